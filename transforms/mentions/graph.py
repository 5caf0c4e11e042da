"""mentions: for every entity, a deterministic bottom-k sample of the links to it, as refs into articles/.

Two passes over ``articles/`` instead of a join of sampled refs with whole articles (the way wikipedia2vec builds
its mention database): pass 1 reads only the links and orders each link to an entity by its ``Order``; each
worker keeps per entity the k smallest orders it saw and spills them to part files by bucket of entity ids
(``transforms/common/spill.py``); then each bucket is reduced on its own from its parts to every entity's k smallest,
from which its threshold is written (the order of its k-th link; none when it has fewer than k links). Only
descriptors of part files are grouped, so no process holds more than one bucket's orders (~100M sampled links of
English Wikipedia would be 2.7 GB packed). Pass 2 reads the articles where they lie and writes the ref of every
link whose order is within its entity's threshold: exactly the bottom-k sample, cut from the text at hand. No
article text goes through a shuffle.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from artifacts import fs, layout, tables
from artifacts.arrays import group_starts
from artifacts.counters import declare, dropped, processed
from artifacts.trie_map import TrieMap, load_trie_map
from encoders.mask_inputs import check_max_seq_length
from transforms.common.dead_letters import count_some
from transforms.common.entity_maps import build_title_ids
from transforms.common.mention_sampling import CHARS_PER_TOKEN, link_ordinals, mention_ref, sample_key
from transforms.common.packed import rank_in_group, split_by_bucket
from transforms.common.parquet_rows import ReadParquetRowGroups, ReadParquetRows
from transforms.common.per_worker import PerProcess
from transforms.common.spill import GatheringDoFn, Part, SpillAndGroup, reduce_parts
from transforms.common.worker_files import load_array, save_array

COUNTERS = declare(
    processed("entities_with_mentions", "entities with sampled mentions"),
    processed("mentions_sampled", "mentions sampled"),
    dropped("links_to_non_entities", "links whose target is not an entity"),
    dropped("entities_without_links", "entities no article links to (no mention to sample)"),
)

# A link's place in its entity's sampling order, packed: 24 bytes a link.
ORDER = np.dtype([("entity_id", "<i4"), ("sample_key", "<u8"), ("page_id", "<i8"), ("link_index", "<i4")])
# An entity's threshold: the order (without the entity) of its k-th sampled link.
THRESHOLD = np.dtype([("sample_key", "<u8"), ("page_id", "<i8"), ("link_index", "<i4")])
# The threshold of an entity with fewer than k links (all of them sampled): above every order.
NO_THRESHOLD = (np.iinfo(np.uint64).max, np.iinfo(np.int64).max, np.iinfo(np.int32).max)
# Link orders a worker gathers before it splits them by bucket.
ORDER_BATCH = 1 << 16
# Links to entities per bucket of the bottom-k reduce: a bucket's sample is at most this many orders (24 bytes
# each, ~6 MB) and its reduce holds a few times that; English Wikipedia's ~150M links make ~570 buckets.
LINKS_PER_BUCKET = 1 << 18
# A link's sampling order: (sample_key, page_id, link_index), the seeded hash (``sample_key``, of the entity's title,
# the page and the link's ordinal among the page's links to it: it survives dump refreshes) first; page and link
# break (astronomically rare) ties.
Order = tuple[int, int, int]


@dataclass(frozen=True)
class MentionsConfig:
    """What the mentions stage samples: up to ``max_mentions`` links per entity, ordered by a hash seeded with
    ``seed``, each with enough context for ``max_seq_length`` model tokens on either side."""

    max_mentions: int = 128
    seed: int = 0
    max_seq_length: int = 512

    def __post_init__(self) -> None:
        if self.max_mentions < 1:
            raise ValueError(f"max_mentions must be at least 1, got {self.max_mentions}")
        check_max_seq_length(self.max_seq_length)

    @property
    def context_chars(self) -> int:
        """Characters of article text kept on each side of a mention."""
        return self.max_seq_length * CHARS_PER_TOKEN


@dataclass(frozen=True)
class MentionsInputs:
    """Where SampleMentions reads (``output``: the OUT holding ``articles/`` and ``entities/``), how many buckets
    of entity ids its combine uses, and ``scratch``: a directory of its own for the files its workers share."""

    output: str
    buckets: int
    scratch: str


def sample_buckets(links: int) -> int:
    """Buckets of entity ids for the bottom-k reduce of ``links`` links: about ``LINKS_PER_BUCKET`` in each."""
    return max(1, math.ceil(links / LINKS_PER_BUCKET))


# --- elements ---------------------------------------------------------------------------------------------------


def entity_link_orders(page_id: int, targets: Iterable[str], entity_of: Callable[[str], int | None],
                       seed: int) -> Iterator[tuple[int, Order] | None]:
    """For each link of a page (link targets in order): (entity id, its ``Order``), or None for a link to no entity
    (not hashed)."""
    for index, target, ordinal in link_ordinals(targets):
        entity_id = entity_of(target)
        yield None if entity_id is None else (entity_id, (sample_key(seed, target, page_id, ordinal), page_id, index))


def bottom_k(orders: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` smallest orders of each entity of ``orders`` (``ORDER`` rows), sorted by entity and order."""
    order = np.lexsort((orders["link_index"], orders["page_id"], orders["sample_key"], orders["entity_id"]))
    return orders[order[rank_in_group(orders["entity_id"][order]) < k]]


