"""dictionary: articles -> entity vocabulary, anchor dictionary (link probability, commonness) and entity linker."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import marisa_trie
import numpy as np
import pyarrow.compute as pc

from artifacts import layout, schemas, tables
from artifacts.errors import InputError
from artifacts.linker import build_kb_trie, write_linker_columns
from artifacts.names import (
    NameRules,
    find_names,
    fold_case,
    name_problem,
    normalize_name,
    paragraphs,
    title_name,
    token_spans,
)
from pipelines.stage import StageContext, run_beam
from transforms.dead_letters import WriteDeadLetters, count, dead_letter


def anchor_pairs(article: dict[str, Any], rules: NameRules) -> Iterator[Any]:
    """((name, target), 1) for every link of an article, and once for its own title minus ``(...)``."""
    text = article["text"]
    sources = [(text[link["start"]:link["end"]], link["target"]) for link in article["links"]]
    sources.append((title_name(article["title"]), article["title"]))
    for raw, target in sources:
        name = normalize_name(raw, rules)
        problem = name_problem(name, rules)
        if problem is None:
            yield (name, target), 1
        elif problem == "names_too_long":
            count(problem)  # long anchors are common (whole sentences linked); counted, not dead-lettered
        else:
            yield dead_letter(problem, "unusable anchor text", page_id=article["page_id"], anchor=raw[:200])


def inbound_links(article: dict[str, Any]) -> Iterator[tuple[str, int]]:
    for link in article["links"]:
        yield link["target"], 1


def entity_candidate(title: str, joined: dict[str, list[Any]], include_red_links: bool = False) -> Iterator[dict]:
    """An entity for a link target: an article of the dump (or any target with ``include_red_links``)."""
    inbound = sum(joined["inbound"])
    if not inbound:
        return
    pages = sorted(joined["page"], key=lambda page: page[0])
    if not pages and not include_red_links:
        count("red_link_targets")
        count("red_links_not_entities", inbound)
        return
    page_id, qid = pages[0] if pages else (None, None)
    yield {"title": title, "page_id": page_id, "qid": qid, "link_count": inbound}


def entity_key(entity: dict[str, Any]) -> str:
    """The KPR entity key: the Wikidata QID where known, else the title."""
    return entity["qid"] or entity["title"]


def first_of_key(key: str, entities: list[dict[str, Any]]) -> dict[str, Any]:
    """One entity per key (two articles with one QID keep the smaller title), counting the others."""
    ordered = sorted(entities, key=lambda entity: entity["title"])
    if len(ordered) > 1:
        count("duplicate_entity_keys", len(ordered) - 1)
    return ordered[0]


def trie_bytes(keys: list[str]) -> bytes:
    return marisa_trie.Trie(keys).tobytes()


class TrieCache:
    """One trie per worker, rebuilt only when its side input changes."""

    def __init__(self) -> None:
        self._source: bytes | None = None
        self._trie: marisa_trie.Trie | None = None

    def get(self, data: bytes) -> marisa_trie.Trie:
        if self._trie is None or data is not self._source:
            self._trie, self._source = marisa_trie.Trie().frombytes(data), data
        return self._trie


class AssignEntityIds(beam.DoFn):
    """entity_id = key id in the kb trie + 1: dense, stable for a key set, the same everywhere."""

    def setup(self) -> None:
        self._tries = TrieCache()

    def process(self, entity: dict[str, Any], kb_trie: bytes) -> Iterator[dict[str, Any]]:
        yield {**entity, "entity_id": self._tries.get(kb_trie)[entity_key(entity)] + 1}


class CountNameOccurrences(beam.DoFn):
    """(name, 1) once per paragraph (or page) in which a dictionary name occurs on token boundaries."""

    def __init__(self, rules: NameRules, per_page: bool) -> None:
        self._rules = rules
        self._per_page = per_page

    def setup(self) -> None:
        import spacy

        self._tokenizer = spacy.blank("en").tokenizer
        self._tries = TrieCache()

    def process(self, article: dict[str, Any], name_trie: bytes) -> Iterator[tuple[str, int]]:
        trie = self._tries.get(name_trie)
        for unit in paragraphs(article["text"], self._per_page):
            tokens = token_spans(self._tokenizer(unit))
            folded = unit if self._rules.case_sensitive else fold_case(unit)
            found = {match.name for match in find_names(folded, tokens, trie.prefixes, self._rules.max_length,
                                                        longest_only=False)}
            for name in found:
                yield name, 1


def name_rows(name: str, joined: dict[str, list[Any]],
              thresholds: dict[str, float] | None = None) -> Iterator[dict[str, Any]]:
    """The kept (name, entity) rows of one name with their statistics; what the filters remove is counted."""
    candidates = sorted(joined["candidates"])
    if not candidates or thresholds is None:
        return
    total = sum(link_count for _, link_count in candidates)
    doc_count = max(sum(joined["docs"]), 1)
    link_prob = min(1.0, total / doc_count)
    if link_prob < thresholds["min_link_prob"]:
        count("names_below_min_link_prob")
        return
    for entity_id, link_count in candidates:
        commonness = link_count / total
        if commonness < thresholds["min_commonness"]:
            count("pairs_below_min_commonness")
        elif link_count < thresholds["min_link_count"]:
            count("pairs_below_min_link_count")
        else:
            yield {"name": name, "entity_id": entity_id, "link_count": link_count, "total_link_count": total,
                   "doc_count": doc_count, "link_prob": link_prob, "commonness": commonness}


def attach_entity_ids(target: str, joined: dict[str, list[Any]]) -> Iterator[tuple[str, tuple[int, int]]]:
    """(name, (entity_id, link_count)) for the pairs whose target is an entity; the rest are counted."""
    entity_ids = joined["entity_id"]
    for name, link_count in joined["pairs"]:
        if entity_ids:
            yield name, (entity_ids[0], link_count)
        else:
            count("pairs_to_non_entities")


class BuildDictionary(beam.PTransform):
    """Articles -> {"entities", "names", "dead_letters"}."""

    def __init__(self, rules: NameRules, per_page: bool, include_red_links: bool,
                 thresholds: dict[str, float]) -> None:
        super().__init__()
        self._rules = rules
        self._per_page = per_page
        self._include_red_links = include_red_links
        self._thresholds = thresholds

    def expand(self, articles: beam.PCollection) -> dict[str, beam.PCollection]:
        anchors = articles | "AnchorPairs" >> beam.FlatMap(anchor_pairs, self._rules).with_outputs(
            "dead_letter", main="pairs")
        pair_counts = anchors.pairs | "CountPairs" >> beam.CombinePerKey(sum)
        entities = self._entities(articles)
        by_name = (
            {
                "pairs": pair_counts | "KeyPairsByTarget" >> beam.MapTuple(lambda pair, n: (pair[1], (pair[0], n))),
                "entity_id": entities | "EntityIdByTitle" >> beam.Map(lambda e: (e["title"], e["entity_id"])),
            }
            | "JoinPairsWithEntities" >> beam.CoGroupByKey()
            | "AttachEntityIds" >> beam.FlatMapTuple(attach_entity_ids)
        )
        name_trie = (
            by_name
            | "Names" >> beam.Keys()
            | "DistinctNames" >> beam.Distinct()
            | "CollectNames" >> beam.combiners.ToList()
            | "BuildNameTrie" >> beam.Map(trie_bytes)
        )
        doc_counts = (
            articles
            | "FindNamesInText" >> beam.ParDo(CountNameOccurrences(self._rules, self._per_page),
                                              beam.pvalue.AsSingleton(name_trie))
            | "CountDocs" >> beam.CombinePerKey(sum)
        )
        names = (
            {"candidates": by_name, "docs": doc_counts}
            | "JoinDocCounts" >> beam.CoGroupByKey()
            | "FilterAndScore" >> beam.FlatMapTuple(name_rows, self._thresholds)
        )
        return {"entities": entities, "names": names, "dead_letters": anchors.dead_letter}

    def _entities(self, articles: beam.PCollection) -> beam.PCollection:
        candidates = (
            {
                "inbound": articles | "InboundLinks" >> beam.FlatMap(inbound_links),
                "page": articles | "PagesByTitle" >> beam.Map(lambda a: (a["title"], (a["page_id"], a["qid"]))),
            }
            | "JoinTargetsWithPages" >> beam.CoGroupByKey()
            | "EntityCandidates" >> beam.FlatMapTuple(entity_candidate, self._include_red_links)
            | "KeyByEntityKey" >> beam.Map(lambda entity: (entity_key(entity), entity))
            | "GroupByEntityKey" >> beam.GroupByKey()
            | "OnePerKey" >> beam.MapTuple(first_of_key)
        )
        kb_trie = (
            candidates
            | "EntityKeys" >> beam.Map(entity_key)
            | "CollectKeys" >> beam.combiners.ToList()
            | "BuildKbTrie" >> beam.Map(trie_bytes)
        )
        return candidates | "AssignEntityIds" >> beam.ParDo(AssignEntityIds(), beam.pvalue.AsSingleton(kb_trie))


def entity_row(entity: dict[str, Any]) -> dict[str, Any]:
    return {name: entity[name] for name in schemas.ENTITIES.names}


class DictionaryStage:
    """Build the anchor dictionary, the entity vocabulary and the entity linker from parsed articles."""

    name = layout.DICTIONARY_STAGE
    outputs = (layout.ENTITIES, layout.DICTIONARY)
    flag_groups = ()

    def config(self, args: argparse.Namespace) -> argparse.Namespace:
        return args  # transitional: the flags themselves until this stage has its frozen config

    def upstream(self, args: argparse.Namespace) -> tuple[str, ...]:
        return (layout.PARSE_STAGE,)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("dictionary")
        group.add_argument("--min-link-prob", type=float, default=0.05, help="keep a name if link_prob >= this")
        group.add_argument("--min-commonness", type=float, default=0.3,
                           help="keep a candidate if commonness >= this")
        group.add_argument("--min-link-count", type=int, default=1, help="keep a candidate with this many links")
        group.add_argument("--max-mention-length", type=int, default=100, help="longest name, in characters")
        group.add_argument("--case-sensitive", action="store_true", help="names keep their case")
        group.add_argument("--doc-unit", choices=("paragraph", "page"), default="paragraph",
                           help="doc_count counts a name once per paragraph or once per page")
        group.add_argument("--include-red-links", action="store_true",
                           help="every link target is an entity, also those with no article in the dump")

    def options(self, args: argparse.Namespace) -> dict[str, Any]:
        return {key: getattr(args, key) for key in ("min_link_prob", "min_commonness", "min_link_count",
                                                    "max_mention_length", "case_sensitive", "doc_unit",
                                                    "include_red_links")}

    def external_inputs(self, args: argparse.Namespace) -> dict[str, str]:
        return {}

    def run(self, ctx: StageContext, args: argparse.Namespace) -> dict[str, int]:
        article_count = tables.total_rows(args.output, layout.ARTICLES)
        if article_count == 0:
            raise InputError(f"{args.output}/articles has no rows: run the parse stage on a dump with articles")
        rules = NameRules(case_sensitive=args.case_sensitive, max_length=args.max_mention_length)
        thresholds = {"min_link_prob": args.min_link_prob, "min_commonness": args.min_commonness,
                      "min_link_count": args.min_link_count}

        def build(pipeline: beam.Pipeline) -> None:
            articles = pipeline | "ReadArticles" >> beam.io.ReadFromParquet(
                tables.parquet_pattern(args.output, layout.ARTICLES),
                columns=["page_id", "title", "text", "links", "qid"],
            ) | "Progress" >> ctx.progress(layout.ARTICLES, article_count)
            built = articles | "BuildDictionary" >> BuildDictionary(rules, args.doc_unit == "page",
                                                                    args.include_red_links, thresholds)
            _ = built["entities"] | "EntityRows" >> beam.Map(entity_row) | "WriteEntities" >> beam.io.WriteToParquet(
                ctx.staged_prefix(layout.ENTITIES), schemas.ENTITIES, file_name_suffix=".parquet",
                codec=schemas.PARQUET_CODEC)
            _ = built["names"] | "WriteNames" >> beam.io.WriteToParquet(
                ctx.staged_prefix(layout.NAMES), schemas.NAMES, file_name_suffix=".parquet",
                codec=schemas.PARQUET_CODEC)
            _ = built["dead_letters"] | "WriteDeadLetters" >> WriteDeadLetters(ctx.errors_prefix("names"))

        counters = run_beam(ctx, build)
        self._write_linker(ctx, args)
        return counters

    def _write_linker(self, ctx: StageContext, args: argparse.Namespace) -> None:
        """The linker is built from the finished tables: only the name and key tries are global."""
        # Columns, not row dicts: 7M entities as Python dicts would take gigabytes on one worker.
        entities = tables.read_table(ctx.staging_root, layout.ENTITIES, ["entity_id", "title", "qid"])
        entities = entities.sort_by("entity_id")
        qid, title = entities.column("qid"), entities.column("title")
        has_qid = pc.fill_null(pc.not_equal(qid, ""), False)  # the same rule as `qid or title`
        kb_keys = build_kb_trie(pc.if_else(has_qid, qid, title).to_pylist())
        titles = title.to_pylist()  # ids are 1..N: position i is entity i + 1
        columns = ["name", "entity_id", "link_count", "total_link_count", "doc_count"]
        names = tables.read_table(ctx.staging_root, layout.NAMES, columns)
        counts = np.stack([names.column(column).to_numpy() for column in columns[1:]], axis=1) \
            if names.num_rows else np.zeros((0, 4), dtype=np.int64)
        config = {"max_mention_length": args.max_mention_length, "case_sensitive": args.case_sensitive,
                  "min_link_prob": args.min_link_prob, "min_prior_prob": args.min_commonness,
                  "min_link_count": args.min_link_count}
        write_linker_columns(ctx.staged(layout.LINKER), names.column("name").to_pylist(), counts, kb_keys,
                             titles, config)


STAGE = DictionaryStage()
