"""What a counter means, declared once next to where it is counted; the manifest records the values and the
report reads the declarations (label, kind) instead of guessing from the name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

CounterKind = Literal["processed", "dropped", "error"]
PROCESSED: CounterKind = "processed"
DROPPED: CounterKind = "dropped"  # removed on purpose: a filter, a duplicate, a link to no entity
ERROR: CounterKind = "error"  # bad input: counted and written to OUT/errors/STAGE/


@dataclass(frozen=True)
class Counter:
    """One counter of a stage.

    ``dead_lettered``: each record it counts is also written to OUT/errors/STAGE/. ``detail``: what it counts is
    already counted by another counter (shown, never added to the totals).
    """

    name: str
    label: str
    kind: CounterKind = PROCESSED
    dead_lettered: bool = False
    detail: bool = False


def declare(*counters: Counter) -> dict[str, Counter]:
    """Counters by name; a name declared twice is a programming error."""
    declared: dict[str, Counter] = {}
    for counter in counters:
        if counter.name in declared:
            raise ValueError(f"counter {counter.name!r} is declared twice")
        declared[counter.name] = counter
    return declared


def processed(name: str, label: str) -> Counter:
    return Counter(name, label, PROCESSED)


def dropped(name: str, label: str, dead_lettered: bool = False) -> Counter:
    return Counter(name, label, DROPPED, dead_lettered=dead_lettered)


def error(name: str, label: str, detail: bool = False) -> Counter:
    """Bad input: dead-lettered unless it is a ``detail`` of another error counter."""
    return Counter(name, label, ERROR, dead_lettered=not detail, detail=detail)
