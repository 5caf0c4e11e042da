"""transforms/mentions/graph.py: link orders, bottom-k, per-entity thresholds (the sample they select is exactly the
bottom-k, ties included), and SampleMentions against a plain Python bottom-k of every entity's links."""

from __future__ import annotations

from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to

from tests.builders import article, run_counting, write_entities, write_parsed
from transforms.common import packed
from transforms.common.mention_sampling import mention_ref, sample_key
from transforms.mentions.graph import (
    LINKS_PER_BUCKET,
    NO_THRESHOLD,
    ORDER,
    MentionsConfig,
    MentionsInputs,
    SampleMentions,
    bottom_k,
    bucket_thresholds,
    entity_link_orders,
    sample_buckets,
    sampled_mentions,
)


def link_refs(article: dict, seed: int) -> list[tuple[str, tuple[int, int, int]]]:
    """The definition, in plain Python: (target, sampling order) of each link of an article, the order being (the
    seeded hash of the target, the page and the link's ordinal among the page's links to it; page; link index)."""
    ordinals: dict[str, int] = {}
    refs = []
    for index, link in enumerate(article["links"]):
        ordinal = ordinals[link["target"]] = ordinals.get(link["target"], -1) + 1
        refs.append((link["target"], (sample_key(seed, link["target"], article["page_id"], ordinal),
                                      article["page_id"], index)))
    return refs


def random_orders(seed: int, entities: int = 40, links: int = 3000) -> np.ndarray:
    """ORDER rows with many ties: sample keys from a small range (pages and links break them)."""
    rng = np.random.default_rng(seed)
    rows = np.zeros(links, dtype=ORDER)
    rows["entity_id"] = rng.integers(1, entities + 1, links)
    rows["sample_key"] = rng.integers(0, 50, links)
    rows["page_id"] = rng.integers(0, 30, links)
    rows["link_index"] = np.arange(links)
    return rows


def plain_bottom_k(rows: np.ndarray, k: int) -> list[tuple]:
    """Per entity, its k rows of smallest (sample_key, page_id, link_index), in plain Python."""
    by_entity: dict[int, list[tuple]] = {}
    for row in rows.tolist():
        by_entity.setdefault(row[0], []).append(row)
    return sorted(row for sample in by_entity.values() for row in sorted(sample, key=lambda r: r[1:])[:k])


@pytest.mark.parametrize("k", [1, 5, 128])
def test_bottom_k_is_the_k_smallest_orders_of_each_entity(k):
    rows = random_orders(seed=k)
    assert sorted(bottom_k(rows, k).tolist()) == plain_bottom_k(rows, k)
    halves = np.concatenate([bottom_k(rows[:1000], k), bottom_k(rows[1000:], k)])
    assert bottom_k(halves, k).tolist() == bottom_k(rows, k).tolist()  # compacting parts first changes nothing


