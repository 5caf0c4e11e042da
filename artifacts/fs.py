"""Small file helpers over Beam's FileSystems, so OUT can be a local path or any Beam filesystem URL."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

_CHUNK = 1 << 20


def join(base: str, *parts: str) -> str:
    """Join path parts the way the filesystem of ``base`` does."""
    return FileSystems.join(base, *parts) if parts else base


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def list_files(directory: str, pattern: str = "*") -> list[str]:
    """Files directly under ``directory`` matching ``pattern``, sorted by path."""
    result = FileSystems.match([join(directory, pattern)])[0]
    return sorted(m.path for m in result.metadata_list)


def list_tree(directory: str) -> list[str]:
    """All files below ``directory`` (any depth), sorted by path."""
    if not FileSystems.exists(directory):
        return []
    result = FileSystems.match([join(directory, "**")])[0]
    return sorted(m.path for m in result.metadata_list)


def size(path: str) -> int:
    return FileSystems.match([path])[0].metadata_list[0].size_in_bytes


def read_bytes(path: str) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read()


def read_json(path: str) -> Any:
    return json.loads(read_bytes(path).decode("utf-8"))


def write_bytes(path: str, data: bytes) -> None:
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(data)


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Write to a temporary sibling, then rename, so readers never see a half-written file."""
    temporary = path + ".tmp"
    write_bytes(temporary, data)
    if FileSystems.exists(path):
        FileSystems.delete([path])
    FileSystems.rename([temporary], [path])


def write_json_atomic(path: str, value: Any) -> None:
    write_bytes_atomic(path, (json.dumps(value, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def iter_chunks(path: str, chunk_size: int = _CHUNK) -> Iterator[bytes]:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        while chunk := handle.read(chunk_size):
            yield chunk


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    for chunk in iter_chunks(path):
        digest.update(chunk)
    return digest.hexdigest()


def delete_tree(directory: str) -> None:
    """Delete every file below ``directory`` (and the directory itself on local disks)."""
    if FileSystems.exists(directory):
        FileSystems.delete([directory])


def mkdirs(directory: str) -> None:
    """Create ``directory`` where the filesystem has directories (object stores need nothing)."""
    if not FileSystems.exists(directory):
        FileSystems.mkdirs(directory)


def ensure_parent(path: str) -> None:
    """Create the directory of ``path`` where the filesystem has directories."""
    mkdirs(path.rsplit("/", 1)[0])


def relative(path: str, base: str) -> str:
    """``path`` relative to ``base`` with forward slashes."""
    prefix = base.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not below {base}")
    return path[len(prefix) :]
