"""index's second part, one process per GPU: the passages' ready inputs read back (``inputs``), batched, padded
and encoded, and each passage's row (id, title, text, vector) staged by hash bucket for the build. It tokenizes
and links nothing. It runs beside the inputs' pipeline, each follower taking the files of its share as they
appear (``follow``).

What a follower encodes is also kept, a file per step written whole (``KeptPassages``), where the stage's
rerun after a kill finds it: a passage is known there by ``passage_key`` (the encoder and the passage's id, title
and text; computed where its inputs are built, ``inputs.passage_keys``), and a rerun's followers do not encode
the passages kept before; their rows are staged from the kept files instead (``StageKeptRows``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from artifacts import fs, layout, schemas, tables
from artifacts.faiss import buckets
from artifacts.faiss.vectors import table_vectors, with_vectors
from encoders.batching import HostBuffers, QueuedForwards, prefetched
from encoders.loading import load_retriever
from encoders.models import worker_device
from encoders.retrievers import DenseEncoder, EncoderOptions, ReadyInputs
from transforms.common.dead_letters import count, count_some, dead_letter
from transforms.common.follow import FollowedFiles, FollowerClock, follow_steps, one_step_ahead
from transforms.common.packed import found_in
from transforms.common.per_worker import PerProcess
from transforms.common.progress import ProgressLog, ProgressSettings
from transforms.common.worker_files import load_array, save_array
from transforms.index.inputs import encoder_key, table_inputs

STAGE = layout.command_of(layout.INDEX_STAGE)  # the follower's summary line names it
KEY = "passage_key"
KEPT_PREFIX = "encoded-"


@dataclass(frozen=True)
class KeptPassages:
    """Where encoded passages are kept for a rerun: ``directory`` (kept files, ``KEPT_PREFIX``*), ``known`` (the
    sorted keys of the passages kept before this run started: not encoded again), ``reused`` (where each
    follower saves the keys it did not encode) and ``salt`` (the encoder's part of every key, hex: the inputs'
    pipeline keys the passages with it)."""

    directory: str
    known: str
    reused: str
    salt: str


def keep_rows(kept: KeptPassages, keys: np.ndarray, rows: pa.Table) -> None:
    """Write encoded rows (an ``embedding_schema`` table) with their keys to a kept file, whole or not at all."""
    if rows.num_rows:
        path = fs.join(kept.directory, f"{KEPT_PREFIX}{uuid.uuid4().hex}.parquet")
        keyed = rows.append_column(pa.field(KEY, pa.uint64()), pa.array(keys, pa.uint64()))
        fs.write_bytes_atomic(path, tables.parquet_bytes(keyed, schemas.scratch_compression(keyed.schema)))


def kept_files(directory: str) -> list[str]:
    return fs.list_files(directory, f"{KEPT_PREFIX}*.parquet")


def kept_keys(paths: Sequence[str]) -> np.ndarray:
    """The keys of the kept files ``paths``, sorted, each once."""
    return np.unique(np.concatenate([np.zeros(0, np.uint64),
                                     *(tables.read_file(path, [KEY]).column(KEY).to_numpy() for path in paths)]))


def load_keyed_encoder(key: str) -> DenseEncoder:
    """The passage encoder of ``encoder_key``, on this worker's device (``worker_device``: one GPU each)."""
    options = EncoderOptions.from_json(json.loads(key))
    return load_retriever(options.with_runtime(device=worker_device(options.device)), "passage")


def encoded_rows(passages: pa.Table, vectors: np.ndarray) -> tuple[pa.Table, np.ndarray, list[Any]]:
    """The rows (an ``embedding_schema`` table) of encoded passages (``passages``: a table of their passage_id,
    title and text, a row per vector), which of them they are, and a dead letter for each non-finite vector; the
    rows counted."""
    finite = np.isfinite(vectors).all(axis=1)
    rows = with_vectors(passages, vectors) if finite.all() else with_vectors(passages.filter(pa.array(finite)),
                                                                             vectors[finite])
    dead = [dead_letter("non_finite_vectors", "the encoder returned NaN or inf", passage_id=passage_id)
            for passage_id in passages.column("passage_id").filter(pa.array(~finite)).to_pylist()]
    count("passages_encoded", rows.num_rows)
    return rows, finite, dead


def add_rows(writer: buckets.BucketWriter, rows: pa.Table, kept: KeptPassages, keys: np.ndarray) -> None:
    """Keep the rows (a file written whole), then stage them by bucket."""
    keep_rows(kept, keys, rows)
    writer.add_table(rows)


@dataclass(frozen=True)
class InputStep:
    """The input files of a step, read: the passages' columns (passage_id, title, text), their keys
    (``inputs.passage_keys``) and their ready model inputs."""

    columns: pa.Table
    keys: np.ndarray
    ready: ReadyInputs


