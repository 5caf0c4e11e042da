"""A read-only map from strings to integers that a worker memory-maps instead of holding: a marisa trie of the keys
and a numpy array of one value per key id, two files in one directory (local or any Beam filesystem URL).

The dictionary build writes two: entity title -> entity_id, and candidate name -> bucket (the name id is the key id);
the mentions stage one: entity title -> entity_id.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import marisa_trie
import numpy as np
import pyarrow as pa

from artifacts import fs

KEYS_FILE, VALUES_FILE = "keys.trie", "values.npy"
# Strings of an Arrow array made Python objects at a time: tries are built and looked up through such slices,
# never through a list of millions of Python strings.
STRING_SLICE = 1 << 16


def iter_strings(strings: pa.Array | pa.ChunkedArray) -> Iterator[str]:
    """The values of an Arrow string array as Python strings, a slice at a time."""
    for start in range(0, len(strings), STRING_SLICE):
        yield from strings.slice(start, STRING_SLICE).to_pylist()


def restored_strings(trie: marisa_trie.Trie, key_ids: np.ndarray) -> pa.ChunkedArray:
    """The keys of ``key_ids`` in ``trie``, as an Arrow string array (the inverse of ``trie_key_ids``)."""
    return pa.chunked_array([pa.array([trie.restore_key(key) for key in key_ids[start:start + STRING_SLICE].tolist()],
                                      pa.string()) for start in range(0, len(key_ids), STRING_SLICE)], pa.string())


def trie_key_ids(trie: marisa_trie.Trie, strings: pa.Array | pa.ChunkedArray, dtype=np.int64) -> np.ndarray:
    """The key id of each string of an Arrow array in ``trie`` (every string must be a key)."""
    return np.fromiter((trie[key] for key in iter_strings(strings)), dtype=dtype, count=len(strings))


@dataclass(frozen=True)
class TrieMap:
    """``keys``: the trie (key id = ``keys[key]``); ``values[key id]``: the key's value."""

    keys: marisa_trie.Trie
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)

    def get(self, key: str) -> int | None:
        """The value of ``key``, or None when the map does not have it."""
        key_id = self.keys.get(key)
        return None if key_id is None else int(self.values[key_id])

    def key_ids(self, keys: Iterable[str]) -> np.ndarray:
        """The key id of each of ``keys``, -1 for a key not in the map."""
        trie = self.keys
        return np.fromiter((trie.get(key, -1) for key in keys), dtype=np.int64)

    def lookup(self, keys: Iterable[str], missing: int = -1) -> np.ndarray:
        """The value of each of ``keys``, ``missing`` for a key not in the map."""
        ids = self.key_ids(keys)
        found = ids >= 0
        result = np.full(len(ids), missing, dtype=np.int64)
        result[found] = self.values[ids[found]]
        return result


def string_array(strings: pa.Array | pa.ChunkedArray | Sequence[str]) -> pa.Array | pa.ChunkedArray:
    """``strings`` as an Arrow string array (Arrow arrays as they are)."""
    return strings if isinstance(strings, (pa.Array, pa.ChunkedArray)) else pa.array(strings, pa.string())


def build_trie_map(keys: pa.Array | pa.ChunkedArray | Sequence[str], values: np.ndarray) -> TrieMap:
    """The map of distinct ``keys`` to ``values`` (aligned with ``keys``), values stored in ``values``' dtype."""
    keys = string_array(keys)
    if len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys for {len(values)} values")
    trie = marisa_trie.Trie(iter_strings(keys))
    by_id = np.zeros(len(trie), dtype=values.dtype)
    by_id[trie_key_ids(trie, keys)] = values
    return TrieMap(trie, by_id)


def save_trie_map(directory: str, trie_map: TrieMap) -> None:
    """Write ``trie_map``'s two files under ``directory``."""
    with tempfile.TemporaryDirectory() as local:
        trie_map.keys.save(os.path.join(local, KEYS_FILE))
        np.save(os.path.join(local, VALUES_FILE), trie_map.values)
        for name in (KEYS_FILE, VALUES_FILE):
            fs.upload(os.path.join(local, name), fs.join(directory, name))


def load_trie_map(directory: str) -> TrieMap:
    """The map under ``directory``, memory-mapped (a remote file through a local copy removed right after)."""
    with fs.local_copy(fs.join(directory, KEYS_FILE)) as keys, fs.local_copy(fs.join(directory, VALUES_FILE)) as values:
        return TrieMap(marisa_trie.Trie().mmap(keys), np.load(values, mmap_mode="r"))
