"""The dictionary's steps on the summed link counts, bucket by bucket with one global step each: entity candidates
from the targets and the entity table (ids from the kb trie) with its title -> entity_id map; name candidates
(pairs whose target is an entity) and the trie of their names; then each name bucket scored and filtered with its
paragraph counts."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc

from artifacts import fs, tables
from artifacts.counters import declare, dropped
from artifacts.trie_map import load_trie_map, save_trie_map
from transforms.common.dead_letters import DEAD_LETTER_TAG, count, count_fields, dead_letter
from transforms.common.per_worker import PerProcess
from transforms.common.spill import Part
from transforms.dictionary.arrow_combine import bucket_sums
from transforms.dictionary.tables import (
    CANDIDATES,
    DOC_KEYS,
    DOC_VALUES,
    PAIR_KEYS,
    PAIR_VALUES,
    TARGET_KEYS,
    TARGET_VALUES,
    Thresholds,
    docs_of,
    entity_candidates,
    entity_table,
    name_buckets,
    name_candidates,
    score_names,
    title_entity_ids,
)

OUTPUT_ROWS = 1 << 16  # rows per entity table sent to the writer
TITLE_IDS_TAG = "title_ids"

COUNTERS = declare(
    dropped("red_link_targets", "link targets that are not articles (no entity without --include-red-links)"),
    dropped("red_links_not_entities", "links to targets that are not entities"),
    dropped("duplicate_entity_keys", "articles sharing an entity key with another one"),
    dropped("pairs_to_non_entities", "name-entity pairs whose target is not an entity"),
    dropped("names_below_min_link_prob", "names below --min-link-prob"),
    dropped("pairs_below_min_commonness", "name-entity pairs below --min-commonness"),
    dropped("pairs_below_min_link_count", "name-entity pairs below --min-link-count"),
)


def bucket_file(directory: str, bucket: int) -> str:
    return fs.join(directory, f"bucket-{bucket:05d}.parquet")


# --- entities ---------------------------------------------------------------------------------------------------------


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
    """The global entity step: all candidates -> entity tables (main output, in slices), the title map's directory
    (tagged ``title_ids``, written first) and a dead letter for each article left out for sharing an entity key."""
    entities, left_out = entity_table(tables.read_files(candidate_files, CANDIDATES))
    for row in left_out.to_pylist():
        yield dead_letter("duplicate_entity_keys", "an article with the entity key of another one, which is the entity "
                          "(the smaller title): links to this one attach to no entity", title=row["title"],
                          page_id=row["page_id"], key=row["key"], entity_title=row["entity_title"],
                          links=row["link_count"])
    save_trie_map(title_ids_dir, title_entity_ids(entities))
    yield beam.pvalue.TaggedOutput(TITLE_IDS_TAG, title_ids_dir)
    for batch in entities.to_batches(max_chunksize=OUTPUT_ROWS):
        yield pa.Table.from_batches([batch])


class Entities(beam.PTransform):
    """(title bucket, parts of its target sums) -> {"entities": entity tables, "title_ids": the title map's
    directory, "dead_letters"}."""

    def __init__(self, include_red_links: bool, candidates_dir: str, title_ids_dir: str) -> None:
        super().__init__()
        self._include_red_links = include_red_links
        self._candidates_dir, self._title_ids_dir = candidates_dir, title_ids_dir

    def expand(self, targets: beam.PCollection) -> dict[str, beam.PCollection]:
        files = targets | "WriteCandidatesPerBucket" >> beam.Map(
            write_entity_candidates, self._candidates_dir, self._include_red_links)
        built = (
            targets.pipeline
            | "Once" >> beam.Create([None])
            | "BuildEntities" >> beam.FlatMap(build_entities, beam.pvalue.AsList(files), self._title_ids_dir)
            .with_outputs(TITLE_IDS_TAG, DEAD_LETTER_TAG, main="entities")
        )
        return {"entities": built.entities, "title_ids": built[TITLE_IDS_TAG], "dead_letters": built[DEAD_LETTER_TAG]}


# --- name candidates --------------------------------------------------------------------------------------------------


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

    def __init__(self, candidates_dir: str, trie_dir: str, title_ids: beam.PCollection) -> None:
        super().__init__()
        self._candidates_dir, self._trie_dir, self._title_ids = candidates_dir, trie_dir, title_ids

    def expand(self, pairs: beam.PCollection) -> dict[str, beam.PCollection]:
        files = pairs | "AttachEntityIds" >> beam.ParDo(WriteNameCandidates(self._candidates_dir),
                                                        beam.pvalue.AsSingleton(self._title_ids))
        trie = (
            pairs.pipeline
            | "Once" >> beam.Create([None])
            | "BuildNameTrie" >> beam.Map(build_name_buckets, beam.pvalue.AsList(files), self._trie_dir)
        )
        return {"files": files, "name_buckets": trie}


# --- scoring ----------------------------------------------------------------------------------------------------------


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
