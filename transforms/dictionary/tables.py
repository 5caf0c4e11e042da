"""The dictionary's element logic on Arrow tables and numpy arrays, without Beam: one bucket's link counts become
entity candidates, the candidates the entity table (ids from the kb trie), anchor pairs name candidates, and
a name bucket's candidates with their paragraph counts the scored dictionary rows.

What a filter removes is returned as counts; the Beam adapters in ``transforms.dictionary.graph`` count them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from artifacts import schemas
from artifacts.linker import build_kb_trie
from artifacts.trie_map import TrieMap, build_trie_map, iter_strings, string_array, trie_key_ids
from transforms.dictionary.arrow_combine import split_by_bucket

# Anchor pairs: anchors with text ``name`` linking to ``target`` (and article titles as links to themselves).
PAIRS = pa.schema([("name", pa.string()), ("target", pa.string()), ("count", pa.int64())])
PAIR_KEYS, PAIR_VALUES = ("name", "target"), ("count",)
# Per title: a page of the dump (page_id set, inbound 0) or links to it (page_id and qid null): summed by all
# three keys, a bucket holds each title's inbound links in one row and its pages in others.
TARGETS = pa.schema([("title", pa.string()), ("page_id", pa.int64()), ("qid", pa.string()), ("inbound", pa.int64())])
TARGET_KEYS, TARGET_VALUES = ("title", "page_id", "qid"), ("inbound",)
# Entities before their ids, and (name, entity) candidates before scoring.
CANDIDATES = pa.schema([("title", pa.string()), ("page_id", pa.int64()), ("qid", pa.string()),
                        ("link_count", pa.int64())])
# total_link_count: every anchor of the name, whatever its target (an entity or not: a red link of a full dump)
NAME_CANDIDATES = pa.schema([("name", pa.string()), ("entity_id", pa.int32()), ("link_count", pa.int64()),
                             ("total_link_count", pa.int64())])
# Paragraphs (or pages) in which a name occurs, by name id (the key id in the name trie).
DOC_COUNTS = pa.schema([("name_id", pa.int64()), ("docs", pa.int64())])
DOC_KEYS, DOC_VALUES = ("name_id",), ("docs",)


@dataclass
class LinkTally:
    """The rows a batch of articles contributes: anchor pairs, link targets and pages."""

    names: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    link_targets: list[str] = field(default_factory=list)
    page_titles: list[str] = field(default_factory=list)
    page_ids: list[int] = field(default_factory=list)
    qids: list[str | None] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.names) + len(self.link_targets) + len(self.page_titles)

    def add_pair(self, name: str, target: str) -> None:
        self.names.append(name)
        self.targets.append(target)

    def add_page(self, title: str, page_id: int, qid: str | None, link_targets: Sequence[str]) -> None:
        self.page_titles.append(title)
        self.page_ids.append(page_id)
        self.qids.append(qid)
        self.link_targets.extend(link_targets)

    def pair_table(self) -> pa.Table:
        """One row per anchor pair (count 1)."""
        ones = pa.array(np.ones(len(self.names), dtype=np.int64))
        return pa.Table.from_arrays([pa.array(self.names, pa.string()), pa.array(self.targets, pa.string()), ones],
                                    schema=PAIRS)

    def target_table(self) -> pa.Table:
        """One row per page (inbound 0) and one per link (page_id and qid null, inbound 1)."""
        links = len(self.link_targets)
        return pa.Table.from_arrays([
            pa.array(self.page_titles + self.link_targets, pa.string()),
            pa.concat_arrays([pa.array(self.page_ids, pa.int64()), pa.nulls(links, pa.int64())]),
            pa.concat_arrays([pa.array(self.qids, pa.string()), pa.nulls(links, pa.string())]),
            pa.array(np.concatenate([np.zeros(len(self.page_titles), np.int64), np.ones(links, np.int64)])),
        ], schema=TARGETS)


def run_starts(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Per row: whether it starts a run of equal values (the first row always does)."""
    if len(values) < 2:
        return np.ones(len(values), dtype=bool)
    changed = pc.not_equal(values.slice(1), values.slice(0, len(values) - 1))
    return np.concatenate([[True], changed.to_numpy(zero_copy_only=False)])


