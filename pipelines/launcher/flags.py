"""Flags shared by several commands, each defined once as a group and added once to a parser, and the types that
check a flag's value while the arguments are parsed.

A command lists the groups it reads (``pipelines.launcher.commands``); `all` adds the union of its stages' groups, so a
shared flag (``--device``) has one definition, one default and one meaning wherever it appears. Nothing here
imports Beam, torch or pyarrow: the command line checks its arguments before it imports them.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from artifacts.errors import SETTING_NAME, BelowMinimumError, InputError, OutsideRangeError, SettingError
from encoders.mask_inputs import check_max_seq_length
from encoders.models import DTYPES, check_device

T = TypeVar("T")
DEFAULT_INTERVAL_S = 30.0  # --progress-interval
DEFAULT_KS = (1, 5, 20, 100)  # evaluate's -k: accuracy within the first k passages
MAX_INTERVAL_S = 86_400  # a day (a worker's timer thread cannot wait forever: inf stopped it)


@dataclass(frozen=True)
class FlagGroup:
    """A titled group of flags; ``add`` defines them on an argparse group."""

    title: str
    add: Callable[[argparse._ArgumentGroup], None]


def add_groups(parser: argparse.ArgumentParser, groups: Iterable[FlagGroup]) -> None:
    """Add each distinct group once, in first-seen order."""
    added: set[str] = set()
    for group in groups:
        if group.title not in added:
            added.add(group.title)
            group.add(parser.add_argument_group(group.title))


# --- value types: a value out of range is a SettingError, worded with its flag like the library's own -----------


def checked(convert: Callable[[str], T], check: Callable[[T], None]) -> Callable[[str], T]:
    """An argparse type: ``convert`` the text (argparse words a text it cannot convert), then ``check`` the value
    (a ``SettingError``, worded with the flag by the command line)."""

    def parse(text: str) -> T:
        value = convert(text)
        check(value)
        return value

    parse.__name__ = convert.__name__  # argparse names the type in "invalid int value"
    return parse


def at_least(setting: str, minimum: int) -> Callable[[str], int]:
    """An integer of at least ``minimum``."""

    def check(value: int) -> None:
        if value < minimum:
            raise BelowMinimumError(setting, value, minimum)

    return checked(int, check)


def whole_between(setting: str, low: int, high: int, what: str) -> Callable[[str], int]:
    """An integer from ``low`` to ``high`` (``what``: what it is)."""

    def check(value: int) -> None:
        if not low <= value <= high:
            raise OutsideRangeError(setting, value, low, high, what)

    return checked(int, check)


def between(setting: str, low: float, high: float, what: str) -> Callable[[str], float]:
    """A number from ``low`` to ``high`` (``what``: what it is); not NaN."""

    def check(value: float) -> None:
        if not low <= value <= high:
            raise OutsideRangeError(setting, value, low, high, what)

    return checked(float, check)


def probability(setting: str) -> Callable[[str], float]:
    """A number from 0 to 1."""
    return between(setting, 0, 1, "a probability")


def more_than(setting: str, floor: float, ceiling: float, why: str) -> Callable[[str], float]:
    """A number above ``floor`` and at most ``ceiling`` (``why``: what the number is); not NaN."""

    def check(value: float) -> None:
        if not floor < value <= ceiling:
            raise SettingError(setting, value, f"{SETTING_NAME} must be more than {floor:g} and at most "
                               f"{ceiling:g} ({why}), got {value:g}")

    return checked(float, check)


DEVICE = checked(str, check_device)


class GivenOnce(argparse.Action):
    """A flag of one value that refuses a second, other value (argparse keeps the last: a repeated ``--corpus``
    dropped every file but the last one's passages without a word)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        given = getattr(namespace, self.dest, None)
        if given is not None and given != self.default and given != values:
            raise InputError(f"{option_string} takes one value, given {given} and {values}: give one path or glob "
                             "(a glob reads every file it matches)")
        setattr(namespace, self.dest, values)


def option_words(text: str) -> tuple[str, ...]:
    """Command-line options given as one value (``"--machine_type=g2-standard-8 --num_workers 4"``), split as a
    shell splits them."""
    try:
        return tuple(shlex.split(text))
    except ValueError as error:  # an unclosed quote
        raise argparse.ArgumentTypeError(f"{text!r}: {error}") from None


def model_pipeline_options(args: argparse.Namespace) -> tuple[str, ...]:
    """The Beam options of --model-pipeline-options (none for a command without the flag, or without a value)."""
    return tuple(getattr(args, "model_pipeline_options", None) or ())


# --- paths: made absolute, so that workers elsewhere read what was meant ----------------------------------------


def path_or_url(value: str) -> str:
    """The value of a flag naming a run or a place: a local path with ``~`` expanded (the shell leaves the one of
    ``--output=~/run``), ``file:///path`` as the path it names, another URL as it is; never empty (``--to "$DEST"``
    with DEST unset would name the working directory)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset shell variable?): name the path")
    value = without_file_scheme(value)
    return value if "://" in value else os.path.expanduser(value)


def without_file_scheme(value: str) -> str:
    """``file:///path`` as the local path it names (Beam has no filesystem for file://); anything else as it is."""
    return value.removeprefix("file://") if value.startswith("file:///") else value


def local_path(value: str) -> str:
    """The value of a path flag: ``path_or_url``'s, a local path made absolute (a worker elsewhere would resolve a
    relative one in its own working directory)."""
    value = path_or_url(value)
    return value if "://" in value else os.path.abspath(value)


def name_or_path(value: str) -> str:
    """The value of a model flag: a local path that exists made absolute (transformers reads it before looking for
    a hub name), anything else (a hub name) as it is."""
    path = os.path.expanduser(without_file_scheme(value))
    return os.path.abspath(path) if os.path.exists(path) else value


def local_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(flag, path)`` for every local path the path and model flags of ``parser`` were given."""
    found = []
    for action in parser._actions:
        if action.type not in (local_path, name_or_path) or getattr(args, action.dest, None) is None:
            continue
        values = getattr(args, action.dest)
        for value in values if isinstance(values, list) else [values]:
            if os.path.isabs(value):
                found.append((action.option_strings[0], value))
    return found


# --- groups ---------------------------------------------------------------------------------------------------


def _output(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--output", required=True, type=local_path, help="OUT: local path or Beam filesystem URL")


def _progress(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--progress-interval", default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                       type=between("progress_interval", 0, MAX_INTERVAL_S, "seconds between lines"),
                       help="seconds between progress lines of a worker")


def _runtime(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--device", type=DEVICE, default="cpu", help="where models run: cpu, cuda or cuda:N")
    group.add_argument("--dtype", choices=DTYPES, default="float32",
                       help="model weights and compute (bfloat16/float16 on GPUs)")
    group.add_argument("--batch-tokens", type=at_least("batch_tokens", 1), default=16384,
                       help="padded tokens per forward pass")
    group.add_argument("--model-workers", type=at_least("model_workers", 1), metavar="N",
                       help="worker processes of a local run that hold the model (default: one per GPU with --device "
                       "cuda, else as many as the run's workers); the model's inputs are built by every worker")
    group.add_argument("--model-pipeline-options", type=option_words, metavar="'BEAM OPTIONS'",
                       help="Beam pipeline options for the model's pipeline alone, after the command's own (which "
                       "the inputs' and every other pipeline keep): its workers' machine, GPUs and image on a "
                       "cluster, e.g. '--machine_type=g2-standard-8 "
                       "--resource_hints=accelerator=type:nvidia-l4;count:1;install-nvidia-driver'")


def _sequence(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--max-seq-length", type=checked(int, check_max_seq_length), default=512,
                       help="model tokens per mention input ([CLS], context with [MASK], [SEP])")


def _refresh(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--previous", metavar="OLD_OUT", type=local_path,
                       help="a previous run of an older dump: reuse its vectors where nothing changed")
    group.add_argument("--require-reuse", action="store_true",
                       help="with --previous: exit 2 instead of recomputing everything when it cannot be reused")


OUTPUT = FlagGroup("output", _output)
PROGRESS = FlagGroup("progress", _progress)
RUNTIME = FlagGroup("model runtime", _runtime)
SEQUENCE = FlagGroup("mention inputs", _sequence)
REFRESH = FlagGroup("refresh", _refresh)


def flag_of(setting: str) -> str:
    """The flag of a config setting: ``max_seq_length`` -> ``--max-seq-length``, ``k`` -> ``-k``."""
    return f"-{setting}" if len(setting) == 1 else "--" + setting.replace("_", "-")


def worded(error: BaseException, flags: Mapping[str, str] | None = None) -> BaseException:
    """A library ``SettingError`` as the command line says it, with its flag (``flags``: the flag of a setting
    whose name is not its flag's, e.g. ``{"kind": "--encoder-type"}``); any other error as it is."""
    if isinstance(error, SettingError):
        return InputError(error.worded((flags or {}).get(error.setting) or flag_of(error.setting)))
    return error
