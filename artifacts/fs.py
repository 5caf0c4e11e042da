"""Small file helpers over Beam's FileSystems, so OUT can be a local path or any Beam filesystem URL.

Beam is imported on first use, not with this module: the runtime linker reads its files through here and must
load without Beam.
"""

from __future__ import annotations

import bz2
import contextlib
import errno
import fnmatch
import glob
import gzip
import hashlib
import io
import json
import os
import re
import tempfile
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, TypeVar

from artifacts.errors import InputError, first_line

_CHUNK = 1 << 20
# Reads of remote files that run at once in ``read_each`` (an object store answers a request after tens of ms).
REMOTE_READS = 16
T = TypeVar("T")
# What a read of scattered ranges from an object store fetches at least (Beam's readers: 16 MB, for sequential reads).
RANGE_READ_BYTES = 256 << 10
_GLOB_CHARACTER = re.compile(r"[*?\[]")  # what makes a path a glob for Beam's match (fnmatch's rules)
# What a truncated or corrupt archive raises while it is being read (bz2: OSError/EOFError; gzip: also zlib.error).
ARCHIVE_ERRORS = (OSError, EOFError, zlib.error)


def _filesystems() -> Any:
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def _uncompressed() -> Any:
    from apache_beam.io.filesystem import CompressionTypes

    return CompressionTypes.UNCOMPRESSED


def join(base: str, *parts: str) -> str:
    """Join path parts the way the filesystem of ``base`` does."""
    if not parts:
        return base
    return os.path.join(base, *parts) if "://" not in base else _filesystems().join(base, *parts)


