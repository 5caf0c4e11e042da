"""Local files seen as an object store: the ``mirror://`` scheme, read as Beam reads an S3 object, each request's
bytes counted, and without directories as on GCS and S3 (a "directory" is a prefix of object names). The tests run
remote-path code on it; ``bench.reduce_reads`` measures what a read fetches."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from apache_beam.io.filesystem import CompressedFile, CompressionTypes, FileMetadata, FileSystem
from apache_beam.io.filesystemio import Downloader, DownloaderStream
from apache_beam.io.localfilesystem import LocalFileSystem

MIRROR = "mirror://"
UPLOAD_SUFFIX = ".mirror-upload"  # a file being written, beside where it appears when closed (never listed)


def mirrored(path: Path | str) -> str:
    """``path`` (a local absolute path) as a ``mirror://`` URL: the code sees a remote store and reads it through
    Beam's FileSystems as it reads ``s3://`` (in this process only: Beam finds the filesystem among the loaded
    subclasses of ``FileSystem``)."""
    return MIRROR + str(path)


def _local(path: str) -> str:
    return path[len(MIRROR):] if path.startswith(MIRROR) else path


# What Beam's S3 and Azure readers fetch at each read outside their buffer (``s3io.S3IO.open``'s default).
OBJECT_STORE_READ_BUFFER = 16 << 20


@dataclass
class RequestLog:
    """The requests of the ``mirror://`` filesystem in this process: each one's bytes (``fetched``) and the most
    that were under way at once; each is answered after ``delay`` seconds (an object store's latency)."""

    fetched: list[int] = field(default_factory=list)
    delay: float = 0.0
    most_at_once: int = 0
    _under_way: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self, delay: float = 0.0) -> None:
        """Forget the requests so far; answer the next ones after ``delay`` seconds."""
        self.fetched.clear()
        self.delay, self.most_at_once = delay, 0

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        with self._lock:
            self._under_way += 1
            self.most_at_once = max(self.most_at_once, self._under_way)
        try:
            time.sleep(self.delay)
            yield
        finally:
            with self._lock:
                self._under_way -= 1


class MirrorDownloader(Downloader):
    """A local file downloaded as Beam's S3 and Azure readers download an object: a request per ranged read, each
    one recorded in ``log``."""

    def __init__(self, path: str, log: RequestLog) -> None:
        self._path, self._log = path, log

    @property
    def size(self) -> int:
        return os.path.getsize(self._path)

    def get_range(self, start: int, end: int) -> bytes:
        with self._log.request(), open(self._path, "rb") as handle:
            handle.seek(start)
            data = handle.read(end - start)
        self._log.fetched.append(len(data))
        return data


class Upload(io.FileIO):
    """A file written as an object is uploaded: beside its place until it is closed, then there whole (a reader
    never finds part of it, as on GCS and S3)."""

    def __init__(self, path: str) -> None:
        self._target = path
        super().__init__(path + UPLOAD_SUFFIX, "wb")

    def close(self) -> None:
        if not self.closed:
            super().close()
            os.replace(self._target + UPLOAD_SUFFIX, self._target)


class MirrorFileSystem(LocalFileSystem):
    """The ``mirror://`` scheme: the local disk under URLs, so remote-path code runs without a cloud. A file is
    read as Beam reads an S3 object (a 16 MB buffer over ranged requests), each request recorded in ``log`` (in this
    process; ``log.clear()`` first). There are no directories, as Beam's GCS and S3 filesystems have none: only a
    file exists, a "directory" is a prefix that lists its files, and a delete removes the file named, or every file
    under a path that ends with ``/``; a file written appears when it is closed."""

    log: ClassVar[RequestLog] = RequestLog()

    @classmethod
    def scheme(cls) -> str:
        return "mirror"

    def join(self, basepath: str, *paths: str) -> str:
        return mirrored(os.path.join(_local(basepath), *paths))

    def split(self, path: str) -> tuple[str, str]:
        head, tail = os.path.split(_local(path))
        return mirrored(head), tail

    def _url_dirname(self, url_or_path: str) -> str:
        return mirrored(os.path.dirname(_local(url_or_path)))

    def has_dirs(self) -> bool:
        return False

    def _list(self, dir_or_prefix: str):
        prefix = _local(dir_or_prefix)
        for directory, _, names in os.walk(prefix if prefix.endswith("/") else os.path.dirname(prefix)):
            for name in names:
                if (path := os.path.join(directory, name)).startswith(prefix) and not name.endswith(UPLOAD_SUFFIX):
                    yield self.metadata(mirrored(path))

    def metadata(self, path: str) -> FileMetadata:
        status = os.stat(_local(path))
        return FileMetadata(path, status.st_size, status.st_mtime)

    def exists(self, path: str) -> bool:
        return os.path.isfile(_local(path))

    def mkdirs(self, path: str) -> None:
        os.makedirs(_local(path), exist_ok=True)  # the files under it need it here; it does not exist for exists()

    def size(self, path: str) -> int:
        return super().size(_local(path))

    def last_updated(self, path: str) -> float:
        return super().last_updated(_local(path))

    def checksum(self, path: str) -> str:
        return super().checksum(_local(path))

    def copy(self, source_file_names: list[str], destination_file_names: list[str]) -> None:
        super().copy([*map(_local, source_file_names)], [*map(_local, destination_file_names)])

    def rename(self, source_file_names: list[str], destination_file_names: list[str]) -> None:
        super().rename([*map(_local, source_file_names)], [*map(_local, destination_file_names)])

    def delete(self, paths: list[str]) -> None:
        for path in map(_local, paths):
            if path.endswith("/"):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.isfile(path):
                os.remove(path)

    def create(self, path: str, mime_type: str = "application/octet-stream",
               compression_type: str = CompressionTypes.AUTO):
        os.makedirs(os.path.dirname(_local(path)), exist_ok=True)
        upload = Upload(_local(path))
        if (compression := FileSystem._get_compression_type(path, compression_type)) != CompressionTypes.UNCOMPRESSED:
            return CompressedFile(upload, compression_type=compression)
        return upload

    def open(self, path: str, mime_type: str = "application/octet-stream",
             compression_type: str = CompressionTypes.AUTO):
        if FileSystem._get_compression_type(path, compression_type) != CompressionTypes.UNCOMPRESSED:
            return super().open(_local(path), mime_type, compression_type)
        stream = DownloaderStream(MirrorDownloader(_local(path), MirrorFileSystem.log))
        return io.BufferedReader(stream, buffer_size=OBJECT_STORE_READ_BUFFER)