def first_per_key(table: pa.Table, key: str) -> tuple[pa.Table, int]:
    """The first row of each run of equal ``key`` values of a table sorted by ``key``; how many rows were left out."""
    kept = table.filter(pa.array(run_starts(table.column(key))))
    return kept, table.num_rows - kept.num_rows


@dataclass(frozen=True)
class RedLinks:
    """Link targets with no article in the dump that did not become entities, and the links to them."""

    targets: int = 0
    links: int = 0


def entity_candidates(targets: pa.Table, include_red_links: bool) -> tuple[pa.Table, RedLinks]:
    """The entity candidates of one title bucket (summed ``TARGETS``): every title with inbound links that is an
    article (its page with the smallest page_id), or any such title with ``include_red_links``."""
    is_link = pc.is_null(targets.column("page_id"))
    links = targets.filter(is_link).select(["title", "inbound"])
    pages = targets.filter(pc.invert(is_link)).select(["title", "page_id", "qid"])
    pages, _ = first_per_key(pages.sort_by([("title", "ascending"), ("page_id", "ascending")]), "title")
    joined = links.join(pages, "title", join_type="left outer", use_threads=False)
    red = pc.is_null(joined.column("page_id"))
    red_links = RedLinks()
    if not include_red_links:
        red_links = RedLinks(pc.sum(red.cast(pa.int64())).as_py() or 0,
                             pc.sum(joined.filter(red).column("inbound")).as_py() or 0)
        joined = joined.filter(pc.invert(red))
    candidates = joined.select(["title", "page_id", "qid", "inbound"]).rename_columns(CANDIDATES.names)
    return candidates.cast(CANDIDATES).sort_by("title"), red_links


