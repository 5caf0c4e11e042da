"""mentions: for every entity, a deterministic sample of up to --max-mentions links to it, as refs into articles/."""

from __future__ import annotations

import argparse
from typing import Any

import apache_beam as beam

from artifacts import layout, schemas, tables
from artifacts.errors import InputError
from pipelines import flags
from pipelines.stage import StageContext, run_beam
from transforms.mentions import COUNTERS, MentionsConfig, SampleMentions


class MentionsStage:
    """Sample up to --max-mentions linked passages per entity, deterministically."""

    name = layout.MENTIONS_STAGE
    outputs = (layout.MENTIONS,)
    flag_groups = (flags.SEQUENCE,)
    counters = COUNTERS

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("mentions")
        group.add_argument("--max-mentions", type=int, default=128, help="mentions sampled per entity")
        group.add_argument("--seed", type=int, default=0, help="seed of the sampling hash")

    def config(self, args: argparse.Namespace) -> MentionsConfig:
        if args.max_mentions < 1:
            raise InputError(f"--max-mentions must be at least 1, got {args.max_mentions}")
        if args.max_seq_length < 3:
            raise InputError(f"--max-seq-length must be at least 3 ([CLS], [MASK], [SEP]), got {args.max_seq_length}")
        return MentionsConfig(max_mentions=args.max_mentions, seed=args.seed, max_seq_length=args.max_seq_length)

    def upstream(self, config: MentionsConfig) -> tuple[str, ...]:
        return (layout.PARSE_STAGE, layout.DICTIONARY_STAGE)

    def options(self, config: MentionsConfig) -> dict[str, Any]:
        return {"max_mentions": config.max_mentions, "seed": config.seed, "max_seq_length": config.max_seq_length}

    def external_inputs(self, config: MentionsConfig) -> dict[str, str]:
        return {}

    def run(self, ctx: StageContext, config: MentionsConfig) -> dict[str, int]:
        tables.parquet_files(ctx.output, layout.ENTITIES)

        def build(pipeline: beam.Pipeline) -> None:
            articles = pipeline | "ReadArticles" >> beam.io.ReadFromParquet(
                tables.parquet_pattern(ctx.output, layout.ARTICLES), columns=["page_id", "text", "links"],
            ) | "Progress" >> ctx.progress("articles", tables.total_rows(ctx.output, layout.ARTICLES))
            entities = pipeline | "ReadEntities" >> beam.io.ReadFromParquet(
                tables.parquet_pattern(ctx.output, layout.ENTITIES), columns=["entity_id", "title"])
            rows = {"articles": articles, "entities": entities} | "SampleMentions" >> SampleMentions(config)
            _ = rows | "WriteMentions" >> beam.io.WriteToParquet(
                ctx.staged_prefix(layout.MENTIONS), schemas.MENTIONS, file_name_suffix=".parquet",
                codec=schemas.PARQUET_CODEC)

        return run_beam(ctx, build)


STAGE = MentionsStage()
