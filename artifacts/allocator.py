"""glibc's allocator around a step that reads and writes large buffers over and over (sorting a shard's buckets).

The command line fixes glibc's mmap threshold at 1 MB for every process (``run_pipeline.MALLOC_SETTINGS``): freed
Arrow buffers then go back to the system, which keeps the stages' memory low. For a step that reads and writes
hundreds of MB a few MB at a time, it means that every buffer of 1 to 4 MB (a row group's text, Parquet's pages
and their compression) is a block mapped, faulted in and unmapped anew, and that two threads doing so wait on each
other's mappings. Sorting the buckets of the shard of 307,087 passages (384 dims, one core, 2026-11-29): 1.4M page
faults (5.4 GB) and 3.3 s of system time in a build of 6.4 s, against 0.41M and 1.7 s in one of 4.6 s with
``blocks_from_the_heap``; its peak 648-656 -> 663-678 MB, a few MB that do not grow with the vectors (shards of
65,536 and 196,608 vectors of 768 dims: 444-455 -> 461-464 MB and 849-850 -> 853-859 MB; README "GPUs").
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import Any

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # mallopt's parameters (malloc.h)
FIXED_THRESHOLD = "MALLOC_MMAP_THRESHOLD_"  # set: the process started with a fixed mmap threshold
ARENA_MAX = "MALLOC_ARENA_MAX"
TRIM_THRESHOLD = "MALLOC_TRIM_THRESHOLD_"
GLIBC_TRIM_THRESHOLD = 128 << 10  # glibc's own, where the process did not set one
# Blocks up to 4 MB come from the heap and are reused once freed: a row group's text and Parquet's page and
# compression buffers, most of what a shard's build mapped anew (1-4 MB: 6 GB of 8 mapped, 40,000 articles)
HEAP_BLOCKS = 4 << 20


def glibc() -> Any | None:
    """The C library when it has glibc's ``mallopt`` and ``malloc_trim``; None elsewhere (musl, macOS)."""
    try:
        library = ctypes.CDLL(None)
    except OSError:
        return None
    return library if hasattr(library, "mallopt") and hasattr(library, "malloc_trim") else None


def threshold(variable: str, default: int) -> int | None:
    """A threshold the process was started with (``variable``), ``default`` when not set, None when unreadable."""
    try:
        return int(os.environ.get(variable, default))
    except ValueError:
        return None


@contextlib.contextmanager
def blocks_from_the_heap() -> Iterator[None]:
    """Within the block, blocks up to ``HEAP_BLOCKS`` (or the process's own threshold, if larger) come from the
    heap and what is freed stays there for the next; afterwards, the thresholds the process was started with and
    the free memory given back (``malloc_trim``): the step leaves nothing held. Only in a process started with a
    fixed mmap threshold (the command line's worker processes and launcher): glibc's own threshold rises by itself
    as large blocks are freed, and once set it could not be given back. Nothing changes where the C library is
    not glibc."""
    library = glibc()
    mmap_after, trim_after = threshold(FIXED_THRESHOLD, 0), threshold(TRIM_THRESHOLD, GLIBC_TRIM_THRESHOLD)
    if library is None or not mmap_after or trim_after is None:
        yield
        return
    library.mallopt(M_MMAP_THRESHOLD, max(HEAP_BLOCKS, mmap_after))
    library.mallopt(M_TRIM_THRESHOLD, max(HEAP_BLOCKS, trim_after))
    try:
        yield
    finally:
        library.mallopt(M_MMAP_THRESHOLD, mmap_after)
        library.mallopt(M_TRIM_THRESHOLD, trim_after)
        library.malloc_trim(0)
