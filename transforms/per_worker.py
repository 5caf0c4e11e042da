"""Read-only objects built from files once per worker process and shared by its DoFns: a title map, a trie, a
threshold table. Their path is all that travels with the DoFn; local files are memory-mapped where they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from apache_beam.utils.shared import Shared

T = TypeVar("T")


class _Held(Generic[T]):
    """A weak-referenceable box: Shared keeps its objects through weak references."""

    def __init__(self, value: T) -> None:
        self.value = value


class PerProcess(Generic[T]):
    """``load(path)``, called at most once per worker process (and again only for another path).

    Keep what ``get`` returns in the DoFn (``setup``): Shared frees the object once nothing refers to it."""

    def __init__(self, load: Callable[[str], T]) -> None:
        self._load = load
        self._shared = Shared()

    def get(self, path: str) -> T:
        return self._shared.acquire(lambda: _Held(self._load(path)), tag=path).value