def entity_table(candidates: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The entities (``schemas.ENTITIES``) from all candidates: one per key (two articles with one QID keep the
    smaller title), ``entity_id`` = key id in the kb trie + 1; and the candidates left out for sharing a kept key
    (their columns, the ``key`` and the ``entity_title`` kept for it)."""
    keyed = candidates.append_column("key", schemas.entity_keys(candidates.column("qid"), candidates.column("title")))
    ordered = keyed.sort_by([("key", "ascending"), ("title", "ascending")])
    starts = run_starts(ordered.column("key"))
    kept = ordered.filter(pa.array(starts))
    first_of_run = np.maximum.accumulate(np.where(starts, np.arange(len(starts)), 0))
    left_out = ordered.filter(pa.array(~starts)).append_column(
        "entity_title", ordered.column("title").take(pa.array(first_of_run[~starts])))
    keys = kept.column("key")
    entity_ids = pa.array((trie_key_ids(build_kb_trie(iter_strings(keys)), keys) + 1).astype(np.int32))
    entities = kept.drop_columns(["key"]).append_column("entity_id", entity_ids)
    return entities.select(schemas.ENTITIES.names).cast(schemas.ENTITIES), left_out


def title_entity_ids(entities: pa.Table) -> TrieMap:
    """Entity title -> entity_id, for attaching anchor pairs to entities by their target."""
    return build_trie_map(entities.column("title"), entities.column("entity_id").to_numpy())


def name_candidates(pairs: pa.Table, title_ids: TrieMap) -> tuple[pa.Table, int]:
    """``NAME_CANDIDATES`` of the summed anchor pairs (every pair of a name is in its bucket) whose target is an
    entity, with the name's links to any target; how many pairs were not."""
    entity_ids = title_ids.lookup(pairs.column("target").to_pylist())
    is_entity = entity_ids >= 0
    keep = pa.array(is_entity)
    name_codes = pairs.column("name").combine_chunks().dictionary_encode().indices.to_numpy()
    totals = np.bincount(name_codes, weights=pairs.column("count").to_numpy()).astype(np.int64)[name_codes]
    candidates = pa.Table.from_arrays(
        [pairs.column("name").filter(keep), pa.array(entity_ids[is_entity].astype(np.int32)),
         pairs.column("count").filter(keep), pa.array(totals[is_entity])], schema=NAME_CANDIDATES)
    return candidates, int(len(is_entity) - is_entity.sum())


def name_buckets(names_by_bucket: Sequence[tuple[int, pa.Array | Sequence[str]]]) -> TrieMap:
    """Candidate name -> its bucket (uint16): the trie whose key ids are the name ids of the document counts."""
    names = pa.chunked_array([string_array(names) for _, names in names_by_bucket], pa.string())
    buckets = np.concatenate([np.full(len(bucket_names), bucket, dtype=np.uint16)
                              for bucket, bucket_names in names_by_bucket]) if names_by_bucket else \
        np.zeros(0, dtype=np.uint16)
    return build_trie_map(names, buckets)


def doc_count_tables(name_ids: np.ndarray, bucket_of_id: np.ndarray) -> list[tuple[int, pa.Table]]:
    """The occurrences of names (one name id per paragraph it occurs in) counted, as ``DOC_COUNTS`` tables per name
    bucket."""
    ids, counts = np.unique(name_ids, return_counts=True)
    table = pa.Table.from_arrays([pa.array(ids.astype(np.int64)), pa.array(counts.astype(np.int64))],
                                 schema=DOC_COUNTS)
    return list(split_by_bucket(table, np.asarray(bucket_of_id[ids], dtype=np.int64)))


def docs_of(name_ids: np.ndarray, doc_counts: pa.Table | None) -> np.ndarray:
    """The document count of each name id (0 where ``doc_counts``, a summed ``DOC_COUNTS`` table, has none)."""
    result = np.zeros(len(name_ids), dtype=np.int64)
    if doc_counts is None or not doc_counts.num_rows:
        return result
    known = doc_counts.column("name_id").to_numpy()
    docs = doc_counts.column("docs").to_numpy()
    order = np.argsort(known)
    known, docs = known[order], docs[order]
    at = np.minimum(np.searchsorted(known, name_ids), len(known) - 1)
    found = known[at] == name_ids
    result[found] = docs[at[found]]
    return result


@dataclass(frozen=True)
class ScoreDrops:
    """What scoring removed: names below min_link_prob, pairs below min_commonness or min_link_count."""

    names_below_min_link_prob: int = 0
    pairs_below_min_commonness: int = 0
    pairs_below_min_link_count: int = 0


@dataclass(frozen=True)
class Thresholds:
    min_link_prob: float
    min_commonness: float
    min_link_count: int


def score_names(candidates: pa.Table, docs: np.ndarray, thresholds: Thresholds) -> tuple[pa.Table, ScoreDrops]:
    """The kept (name, entity) rows (``schemas.NAMES``) of a bucket's ``NAME_CANDIDATES`` whose names occur in
    ``docs[i]`` documents (row i): link_prob = total_link_count (the name's anchors, whatever their target) /
    max(doc_count, 1), capped at 1; commonness =
    link_count / total_link_count. Rows are sorted by (name, entity_id). A name found in no document (a title's
    name no paragraph holds, an anchor cut inside a word) is stored with doc_count 1: the KPR reference linker,
    which reads these counts from ``data.npy``, takes a doc_count of 0 as link_prob 0 and would never link it."""
    if not candidates.num_rows:
        return schemas.NAMES.empty_table(), ScoreDrops()
    order = pc.sort_indices(candidates, [("name", "ascending"), ("entity_id", "ascending")])
    candidates, docs = candidates.take(order), np.asarray(docs)[order.to_numpy()]
    names = candidates.column("name")
    starts = np.flatnonzero(run_starts(names))
    link_count = candidates.column("link_count").to_numpy()
    total = candidates.column("total_link_count").to_numpy()
    doc_count = np.maximum(docs, 1)
    link_prob = np.minimum(1.0, total / doc_count)
    name_kept = link_prob >= thresholds.min_link_prob
    commonness = link_count / total
    below_commonness = name_kept & (commonness < thresholds.min_commonness)
    below_link_count = name_kept & ~below_commonness & (link_count < thresholds.min_link_count)
    keep = name_kept & ~below_commonness & ~below_link_count
    rows = pa.Table.from_arrays([
        names.filter(pa.array(keep)), candidates.column("entity_id").filter(pa.array(keep)),
        pa.array(link_count[keep]), pa.array(total[keep]), pa.array(doc_count[keep]),
        pa.array(link_prob[keep].astype(np.float32)), pa.array(commonness[keep].astype(np.float32)),
    ], schema=schemas.NAMES)
    drops = ScoreDrops(int((~name_kept[starts]).sum()), int(below_commonness.sum()), int(below_link_count.sum()))
    return rows, drops
