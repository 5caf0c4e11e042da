"""embed-entities: the context windows of the sampled mentions, cut from ``articles/`` at embed time.

``mentions/`` holds references into the articles. They are joined with the article text by article shard (a row
group of an articles/ file, found with the page map): refs are spilled to part files by bucket of shards where they
are read (``transforms/common/spill.py``), and each bucket's reduce reads its refs and, shard by shard, that one row
group's ``page_id, text`` and cuts its windows. No article text goes through a shuffle, and no process holds the
refs of more than one bucket (~80-112M refs for English Wikipedia).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa

from artifacts import fs, layout, tables
from artifacts.arrays import split_by
from artifacts.counters import declare, dropped
from transforms.common.article_shards import PageMap, load_page_map, page_map, read_row_group, save_page_map
from transforms.common.dead_letters import DEAD_LETTER_TAG, dead_letter
from transforms.common.mention_sampling import mention_window
from transforms.common.per_worker import PerProcess
from transforms.common.spill import Part, SpillAndGroup, reduce_parts

COUNTERS = declare(
    dropped("mention_pages_missing", "mentions whose page is not in articles/", dead_lettered=True),
)

# A mentions/ ref, packed (24 bytes).
REF = np.dtype([("entity_id", "<i4"), ("page_id", "<i8"), ("link_index", "<i4"), ("start", "<i4"), ("end", "<i4")])
REF_COLUMNS = list(REF.names)
# Article shards (row groups of ~2 MB: some 300 articles, ~4,000 sampled mentions) per bucket of the join, at most:
# English Wikipedia's ~22,000 shards make ~350 buckets of ~250,000 refs; fewer shards are cut into at least
# MIN_BUCKETS buckets. The windows are cut and their inputs built bucket by bucket: a bucket is a unit of work, dealt
# to the workers in turn, and the stage's inputs end with the slowest worker's last one; with 16 buckets at 40,000
# articles (8 seconds of work each on one core) one of 2 workers ran ~3 s alone at the end.
SHARDS_PER_BUCKET, MIN_BUCKETS = 64, 64


def shards_per_bucket(shards: int) -> int:
    """Shards in a bucket of the join when articles/ has ``shards`` row groups."""
    return max(1, min(SHARDS_PER_BUCKET, shards // MIN_BUCKETS))


def ref_array(table: pa.Table) -> np.ndarray:
    """The ``REF`` rows of a table of ``mentions/`` rows."""
    refs = np.empty(table.num_rows, dtype=REF)
    for name in REF.names:
        refs[name] = table.column(name).to_numpy()
    return refs


def ref_table(refs: np.ndarray) -> pa.Table:
    """``REF`` rows as an Arrow table (what is spilled)."""
    return pa.table({name: refs[name] for name in REF.names})


def same_rows(table: pa.Table) -> pa.Table:
    """A spill's compaction that keeps every row."""
    return table


def shard_windows(refs: np.ndarray, texts: dict[int, str], chars: int) -> Iterator[dict[str, Any]]:
    """The mention rows (entity_id, page_id, link_index, text, start, end) of a shard's refs, in (page, link,
    entity) order; ``texts``: the shard's article text by page."""
    refs = refs[np.lexsort((refs["entity_id"], refs["link_index"], refs["page_id"]))]
    for entity_id, page_id, link_index, start, end in refs.tolist():
        row = mention_window({"entity_id": entity_id, "page_id": page_id, "start": start, "end": end},
                             texts[page_id], chars)
        yield {**row, "link_index": link_index}


def missing_page(ref: tuple) -> beam.pvalue.TaggedOutput:
    entity_id, page_id, link_index = ref[:3]
    return dead_letter("mention_pages_missing", "the page of a sampled mention is not in articles/",
                       entity_id=entity_id, page_id=page_id, link_index=link_index)


