"""The files a command wrote into a directory the user named (export-kpr's DIR, publish's DEST), recorded in a
small JSON file there, so that a later run replaces or removes only those and never a file of the user's.

A command first finds what is in the way of what it will write (``in_the_way``) and refuses anything it did not
write; before it changes anything it records every file it has written or is about to write (a killed run still
owns its partial files), and when done it records exactly the files it wrote.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping

from artifacts import fs
from artifacts.errors import InputError


class ForeignFileError(InputError):
    """A file (or directory) in the way of a command's output that no earlier run of the command wrote."""

    def __init__(self, directory: str, relative: str, writer: str) -> None:
        super().__init__(f"{fs.join(directory, relative)} is in the way and no earlier {writer} wrote it: it is left "
                         "as it is (move it away or write somewhere else)")
        self.directory, self.relative, self.writer = directory, relative, writer

    @property
    def path(self) -> str:
        return fs.join(self.directory, self.relative)

    def __reduce__(self):
        return type(self), (self.directory, self.relative, self.writer)


def load_record(directory: str, record: str) -> frozenset[str]:
    """The relative paths that ``directory/record`` says an earlier run wrote (none if there is no record)."""
    path = fs.join(directory, record)
    if not fs.exists(path) or fs.is_directory(path):
        return frozenset()
    try:
        files = fs.read_json(path)["files"]
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(f"{path} is not a record of written files ({error}): it is left as it is") from error
    if not isinstance(files, list):
        raise InputError(f"{path} is not a record of written files (its \"files\" is not a list): it is left as it is")
    # a damaged or hand-edited record must not make the command delete a file elsewhere
    outside = next((name for name in files if not isinstance(name, str) or not fs.stays_below(name)), None)
    if outside is not None:
        raise InputError(f"{path} is not a record of written files: it lists {outside!r}, which is not a path below "
                         f"{directory}; nothing was changed (move the record away to write here)")
    return frozenset(files)


def save_record(directory: str, record: str, files: Iterable[str], facts: Mapping[str, str] | None = None) -> None:
    """Record the ``files`` written into ``directory`` (and ``facts`` of the writing, beside them)."""
    fs.write_json_atomic(fs.join(directory, record), {"files": sorted(set(files)), **(facts or {})})


def add_to_record(directory: str, record: str, files: Iterable[str]) -> None:
    """Add ``files`` to the record of files written into ``directory``, its facts kept."""
    path = fs.join(directory, record)
    facts = {name: value for name, value in fs.read_json(path).items() if name != "files"} if fs.exists(path) else {}
    save_record(directory, record, [*load_record(directory, record), *files], facts)


def in_the_way(directory: str, files: Iterable[str], trees: Iterable[str]) -> list[str]:
    """What exists under ``directory`` where ``files`` (relative paths) go or below ``trees`` (relative directories
    the command fills): relative paths of files (a file where a tree goes included), and ``NAME/`` for a directory
    where a file goes; sorted."""
    filled = set(trees)
    found: set[str] = set()
    for tree in filled:  # one listing per tree (on object stores a listing is one request, not one per file)
        path = fs.join(directory, tree)
        listed = [fs.relative(found_path, directory) for found_path in fs.list_tree(path)]
        if not listed and fs.exists(path) and not fs.is_directory(path):
            listed = [tree]  # a file where the tree goes
        found.update(listed)
    for relative in files:
        if relative.split("/")[0] in filled:
            continue  # listed above: the file itself, or the files of a directory in its place
        path = fs.join(directory, relative)
        if fs.is_directory(path):
            found.add(relative + "/")
        elif fs.exists(path):
            found.add(relative)
    return sorted(found)


def is_owned(relative: str, owned: frozenset[str]) -> bool:
    """Whether ``owned`` lists the file ``relative``, or a directory (``NAME/``, e.g. a staging directory) that
    holds it."""
    return relative in owned or any(relative.startswith(entry) for entry in owned if entry.endswith("/"))


def require_owned(directory: str, record: str, files: Iterable[str], trees: Iterable[str],
                  writer: str) -> frozenset[str]:
    """The files an earlier ``writer`` recorded in ``directory``; a ForeignFileError names the first thing in the
    way of ``files`` and ``trees`` that it did not write."""
    owned = load_record(directory, record)
    foreign = [relative for relative in in_the_way(directory, [*files, record], trees)
               if not is_owned(relative, owned) and relative != record]
    if foreign:
        raise ForeignFileError(directory, foreign[0], writer)
    return owned


def remove_stale(directory: str, owned: Iterable[str], keep: Iterable[str]) -> list[str]:
    """Delete the ``owned`` files that are not in ``keep`` (an earlier run's files this one does not write; a
    recorded directory is the command's own to remove, and a directory found where a file was recorded is left
    alone); returns the deleted relative paths."""
    stale = sorted(relative for relative in set(owned) - set(keep)
                   if not relative.endswith("/") and not fs.is_directory(fs.join(directory, relative)))
    for relative in stale:
        fs.delete_file(fs.join(directory, relative))
    if fs.is_local(directory):
        remove_emptied_directories(directory.removeprefix("file://"), stale)
    return stale


def remove_emptied_directories(directory: str, removed: Iterable[str]) -> None:
    """The local directories below ``directory`` that held the ``removed`` files and now hold nothing, deepest
    first (``os.rmdir`` removes an empty directory and nothing else: one that holds anything stays)."""
    parents: set[str] = set()
    for relative in removed:
        while relative := os.path.dirname(relative):
            parents.add(relative)
    for parent in sorted(parents, key=lambda parent: parent.count("/"), reverse=True):
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(directory, parent))
