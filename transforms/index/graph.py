"""index: a passage corpus encoded by a dense retriever, staged in hash buckets, then built into sharded FAISS
indexes.

Three Beam pipelines, so that each part runs where it should (every core for the CPU work, one process per GPU
for the model). ``PreparePassages`` reads the passages and builds the model's inputs (``inputs``: tokenizing, a KPR
encoder's linking), written as files (or takes the vector of an unchanged passage from a previous run, staged
right away); ``EncodePassages`` runs beside it, reads the inputs as they are written, runs the model and stages
the rows as they come into files by hash bucket (``forward``, artifacts/faiss/buckets.py), listing the files
written. Then the exact count decides the number of shards (from the memory budget, unless given), the index type
and its training sample. ``BuildIndex`` trains the
index once, in one worker, on the rows with the smallest sample keys of the staged files (the keys first, then only
the chosen vectors), then builds every shard in parallel: each of its buckets sorted by passage id and written as
one of the shard's files, then the shard's vectors put in a copy of the trained index (FAISS ids = passage ids) in
that order (a flat index filled in place from the staged files, any other added to from the shard's files); then
index.json.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows

from artifacts import allocator, fs, layout
from artifacts.counters import declare, dropped, error, processed
from artifacts.faiss import buckets, build, choice, files, info, storage
from artifacts.faiss.vectors import embedding_table
from encoders.retrievers import EncoderOptions
from transforms.common.dead_letters import DEAD_LETTER_TAG, count, count_some
from transforms.common.follow import FollowedFiles, RunFollowers
from transforms.common.progress import ProgressSettings
from transforms.index.forward import FollowPassageInputs, KeptPassages, StageKeptRows
from transforms.index.inputs import INPUT_FILE_ROWS, PreparePassageInputs
from transforms.index.passages import DUPLICATE_KEEPS
from transforms.index.refresh import SplitPassagesForRefresh

COUNTERS = declare(
    processed("passages_read", "passages read"),
    processed("passages_with_nul_bytes", "passages whose NUL bytes were removed"),
    error("invalid_utf8", "passage lines that are not UTF-8"),
    error("bad_quoting", "passage lines with broken quoting"),
    error("wrong_column_count", "passage lines without 3 columns"),
    error("bad_ids", "passage lines whose id is not an integer from 0 to 2^63 - 1"),
    error("empty_texts", "passages with empty text"),
    dropped("articles_without_text", "articles without text to cut into passages"),
    error("too_long_articles", "articles with more words than passage ids per page allow"),
    dropped("duplicate_ids", "passages whose id an earlier row has (the first row is kept, or the last with "
                             "--on-duplicate-id last)", dead_lettered=True),
    processed("passages_reused", "passages reused"),
    processed("passages_encoded", "passages encoded"),
    processed("passages_cut", "passages longer than --max-length tokens: their end is not encoded"),
    error("non_finite_vectors", "vectors with NaN or inf (or a zero mean)"),
    processed("kpr_entities", "kpr entities"),
    dropped("kpr_entities_truncated", "kpr entities whose mention runs past max length"),
    dropped("kpr_entities_over_max", "kpr entities over max"),
    processed("shards_built", "index shards built"),
    processed("passages_indexed", "passages in the index"),
    dropped("passages_staged_twice", "passages of an input file written twice (a retried bundle of a cluster's "
                                     "inputs' job), kept once"),
    processed("train_sample", "vectors the index was trained on"),
)


@dataclass(frozen=True)
class IndexConfig:
    """What the index stage builds: the passages of ``corpus`` (DPR TSV files; None: cut from OUT/articles into
    ``words_per_passage``-word passages) encoded by ``encoder``, hashed into ``shards`` FAISS shards of
    ``index_factory`` (None: chosen by corpus size). Without ``shards``, the fewest shards (a power of two) such
    that building one takes at most ``shard_memory_gb``. ``encoder`` names the run's own artifacts (a KPR
    encoder's linker and entity embeddings) relative to OUT."""

    encoder: EncoderOptions
    corpus: str | None = None
    words_per_passage: int = 100
    on_duplicate_id: str = "first"
    shards: int | None = None
    shard_memory_gb: float = choice.DEFAULT_SHARD_MEMORY_GB
    index_factory: str | None = None
    faiss_gpu: bool = True
    previous: str | None = None  # --previous OLD_OUT: reuse the vectors of unchanged passages
    require_reuse: bool = False
    model_workers: int | None = None  # processes of a local run that hold the model (None: one per GPU, or all)

    def __post_init__(self) -> None:
        if self.shards is not None and not 1 <= self.shards <= choice.MAX_SHARDS:
            raise ValueError(f"shards must be from 1 to {choice.MAX_SHARDS} ({choice.SHARDS_ARE}), got {self.shards}")
        if not choice.WORKER_BASE_GB < self.shard_memory_gb <= choice.MAX_SHARD_MEMORY_GB:
            raise ValueError(f"shard_memory_gb must be more than {choice.WORKER_BASE_GB:g} and at most "
                             f"{choice.MAX_SHARD_MEMORY_GB:g} (a worker's own memory before any vector, in GB), got "
                             f"{self.shard_memory_gb:g}")
        if self.words_per_passage < 1:
            raise ValueError(f"words_per_passage must be at least 1, got {self.words_per_passage}")
        if self.on_duplicate_id not in DUPLICATE_KEEPS:
            raise ValueError(f"on_duplicate_id must be one of {', '.join(DUPLICATE_KEEPS)}")

    @property
    def cuts_articles(self) -> bool:
        """Passages come from OUT/articles (no corpus file)."""
        return not self.corpus

    @property
    def shard_memory_bytes(self) -> int:
        return int(self.shard_memory_gb * choice.GB)

    def recorded_options(self) -> dict[str, Any]:
        """The options that change the index (the encoder without its runtime and OUT-relative names)."""
        encoder = self.encoder.to_json()
        for runtime in ("device", "batch_tokens", "linker", "entity_embeddings"):
            encoder.pop(runtime)
        return {"encoder": encoder, "corpus": self.corpus, "words_per_passage": self.words_per_passage,
                "on_duplicate_id": self.on_duplicate_id, "shards": self.shards,
                "shard_memory_gb": self.shard_memory_gb, "index_factory": self.index_factory}


