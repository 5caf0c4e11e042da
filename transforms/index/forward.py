"""index's second part, one process per GPU: the passages' ready inputs read back (``inputs``), batched, padded
and encoded, and each passage's row (id, title, text, vector) staged by hash bucket for the build. It tokenizes
and links nothing. It runs beside the inputs' pipeline, each follower taking the files of its share as they
appear (``follow``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np

from artifacts import tables
from artifacts.faiss import buckets
from artifacts.passages import Passage
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


def encoded_row(passage: Passage, vector: np.ndarray) -> buckets.Row | beam.pvalue.TaggedOutput:
    """An encoded passage as a row (passage_id, title, text, vector), or a dead letter for a non-finite vector."""
    if not np.all(np.isfinite(vector)):
        return dead_letter("non_finite_vectors", "the encoder returned NaN or inf", passage_id=passage.passage_id)
    count("passages_encoded")
    return passage.passage_id, passage.title, passage.text, vector


class FollowPassageInputs(beam.DoFn):
    """(index, followers) -> the records (``BucketFile`` JSON) of the staged files of the passages of the input
    files this follower takes, encoded as the inputs' pipeline writes them, until it has ended. Non-finite vectors
    are dead-lettered; how many passages each row group held is tagged ``encoded``."""

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
        for path in follow(self._files, index, followers):
            for table in tables.iter_file_batches([path], batch_size=1 << 30):  # a row group at a time
                passages, features = table_features(table)
                for passage, vector in zip(passages, self._encoder.encode_features(features), strict=True):
                    row = encoded_row(passage, vector)
                    if isinstance(row, beam.pvalue.TaggedOutput):
                        yield row
                    else:
                        writer.add(row)
                yield beam.pvalue.TaggedOutput(ENCODED_TAG, len(passages))
        for record in writer.close():
            yield record.to_json()
