"""dictionary: articles -> entity vocabulary, anchor dictionary (link probability, commonness) and entity linker.

Two reads of the articles, nothing of their text shuffled, every count summed per bucket where it is made and
spilled to part files, then each bucket summed on its own from its parts (``arrow_combine``, ``spill``):

1. links: anchor (name, target) counts by name bucket; per title bucket, the inbound links and the pages.
2. entities (per title bucket, then ONE step): candidates, one per entity key, ids from the kb trie; written with a
   title -> entity_id map (a file each worker memory-maps).
3. name candidates (per name bucket): pairs whose target is an entity; then ONE step builds the trie of their
   names (name id = key id; each name's bucket is its value).
4. text (the second read, once the name trie exists): paragraphs per name id, by name bucket.
5. per name bucket: candidates and paragraph counts scored and filtered; then ONE step writes the linker.

Only paths travel as side inputs; the global objects (kb trie, title map, name trie, linker) are files.

Held: per worker the rows it gathers before a spill, one bucket's parts in a reduce, the mapped tries; in the one
worker of each global step what that step builds (entities, the name trie, the linker), from Arrow columns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.transforms.window import GlobalWindows

from artifacts import fs, tables
from artifacts.counters import declare, dropped, error
from artifacts.errors import BelowMinimumError, OutsideRangeError
from artifacts.names import (
    DOC_UNITS,
    NameRules,
    name_problem,
    normalize_name,
    title_name,
)
from artifacts.trie_map import load_trie_map, save_trie_map
from transforms.common.dead_letters import DEAD_LETTER_TAG, count, count_fields, dead_letter
from transforms.common.per_worker import PerProcess
from transforms.common.spill import Part, SpillAndGroup
from transforms.dictionary.arrow_combine import bucket_sums, bucketed_sums, summed_by
from transforms.dictionary.name_occurrences import CountNameDocs
from transforms.dictionary.tables import (
    CANDIDATES,
    DOC_KEYS,
    DOC_VALUES,
    PAIR_KEYS,
    PAIR_VALUES,
    TARGET_KEYS,
    TARGET_VALUES,
    LinkTally,
    Thresholds,
    docs_of,
    entity_candidates,
    entity_table,
    name_buckets,
    name_candidates,
    score_names,
    title_entity_ids,
)

LINK_COLUMNS = ["page_id", "title", "text", "links", "qid"]
TEXT_COLUMNS = ["text"]
# Buckets: a power of two from the article count (results do not depend on it), so that a bucket holds about
# this many articles' keys; full English Wikipedia gets the maximum.
ARTICLES_PER_BUCKET, MIN_BUCKETS, MAX_BUCKETS = 25_000, 4, 256
# Rows a worker gathers before summing them into per-bucket tables (pass 1); rows per entity table sent to the
# writer.
BATCH_ROWS, OUTPUT_ROWS = 1 << 16, 1 << 16
PAIRS_TAG, TARGETS_TAG, TITLE_IDS_TAG = "pairs", "targets", "title_ids"

COUNTERS = declare(
    error("empty_names", "anchors with empty text"),
    error("names_with_control_characters", "anchors with control characters"),
    dropped("names_too_long", "anchors longer than --max-mention-length"),
    dropped("red_link_targets", "link targets that are not articles (no entity without --include-red-links)"),
    dropped("red_links_not_entities", "links to targets that are not entities"),
    dropped("duplicate_entity_keys", "articles sharing an entity key with another one"),
    dropped("pairs_to_non_entities", "name-entity pairs whose target is not an entity"),
    dropped("names_below_min_link_prob", "names below --min-link-prob"),
    dropped("pairs_below_min_commonness", "name-entity pairs below --min-commonness"),
    dropped("pairs_below_min_link_count", "name-entity pairs below --min-link-count"),
)


@dataclass(frozen=True)
class DictionaryConfig:
    """What the dictionary keeps: names whose links make up at least ``min_link_prob`` of the paragraphs (or
    pages, by ``doc_unit``) they occur in, and of a name's entities those with at least ``min_commonness`` of
    its links and ``min_link_count`` links; names of up to ``max_mention_length`` characters, case-folded
    unless ``case_sensitive``. With ``include_red_links`` every link target is an entity."""

    min_link_prob: float = 0.05
    min_commonness: float = 0.3
    min_link_count: int = 1
    max_mention_length: int = 100
    case_sensitive: bool = False
    doc_unit: str = "paragraph"
    include_red_links: bool = False

    def __post_init__(self) -> None:
        if self.doc_unit not in DOC_UNITS:
            raise ValueError(f"doc_unit must be one of {DOC_UNITS}, got {self.doc_unit!r}")
        for setting in ("min_link_prob", "min_commonness"):  # a value beyond 1 would silently drop everything
            value = getattr(self, setting)
            if not 0 <= value <= 1:
                raise OutsideRangeError(setting, value, 0, 1, "a probability")
        if self.min_link_count < 0:
            raise BelowMinimumError("min_link_count", self.min_link_count, 0)
        if self.max_mention_length < 1:
            raise BelowMinimumError("max_mention_length", self.max_mention_length, 1)

    @property
    def rules(self) -> NameRules:
        return NameRules(case_sensitive=self.case_sensitive, max_length=self.max_mention_length)

    @property
    def per_page(self) -> bool:
        """Whether doc_count counts a name once per page (else once per paragraph)."""
        return self.doc_unit == "page"

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(self.min_link_prob, self.min_commonness, self.min_link_count)

    @property
    def linker_config(self) -> dict[str, Any]:
        """The options recorded in the linker, under the linker's names for them."""
        return {"max_mention_length": self.max_mention_length, "case_sensitive": self.case_sensitive,
                "min_link_prob": self.min_link_prob, "min_prior_prob": self.min_commonness,
                "min_link_count": self.min_link_count}


