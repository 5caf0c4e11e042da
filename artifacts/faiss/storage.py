"""FAISS indexes and numpy arrays on a local path or any Beam filesystem URL (through local temporary files)."""

from __future__ import annotations

import io

import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from artifacts import fs
from artifacts.errors import InputError, first_line


class MissingIndexFileError(InputError):
    """An index file that the index stage should have written is not there."""

    def __init__(self, path: str) -> None:
        super().__init__(f"missing index file {path}")
        self.path = path


def write_index(index, path: str) -> None:
    """Write a FAISS index to a local path (in place) or any Beam filesystem URL (through a local temporary file)."""
    import faiss

    with fs.local_target(path) as local_path:
        faiss.write_index(index, local_path)


def read_index(path: str, mmap: bool = True):
    """Read a FAISS index (memory-mapped where the type allows) from a local path or a Beam filesystem URL. A
    local file is mapped where it is; a remote one is copied to a temporary directory that is removed once the
    index is read (a mapping stays valid after its file is unlinked, on POSIX), so nothing is left behind."""
    if not fs.exists(path):
        raise MissingIndexFileError(path)
    with fs.local_copy(path) as local_path:
        return _read_local_index(local_path, path, mmap)


def stored_ids(index) -> np.ndarray | None:
    """The passage ids a FAISS index stores (an IDMap's id map, or an IVF index's inverted lists, list by list);
    None for an index that stores none."""
    import faiss

    mapped = faiss.downcast_index(index)
    if isinstance(mapped, faiss.IndexIDMap):
        return faiss.vector_to_array(mapped.id_map).astype(np.int64)
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:  # neither an IDMap nor an IVF index
        return None
    lists, parts = ivf.invlists, [np.zeros(0, np.int64)]
    for number in range(ivf.nlist):
        size = lists.list_size(number)
        if size:
            pointer = lists.get_ids(number)
            parts.append(faiss.rev_swig_ptr(pointer, size).astype(np.int64))  # a copy
            lists.release_ids(number, pointer)
    return np.concatenate(parts)


def _read_local_index(local_path: str, path: str, mmap: bool):
    """Read the local file ``local_path``, a copy of ``path`` (what errors name)."""
    import faiss

    flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
    try:
        return faiss.read_index(local_path, flags)
    except RuntimeError:
        pass  # some index types cannot be memory-mapped: read them whole
    try:
        return faiss.read_index(local_path)
    except RuntimeError as error:
        raise DamagedIndexError(path, _faiss_reason(error)) from error


class DamagedIndexError(InputError):
    """A FAISS file that exists but cannot be read (cut short, overwritten)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} is damaged: {reason}")
        self.path, self.reason = path, reason


def _faiss_reason(error: RuntimeError) -> str:
    """The readable end of FAISS's 'Error in <C++ signature> at <file>:<line>: <reason>' message."""
    text = first_line(error)
    if "read error" in text:
        return "the file ends before the index does (cut short?)"
    return text.rsplit(": ", 1)[-1]


def write_npy(path: str, array: np.ndarray) -> None:
    with fs.local_target(path) as local_path, open(local_path, "wb") as handle:
        np.save(handle, array)


def read_npy(path: str) -> np.ndarray:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return np.load(io.BytesIO(handle.read()))