# --- encoding: the inputs' pipeline and the model's, side by side --------------------------------------------


@dataclass(frozen=True)
class EncodingFiles:
    """Where the two encoding pipelines write: the model inputs (``inputs``, followed by the model's part, up to
    ``input_rows`` passages a file) and the staged rows by bucket (``staged``, with the records of their files
    listed under ``staged``/bucket-files*); ``tokenizer``: the passages' tokenizer saved for the inputs' workers
    (``models.save_tokenizer``; "": each loads it with transformers)."""

    inputs: FollowedFiles
    staged: str
    input_rows: int = INPUT_FILE_ROWS
    tokenizer: str = ""

    def bucket_list(self, source: str) -> str:
        """The prefix of the records of the staged files one part writes (``source``: encoded or reused)."""
        return fs.join(self.staged, f"{files.BUCKET_LIST_NAME}-{source}")


class PreparePassages(beam.PTransform):
    """Passages -> their keys under the encoder of ``salt`` (``KeptPassages.salt``) and their model inputs, written
    as files under ``files.inputs`` and listed there for the model's part. With ``lenders`` (runs' OUTs: a previous
    run, this OUT's committed index), a passage unchanged since one of them takes its vector instead (the first
    that has it), staged by bucket right away (the old shards' digest tables are written under ``scratch``);
    ``progress`` is a pass-through step that logs the rate."""

    def __init__(self, encoder: EncoderOptions, files: EncodingFiles, bucket_count: int, dim: int, salt: str,
                 progress: beam.PTransform | None = None, lenders: tuple[str, ...] = (), scratch: str = "") -> None:
        super().__init__()
        self._encoder, self._files, self._buckets, self._dim, self._salt = encoder, files, bucket_count, dim, salt
        self._progress, self._lenders, self._scratch = progress, lenders, scratch

    def expand(self, passages: beam.PCollection) -> beam.pvalue.PDone:
        encoding = self._files
        reused = []
        for number, lender in enumerate(self._lenders):  # what the first lends, the next need not
            split = passages | f"SplitForRefresh{number}" >> SplitPassagesForRefresh(
                fs.join(lender, layout.INDEX), fs.join(self._scratch, str(number)))
            passages = split["encode"]
            reused.append(split["reused"])
        if reused:
            _ = (reused | "AllReused" >> beam.Flatten()
                 | "WriteReusedBuckets" >> WriteBuckets(encoding.staged, self._buckets, self._dim)
                 | "ListReused" >> ListBucketFiles(encoding.bucket_list("reused")))
        paths = passages | "PrepareInputs" >> PreparePassageInputs(self._encoder, encoding.inputs,
                                                                   self._salt, self._progress, encoding.input_rows,
                                                                   encoding.tokenizer)
        return paths | "ListInputFiles" >> beam.io.WriteToText(encoding.inputs.listing)


