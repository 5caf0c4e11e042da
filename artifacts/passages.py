"""The passage row shared by the index build, the encoders and the readers; the shard a passage lives in and its
key for the training sample (stable hashes of its id)."""

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


def sample_key(passage_id: int) -> int:
    """The FAISS training sample is the passages with the smallest keys (int63, seed-free, order-free)."""
    digest = hashlib.blake2b(passage_id.to_bytes(8, "little", signed=True), digest_size=8,
                             person=b"kpr-train").digest()
    return int.from_bytes(digest, "little") >> 1