def bucket_thresholds(sample: np.ndarray, buckets: int, slots: int, k: int) -> np.ndarray:
    """``THRESHOLD`` rows by slot (``entity_id // buckets``) of one bucket's entities from their ``bottom_k``
    sample: the order of an entity's k-th link, or ``NO_THRESHOLD`` (fewer than k links, or none)."""
    thresholds = np.empty(slots, dtype=THRESHOLD)
    for field, value in zip(THRESHOLD.names, NO_THRESHOLD, strict=True):
        thresholds[field] = value
    starts = group_starts(sample["entity_id"])
    counts = np.diff(np.r_[starts, len(sample)])
    last = (starts + counts - 1)[counts >= k]
    for field in THRESHOLD.names:
        thresholds[field][sample["entity_id"][last] // buckets] = sample[field][last]
    return thresholds


def order_table(orders: np.ndarray) -> pa.Table:
    """``ORDER`` rows as an Arrow table (what is spilled)."""
    return pa.table({name: orders[name] for name in ORDER.names})


def table_orders(table: pa.Table) -> np.ndarray:
    """An ``order_table`` back as ``ORDER`` rows."""
    orders = np.empty(table.num_rows, dtype=ORDER)
    for name in ORDER.names:
        orders[name] = table.column(name).to_numpy()
    return orders


def bottom_k_table(table: pa.Table, k: int) -> pa.Table:
    """``bottom_k`` of an ``order_table``."""
    return order_table(bottom_k(table_orders(table), k))


def sampled_mentions(article: dict[str, Any], entity_of: Callable[[str], int | None],
                     threshold_of: Callable[[int], Order], seed: int, chars: int) -> Iterator[dict[str, Any]]:
    """The ``mentions/`` rows of an article's links that are in their entity's sample (order within threshold)."""
    targets = (link["target"] for link in article["links"])
    for item in entity_link_orders(article["page_id"], targets, entity_of, seed):
        if item is not None and item[1] <= threshold_of(item[0]):
            yield mention_ref(item[0], article, item[1][2], chars)


def page_targets(table: pa.Table) -> Iterator[tuple[int, list[str]]]:
    """(page_id, its link targets in order) of each article of a table with ``page_id`` and ``links``."""
    links = table.column("links").combine_chunks()
    targets = pc.list_flatten(links).field("target").to_pylist()
    offsets = links.offsets.to_numpy()
    for row, page_id in enumerate(table.column("page_id").to_pylist()):
        yield page_id, targets[offsets[row]:offsets[row + 1]]


@dataclass(frozen=True)
class Thresholds:
    """Every entity's threshold: bucket ``entity_id % buckets``, slot ``entity_id // buckets``."""

    tables: list[np.ndarray]

    def of(self, entity_id: int) -> Order:
        return self.tables[entity_id % len(self.tables)][entity_id // len(self.tables)].item()


def build_entity_title_ids(output: str, directory: str) -> str:
    """Build the title map of ``output``'s entities/ under ``directory`` (in the one worker that runs this)."""
    return build_title_ids(tables.parquet_files(output, layout.ENTITIES), directory)


def threshold_path(directory: str, bucket: int) -> str:
    return fs.join(directory, f"thresholds-{bucket:05d}.npy")


def load_thresholds(directory: str) -> Thresholds:
    """The thresholds written under ``directory``, one file per bucket, memory-mapped."""
    return Thresholds([load_array(path) for path in fs.list_files(directory, "thresholds-*.npy")])


# --- DoFns ------------------------------------------------------------------------------------------------------


class LinkOrdersByBucket(GatheringDoFn):
    """Tables of articles' ``page_id, links`` -> (bucket, ``order_table`` of their links to entities), gathered
    until ``batch_orders`` before they are split by bucket; links to no entity are counted."""

    def __init__(self, title_ids: str, seed: int, buckets: int, batch_orders: int = ORDER_BATCH) -> None:
        self._title_ids, self._seed, self._buckets, self._batch_orders = title_ids, seed, buckets, batch_orders
        self._titles = PerProcess(load_trie_map)

    def setup(self) -> None:
        self._map: TrieMap = self._titles.get(self._title_ids)

    def start_bundle(self) -> None:
        self._rows: list[tuple[int, int, int, int]] = []

    def process(self, table: pa.Table, _built: str) -> Iterator[tuple[int, pa.Table]]:
        non_entity = 0
        for page_id, targets in page_targets(table):
            for item in entity_link_orders(page_id, targets, self._map.get, self._seed):
                if item is None:
                    non_entity += 1
                else:
                    self._rows.append((item[0], *item[1]))
        count_some("links_to_non_entities", non_entity)
        if len(self._rows) >= self._batch_orders:
            yield from self._flush()

    def _flush(self) -> list[tuple[int, pa.Table]]:
        rows, self._rows = self._rows, []
        return [(bucket, order_table(orders))
                for bucket, orders in split_by_bucket(np.array(rows, dtype=ORDER), "entity_id", self._buckets)]


class WriteThresholds(beam.DoFn):
    """(bucket, its parts of spilled orders) -> the path of the bucket's threshold file, from its ``bottom_k``
    sample; counts the entities of the bucket with and without links and the mentions sampled."""

    def __init__(self, title_ids: str, directory: str, buckets: int, max_mentions: int) -> None:
        self._title_ids, self._directory, self._buckets, self._k = title_ids, directory, buckets, max_mentions
        self._titles = PerProcess(load_trie_map)

    def setup(self) -> None:
        self._map: TrieMap = self._titles.get(self._title_ids)

    def process(self, element: tuple[int, list[Part]], _built: str) -> Iterator[str]:
        bucket, parts = element
        reduced = reduce_parts(parts, partial(bottom_k_table, k=self._k))
        sample = np.zeros(0, dtype=ORDER) if reduced is None else table_orders(reduced)
        with_links = len(group_starts(sample["entity_id"]))
        in_bucket = int(np.count_nonzero(self._map.values % self._buckets == bucket))
        count_some("entities_with_mentions", with_links)
        count_some("mentions_sampled", len(sample))
        count_some("entities_without_links", in_bucket - with_links)
        slots = (int(self._map.values.max()) if len(self._map) else 0) // self._buckets + 1
        yield save_array(threshold_path(self._directory, bucket),
                         bucket_thresholds(sample, self._buckets, slots, self._k))


class CutSampledMentions(beam.DoFn):
    """Article rows (``page_id, text, links``) -> the ``mentions/`` rows of their sampled links."""

    def __init__(self, title_ids: str, thresholds: str, config: MentionsConfig) -> None:
        self._title_ids, self._thresholds = title_ids, thresholds
        self._seed, self._chars = config.seed, config.context_chars
        self._titles, self._loaded = PerProcess(load_trie_map), PerProcess(load_thresholds)

    def setup(self) -> None:
        self._map: TrieMap = self._titles.get(self._title_ids)
        self._table: Thresholds = self._loaded.get(self._thresholds)

    def process(self, article: dict[str, Any], _written: list[str]) -> Iterator[dict[str, Any]]:
        yield from sampled_mentions(article, self._map.get, self._table.of, self._seed, self._chars)


# --- the stage's transform --------------------------------------------------------------------------------------


class SampleMentions(beam.PTransform):
    """``articles/`` + ``entities/`` (``MentionsInputs``) -> ``mentions/`` rows: up to ``max_mentions`` links per
    entity, the smallest by ``Order``; two passes over the articles, nothing but packed link orders shuffled.
    ``progress``: optional pass-through steps (progress logs) by pass: ``links`` (tables of articles' links,
    one per row group) and ``articles`` (article rows)."""

    def __init__(self, config: MentionsConfig, inputs: MentionsInputs,
                 progress: Mapping[str, beam.PTransform] | None = None) -> None:
        super().__init__()
        self._config, self._inputs, self._progress = config, inputs, dict(progress or {})

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        inputs, config = self._inputs, self._config
        work = fs.join(inputs.scratch, uuid.uuid4().hex[:12])  # per run: a per-process object's tag
        title_ids, thresholds = fs.join(work, "title_ids"), fs.join(work, "thresholds")
        built = (pipeline | "Entities" >> beam.Create([inputs.output])
                 | "BuildTitleIds" >> beam.Map(build_entity_title_ids, title_ids))
        written = (self._read(pipeline, "links", ["page_id", "links"], batched=True)
                   | "LinkOrders" >> beam.ParDo(LinkOrdersByBucket(title_ids, config.seed, inputs.buckets),
                                                beam.pvalue.AsSingleton(built))
                   | "SpillBottomK" >> SpillAndGroup(fs.join(work, "orders"),
                                                     partial(bottom_k_table, k=config.max_mentions), inputs.buckets)
                   | "WriteThresholds" >> beam.ParDo(
                       WriteThresholds(title_ids, thresholds, inputs.buckets, config.max_mentions),
                       beam.pvalue.AsSingleton(built)))
        return (self._read(pipeline, "articles", ["page_id", "text", "links"], batched=False)
                | "CutSampledMentions" >> beam.ParDo(CutSampledMentions(title_ids, thresholds, config),
                                                     beam.pvalue.AsList(written)))

    def _read(self, pipeline: beam.pvalue.PBegin, name: str, columns: list[str], batched: bool) -> beam.PCollection:
        """``columns`` of articles/ (tables by row group when ``batched``, else rows), spread over the workers,
        through ``name``'s progress."""
        files = tables.parquet_files(self._inputs.output, layout.ARTICLES)
        read = ReadParquetRowGroups(files, columns) if batched else ReadParquetRows(files, columns)
        label = f"Read{name.capitalize()}"
        articles = pipeline | label >> read
        if name not in self._progress:
            return articles
        return articles | f"{label}Progress" >> self._progress[name]
