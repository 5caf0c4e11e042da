"""Read-only objects built from files once per worker process and shared by its DoFns: a title map, a trie, a
threshold table. Their path is all that travels with the DoFn; local files are memory-mapped where they are."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from apache_beam.utils.shared import Shared

T = TypeVar("T")


class _Held(Generic[T]):
    """A weak-referenceable box: Shared keeps its objects through weak references."""

    def __init__(self, value: T) -> None:
        self.value = value


class PerProcess(Generic[T]):
    """``load(path)``, called at most once per worker process (and again only for another path); the object
    stays loaded while the DoFn holding this lives."""

    def __init__(self, load: Callable[[str], T]) -> None:
        self._load = load
        self._shared = Shared()
        self._held: _Held[T] | None = None

    def get(self, path: str) -> T:
        held = self._shared.acquire(lambda: _Held(self._load(path)), tag=path)
        self._held = held  # Shared refers to it weakly: this reference keeps it loaded between elements
        return held.value

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_held": None}  # the loaded object never travels with the DoFn
