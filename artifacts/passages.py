"""The passage row shared by the index build, the encoders and the readers, and the shard a passage lives in."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Passage:
    passage_id: int
    title: str
    text: str

    def to_row(self) -> dict[str, object]:
        return {"passage_id": self.passage_id, "title": self.title, "text": self.text}


def shard_of(passage_id: int, shards: int) -> int:
    """The shard of a passage: a stable hash of its id, so shards stay balanced whatever the id ranges."""
    digest = hashlib.blake2b(passage_id.to_bytes(8, "little", signed=True), digest_size=8).digest()
    return int.from_bytes(digest, "little") % shards
