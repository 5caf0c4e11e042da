"""transforms/embed_entities/refresh.py: sample digests (packed, summed per entity), the refresh decision, and the
decision in a pipeline (the id map written, the entities counted)."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from artifacts import schemas
from tests.builders import artifact_rows, run_counting
from transforms.common.mention_sampling import window_digest
from transforms.embed_entities.refresh import (
    DIGEST,
    DecideRefresh,
    decide,
    digest_rows,
    entity_key,
    mention_digest,
    sum_digests,
)


def mention(entity_id: int, page_id: int, text: str = "see Paris here", start: int = 4, end: int = 9) -> dict:
    """A mentions/ ref whose window is ``text`` (start, end: the span in it)."""
    return {"entity_id": entity_id, "page_id": page_id, "link_index": 0, "start": start, "end": end,
            "window_digest": window_digest(text, start, end)}


def entity(entity_id: int, title: str, qid: str | None = None) -> dict:
    return {"entity_id": entity_id, "title": title, "qid": qid}


def digest_of(rows: list[dict]) -> tuple[int, int, int]:
    [summed] = sum_digests(digest_rows(rows)).tolist()
    return summed[1:]


def test_sample_digest_ignores_order_and_sees_every_field():
    rows = [mention(1, 10), mention(1, 11), mention(1, 12, "other words", 0, 5)]
    assert digest_of(rows) == digest_of(rows[::-1])
    assert digest_of(rows)[2] == 3
    assert digest_of(rows[:2] + rows[:1]) != digest_of(rows[:2])  # a repeated row does not cancel out
    for changed in (mention(1, 99), mention(1, 10, "see Paris there"), mention(1, 10, start=3),
                    mention(1, 10, end=8)):
        assert mention_digest(changed) != mention_digest(mention(1, 10))
    assert mention_digest(mention(7, 10)) == mention_digest(mention(1, 10))  # the id is not part of it


def test_summed_digests_are_the_128_bit_digests_lane_by_lane_modulo_2_to_the_64():
    rows = [mention(1, page) for page in range(50)] + [mention(2, 7)]
    found = sum_digests(digest_rows(rows[::-1]))
    digests = [mention_digest(row) for row in rows[:50]]
    assert found["entity_id"].tolist() == [1, 2]
    assert int(found["low"][0]) == sum(digest & (2**64 - 1) for digest in digests) % 2**64
    assert int(found["high"][0]) == sum(digest >> 64 for digest in digests) % 2**64
    halves = np.concatenate([sum_digests(digest_rows(rows[:20])), sum_digests(digest_rows(rows[20:]))])
    assert sum_digests(halves).tolist() == found.tolist()  # combining partial sums changes nothing


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


# Old run: Paris, Rome, Oslo, Bern (Bern without a vector). New run: Paris renamed (same QID, same sample) and
# renumbered; Rome's sample changed; Oslo unchanged; Bern had no vector (reused only with one); Lima is new;
# Quito has no mentions; a removed entity has no row; "Twin" is a key two new entities share.
OLD_MENTIONS = [mention(1, 10), mention(2, 10, "a Rome b", 2, 6), mention(3, 11, "x Oslo y", 2, 6),
                mention(4, 12, "in Bern", 3, 7), mention(5, 14, "a Twin", 2, 6)]
OLD_ENTITIES = [entity(1, "Paris", "Q90"), entity(2, "Rome"), entity(3, "Oslo"), entity(4, "Bern"),
                entity(5, "Twin")]
OLD_WITH_VECTORS = [1, 2, 3, 5]
NEW_MENTIONS = [mention(5, 10), mention(1, 10, "a Rome c", 2, 6), mention(2, 11, "x Oslo y", 2, 6),
                mention(3, 12, "in Bern", 3, 7), mention(4, 13, "to Lima", 3, 7), mention(7, 14, "a Twin", 2, 6),
                mention(8, 14, "a Twin", 2, 6)]
NEW_ENTITIES = [entity(5, "Paris, France", "Q90"), entity(1, "Rome"), entity(2, "Oslo"), entity(3, "Bern"),
                entity(4, "Lima"), entity(6, "Quito"), entity(7, "Twin"), entity(8, "Twin")]
ID_MAP = [{"key": "Q90", "old_entity_id": 1, "new_entity_id": 5},
          {"key": "Rome", "old_entity_id": 2, "new_entity_id": 1},
          {"key": "Oslo", "old_entity_id": 3, "new_entity_id": 2},
          {"key": "Bern", "old_entity_id": 4, "new_entity_id": 3}]


def test_decide_reuses_unchanged_samples_under_new_ids():
    decision = decide(pa.Table.from_pylist(OLD_ENTITIES), pa.Table.from_pylist(NEW_ENTITIES),
                      sum_digests(digest_rows(OLD_MENTIONS)), sum_digests(digest_rows(NEW_MENTIONS)),
                      np.array(OLD_WITH_VECTORS))
    assert sorted(decision.id_map.to_pylist(), key=lambda row: row["old_entity_id"]) == ID_MAP
    assert dict(zip(decision.reuse_old.tolist(), decision.reuse_new.tolist(), strict=True)) == {1: 5, 3: 2}
    assert decision.encode.tolist() == [1, 3, 4, 7, 8]  # Quito: no mentions, nothing to encode
    empty = decide(pa.Table.from_pylist(OLD_ENTITIES), pa.Table.from_pylist(NEW_ENTITIES), np.zeros(0, DIGEST),
                   np.zeros(0, DIGEST), np.zeros(0, np.int64))
    assert (len(empty.reuse_new), len(empty.encode)) == (0, 0)


def write_run(output: Path, entities: list[dict], mentions: list[dict], vectors: dict[int, float] | None = None):
    """An OUT with entities/, mentions/ and, given ``vectors`` (id -> value), float16 entity_embeddings/."""
    (output / "entities").mkdir(parents=True)
    rows = [{**row, "page_id": 100 + row["entity_id"], "link_count": 0} for row in entities]
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.ENTITIES), output / "entities" / "part-0.parquet")
    (output / "mentions").mkdir()
    pq.write_table(pa.Table.from_pylist(mentions, schema=schemas.MENTIONS), output / "mentions" / "part-0.parquet")
    if vectors is not None:
        (output / "entity_embeddings").mkdir()
        table = [{**row, "embedding": [vectors[row["entity_id"]]] * 2, "mention_count": row["entity_id"]}
                 for row in entities if row["entity_id"] in vectors]
        pq.write_table(pa.Table.from_pylist(table, schema=schemas.entity_embeddings(2, pa.float16())),
                       output / "entity_embeddings" / "part-0.parquet")


def test_the_refresh_decision_writes_the_id_map_and_counts_the_unchanged_entities(tmp_path: Path):
    old, new = tmp_path / "old", tmp_path / "new"
    write_run(old, OLD_ENTITIES, OLD_MENTIONS, {1: 0.1, 2: 2.0, 3: 3.0, 5: 5.0})
    write_run(new, NEW_ENTITIES, NEW_MENTIONS)

    def build(pipeline: beam.Pipeline) -> None:
        _ = pipeline | DecideRefresh(str(old), str(new), str(tmp_path / "scratch"), str(new / "entity_id_map"))

    # Oslo and Paris: their samples unchanged (their windows are all in the old run's store)
    assert run_counting(build) == {"entities_reused": 2, "entities_recomputed": 5}
    assert sorted(artifact_rows(new, "entity_id_map"), key=lambda row: row["old_entity_id"]) == ID_MAP