class EncodePassages(beam.PTransform):
    """A pipeline's root, run beside ``PreparePassages``' -> the rows (passage_id, title, text, vector) of the
    inputs it writes, encoded as they appear by the inputs' followers (one per process that holds the model),
    kept (``kept``: those kept by a killed run are not encoded again), staged by bucket and their files listed.
    Returns the dead letters (non-finite vectors). The launcher ends it (``follow.mark_ended``) once the inputs'
    pipeline has ended."""

    def __init__(self, encoder: EncoderOptions, files: EncodingFiles, bucket_count: int, dim: int,
                 kept: KeptPassages, progress: ProgressSettings) -> None:
        super().__init__()
        follower = FollowPassageInputs(encoder, files.inputs, files.staged, bucket_count, dim, kept, progress)
        self._encode = RunFollowers(follower, files.inputs.followers, "records")
        self._list = files.bucket_list("encoded")

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        encoded = pipeline | "Encode" >> self._encode
        _ = encoded["records"] | "ListBucketFiles" >> ListBucketFiles(self._list)
        return encoded[DEAD_LETTER_TAG]


class StageKeptPassages(beam.PTransform):
    """A pipeline's root -> the rows of the kept files ``paths`` (a killed run's) whose keys are among the sorted
    keys saved at ``reused`` (passages of this run not encoded again), staged by bucket and their files listed."""

    def __init__(self, paths: list[str], reused: str, files: EncodingFiles, bucket_count: int, dim: int) -> None:
        super().__init__()
        self._paths, self._reused, self._files = paths, reused, files
        self._buckets, self._dim = bucket_count, dim

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.pvalue.PDone:
        return (pipeline | "KeptFiles" >> beam.Create(self._paths) | "Spread" >> beam.Reshuffle()
                | "KeptRows" >> beam.ParDo(StageKeptRows(self._reused))
                | "WriteKeptBuckets" >> WriteBuckets(self._files.staged, self._buckets, self._dim)
                | "ListKept" >> ListBucketFiles(self._files.bucket_list("kept")))


# --- staging the vectors by bucket ---------------------------------------------------------------------------


class WriteBucketFilesFn(beam.DoFn):
    """Rows -> staged files by hash bucket (one writer per bundle, given ``ROWS_PER_TABLE`` rows at a time); emits
    the records of the files it closed."""

    ROWS_PER_TABLE = 1024

    def __init__(self, directory: str, bucket_count: int, dim: int) -> None:
        self._directory, self._buckets, self._dim = directory, bucket_count, dim
        self._writer: buckets.BucketWriter | None = None

    def start_bundle(self) -> None:
        self._writer = buckets.BucketWriter(self._directory, self._buckets, self._dim)
        self._rows: list[buckets.Row] = []

    def process(self, row: buckets.Row) -> None:
        self._rows.append(row)
        if len(self._rows) >= self.ROWS_PER_TABLE:
            self._add_rows()

    def _add_rows(self) -> None:
        if self._rows:
            self._writer.add_table(embedding_table(self._rows, self._dim))
        self._rows = []

    def finish_bundle(self) -> Iterator[Any]:
        self._add_rows()
        for record in self._writer.close():
            yield GlobalWindows.windowed_value(record.to_json())


class WriteBuckets(beam.PTransform):
    """Rows -> staged Parquet files under ``directory`` by hash bucket, written as the rows come (no shuffle);
    the output: the records of the files written (``BucketFile`` JSON lines)."""

    def __init__(self, directory: str, bucket_count: int, dim: int) -> None:
        super().__init__()
        self._directory, self._buckets, self._dim = directory, bucket_count, dim

    def expand(self, rows: beam.PCollection) -> beam.PCollection:
        return rows | "WriteBucketFiles" >> beam.ParDo(WriteBucketFilesFn(self._directory, self._buckets, self._dim))


