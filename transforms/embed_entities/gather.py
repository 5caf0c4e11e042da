"""embed-entities' reduce, first half: each mention's vector found in the window store (``window_store``), bucket by
bucket of window keys, and passed on as parts bucketed by entity (``entity_vectors``); this run's store (the
windows its mentions use, each once) written as it goes.

A bucket's work reads its mentions' window keys (the followers' parts) and the bucket from every store file that
has it (the previous run's store in a refresh, this OUT's from an earlier run, the pending files of this run and
of a killed one): at most ``window_store.BUCKET_BYTES`` of stored vectors per store, and their float32 copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows

from artifacts import fs
from artifacts.counters import declare, dropped
from transforms.common.dead_letters import DEAD_LETTER_TAG, count_some, dead_letter
from transforms.common.packed import found_in
from transforms.common.per_worker import PerProcess
from transforms.embed_entities.entity_vectors import MENTION_KEY, ModelFacts, Part, PartWriter, read_parts
from transforms.embed_entities.inputs import WINDOW_REF
from transforms.embed_entities.window_store import StoreFile, read_bucket, write_store_file

COUNTERS = declare(
    dropped("mention_vectors_missing", "mentions whose window has no stored vector", dead_lettered=True),
    dropped("mentions_taken_twice", "mentions of an input file written twice (a retried bundle of a cluster's "
                                    "inputs' job), kept once"),
)


def save_store_index(path: str, files: Sequence[StoreFile]) -> str:
    """Write the list of store files the reduce reads (one JSON file: its workers load it once); returns ``path``."""
    fs.write_json_atomic(path, [asdict(item) for item in files])
    return path


def load_store_index(path: str) -> list[StoreFile]:
    return [StoreFile(item["path"], item["bits"], tuple(item["buckets"])) for item in fs.read_json(path)]


def read_refs(parts: Sequence[Part]) -> np.ndarray:
    """The ``WINDOW_REF`` rows of the followers' parts."""
    found = [np.zeros(0, dtype=WINDOW_REF)]
    for table in read_parts(parts):
        rows = np.empty(table.num_rows, dtype=WINDOW_REF)
        for name in WINDOW_REF.names:
            rows[name] = table.column(name).to_numpy()
        found.append(rows)
    return np.concatenate(found)


def each_once(refs: np.ndarray) -> np.ndarray:
    """``WINDOW_REF`` rows, each mention once (its first row). A mention is listed twice when its input file was
    written twice: a cluster retries a failed bundle of the inputs' job, and a follower may have taken the failed
    attempt's file before the job ended (only the retry's is listed); both have the mention's window, so both of
    its rows are in its window's bucket."""
    _, first = np.unique(mention_keys(refs), return_index=True)
    return refs if len(first) == len(refs) else refs[np.sort(first)]


def mention_keys(refs: np.ndarray) -> np.ndarray:
    """The ``MENTION_KEY`` fields of ``WINDOW_REF`` rows."""
    keys = np.empty(len(refs), dtype=MENTION_KEY)
    for name in MENTION_KEY.names:
        keys[name] = refs[name]
    return keys


def missing_vector(ref: tuple) -> beam.pvalue.TaggedOutput:
    entity_id, page_id, link_index, window_key = ref
    return dead_letter("mention_vectors_missing", "no stored vector for the mention's window",
                       entity_id=entity_id, page_id=page_id, link_index=link_index, window_key=str(window_key))


class GatherBucketVectors(beam.DoFn):
    """(store bucket, parts of its mentions' window keys) -> (entity bucket, Part) of the mentions' vectors
    under ``parts`` (written as part files of ``entity_vectors.PartWriter``); with a ``destination``, the bucket's
    vectors the mentions use are written there as the bucket's store file. Mentions whose window has no vector
    are dead-lettered."""

    def __init__(self, index: str, parts: str, destination: str | None, salt: str) -> None:
        self._index, self._parts, self._destination, self._salt = index, parts, destination, salt
        self._loader = PerProcess(load_store_index)

    def setup(self) -> None:
        self._files: list[StoreFile] = self._loader.get(self._index)

    def start_bundle(self) -> None:
        self._writer: PartWriter | None = None

    def process(self, element: tuple[int, Sequence[Part]], facts: ModelFacts) -> Iterator[Any]:
        bucket, parts = element
        listed = read_refs(parts)
        refs = each_once(listed)
        count_some("mentions_taken_twice", len(listed) - len(refs))
        keys, vectors = read_bucket(self._files, bucket, facts.store_bits, facts.dim)
        found, where = found_in(keys, refs["window_key"])
        for ref in refs[~found].tolist():
            yield missing_vector(ref)
        rows = where[found]
        if self._destination is not None:
            used = np.unique(rows)
            name = f"part-{bucket:05d}-of-{1 << facts.store_bits:05d}.parquet"
            write_store_file(fs.join(self._destination, name), keys[used], vectors[used], self._salt,
                             facts.store_bits)
        if self._writer is None:
            self._writer = PartWriter(self._parts, facts.buckets)
        yield from self._writer.add(mention_keys(refs[found]), vectors[rows])  # float16, as stored

    def finish_bundle(self) -> Iterator[Any]:
        for item in self._writer.flush() if self._writer is not None else []:
            yield GlobalWindows.windowed_value(item)


class GatherMentionVectors(beam.PTransform):
    """(store bucket, Part) of the mentions' window keys -> (entity bucket, Part) of their vectors (main output
    ``parts``) and the dead letters of mentions without one; the run's store written under ``destination`` (None:
    not kept). ``facts``: the singleton ``ModelFacts``; ``index``: the saved list of store files
    (``save_store_index``); ``parts``: a directory for the vectors' part files."""

    def __init__(self, index: str, parts: str, destination: str | None, salt: str) -> None:
        super().__init__()
        self._gather = GatherBucketVectors(index, parts, destination, salt)

    def expand(self, inputs: dict[str, beam.PCollection]) -> dict[str, beam.PCollection]:
        gathered = (inputs["refs"] | "RefsByBucket" >> beam.GroupByKey()
                    | "Gather" >> beam.ParDo(self._gather, beam.pvalue.AsSingleton(inputs["facts"])).with_outputs(
                        DEAD_LETTER_TAG, main="parts"))
        return {"parts": gathered.parts, DEAD_LETTER_TAG: gathered[DEAD_LETTER_TAG]}
