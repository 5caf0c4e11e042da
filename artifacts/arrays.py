"""Grouping the rows of numpy arrays by a key, without a Python object per row."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def run_starts(sorted_values: np.ndarray) -> np.ndarray:
    """Whether each value of a sorted numpy array starts a run of equal values (a boolean mask)."""
    return np.r_[True, sorted_values[1:] != sorted_values[:-1]] if len(sorted_values) else np.zeros(0, dtype=bool)


def group_starts(ids: np.ndarray) -> np.ndarray:
    """Where each run of equal values of the sorted ``ids`` starts (positions: ``run_starts``' True ones)."""
    return np.flatnonzero(run_starts(ids))


def split_by(rows: np.ndarray, keys: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(key, the rows of ``rows`` with that key) for every key of ``keys`` (one per row), keys ascending."""
    if not len(rows):
        return
    order = np.argsort(keys, kind="stable")
    rows, keys = rows[order], np.asarray(keys)[order]
    starts = group_starts(keys)
    for start, stop in zip(starts, [*starts[1:], len(rows)], strict=True):
        yield int(keys[start]), rows[start:stop]
