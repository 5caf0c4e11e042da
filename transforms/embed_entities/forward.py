"""embed-entities' second part, one process per GPU: ready inputs read back (``inputs``), padded, encoded, and
their [MASK] vectors written as parts bucketed by entity for the reduce (``entity_vectors``). It tokenizes and
cuts nothing: what it does beside the forward is reading Parquet row groups, numpy padding and writing.

It runs beside the inputs' pipeline, not after it: each follower (one per process that holds a model) encodes
the input files of its share as they appear, so the GPU works while the inputs are built, and stops once the
launcher has written that the inputs' pipeline ended (the full list of files) or failed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass
from typing import Any

import apache_beam as beam
import numpy as np

from artifacts import fs, tables
from artifacts.counters import declare, error
from encoders.batching import prefetched
from encoders.mask_encoder import MaskEncoder
from encoders.mask_inputs import PackedMaskInputs
from encoders.models import ModelSpec, worker_device
from transforms.common.dead_letters import dead_letter
from transforms.common.follow import ENCODED_TAG, FollowedFiles, follow, wait_for
from transforms.common.per_worker import PerProcess
from transforms.embed_entities.entity_vectors import ModelFacts, PartWriter
from transforms.embed_entities.inputs import table_inputs

COUNTERS = declare(error("non_finite_vectors", "vectors with NaN or inf (or a zero mean)"))



@dataclass(frozen=True)
class InputFiles:
    """Where the two parts meet: ``facts`` (the model's ``ModelFacts``, saved by the inputs' pipeline), the input
    files (``followed``) and ``parts`` (the directory of the vectors' parts)."""

    facts: str
    followed: FollowedFiles
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
    """(index, followers) -> (bucket, Part) of the mention vectors of the input files this follower takes
    (``follow``), encoded as the inputs' pipeline writes them, until it has ended. Non-finite vectors are
    dead-lettered; how many each row group held is tagged ``encoded``. While the model runs, the next row group is
    read in a thread (``read_inputs``) and the last one's vectors written in another."""

    def __init__(self, spec: ModelSpec, layer: int, max_tokens: int, files: InputFiles) -> None:
        self._key, self._files = encoder_key(spec, layer, max_tokens), files
        self._encoders = PerProcess(load_encoder)

    def setup(self) -> None:
        self._encoder = self._encoders.get(self._key)

    def process(self, element: tuple[int, int]) -> Iterator[Any]:
        index, followers = element
        files = self._files
        wait_for(files.facts, files.followed)  # the inputs' pipeline measures the model first
        writer = PartWriter(files.parts, ModelFacts(**fs.read_json(files.facts)).buckets)
        # the next row group is read in a thread, and the last one's vectors written in another, while the model runs
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="write-parts") as behind:
            writing = behind.submit(list)
            for keys, packed in prefetched(read_inputs(follow(files.followed, index, followers)), depth=1):
                vectors = self._encoder.encode_packed(packed)
                finite, dead = finite_rows(keys, vectors)
                yield from dead
                yield from writing.result()  # one row group in flight at most
                writing = behind.submit(writer.add, keys[finite], vectors[finite])
                yield beam.pvalue.TaggedOutput(ENCODED_TAG, len(keys))
            yield from writing.result()
        yield from writer.flush()


def read_inputs(paths: Iterator[str]) -> Iterator[tuple[np.ndarray, PackedMaskInputs]]:
    """The keys and ready inputs of the input files ``paths``, a row group at a time."""
    for path in paths:
        for table in tables.iter_file_batches([path], batch_size=1 << 30):
            yield table_inputs(table)
