"""Flags shared by several commands, each defined once as a group and added once to a parser.

A stage lists the groups it reads in ``flag_groups``; `all` adds the union of its stages' groups, so a shared
flag (``--device``) has one definition, one default and one meaning wherever it appears.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from artifacts.errors import InputError, SettingError
from encoders.models import DTYPES


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


DEFAULT_INTERVAL_S = 30.0  # --progress-interval


def _output(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--output", required=True, help="OUT: local path or Beam filesystem URL")


def _progress(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--progress-interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                       help="seconds between progress lines of a worker")


def _runtime(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--device", default="cpu", help="where models run: cpu, cuda or cuda:N")
    group.add_argument("--dtype", choices=DTYPES, default="float32",
                       help="model weights and compute (bfloat16/float16 on GPUs)")
    group.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per forward pass")


def _sequence(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--max-seq-length", type=int, default=512,
                       help="model tokens per mention input ([CLS], context with [MASK], [SEP])")


def _refresh(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--previous", metavar="OLD_OUT",
                       help="a previous run of an older dump: reuse its vectors where nothing changed")
    group.add_argument("--require-reuse", action="store_true",
                       help="with --previous: exit 2 instead of recomputing everything when it cannot be reused")


OUTPUT = FlagGroup("output", _output)
PROGRESS = FlagGroup("progress", _progress)
RUNTIME = FlagGroup("model runtime", _runtime)
SEQUENCE = FlagGroup("mention inputs", _sequence)
REFRESH = FlagGroup("refresh", _refresh)


def flag_of(setting: str) -> str:
    """The flag of a config setting: ``max_seq_length`` -> ``--max-seq-length``."""
    return "--" + setting.replace("_", "-")


def worded(error: BaseException, flags: Mapping[str, str] | None = None) -> BaseException:
    """A library ``SettingError`` as the command line says it, with its flag (``flags``: the flag of a setting
    whose name is not its flag's, e.g. ``{"kind": "--encoder-type"}``); any other error as it is."""
    if isinstance(error, SettingError):
        return InputError(error.worded((flags or {}).get(error.setting) or flag_of(error.setting)))
    return error
