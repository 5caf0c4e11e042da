"""Grouping the rows of numpy arrays by a key, without a Python object per row."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def group_starts(ids: np.ndarray) -> np.ndarray:
    """Where each run of equal values of the sorted ``ids`` starts."""
    return np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.zeros(0, dtype=np.int64)


def split_by(rows: np.ndarray, keys: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(key, the rows of ``rows`` with that key) for every key of ``keys`` (one per row), keys ascending."""
    if not len(rows):
        return
    order = np.argsort(keys, kind="stable")
    rows, keys = rows[order], np.asarray(keys)[order]
    starts = group_starts(keys)
    for start, stop in zip(starts, [*starts[1:], len(rows)], strict=True):
        yield int(keys[start]), rows[start:stop]
