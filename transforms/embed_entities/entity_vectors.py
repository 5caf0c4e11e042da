"""embed-entities: mention vectors -> one vector per entity, reduced per bucket of entity ids from files.

The mention vectors (~112M x 768 float16 values for English Wikipedia, ~172 GB) never go through a shuffle: the
reduce's first half (``gather``) writes each mention's stored vector to part files under the stage's scratch
directory (``spill.write_part``: Arrow IPC, a record batch per bucket, ``entity_id % buckets``); only (bucket,
file, batch) triples are grouped. Each bucket then reads its
batches (at most ``VECTOR_BUCKET_BYTES`` of vectors), sums every entity's vectors in float64 in (page,
link) order, so the result does not depend on the runner or the worker count, scales the mean to the target
norm and writes its own ``entity_embeddings/`` file.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from artifacts import fs, layout, schemas, tables
from artifacts.arrays import group_starts, split_by
from artifacts.counters import declare, dropped, processed
from transforms.common.dead_letters import DEAD_LETTER_TAG, count_some, dead_letter
from transforms.common.entity_maps import EntityRows, build_entity_rows, load_entity_rows
from transforms.common.packed import bucket_of
from transforms.common.per_worker import PerProcess
from transforms.common.spill import Part, read_parts, write_part

COUNTERS = declare(
    processed("entities_embedded", "entities embedded"),
    dropped("entities_without_mentions", "entities without any mention to embed"),
    dropped("mentions_of_unknown_entities", "mentions of unknown entities", dead_lettered=True),
)

# What identifies a mention vector (its entity, page and link): the order vectors are summed in.
MENTION_KEY = np.dtype([("entity_id", "<i4"), ("page_id", "<i8"), ("link_index", "<i4")])
# Vectors of one bucket held at once by the reduce (float32).
VECTOR_BUCKET_BYTES = 128 << 20
# Vectors a worker buffers before writing a part file: about this much per bucket (so a bucket's reduce reads
# ~V / (buckets x 256 KiB) record batches), within these bounds.
PART_BYTES_PER_BUCKET, MIN_PART_BYTES, MAX_PART_BYTES = 256 << 10, 32 << 20, 256 << 20


@dataclass(frozen=True)
class ModelFacts:
    """What the workers must know of the model: ``dim`` (hidden size), ``target_norm`` (mean input-embedding
    norm), how many ``buckets`` of entity ids the mention vectors are reduced in, and the bucket bits of the
    window vectors' store (``window_store``)."""

    dim: int
    target_norm: float
    buckets: int
    store_bits: int


def part_bytes(buckets: int) -> int:
    """Vector bytes a worker buffers before writing a part file with one record batch per bucket."""
    return min(max(buckets * PART_BYTES_PER_BUCKET, MIN_PART_BYTES), MAX_PART_BYTES)


def vector_buckets(mentions: int, dim: int) -> int:
    """Buckets such that one bucket's mention vectors (float32) stay within ``VECTOR_BUCKET_BYTES``."""
    return max(1, math.ceil(mentions * dim * 4 / VECTOR_BUCKET_BYTES))


def part_line(keyed: tuple[int, Part]) -> str:
    """A (bucket, Part) as one JSON line (how the parts are listed between the stage's pipelines)."""
    bucket, part = keyed
    return json.dumps({"bucket": bucket, **asdict(part)}, sort_keys=True)


def line_part(line: str) -> tuple[int, Part]:
    """The (bucket, Part) of a ``part_line``."""
    fields = json.loads(line)
    return fields.pop("bucket"), Part(**fields)


# --- elements ---------------------------------------------------------------------------------------------------


def vector_column(vectors: np.ndarray) -> pa.FixedSizeListArray:
    """Rows as a fixed-size list column: float16 kept as it is (the window store's values), else float32."""
    dtype = np.float16 if vectors.dtype == np.float16 else np.float32
    flat = pa.array(np.ascontiguousarray(vectors, dtype=dtype).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])


