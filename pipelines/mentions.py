"""mentions: for every entity, a deterministic sample of up to --max-mentions links to it, as refs into articles/."""

from __future__ import annotations

import argparse
from typing import Any

import apache_beam as beam

from artifacts import fs, layout, schemas, tables
from artifacts.run import manifest
from pipelines.launcher.stage import StageContext, run_beam
from transforms.common.article_shards import row_group_count
from transforms.common.parquet_rows import write_parquet_rows
from transforms.mentions.graph import COUNTERS, MentionsConfig, MentionsInputs, SampleMentions, sample_buckets


class MentionsStage:
    """Sample up to --max-mentions linked passages per entity, deterministically."""

    name = layout.MENTIONS_STAGE
    outputs = layout.STAGE_OUTPUTS[layout.MENTIONS_STAGE]
    counters = COUNTERS

    def config(self, args: argparse.Namespace) -> MentionsConfig:
        return MentionsConfig(max_mentions=args.max_mentions, seed=args.seed, max_seq_length=args.max_seq_length)

    def upstream(self, config: MentionsConfig) -> tuple[str, ...]:
        return (layout.PARSE_STAGE, layout.DICTIONARY_STAGE)

    def options(self, config: MentionsConfig) -> dict[str, Any]:
        return {"max_mentions": config.max_mentions, "seed": config.seed, "max_seq_length": config.max_seq_length}

    def external_inputs(self, config: MentionsConfig) -> dict[str, str]:
        return {}

    def content_inputs(self, config: MentionsConfig) -> dict[str, str]:
        return {}

    def run(self, ctx: StageContext, config: MentionsConfig) -> dict[str, int]:
        inputs = MentionsInputs(output=ctx.output, scratch=scratch_directory(ctx),
                                buckets=sample_buckets(parsed_links(ctx.output)))
        progress = {"links": ctx.progress("article row groups (pass 1: links)", article_row_groups(ctx.output)),
                    "articles": ctx.progress("articles (pass 2: mentions)",
                                             tables.total_rows(ctx.output, layout.ARTICLES))}

        def build(pipeline: beam.Pipeline) -> None:
            rows = pipeline | "SampleMentions" >> SampleMentions(config, inputs, progress)
            _ = rows | "WriteMentions" >> write_parquet_rows(ctx.staged_prefix(layout.MENTIONS), schemas.MENTIONS)

        return run_beam(ctx, build)


def scratch_directory(ctx: StageContext) -> str:
    """Where the stage's workers share files (title map, thresholds): in its staging directory, removed with it."""
    return fs.join(ctx.staging_root, "work")


def parsed_links(output: str) -> int:
    """The links parse counted in the articles (those to entities are at most as many): what the bottom-k reduce
    is bucketed by."""
    return int(manifest.load(output)[layout.PARSE_STAGE].counters.get("links", 0))


def article_row_groups(output: str) -> int:
    """Row groups of articles/ (from the Parquet footers): the tables pass 1 reads."""
    return sum(row_group_count(path) for path in tables.parquet_files(output, layout.ARTICLES))


STAGE = MentionsStage()
