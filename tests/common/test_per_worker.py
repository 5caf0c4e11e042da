"""Objects loaded once per worker process: loaded once a path, and kept out of the cyclic collector's walks."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from transforms.common.per_worker import PerProcess


class Node:
    """A weak-referenceable object that can be part of a reference cycle."""

    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test process as it was


def test_a_path_is_loaded_once_and_what_is_alive_is_frozen_until_the_next_load() -> None:
    loads: list[str] = []

    def load(path: str) -> dict[str, list[str]]:
        loads.append(path)
        return {"path": [path]}

    loaded = PerProcess(load)
    cycle = Node()
    cycle.other = Node()
    cycle.other.other = cycle  # cyclic: only the collector frees it
    first = loaded.get("a")
    assert loaded.get("a") is first and loads == ["a"]
    assert gc.get_freeze_count() > 0 and all(item is not first for item in gc.get_objects())
    assert all(item is not cycle for item in gc.get_objects())  # alive at the load: frozen with it
    dead = weakref.ref(cycle)
    del cycle
    gc.collect()
    assert dead() is not None  # a frozen cycle is not collected ...
    second = PerProcess(load).get("b")
    assert dead() is None and loads == ["a", "b"]  # ... until the next load collects everything first
    assert second == {"path": ["b"]} and all(item is not second for item in gc.get_objects())