def buckets_for(articles: int) -> int:
    """How many buckets the counts of ``articles`` articles are combined in: a power of two, MIN..MAX_BUCKETS."""
    buckets = MIN_BUCKETS
    while buckets < MAX_BUCKETS and buckets * ARTICLES_PER_BUCKET < articles:
        buckets *= 2
    return buckets


# --- pass 1: links ------------------------------------------------------------------------------------------


def anchor_names(article: dict[str, Any], rules: NameRules) -> Iterator[tuple[str, str] | beam.pvalue.TaggedOutput]:
    """(name, target) for every link of an article and once for its own title minus ``(...)``; unusable anchor
    texts are counted (too long) or dead-lettered."""
    text = article["text"]
    sources = [(text[link["start"]:link["end"]], link["target"]) for link in article["links"]]
    sources.append((title_name(article["title"]), article["title"]))
    for raw, target in sources:
        name = normalize_name(raw, rules)
        problem = name_problem(name, rules)
        if problem is None:
            yield name, target
        elif problem == "names_too_long":
            count(problem)  # long anchors are common (whole sentences linked); counted, not dead-lettered
        else:
            yield dead_letter(problem, "unusable anchor text", page_id=article["page_id"], anchor=raw[:200])


def in_global_window(output: beam.pvalue.TaggedOutput) -> beam.pvalue.TaggedOutput:
    """An output of ``finish_bundle`` (which must carry its window)."""
    return beam.pvalue.TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))


class TallyLinks(beam.DoFn):
    """Articles -> tagged (bucket, table): anchor pairs by name bucket, link targets and pages by title bucket,
    each batch summed first; plus dead letters."""

    def __init__(self, rules: NameRules, buckets: int, batch_rows: int = BATCH_ROWS) -> None:
        self._rules, self._buckets, self._batch_rows = rules, buckets, batch_rows

    def start_bundle(self) -> None:
        self._tally = LinkTally()

    def process(self, article: dict[str, Any]) -> Iterator[beam.pvalue.TaggedOutput]:
        for item in anchor_names(article, self._rules):
            if isinstance(item, beam.pvalue.TaggedOutput):
                yield item
            else:
                self._tally.add_pair(*item)
        self._tally.add_page(article["title"], article["page_id"], article["qid"],
                             [link["target"] for link in article["links"]])
        if self._tally.rows >= self._batch_rows:
            yield from self._flush()

    def finish_bundle(self) -> Iterator[beam.pvalue.TaggedOutput]:
        yield from map(in_global_window, self._flush())

    def _flush(self) -> Iterator[beam.pvalue.TaggedOutput]:
        tally, self._tally = self._tally, LinkTally()
        if not tally.rows:
            return
        for bucket, table in bucketed_sums(tally.pair_table(), PAIR_KEYS, PAIR_VALUES, "name", self._buckets):
            yield beam.pvalue.TaggedOutput(PAIRS_TAG, (bucket, table))
        for bucket, table in bucketed_sums(tally.target_table(), TARGET_KEYS, TARGET_VALUES, "title",
                                           self._buckets):
            yield beam.pvalue.TaggedOutput(TARGETS_TAG, (bucket, table))


