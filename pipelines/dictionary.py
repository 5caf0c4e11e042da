"""dictionary: articles -> entity vocabulary, anchor dictionary (link probability, commonness) and entity linker."""

from __future__ import annotations

import argparse
from typing import Any

import apache_beam as beam

from artifacts import fs, layout, schemas, tables
from artifacts.errors import InputError
from artifacts.names import SPACY_CODES, blank_language
from artifacts.run import manifest
from pipelines.launcher.stage import StageContext, run_beam
from transforms.common.dead_letters import WriteDeadLetters
from transforms.common.parquet_rows import ReadParquetRows
from transforms.dictionary.graph import (
    COUNTERS,
    BuildDictionary,
    DictionaryConfig,
    buckets_for,
)
from transforms.dictionary.linker import WriteLinker

WORK_DIR = "work"  # intermediate files under the stage's staging directory (removed when the stage commits)


class DictionaryStage:
    """Build the anchor dictionary, the entity vocabulary and the entity linker from parsed articles."""

    name = layout.DICTIONARY_STAGE
    outputs = layout.STAGE_OUTPUTS[layout.DICTIONARY_STAGE]
    counters = COUNTERS

    def config(self, args: argparse.Namespace) -> DictionaryConfig:
        return DictionaryConfig(
            min_link_prob=args.min_link_prob, min_commonness=args.min_commonness, min_link_count=args.min_link_count,
            max_mention_length=args.max_mention_length, case_sensitive=args.case_sensitive, doc_unit=args.doc_unit,
            include_red_links=args.include_red_links, language=checked_language(args.language),
            bold_self_links=links_first_bolds(args))

    def upstream(self, config: DictionaryConfig) -> tuple[str, ...]:
        return (layout.PARSE_STAGE,)

    def options(self, config: DictionaryConfig) -> dict[str, Any]:
        """The options that change the dictionary; ``language`` only when not English (the tokenizer of runs
        recorded before it was an option), so that those runs keep their records."""
        return {"min_link_prob": config.min_link_prob, "min_commonness": config.min_commonness,
                "min_link_count": config.min_link_count, "max_mention_length": config.max_mention_length,
                "case_sensitive": config.case_sensitive, "doc_unit": config.doc_unit,
                "include_red_links": config.include_red_links, **manifest.unless_default("language", config.language),
                **({"bold_self_links": True} if config.bold_self_links else {})}  # earlier versions counted them

    def external_inputs(self, config: DictionaryConfig) -> dict[str, str]:
        return {}

    def content_inputs(self, config: DictionaryConfig) -> dict[str, str]:
        return {}

    def run(self, ctx: StageContext, config: DictionaryConfig) -> dict[str, int]:
        article_count = tables.total_rows(ctx.output, layout.ARTICLES)
        if article_count == 0:
            raise InputError(f"{ctx.output}/articles has no rows: run the parse stage on a dump with articles")

        article_files = tables.parquet_files(ctx.output, layout.ARTICLES)

        def read_articles(columns: list[str], unit: str) -> beam.PTransform:
            return ReadParquetRows(article_files, columns) | ctx.progress(unit, article_count)

        def build(pipeline: beam.Pipeline) -> None:
            built = pipeline | "BuildDictionary" >> BuildDictionary(
                config, read_articles, fs.join(ctx.staging_root, WORK_DIR), buckets_for(article_count))
            entity_files = built["entities"] | "WriteEntities" >> beam.io.WriteToParquetBatched(
                ctx.staged_prefix(layout.ENTITIES), schemas.ENTITIES, file_name_suffix=".parquet",
                codec=schemas.PARQUET_CODEC)
            name_files = built["names"] | "WriteNames" >> beam.io.WriteToParquetBatched(
                ctx.staged_prefix(layout.NAMES), schemas.NAMES, file_name_suffix=".parquet",
                codec=schemas.PARQUET_CODEC)
            _ = {"entities": entity_files, "names": name_files} | "WriteLinker" >> WriteLinker(
                ctx.staged(layout.LINKER), config.linker_config)
            _ = built["dead_letters"] | "WriteDeadLetters" >> WriteDeadLetters(ctx.errors_prefix("names"))

        return run_beam(ctx, build)


def links_first_bolds(args: argparse.Namespace) -> bool:
    """Whether parse links each article's first bold to the article: as `all` is told (--first-bold-as-link), or
    as the parse stage of OUT recorded it."""
    if hasattr(args, "first_bold_as_link"):
        return bool(args.first_bold_as_link)
    parse = manifest.load(args.output).get(layout.PARSE_STAGE)
    return parse is not None and parse.options.get("first_bold_as_link") is True


def checked_language(language: str) -> str:
    """spaCy's own code of ``--language`` (``eng`` is ``en``: one tokenizer, one record), refused in one line
    before any work where spaCy makes no tokenizer of it here."""
    try:
        return blank_language(SPACY_CODES.get(language, language)).lang  # a Wikipedia's code too (no: nb)
    except InputError as error:
        raise InputError(f"--language {language}: {error.message}") from None


STAGE = DictionaryStage()
