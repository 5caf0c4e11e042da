"""mentions: for every entity, a deterministic bottom-k sample of the links to it, as refs into articles/."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam

from artifacts.counters import declare, dropped, processed
from transforms.dead_letters import count
from transforms.mention_sampling import CHARS_PER_TOKEN, LinkRef, link_refs, mention_ref

COUNTERS = declare(
    processed("entities_with_mentions", "entities with sampled mentions"),
    processed("mentions_sampled", "mentions sampled"),
    dropped("links_to_non_entities", "links whose target is not an entity"),
    dropped("entities_without_links", "entities no article links to (no mention to sample)"),
    dropped("sampled_pages_missing", "sampled mentions whose source page was not found"),
)


@dataclass(frozen=True)
class MentionsConfig:
    """What the mentions stage samples: up to ``max_mentions`` links per entity, ordered by a hash seeded with
    ``seed``, each with enough context for ``max_seq_length`` model tokens on either side."""

    max_mentions: int = 128
    seed: int = 0
    max_seq_length: int = 512

    def __post_init__(self) -> None:
        if self.max_mentions < 1:
            raise ValueError(f"max_mentions must be at least 1, got {self.max_mentions}")
        if self.max_seq_length < 3:
            raise ValueError(f"max_seq_length must be at least 3 ([CLS], [MASK], [SEP]), got {self.max_seq_length}")

    @property
    def context_chars(self) -> int:
        """Characters of article text kept on each side of a mention."""
        return self.max_seq_length * CHARS_PER_TOKEN


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

    def __init__(self, config: MentionsConfig) -> None:
        super().__init__()
        self._config = config

    def expand(self, inputs: dict[str, beam.PCollection]) -> beam.PCollection:
        articles, entities = inputs["articles"], inputs["entities"]
        sampled = (
            {
                "sample": articles | "LinkRefs" >> beam.FlatMap(link_refs, self._config.seed)
                | "BottomKPerTarget" >> beam.CombinePerKey(count_and_bottom_k(self._config.max_mentions)),
                "entity_id": entities | "EntityIdByTitle" >> beam.Map(lambda e: (e["title"], e["entity_id"])),
            }
            | "JoinSamplesWithEntities" >> beam.CoGroupByKey()
            | "SamplesOfEntities" >> beam.FlatMapTuple(sample_of_entity)
            | "SampledByPage" >> beam.FlatMapTuple(sampled_by_page)
        )
        return (
            {"sampled": sampled, "article": articles | "ArticlesById" >> beam.Map(lambda a: (a["page_id"], a))}
            | "JoinSampledWithArticles" >> beam.CoGroupByKey()
            | "MentionRefs" >> beam.FlatMapTuple(mention_refs, self._config.context_chars)
        )
