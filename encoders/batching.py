"""Batching for the encoders: token-budget batches with length bucketing (no padding every sequence to the
longest in the corpus), numpy-built padded arrays, host/device copies, and a prefetch thread."""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:  # the command line imports the encoders' options: no Arrow before it needs it
    import pyarrow as pa

T = TypeVar("T")


def token_budget_batches(lengths: Sequence[int], max_tokens: int, max_batch_size: int = 1024) -> list[list[int]]:
    """Group item indices into batches whose padded size (batch size x longest item) stays within ``max_tokens``.

    Items are sorted by length first (stable, so equal lengths keep their order), which keeps padding small.
    An item longer than the budget gets a batch of its own. Every index appears in exactly one batch.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = max(lengths[index], 1)  # sorted ascending: the new item is the longest so far
        if current and (longest * (len(current) + 1) > max_tokens or len(current) >= max_batch_size):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches


def list_offsets(column: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """An Arrow list column as one array (its chunks combined) and its offsets as int64 from 0 (a sliced array's
    start at its first row)."""
    array = column.combine_chunks() if hasattr(column, "combine_chunks") else column  # a ChunkedArray
    offsets = array.offsets.to_numpy().astype(np.int64)
    return array, offsets - offsets[0]


@dataclass(frozen=True)
class PackedLists:
    """Many integer sequences as an Arrow list column stores them: sequence i is ``values[offsets[i]:offsets[i +
    1]]`` (``offsets`` int64, from 0)."""

    values: np.ndarray
    offsets: np.ndarray

    @classmethod
    def of(cls, sequences: Sequence[Sequence[int]], dtype: type = np.int32) -> PackedLists:
        lengths = np.fromiter((len(sequence) for sequence in sequences), dtype=np.int64, count=len(sequences))
        values = np.fromiter(itertools.chain.from_iterable(sequences), dtype=dtype, count=int(lengths.sum()))
        return cls(values, np.concatenate([[0], np.cumsum(lengths)]))

    @classmethod
    def of_column(cls, column: pa.Array | pa.ChunkedArray) -> PackedLists:
        """An Arrow list column's values and offsets, without converting a value to Python."""
        array, offsets = list_offsets(column)
        return cls(array.flatten().to_numpy(zero_copy_only=False), offsets)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def padded(self, rows: np.ndarray, pad: int, at_least: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(ids, attention mask) of the sequences ``rows``: ``padded_packed``."""
        return padded_packed(self.values, self.offsets, rows, pad, at_least)


@dataclass(frozen=True)
class PackedListsOfLists:
    """Many sequences of integer sequences as an Arrow list<list<int>> column stores them: sequence i holds the
    inner sequences ``offsets[i]`` to ``offsets[i + 1]`` of ``inner`` (``offsets`` int64, from 0)."""

    inner: PackedLists
    offsets: np.ndarray

    @classmethod
    def of(cls, sequences: Sequence[Sequence[Sequence[int]]], dtype: type = np.int32) -> PackedListsOfLists:
        lengths = np.fromiter((len(sequence) for sequence in sequences), dtype=np.int64, count=len(sequences))
        return cls(PackedLists.of(list(itertools.chain.from_iterable(sequences)), dtype),
                   np.concatenate([[0], np.cumsum(lengths)]))

    @classmethod
    def of_column(cls, column: pa.Array | pa.ChunkedArray) -> PackedListsOfLists:
        """An Arrow list<list<int>> column's values and both levels of offsets, without converting a value to
        Python."""
        array, offsets = list_offsets(column)
        return cls(PackedLists.of_column(array.flatten()), offsets)

    def padded(self, rows: np.ndarray, pad: int = 0) -> np.ndarray:
        """(rows, longest sequence, longest inner sequence) int64 array of the sequences ``rows``, each at least 1
        wide, ``pad`` where a sequence or an inner sequence is shorter."""
        inner, present = padded_places(self.offsets, rows, 1)
        values, _ = self.inner.padded(inner[present], pad, 1)
        result = np.full((*inner.shape, values.shape[1]), pad, dtype=np.int64)
        result[present] = values
        return result


def padded_places(offsets: np.ndarray, rows: np.ndarray, at_least: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(where each padded value of the sequences ``rows`` is in the packed values, which of them are present):
    (rows, longest) arrays, the longest of the sequences ``rows`` (sequence i: ``offsets[i]`` to ``offsets[i + 1]``),
    ``at_least`` wide."""
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    longest = max(at_least, int(lengths.max()) if len(rows) else 0)
    return starts[:, None] + np.arange(longest), np.arange(longest) < lengths[:, None]


def padded_packed(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray, pad: int,
                  at_least: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ids, attention mask) int64 arrays of the sequences ``rows`` of a packed column (sequence i is
    ``values[offsets[i]:offsets[i + 1]]``, as an Arrow list column stores it), gathered with numpy in one pass, at
    least ``at_least`` wide."""
    places, present = padded_places(offsets, rows, at_least)
    ids = np.full(present.shape, pad, dtype=np.int64)
    ids[present] = values[places[present]]
    return ids, present.astype(np.int64)


def host_tensor(array: np.ndarray, device: str):
    """A CPU tensor over ``array``; in pinned memory when it will be copied to a CUDA device (so the copy can be
    asynchronous). Meant for the prefetch thread: pinning costs host time that should not stall the GPU."""
    import torch

    tensor = torch.from_numpy(array)
    return tensor.pin_memory() if str(device).startswith("cuda") else tensor


def to_device(tensor, device: str):
    """``tensor`` on ``device``; a non-blocking copy from pinned memory on CUDA, no copy on the CPU."""
    return tensor.to(device, non_blocking=True)


def to_host(tensors: Sequence, order: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Device result tensors of several batches -> one float32 array, copied back once (after the last batch,
    so the forward passes are queued without waiting for each result); with ``order`` (the row of each result row,
    every row once), in row order; into ``out`` (as many rows) when given. Joined, put in order and made float32 on
    their device (``in_row_order``), so the host fills one array, while the GPU waits. Results already on the CPU
    are put in place by numpy: torch would run the copy on its intra-op threads, which spin for cores the inputs'
    workers need (3-4.5 CPU s of the index's model process on 2 cores, stand-in GPU)."""
    import torch

    if not tensors:
        raise ValueError("no result tensors to copy back")
    if all(tensor.device.type == "cpu" for tensor in tensors):
        parts = [tensor.float().numpy() for tensor in tensors]
        if order is None and out is None:
            return np.concatenate(parts)
        rows = np.arange(sum(map(len, parts))) if order is None else order
        vectors = np.empty((len(rows), parts[0].shape[1]), dtype=np.float32) if out is None else out
        for part, place in zip(parts, np.split(rows, np.cumsum([len(part) for part in parts])[:-1]), strict=True):
            vectors[place] = part
        return vectors
    joined = in_row_order(tensors, order).float()
    if out is None:
        return joined.to("cpu").numpy()
    torch.from_numpy(out).copy_(joined)
    return out


def in_row_order(tensors: Sequence, order: np.ndarray | None):
    """Result tensors of several batches joined where they are, in row order (``order``: the row of each result
    row, every row once; None: as they come)."""
    import torch

    joined = torch.cat(list(tensors)) if len(tensors) > 1 else tensors[0]
    if order is None:
        return joined
    place = np.empty_like(order)
    place[order] = np.arange(len(order))
    return joined[torch.from_numpy(place).to(joined.device)]


@dataclass(frozen=True)
class QueuedForwards:
    """The results of one call's forward passes, left where the model put them (on a GPU: queued there, the
    device still running them) until ``collect`` copies them back: ``rows``, the row of each result row."""

    dim: int
    rows: np.ndarray
    results: list

    def collect(self, out: np.ndarray | None = None) -> np.ndarray:
        """float32 rows in row order (``to_host``: waits for the device; into ``out`` when given)."""
        return to_host(self.results, self.rows, out) if self.results else np.zeros((0, self.dim), dtype=np.float32)


def queue_forwards(size: int, dim: int, prepared: Iterable[tuple[list[int], T]], forward: Callable[[T], object],
                   on_batch: Callable[[list[int]], None] | None = None) -> QueuedForwards:
    """``forward`` on each prepared (row indices, host inputs) batch, built ahead in the prefetch thread; the results
    stay on the device (``QueuedForwards.collect`` brings them back in one copy). Every row is in exactly one batch.
    ``on_batch`` (e.g. a progress count) gets each batch's rows once its forward pass has run (on a GPU: queued)."""
    order: list[int] = []
    results = []
    for batch, host in prefetched(prepared):
        order.extend(batch)
        results.append(forward(host))
        if on_batch is not None:
            on_batch(batch)
    rows = np.asarray(order, dtype=np.int64)
    check_each_row_once(rows, size)
    return QueuedForwards(dim, rows, results)


def check_each_row_once(order: np.ndarray, size: int) -> None:
    """A clear error unless the batches' rows (``order``) are each of the ``size`` rows once."""
    seen = np.zeros(size, dtype=bool)
    if len(order) == size and (size == 0 or (order.min() >= 0 and order.max() < size)):
        seen[order] = True
    if not seen.all():
        raise ValueError(f"the batches hold {len(order)} rows, not each of the {size} rows once")


class HostBuffers:
    """The float32 arrays a model process's steps are copied back into, ``count`` of them in turn, each grown to
    the largest step: their pages fault in once, not at every step (fresh pages fault in slowly on some machines:
    ~20 ms for 8,192 vectors of 768 on these, while the GPU waits for the host). A step's array is overwritten
    ``count`` steps later: whatever reads it (a writing thread) must be done by then."""

    def __init__(self, count: int = 2) -> None:
        self._arrays: list[np.ndarray] = [np.zeros((0, 0), np.float32)] * count
        self._turn = 0

    def take(self, rows: int, dim: int) -> np.ndarray:
        """The next array in turn, as ``rows`` x ``dim``."""
        array = self._arrays[self._turn]
        if len(array) < rows or array.shape[1] != dim:
            array = self._arrays[self._turn] = np.empty((rows, dim), dtype=np.float32)
        self._turn = (self._turn + 1) % len(self._arrays)
        return array[:rows]


_DONE = object()


def prefetched(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """Iterate ``items`` in a background thread, at most ``depth`` ahead of the consumer, so that building the
    next batch (tokenizing, padding, pinning) overlaps the current forward pass. An exception in the producer
    is raised in the consumer; a consumer that stops early stops the producer (no thread left blocked)."""
    results: queue.Queue = queue.Queue(maxsize=max(depth, 1))
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                if not _put(results, (item, None), stop):
                    return
            _put(results, (_DONE, None), stop)
        except BaseException as error:  # handed to the consumer, which re-raises it
            _put(results, (_DONE, error), stop)

    worker = threading.Thread(target=produce, name="prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item, error = results.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        worker.join()


def _put(results: queue.Queue, entry: tuple, stop: threading.Event) -> bool:
    """Put ``entry`` unless the consumer has stopped; False when it has."""
    while not stop.is_set():
        try:
            results.put(entry, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False
