"""index: passages encoded by a dense retriever, written by shard, then built into sharded FAISS indexes.

Two Beam pipelines. ``EncodePassages`` encodes every passage through RunInference (or takes the vector of an
unchanged passage from a previous run), ``WriteShards`` writes the vectors by shard (a hash of the passage id)
and ``WriteTrainingSample`` the passages with the smallest hash keys. Between the two, the index type and its
memory are decided from the exact count. ``BuildIndex`` trains the index once on the sample, then adds every
shard in parallel (FAISS ids = passage ids) and writes the shard files, their id maps and index.json.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.ml.inference.base import PredictionResult, RunInference

from artifacts import fs, layout, schemas
from artifacts.counters import declare, dropped, error, processed
from artifacts.faiss import build, choice, files, info, storage, vectors
from artifacts.passages import shard_of
from encoders.loading import PassageEncoderHandler
from encoders.retrievers import EncoderOptions
from transforms.dead_letters import count, dead_letter
from transforms.passages import DUPLICATE_KEEPS, sample_key
from transforms.refresh import SplitPassagesForRefresh

COUNTERS = declare(
    processed("passages_read", "passages read"),
    processed("passages_with_nul_bytes", "passages whose NUL bytes were removed"),
    error("invalid_utf8", "passage lines that are not UTF-8"),
    error("bad_quoting", "passage lines with broken quoting"),
    error("wrong_column_count", "passage lines without 3 columns"),
    error("bad_ids", "passage lines whose id is not a non-negative integer"),
    error("empty_texts", "passages with empty text"),
    dropped("articles_without_text", "articles without text to cut into passages"),
    error("too_long_articles", "articles with more words than passage ids per page allow"),
    dropped("duplicate_ids", "passages whose id an earlier row has (the first row is kept, or the last with "
                             "--on-duplicate-id last)", dead_lettered=True),
    processed("passages_reused", "passages reused"),
    processed("passages_encoded", "passages encoded"),
    error("non_finite_vectors", "vectors with NaN or inf (or a zero mean)"),
    processed("kpr_entities", "kpr entities"),
    processed("kpr_entities_over_max", "kpr entities over max"),
    processed("shards_built", "index shards built"),
    processed("passages_indexed", "passages in the index"),
    processed("train_sample", "vectors the index was trained on"),
)
ShardRow = tuple[int, tuple[int, str, str, np.ndarray]]  # (shard, (passage_id, title, text, vector))


@dataclass(frozen=True)
class IndexConfig:
    """What the index stage builds: the passages of ``corpus`` (DPR TSV files; None: cut from OUT/articles into
    ``words_per_passage``-word passages) encoded by ``encoder``, hashed into ``shards`` FAISS shards of
    ``index_factory`` (None: chosen by corpus size). ``encoder`` names the run's own artifacts (a KPR encoder's
    linker and entity embeddings) relative to OUT."""

    encoder: EncoderOptions
    corpus: str | None = None
    words_per_passage: int = 100
    on_duplicate_id: str = "first"
    shards: int = 1
    index_factory: str | None = None
    faiss_gpu: bool = True
    previous: str | None = None  # --previous OLD_OUT: reuse the vectors of unchanged passages
    require_reuse: bool = False

    def __post_init__(self) -> None:
        if self.shards < 1:
            raise ValueError(f"shards must be at least 1, got {self.shards}")
        if self.words_per_passage < 1:
            raise ValueError(f"words_per_passage must be at least 1, got {self.words_per_passage}")
        if self.on_duplicate_id not in DUPLICATE_KEEPS:
            raise ValueError(f"on_duplicate_id must be one of {', '.join(DUPLICATE_KEEPS)}")

    @property
    def cuts_articles(self) -> bool:
        """Passages come from OUT/articles (no corpus file)."""
        return not self.corpus

    def recorded_options(self) -> dict[str, Any]:
        """The options that change the index (the encoder without its runtime and OUT-relative names)."""
        encoder = self.encoder.to_json()
        for runtime in ("device", "batch_tokens", "linker", "entity_embeddings"):
            encoder.pop(runtime)
        return {"encoder": encoder, "corpus": self.corpus, "words_per_passage": self.words_per_passage,
                "on_duplicate_id": self.on_duplicate_id, "shards": self.shards, "index_factory": self.index_factory}


# --- encoding ------------------------------------------------------------------------------------------------


def encoded_row(result: PredictionResult, shards: int) -> Iterator[Any]:
    passage, vector = result.example, np.asarray(result.inference, dtype=np.float32)
    if not np.all(np.isfinite(vector)):
        yield dead_letter("non_finite_vectors", "the encoder returned NaN or inf", passage_id=passage.passage_id)
        return
    count("passages_encoded")
    yield shard_of(passage.passage_id, shards), (passage.passage_id, passage.title, passage.text, vector)


def reused_row(row: dict[str, Any], shards: int) -> ShardRow:
    vector = np.asarray(row["embedding"], dtype=np.float32)
    return shard_of(row["passage_id"], shards), (row["passage_id"], row["title"], row["text"], vector)


class EncodePassages(beam.PTransform):
    """Passages -> (shard, row) pairs, tagged ``dead_letter``: vectors with NaN or inf. With ``previous`` (a
    previous run's OUT), unchanged passages take their old vector instead of being encoded; ``progress`` is a
    pass-through step that logs the encoding rate."""

    def __init__(self, encoder: EncoderOptions, shards: int, progress: beam.PTransform,
                 previous: str | None = None) -> None:
        super().__init__()
        self._encoder, self._shards, self._progress, self._previous = encoder, shards, progress, previous

    def expand(self, passages: beam.PCollection) -> dict[str, beam.PCollection]:
        reused = None
        if self._previous is not None:
            pattern = fs.join(self._previous, layout.INDEX, files.EMBEDDINGS_DIR, "*", "*.parquet")
            old = passages.pipeline | "ReadOldVectors" >> beam.io.ReadFromParquet(pattern)
            split = {"passages": passages, "old_vectors": old} | "SplitForRefresh" >> SplitPassagesForRefresh()
            passages, reused = split["encode"], split["reused"] | "ReusedRows" >> beam.Map(reused_row, self._shards)
        encoded = (passages
                   | "Encode" >> RunInference(PassageEncoderHandler(self._encoder, count=count))
                   | "Progress" >> self._progress
                   | "KeepFinite" >> beam.FlatMap(encoded_row, self._shards).with_outputs("dead_letter", main="rows"))
        rows = encoded.rows if reused is None else (encoded.rows, reused) | "WithReused" >> beam.Flatten()
        return {"rows": rows, "dead_letter": encoded.dead_letter}


# --- writing the vectors -------------------------------------------------------------------------------------


class WriteVectorTables(beam.PTransform):
    """Rows -> Arrow tables of a few thousand rows -> Parquet files under ``prefix``."""

    def __init__(self, prefix: str, to_table: Callable[[list], pa.Table], schema: pa.Schema) -> None:
        super().__init__()
        self._prefix, self._to_table, self._schema = prefix, to_table, schema

    def expand(self, rows: beam.PCollection) -> beam.pvalue.PDone:
        return (rows
                | "Batch" >> beam.BatchElements(min_batch_size=64, max_batch_size=4096)
                | "ToTable" >> beam.Map(self._to_table)
                | "WriteParquet" >> beam.io.parquetio.WriteToParquetBatched(
                    self._prefix, self._schema, file_name_suffix=".parquet", codec=schemas.PARQUET_CODEC))


class WriteShards(beam.PTransform):
    """(shard, row) -> ``embeddings/shard-NNNNN/*.parquet`` per shard."""

    def __init__(self, index_dir: str, shards: int, dim: int) -> None:
        super().__init__()
        self._index_dir, self._shards, self._dim = index_dir, shards, dim

    def expand(self, rows: beam.PCollection) -> None:
        dim = self._dim
        by_shard = rows | "SplitShards" >> beam.Partition(lambda keyed, shards: keyed[0], self._shards)
        for shard, rows_of_shard in enumerate(by_shard):
            name = files.shard_name(shard)
            _ = (rows_of_shard | f"{name}Rows" >> beam.Map(lambda keyed: keyed[1])
                 | f"Write{name}" >> WriteVectorTables(
                     fs.join(self._index_dir, files.EMBEDDINGS_DIR, name, "part"),
                     lambda batch: vectors.embedding_table(batch, dim), vectors.embedding_schema(dim)))


def under_threshold(keyed: ShardRow, threshold: int | None) -> bool:
    return threshold is not None and sample_key(keyed[1][0]) <= threshold


def sample_row(keyed: ShardRow) -> tuple[int, int, np.ndarray]:
    passage_id, vector = keyed[1][0], keyed[1][3]
    return sample_key(passage_id), passage_id, vector


def largest_or_none(keys: list[int]) -> int | None:
    return max(keys) if keys else None


class WriteTrainingSample(beam.PTransform):
    """The rows with the MAX_TRAIN_SAMPLE smallest sample keys -> ``train_sample/*.parquet`` (two passes: the
    keys alone find the threshold, then the rows under it are written)."""

    def __init__(self, index_dir: str, dim: int) -> None:
        super().__init__()
        self._index_dir, self._dim = index_dir, dim

    def expand(self, rows: beam.PCollection) -> None:
        dim = self._dim
        threshold = (rows | "SampleKeys" >> beam.Map(lambda keyed: sample_key(keyed[1][0]))
                     | "SmallestKeys" >> beam.combiners.Top.Smallest(choice.MAX_TRAIN_SAMPLE)
                     | "Threshold" >> beam.Map(largest_or_none))
        _ = (rows
             | "InSample" >> beam.Filter(under_threshold, beam.pvalue.AsSingleton(threshold))
             | "SampleRows" >> beam.Map(sample_row)
             | "WriteSample" >> WriteVectorTables(
                 fs.join(self._index_dir, files.TRAIN_SAMPLE_DIR, "part"),
                 lambda batch: vectors.train_sample_table(batch, dim), vectors.train_sample_schema(dim)))


# --- building the index --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexPlan:
    """The index decided from the exact count: where it is built, its type, sample and index.json fields."""

    index_dir: str
    shards: tuple[str, ...]  # the names of the non-empty shards
    factory: str
    dim: int
    sample_size: int
    use_gpu: bool
    info: dict[str, Any]  # index.json without the shard list


class BuildShard(beam.DoFn):
    """One shard: the trained index, the shard's vectors added in chunks, the shard file and its id map."""

    def __init__(self, index_dir: str, use_gpu: bool) -> None:
        self._index_dir = index_dir
        self._use_gpu = use_gpu

    def process(self, shard: str, trained_path: str) -> Iterator[dict[str, Any]]:
        summary = build.build_shard(self._index_dir, shard, trained_path, self._use_gpu)
        count("shards_built")
        yield summary


def train_once(_: Any, index_dir: str, factory: str, dim: int, sample_size: int, use_gpu: bool) -> str:
    """Train the index on the sample (in a worker) and write trained.faiss; returns its path."""
    sample = build.read_train_sample(fs.join(index_dir, files.TRAIN_SAMPLE_DIR), sample_size)
    index = build.train_index(factory, dim, sample.reshape(-1, dim), use_gpu)
    path = fs.join(index_dir, files.TRAINED_NAME)
    storage.write_index(index, path)
    return path


def write_index_json(summaries: list[dict[str, Any]], index_dir: str, fields: dict[str, Any]) -> None:
    shard_files = sorted(summaries, key=lambda item: item["name"])
    fields = {**fields, "shard_files": shard_files, "count": sum(item["count"] for item in shard_files)}
    fs.write_json_atomic(fs.join(index_dir, files.INDEX_JSON), info.IndexInfo(**fields).to_json())


class BuildIndex(beam.PTransform):
    """The trained index (trained once in a worker, or ``trained`` already there), every shard added in
    parallel, then index.json."""

    def __init__(self, plan: IndexPlan, trained: str | None = None) -> None:
        super().__init__()
        self._plan, self._trained = plan, trained

    def expand(self, pipeline: beam.Pipeline) -> None:
        plan = self._plan
        if self._trained is None:
            trained = (pipeline | "Once" >> beam.Create([None])
                       | "Train" >> beam.Map(train_once, plan.index_dir, plan.factory, plan.dim, plan.sample_size,
                                             plan.use_gpu))
        else:
            trained = pipeline | "ReusedTrained" >> beam.Create([self._trained])
        summaries = (pipeline | "Shards" >> beam.Create(list(plan.shards))
                     | "Spread" >> beam.Reshuffle()
                     | "BuildShards" >> beam.ParDo(BuildShard(plan.index_dir, plan.use_gpu),
                                                   beam.pvalue.AsSingleton(trained)))
        _ = (summaries | "AllShards" >> beam.combiners.ToList()
             | "WriteIndexJson" >> beam.Map(write_index_json, plan.index_dir, plan.info))
