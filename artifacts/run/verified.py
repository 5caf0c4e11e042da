"""The content of recorded outputs that a reader is about to trust (the index shards search opens, the upstream
outputs a stage reads), checked against the manifest's sha256 once: a file that matched is remembered by path, size
and modification time, so a later reader does not hash it again (a 4 GB shard is 2.5 s of CPU and a read of the
whole file, where search maps it and reads only what it probes); ``trust_remembered=False`` hashes it again (search
--verify). A stage's launcher remembers the files it hashed at commit (``remember``), so the next stage on the same
machine only compares their stamps. The memory is a small JSON file in the user's cache directory, not under OUT,
which a reader may not be able to write (a published run); losing it only costs hashing again."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable

from apache_beam.io.filesystems import FileSystems

from artifacts import fs
from artifacts.run.manifest import OutputFile, files_missing_or_changed

CACHE_ENV = "KPR_VERIFIED_CACHE"  # the file remembering verified files (default: under XDG_CACHE_HOME or ~/.cache)


def cache_file() -> str:
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kpr-pipeline", "verified-files.json")


def file_stamp(path: str) -> list[float]:
    """[size, modification time] of a file on any Beam filesystem (JSON-comparable)."""
    metadata = FileSystems.match([path])[0].metadata_list[0]
    return [metadata.size_in_bytes, metadata.last_updated_in_seconds]


def load_verified() -> dict[str, dict]:
    """path -> {"stamp": [size, mtime], "sha256": digest} of the files verified before (empty if unreadable)."""
    try:
        with open(cache_file(), encoding="utf-8") as handle:
            verified = json.load(handle)
    except (OSError, ValueError):
        return {}
    return verified if isinstance(verified, dict) else {}


def save_verified(verified: dict[str, dict]) -> None:
    """Write the memory atomically; a cache directory that cannot be written only means hashing again."""
    path = cache_file()
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(verified, handle)
        os.replace(temporary, path)


def file_key(output: str, relative: str) -> str:
    """The memory's key of the file ``relative`` under ``output``: its absolute path, or its URL."""
    path = fs.join(output, relative)
    return os.path.abspath(path) if fs.is_local(path) else path


def remember(output: str, items: Iterable[OutputFile]) -> None:
    """Remember the files ``items`` under ``output`` as matching their sha256 (just hashed: a stage's committed
    outputs), forgetting the other files remembered in their artifact directories (those the commit replaced: the
    memory holds no more than the files there are)."""
    items = list(items)
    fresh = {file_key(output, item.path): {"stamp": file_stamp(fs.join(output, item.path)), "sha256": item.sha256}
             for item in items}
    directories = tuple({file_key(output, item.path.rsplit("/", 1)[0]) + "/" for item in items if "/" in item.path})
    kept = {key: value for key, value in load_verified().items() if not key.startswith(directories)}
    save_verified({**kept, **fresh})


def changed_files(output: str, items: Iterable[OutputFile], trust_remembered: bool = True,
                  hash_remote: bool = True) -> str | None:
    """The first of ``items`` (recorded outputs under ``output``) that is missing or of another size than the
    manifest says, else ``changed_content``'s answer (not hashed on a remote run unless ``hash_remote``); None
    when every file is as recorded."""
    items = list(items)
    problems = files_missing_or_changed(output, items)
    if problems:
        return problems[0]
    if not hash_remote and not fs.is_local(output):
        return None
    return changed_content(output, items, trust_remembered)


def changed_local_content(output: str, items: Iterable[OutputFile]) -> str | None:
    """``changed_content`` of a local run; None for a remote one, whose files are not downloaded to be hashed (an
    index of English Wikipedia is ~100 GB)."""
    return changed_content(output, items) if fs.is_local(output) else None


def changed_content(output: str, items: Iterable[OutputFile], trust_remembered: bool = True) -> str | None:
    """The first of ``items`` (recorded outputs under ``output``, of the size the manifest says) whose sha256 is
    not the manifest's, as ``path: ...``; None when all match. Files verified before with the same size and
    modification time are not hashed again, unless not ``trust_remembered``."""
    verified = load_verified()
    remembered = dict(verified)
    try:
        for item in items:
            path, key = fs.join(output, item.path), file_key(output, item.path)
            stamp = file_stamp(path)
            known = verified.get(key)
            if trust_remembered and known and known.get("stamp") == stamp and known.get("sha256") == item.sha256:
                continue
            if fs.sha256(path) != item.sha256:
                verified.pop(key, None)
                return f"{item.path}: its sha256 differs from the manifest's"
            verified[key] = {"stamp": stamp, "sha256": item.sha256}
        return None
    finally:
        if verified != remembered:
            save_verified(verified)
