"""transforms/refresh.py: option comparison and the passages' reuse split, in memory."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from artifacts.passages import Passage
from transforms.refresh import SplitPassagesForRefresh, option_changes


def test_option_changes_names_each_difference_and_ignores_the_previous_run():
    old = {"layer": -1, "model": "a", "previous": "/old", "dtype": "float32"}
    new = {"layer": 2, "model": "a", "previous": "/other", "window": 5, "dtype": "float32"}
    assert option_changes(old, new) == ["layer: -1 -> 2", "window: None -> 5"]
    assert option_changes(old, {**old, "previous_manifest_sha256": "x"}) == []


def test_split_passages_reuses_same_id_title_and_text():
    old = [{"passage_id": 1, "title": "A", "text": "one", "embedding": [1.0]},
           {"passage_id": 2, "title": "B", "text": "two", "embedding": [2.0]},
           {"passage_id": 3, "title": "C", "text": "three", "embedding": [3.0]},
           {"passage_id": 4, "title": "D", "text": "four", "embedding": [4.0]}]
    new = [Passage(1, "A", "one"), Passage(2, "B", "two, edited"), Passage(3, "C2", "three"), Passage(5, "E", "five")]
    with TestPipeline() as pipeline:
        split = {"passages": pipeline | "New" >> beam.Create(new),
                 "old_vectors": pipeline | "Old" >> beam.Create(old)} | SplitPassagesForRefresh()
        assert_that(split["encode"], equal_to(new[1:]), label="Encode")
        assert_that(split["reused"], equal_to(old[:1]), label="Reused")