def column_vectors(table: pa.Table, dim: int) -> np.ndarray:
    """The ``vector`` column of a part table as float32 rows."""
    return table.column("vector").combine_chunks().flatten().to_numpy().reshape(-1, dim).astype(np.float32,
                                                                                               copy=False)


def mention_vector_table(keys: np.ndarray, vectors: np.ndarray) -> pa.Table:
    """A part table of mention vectors: ``MENTION_KEY`` rows ``keys`` and their ``vectors`` (``vector_column``)."""
    return pa.table({"entity_id": keys["entity_id"], "page_id": keys["page_id"], "link_index": keys["link_index"],
                     "vector": vector_column(vectors)})


def write_bucketed_part(path: str, table: pa.Table, of_rows: np.ndarray) -> list[tuple[int, Part]]:
    """Write the part ``table`` to the Arrow IPC file ``path`` (``spill.write_part``), one record batch per bucket
    (``of_rows``: each row's); returns (bucket, its Part) of each."""
    return write_part(path, [(bucket, table.take(rows)) for bucket, rows in split_by(np.arange(table.num_rows),
                                                                                    of_rows)])


def read_mention_vectors(parts: Sequence[Part], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(``MENTION_KEY`` rows sorted by entity, page and link; their float32 vectors in that order) of mention vector
    parts. The vectors are placed in order part by part: one part besides the result is held at a time."""
    keys = [np.zeros(0, dtype=MENTION_KEY)]
    for table in read_parts(parts, list(MENTION_KEY.names)):
        part = np.empty(table.num_rows, dtype=MENTION_KEY)
        for name in MENTION_KEY.names:
            part[name] = table.column(name).to_numpy()
        keys.append(part)
    found = np.concatenate(keys)
    order = np.lexsort((found["link_index"], found["page_id"], found["entity_id"]))
    place = np.empty(len(order), dtype=np.int64)
    place[order] = np.arange(len(order))
    vectors, done = np.empty((len(found), dim), dtype=np.float32), 0
    for table in read_parts(parts, ["vector"]):
        vectors[place[done:done + table.num_rows]] = column_vectors(table, dim)
        done += table.num_rows
    return found[order], vectors


def entity_sums(keys: np.ndarray, vectors: np.ndarray) -> Iterator[tuple[int, np.ndarray, int]]:
    """(entity id, float64 sum of its vectors, mention count) per entity, by id, each entity's vectors added one by
    one in (page_id, link_index) order: the same sums whatever order the vectors came in."""
    order = np.lexsort((keys["link_index"], keys["page_id"], keys["entity_id"]))
    if not np.array_equal(order, np.arange(len(order))):  # already in order: no copy of the vectors
        keys, vectors = keys[order], vectors[order]
    starts = group_starts(keys["entity_id"])
    counts = np.diff(np.r_[starts, len(keys)]).astype(np.int64)
    for start, count in zip(starts.tolist(), counts.tolist(), strict=True):
        total = np.add.reduce(vectors[start:start + count].astype(np.float64), axis=0)  # row after row
        yield int(keys["entity_id"][start]), total, count


def norm_matched(total: np.ndarray, seen: int, target_norm: float) -> np.ndarray | None:
    """The mean direction scaled to ``target_norm`` (None if the mean is zero or not finite)."""
    mean = total / seen
    norm = float(np.linalg.norm(mean))
    if not math.isfinite(norm) or norm == 0.0:
        return None
    return (mean / norm * target_norm).astype(np.float32)


def embedding_table(entities: pa.Table, ids: np.ndarray, vectors: np.ndarray, counts: np.ndarray,
                    schema: pa.Schema) -> pa.Table:
    """``entity_embeddings/`` rows of the entities ``ids`` (all in ``entities``: entity_id, title, qid, sorted by
    id) with their ``vectors`` and mention ``counts``, sorted by id."""
    order = np.argsort(ids, kind="stable")
    ids, vectors, counts = ids[order], vectors[order], counts[order]
    rows = np.searchsorted(entities.column("entity_id").to_numpy(), ids)
    values = pa.array(vectors.reshape(-1).astype(np.float32)).cast(schema.field("embedding").type.value_type)
    return pa.table({"entity_id": pa.array(ids, pa.int32()), "title": entities.column("title").take(rows),
                     "qid": entities.column("qid").take(rows),
                     "embedding": pa.FixedSizeListArray.from_arrays(values, vectors.shape[1]),
                     "mention_count": pa.array(counts, pa.int32())}, schema=schema)


@dataclass
class BucketVectors:
    """What a bucket's reduce found: the vectors to write (``ids``, the first ``len(ids)`` rows of ``vectors``,
    ``counts``), how many entities of entities/ had mentions (``known``: with a vector or a zero or non-finite mean)
    and the dead letters (unknown entities, zero or non-finite means)."""

    ids: list[int]
    vectors: np.ndarray
    counts: list[int]
    known: int
    dead: list[beam.pvalue.TaggedOutput]

    @property
    def computed(self) -> np.ndarray:
        return self.vectors[:len(self.ids)]


def reduce_bucket(known: np.ndarray, keys: np.ndarray, vectors: np.ndarray, target_norm: float) -> BucketVectors:
    """The entity vectors of one bucket's mention vectors (``MENTION_KEY`` rows ``keys``, float32 ``vectors``);
    ``known``: the sorted ids of entities/. Holds one float32 vector per entity besides the input."""
    found = BucketVectors([], np.empty((len(np.unique(keys["entity_id"])), vectors.shape[1]), np.float32), [], 0, [])
    for entity_id, total, seen in entity_sums(keys, vectors):
        where = np.searchsorted(known, entity_id)
        if where >= len(known) or known[where] != entity_id:
            found.dead.append(dead_letter("mentions_of_unknown_entities", "mentions of an entity_id not in entities/",
                                          entity_id=entity_id, mention_count=seen))
            continue
        found.known += 1
        vector = norm_matched(total, seen, target_norm)
        if vector is None:
            found.dead.append(dead_letter("non_finite_vectors", "mean vector is zero or not finite",
                                          entity_id=entity_id))
            continue
        found.vectors[len(found.ids)] = vector
        found.ids.append(entity_id)
        found.counts.append(seen)
    return found


def write_parquet_file(path: str, table: pa.Table) -> str:
    """Write an artifact file as Beam's WriteToParquet does (zstd, lists not in the "compliant" nested layout, so
    a vector column reads back as ``fixed_size_list<item: ...>``); returns ``path``."""
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        pq.write_table(table, handle, compression=schemas.PARQUET_CODEC, use_compliant_nested_type=False,
                       **schemas.writer_options(table.schema))
    return path


# --- DoFns ------------------------------------------------------------------------------------------------------


class PartWriter:
    """Mention vectors -> part files of ``part_bytes`` under ``directory``, one record batch per bucket of entity ids
    (a part file as large as that, so that a bucket's reduce reads few batches, whatever the callers' batches);
    ``add`` and ``flush`` return the (bucket, Part) of what they wrote."""

    def __init__(self, directory: str, buckets: int) -> None:
        self._directory, self._buckets = directory, buckets
        self._keys: list[np.ndarray] = []
        self._vectors: list[np.ndarray] = []
        self._bytes = 0

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> list[tuple[int, Part]]:
        """Buffer ``MENTION_KEY`` rows ``keys`` and their float32 ``vectors``; write a part once enough is held."""
        self._keys.append(keys)
        self._vectors.append(vectors)
        self._bytes += vectors.nbytes
        return self.flush() if self._bytes >= part_bytes(self._buckets) else []

    def flush(self) -> list[tuple[int, Part]]:
        if not self._bytes:
            return []
        keys, vectors = np.concatenate(self._keys), np.concatenate(self._vectors)
        self._keys, self._vectors, self._bytes = [], [], 0
        path = fs.join(self._directory, f"part-{uuid.uuid4().hex}.arrow")
        return write_bucketed_part(path, mention_vector_table(keys, vectors),
                                   bucket_of(keys["entity_id"], self._buckets))


class ReduceEntityBucket(beam.DoFn):
    """(bucket, [Part or None, ...]) -> writes the bucket's ``entity_embeddings/`` file under ``destination`` (the
    mean of each entity's mention vectors) and yields its path; its dead letters are tagged."""

    def __init__(self, entities: str, destination: str, schema_of: Callable[[ModelFacts], pa.Schema]) -> None:
        self._entities, self._destination, self._schema_of = entities, destination, schema_of
        self._loader = PerProcess(load_entity_rows)

    def setup(self) -> None:
        self._rows: EntityRows = self._loader.get(self._entities)

    def process(self, element: tuple[int, Sequence[Part | None]], facts: ModelFacts, _built: str) -> Iterator[Any]:
        bucket, items = element
        keys, vectors = read_mention_vectors([item for item in items if item is not None], facts.dim)
        found = reduce_bucket(self._rows.entity_ids, keys, vectors, facts.target_norm)
        del keys, vectors
        yield from found.dead
        entities = self._rows.of_bucket(bucket, facts.buckets)
        count_some("entities_embedded", len(found.ids))
        count_some("entities_without_mentions", entities.num_rows - found.known)
        table = embedding_table(entities, np.array(found.ids, dtype=np.int32), found.computed,
                                np.array(found.counts, dtype=np.int64), self._schema_of(facts))
        yield write_parquet_file(fs.join(self._destination, f"part-{bucket:05d}-of-{facts.buckets:05d}.parquet"),
                                 table)


