"""dictionary: articles -> entity vocabulary, anchor dictionary (link probability, commonness) and entity linker.

Two reads of the articles, nothing of their text shuffled, every count summed per bucket where it is made and
spilled to part files, then each bucket summed on its own from its parts (``arrow_combine``, ``spill``); pass 1 is
in ``links``, steps 2, 3 and 5 in ``candidates``, step 4 in ``name_occurrences``, the linker in ``linker``:

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

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import apache_beam as beam

from artifacts import fs
from artifacts.counters import declare
from artifacts.errors import BelowMinimumError, OutsideRangeError
from artifacts.names import DEFAULT_LANGUAGE, DOC_UNITS, NameRules
from artifacts.run import manifest
from transforms.common.spill import SpillAndGroup
from transforms.dictionary.arrow_combine import summed_by
from transforms.dictionary.candidates import COUNTERS as CANDIDATE_COUNTERS
from transforms.dictionary.candidates import Entities, NameCandidates, ScoreNameBucket
from transforms.dictionary.links import COUNTERS as LINK_COUNTERS
from transforms.dictionary.links import SumLinksPerBucket
from transforms.dictionary.name_occurrences import CountNameDocs
from transforms.dictionary.tables import DOC_KEYS, DOC_VALUES, Thresholds

LINK_COLUMNS = ["page_id", "title", "text", "links", "qid"]
TEXT_COLUMNS = ["text"]
# Buckets: a power of two from the article count (results do not depend on it), so that a bucket holds about
# this many articles' keys; full English Wikipedia gets the maximum.
ARTICLES_PER_BUCKET, MIN_BUCKETS, MAX_BUCKETS = 25_000, 4, 256

COUNTERS = declare(*LINK_COUNTERS.values(), *CANDIDATE_COUNTERS.values())


@dataclass(frozen=True)
class DictionaryConfig:
    """What the dictionary keeps: names whose links make up at least ``min_link_prob`` of the paragraphs (or
    pages, by ``doc_unit``) they occur in, and of a name's entities those with at least ``min_commonness`` of
    its links and ``min_link_count`` links; names of up to ``max_mention_length`` characters, case-folded
    unless ``case_sensitive``, found on the token boundaries of spaCy's blank tokenizer of ``language``. With
    ``include_red_links`` every link target is an entity. With ``bold_self_links`` (parse ran with
    --first-bold-as-link) a page's links to itself are its bold name: no anchor and no inbound link (mentions
    still sample them), as the paper's reference counts neither."""

    min_link_prob: float = 0.05
    min_commonness: float = 0.3
    min_link_count: int = 1
    max_mention_length: int = 100
    case_sensitive: bool = False
    doc_unit: str = "paragraph"
    include_red_links: bool = False
    language: str = DEFAULT_LANGUAGE
    bold_self_links: bool = False

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
        return NameRules(case_sensitive=self.case_sensitive, max_length=self.max_mention_length,
                         language=self.language)

    @property
    def per_page(self) -> bool:
        """Whether doc_count counts a name once per page (else once per paragraph)."""
        return self.doc_unit == "page"

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(self.min_link_prob, self.min_commonness, self.min_link_count)

    @property
    def linker_config(self) -> dict[str, Any]:
        """The options recorded in the linker, under the linker's names for them; ``language`` only when not
        English (a linker without it tokenizes English: an English one is the same file as before the option)."""
        return {"max_mention_length": self.max_mention_length, "case_sensitive": self.case_sensitive,
                "min_link_prob": self.min_link_prob, "min_prior_prob": self.min_commonness,
                "min_link_count": self.min_link_count, **manifest.unless_default("language", self.language)}


def buckets_for(articles: int) -> int:
    """How many buckets the counts of ``articles`` articles are combined in: a power of two, MIN..MAX_BUCKETS."""
    buckets = MIN_BUCKETS
    while buckets < MAX_BUCKETS and buckets * ARTICLES_PER_BUCKET < articles:
        buckets *= 2
    return buckets


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
        links = articles | "SumLinksPerBucket" >> SumLinksPerBucket(
            config.rules, self._buckets, self._work.pair_parts, self._work.target_parts, config.bold_self_links)
        entities = links["targets"] | "Entities" >> Entities(
            config.include_red_links, self._work.entity_candidates, self._work.title_ids)
        candidates = links["pairs"] | "NameCandidates" >> NameCandidates(
            self._work.name_candidates, self._work.name_buckets, entities["title_ids"])
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
        dead_letters = (links["dead_letters"], entities["dead_letters"]) | "DeadLetters" >> beam.Flatten()
        return {"entities": entities["entities"], "names": names, "dead_letters": dead_letters}