def build_article_page_map(output: str, directory: str) -> str:
    """Write the page map of ``output``'s articles/ under ``directory`` (in the one worker that runs this)."""
    return save_page_map(page_map(tables.parquet_files(output, layout.ARTICLES)), directory)


class RefsByBucket(beam.DoFn):
    """Packed refs -> (bucket of their shards, their ``ref_table``); refs of pages not in articles/ dead-lettered."""

    def __init__(self, pages: str) -> None:
        self._pages, self._loader = pages, PerProcess(load_page_map)

    def setup(self) -> None:
        self._map: PageMap = self._loader.get(self._pages)
        self._per_bucket = shards_per_bucket(int(self._map.shards.max()) + 1 if len(self._map.shards) else 0)

    def process(self, refs: np.ndarray, _built: str) -> Iterator[Any]:
        shards = self._map.shards_of(refs["page_id"])
        for ref in refs[shards < 0].tolist():
            yield missing_page(ref)
        found = shards >= 0
        for bucket, rows in split_by(refs[found], shards[found] // self._per_bucket):
            yield bucket, ref_table(rows)


class CutBucketWindows(beam.DoFn):
    """(bucket of shards, parts of its refs) -> the mention rows of those refs, shard by shard, their windows cut
    from each shard's article text."""

    def __init__(self, pages: str, chars: int) -> None:
        self._pages, self._chars, self._loader = pages, chars, PerProcess(load_page_map)

    def setup(self) -> None:
        self._map: PageMap = self._loader.get(self._pages)

    def process(self, element: tuple[int, list[Part]], _built: str) -> Iterator[dict[str, Any]]:
        _, parts = element
        table = reduce_parts(parts, same_rows)
        if table is None:
            return
        refs = ref_array(table)
        for shard, shard_refs in split_by(refs, self._map.shards_of(refs["page_id"])):
            yield from self._cut(shard, shard_refs)

    def _cut(self, shard: int, refs: np.ndarray) -> Iterator[dict[str, Any]]:
        path, row_group = self._map.location(shard)
        articles = read_row_group(path, row_group, ["page_id", "text"])
        wanted = set(refs["page_id"].tolist())
        texts = {page_id: text for page_id, text in zip(articles.column("page_id").to_pylist(),
                                                         articles.column("text").to_pylist(), strict=True)
                 if page_id in wanted}
        yield from shard_windows(refs, texts, self._chars)


class CutMentionWindows(beam.PTransform):
    """Packed refs (``REF`` arrays of ``mentions/`` rows) -> mention rows with their context windows of about
    ``chars`` characters per side cut from ``output``'s articles/ (main output ``mentions``; ``dead_letter``:
    refs of missing pages). ``scratch``: a directory for the page map the workers share."""

    def __init__(self, output: str, scratch: str, chars: int) -> None:
        super().__init__()
        self._output, self._scratch, self._chars = output, scratch, chars

    def expand(self, refs: beam.PCollection) -> dict[str, beam.PCollection]:
        pages = fs.join(self._scratch, f"page_map-{uuid.uuid4().hex[:12]}")  # per run: a per-process object's tag
        built = (refs.pipeline | "Articles" >> beam.Create([self._output])
                 | "BuildPageMap" >> beam.Map(build_article_page_map, pages))
        keyed = refs | "RefsByBucket" >> beam.ParDo(RefsByBucket(pages), beam.pvalue.AsSingleton(built)).with_outputs(
            DEAD_LETTER_TAG, main="refs")
        mentions = (keyed.refs | "SpillRefs" >> SpillAndGroup(fs.join(self._scratch, f"refs-{uuid.uuid4().hex[:12]}"),
                                                              same_rows)
                    | "CutWindows" >> beam.ParDo(CutBucketWindows(pages, self._chars), beam.pvalue.AsSingleton(built)))
        return {"mentions": mentions, DEAD_LETTER_TAG: keyed[DEAD_LETTER_TAG]}
