"""transforms/refresh.py: sample digests, option comparison and the reuse splits, in memory."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from transforms.mention_sampling import window_digest
from transforms.refresh import (
    SampleDigest,
    SplitEntitiesForRefresh,
    entity_key,
    mention_digest,
    option_changes,
)


def mention(entity_id: int, page_id: int, text: str = "see Paris here", start: int = 4, end: int = 9) -> dict:
    """A mentions/ ref whose window is ``text`` (start, end: the span in it)."""
    return {"entity_id": entity_id, "page_id": page_id, "link_index": 0, "start": start, "end": end,
            "window_digest": window_digest(text, start, end)}


def entity(entity_id: int, title: str, qid: str | None = None) -> dict:
    return {"entity_id": entity_id, "title": title, "qid": qid}


def vector_row(entity_id: int, title: str, value: float, qid: str | None = None) -> dict:
    return {"entity_id": entity_id, "title": title, "qid": qid, "embedding": [value, value], "mention_count": 1}


def digest_of(rows: list[dict]) -> tuple[int, int]:
    combine = SampleDigest()
    accumulator = combine.create_accumulator()
    for row in rows:
        accumulator = combine.add_input(accumulator, row)
    return combine.extract_output(accumulator)


def test_sample_digest_ignores_order_and_sees_every_field():
    rows = [mention(1, 10), mention(1, 11), mention(1, 12, "other words", 0, 5)]
    assert digest_of(rows) == digest_of(rows[::-1])
    assert digest_of(rows)[1] == 3
    assert digest_of(rows[:2] + rows[:1]) != digest_of(rows[:2])  # a repeated row does not cancel out
    for changed in (mention(1, 99), mention(1, 10, "see Paris there"), mention(1, 10, start=3),
                    mention(1, 10, end=8)):
        assert mention_digest(changed) != mention_digest(mention(1, 10))
    assert mention_digest(mention(7, 10)) == mention_digest(mention(1, 10))  # the id is not part of it


def test_a_row_of_an_older_run_with_its_window_has_the_digest_of_its_ref():
    stored = {"entity_id": 1, "page_id": 10, "text": "see Paris here", "start": 4, "end": 9}
    assert mention_digest(stored) == mention_digest(mention(1, 10))
    assert mention_digest({**stored, "text": "see Paris there"}) != mention_digest(mention(1, 10))
    # the ref's span is in the article: only the window and the span in it matter
    assert mention_digest({**mention(1, 10), "start": 104, "end": 109, "link_index": 3}) == mention_digest(
        mention(1, 10))


def test_entity_key_prefers_the_qid():
    assert entity_key("Paris", "Q90") == "Q90"
    assert entity_key("Paris", None) == "Paris"


def test_option_changes_names_each_difference_and_ignores_the_previous_run():
    old = {"layer": -1, "model": "a", "previous": "/old", "dtype": "float32"}
    new = {"layer": 2, "model": "a", "previous": "/other", "window": 5, "dtype": "float32"}
    assert option_changes(old, new) == ["layer: -1 -> 2", "window: None -> 5"]
    assert option_changes(old, {**old, "previous_manifest_sha256": "x"}) == []


def test_split_entities_reuses_unchanged_samples_under_new_ids():
    old_mentions = [mention(1, 10), mention(2, 10, "a Rome b", 2, 6), mention(3, 11, "x Oslo y", 2, 6),
                    mention(4, 12, "in Bern", 3, 7)]
    old_entities = [entity(1, "Paris", "Q90"), entity(2, "Rome"), entity(3, "Oslo"), entity(4, "Bern")]
    old_vectors = [vector_row(1, "Paris", 1.0, "Q90"), vector_row(2, "Rome", 2.0), vector_row(3, "Oslo", 3.0)]
    # New run: Paris renamed (same QID, same sample) and renumbered; Rome's sample changed; Oslo unchanged;
    # Bern had no vector (reused only with one); Lima is new; a removed entity has no row.
    new_mentions = [mention(5, 10), mention(1, 10, "a Rome c", 2, 6), mention(2, 11, "x Oslo y", 2, 6),
                    mention(3, 12, "in Bern", 3, 7), mention(4, 13, "to Lima", 3, 7)]
    new_entities = [entity(5, "Paris, France", "Q90"), entity(1, "Rome"), entity(2, "Oslo"), entity(3, "Bern"),
                    entity(4, "Lima"), entity(6, "Quito")]
    with TestPipeline() as pipeline:
        def create(label, rows):
            return pipeline | label >> beam.Create(rows)

        split = {"mentions": create("M", new_mentions), "entities": create("E", new_entities),
                 "old_mentions": create("OM", old_mentions), "old_entities": create("OE", old_entities),
                 "old_embeddings": create("OV", old_vectors)} | SplitEntitiesForRefresh()
        assert_that(split["encode"], equal_to(new_mentions[1:2] + new_mentions[3:]), label="Encode")
        assert_that(split["reused"], equal_to([vector_row(5, "Paris, France", 1.0, "Q90"),
                                               vector_row(2, "Oslo", 3.0)]), label="Reused")
        assert_that(split["id_map"], equal_to([
            {"key": "Q90", "old_entity_id": 1, "new_entity_id": 5},
            {"key": "Rome", "old_entity_id": 2, "new_entity_id": 1},
            {"key": "Oslo", "old_entity_id": 3, "new_entity_id": 2},
            {"key": "Bern", "old_entity_id": 4, "new_entity_id": 3}]), label="IdMap")
