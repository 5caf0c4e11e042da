"""mentions: for every entity, a deterministic sample of up to --max-mentions links to it, as refs into articles/."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import apache_beam as beam

from artifacts import schemas, tables
from artifacts.errors import InputError
from pipelines.stage import StageContext, run_beam
from transforms.dead_letters import count
from transforms.mention_sampling import CHARS_PER_TOKEN, LinkRef, link_refs, mention_ref


def ref_order(ref: LinkRef) -> tuple[int, int, int]:
    """The sampling order: the seeded hash first; page and link break (astronomically rare) ties."""
    return ref.sample_key, ref.page_id, ref.link_index


def count_and_bottom_k(max_mentions: int) -> beam.CombineFn:
    """Per link target: (number of links, the ``max_mentions`` links of smallest order). Both combine before
    the shuffle, so a target with millions of links sends only k refs and a count over the network."""
    return beam.combiners.SingleInputTupleCombineFn(
        beam.combiners.CountCombineFn(), beam.combiners.TopCombineFn(max_mentions, key=ref_order, reverse=True))


def sample_of_entity(title: str, joined: dict[str, list[Any]]) -> Iterator[tuple[int, list[LinkRef]]]:
    """(entity_id, its sampled refs); links to non-entities and entities nobody links to are counted."""
    entity_ids, samples = joined["entity_id"], joined["sample"]
    if not entity_ids:
        count("links_to_non_entities", sum(links for links, _ in samples))
        return
    if not samples:
        count("entities_without_links")
        return
    _, refs = samples[0]
    yield entity_ids[0], refs


def sampled_by_page(entity_id: int, refs: list[LinkRef]) -> Iterator[tuple[int, tuple[int, int]]]:
    count("entities_with_mentions")
    count("mentions_sampled", len(refs))
    for ref in refs:
        yield ref.page_id, (entity_id, ref.link_index)


def mention_refs(page_id: int, joined: dict[str, list[Any]], chars: int = 0) -> Iterator[dict[str, Any]]:
    """The sampled mentions of one page as references into its text (the window is cut again at embed time)."""
    articles = joined["article"]
    if not articles:
        count("sampled_pages_missing", len(joined["sampled"]))
        return
    for entity_id, link_index in sorted(joined["sampled"]):
        yield mention_ref(entity_id, articles[0], link_index, chars)


class SampleMentions(beam.PTransform):
    """Articles + entities -> mention refs: a bottom-k sample by seeded hash, combined per entity."""

    def __init__(self, max_mentions: int, seed: int, context_chars: int) -> None:
        super().__init__()
        self._max_mentions = max_mentions
        self._seed = seed
        self._context_chars = context_chars

    def expand(self, inputs: dict[str, beam.PCollection]) -> beam.PCollection:
        articles, entities = inputs["articles"], inputs["entities"]
        sampled = (
            {
                "sample": articles | "LinkRefs" >> beam.FlatMap(link_refs, self._seed)
                | "BottomKPerTarget" >> beam.CombinePerKey(count_and_bottom_k(self._max_mentions)),
                "entity_id": entities | "EntityIdByTitle" >> beam.Map(lambda e: (e["title"], e["entity_id"])),
            }
            | "JoinSamplesWithEntities" >> beam.CoGroupByKey()
            | "SamplesOfEntities" >> beam.FlatMapTuple(sample_of_entity)
            | "SampledByPage" >> beam.FlatMapTuple(sampled_by_page)
        )
        return (
            {"sampled": sampled, "article": articles | "ArticlesById" >> beam.Map(lambda a: (a["page_id"], a))}
            | "JoinSampledWithArticles" >> beam.CoGroupByKey()
            | "MentionRefs" >> beam.FlatMapTuple(mention_refs, self._context_chars)
        )


class MentionsStage:
    """Sample up to --max-mentions linked passages per entity, deterministically."""

    name = "mentions"
    outputs = ("mentions",)

    def upstream(self, args: argparse.Namespace) -> tuple[str, ...]:
        return ("parse", "dictionary")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("mentions")
        group.add_argument("--max-mentions", type=int, default=128, help="mentions sampled per entity")
        group.add_argument("--seed", type=int, default=0, help="seed of the sampling hash")
        group.add_argument("--max-seq-length", type=int, default=512,
                           help="model tokens the contexts must cover on each side of a mention")

    def options(self, args: argparse.Namespace) -> dict[str, Any]:
        return {"max_mentions": args.max_mentions, "seed": args.seed, "max_seq_length": args.max_seq_length}

    def external_inputs(self, args: argparse.Namespace) -> dict[str, str]:
        return {}

    def run(self, ctx: StageContext, args: argparse.Namespace) -> dict[str, int]:
        if args.max_mentions < 1:
            raise InputError(f"--max-mentions must be at least 1, got {args.max_mentions}")
        if args.max_seq_length < 3:
            raise InputError(f"--max-seq-length must be at least 3 ([CLS], [MASK], [SEP]), got {args.max_seq_length}")
        tables.parquet_files(args.output, "entities")

        def build(pipeline: beam.Pipeline) -> None:
            articles = pipeline | "ReadArticles" >> beam.io.ReadFromParquet(
                tables.parquet_pattern(args.output, "articles"), columns=["page_id", "text", "links"],
            ) | "Progress" >> ctx.progress("articles", tables.total_rows(args.output, "articles"))
            entities = pipeline | "ReadEntities" >> beam.io.ReadFromParquet(
                tables.parquet_pattern(args.output, "entities"), columns=["entity_id", "title"])
            rows = {"articles": articles, "entities": entities} | "SampleMentions" >> SampleMentions(
                args.max_mentions, args.seed, args.max_seq_length * CHARS_PER_TOKEN)
            _ = rows | "WriteMentions" >> beam.io.WriteToParquet(
                ctx.staged_prefix("mentions"), schemas.MENTIONS, file_name_suffix=".parquet",
                codec=schemas.PARQUET_CODEC)

        return run_beam(ctx, build)


STAGE = MentionsStage()
