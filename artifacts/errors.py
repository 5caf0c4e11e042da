"""The errors a user sees as a one-line message instead of a traceback: ``InputError`` and its typed kinds,
whose fields let the command line word the hint (a flag name) that library code does not know."""

from __future__ import annotations

import errno
import re
from collections.abc import Callable, Iterator
from typing import Any

from artifacts.layout import command_of

_MARKER = "KPR-INPUT-ERROR: "
_PATTERN = re.compile(r"(?:" + re.escape(_MARKER) + r")+([^\n]*)")
_BEAM_CONTEXT = re.compile(r"\s*\[while running '[^\n]*'\]\s*$")


class InputError(Exception):
    """Input that cannot be read at all: a missing file, a truncated archive, a missing artifact.

    The message names the file (and the position where it matters). Raised inside a Beam worker it reaches
    the driver wrapped in the runner's own exception; ``input_error_message`` finds it again there.
    """

    def __init__(self, message: str) -> None:
        message = message.removeprefix(_MARKER)  # Beam re-raises a worker's error with its text as message
        super().__init__(_MARKER + message)
        self.message = _BEAM_CONTEXT.sub("", message)


class ModelError(InputError):
    """A model that cannot be loaded or used: ``model`` is its path or hub name; the message says why."""

    def __init__(self, model: str, message: str) -> None:
        self.model = str(model)
        super().__init__(message)

    def __reduce__(self):
        return type(self), (self.model, self.message)


class NoRoomError(InputError):
    """What is about to be written under ``destination`` (``need`` bytes) is more than the ``free`` bytes of its
    filesystem; raised before anything is written."""

    def __init__(self, destination: str, need: int, free: int) -> None:
        self.destination, self.need, self.free = destination, need, free
        super().__init__(f"{destination}: {need:,} bytes to write, {free:,} free")

    def __reduce__(self):
        return type(self), (self.destination, self.need, self.free)


def refuse_without_room(destination: str, free: int | None, need: Callable[[], int]) -> None:
    """Raise ``NoRoomError`` when ``need()`` bytes are more than ``free``; with ``free`` None (not known: a remote
    filesystem) ``need`` is not even computed."""
    if free is None:
        return
    needed = need()
    if needed > free:
        raise NoRoomError(destination, needed, free)


class DamagedManifestError(InputError):
    """A manifest (``path``) that cannot be read as one: cut short, not JSON, JSON of another shape, a missing or
    mistyped field; ``problem`` says which. Nothing was written: the command line words what to do."""

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path} is damaged: {problem}")

    def __reduce__(self):
        return type(self), (self.path, self.problem)


class RunStateError(InputError):
    """What a reader needs of the run under ``output`` is not there, or not as recorded (``what``: no manifest, a
    stage that has not completed, a recorded file gone or changed); ``advice``: what to do about it. Where another
    process writes the run (a stage committing, a publish copying it in), it may be on its way: the command line
    names that writer instead of the advice."""

    def __init__(self, output: str, what: str, advice: str = "") -> None:
        self.output, self.what, self.advice = output, what, advice
        super().__init__(f"{what}: {advice}" if advice else what)

    def __reduce__(self):
        return type(self), (self.output, self.what, self.advice)


class InvalidRunError(RunStateError):
    """The run under ``output`` does not validate (``problems``, the first named): publish and export refuse it."""

    def __init__(self, output: str, problems: list[str]) -> None:
        self.problems = tuple(problems)
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(output, f"{output} does not validate ({problems[0]}{more})")

    def __reduce__(self):
        return type(self), (self.output, list(self.problems))


class IncompleteRunError(RunStateError):
    """A file that the ``stage`` of the run under ``output`` recorded is gone or resized since (``problem``)."""

    def __init__(self, output: str, stage: str, problem: str) -> None:
        self.stage, self.problem = stage, problem
        super().__init__(output, f"{output} is incomplete ({problem}, written by its '{command_of(stage)}' stage)")

    def __reduce__(self):
        return type(self), (self.output, self.stage, self.problem)


# Where a SettingError's template names the setting.
SETTING_NAME = "{name}"


class SettingError(InputError):
    """A setting's value the library cannot use: ``setting`` (its field name in a stage's config or in
    ``EncoderOptions``, e.g. ``max_seq_length``), ``value``, and ``template``, the message with ``{name}`` where
    the setting is named. The library's message names the field; the command line words it with its flag
    (``worded``, applied by ``pipelines.launcher.flags.worded``)."""

    def __init__(self, setting: str, value: Any, template: str) -> None:
        self.setting, self.value, self.template = setting, value, template
        super().__init__(self.worded(setting))

    def worded(self, name: str) -> str:
        """The message, calling the setting ``name`` (a flag such as ``--layer``)."""
        return self.template.replace(SETTING_NAME, name)

    def __reduce__(self):
        return type(self), (self.setting, self.value, self.template)


class BelowMinimumError(SettingError):
    """A setting below its ``minimum``."""

    def __init__(self, setting: str, value: Any, minimum: int) -> None:
        self.minimum = minimum
        super().__init__(setting, value, f"{SETTING_NAME} must be at least {minimum}, got {value}")

    def __reduce__(self):
        return type(self), (self.setting, self.value, self.minimum)


class OutsideRangeError(SettingError):
    """A setting outside ``low``..``high``; ``what`` says what the setting is (e.g. "a probability")."""

    def __init__(self, setting: str, value: Any, low: float, high: float, what: str) -> None:
        self.low, self.high, self.what = low, high, what
        super().__init__(setting, value, f"{SETTING_NAME} is {what}, from {low} to {high}: got {value}")

    def __reduce__(self):
        return type(self), (self.setting, self.value, self.low, self.high, self.what)


# Control characters and line or paragraph separators, as Python escapes them.
ESCAPED = {code: repr(chr(code))[1:-1] for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)}


def on_one_line(text: str) -> str:
    """``text`` on one line of a table or message: a tab, line break or other control character as its escape
    (``\\t``)."""
    return text.translate(ESCAPED)


def first_line(error: BaseException) -> str:
    """The first line of an error message (its type when it has none), for one-line InputErrors: control characters
    as their escapes (a library's message may quote a byte it could not read)."""
    text = (error.message if isinstance(error, InputError) else str(error)).strip()
    return on_one_line(text.splitlines()[0]) if text else type(error).__name__


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then what it was raised from or during, each once (a cycle ends the chain)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def input_error_message(error: BaseException) -> str | None:
    """The one-line message of an ``InputError`` somewhere in ``error`` (or its text), else None."""
    for current in error_chain(error):
        if isinstance(current, InputError):
            return current.message
    match = _PATTERN.search(str(error))
    return _BEAM_CONTEXT.sub("", match.group(1)).strip() if match else None


def mentions_input_error(text: str) -> bool:
    """Whether a log message carries an InputError (the command line shows it once, as one line)."""
    return _MARKER in text


DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)  # a write refused by permissions or a read-only filesystem
# Such an error as its text reads once Beam re-raised it from a worker process: [Errno 13] Permission denied: 'f'
_DENIED_TEXT = re.compile(rf"\[Errno ({'|'.join(map(str, DENIED))})\] ([^:\]\[]+): '([^']+)'")


def denied_in_text(text: str) -> OSError | None:
    """The permission error (``DENIED``) a text names, with its file name, as an OSError; None if none."""
    match = _DENIED_TEXT.search(text)
    return OSError(int(match.group(1)), match.group(2), match.group(3)) if match else None