# --- the transform ----------------------------------------------------------------------------------------------


def build_entities_rows(output: str, directory: str) -> str:
    """Write the entity rows of ``output``'s entities/ under ``directory`` (in the one worker that runs this)."""
    return build_entity_rows(tables.parquet_files(output, layout.ENTITIES), directory)


def every_bucket(facts: ModelFacts) -> Iterator[tuple[int, None]]:
    """(bucket, None) for every bucket: each bucket is reduced (and its file written) even without vectors."""
    for bucket in range(facts.buckets):
        yield bucket, None


class EntityVectors(beam.PTransform):
    """``parts`` ((bucket, Part) of mention vectors: ``PartWriter``'s) -> one ``entity_embeddings/`` file per bucket
    of entity ids under ``destination`` (rows: the norm-matched mean of each entity of ``output``'s entities/ with
    mentions; ``schema_of(facts)``: their schema). Returns the dead
    letters (mentions of unknown entities, zero or non-finite means). ``facts``: a singleton PCollection of
    ``ModelFacts``; ``scratch``: a directory for the entity rows the workers share."""

    def __init__(self, output: str, scratch: str, destination: str,
                 schema_of: Callable[[ModelFacts], pa.Schema]) -> None:
        super().__init__()
        self._output, self._scratch, self._destination, self._schema_of = output, scratch, destination, schema_of

    def expand(self, inputs: dict[str, beam.PCollection]) -> beam.PCollection:
        entities = fs.join(self._scratch, f"entities-{uuid.uuid4().hex[:12]}")  # per run: a per-process object's tag
        facts = beam.pvalue.AsSingleton(inputs["facts"])
        built = (inputs["facts"].pipeline | "Entities" >> beam.Create([self._output])
                 | "BuildEntityRows" >> beam.Map(build_entities_rows, entities))
        buckets = inputs["facts"] | "EveryBucket" >> beam.FlatMap(every_bucket)
        reduced = ((inputs["parts"], buckets) | "WithEveryBucket" >> beam.Flatten()
                   | "PartsByBucket" >> beam.GroupByKey()
                   | "ReduceBuckets" >> beam.ParDo(ReduceEntityBucket(entities, self._destination, self._schema_of),
                                                   facts, beam.pvalue.AsSingleton(built)).with_outputs(
                       DEAD_LETTER_TAG, main="written"))
        return reduced[DEAD_LETTER_TAG]
