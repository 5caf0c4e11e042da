"""Which corpus rows to drop as duplicate ids, found from ids alone (packed arrays), never from the rows' text.

Pure functions only. Each line range sends the ids and line numbers of its valid rows, split into ``ID_GROUPS``
groups by a hash of the id (so that one group holds every row of an id); each group finds its ids seen more than
once and keeps the first row in (file, line) order, or the last. The decisions (a small set: only the rows to drop)
go back to the range that holds them and are applied while the range is read again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from transforms.index.passages import DUPLICATE_KEEPS

ID_GROUPS = 64  # groups of ids found duplicate together: a group of DPR's 21M ids is ~330K (id, line) pairs
_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: sequential ids spread evenly over the groups


@dataclass(frozen=True)
class IdBlock:
    """The valid rows of one line range (``path``, ``start``) whose ids fall in one group: ids and line numbers."""

    path: str
    start: int
    ids: np.ndarray  # int64
    lines: np.ndarray  # int64, the rows' line numbers in ``path``


@dataclass(frozen=True)
class Drops:
    """Rows of one line range to drop: their line numbers, and the file and line of the row kept for their id."""

    lines: np.ndarray  # int64
    kept_paths: tuple[str, ...]
    kept_lines: np.ndarray  # int64

    def by_line(self) -> dict[int, tuple[str, int]]:
        return {int(line): (path, int(kept)) for line, path, kept in
                zip(self.lines, self.kept_paths, self.kept_lines, strict=True)}


def id_groups(ids: np.ndarray, groups: int = ID_GROUPS) -> np.ndarray:
    """The group of each id (a hash of the id, so that adversarial id ranges stay balanced)."""
    mixed = ids.astype(np.int64).view(np.uint64) * _MIX
    return ((mixed >> np.uint64(32)) % np.uint64(groups)).astype(np.int64)


def grouped_blocks(path: str, start: int, ids: Iterable[int], lines: Iterable[int],
                   groups: int = ID_GROUPS) -> Iterator[tuple[int, IdBlock]]:
    """(group, block) for each group that a range's (id, line) pairs fall in."""
    id_array, line_array = np.fromiter(ids, np.int64), np.fromiter(lines, np.int64)
    group_of = id_groups(id_array, groups)
    for group in np.unique(group_of).tolist():
        mine = group_of == group
        yield group, IdBlock(path, start, id_array[mine], line_array[mine])


def duplicate_drops(blocks: Iterable[IdBlock], keep: str = "first") -> Iterator[tuple[tuple[str, int], Drops]]:
    """((path, start) of a range, the rows it must drop) for every range holding a row of a repeated id that is
    not the kept one: the first row in (file, line) order, or the last with ``keep="last"``."""
    if keep not in DUPLICATE_KEEPS:
        raise ValueError(f"keep must be one of {DUPLICATE_KEEPS}, got {keep!r}")
    blocks = list(blocks)
    if not blocks:
        return
    paths = sorted({block.path for block in blocks})
    rank = {path: index for index, path in enumerate(paths)}
    ids = np.concatenate([block.ids for block in blocks])
    lines = np.concatenate([block.lines for block in blocks])
    files = np.concatenate([np.full(len(block.ids), rank[block.path], np.int64) for block in blocks])
    owner = np.concatenate([np.full(len(block.ids), index, np.int64) for index, block in enumerate(blocks)])
    order = np.lexsort((lines, files, ids))  # by id, then file, then line
    run_starts = np.flatnonzero(np.r_[True, np.diff(ids[order]) != 0])
    run_ends = np.r_[run_starts[1:], len(order)]
    dropped: dict[int, list[tuple[int, str, int]]] = {}
    for run_start, run_end in zip(run_starts.tolist(), run_ends.tolist(), strict=True):
        if run_end - run_start < 2:
            continue
        rows = order[run_start:run_end].tolist()
        kept = rows[0] if keep == "first" else rows[-1]
        for row in rows:
            if row != kept:
                dropped.setdefault(int(owner[row]), []).append(
                    (int(lines[row]), paths[files[kept]], int(lines[kept])))
    for index, rows in sorted(dropped.items()):
        block = blocks[index]
        yield (block.path, block.start), Drops(np.array([row[0] for row in rows], np.int64),
                                               tuple(row[1] for row in rows),
                                               np.array([row[2] for row in rows], np.int64))
