"""Files a stage writes for its own workers (a title map, thresholds, a page map) under its staging directory:
numpy arrays and marisa tries saved to any Beam filesystem path and memory-mapped when read back (a remote file
is copied to a temporary file first, removed once mapped)."""

from __future__ import annotations

import io
import os
import tempfile

import marisa_trie
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


def save_trie(path: str, trie: marisa_trie.Trie) -> str:
    """Write ``trie`` at ``path``; returns ``path``."""
    with tempfile.TemporaryDirectory(prefix="kpr-trie-") as local:
        trie.save(os.path.join(local, "trie"))
        with open(os.path.join(local, "trie"), "rb") as handle:
            fs.write_bytes(path, handle.read())
    return path


def load_trie(path: str) -> marisa_trie.Trie:
    """The marisa trie at ``path``, memory-mapped."""
    with fs.local_copy(path) as local:
        return marisa_trie.Trie().mmap(local)