@pytest.mark.parametrize("buckets", [1, 3])
def test_links_within_their_entitys_threshold_are_exactly_the_bottom_k(buckets):
    k, rows = 8, random_orders(seed=buckets)
    rows = rows[rows["entity_id"] != 7]  # an entity without links
    rows = np.concatenate([rows[rows["entity_id"] != 9], rows[rows["entity_id"] == 9][:3]])  # one with < k
    thresholds = {}
    for bucket, sample in packed.split_by_bucket(bottom_k(rows, k), "entity_id", buckets):
        table = bucket_thresholds(sample, buckets, slots=40 // buckets + 1, k=k)
        thresholds.update({entity_id: table[entity_id // buckets].item() for entity_id in range(bucket, 41, buckets)})
    chosen = sorted(row for row in rows.tolist() if tuple(row[1:]) <= thresholds[row[0]])
    assert chosen == plain_bottom_k(rows, k)
    assert thresholds[9] == thresholds[7] == NO_THRESHOLD


def test_entity_link_orders_are_the_orders_of_link_refs_and_skip_non_entities():
    row = article(9, "T", "Paris and Lyon, Paris, Nowhere", [("Paris", "Paris"), ("Lyon", "Lyon"),
                                                               ("Paris", "Paris"), ("Nowhere", "Nowhere")])
    ids = {"Paris": 1, "Lyon": 2}
    orders = list(entity_link_orders(9, [link["target"] for link in row["links"]], ids.get, seed=5))
    expected = [(ids[target], order) if target in ids else None for target, order in link_refs(row, seed=5)]
    assert orders == expected and orders[3] is None


def test_sampled_mentions_are_the_links_within_threshold():
    row = article(9, "T", "Paris and Lyon, Paris", [("Paris", "Paris"), ("Lyon", "Lyon"), ("Paris", "Paris")])
    refs = dict(enumerate(order for _, order in link_refs(row, seed=0)))
    thresholds = {1: min(refs[0], refs[2]), 2: NO_THRESHOLD}
    found = list(sampled_mentions(row, {"Paris": 1, "Lyon": 2}.get, thresholds.__getitem__, seed=0, chars=10))
    first = 0 if refs[0] < refs[2] else 2  # the one Paris link within its threshold
    assert found == [mention_ref(entity_id, row, index, 10) for index, entity_id in sorted([(first, 1), (1, 2)])]


def test_sample_buckets_bound_the_links_of_a_bucket():
    assert sample_buckets(0) == 1 and sample_buckets(1000) == 1 and sample_buckets(LINKS_PER_BUCKET + 1) == 2
    assert sample_buckets(150_000_000) == 573  # English Wikipedia


# --- SampleMentions ---------------------------------------------------------------------------------------------

TITLES = [f"E{number}" for number in range(12)]


def linked_articles() -> list[dict]:
    """60 articles linking to entities E0..E9 (E10, E11: nobody links to them) and to red links."""
    rng = np.random.default_rng(3)
    pages = []
    for page_id in range(1, 61):
        targets = [f"E{number}" for number in rng.integers(0, 10, 6)] + [f"Red{page_id}"]
        text = " ".join(f"w{page_id} {target}" for target in targets)
        pages.append(article(page_id, f"P{page_id}", text, [(target, target) for target in targets]))
    return pages


def expected_mentions(pages: list[dict], k: int, seed: int, chars: int) -> list[dict]:
    """Today's definition, in plain Python: per entity the k links of smallest order (``link_refs``)."""
    ids = {title: entity_id for entity_id, title in enumerate(TITLES, start=1)}
    refs: dict[str, list] = {}
    for page in pages:
        for target, order in link_refs(page, seed):
            refs.setdefault(target, []).append(order)
    by_id = {page["page_id"]: page for page in pages}
    return [mention_ref(ids[target], by_id[page_id], link_index, chars)
            for target, found in refs.items() if target in ids
            for _, page_id, link_index in sorted(found)[:k]]


@pytest.mark.parametrize("buckets", [1, 4])
def test_sample_mentions_equals_a_plain_bottom_k(tmp_path: Path, monkeypatch, buckets):
    monkeypatch.setattr(packed, "MIN_PENDING_ROWS", 8)  # compact the accumulators often
    pages = linked_articles()
    write_parsed(tmp_path, pages)
    write_entities(tmp_path, TITLES)
    config = MentionsConfig(max_mentions=5, seed=11, max_seq_length=5)
    inputs = MentionsInputs(output=str(tmp_path), buckets=buckets, scratch=str(tmp_path / "scratch"))
    expected = expected_mentions(pages, 5, 11, config.context_chars)

    def build(pipeline: beam.Pipeline) -> None:
        assert_that(pipeline | SampleMentions(config, inputs), equal_to(expected))

    links = sum(len(page["links"]) for page in pages)
    assert run_counting(build) == {"entities_with_mentions": 10, "mentions_sampled": 50, "entities_without_links": 2,
                                   "links_to_non_entities": links - 6 * 60}
