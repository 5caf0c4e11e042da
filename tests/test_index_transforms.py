"""The index stage's transforms in memory: the corpus read as unique passages with its dead letters, encoded
rows by shard, the training-sample threshold, and the stage's counters declared where they are counted."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.ml.inference.base import PredictionResult
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from artifacts import layout
from artifacts.passages import Passage, shard_of
from artifacts.run import manifest
from encoders.retrievers import EncoderOptions
from pipelines.index import STAGE
from transforms.corpus import ReadPassages
from transforms.index import COUNTERS, IndexConfig, encoded_row, largest_or_none, under_threshold
from transforms.passages import sample_key

CORPUS = ("id\ttext\ttitle\n"
          "1\tfirst text\tOne\n"
          "2\tsecond text\tTwo\n"
          "x\tnot an id\tBad\n"
          "1\tthe same id again\tOne again\n"
          "3\t\tEmpty\n")


@pytest.mark.parametrize(("keep", "kept", "duplicate_line"),
                         [("first", "first text", 5), ("last", "the same id again", 2)])
def test_the_corpus_is_read_as_unique_passages_with_its_dead_letters(tmp_path, keep, kept, duplicate_line):
    path = tmp_path / "corpus.tsv"
    path.write_text(CORPUS, encoding="utf-8")
    with TestPipeline() as pipeline:
        passages, dead = pipeline | ReadPassages(str(path), (0, 1, 2), str(tmp_path), 100, keep)
        assert_that(passages, equal_to([Passage(1, "One" if keep == "first" else "One again", kept),
                                        Passage(2, "Two", "second text")]), label="Passages")
        kinds = dead | beam.Map(lambda record: (record["kind"], record["line_number"]))
        assert_that(kinds, equal_to([("bad_ids", 4), ("empty_texts", 6), ("duplicate_ids", duplicate_line)]),
                    label="DeadLetters")


def test_encoded_rows_go_to_their_shard_and_non_finite_vectors_are_dead_lettered():
    good = PredictionResult(Passage(7, "T", "text"), np.array([1.0, 2.0], np.float32))
    bad = PredictionResult(Passage(8, "U", "more"), np.array([np.nan, 1.0], np.float32))
    with TestPipeline() as pipeline:
        rows = (pipeline | beam.Create([good, bad])
                | beam.FlatMap(encoded_row, 3).with_outputs("dead_letter", main="rows"))
        assert_that(rows.rows | beam.MapTuple(lambda shard, row: (shard, row[0], row[3].tolist())),
                    equal_to([(shard_of(7, 3), 7, [1.0, 2.0])]), label="Rows")
        assert_that(rows.dead_letter | beam.Map(lambda record: (record["kind"], record["passage_id"])),
                    equal_to([("non_finite_vectors", 8)]), label="DeadLetters")


def test_the_training_sample_is_the_rows_up_to_the_largest_kept_key():
    keys = sorted(sample_key(passage_id) for passage_id in range(10))
    threshold = largest_or_none(keys[:4])
    kept = [passage_id for passage_id in range(10) if under_threshold((0, (passage_id,)), threshold)]
    assert sorted(sample_key(passage_id) for passage_id in kept) == keys[:4]
    assert largest_or_none([]) is None and not under_threshold((0, (1,)), None)


def test_the_config_refuses_impossible_values_and_records_the_same_options():
    encoder = EncoderOptions("kpr", "model", linker=layout.LINKER, entity_embeddings=layout.ENTITY_EMBEDDINGS)
    with pytest.raises(ValueError, match="shards must be at least 1, got 0"):
        IndexConfig(encoder, shards=0)
    with pytest.raises(ValueError, match="words_per_passage must be at least 1, got 0"):
        IndexConfig(encoder, words_per_passage=0)
    config = IndexConfig(encoder, corpus="psgs.tsv", shards=4)
    assert STAGE.options(config) == {
        "encoder": {"kind": "kpr", "model": "model", "query_model": None, "similarity": "", "title": "",
                    "query_prefix": None, "passage_prefix": "", "max_length": 256, "dtype": "float32",
                    "max_entities": 128},
        "corpus": "psgs.tsv", "words_per_passage": 100, "on_duplicate_id": "first", "shards": 4,
        "index_factory": None}
    assert STAGE.upstream(config) == (layout.DICTIONARY_STAGE, layout.EMBED_ENTITIES_STAGE)
    assert STAGE.upstream(IndexConfig(EncoderOptions("mean", "model"))) == (layout.PARSE_STAGE,)


def test_every_counter_of_a_recorded_index_run_is_declared(full_run):
    counted = manifest.load(str(full_run))[layout.INDEX_STAGE].counters
    assert {"passages_read", "passages_encoded", "passages_indexed", "shards_built"} <= set(counted)
    assert set(counted) <= set(COUNTERS)
    assert STAGE.counters is COUNTERS
