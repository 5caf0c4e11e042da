"""Redirect resolution at corpus scale, into the title map: chains followed by pointer jumping over arrays, cycles
dropped and counted, duplicate article pages decided, QIDs attached.

Every title of the article namespace gets a key id in one trie; a redirect is an edge between key ids, and 6 rounds
of ``current = current[current]`` follow chains of up to 64 hops for all ~10M redirects of English Wikipedia at once
(numpy, in one worker). Only titles, page ids and targets are read here, never article text.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

import marisa_trie
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from artifacts.arrays import run_starts
from artifacts.counters import declare, dropped, error, processed
from artifacts.title_map import ARTICLE, RED, VIA_REDIRECT, TitleArrays
from artifacts.trie_map import iter_strings, restored_strings, trie_key_ids

# Pointer jumping doubles the followed chain length each round: 6 rounds follow chains of up to 64 hops.
JUMP_ROUNDS = 6
DUPLICATE_PAGE_IDS = "duplicate_page_ids"
DUPLICATE_TITLES = "duplicate_titles"

COUNTERS = declare(
    processed("redirects_resolved", "redirects resolved to their final target"),
    processed("redirects_to_missing_articles", "redirects kept whose target is not an article of the dump (of "
                                               "redirects resolved; a link through one is a red link)"),
    error("redirect_cycles", "redirect chains that loop or exceed 64 hops"),
    error("duplicate_redirects", "redirect pages dropped: another redirect page of the same title (the smallest "
                                 "target is kept) or an article of that title"),
    processed("sql_redirects", "redirects taken from the SQL dump"),
    dropped("sql_redirects_unknown_source", "SQL redirect rows whose source page is unknown"),
    dropped("sql_redirects_from_articles", "SQL redirect rows whose source is an article of the dump (the table is of "
                                           "another date than the dump): an article ends a redirect chain",
            dead_lettered=True),
)

_DIGIT_RUNS = re.compile("([0-9]+)")  # split with its group: the runs at the odd places


# The positions (where each was read) of the article records at the given indices of ``TitleRecords.articles``.
PositionsOf = Callable[[np.ndarray], pa.Array]


@dataclass(frozen=True)
class TitleRecords:
    """What the title map is built from, as Arrow tables: ``articles`` (title, page_id) of every converted article
    page, and ``positions_of`` their positions by index (only duplicate pages need one: they are read when asked
    for, not held); ``redirects`` (title, target) of redirect pages; ``pages`` (page_id, title) of every page that
    can name an SQL redirect's source; ``sql_redirects`` (page_id, target); ``qids`` (page_id, qid)."""

    articles: pa.Table
    positions_of: PositionsOf
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
    (title, target), the redirect cycles (title, final target), the dump's redirect pages dropped as duplicates
    (title, target, why), the rows of the SQL table dropped because an article has their title (title, target) and
    the counts of the build."""

    trie: marisa_trie.Trie
    arrays: TitleArrays
    dropped: pa.Table
    redirects: pa.Table
    cycles: list[tuple[str, str]]
    duplicate_redirects: list[tuple[str, str, str]]
    sql_redirects_from_articles: list[tuple[str, str]]
    counts: RedirectCounts


def in_repeated_runs(sorted_values: np.ndarray) -> np.ndarray:
    """Whether each value of a sorted numpy array has an equal neighbour (its run holds more than one)."""
    starts = run_starts(sorted_values)
    run = np.cumsum(starts) - 1
    return np.bincount(run)[run] > 1 if len(run) else np.zeros(0, dtype=bool)


def smallest_by_keys(rows: np.ndarray, groups: np.ndarray, *keys: list) -> np.ndarray:
    """For each group (``groups[i]`` of ``rows[i]``, sorted), its row whose ``keys`` (compared in order) are
    smallest: Python comparisons, for the few rows that share a page id or a title."""
    best: dict[int, tuple] = {}
    for row, group, *values in zip(rows.tolist(), groups.tolist(), *keys, strict=True):
        if group not in best or tuple(values) < best[group][1:]:
            best[group] = (row, *values)
    return np.array(sorted(found[0] for found in best.values()), dtype=np.int64)


def dump_order(position: str) -> tuple:
    """A page's position (``file#n``, ``file@offset#n``) as a key that sorts in dump order: its runs of digits
    compared as numbers (``#9`` before ``#10``, ``articles2.xml`` before ``articles10.xml``), so that a whole-file
    read and a multistream read of one dump agree on which of two copies comes first."""
    parts = _DIGIT_RUNS.split(position)
    return tuple(int(part) if index % 2 else part for index, part in enumerate(parts))


def kept_article_rows(records: TitleRecords, title_keys: np.ndarray) -> tuple[np.ndarray, pa.Table]:
    """(whether each article record is kept, dropped positions with their counter): of pages sharing a page id the
    smallest title is kept (ties: the first in the dump, ``dump_order``), then of pages sharing a title the smallest
    page id. Numbers only (page ids, the titles' trie key ids): strings and positions are read for duplicates alone."""
    articles, kept = records.articles, np.ones(records.articles.num_rows, dtype=bool)
    page_ids = articles.column("page_id").to_numpy()
    by_id = np.argsort(page_ids, kind="stable")
    shared = by_id[in_repeated_runs(page_ids[by_id])]
    if len(shared):
        kept[shared] = False
        titles = articles.column("title").take(pa.array(shared))
        dump_orders = [dump_order(position) for position in records.positions_of(shared).to_pylist()]
        kept[smallest_by_keys(shared, page_ids[shared], titles.to_pylist(), dump_orders)] = True
    duplicate_ids = np.setdiff1d(shared, np.flatnonzero(kept))
    remaining = np.flatnonzero(kept)
    by_title = remaining[np.lexsort((page_ids[remaining], title_keys[remaining]))]
    duplicate_titles = by_title[~run_starts(title_keys[by_title])]
    kept[duplicate_titles] = False
    dropped = pa.table({
        "position": pa.chunked_array([records.positions_of(duplicate_ids), records.positions_of(duplicate_titles)],
                                     pa.string()),
        "kind": pa.array([DUPLICATE_PAGE_IDS] * len(duplicate_ids) + [DUPLICATE_TITLES] * len(duplicate_titles),
                         pa.string())})
    return kept, dropped


def smallest_by_page_id(table: pa.Table, column: str, page_ids: pa.ChunkedArray) -> pa.ChunkedArray:
    """For each of ``page_ids`` the smallest ``column`` value of ``table``'s rows of that page id, null where it
    has none. The rows are sorted by (page id, value) and the first of each page id taken, in numpy: Arrow's hash
    aggregation and join held ~360 bytes a page record over the table, this ~10 (``bench/title_map.py``)."""
    if not table.num_rows:
        return pa.chunked_array([pa.nulls(len(page_ids), table.schema.field(column).type)])
    order = pc.sort_indices(table, sort_keys=[("page_id", "ascending"), (column, "ascending")]).to_numpy()
    sorted_ids = table.column("page_id").to_numpy()[order]
    firsts = run_starts(sorted_ids)
    rows, ids = order[firsts], sorted_ids[firsts]
    wanted = page_ids.to_numpy()
    at = np.minimum(np.searchsorted(ids, wanted), len(ids) - 1)
    return table.column(column).take(pa.array(rows[at], mask=ids[at] != wanted))


def sql_redirect_pairs(records: TitleRecords) -> pa.Table:
    """(title, target) of the SQL redirect rows, each named by the smallest title its source page has; rows whose
    source page is unknown have a null title."""
    sources = records.sql_redirects.column("page_id")
    return pa.table({"title": smallest_by_page_id(records.pages, "title", sources),
                     "target": records.sql_redirects.column("target")},
                    schema=pa.schema([("title", pa.string()), ("target", pa.string())]))


def redirect_pairs(dump_pairs: pa.Table, sql_pairs: pa.Table) -> pa.Table:
    """Every (title, target) redirect pair, the dump's and the SQL table's (not copied)."""
    return pa.concat_tables([dump_pairs.select(["title", "target"]), sql_pairs])


def one_target_each(pairs: pa.Table, sources: np.ndarray) -> np.ndarray:
    """Whether each pair is kept: one per redirect (``sources``: its title's key id); where several give a
    redirect a target (the dump and the SQL table disagree, or a duplicate page), the smallest target."""
    kept = np.ones(len(sources), dtype=bool)
    by_source = np.argsort(sources, kind="stable")
    shared = by_source[in_repeated_runs(sources[by_source])]
    if len(shared):
        kept[shared] = False
        targets = pairs.column("target").take(pa.array(shared)).to_pylist()
        kept[smallest_by_keys(shared, sources[shared], targets)] = True
    return kept


def duplicate_redirect_pages(pairs: pa.Table, sources: np.ndarray, is_article: np.ndarray
                             ) -> tuple[np.ndarray, list[tuple[str, str, str]]]:
    """(whether each of the dump's redirect pages is kept, the dropped ones as (title, target, why)): a redirect
    page whose title an article has, and all but one of the redirect pages sharing a title (``one_target_each``)."""
    shadowed = is_article[sources]
    kept = one_target_each(pairs, sources) & ~shadowed
    dropped = np.flatnonzero(~kept)
    titles, targets = pairs.column("title").take(pa.array(dropped)), pairs.column("target").take(pa.array(dropped))
    return kept, [(title, target, "an article has this title" if shadowed[row] else "another redirect page has this "
                   "title") for row, title, target in zip(dropped.tolist(), titles.to_pylist(), targets.to_pylist(),
                                                          strict=True)]


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
    row_of_key = np.full(len(trie), -1, dtype=np.int64)
    row_of_key[trie_key_ids(trie, kept.column("title"))] = np.arange(kept.num_rows)
    qid_of_row = smallest_by_page_id(qids, "qid", kept.column("page_id")).combine_chunks()
    return qid_of_row.take(pa.array(row_of_key, mask=row_of_key < 0))


def build_title_map(records: TitleRecords, rounds: int = JUMP_ROUNDS) -> TitleMapBuild:
    """The title map of a dump from its title records (see ``TitleRecords``). Titles stay in Arrow arrays (the
    trie is built from slices of them) and duplicates are found on key ids: no title is copied."""
    sql_pairs = sql_redirect_pairs(records)
    named = pc.is_valid(sql_pairs.column("title"))
    all_pairs = redirect_pairs(records.redirects, sql_pairs.filter(named))
    articles = records.articles
    trie = marisa_trie.Trie(itertools.chain(*(iter_strings(titles) for titles in (
        articles.column("title"), all_pairs.column("title"), all_pairs.column("target")))))  # each title once
    title_keys = trie_key_ids(trie, articles.column("title")).astype(np.int32)
    kept_rows, dropped_positions = kept_article_rows(records, title_keys)
    is_article = np.zeros(len(trie), dtype=bool)
    is_article[title_keys[kept_rows]] = True
    all_sources = trie_key_ids(trie, all_pairs.column("title")).astype(np.int32)
    dump_rows = records.redirects.num_rows  # the first pairs: the dump's redirect pages
    dump_kept, duplicates = duplicate_redirect_pages(all_pairs.slice(0, dump_rows), all_sources[:dump_rows],
                                                     is_article)
    # a row of the SQL table whose source the dump holds as an article (a table of another date): an article has
    # no successor, or a link through a redirect to it would go on past it; the others one_target_each decides
    sql_shadowed = is_article[all_sources[dump_rows:]]
    from_articles = all_pairs.slice(dump_rows).filter(pa.array(sql_shadowed))
    keep = np.r_[dump_kept, ~sql_shadowed]
    if not keep.all():
        all_pairs, all_sources = all_pairs.filter(pa.array(keep)), all_sources[keep]
    one_each = one_target_each(all_pairs, all_sources)
    pairs = all_pairs.filter(pa.array(one_each)) if not one_each.all() else all_pairs
    sources = all_sources[one_each]
    targets = trie_key_ids(trie, pairs.column("target")).astype(np.int32)
    is_redirect = np.zeros(len(trie), dtype=bool)
    is_redirect[sources] = True
    successor = np.arange(len(trie), dtype=np.int32)
    successor[sources] = targets
    final = jump(successor, rounds)
    in_cycle = is_redirect & is_redirect[final] & ~is_article[final]
    resolved, flags = link_resolution(is_article, is_redirect, final, in_cycle)
    resolved_pairs = ~in_cycle[sources]
    resolved_sources = sources[resolved_pairs]
    sql_named = int(pc.sum(named).as_py() or 0)
    counts = RedirectCounts(len(resolved_sources), int((~is_article[final[resolved_sources]]).sum()),
                            sql_named - from_articles.num_rows, sql_pairs.num_rows - sql_named)
    redirects = pa.table({"title": pairs.column("title").filter(pa.array(resolved_pairs)),
                          "target": restored_strings(trie, final[resolved_sources])},
                         schema=pa.schema([("title", pa.string()), ("target", pa.string())]))
    cycles = [(trie.restore_key(int(key)), trie.restore_key(int(final[key]))) for key in sources[~resolved_pairs]]
    kept = articles if kept_rows.all() else articles.filter(pa.array(kept_rows))
    arrays = TitleArrays(resolved, flags, article_qids(kept, records.qids, trie))
    stale = list(zip(*(from_articles.column(name).to_pylist() for name in ("title", "target")), strict=True))
    return TitleMapBuild(trie, arrays, dropped_positions, redirects, sorted(cycles), duplicates, stale, counts)