def basename(path: str) -> str:
    """The last part of a local path or a URL."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def located(base: str, name: str) -> str:
    """``name`` relative to ``base`` (how artifacts refer to each other) as a path under ``base``; an absolute
    path or URL (as older artifacts stored) and the empty name stay as they are."""
    if not name or "://" in name or os.path.isabs(name):
        return name
    return join(base, *name.split("/"))


def exists(path: str) -> bool:
    """Whether ``path`` exists; a local one that a directory on its way keeps this user from looking at is a
    ``PermissionError`` (said "missing", a run on a shared disk of another user's was sent to be computed again)."""
    if not is_local(path):
        return _filesystems().exists(path)
    try:
        os.stat(path.removeprefix("file://"))
    except PermissionError:
        raise
    except (OSError, ValueError):  # not there, a file on the way, a name the OS refuses
        return False
    return True


def list_files(directory: str, pattern: str = "*") -> list[str]:
    """Files directly under ``directory`` matching ``pattern`` (a file name pattern), sorted by path; none where
    there is no such directory (an object store's prefix with no file below it: never test it with exists()). A local
    directory is scanned without a stat of each file (Beam's match reads every file's size and time: a follower
    lists its inputs' directory once for every file it takes)."""
    if _is_plain_path(directory):
        try:
            with os.scandir(directory) as entries:
                return sorted(join(directory, entry.name) for entry in entries
                              if entry.is_file() and fnmatch.fnmatchcase(entry.name, pattern))
        except (FileNotFoundError, NotADirectoryError):
            return []
    result = _filesystems().match([join(directory, pattern)])[0]
    return sorted(m.path for m in result.metadata_list)


def list_tree(directory: str) -> list[str]:
    """All files below ``directory`` (any depth), sorted by path; none if there is no such directory. Matched, not
    tested with exists() first: on object stores a "directory" is only a prefix, which exists() does not see."""
    result = _filesystems().match([join(directory, "**")])[0]
    return sorted(m.path for m in result.metadata_list)


def newest_update(directory: str) -> float | None:
    """When a file below ``directory`` was last written, the latest of them (seconds since the epoch); None when
    there is none."""
    result = _filesystems().match([join(directory, "**")])[0]
    return max((item.last_updated_in_seconds for item in result.metadata_list), default=None)


def size(path: str) -> int:
    return _filesystems().match([path])[0].metadata_list[0].size_in_bytes


def open_read(path: str) -> IO[bytes]:
    """A seekable binary stream of the file at ``path``."""
    if _is_plain_path(path):  # plain local paths need no Beam (the runtime linker reads its files here)
        return open(path, "rb")
    return _filesystems().open(path, compression_type=_uncompressed())


def open_ranges(path: str, read_ahead: int = RANGE_READ_BYTES) -> IO[bytes]:
    """A seekable binary stream of the file at ``path`` for reads of scattered byte ranges (one bucket's record
    batch of a part file, one bz2 stream of a dump). Beam's object-store readers fetch 16 MB at each read outside
    what they hold, which serves sequential reads but made a 64 KB record batch cost 16 MB; here a read outside the
    buffer fetches what it asks or ``read_ahead`` bytes, whichever is more (256 KB: a record batch's metadata and
    buffers in one request; 0 for reads of known sizes): on GCS Beam's own reader with that buffer, on a filesystem
    whose reader is a buffer over ranged reads (S3, Azure) that stream under a buffer of that size. A local path is
    the file. A one-line InputError if it cannot be opened."""
    buffer = max(read_ahead, 1)
    try:
        if _is_plain_path(path):
            return open(path, "rb")
        if path.startswith("gs://"):
            from apache_beam.io.gcp.gcsio import GcsIO

            # Options of their own (no flags: PipelineOptions() would parse this process's command line).
            return GcsIO(pipeline_options={}).open(path, "rb", read_buffer_size=buffer)
        handle = _filesystems().open(path, compression_type=_uncompressed())
    except Exception as error:  # Beam wraps every filesystem's own error type in its own
        raise InputError(f"cannot open {path}: {first_line(error)}") from error
    if isinstance(handle, io.BufferedReader):  # over a stream of ranged reads: a smaller buffer over it
        return io.BufferedReader(handle.detach(), buffer_size=buffer)
    return handle


def read_each(paths: Sequence[str], read: Callable[[str], T]) -> Iterator[T]:
    """``read(path)`` of each of ``paths``, in their order. Where some are remote, up to ``REMOTE_READS`` reads run
    at once on threads (a reduce reads one bucket from each of hundreds of files, each read a few requests that an
    object store answers after tens of milliseconds); local files are read one at a time."""
    if len(paths) < 2 or all(map(_is_plain_path, paths)):
        yield from map(read, paths)
        return
    with ThreadPoolExecutor(REMOTE_READS) as pool:
        running: deque[Future[T]] = deque()
        for path in paths:
            running.append(pool.submit(read, path))
            if len(running) == REMOTE_READS:
                yield running.popleft().result()
        while running:
            yield running.popleft().result()


def has_glob_characters(pattern: str) -> bool:
    """Whether a path flag's value may be a glob (``is_glob`` asks its filesystem)."""
    return bool(_GLOB_CHARACTER.search(pattern))


def names_file_as_written(pattern: str) -> bool:
    """Whether a value with a ``*``, ``?`` or ``[`` names a file as it is written (a part file ``x[1].bz2``), which
    Beam's match would read as a glob (``x1.bz2``)."""
    return has_glob_characters(pattern) and exists(pattern)


def is_glob(pattern: str) -> bool:
    """Whether a path flag's value is a glob: it has a ``*``, ``?`` or ``[`` and names no file as it is written."""
    return has_glob_characters(pattern) and not names_file_as_written(pattern)


def _metadata(pattern: str, as_written: bool) -> list[Any]:
    """Beam's FileMetadata of the file ``pattern`` names ``as_written``, else of what Beam's match finds."""
    if as_written:
        return [_filesystems().get_filesystem(pattern).metadata(pattern)]
    return _filesystems().match([pattern])[0].metadata_list


def metadata_of(pattern: str) -> list[Any]:
    """Beam's FileMetadata of what a path or glob names; of a path that names a file as it is written, its own."""
    return _metadata(pattern, names_file_as_written(pattern))


def matching(pattern: str) -> list[Any]:
    """The files (Beam FileMetadata: path, size) a path or glob names on any Beam filesystem, by path; a
    one-line InputError when it cannot be listed or names a directory (which Beam lists as if it were a file)."""
    as_written = names_file_as_written(pattern)  # outside the try: a storage client's error (a library missing)
    try:  # as it is, for the command line to word it
        found = _metadata(pattern, as_written)
    except Exception as error:  # Beam wraps every filesystem's own error type in its own
        raise InputError(f"cannot list {pattern}: {first_line(error)}") from error
    files = [item for item in found if not (_is_plain_path(item.path) and os.path.isdir(item.path))]
    if len(files) < len(found):
        raise InputError(f"{pattern} is a directory: name its files (a path, or a glob such as {join(pattern, '*')})")
    return sorted(files, key=lambda item: item.path)


def matching_files(pattern: str) -> list[str]:
    """The paths of the files a path or glob names (on any Beam filesystem), sorted; a one-line InputError when
    there is none."""
    found = [metadata.path for metadata in matching(pattern)]
    if not found:
        raise InputError(f"no file matches {pattern}")
    return found


def expand_glob(pattern: str) -> list[str]:
    """A glob as the files it matches, sorted (as a shell lists them: part files in order, their indexes in the same
    order); any other path (one that names a file as it is written too) as it is (where it is missing, opening it
    says so)."""
    return matching_files(pattern) if is_glob(pattern) else [pattern]


def open_input(path: str) -> IO[bytes]:
    """An input file's bytes as stored (a dump, a corpus, an SQL table); a one-line InputError if it cannot be
    opened."""
    try:
        return _filesystems().open(path, compression_type=_uncompressed())
    except Exception as error:  # Beam wraps every filesystem's own error type in its own
        raise InputError(f"cannot open {path}: {first_line(error)}") from error


@contextlib.contextmanager
def open_decompressed(path: str) -> Iterator[IO[bytes]]:
    """An input file's content, decompressed by its suffix in any case (.bz2 with any number of streams, .gz), as a
    context: the file is closed with the decompressor (which leaves a file object it was handed open). Reading a cut
    or corrupt archive raises one of ``ARCHIVE_ERRORS``."""
    with open_input(path) as raw:
        if path.lower().endswith(".bz2"):
            with bz2.BZ2File(raw) as stream:
                yield stream
        elif path.lower().endswith(".gz"):
            with gzip.GzipFile(fileobj=raw) as stream:
                yield stream
        else:
            yield raw


def is_compressed(path: str) -> bool:
    """Whether ``open_decompressed`` decompresses the file (Python's own readers: a cut archive raises)."""
    return path.lower().endswith((".bz2", ".gz"))


# What a file's first bytes say it is compressed as, and the suffix that reads it so (xz: none does); bzip2's
# magic is "BZh", a level digit, then its first block's "1AY&SY" (a text may start "BZh9").
_MAGIC = ((re.compile(rb"\x1f\x8b"), "gzip", ".gz"), (re.compile(rb"BZh[1-9]1AY&SY", re.DOTALL), "bzip2", ".bz2"),
          (re.compile(rb"\xfd7zXZ\x00"), "xz", ""))


def compression_of(start: bytes) -> tuple[str | None, str]:
    """(kind, suffix that reads it) of a file whose first bytes are ``start`` (10 of them say it): (None, "") when
    they are no compressed file's."""
    return next(((kind, suffix) for magic, kind, suffix in _MAGIC if magic.match(start)), (None, ""))


def misnamed_compression(path: str) -> str | None:
    """What is wrong where a file's first bytes and its name disagree on its compression (``open_decompressed``
    goes by the name: its error then says nothing of why), e.g. ``its bytes are gzip-compressed: its name should end
    in .gz``; None where they agree."""
    with open_input(path) as raw:
        kind, suffix = compression_of(raw.read(10))
    named = next((ending for ending in (".bz2", ".gz") if path.lower().endswith(ending)), "")
    if suffix == named and kind != "xz":
        return None
    if kind is None:
        return f"its bytes are not compressed: its name should not end in {named}"
    if not suffix:
        return f"its bytes are {kind}-compressed, which is not read: decompress it, or compress it as .bz2 or .gz"
    return f"its bytes are {kind}-compressed: its name should end in {suffix}"


def read_bytes(path: str) -> bytes:
    with open_read(path) as handle:
        return handle.read()


def read_json(path: str) -> Any:
    return json.loads(read_bytes(path).decode("utf-8"))


def create(path: str) -> IO[bytes]:
    """A new file at ``path`` (any Beam filesystem; local parent directories are made), open for writing."""
    return _filesystems().create(path, compression_type=_uncompressed())


def write_bytes(path: str, data: bytes) -> None:
    with create(path) as handle:
        handle.write(data)


class PathError(InputError):
    """An error about one ``path``, its message made from it (``MESSAGE``); pickled by its path, as Beam ships a
    worker's exception."""

    MESSAGE = "{path}"

    def __init__(self, path: str) -> None:
        super().__init__(self.MESSAGE.format(path=path))
        self.path = path

    def __reduce__(self):
        return type(self), (self.path,)


class DirectoryTargetError(PathError):
    """A file was to be written (or removed) where a directory is: nothing there is touched."""

    MESSAGE = "{path} is a directory, not a file: it is left as it is"


def is_directory(path: str) -> bool:
    """Whether ``path`` is a directory: on a local disk one that exists, on object stores a prefix with objects."""
    if _is_plain_path(path):
        return os.path.isdir(path)
    return bool(_filesystems().match([join(path, "**")])[0].metadata_list)


class FileInTheWayError(PathError):
    """A file where a directory goes (OUT/.staging, OUT/report, ...)."""

    MESSAGE = "{path} is a file, where a directory goes: move it away (it is left as it is)"


def require_directory_target(path: str) -> None:
    """Raise a FileInTheWayError if ``path``, about to hold files, is a file (local paths: an object store has no
    files in the way of a prefix)."""
    if _is_plain_path(path) and os.path.lexists(path) and not os.path.isdir(path):
        raise FileInTheWayError(path)


def unchangeable_directory(path: str, whole_tree: bool = True) -> str | None:
    """The first directory at local ``path`` (with ``whole_tree``, or below it) whose entries this user may not list,
    remove or add (its permissions, a read-only filesystem): one ``delete_tree`` or a rename into it would fail on;
    None when there is none, or ``path`` is remote or absent (root passes every check but a read-only
    filesystem's)."""
    if not _is_plain_path(path) or not os.path.isdir(path):
        return None
    unlistable: list[str] = []  # a directory os.walk cannot open is passed over: its error says which
    walked = (directory for directory, _, _ in os.walk(path, onerror=lambda error: unlistable.append(error.filename)))
    for directory in walked if whole_tree else [path]:
        if unlistable:
            return unlistable[0]
        if not os.access(directory, os.R_OK | os.W_OK | os.X_OK):
            return directory
    return unlistable[0] if unlistable else None


def require_file_target(path: str) -> None:
    """Raise a DirectoryTargetError if ``path``, about to be written as a file, is a directory."""
    if is_directory(path):
        raise DirectoryTargetError(path)


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Replace the file ``path`` so that a reader sees the old content or the new, never a part or none
    (``atomic_target``); on object stores one write."""
    if _is_plain_path(path):
        with atomic_target(path) as local, open(local, "xb") as out:  # "x": never an existing file
            out.write(data)
        return
    require_file_target(path)
    write_bytes(path, data)


@contextlib.contextmanager
def atomic_target(path: str) -> Iterator[str]:
    """A local path to write the file ``path`` through, so that a reader sees the old content or the new, never a
    part or none: on a local disk a new temporary sibling, renamed over ``path`` when the block ends (removed if it
    fails); elsewhere a local file uploaded then (an object is replaced whole). What is written streams to disk:
    a large file is never held in memory whole.

    Nothing is deleted first: a directory at ``path`` raises a DirectoryTargetError and stays as it is.
    """
    require_file_target(path)
    if not _is_plain_path(path):
        with local_target(path) as local:
            yield local
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # a new name, created by the caller with the usual permissions (mkstemp's are 0600)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        yield temporary
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        if isinstance(error, OSError) and error.errno and error.filename is None:  # a full disk's write names none
            error.filename = path
        raise


def remove_temporaries(path: str, min_age_s: float = 0.0) -> None:
    """Remove the temporary siblings that ``atomic_target`` made for ``path`` and a killed writer left (to be
    called by the one writer of ``path``, under its lock; a writer that holds none leaves those of the last
    ``min_age_s`` seconds, which may be another's being written); on object stores there are none."""
    if _is_plain_path(path):
        for temporary in Path(path).parent.glob(f".{glob.escape(os.path.basename(path))}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                if time.time() - temporary.stat().st_mtime >= min_age_s:
                    temporary.unlink()


def _is_plain_path(path: str) -> bool:
    """A local path without a scheme (os functions apply as they are)."""
    return "://" not in path


def upload(local: str, path: str) -> None:
    """Copy the local file ``local`` to ``path`` (any filesystem) chunk by chunk."""
    with open(local, "rb") as source, _filesystems().create(path, compression_type=_uncompressed()) as target:
        while chunk := source.read(_CHUNK):
            target.write(chunk)


def write_json_atomic(path: str, value: Any) -> None:
    write_bytes_atomic(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def iter_chunks(path: str, chunk_size: int = _CHUNK) -> Iterator[bytes]:
    with _filesystems().open(path, compression_type=_uncompressed()) as handle:
        while chunk := handle.read(chunk_size):
            yield chunk


def sha256(path: str) -> str:
    """The SHA-256 of the file ``path``, read chunk by chunk into one buffer: a new chunk object each time is a
    block that the allocator maps and faults in anew (the 474 MB index of 307,087 passages hashed in 0.45-0.60 s
    against 0.26, one core, the command line's allocator settings)."""
    digest = hashlib.sha256()
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with _filesystems().open(path, compression_type=_uncompressed()) as handle:
        while size := handle.readinto(buffer):
            digest.update(view[:size])
    return digest.hexdigest()


def delete_tree(directory: str) -> None:
    """Delete every file below ``directory`` (and the directory itself where the filesystem has directories). On an
    object store a "directory" is a prefix that exists() does not see and a delete of its name does not empty: each
    file listed below it is deleted."""
    if _filesystems().exists(directory):
        _filesystems().delete([directory])
    elif files := list_tree(directory):
        _filesystems().delete(files)


def delete_file(path: str) -> None:
    """Delete the file ``path`` if there is one; a directory there raises a DirectoryTargetError and stays (Beam's
    delete would remove a whole tree)."""
    require_file_target(path)
    if _filesystems().exists(path):
        _filesystems().delete([path])


def mkdirs(directory: str) -> None:
    """Create ``directory`` where the filesystem has directories (object stores need nothing)."""
    if not _filesystems().exists(directory):
        try:
            _filesystems().mkdirs(directory)
        except OSError:  # made meanwhile by another process (Beam's local mkdirs refuses an existing directory)
            if not _filesystems().exists(directory):
                raise


def ensure_parent(path: str) -> None:
    """Create the directory of ``path`` where the filesystem has directories."""
    mkdirs(path.rsplit("/", 1)[0])


def relative(path: str, base: str) -> str:
    """``path`` relative to ``base`` with forward slashes."""
    prefix = base.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not below {base}")
    return path[len(prefix) :]


def stays_below(relative: str) -> bool:
    """Whether ``relative`` (a "/"-separated name a record under a directory stores) names something below that
    directory: not empty, not absolute, no URL, no ``..`` or empty part (a damaged or hostile record must not make a
    command read or delete a file elsewhere)."""
    return ("://" not in relative and not os.path.isabs(relative)
            and all(part not in ("", ".", "..") for part in relative.removesuffix("/").split("/")))


def is_local(path: str) -> bool:
    """Whether ``path`` is a plain local path rather than a Beam filesystem URL (``gs://``, ``s3://``, ...)."""
    return "://" not in path or path.startswith("file://")


def resolved(path: str) -> str:
    """``path`` as one place is named however it is written: on a local disk absolute, without ``file://``, its
    symbolic links resolved (a link into a run is inside it); a URL less its final /."""
    return os.path.realpath(path.removeprefix("file://")) if is_local(path) else path.rstrip("/")


def same_file_key(path: str) -> str | tuple[int, int]:
    """What names one file however it is reached: a local file's device and inode (a hard link is the file it links
    to), else ``resolved``."""
    if is_local(path):
        with contextlib.suppress(OSError):
            status = os.stat(path.removeprefix("file://"))
            return status.st_dev, status.st_ino
    return resolved(path)


def overlaps(first: str, second: str) -> bool:
    """Whether one path is the other or lies inside it (``resolved``: however each is written)."""
    first, second = resolved(first), resolved(second)
    return first == second or first.startswith(second + "/") or second.startswith(first + "/")


def require_run_directory(path: str, flag: str) -> None:
    """Raise an InputError unless local ``path`` is a directory (a run to read: a mistyped path said only that no
    stage had completed there). Remote URLs are not checked: a prefix is no directory."""
    if not is_local(path):
        return
    local = os.path.abspath(path.removeprefix("file://"))
    if not os.path.exists(local):
        raise InputError(f"{flag} {path}: no such directory")
    if not os.path.isdir(local):
        raise InputError(f"{flag} {path} is a file, not a run's directory")


def require_writable_directory(path: str, flag: str) -> None:
    """Raise an InputError unless local ``path`` is, or can be created as, a writable directory.

    Nothing is left here: a file is made and removed at once where the directory would be made (root passes every
    permission check, also where nothing can be written: /proc). Remote URLs are not checked: their permissions show
    only when writing.
    """
    if not is_local(path):
        return
    current = os.path.abspath(path.removeprefix("file://"))
    while not os.path.exists(current):
        current = os.path.dirname(current)
    if not os.path.isdir(current):
        where = "" if current == os.path.abspath(path) else f" ({current} is a file)"
        raise InputError(f"{flag} {path} is not a directory{where}")
    if not os.access(current, os.W_OK):
        reason = "a read-only filesystem" if _read_only(current) else "no write permission"
        raise InputError(f"{flag} {path} is not writable ({current}: {reason})")
    try:
        with tempfile.TemporaryFile(dir=current):
            pass
    except OSError as error:
        raise InputError(f"{flag} {path} is not writable ({current}: a file cannot be made there: "
                         f"{error.strerror or error})") from error


def _read_only(directory: str) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError as error:
        return error.errno == errno.EROFS


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
    """A local path with the content of ``path``, to memory-map: ``path`` itself when it is local, else a temporary
    copy removed when the block ends (on POSIX a mapping made inside the block stays valid after the removal)."""
    if _is_plain_path(path):
        yield path
        return
    handle, local = tempfile.mkstemp(prefix="kpr-copy-", suffix=os.path.basename(path))
    try:
        with os.fdopen(handle, "wb") as out:
            for chunk in iter_chunks(path):
                out.write(chunk)
        yield local
    finally:
        os.unlink(local)


@contextlib.contextmanager
def local_target(path: str) -> Iterator[str]:
    """A local path to write ``path`` through: ``path`` itself when it is local (nothing copied), else a file in a
    temporary directory, uploaded to ``path`` when the block ends."""
    if _is_plain_path(path):
        ensure_parent(path)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="kpr-upload-") as local:
        local_path = os.path.join(local, os.path.basename(path))
        yield local_path
        upload(local_path, path)


def human_size(size: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 KB``, ``3.2 GB`` (powers of 1024)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    raise AssertionError("unreachable")
