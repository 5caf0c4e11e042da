"""index's second part, one process per GPU: the passages' ready inputs read back (``inputs``), batched, padded
and encoded, and each passage's row (id, title, text, vector) staged by hash bucket for the build. It tokenizes
and links nothing. It runs beside the inputs' pipeline, each follower taking the files of its share as they
appear (``follow``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import apache_beam as beam
import numpy as np

from artifacts import tables
from artifacts.faiss import buckets
from artifacts.passages import Passage
from encoders.batching import prefetched
from encoders.loading import load_retriever
from encoders.models import worker_device
from encoders.retrievers import DenseEncoder, EncoderOptions
from transforms.common.dead_letters import count, dead_letter
from transforms.common.follow import ENCODED_TAG, FollowedFiles, follow
from transforms.common.per_worker import PerProcess
from transforms.index.inputs import encoder_key, table_features


def load_keyed_encoder(key: str) -> DenseEncoder:
    """The passage encoder of ``encoder_key``, on this worker's device (``worker_device``: one GPU each)."""
    options = EncoderOptions.from_json(json.loads(key))
    return load_retriever(options.with_runtime(device=worker_device(options.device)), "passage")


def encoded_rows(passages: list[Passage], vectors: np.ndarray) -> tuple[list[buckets.Row], list[Any]]:
    """The rows (passage_id, title, text, vector) of encoded passages, and a dead letter for each non-finite
    vector; the rows counted."""
    finite = np.isfinite(vectors).all(axis=1)
    rows = [(passage.passage_id, passage.title, passage.text, vector)
            for passage, vector, kept in zip(passages, vectors, finite.tolist(), strict=True) if kept]
    dead = [dead_letter("non_finite_vectors", "the encoder returned NaN or inf", passage_id=passage.passage_id)
            for passage, kept in zip(passages, finite.tolist(), strict=True) if not kept]
    count("passages_encoded", len(rows))
    return rows, dead


def add_rows(writer: buckets.BucketWriter, rows: list[buckets.Row]) -> None:
    for row in rows:
        writer.add(row)


def read_inputs(paths: Iterator[str]) -> Iterator[tuple[list[Passage], list[dict[str, Any]]]]:
    """The passages and ready model inputs of the input files ``paths``, a row group at a time."""
    for path in paths:
        for table in tables.iter_file_batches([path], batch_size=1 << 30):
            yield table_features(table)


class FollowPassageInputs(beam.DoFn):
    """(index, followers) -> the records (``BucketFile`` JSON) of the staged files of the passages of the input
    files this follower takes, encoded as the inputs' pipeline writes them, until it has ended. Non-finite vectors
    are dead-lettered; how many passages each row group held is tagged ``encoded``. While the model runs, the next
    row group is read in a thread (``read_inputs``) and the last one's rows staged in another."""

    def __init__(self, encoder: EncoderOptions, files: FollowedFiles, directory: str, bucket_count: int,
                 dim: int) -> None:
        self._key, self._files = encoder_key(encoder), files
        self._directory, self._buckets, self._dim = directory, bucket_count, dim
        self._encoders = PerProcess(load_keyed_encoder)

    def setup(self) -> None:
        self._encoder = self._encoders.get(self._key)

    def process(self, element: tuple[int, int]) -> Iterator[Any]:
        index, followers = element
        writer = buckets.BucketWriter(self._directory, self._buckets, self._dim)
        # the next row group is read in a thread, and the last one's rows staged in another, while the model runs
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="stage-rows") as behind:
            staging = behind.submit(lambda: None)
            for passages, features in prefetched(read_inputs(follow(self._files, index, followers)), depth=1):
                rows, dead = encoded_rows(passages, self._encoder.encode_features(features))
                yield from dead
                staging.result()  # one row group in flight at most
                staging = behind.submit(add_rows, writer, rows)
                yield beam.pvalue.TaggedOutput(ENCODED_TAG, len(passages))
            staging.result()
        for record in writer.close():
            yield record.to_json()
