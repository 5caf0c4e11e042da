"""Redirect resolution at corpus scale, into the title map: chains followed by pointer jumping over arrays, cycles
dropped and counted, duplicate article pages decided, QIDs attached.

Every title of the article namespace gets a key id in one trie; a redirect is an edge between key ids, and 6 rounds
of ``current = current[current]`` follow chains of up to 64 hops for all ~10M redirects of English Wikipedia at once
(numpy, in one worker). Only titles, page ids and targets are read here, never article text.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import marisa_trie
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from artifacts.counters import declare, dropped, error, processed
from artifacts.title_map import ARTICLE, RED, VIA_REDIRECT, TitleArrays
from artifacts.trie_map import iter_strings, restored_strings, trie_key_ids

# Pointer jumping doubles the followed chain length each round: 6 rounds follow chains of up to 64 hops.
JUMP_ROUNDS = 6
DUPLICATE_PAGE_IDS = "duplicate_page_ids"
DUPLICATE_TITLES = "duplicate_titles"

COUNTERS = declare(
    processed("redirects_resolved", "redirects resolved to their final target"),
    dropped("redirects_to_missing_articles", "redirects whose target is not an article of the dump"),
    error("redirect_cycles", "redirect chains that loop or exceed 64 hops"),
    processed("sql_redirects", "redirects taken from the SQL dump"),
    dropped("sql_redirects_unknown_source", "SQL redirect rows whose source page is unknown"),
)


@dataclass(frozen=True)
class TitleRecords:
    """What the title map is built from, as Arrow tables: ``articles`` (position, title, page_id) of every converted
    article page; ``redirects`` (title, target) of redirect pages; ``pages`` (page_id, title) of every page that can
    name an SQL redirect's source; ``sql_redirects`` (page_id, target); ``qids`` (page_id, qid)."""

    articles: pa.Table
    redirects: pa.Table
    pages: pa.Table
    sql_redirects: pa.Table
    qids: pa.Table


@dataclass(frozen=True)
class RedirectCounts:
    """What the build counted (the counters of the same names)."""

    redirects_resolved: int = 0
    redirects_to_missing_articles: int = 0
    sql_redirects: int = 0
    sql_redirects_unknown_source: int = 0


@dataclass(frozen=True)
class TitleMapBuild:
    """A built title map (trie + arrays + the positions of duplicate pages), the resolved redirects as rows
    (title, target), the redirect cycles (title, final target) and the counts of the build."""

    trie: marisa_trie.Trie
    arrays: TitleArrays
    dropped: pa.Table
    redirects: pa.Table
    cycles: list[tuple[str, str]]
    counts: RedirectCounts


