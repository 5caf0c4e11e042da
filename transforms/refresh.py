"""Dump refreshes: which entity and passage vectors of a previous run can be taken as they are.

An entity's vector is a function of its sampled mentions' windows and the model options only, so an entity (by key:
QID, else title, because entity ids are renumbered per run) whose sample digest is unchanged keeps its old
vector. A passage's vector is a function of its id, title and text and the encoder, so an unchanged passage
keeps its old vector (transforms/passage_refresh.py). Everything else is encoded again; the splits below are thin
Beam adapters over the pure functions at the top.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam

from artifacts.counters import declare, processed
from transforms.dead_letters import count
from transforms.mention_sampling import window_digest

DIGEST_MODULUS = 1 << 128  # row digests are summed modulo 2**128: order-independent, no XOR cancellation
RUNTIME_OPTIONS = ("previous", "previous_manifest_sha256", "require_reuse")

ENTITY_COUNTERS = declare(
    processed("entities_reused", "entities reused"),
    processed("entities_recomputed", "entities recomputed"),
)


def entity_key(title: str, qid: str | None) -> str:
    """The identity of an entity across dumps: its Wikidata QID, else its title."""
    return qid or title


def mention_digest(row: dict[str, Any]) -> int:
    """A 128-bit digest of one sampled mention: source page, and its context window with the span in it (the
    ref's ``window_digest``; a row of an older run that stored the window itself gives the same digest)."""
    window = row.get("window_digest") or window_digest(row["text"], row["start"], row["end"])
    return int.from_bytes(hashlib.blake2b(f"{row['page_id']}\x1f".encode() + window, digest_size=16).digest(), "big")


def option_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``name: old -> new`` for every recorded option that differs (runtime-only options are ignored)."""
    names = sorted((set(old) | set(new)) - set(RUNTIME_OPTIONS))
    return [f"{name}: {old.get(name)!r} -> {new.get(name)!r}" for name in names if old.get(name) != new.get(name)]


class SampleDigest(beam.CombineFn):
    """(sum of mention digests mod 2**128, mention count) of one entity's sample, in any order."""

    def create_accumulator(self) -> tuple[int, int]:
        return 0, 0

    def add_input(self, accumulator: tuple[int, int], row: dict[str, Any]) -> tuple[int, int]:
        return (accumulator[0] + mention_digest(row)) % DIGEST_MODULUS, accumulator[1] + 1

    def merge_accumulators(self, accumulators) -> tuple[int, int]:
        total, seen = 0, 0
        for part, part_seen in accumulators:
            total, seen = (total + part) % DIGEST_MODULUS, seen + part_seen
        return total, seen

    def extract_output(self, accumulator: tuple[int, int]) -> tuple[int, int]:
        return accumulator


@dataclass(frozen=True)
class OldEntity:
    entity_id: int
    digest: tuple[int, int] | None
    row: dict[str, Any] | None  # its entity_embeddings row, if it had a vector


@dataclass(frozen=True)
class NewEntity:
    entity_id: int
    title: str
    qid: str | None
    digest: tuple[int, int] | None


def old_entity(entity_id: int, joined: dict[str, list[Any]]) -> Iterator[tuple[str, OldEntity]]:
    if joined["key"]:
        digest = joined["digest"][0] if joined["digest"] else None
        row = joined["vector"][0] if joined["vector"] else None
        yield joined["key"][0], OldEntity(entity_id, digest, row)


def new_entity(entity_id: int, joined: dict[str, list[Any]]) -> Iterator[tuple[str, NewEntity]]:
    if joined["entity"]:
        title, qid = joined["entity"][0]
        digest = joined["digest"][0] if joined["digest"] else None
        yield entity_key(title, qid), NewEntity(entity_id, title, qid, digest)


def entity_decision(key: str, joined: dict[str, list[Any]]) -> Iterator[Any]:
    """Per key: the id map row (in both runs), then the reused vector row or the id to encode (tagged)."""
    olds, news = joined["old"], joined["new"]
    old = olds[0] if len(olds) == 1 else None  # a key shared by several entities is never reused
    for new in news:
        if old is not None and len(news) == 1:
            yield beam.pvalue.TaggedOutput("id_map", {"key": key, "old_entity_id": old.entity_id,
                                                      "new_entity_id": new.entity_id})
        if new.digest is None:
            continue  # no mentions: no vector in either kind of run
        if old is not None and len(news) == 1 and old.row is not None and old.digest == new.digest:
            count("entities_reused")
            yield beam.pvalue.TaggedOutput("reused", {**old.row, "entity_id": new.entity_id, "title": new.title,
                                                      "qid": new.qid})
        else:
            count("entities_recomputed")
            yield new.entity_id


def mentions_to_encode(entity_id: int, joined: dict[str, list[Any]]) -> Iterator[dict[str, Any]]:
    if joined["encode"]:
        yield from joined["mentions"]


class SplitEntitiesForRefresh(beam.PTransform):
    """New mentions and entities + the previous run's mentions, entities and embeddings -> ``encode`` (mention
    rows of entities whose sample changed or that are new), ``reused`` (embedding rows under new ids) and
    ``id_map`` (key, old_entity_id, new_entity_id)."""

    def expand(self, inputs: dict[str, beam.PCollection]) -> dict[str, beam.PCollection]:
        by_id = lambda row: (row["entity_id"], row)  # noqa: E731
        digests = {name: inputs[source] | f"Key{name}Samples" >> beam.Map(by_id)
                   | f"{name}SampleDigests" >> beam.CombinePerKey(SampleDigest())
                   for name, source in (("Old", "old_mentions"), ("New", "mentions"))}
        old = ({"key": inputs["old_entities"] | "OldKeys" >> beam.Map(
                    lambda e: (e["entity_id"], entity_key(e["title"], e["qid"]))),
                "digest": digests["Old"], "vector": inputs["old_embeddings"] | "KeyOldVectors" >> beam.Map(by_id)}
               | "JoinOld" >> beam.CoGroupByKey() | "OldByKey" >> beam.FlatMapTuple(old_entity))
        new = ({"entity": inputs["entities"] | "NewInfo" >> beam.Map(
                    lambda e: (e["entity_id"], (e["title"], e["qid"]))), "digest": digests["New"]}
               | "JoinNew" >> beam.CoGroupByKey() | "NewByKey" >> beam.FlatMapTuple(new_entity))
        decided = ({"old": old, "new": new} | "JoinByKey" >> beam.CoGroupByKey()
                   | "Decide" >> beam.FlatMapTuple(entity_decision).with_outputs("reused", "id_map", main="encode"))
        encode = ({"mentions": inputs["mentions"] | "KeyMentions" >> beam.Map(by_id),
                   "encode": decided.encode | "Marks" >> beam.Map(lambda entity_id: (entity_id, True))}
                  | "JoinMarks" >> beam.CoGroupByKey() | "MentionsToEncode" >> beam.FlatMapTuple(mentions_to_encode))
        return {"encode": encode, "reused": decided.reused, "id_map": decided.id_map}