def read_inputs(steps: Iterator[list[str]]) -> Iterator[InputStep]:
    """The input files of each step (``follow_steps``), read a step at a time."""
    for step in steps:
        table = tables.read_files(step, schemas.PASSAGE_INPUTS)
        yield InputStep(table.select(["passage_id", "title", "text"]), *table_inputs(table))


class FollowPassageInputs(beam.DoFn):
    """(index, followers) -> the records (``BucketFile`` JSON) of the staged files of the passages of the input
    files this follower takes, encoded as the inputs' pipeline writes them, until it has ended; those kept before
    (``kept.known``) are not encoded, their keys saved for ``StageKeptRows``. Non-finite vectors are
    dead-lettered. Its progress lines (``progress``) count the passages as their forward batches run, those kept
    before when their step (``follow_steps``: present files, one model call) starts. While the model runs, the
    next step is read in a thread (``read_inputs``), the last one's vectors checked (the next step's forward
    passes queued before: ``one_step_ahead``) and its rows kept and staged in another."""

    def __init__(self, encoder: EncoderOptions, files: FollowedFiles, directory: str, bucket_count: int,
                 dim: int, kept: KeptPassages, progress: ProgressSettings) -> None:
        self._key, self._files, self._settings = encoder_key(encoder), files, progress
        self._directory, self._buckets, self._dim, self._kept = directory, bucket_count, dim, kept
        self._encoders = PerProcess(load_keyed_encoder)

    def setup(self) -> None:
        self._encoder = self._encoders.get(self._key)
        self._progress = ProgressLog(self._settings)

    def teardown(self) -> None:
        self._progress.stop()

    def process(self, element: tuple[int, int]) -> Iterator[Any]:
        index, followers = element
        writer = buckets.BucketWriter(self._directory, self._buckets, self._dim)
        known, skipped = load_array(self._kept.known), [np.zeros(0, np.uint64)]
        clock, seen, encoded = FollowerClock(), 0, 0
        buffers = HostBuffers(2)  # a step's rows are staged (copied by bucket) before the step after next

        def start(step: InputStep) -> tuple[pa.Table, np.ndarray, np.ndarray, QueuedForwards]:
            done, _ = found_in(known, step.keys)
            skipped.append(step.keys[done])
            count_some("passages_reused", int(done.sum()))
            todo = np.flatnonzero(~done)
            self._progress.add(len(step.keys) - len(todo))
            with clock.timing("model"):
                return step.columns, step.keys, todo, self._encoder.queue_ready(
                    step.ready, todo, lambda batch: self._progress.add(len(batch)))

        def finish(started: tuple[pa.Table, np.ndarray, np.ndarray, QueuedForwards]
                   ) -> tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray]:
            columns, keys, todo, queued = started
            with clock.timing("model"):
                return columns, keys, todo, queued.collect(buffers.take(len(todo), self._dim))

        # the next step is read in a thread, and the last one's rows staged in another, while the model runs
        with self._progress.active(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="stage-rows") as behind, \
                closing(prefetched(read_inputs(follow_steps(self._files, index, followers)), depth=1)) as inputs:
            staging = behind.submit(lambda: None)
            steps = one_step_ahead(clock.waited("waiting for inputs", inputs), start, finish)
            for columns, keys, todo, vectors in steps:
                rows, finite, dead = encoded_rows(columns if len(todo) == len(keys) else columns.take(todo), vectors)
                yield from dead
                seen, encoded = seen + len(keys), encoded + len(todo)
                with clock.timing("writing behind"):
                    staging.result()  # one row group in flight at most
                staging = behind.submit(add_rows, writer, rows, self._kept, keys[todo][finite])
            staging.result()
        save_array(fs.join(self._kept.reused, f"reused-{index:05d}.npy"), np.concatenate(skipped))
        for record in writer.close():
            yield record.to_json()
        clock.write(STAGE, f"{index + 1} of {followers}", f"{encoded:,} passages encoded of {seen:,}")


class StageKeptRows(beam.DoFn):
    """A kept file of a killed run -> its rows (passage_id, title, text, vector) whose keys are among the sorted
    ``reused`` keys (the passages of this run its followers did not encode)."""

    def __init__(self, reused: str) -> None:
        self._reused, self._loader = reused, PerProcess(load_array)

    def setup(self) -> None:
        self._keys: np.ndarray = self._loader.get(self._reused)

    def process(self, path: str) -> Iterator[buckets.Row]:
        table = tables.read_file(path)
        wanted, _ = found_in(self._keys, table.column(KEY).to_numpy())
        picked = table.filter(pa.array(wanted))
        yield from zip(picked.column("passage_id").to_pylist(), picked.column("title").to_pylist(),
                       picked.column("text").to_pylist(), table_vectors(picked), strict=True)
