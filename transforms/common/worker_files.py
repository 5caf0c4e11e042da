"""Arrays a stage writes for its own workers (thresholds, a page map) under its staging directory: numpy arrays saved
to any Beam filesystem path and memory-mapped when read back (a remote file is copied to a temporary file first,
removed once mapped). Maps of strings: artifacts/trie_map.py."""

from __future__ import annotations

import io

import numpy as np

from artifacts import fs


def save_array(path: str, array: np.ndarray) -> str:
    """Write ``array`` as a .npy file at ``path``; returns ``path``."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    fs.write_bytes(path, buffer.getvalue())
    return path


def load_array(path: str) -> np.ndarray:
    """The .npy file at ``path``, memory-mapped (read-only)."""
    with fs.local_copy(path) as local:
        return np.load(local, mmap_mode="r", allow_pickle=False)