class SumLinksPerBucket(beam.PTransform):
    """Articles -> {"pairs": (name bucket, parts of its pair sums), "targets": (title bucket, parts of its target
    sums), "dead_letters"}; the parts are spilled under ``work``."""

    def __init__(self, rules: NameRules, buckets: int, work: WorkFiles) -> None:
        super().__init__()
        self._rules, self._buckets, self._work = rules, buckets, work

    def expand(self, articles: beam.PCollection) -> dict[str, beam.PCollection]:
        tallied = articles | "TallyLinks" >> beam.ParDo(TallyLinks(self._rules, self._buckets)).with_outputs(
            PAIRS_TAG, TARGETS_TAG, DEAD_LETTER_TAG)
        return {
            "pairs": tallied[PAIRS_TAG] | "SumPairs" >> SpillAndGroup(self._work.pair_parts,
                                                                      summed_by(PAIR_KEYS, PAIR_VALUES)),
            "targets": tallied[TARGETS_TAG] | "SumTargets" >> SpillAndGroup(self._work.target_parts,
                                                                            summed_by(TARGET_KEYS, TARGET_VALUES)),
            "dead_letters": tallied[DEAD_LETTER_TAG],
        }


# --- entities ---------------------------------------------------------------------------------------------------


def bucket_file(directory: str, bucket: int) -> str:
    return fs.join(directory, f"bucket-{bucket:05d}.parquet")


@dataclass(frozen=True)
class WorkFiles:
    """Where the stage's intermediate files go: one directory each under the stage's staging directory (removed
    when the stage commits)."""

    pair_parts: str
    target_parts: str
    doc_parts: str
    entity_candidates: str
    title_ids: str
    name_candidates: str
    name_buckets: str

    @classmethod
    def under(cls, root: str) -> WorkFiles:
        return cls(*(fs.join(root, field.name) for field in fields(cls)))


def write_entity_candidates(bucket_parts: tuple[int, list[Part]], directory: str,
                            include_red_links: bool) -> str:
    """One title bucket's entity candidates from the parts of its target sums, written to its file (the path is
    returned); red links counted."""
    bucket, parts = bucket_parts
    candidates, red_links = entity_candidates(bucket_sums(parts, TARGET_KEYS, TARGET_VALUES), include_red_links)
    if red_links.targets:
        count("red_link_targets", red_links.targets)
        count("red_links_not_entities", red_links.links)
    path = bucket_file(directory, bucket)
    tables.write_file(path, candidates)
    return path


def build_entities(_: None, candidate_files: list[str], title_ids_dir: str) -> Iterator[Any]:
    """The global entity step: all candidates -> entity tables (main output, in slices) and the title map's
    directory (tagged ``title_ids``, written first)."""
    entities, duplicates = entity_table(tables.read_files(candidate_files, CANDIDATES))
    if duplicates:
        count("duplicate_entity_keys", duplicates)
    save_trie_map(title_ids_dir, title_entity_ids(entities))
    yield beam.pvalue.TaggedOutput(TITLE_IDS_TAG, title_ids_dir)
    for batch in entities.to_batches(max_chunksize=OUTPUT_ROWS):
        yield pa.Table.from_batches([batch])


class Entities(beam.PTransform):
    """(title bucket, parts of its target sums) -> {"entities": entity tables, "title_ids": the title map's
    directory}."""

    def __init__(self, include_red_links: bool, work: WorkFiles) -> None:
        super().__init__()
        self._include_red_links, self._work = include_red_links, work

    def expand(self, targets: beam.PCollection) -> dict[str, beam.PCollection]:
        files = targets | "WriteCandidatesPerBucket" >> beam.Map(
            write_entity_candidates, self._work.entity_candidates, self._include_red_links)
        built = (
            targets.pipeline
            | "Once" >> beam.Create([None])
            | "BuildEntities" >> beam.FlatMap(build_entities, beam.pvalue.AsList(files), self._work.title_ids)
            .with_outputs(TITLE_IDS_TAG, main="entities")
        )
        return {"entities": built.entities, "title_ids": built[TITLE_IDS_TAG]}


# --- name candidates ---------------------------------------------------------------------------------------


