"""Redirect chains, cycles and link resolution: pure steps and the Beam joins."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.conftest import DIRECT
from transforms.link_resolution import ResolveLinks, apply_resolution, resolve_target
from transforms.redirects import ResolveRedirects, jump


def test_jump_moves_every_source_one_hop():
    assert sorted(jump("B", {"sources": ["A", "X"], "next": ["C"]})) == [("A", "C"), ("X", "C")]
    assert list(jump("C", {"sources": ["B"], "next": []})) == [("B", "C")]


def test_resolve_target_prefers_the_article_then_the_redirect():
    article = {"refs": [(1, 0)], "articles": [None], "redirects": [{"target": "Z", "target_exists": True}]}
    assert list(resolve_target("A", article)) == [(1, (0, "A"))]
    redirect = {"refs": [(1, 0), (2, 3)], "articles": [], "redirects": [{"target": "Z", "target_exists": True}]}
    assert list(resolve_target("A", redirect)) == [(1, (0, "Z")), (2, (3, "Z"))]
    red = {"refs": [(5, 1)], "articles": [], "redirects": []}
    assert list(resolve_target("Nowhere", red)) == [(5, (1, "Nowhere"))]


def test_apply_resolution_keeps_offsets_and_order():
    article = {"page_id": 1, "title": "T", "text": "ab cd",
               "links": [{"start": 0, "end": 2, "target": "Ab"}, {"start": 3, "end": 5, "target": "Cd"}]}
    resolved = apply_resolution(article, [(1, "Cd (letters)")])
    assert resolved["links"] == [{"start": 0, "end": 2, "target": "Ab"},
                                 {"start": 3, "end": 5, "target": "Cd (letters)"}]


def test_chains_are_followed_and_cycles_dropped():
    pairs = [("A", "B"), ("B", "C"), ("C", "D"), ("D", "Article"), ("Loop1", "Loop2"), ("Loop2", "Loop1"),
             ("Self", "Self"), ("IntoLoop", "Loop1"), ("Red", "Missing"), ("Dup", "Article"), ("Dup", "Zeta")]
    expected = [
        {"title": "A", "target": "Article", "target_exists": True},
        {"title": "B", "target": "Article", "target_exists": True},
        {"title": "C", "target": "Article", "target_exists": True},
        {"title": "D", "target": "Article", "target_exists": True},
        {"title": "Red", "target": "Missing", "target_exists": False},
        {"title": "Dup", "target": "Article", "target_exists": True},
    ]
    with TestPipeline(argv=DIRECT) as pipeline:
        result = {"pairs": pipeline | "Pairs" >> beam.Create(pairs),
                  "article_titles": pipeline | "Titles" >> beam.Create(["Article", "Zeta"])} | ResolveRedirects()
        assert_that(result["redirects"], equal_to(expected), label="Resolved")
        cycles = result["dead_letters"] | beam.Map(lambda record: (record["kind"], record["title"]))
        assert_that(cycles, equal_to([("redirect_cycles", title) for title in ("Loop1", "Loop2", "Self", "IntoLoop")]),
                    label="Cycles")


def test_a_chain_longer_than_the_jump_rounds_is_dropped():
    chain = [(f"R{i}", f"R{i + 1}") for i in range(10)] + [("R10", "End")]
    with TestPipeline(argv=DIRECT) as pipeline:
        result = {"pairs": pipeline | "Pairs" >> beam.Create(chain),
                  "article_titles": pipeline | "Titles" >> beam.Create(["End"])} | ResolveRedirects(rounds=2)
        # 2 rounds follow 4 hops: R7..R10 reach End, R0..R6 are still on a redirect and counted as loops.
        assert_that(result["redirects"] | beam.Map(lambda row: row["title"]),
                    equal_to(["R7", "R8", "R9", "R10"]), label="Resolved")
        assert_that(result["dead_letters"] | beam.Map(lambda row: row["title"]),
                    equal_to([f"R{i}" for i in range(7)]), label="TooLong")


def test_resolve_links_through_redirects():
    articles = [
        {"page_id": 1, "title": "Article", "text": "x", "links": [{"start": 0, "end": 1, "target": "A"},
                                                                {"start": 0, "end": 1, "target": "Article"},
                                                                {"start": 0, "end": 1, "target": "Nope"}]},
    ]
    redirects = [{"title": "A", "target": "Article", "target_exists": True}]
    with TestPipeline(argv=DIRECT) as pipeline:
        resolved = {"articles": pipeline | "Articles" >> beam.Create(articles),
                    "redirects": pipeline | "Redirects" >> beam.Create(redirects)} | ResolveLinks()
        assert_that(resolved, equal_to([(1, (0, "Article")), (1, (1, "Article")), (1, (2, "Nope"))]))
