"""Streaming aggregates with bounded memory: exact value counts, fixed-bin histograms, a bounded top-k."""

from __future__ import annotations

import heapq
from typing import Any, Generic, TypeVar

import numpy as np

Key = TypeVar("Key")


class ValueCounts:
    """Exact counts of integer values, merged batch by batch (memory: one entry per distinct value)."""

    def __init__(self) -> None:
        self.values = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0

    def add(self, values: np.ndarray) -> None:
        if len(values) == 0:
            return
        unique, counts = np.unique(np.asarray(values, dtype=np.int64), return_counts=True)
        self._pending.append((unique, counts.astype(np.int64)))
        self._pending_size += len(unique)
        # merging only when the pending parts outgrow the merged ones keeps the sorting cost amortized
        if self._pending_size > max(len(self.values), 1 << 20):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        values = np.concatenate([self.values, *(part[0] for part in self._pending)])
        counts = np.concatenate([self.counts, *(part[1] for part in self._pending)])
        self._pending, self._pending_size = [], 0
        self.values, inverse = np.unique(values, return_inverse=True)
        self.counts = np.zeros(len(self.values), dtype=np.int64)
        np.add.at(self.counts, inverse.reshape(-1), counts)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted distinct values, their counts)."""
        self._merge()
        return self.values, self.counts

    def total(self) -> int:
        return int(self.result()[1].sum())


class Histogram:
    """Counts in fixed bins, accumulated batch by batch."""

    def __init__(self, edges: np.ndarray) -> None:
        self.edges = np.asarray(edges, dtype=np.float64)
        self.counts = np.zeros(len(self.edges) - 1, dtype=np.float64)

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        if len(values):
            self.counts += np.histogram(values, bins=self.edges, weights=weights)[0]


class TopK(Generic[Key]):
    """The ``k`` items with the smallest keys seen so far (a bounded heap; keys must be unique and comparable)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._heap: list[tuple[Any, int, Any]] = []  # (negated order, sequence, item): the worst item on top
        self._sequence = 0

    def offer(self, key: Key, item: Any) -> None:
        entry = (_Reversed(key), self._sequence, item)
        self._sequence += 1
        if len(self._heap) < self.k:
            heapq.heappush(self._heap, entry)
        elif key < self._heap[0][0].key:
            heapq.heapreplace(self._heap, entry)

    def worst(self) -> Key | None:
        """The largest key kept, once ``k`` items are kept (anything not smaller cannot get in)."""
        return self._heap[0][0].key if len(self._heap) == self.k else None

    def items(self) -> list[Any]:
        """The kept items, best (smallest key) first."""
        return [entry[2] for entry in sorted(self._heap, key=lambda entry: entry[0].key)]


class _Reversed:
    """Inverts the order of a key, so Python's min-heap keeps the largest key on top."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Reversed) -> bool:
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Reversed) and other.key == self.key


def integer_log_edges(maximum: int, per_decade: int = 8) -> np.ndarray:
    """Bin edges on whole numbers from 1 to just above ``maximum``, about ``per_decade`` bins per decade
    (one bin per integer where the geometric steps are narrower than 1)."""
    decades = np.log10(max(maximum, 1) + 1)
    steps = np.logspace(0, decades, max(2, int(np.ceil(decades * per_decade)) + 1))
    edges = np.unique(np.round(steps).astype(np.int64))
    if edges[-1] <= maximum:
        edges = np.append(edges, maximum + 1)
    return edges.astype(np.float64)


def splitmix64(values: np.ndarray) -> np.ndarray:
    """A seed-free 64-bit mix of integers: the same sample whatever the file layout or process."""
    with np.errstate(over="ignore"):
        z = np.asarray(values).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
