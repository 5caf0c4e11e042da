"""Link targets resolved through redirects with keyed joins (150M links do not fit a side input)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam

from artifacts.counters import declare, processed
from transforms.dead_letters import count

COUNTERS = declare(
    processed("links_via_redirect", "links resolved through a redirect"),
    processed("red_links", "links to titles that are not articles of the dump"),
)


def explode_links(article: dict[str, Any]) -> Iterator[tuple[str, tuple[int, int]]]:
    """(target, (page_id, link index)) for every link of an article."""
    for index, link in enumerate(article["links"]):
        yield link["target"], (article["page_id"], index)


def resolve_target(target: str, joined: dict[str, list[Any]]) -> Iterator[tuple[int, tuple[int, str]]]:
    """Where links to ``target`` go: the article itself, or the final target of its redirect.

    Links whose final target is no article of the dump are red links: counted, and kept (the dictionary stage
    decides; a partial dump has most targets elsewhere).
    """
    refs = joined["refs"]
    if joined["articles"]:
        resolved, red = target, False
    elif joined["redirects"]:
        redirect = joined["redirects"][0]
        resolved, red = redirect["target"], not redirect["target_exists"]
        count("links_via_redirect", len(refs))
    else:
        resolved, red = target, True
    if red:
        count("red_links", len(refs))
    for page_id, index in refs:
        yield page_id, (index, resolved)


def apply_resolution(article: dict[str, Any], resolved: list[tuple[int, str]]) -> dict[str, Any]:
    """The article with each link's target replaced by its resolved target (links keep their order)."""
    targets = dict(resolved)
    links = [{**link, "target": targets.get(index, link["target"])} for index, link in enumerate(article["links"])]
    return {**article, "links": links}


class ResolveLinks(beam.PTransform):
    """Articles + resolved redirects -> (page_id, [(link index, resolved target)]) per page with links."""

    def expand(self, inputs: dict[str, beam.PCollection]) -> beam.PCollection:
        articles, redirects = inputs["articles"], inputs["redirects"]
        return (
            {
                "refs": articles | "ExplodeLinks" >> beam.FlatMap(explode_links),
                "articles": articles | "KeyArticleTitles" >> beam.Map(lambda article: (article["title"], None)),
                "redirects": redirects | "KeyRedirectTitles" >> beam.Map(lambda row: (row["title"], row)),
            }
            | "JoinLinkTargets" >> beam.CoGroupByKey()
            | "ResolveTargets" >> beam.FlatMapTuple(resolve_target)
        )
