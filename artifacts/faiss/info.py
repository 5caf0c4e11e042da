"""OUT/index/index.json: what the index is (factory, metric, dimension, shards) and how it was encoded.

Artifacts of the run that the encoder reads (a KPR encoder's linker and entity embeddings) are stored as names
relative to OUT with their identity (a digest of their recorded files), never as absolute paths, so a moved or
published run searches exactly as in place.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from artifacts import fs
from artifacts.errors import InputError
from artifacts.faiss.files import INDEX_JSON


class MissingIndexError(InputError):
    """A directory without index.json: the index stage has not written an index there."""

    def __init__(self, index_dir: str) -> None:
        super().__init__(f"no index at {index_dir} ({INDEX_JSON} is missing)")
        self.index_dir = index_dir


class DamagedIndexInfoError(InputError):
    """index.json holds a field of the wrong type (edited by hand, or written by something else)."""


@dataclass
class IndexInfo:
    factory: str
    metric: str
    dim: int
    count: int
    shards: int  # how many shards passages were hashed into (some may be empty)
    shard_files: list[dict[str, Any]] = field(default_factory=list)
    encoder: dict[str, Any] = field(default_factory=dict)
    train_sample: int = 0
    format: int = 1
    inputs: dict[str, str] = field(default_factory=dict)  # artifact name (relative to OUT) -> artifact_digest

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Any) -> IndexInfo:
        """The fields this version knows, each checked for its type (a ``ValueError`` naming the first that is
        not, or the required ones missing)."""
        if not isinstance(value, dict):
            raise ValueError(f"a JSON {type(value).__name__}, not an object")
        missing = [item.name for item in fields(cls) if item.name not in value
                   and item.default is MISSING and item.default_factory is MISSING]
        if missing:
            raise ValueError(f"it has no {', '.join(missing)}")
        known = {key: item for key, item in value.items() if key in cls.__dataclass_fields__}
        for key, item in known.items():
            _check_field(key, item, _FIELD_TYPES[key])
        for shard in known.get("shard_files", []):
            if not isinstance(shard, dict):
                raise ValueError(f"shard_files holds {shard!r}, not an object")
            for key, kind in _SHARD_FIELD_TYPES.items():
                _check_field(f"a shard's {key}", shard.get(key), kind)
        return cls(**known)


# index.json's fields by type: a whole number is an int (not a bool).
_FIELD_TYPES = {"factory": str, "metric": str, "dim": int, "count": int, "shards": int, "shard_files": list,
                "encoder": dict, "train_sample": int, "format": int, "inputs": dict}
_SHARD_FIELD_TYPES = {"name": str, "index": str, "ids": str, "count": int}
_TYPE_NAMES = {int: "a whole number", str: "a string", list: "an array", dict: "an object"}


def _check_field(name: str, value: Any, kind: type) -> None:
    if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 0):
        raise ValueError(f"{name} is {json.dumps(value)[:80]}, not {_TYPE_NAMES[kind]}")


def load_index_info(index_dir: str) -> IndexInfo:
    """OUT/index/index.json; a ``DamagedIndexInfoError`` (one line) when a field is not of its type."""
    path = fs.join(index_dir, INDEX_JSON)
    if not fs.exists(path):
        raise MissingIndexError(index_dir)
    try:
        return IndexInfo.from_json(fs.read_json(path))
    except ValueError as error:
        raise DamagedIndexInfoError(f"{path} is damaged: {error}") from error


def artifact_digest(files: Iterable[tuple[str, str]], artifact: str) -> str:
    """The identity of ``artifact`` (a name relative to OUT) from the (path relative to OUT, sha256) pairs a
    manifest records: one hash over the checksums of its files, by their path inside the artifact."""
    prefix = artifact.rstrip("/") + "/"
    digest = hashlib.sha256()
    for path, sha256 in sorted((path.removeprefix(prefix), sha256) for path, sha256 in files
                               if path.startswith(prefix)):
        digest.update(f"{path}\\t{sha256}\\n".encode())
    return digest.hexdigest()
