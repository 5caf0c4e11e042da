"""Dump refreshes of embed-entities: which entities of a previous run are the same, and under which new ids.

The vectors themselves are reused per mention window (``window_store``: a refresh encodes only the windows whose
model input is new). What is decided here, per entity (by key: QID, else title, because entity ids are renumbered
per run), is the ``entity_id_map/`` of the refresh and its entity counters: an entity whose sample digest is
unchanged is counted reused (every window of its sample is in the previous run's store), the others recomputed.

At scale: each run's sample digests are summed per entity in a combine over a few buckets of entity ids (packed
arrays) and written as files; one worker step reads them with both runs' entity keys (entity-sized, ~1-2 GB for
English Wikipedia), decides and writes ``entity_id_map/`` itself.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from artifacts import fs, layout, schemas, tables
from artifacts.arrays import group_starts
from artifacts.counters import declare, processed
from transforms.common.dead_letters import count_some
from transforms.common.mention_sampling import window_digest
from transforms.common.packed import PackedCombineFn, split_by_bucket
from transforms.common.parquet_rows import ReadParquetRowGroups
from transforms.common.worker_files import load_array, save_array
from transforms.embed_entities.entity_vectors import (
    write_parquet_file,
)

ENTITY_COUNTERS = declare(
    processed("entities_reused", "entities reused"),
    processed("entities_recomputed", "entities recomputed"),
)

# An entity's sample digest: two 64-bit lanes of its mentions' 128-bit digests, each summed modulo 2**64 (order
# does not matter, a repeated mention does not cancel out), and the number of mentions.
DIGEST = np.dtype([("entity_id", "<i4"), ("low", "<u8"), ("high", "<u8"), ("mentions", "<i8")])
DIGEST_BUCKETS = 16
ENTITY_COLUMNS = ["entity_id", "title", "qid"]


def entity_key(title: str, qid: str | None) -> str:
    """The identity of an entity across dumps: its Wikidata QID, else its title."""
    return qid or title


def mention_digest(row: dict[str, Any]) -> int:
    """A 128-bit digest of one sampled mention: source page, and its context window with the span in it (the
    ref's ``window_digest``; a row of an older run that stored the window itself gives the same digest)."""
    window = row.get("window_digest") or window_digest(row["text"], row["start"], row["end"])
    return int.from_bytes(hashlib.blake2b(f"{row['page_id']}\x1f".encode() + window, digest_size=16).digest(), "big")


def digest_rows(rows: list[dict[str, Any]]) -> np.ndarray:
    """One ``DIGEST`` row per ``mentions/`` row."""
    digests = [mention_digest(row) for row in rows]
    found = np.zeros(len(rows), dtype=DIGEST)
    found["entity_id"] = [row["entity_id"] for row in rows]
    found["low"] = [digest & 0xFFFF_FFFF_FFFF_FFFF for digest in digests]
    found["high"] = [digest >> 64 for digest in digests]
    found["mentions"] = 1
    return found


def sum_digests(rows: np.ndarray) -> np.ndarray:
    """Per entity of ``rows`` (``DIGEST``): its lanes summed modulo 2**64 and its mentions, sorted by entity."""
    rows = rows[np.argsort(rows["entity_id"], kind="stable")]
    starts = group_starts(rows["entity_id"])
    summed = np.zeros(len(starts), dtype=DIGEST)
    summed["entity_id"] = rows["entity_id"][starts]
    if len(starts):
        for lane in ("low", "high", "mentions"):
            summed[lane] = np.add.reduceat(rows[lane], starts)  # uint64 lanes wrap: modulo 2**64
    return summed


@dataclass(frozen=True)
class RefreshDecision:
    """``id_map`` (key, old_entity_id, new_entity_id: entities whose key is once in each run), ``reuse_old`` ->
    ``reuse_new`` (entities whose vector is reused) and ``encode`` (new ids whose mentions are encoded)."""

    id_map: pa.Table
    reuse_old: np.ndarray
    reuse_new: np.ndarray
    encode: np.ndarray


def keyed(entities: pa.Table, role: str) -> pa.Table:
    """(key, ``role``_entity_id) of the entities whose key only one of them has."""
    keys = [entity_key(title, qid) for title, qid in zip(entities.column("title").to_pylist(),
                                                         entities.column("qid").to_pylist(), strict=True)]
    table = pa.table({"key": pa.array(keys, pa.string()), f"{role}_entity_id": entities.column("entity_id")})
    counts = table.group_by("key").aggregate([(f"{role}_entity_id", "count"), (f"{role}_entity_id", "min")])
    once = counts.filter(pc.equal(counts.column(f"{role}_entity_id_count"), 1))
    return pa.table({"key": once.column("key"), f"{role}_entity_id": once.column(f"{role}_entity_id_min")})


def digests_of(ids: np.ndarray, digests: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(whether each id has a digest, its digest row) from ``digests`` sorted by entity id."""
    if not len(digests):
        return np.zeros(len(ids), dtype=bool), np.zeros(len(ids), dtype=DIGEST)
    where = np.minimum(np.searchsorted(digests["entity_id"], ids), len(digests) - 1)
    return digests["entity_id"][where] == ids, digests[where]


def id_map_pairs(old_entities: pa.Table, new_entities: pa.Table) -> pa.Table:
    """(key, old_entity_id, new_entity_id) of the entities whose key is once in each run, by new id."""
    pairs = keyed(new_entities, "new").join(keyed(old_entities, "old"), "key", join_type="inner")
    return pairs.sort_by("new_entity_id").select(["key", "old_entity_id", "new_entity_id"])


def decide(old_entities: pa.Table, new_entities: pa.Table, old_digests: np.ndarray, new_digests: np.ndarray,
           old_with_vectors: np.ndarray) -> RefreshDecision:
    """Which entities keep their old vector: a key once in each run, an old vector, the same sample digest.
    Every other new entity with mentions is encoded."""
    pairs = id_map_pairs(old_entities, new_entities)
    old_ids = pairs.column("old_entity_id").to_numpy()
    new_ids = pairs.column("new_entity_id").to_numpy()
    had, old_digest = digests_of(old_ids, old_digests)
    has, new_digest = digests_of(new_ids, new_digests)
    same = np.all([old_digest[lane] == new_digest[lane] for lane in ("low", "high", "mentions")], axis=0)
    reused = had & has & same & np.isin(old_ids, old_with_vectors)
    sampled, _ = digests_of(new_entities.column("entity_id").to_numpy(), new_digests)
    encode = np.setdiff1d(new_entities.column("entity_id").to_numpy()[sampled], new_ids[reused])
    return RefreshDecision(pairs, old_ids[reused], new_ids[reused], encode)


# --- files and DoFns --------------------------------------------------------------------------------------------


def digest_path(directory: str, bucket: int) -> str:
    return fs.join(directory, f"digests-{bucket:05d}.npy")


def read_digests(paths: list[str]) -> np.ndarray:
    """The digests written to ``paths``, sorted by entity id."""
    parts = [np.asarray(load_array(path)) for path in paths]
    digests = np.concatenate(parts) if parts else np.zeros(0, dtype=DIGEST)
    return digests[np.argsort(digests["entity_id"], kind="stable")]


def entity_table(output: str) -> pa.Table:
    return tables.read_table(output, layout.ENTITIES, ENTITY_COLUMNS)


def decide_runs(previous: str, output: str, old_digests: list[str], new_digests: list[str], id_map: str) -> str:
    """Decide a refresh of ``previous`` by ``output`` (in the one worker that runs this): write the id map under
    ``id_map``; count the reused and recomputed entities. Returns the id map's path."""
    old_vectors = tables.read_table(previous, layout.ENTITY_EMBEDDINGS, ["entity_id"]).column("entity_id")
    decision = decide(entity_table(previous), entity_table(output), read_digests(old_digests),
                      read_digests(new_digests), old_vectors.to_numpy())
    count_some("entities_reused", len(decision.reuse_new))
    count_some("entities_recomputed", len(decision.encode))
    return write_id_map(id_map, decision.id_map)


def write_id_map(id_map: str, pairs: pa.Table) -> str:
    return write_parquet_file(fs.join(id_map, "part-00000-of-00001.parquet"), pairs.cast(schemas.ENTITY_ID_MAP))


def map_ids(previous: str, output: str, id_map: str) -> str:
    """Write under ``id_map`` the id map from ``previous``'s entities to ``output``'s (a refresh that takes no
    vector from ``previous``: its ids still map). Returns its path."""
    return write_id_map(id_map, id_map_pairs(entity_table(previous), entity_table(output)))


class WriteDigests(beam.DoFn):
    """(bucket, its entities' summed digests) -> the path of the bucket's digest file under ``directory``."""

    def __init__(self, directory: str) -> None:
        self._directory = directory

    def process(self, element: tuple[int, np.ndarray]) -> Iterator[str]:
        bucket, digests = element
        yield save_array(digest_path(self._directory, bucket), digests)


def digests_by_bucket(table: pa.Table) -> Iterator[tuple[int, np.ndarray]]:
    return split_by_bucket(digest_rows(table.to_pylist()), "entity_id", DIGEST_BUCKETS)


class SampleDigests(beam.PTransform):
    """``output``'s mentions/ -> paths of files with every entity's summed sample digest (``DIGEST`` rows)."""

    def __init__(self, output: str, directory: str) -> None:
        super().__init__()
        self._output, self._directory = output, directory

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        return (pipeline | "Read" >> ReadParquetRowGroups(tables.parquet_files(self._output, layout.MENTIONS))
                | "ByBucket" >> beam.FlatMap(digests_by_bucket)
                | "SumPerEntity" >> beam.CombinePerKey(PackedCombineFn(sum_digests, DIGEST))
                | "Write" >> beam.ParDo(WriteDigests(self._directory)))


class DecideRefresh(beam.PTransform):
    """A pipeline's root -> the refresh of ``previous`` by ``output`` decided: the id map written under ``id_map``,
    the entities whose sample is unchanged counted as reused (every window of theirs is in the previous run's
    store), the others as recomputed. ``scratch``: a directory for the digests and the decision."""

    def __init__(self, previous: str, output: str, scratch: str, id_map: str) -> None:
        super().__init__()
        self._previous, self._output, self._scratch, self._id_map = previous, output, scratch, id_map

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        work = fs.join(self._scratch, f"refresh-{uuid.uuid4().hex[:12]}")
        old = pipeline | "OldDigests" >> SampleDigests(self._previous, fs.join(work, "old"))
        new = pipeline | "NewDigests" >> SampleDigests(self._output, fs.join(work, "new"))
        return (pipeline | "Runs" >> beam.Create([self._previous])
                | "Decide" >> beam.Map(decide_runs, self._output, beam.pvalue.AsList(old), beam.pvalue.AsList(new),
                                       self._id_map))
