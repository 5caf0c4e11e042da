"""embed-entities' second part, one process per GPU: ready inputs read back (``inputs``), padded, encoded, and
their [MASK] vectors written as parts bucketed by entity for the reduce (``entity_vectors``). It tokenizes and
cuts nothing: what it does beside the forward is reading Parquet row groups, numpy padding and writing.

It runs beside the inputs' pipeline, not after it: each follower (one per process that holds a model) encodes
the input files of its share as they appear, so the GPU works while the inputs are built, and stops once the
launcher has written that the inputs' pipeline ended (the full list of files) or failed."""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Iterator
from dataclasses import astuple, dataclass
from typing import Any

import apache_beam as beam
import numpy as np

from artifacts import fs, tables
from artifacts.counters import declare, error
from encoders.mask_encoder import MaskEncoder
from encoders.models import ModelSpec, worker_device
from transforms.common.dead_letters import DEAD_LETTER_TAG, dead_letter
from transforms.common.per_worker import PerProcess
from transforms.embed_entities.entity_vectors import ModelFacts, PartWriter
from transforms.embed_entities.inputs import INPUT_PREFIX, table_inputs

COUNTERS = declare(error("non_finite_vectors", "vectors with NaN or inf (or a zero mean)"))

ENCODED_TAG = "encoded"  # how many mentions each step encoded (for the progress line)
FOLLOW_POLL_S = 0.2  # a follower with nothing to encode looks for new input files this often


@dataclass(frozen=True)
class InputFiles:
    """Where the two parts meet: ``facts`` (the model's ``ModelFacts``, saved by the inputs' pipeline), ``inputs``
    (the directory the input files are written to), ``ended`` (the file the launcher writes once the inputs'
    pipeline has ended: every input file, or why it failed) and ``parts`` (the directory of the vectors' parts)."""

    facts: str
    inputs: str
    ended: str
    parts: str


def encoder_key(spec: ModelSpec, layer: int, max_tokens: int) -> str:
    """What identifies a loaded [MASK] encoder (the key of the one each worker process holds)."""
    return json.dumps([*astuple(spec), layer, max_tokens])


def load_encoder(key: str) -> MaskEncoder:
    """The [MASK] encoder of ``encoder_key``, on this worker's device (``worker_device``: one GPU each)."""
    name, device, dtype, layer, max_tokens = json.loads(key)
    return MaskEncoder(ModelSpec(name, worker_device(device), dtype), layer, max_tokens)


def finite_rows(keys: np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, list[Any]]:
    """Which rows have finite vectors, and a dead letter for each of the others."""
    finite = np.isfinite(vectors).all(axis=1)
    dead = [dead_letter("non_finite_vectors", "the model returned NaN or inf", entity_id=int(entity_id))
            for entity_id in keys["entity_id"][~finite].tolist()]
    return finite, dead


class FollowInputFiles(beam.DoFn):
    """(index, followers) -> (bucket, Part) of the mention vectors of the input files this follower takes (those
    whose name hashes to ``index``), encoded as the inputs' pipeline writes them into ``inputs``, running beside
    it, until the ``ended`` file says that pipeline has ended (with the list of every file) or failed. Non-finite
    vectors are dead-lettered; how many each file held is tagged ``encoded``."""

    def __init__(self, spec: ModelSpec, layer: int, max_tokens: int, files: InputFiles) -> None:
        self._key, self._files = encoder_key(spec, layer, max_tokens), files
        self._encoders = PerProcess(load_encoder)

    def setup(self) -> None:
        self._encoder = self._encoders.get(self._key)

    def process(self, element: tuple[int, int]) -> Iterator[Any]:
        index, followers = element
        files = self._files
        writer, done = PartWriter(files.parts, saved_facts(files).buckets), set()
        while True:
            ended = inputs_ended(files.ended)
            listed = ended if ended is not None else fs.list_files(files.inputs, f"{INPUT_PREFIX}*.parquet")
            mine = [path for path in listed if taken_by(path, followers) == index and fs.basename(path) not in done]
            for path in mine:
                yield from self._encode(path, writer)
                done.add(fs.basename(path))
            if ended is not None and not mine:
                break
            if not mine:
                time.sleep(FOLLOW_POLL_S)
        yield from writer.flush()

    def _encode(self, path: str, writer: PartWriter) -> Iterator[Any]:
        for table in tables.iter_file_batches([path], batch_size=1 << 30):  # a row group at a time
            keys, packed = table_inputs(table)
            vectors = self._encoder.encode_packed(packed)
            finite, dead = finite_rows(keys, vectors)
            yield from dead
            yield from writer.add(keys[finite], vectors[finite])
            yield beam.pvalue.TaggedOutput(ENCODED_TAG, len(keys))


def taken_by(path: str, followers: int) -> int:
    """The follower that encodes the input file ``path`` (a hash of its name: the same in every process)."""
    return zlib.crc32(fs.basename(path).encode()) % followers


def saved_facts(files: InputFiles) -> ModelFacts:
    """The model's facts, once the inputs' pipeline has saved them (it measures the model first)."""
    while not fs.exists(files.facts):
        inputs_ended(files.ended)  # an inputs' pipeline that failed before saving them ends the wait
        time.sleep(FOLLOW_POLL_S)
    return ModelFacts(**fs.read_json(files.facts))


def inputs_ended(path: str) -> list[str] | None:
    """The input files of an inputs' pipeline that has ended (its ``ended`` file), None while it runs; an
    ``InputsFailedError`` if it failed."""
    if not fs.exists(path):
        return None
    ended = fs.read_json(path)
    if "failed" in ended:
        raise InputsFailedError(ended["failed"])
    return list(ended["files"])


class InputsFailedError(RuntimeError):
    """The pipeline that builds the model's inputs failed: the one that follows it stops (its error is the one
    the stage reports)."""


class EncodeMentionInputs(beam.PTransform):
    """A pipeline's root -> {"parts": (bucket, Part) of the mention vectors of every input file, "dead_letter":
    non-finite vectors}, encoded by ``followers`` followers (one per process that holds the model) beside the
    inputs' pipeline; ``progress``: an optional step that counts the mentions encoded."""

    def __init__(self, spec: ModelSpec, layer: int, max_tokens: int, files: InputFiles, followers: int,
                 progress: beam.PTransform | None = None) -> None:
        super().__init__()
        self._follow = FollowInputFiles(spec, layer, max_tokens, files)
        self._followers, self._progress = followers, progress

    def expand(self, pipeline: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        followers = [(index, self._followers) for index in range(self._followers)]
        encoded = (pipeline | "Followers" >> beam.Create(followers) | "Spread" >> beam.Reshuffle()
                   | "Follow" >> beam.ParDo(self._follow).with_outputs(DEAD_LETTER_TAG, ENCODED_TAG, main="parts"))
        if self._progress is not None:
            _ = encoded[ENCODED_TAG] | "Progress" >> self._progress
        return {"parts": encoded.parts, DEAD_LETTER_TAG: encoded[DEAD_LETTER_TAG]}
