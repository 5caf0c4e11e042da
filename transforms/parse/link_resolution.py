"""Link targets resolved through redirects, article by article, against the title map loaded once per worker
process: the article text stays in the worker that converted it (read back from the staged rows where they lie)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam

from artifacts.counters import declare, dropped, processed
from artifacts.title_map import TitleMap
from transforms.common.dead_letters import count, dead_letter
from transforms.common.per_worker import PerProcess
from transforms.parse.redirects import DUPLICATE_PAGE_IDS, DUPLICATE_TITLES

COUNTERS = declare(
    processed("articles", "articles written"),
    processed("links", "entity links in the articles"),
    processed("links_via_redirect", "links resolved through a redirect"),
    processed("red_links", "links to titles that are not articles of the dump"),
    processed("articles_with_qid", "articles with a Wikidata QID"),
    dropped("duplicate_page_ids", "article pages whose id another page has (of one id the smallest title is kept)",
            dead_lettered=True),
    dropped("duplicate_titles", "article pages whose title another page has (of one title the smallest id is kept)",
            dead_lettered=True),
)


def resolve_links(links: list[dict[str, Any]], titles: TitleMap) -> tuple[list[dict[str, Any]], int, int]:
    """(the links with their resolved targets, how many went through a redirect, how many are red links).

    Links whose final target is no article of the dump are kept (the dictionary stage decides; a partial dump has
    most targets elsewhere)."""
    resolved, via, red = [], 0, 0
    for link in links:
        resolution = titles.resolve(link["target"])
        via += resolution.via_redirect
        red += resolution.red
        resolved.append({**link, "target": resolution.target})
    return resolved, via, red


def final_article(raw: dict[str, Any], titles: TitleMap) -> Iterator[Any]:
    """The articles/ row of a staged article page (links resolved, QID attached); a duplicate page (see the title
    map) is dead-lettered instead."""
    duplicate = titles.dropped_as(raw["position"])
    where = {"page_id": raw["page_id"], "title": raw["title"], "source": raw["position"]}
    if duplicate == DUPLICATE_PAGE_IDS:
        yield dead_letter("duplicate_page_ids", "another page has this id (of one id, the smallest title is kept)",
                          **where)
        return
    if duplicate == DUPLICATE_TITLES:
        yield dead_letter("duplicate_titles", "another page has this title (of one title, the smallest page id is "
                          "kept)", **where)
        return
    links, via, red = resolve_links(raw["links"], titles)
    qid = titles.qid(raw["title"])
    count("articles")
    count("links", len(links))
    if via:
        count("links_via_redirect", via)
    if red:
        count("red_links", red)
    if qid is not None:
        count("articles_with_qid")
    yield {"page_id": raw["page_id"], "title": raw["title"], "text": raw["text"], "links": links, "qid": qid}


class ResolveArticles(beam.DoFn):
    """Staged article rows -> articles/ rows, against the title map whose directory is the side input."""

    def __init__(self) -> None:
        self._maps = PerProcess(TitleMap.load)

    def process(self, raw: dict[str, Any], title_map: str) -> Iterator[Any]:
        yield from final_article(raw, self._maps.get(title_map))