class ListBucketFiles(beam.PTransform):
    """The records of every staged file -> JSON-lines files under ``prefix`` (read by the launcher's plan)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix

    def expand(self, records: beam.PCollection) -> beam.pvalue.PDone:
        return records | "WriteList" >> beam.io.WriteToText(self._prefix, file_name_suffix=".jsonl")


# --- building the index --------------------------------------------------------------------------------------

# A shard's buckets sorted at once, each holding its vectors once and its text twice while it is sorted: with
# MIN_BUCKETS_PER_SHARD, a quarter of the shard's vectors (and half its text) at most, before the index exists.
SORTING_THREADS = 2
ShardSpec = tuple[str, tuple[tuple[int, tuple[str, ...]], ...]]  # (shard name, ((bucket, its staged files), ...))


@dataclass(frozen=True)
class IndexPlan:
    """The index decided from the exact count: where it is built, its shards (each with its buckets' staged files),
    type, sample and index.json fields."""

    index_dir: str
    shards: tuple[ShardSpec, ...]  # the non-empty shards
    factory: str
    dim: int
    sample_size: int
    use_gpu: bool
    info: dict[str, Any]  # index.json without the shard list

    @property
    def staged_files(self) -> list[str]:
        return [path for _, shard_buckets in self.shards for _, paths in shard_buckets for path in paths]


class BuildShard(beam.DoFn):
    """One shard: each of its buckets sorted and written as one of its files (``SORTING_THREADS`` at a time: Arrow's
    reading and writing run outside the GIL), then the trained index with the shard's vectors in that order: a flat
    index filled in place from the staged files (by the same threads: no copy, no read back), any other added to
    from the shard's files; then the shard's index file and its id map. The buckets' row groups are read and
    written with blocks from the heap (``allocator.blocks_from_the_heap``)."""

    def __init__(self, index_dir: str, dim: int, use_gpu: bool, factory: str) -> None:
        self._index_dir, self._dim, self._use_gpu, self._factory = index_dir, dim, use_gpu, factory

    def process(self, shard: ShardSpec, trained_path: str) -> Iterator[dict[str, Any]]:
        name, shard_buckets = shard

        def write_bucket(item: tuple[int, tuple[str, ...]]) -> tuple[np.ndarray, int]:
            return buckets.write_shard_bucket(self._index_dir, name, item[0], item[1], self._dim)

        with ThreadPoolExecutor(max_workers=SORTING_THREADS, thread_name_prefix="sort-bucket") as pool:
            with allocator.blocks_from_the_heap():
                written = list(pool.map(write_bucket, shard_buckets))  # every bucket written, or the first error
            sorted_ids = [ids for ids, _ in written]
            count_some("passages_staged_twice", sum(repeated for _, repeated in written))  # in the bundle's thread
            index = storage.read_index(trained_path, mmap=False)
            room = build.flat_rows(index, sum(len(ids) for ids in sorted_ids))
            if room is None:
                summary = build.add_shard_files(index, self._index_dir, name, self._use_gpu, self._factory)
            else:
                fill_in_place(pool, room, [paths for _, paths in shard_buckets], sorted_ids)
                summary = build.write_shard(index, room[1], self._index_dir, name)
        count("shards_built")
        count_some("passages_indexed", summary["count"])
        yield summary


def fill_in_place(pool: ThreadPoolExecutor, room: tuple[np.ndarray, np.ndarray], staged: list[tuple[str, ...]],
                  sorted_ids: list[np.ndarray]) -> None:
    """A flat index's vectors and ids (``room``) filled with its buckets' rows, bucket after bucket, each in
    passage id order (``sorted_ids``): every bucket's staged vectors read again straight into their rows."""
    vectors, ids = room
    ids[:] = np.concatenate(sorted_ids)
    starts = np.cumsum([len(bucket) for bucket in sorted_ids])[:-1]
    list(pool.map(buckets.fill_bucket, staged, sorted_ids, np.split(vectors, starts)))


def train_once(_: Any, plan: IndexPlan) -> str:
    """Train the index on the sample of the staged files (in a worker) and write trained.faiss; returns its path."""
    sample = build.read_train_sample(plan.staged_files, plan.sample_size)
    index = build.train_index(plan.factory, plan.dim, sample.reshape(-1, plan.dim), plan.use_gpu)
    path = fs.join(plan.index_dir, files.TRAINED_NAME)
    storage.write_index(index, path)
    return path


def write_index_json(summaries: list[dict[str, Any]], index_dir: str, fields: dict[str, Any]) -> None:
    shard_files = sorted(summaries, key=lambda item: item["name"])
    fields = {**fields, "shard_files": shard_files, "count": sum(item["count"] for item in shard_files)}
    fs.write_json_atomic(fs.join(index_dir, files.INDEX_JSON), info.IndexInfo(**fields).to_json())


class BuildIndex(beam.PTransform):
    """The trained index (trained once in a worker, or ``trained`` already there), every shard built in
    parallel, then index.json."""

    def __init__(self, plan: IndexPlan, trained: str | None = None) -> None:
        super().__init__()
        self._plan, self._trained = plan, trained

    def expand(self, pipeline: beam.Pipeline) -> None:
        plan = self._plan
        if self._trained is None:
            trained = pipeline | "Once" >> beam.Create([None]) | "Train" >> beam.Map(train_once, plan)
        else:
            trained = pipeline | "ReusedTrained" >> beam.Create([self._trained])
        summaries = (pipeline | "Shards" >> beam.Create(list(plan.shards))
                     | "Spread" >> beam.Reshuffle()
                     | "BuildShards" >> beam.ParDo(BuildShard(plan.index_dir, plan.dim, plan.use_gpu, plan.factory),
                                                   beam.pvalue.AsSingleton(trained)))
        _ = (summaries | "AllShards" >> beam.combiners.ToList()
             | "WriteIndexJson" >> beam.Map(write_index_json, plan.index_dir, plan.info))
