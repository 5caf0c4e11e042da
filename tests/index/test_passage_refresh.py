"""transforms/index/refresh.py: unchanged passages found from the old shards' digest tables, their old rows read
from their old shard, in memory."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from artifacts.passages import Passage
from tests.builders import clustered, write_index_dir
from transforms.index.refresh import DigestTable, SplitPassagesForRefresh, passage_digest


def test_split_passages_reuses_same_id_title_and_text(tmp_path):
    old_ids = np.arange(40, dtype=np.int64)
    vectors = clustered(40)
    old_index = write_index_dir(tmp_path / "old", vectors, old_ids, 3)
    unchanged = [Passage(passage_id, f"T{passage_id}", f"text of {passage_id}") for passage_id in range(0, 40, 2)]
    edited = [Passage(1, "T1", "text of 1, edited"), Passage(3, "Other title", "text of 3"), Passage(99, "N", "new")]
    with TestPipeline() as pipeline:
        split = (pipeline | beam.Create(unchanged + edited)
                 | SplitPassagesForRefresh(old_index, str(tmp_path / "digests")))
        assert_that(split["encode"], equal_to(edited), label="Encode")
        assert_that(split["reused"] | beam.Map(lambda row: (row[0], row[1], row[2], row[3].tolist())),
                    equal_to([(passage.passage_id, passage.title, passage.text, vectors[passage.passage_id].tolist())
                              for passage in unchanged]), label="Reused")


def test_digest_tables_never_reuse_an_id_the_old_run_has_twice():
    ids = np.array([5, 3, 5, 9], np.int64)
    digests = np.stack([np.frombuffer(passage_digest("T", str(value)), np.uint8) for value in ids])
    table = DigestTable.of(ids, digests)
    assert table.ids.tolist() == [3, 9]
    assert table.unchanged(9, passage_digest("T", "9")) and not table.unchanged(9, passage_digest("T", "8"))
    assert not table.unchanged(5, passage_digest("T", "5")) and not table.unchanged(4, b"")
    assert passage_digest("ab", "c") != passage_digest("a", "bc")
