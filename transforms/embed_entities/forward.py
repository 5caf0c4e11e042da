"""embed-entities' second part, one process per GPU: ready inputs read back (``inputs``); those whose window is not
stored yet (``window_store``) padded, encoded and their [MASK] vectors stored; every mention's window key written,
bucketed as the store, for the reduce (``gather``). It tokenizes and cuts nothing: what it does beside the forward
is reading Parquet row groups, a sorted lookup, numpy padding and writing.

It runs beside the inputs' pipeline, not after it: each follower (one per process that holds a model) encodes
the input files of its share as they appear, so the GPU works while the inputs are built, and stops once the
launcher has written that the inputs' pipeline ended (the full list of files) or failed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import astuple, dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from artifacts import fs, layout, schemas, tables
from artifacts.counters import declare, error, processed
from encoders.batching import HostBuffers, QueuedForwards, prefetched
from encoders.mask_encoder import MaskEncoder
from encoders.mask_inputs import PackedMaskInputs
from encoders.models import ModelSpec, worker_device
from transforms.common.dead_letters import count_some, dead_letter
from transforms.common.follow import (
    FollowedFiles,
    FollowerClock,
    follow_steps,
    one_step_ahead,
    wait_for,
)
from transforms.common.packed import found_in
from transforms.common.per_worker import PerProcess
from transforms.common.progress import ProgressLog, ProgressSettings
from transforms.embed_entities.entity_vectors import ModelFacts, Part, write_bucketed_part
from transforms.embed_entities.inputs import WINDOW_REF, table_inputs
from transforms.embed_entities.window_store import (
    STORE_DTYPE,
    key_buckets,
    load_known,
    pending_path,
    pending_rows,
    write_store_file,
)

COUNTERS = declare(
    error("non_finite_vectors", "mentions whose window's vector was NaN or inf (or beyond float16), entities whose "
          "mean vector was zero or not finite"),
    error("non_finite_windows", "windows whose vector the model returned NaN or inf (or beyond float16): their "
          "mentions are counted and dead-lettered as non_finite_vectors", detail=True),
    processed("mentions_encoded", "mentions whose window was encoded"),
    processed("mentions_reused", "mentions whose window's vector was stored before, or encoded for an earlier mention "
              "of this run"),
)
STAGE = layout.command_of(layout.EMBED_ENTITIES_STAGE)  # the follower's summary line names it
REF_ROWS = 1 << 20  # mentions' window keys a follower buffers before writing a part (24 MB)



@dataclass(frozen=True)
class InputFiles:
    """Where the two parts meet: ``facts`` (the model's ``ModelFacts``, saved by the inputs' pipeline), the input
    files (``followed``), ``known`` (the sorted keys of the windows stored before: not encoded again), ``pending``
    (the directory of the store files of what is encoded, kept if the stage is killed) and ``parts`` (the directory
    of the mentions' window keys, bucketed as the store)."""

    facts: str
    followed: FollowedFiles
    known: str
    pending: str
    parts: str


def encoder_key(spec: ModelSpec, layer: int, max_tokens: int) -> str:
    """What identifies a loaded [MASK] encoder (the key of the one each worker process holds)."""
    return json.dumps([*astuple(spec), layer, max_tokens])


def load_encoder(key: str) -> MaskEncoder:
    """The [MASK] encoder of ``encoder_key``, on this worker's device (``worker_device``: one GPU each)."""
    name, device, dtype, layer, max_tokens = json.loads(key)
    return MaskEncoder(ModelSpec(name, worker_device(device), dtype), layer, max_tokens)


def storable_rows(mentions: np.ndarray, rows: np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                                        list[Any]]:
    """Of a step's ``mentions`` (``WINDOW_REF`` rows) and the ``vectors`` of its encoded ``rows`` (one a window):
    which encoded rows have vectors the store can hold (finite as ``STORE_DTYPE``), which mentions have a window
    that has none, and a dead letter for each of those mentions (every mention of a window, not only the one
    encoded); the windows counted (``non_finite_windows``)."""
    largest = np.finfo(STORE_DTYPE).max  # two reductions: no temporary array of the vectors' size (NaN compares False)
    finite = (vectors.max(axis=1) <= largest) & (vectors.min(axis=1) >= -largest)
    if finite.all():
        return finite, np.zeros(len(mentions), dtype=bool), []
    count_some("non_finite_windows", int((~finite).sum()))
    failed = np.isin(mentions["window_key"], mentions["window_key"][rows[~finite]])
    dead = [dead_letter("non_finite_vectors", "the model returned NaN or inf (or beyond float16) for its window",
                        entity_id=int(entity_id), page_id=int(page_id), link_index=int(link_index))
            for entity_id, page_id, link_index in mentions[failed][["entity_id", "page_id", "link_index"]].tolist()]
    return finite, failed, dead


def rows_to_encode(known: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the rows whose window is not among the ``known`` keys, the first of each key, in order; how many of the
    step's mentions, their window ``keys``, each of those rows stands for)."""
    _, first, counts = np.unique(keys, return_index=True, return_counts=True)
    stored, _ = found_in(known, keys[first])
    first, counts = first[~stored], counts[~stored]
    order = np.argsort(first)
    return first[order], counts[order]


class RefWriter:
    """Mentions' ``WINDOW_REF`` rows -> part files under ``directory``, one record batch per bucket of their window
    keys (``bits``), written every ``REF_ROWS`` rows; ``add`` and ``flush`` return the (bucket, Part) written."""

    def __init__(self, directory: str, bits: int) -> None:
        self._directory, self._bits, self._held = directory, bits, []

    def add(self, refs: np.ndarray) -> list[tuple[int, Part]]:
        self._held.append(refs)
        return self.flush() if sum(map(len, self._held)) >= REF_ROWS else []

    def flush(self) -> list[tuple[int, Part]]:
        if not self._held:
            return []
        refs, self._held = np.concatenate(self._held), []
        table = pa.table({name: refs[name] for name in WINDOW_REF.names})
        path = fs.join(self._directory, f"refs-{uuid.uuid4().hex}.arrow")
        return write_bucketed_part(path, table, key_buckets(refs["window_key"], self._bits))


class PendingWriter:
    """Encoded windows (keys, vectors) -> store files under ``directory`` (``window_store.pending_path``), one
    every ``rows`` windows and at the end: what a rerun after a kill finds encoded."""

    def __init__(self, directory: str, salt: str, bits: int, rows: int) -> None:
        self._directory, self._salt, self._bits, self._rows = directory, salt, bits, rows
        self._keys: list[np.ndarray] = []
        self._vectors: list[np.ndarray] = []

    def add(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        if not len(keys):
            return
        self._keys.append(keys)
        self._vectors.append(vectors.astype(STORE_DTYPE))
        if sum(map(len, self._keys)) >= self._rows:
            self.flush()

    def flush(self) -> None:
        if self._keys:
            keys, vectors = np.concatenate(self._keys), np.concatenate(self._vectors)
            self._keys, self._vectors = [], []
            write_store_file(pending_path(self._directory), keys, vectors, self._salt, self._bits)


def write_encoded(refs: RefWriter, pending: PendingWriter, mentions: np.ndarray, keys: np.ndarray,
                  vectors: np.ndarray) -> list[tuple[int, Part]]:
    """Store the encoded windows, then list the mentions that refer to windows (both written in that order: a
    listed mention's window is stored)."""
    pending.add(keys, vectors)
    return refs.add(mentions)


class FollowInputFiles(beam.DoFn):
    """(index, followers) -> (bucket, Part) of the window keys of the mentions in the input files this follower
    takes, as the inputs' pipeline writes them, until it has ended, a step of present files at a time
    (``follow_steps``: one model call, whose vectors come back before the next step's forward passes are queued,
    and are checked and written while they run: ``one_step_ahead``). Windows not stored before (not among the
    ``known`` keys) are encoded and stored (pending files, every ``pending_rows``); non-finite vectors are
    dead-lettered (their mentions dropped). Its progress lines (``progress``) count the mentions as their windows'
    forward batches run, those stored before when their step starts. While the model runs, the next step is read
    in a thread (``read_inputs``) and the last one's vectors written in another."""

    def __init__(self, spec: ModelSpec, layer: int, max_tokens: int, files: InputFiles, salt: str,
                 mentions: int, progress: ProgressSettings) -> None:
        self._key, self._files = encoder_key(spec, layer, max_tokens), files
        self._salt, self._mentions, self._settings = salt, mentions, progress
        self._encoders = PerProcess(load_encoder)

    def setup(self) -> None:
        self._encoder = self._encoders.get(self._key)
        self._progress = ProgressLog(self._settings)

    def teardown(self) -> None:
        self._progress.stop()

    def process(self, element: tuple[int, int]) -> Iterator[Any]:
        index, followers = element
        files = self._files
        wait_for(files.facts, files.followed)  # the inputs' pipeline measures the model first
        facts = ModelFacts(**fs.read_json(files.facts))
        known = load_known(files.known)
        refs = RefWriter(files.parts, facts.store_bits)
        pending = PendingWriter(files.pending, self._salt, facts.store_bits, pending_rows(self._mentions, facts.dim))
        clock, seen, encoded = FollowerClock(), 0, 0
        buffers = HostBuffers(2)  # a step's vectors are written (copied as STORE_DTYPE) before the step after next

        def start(step: tuple[np.ndarray, PackedMaskInputs]) -> tuple[np.ndarray, np.ndarray, QueuedForwards]:
            mentions, packed = step
            rows, weights = rows_to_encode(known, mentions["window_key"])
            self._progress.add(len(mentions) - int(weights.sum()))  # their windows stored before
            with clock.timing("model"):
                return mentions, rows, self._encoder.queue_packed(
                    packed.take(rows), lambda batch: self._progress.add(int(weights[batch].sum())))

        def finish(started: tuple[np.ndarray, np.ndarray, QueuedForwards]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            mentions, rows, queued = started
            with clock.timing("model"):
                return mentions, rows, queued.collect(buffers.take(len(rows), facts.dim))

        # the next step is read in a thread, and the last one's vectors written in another, while the model runs
        with self._progress.active(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="write-vectors") as behind, \
                closing(prefetched(read_inputs(follow_steps(files.followed, index, followers)), depth=1)) as inputs:
            writing = behind.submit(list)
            steps = one_step_ahead(clock.waited("waiting for inputs", inputs), start, finish)
            for mentions, rows, vectors in steps:
                finite, failed, dead = storable_rows(mentions, rows, vectors)
                yield from dead
                count_some("mentions_encoded", len(rows))
                count_some("mentions_reused", len(mentions) - len(rows))
                seen, encoded = seen + len(mentions), encoded + len(rows)
                with clock.timing("writing behind"):
                    written = writing.result()  # one row group in flight at most
                yield from written
                writing = behind.submit(write_encoded, refs, pending, mentions[~failed],
                                        mentions["window_key"][rows[finite]], vectors[finite] if dead else vectors)
            yield from writing.result()
        pending.flush()
        yield from refs.flush()
        clock.write(STAGE, f"{index + 1} of {followers}", f"{encoded:,} windows encoded for {seen:,} mentions")


def read_inputs(steps: Iterator[list[str]]) -> Iterator[tuple[np.ndarray, PackedMaskInputs]]:
    """The ``WINDOW_REF`` rows and ready inputs of the input files of each step (``follow_steps``), a step at a
    time."""
    for step in steps:
        yield table_inputs(tables.read_files(step, schemas.MENTION_INPUTS))
