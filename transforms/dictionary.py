"""dictionary: articles -> entity vocabulary, anchor dictionary (link probability, commonness) and entity linker."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import marisa_trie
import numpy as np
import pyarrow.compute as pc

from artifacts import layout, schemas, tables
from artifacts.counters import declare, dropped, error
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
from transforms.dead_letters import count, dead_letter

DOC_UNITS = ("paragraph", "page")

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

    @property
    def rules(self) -> NameRules:
        return NameRules(case_sensitive=self.case_sensitive, max_length=self.max_mention_length)

    @property
    def per_page(self) -> bool:
        """Whether doc_count counts a name once per page (else once per paragraph)."""
        return self.doc_unit == "page"

    @property
    def linker_config(self) -> dict[str, Any]:
        """The options recorded in the linker, under the linker's names for them."""
        return {"max_mention_length": self.max_mention_length, "case_sensitive": self.case_sensitive,
                "min_link_prob": self.min_link_prob, "min_prior_prob": self.min_commonness,
                "min_link_count": self.min_link_count}


DEFAULTS = DictionaryConfig()


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
              config: DictionaryConfig = DEFAULTS) -> Iterator[dict[str, Any]]:
    """The kept (name, entity) rows of one name with their statistics; what the filters remove is counted.
    (``config`` has a default only because Beam's FlatMapTuple wants one for every extra argument.)"""
    candidates = sorted(joined["candidates"])
    if not candidates:
        return
    total = sum(link_count for _, link_count in candidates)
    doc_count = max(sum(joined["docs"]), 1)
    link_prob = min(1.0, total / doc_count)
    if link_prob < config.min_link_prob:
        count("names_below_min_link_prob")
        return
    for entity_id, link_count in candidates:
        commonness = link_count / total
        if commonness < config.min_commonness:
            count("pairs_below_min_commonness")
        elif link_count < config.min_link_count:
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

    def __init__(self, config: DictionaryConfig) -> None:
        super().__init__()
        self._config = config

    def expand(self, articles: beam.PCollection) -> dict[str, beam.PCollection]:
        anchors = articles | "AnchorPairs" >> beam.FlatMap(anchor_pairs, self._config.rules).with_outputs(
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
            | "FindNamesInText" >> beam.ParDo(CountNameOccurrences(self._config.rules, self._config.per_page),
                                              beam.pvalue.AsSingleton(name_trie))
            | "CountDocs" >> beam.CombinePerKey(sum)
        )
        names = (
            {"candidates": by_name, "docs": doc_counts}
            | "JoinDocCounts" >> beam.CoGroupByKey()
            | "FilterAndScore" >> beam.FlatMapTuple(name_rows, self._config)
        )
        return {"entities": entities, "names": names, "dead_letters": anchors.dead_letter}

    def _entities(self, articles: beam.PCollection) -> beam.PCollection:
        candidates = (
            {
                "inbound": articles | "InboundLinks" >> beam.FlatMap(inbound_links),
                "page": articles | "PagesByTitle" >> beam.Map(lambda a: (a["title"], (a["page_id"], a["qid"]))),
            }
            | "JoinTargetsWithPages" >> beam.CoGroupByKey()
            | "EntityCandidates" >> beam.FlatMapTuple(entity_candidate, self._config.include_red_links)
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


def write_linker(tables_root: str, linker_dir: str, config: DictionaryConfig) -> None:
    """The entity linker from the finished entities/ and names tables under ``tables_root``: only the name and
    key tries are global."""
    # Columns, not row dicts: 7M entities as Python dicts would take gigabytes on one worker.
    entities = tables.read_table(tables_root, layout.ENTITIES, ["entity_id", "title", "qid"])
    entities = entities.sort_by("entity_id")
    qid, title = entities.column("qid"), entities.column("title")
    has_qid = pc.fill_null(pc.not_equal(qid, ""), False)  # the same rule as `qid or title`
    kb_keys = build_kb_trie(pc.if_else(has_qid, qid, title).to_pylist())
    titles = title.to_pylist()  # ids are 1..N: position i is entity i + 1
    columns = ["name", "entity_id", "link_count", "total_link_count", "doc_count"]
    names = tables.read_table(tables_root, layout.NAMES, columns)
    counts = np.stack([names.column(column).to_numpy() for column in columns[1:]], axis=1) \
        if names.num_rows else np.zeros((0, 4), dtype=np.int64)
    write_linker_columns(linker_dir, names.column("name").to_pylist(), counts, kb_keys, titles,
                         config.linker_config)
