"""The one error type a user sees as a one-line message instead of a traceback."""

from __future__ import annotations

import re

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


def input_error_message(error: BaseException) -> str | None:
    """The one-line message of an ``InputError`` somewhere in ``error`` (or its text), else None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, InputError):
            return current.message
        current = current.__cause__ or current.__context__
    match = _PATTERN.search(str(error))
    return _BEAM_CONTEXT.sub("", match.group(1)).strip() if match else None


def mentions_input_error(text: str) -> bool:
    """Whether a log message carries an InputError (the command line shows it once, as one line)."""
    return _MARKER in text