def first_of_runs(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Whether each value of a sorted array starts a run of equal values."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    starts = np.ones(len(values), dtype=bool)
    if len(values) > 1:
        starts[1:] = pc.not_equal(values.slice(1), values.slice(0, len(values) - 1)).to_numpy(zero_copy_only=False)
    return starts


def kept_articles(articles: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(kept articles: title and page_id, dropped positions with their counter): of pages sharing a page id the
    smallest title is kept (ties: the first position), then of pages sharing a title the smallest page id.
    Sorted by indices: the articles (positions are most of their bytes) are never copied whole."""
    by_id = pc.sort_indices(articles, [("page_id", "ascending"), ("title", "ascending"), ("position", "ascending")])
    unique_id = first_of_runs(articles.column("page_id").take(by_id))
    distinct_ids = by_id.filter(pa.array(unique_id))
    candidates = articles.select(["title", "page_id"]).take(distinct_ids)
    by_title = pc.sort_indices(candidates, [("title", "ascending"), ("page_id", "ascending")])
    unique_title = first_of_runs(candidates.column("title").take(by_title))
    kept = candidates.take(by_title.filter(pa.array(unique_title)))
    duplicate_ids = by_id.filter(pa.array(~unique_id))
    duplicate_titles = distinct_ids.take(by_title.filter(pa.array(~unique_title)))
    positions = articles.column("position")
    dropped_positions = pa.table({
        "position": pa.chunked_array([positions.take(duplicate_ids), positions.take(duplicate_titles)],
                                     pa.string()),
        "kind": pa.array([DUPLICATE_PAGE_IDS] * len(duplicate_ids) + [DUPLICATE_TITLES] * len(duplicate_titles),
                         pa.string())})
    return kept, dropped_positions


def sql_redirect_pairs(records: TitleRecords) -> pa.Table:
    """(title, target) of the SQL redirect rows, each named by the smallest title its source page has; rows whose
    source page is unknown have a null title."""
    titles = records.pages.group_by("page_id").aggregate([("title", "min")]).rename_columns(["page_id", "title"])
    if records.sql_redirects.num_rows == 0:
        return pa.table({"title": pa.array([], pa.string()), "target": pa.array([], pa.string())})
    return records.sql_redirects.join(titles, "page_id", join_type="left outer").select(["title", "target"])


def redirect_pairs(dump_pairs: pa.Table, sql_pairs: pa.Table) -> pa.Table:
    """One target per redirect title: where the dump and the SQL table disagree, the smallest. (Sorted, not
    grouped: Arrow's hash aggregation of a string minimum holds several times the pairs.)"""
    pairs = pa.concat_tables([dump_pairs.select(["title", "target"]), sql_pairs])
    order = pc.sort_indices(pairs, [("title", "ascending"), ("target", "ascending")])
    first = first_of_runs(pairs.column("title").take(order))
    return pairs.take(order.filter(pa.array(first)))


def jump(successor: np.ndarray, rounds: int = JUMP_ROUNDS) -> np.ndarray:
    """Each key's 2**rounds-th successor (a key that is no redirect is its own successor)."""
    current = successor
    for _ in range(rounds):
        current = current[current]
    return current


def link_resolution(is_article: np.ndarray, is_redirect: np.ndarray, final: np.ndarray,
                    in_cycle: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(resolved key, flags) per key: an article is itself; a redirect out of any cycle goes to its final target
    (red when that is no article); anything else is a red link to itself."""
    via = is_redirect & ~is_article & ~in_cycle
    resolved = np.where(via, final, np.arange(len(final)))
    red = ~is_article[resolved]
    flags = (is_article * ARTICLE) | (via * VIA_REDIRECT) | (red * RED)
    return resolved.astype(np.int32), flags.astype(np.uint8)


def article_qids(kept: pa.Table, qids: pa.Table, trie: marisa_trie.Trie) -> pa.Array:
    """The QID of each key's article (the smallest where page_props gives several), null elsewhere."""
    if not qids.num_rows:
        return pa.nulls(len(trie), pa.string())
    smallest = qids.group_by("page_id").aggregate([("qid", "min")]).rename_columns(["page_id", "qid"])
    joined = kept.select(["title", "page_id"]).join(smallest, "page_id", join_type="inner")
    row_of_key = np.full(len(trie), -1, dtype=np.int64)
    row_of_key[trie_key_ids(trie, joined.column("title"))] = np.arange(joined.num_rows)
    return joined.column("qid").combine_chunks().take(pa.array(row_of_key, mask=row_of_key < 0))


def build_title_map(records: TitleRecords, rounds: int = JUMP_ROUNDS) -> TitleMapBuild:
    """The title map of a dump from its title records (see ``TitleRecords``). Titles stay in Arrow arrays: the
    trie is built from slices of them, never from a list of all of them."""
    kept, dropped_positions = kept_articles(records.articles)
    sql_pairs = sql_redirect_pairs(records)
    named = pc.is_valid(sql_pairs.column("title"))
    pairs = redirect_pairs(records.redirects, sql_pairs.filter(named))
    trie = marisa_trie.Trie(itertools.chain(*(iter_strings(titles) for titles in (
        kept.column("title"), pairs.column("title"), pairs.column("target")))))  # the trie keeps each title once
    sources, targets = trie_key_ids(trie, pairs.column("title")), trie_key_ids(trie, pairs.column("target"))
    is_article = np.zeros(len(trie), dtype=bool)
    is_article[trie_key_ids(trie, kept.column("title"))] = True
    is_redirect = np.zeros(len(trie), dtype=bool)
    is_redirect[sources] = True
    successor = np.arange(len(trie))
    successor[sources] = targets
    final = jump(successor, rounds)
    in_cycle = is_redirect & is_redirect[final] & ~is_article[final]
    resolved, flags = link_resolution(is_article, is_redirect, final, in_cycle)
    resolved_pairs = ~in_cycle[sources]
    resolved_sources = sources[resolved_pairs]
    sql_named = int(pc.sum(named).as_py() or 0)
    counts = RedirectCounts(len(resolved_sources), int((~is_article[final[resolved_sources]]).sum()), sql_named,
                            sql_pairs.num_rows - sql_named)
    redirects = pa.table({"title": pairs.column("title").filter(pa.array(resolved_pairs)),
                          "target": restored_strings(trie, final[resolved_sources])},
                         schema=pa.schema([("title", pa.string()), ("target", pa.string())]))
    cycles = [(trie.restore_key(int(key)), trie.restore_key(int(final[key]))) for key in sources[~resolved_pairs]]
    arrays = TitleArrays(resolved, flags, article_qids(kept, records.qids, trie))
    return TitleMapBuild(trie, arrays, dropped_positions, redirects, sorted(cycles), counts)
