"""A Beam filesystem for tests that behaves like a remote one (paths are URLs, ``remote:///abs/path``, so the code
under test takes its remote-path branches) while storing files on the local disk. Importing this module registers
it with Beam's FileSystems."""

from __future__ import annotations

from apache_beam.io.filesystem import FileMetadata, MatchResult
from apache_beam.io.localfilesystem import LocalFileSystem

SCHEME = "remote"
PREFIX = f"{SCHEME}://"


def remote(path: object) -> str:
    """The remote URL of a local absolute path."""
    return PREFIX + str(path)


def _local(path: str) -> str:
    return path[len(PREFIX):] if path.startswith(PREFIX) else path


class RemoteLikeFileSystem(LocalFileSystem):
    """LocalFileSystem under the ``remote://`` scheme."""

    @classmethod
    def scheme(cls) -> str:
        return SCHEME

    def join(self, basepath, *paths):
        return remote(super().join(_local(basepath), *paths))

    def split(self, path):
        head, tail = super().split(_local(path))
        return remote(head), tail

    def mkdirs(self, path):
        return super().mkdirs(_local(path))

    def match(self, patterns, limits=None):
        results = super().match([_local(pattern) for pattern in patterns], limits)
        return [MatchResult(remote(result.pattern), [FileMetadata(remote(item.path), item.size_in_bytes,
                                                                  item.last_updated_in_seconds)
                                                     for item in result.metadata_list]) for result in results]

    def create(self, path, *args, **kwargs):
        return super().create(_local(path), *args, **kwargs)

    def open(self, path, *args, **kwargs):
        return super().open(_local(path), *args, **kwargs)

    def copy(self, source_file_names, destination_file_names):
        return super().copy([_local(p) for p in source_file_names], [_local(p) for p in destination_file_names])

    def rename(self, source_file_names, destination_file_names):
        return super().rename([_local(p) for p in source_file_names], [_local(p) for p in destination_file_names])

    def exists(self, path):
        return super().exists(_local(path))

    def size(self, path):
        return super().size(_local(path))

    def last_updated(self, path):
        return super().last_updated(_local(path))

    def checksum(self, path):
        return super().checksum(_local(path))

    def metadata(self, path):
        return super().metadata(_local(path))

    def delete(self, paths):
        return super().delete([_local(path) for path in paths])