class WriteNameCandidates(beam.DoFn):
    """(name bucket, parts of its pair sums) -> (bucket, path of its file of pairs attached to entities)."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._maps = PerProcess(load_trie_map)

    def process(self, bucket_parts: tuple[int, list[Part]], title_ids_dir: str) -> Iterator[tuple[int, str]]:
        bucket, parts = bucket_parts
        self._title_ids = self._maps.get(title_ids_dir)  # kept: Shared frees what nothing refers to
        candidates, not_entities = name_candidates(bucket_sums(parts, PAIR_KEYS, PAIR_VALUES), self._title_ids)
        if not_entities:
            count("pairs_to_non_entities", not_entities)
        path = bucket_file(self._directory, bucket)
        tables.write_file(path, candidates)
        yield bucket, path


def build_name_buckets(_: None, candidate_files: list[tuple[int, str]], directory: str) -> str:
    """The global name step: the trie of every candidate name (ids for the document counts), each name's bucket
    its value; returns its directory."""
    names_by_bucket = [(bucket, pc.unique(tables.read_file(path, ["name"]).column("name")))
                       for bucket, path in sorted(candidate_files)]
    save_trie_map(directory, name_buckets(names_by_bucket))
    return directory


class NameCandidates(beam.PTransform):
    """(name bucket, parts of its pair sums) -> {"files": (bucket, candidates file), "name_buckets": the name
    trie's directory}."""

    def __init__(self, work: WorkFiles, title_ids: beam.PCollection) -> None:
        super().__init__()
        self._work, self._title_ids = work, title_ids

    def expand(self, pairs: beam.PCollection) -> dict[str, beam.PCollection]:
        files = pairs | "AttachEntityIds" >> beam.ParDo(WriteNameCandidates(self._work.name_candidates),
                                                        beam.pvalue.AsSingleton(self._title_ids))
        trie = (
            pairs.pipeline
            | "Once" >> beam.Create([None])
            | "BuildNameTrie" >> beam.Map(build_name_buckets, beam.pvalue.AsList(files), self._work.name_buckets)
        )
        return {"files": files, "name_buckets": trie}


# --- scoring --------------------------------------------------------------------------------------------------------


class ScoreNameBucket(beam.DoFn):
    """(name bucket, {"candidates": [file], "docs": [parts of its paragraph counts]}) -> the bucket's kept name
    rows (a table)."""

    def __init__(self, thresholds: Thresholds) -> None:
        self._thresholds = thresholds
        self._maps = PerProcess(load_trie_map)

    def process(self, joined: tuple[int, dict[str, list[Any]]], names_dir: str) -> Iterator[pa.Table]:
        _, inputs = joined
        if not inputs["candidates"]:
            return
        self._names = self._maps.get(names_dir)  # kept: Shared frees what nothing refers to
        candidates = tables.read_file(inputs["candidates"][0])
        name_ids = self._names.key_ids(candidates.column("name").to_pylist())
        docs = docs_of(name_ids, bucket_sums(inputs["docs"][0], DOC_KEYS, DOC_VALUES) if inputs["docs"] else None)
        rows, drops = score_names(candidates, docs, self._thresholds)
        count_fields(drops)
        if rows.num_rows:
            yield rows


ReadArticles = Callable[[list[str], str], beam.PTransform]


class BuildDictionary(beam.PTransform):
    """A pipeline's root -> {"entities", "names": tables of their rows, "dead_letters"}.

    ``read_articles(columns, unit)`` is a source of article rows with those columns (read twice: links first, then
    text for name occurrences once the name trie exists); ``work_dir`` takes the intermediate files; ``buckets``:
    how many buckets the counts are combined in (see ``buckets_for``; results do not depend on it)."""

    def __init__(self, config: DictionaryConfig, read_articles: ReadArticles, work_dir: str, buckets: int) -> None:
        super().__init__()
        self._config, self._read, self._buckets = config, read_articles, buckets
        self._work = WorkFiles.under(work_dir)

    def expand(self, root: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        config = self._config
        articles = root | "ReadArticles" >> self._read(LINK_COLUMNS, "articles (links)")
        links = articles | "SumLinksPerBucket" >> SumLinksPerBucket(config.rules, self._buckets, self._work)
        entities = links["targets"] | "Entities" >> Entities(config.include_red_links, self._work)
        candidates = links["pairs"] | "NameCandidates" >> NameCandidates(self._work, entities["title_ids"])
        names_dir = beam.pvalue.AsSingleton(candidates["name_buckets"])
        doc_counts = (
            root
            | "ReadArticleTexts" >> self._read(TEXT_COLUMNS, "articles (names in text)")
            | "CountNameDocs" >> beam.ParDo(CountNameDocs(config.rules, config.per_page), names_dir)
            | "SumDocsPerBucket" >> SpillAndGroup(self._work.doc_parts, summed_by(DOC_KEYS, DOC_VALUES))
        )
        names = (
            {"candidates": candidates["files"], "docs": doc_counts}
            | "JoinDocCounts" >> beam.CoGroupByKey()
            | "FilterAndScore" >> beam.ParDo(ScoreNameBucket(config.thresholds), names_dir)
        )
        return {"entities": entities["entities"], "names": names, "dead_letters": links["dead_letters"]}
