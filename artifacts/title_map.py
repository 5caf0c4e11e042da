"""The title map of a parse: every title of the dump's article namespace (articles, redirects, redirect targets) ->
where a link to it goes, and the Wikidata QID of its article; plus the positions of the article pages that are
duplicates of kept ones.

The parse stage builds it once, in one worker, from the titles of every page (redirect chains followed there), and
every worker then resolves the links of the articles it converted against it: ~17M titles for English Wikipedia, a
few hundred MB as a marisa trie and arrays indexed by the trie's key ids, memory-mapped once per worker process.
It is an intermediate of the parse stage (under OUT/.staging/parse/), not an artifact of the run.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import marisa_trie
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from artifacts import fs

TRIE = "titles.marisa"
RESOLVED = "resolved.npy"  # int32 per key id: the key id of the title a link to this title goes to
FLAGS = "flags.npy"  # uint8 per key id: ARTICLE | VIA_REDIRECT | RED
QIDS = "qids.arrow"  # Arrow IPC file, one string column "qid", one row per key id
DROPPED = "dropped.arrow"  # Arrow IPC file: the positions of article pages not kept (duplicates) and why
FILES = (TRIE, RESOLVED, FLAGS, QIDS, DROPPED)

ARTICLE = 1  # the title is an article of the dump
VIA_REDIRECT = 2  # a link to the title goes through a redirect
RED = 4  # a link to the title goes to no article of the dump


@dataclass(frozen=True)
class Resolution:
    """Where a link to a title goes: the ``target`` title, whether through a redirect, whether to no article."""

    target: str
    via_redirect: bool
    red: bool


@dataclass(frozen=True)
class TitleArrays:
    """The map's content in key-id order (see the module's file constants)."""

    resolved: np.ndarray
    flags: np.ndarray
    qids: pa.Array


def write_title_map(directory: str, trie: marisa_trie.Trie, arrays: TitleArrays, dropped: pa.Table) -> None:
    """Write a title map under ``directory`` (any Beam filesystem). ``dropped``: columns ``position`` and ``kind``."""
    with tempfile.TemporaryDirectory(prefix="kpr-title-map-") as local:
        trie.save(os.path.join(local, TRIE))
        np.save(os.path.join(local, RESOLVED), arrays.resolved.astype(np.int32))
        np.save(os.path.join(local, FLAGS), arrays.flags.astype(np.uint8))
        _write_arrow(os.path.join(local, QIDS), pa.table({"qid": arrays.qids}))
        _write_arrow(os.path.join(local, DROPPED), dropped)
        for name in FILES:
            with open(os.path.join(local, name), "rb") as handle:
                fs.write_bytes(fs.join(directory, name), handle.read())


def _write_arrow(path: str, table: pa.Table) -> None:
    with pa.OSFile(path, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def _read_arrow(path: str) -> pa.Table:
    """An Arrow IPC file, memory-mapped (its buffers stay valid after the file is removed)."""
    return ipc.open_file(pa.memory_map(path, "r")).read_all()


class TitleMap:
    """Lookups into a title map written by ``write_title_map``."""

    def __init__(self, trie: marisa_trie.Trie, arrays: TitleArrays, dropped: dict[str, str]) -> None:
        self._trie = trie
        self._arrays = arrays
        self._dropped = dropped

    @classmethod
    def load(cls, directory: str) -> TitleMap:
        """Memory-map a title map: in place when local; a remote one is copied file by file, each copy removed
        as soon as it is mapped."""
        with contextlib.ExitStack() as stack:
            local = {name: stack.enter_context(fs.local_copy(fs.join(directory, name))) for name in FILES}
            trie = marisa_trie.Trie()
            trie.mmap(local[TRIE])
            arrays = TitleArrays(np.load(local[RESOLVED], mmap_mode="r"), np.load(local[FLAGS], mmap_mode="r"),
                                 _read_arrow(local[QIDS]).column("qid"))
            dropped = _read_arrow(local[DROPPED])
        positions, kinds = dropped.column("position").to_pylist(), dropped.column("kind").to_pylist()
        return cls(trie, arrays, dict(zip(positions, kinds, strict=True)))

    def __len__(self) -> int:
        return len(self._trie)

    def resolve(self, title: str) -> Resolution:
        """Where a link to ``title`` goes; a title the map does not know is a red link to itself."""
        key = self._trie.get(title)
        if key is None:
            return Resolution(title, False, True)
        flags = int(self._arrays.flags[key])
        resolved = int(self._arrays.resolved[key])
        target = title if resolved == key else self._trie.restore_key(resolved)
        return Resolution(target, bool(flags & VIA_REDIRECT), bool(flags & RED))

    def qid(self, title: str) -> str | None:
        key = self._trie.get(title)
        return None if key is None else self._arrays.qids[key].as_py()

    def dropped_as(self, position: str) -> str | None:
        """Why the article page read at ``position`` is not kept (a duplicate counter's name), or None."""
        return self._dropped.get(position)

    def titles(self) -> Iterator[str]:
        return iter(self._trie)
