"""KPR model inputs built as the reference builds them (kembed ``utils/preprocessing.py``, ``data.py``), as pure
functions of token ids and the linker's mentions:

- a segment (a title, a text, a query) is tokenized in pieces cut at the start and end of every mention that has
  a candidate with an embedding, so each mention covers whole tokens;
- the sequence is the prefix's tokens, then the title's and [SEP] (in title mode ``pair``), then the text's, cut
  to ``max_length - 2`` tokens, between [CLS] and [SEP]; no token type ids (every token type is 0);
- the entities are every candidate with an embedding of each mention, title first, in text order, each with the
  token positions of its mention; one whose mention runs past ``max_length - 1`` (the final [SEP]'s position) is
  dropped, as is every entity beyond ``max_entities`` (a cap of this pipeline; the reference has none).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from artifacts.linker import Mention


@dataclass(frozen=True)
class EntityInputs:
    """The entities of one text: ids and, per entity, its token positions (all > 0)."""

    entity_ids: tuple[int, ...]
    positions: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class LinkedMention:
    """A mention's character span and its candidates that have an embedding, in the linker's order."""

    start: int
    end: int
    entity_ids: tuple[int, ...]


@dataclass(frozen=True)
class EntitySpan:
    """An entity and the tokens [start, end) of its mention, counted from the first token of their segment (or,
    once placed in a sequence, from the first token after [CLS])."""

    entity_id: int
    start: int
    end: int


@dataclass(frozen=True)
class Segment:
    """A tokenized segment: its token ids and the spans of its entities."""

    ids: tuple[int, ...]
    entities: tuple[EntitySpan, ...]


@dataclass(frozen=True)
class KPRSequence:
    """The model inputs of one text: token ids from [CLS] to [SEP], its entities, the length of its first segment
    with [CLS] and the [SEP] after it, the entities dropped: cut off by ``max_length`` or over ``max_entities``, and
    whether its tokens were cut at ``max_length``."""

    input_ids: tuple[int, ...]
    entities: EntityInputs
    first_length: int
    truncated: int
    over_max: int
    cut: bool


def linked_mentions(mentions: Sequence[Mention], has_embedding: Callable[[int], bool]) -> list[LinkedMention]:
    """The mentions that have a candidate with an embedding (the reference's mentions of entities in its vocabulary),
    with those candidates."""
    linked = [LinkedMention(mention.start, mention.end,
                            tuple(candidate.entity_id for candidate in mention.candidates
                                  if has_embedding(candidate.entity_id)))
              for mention in mentions]
    return [mention for mention in linked if mention.entity_ids]


def mention_bounds(mentions: Sequence[LinkedMention]) -> list[int]:
    """The character positions where a segment is cut: every start and end of a mention, in order, once each."""
    return sorted({mention.start for mention in mentions} | {mention.end for mention in mentions})


def text_pieces(text: str, bounds: Sequence[int]) -> list[str]:
    """``text`` cut at ``bounds``: ``len(bounds) + 1`` pieces, some possibly empty."""
    starts = [0, *bounds]
    return [text[start:end] for start, end in zip(starts, [*bounds, len(text)], strict=True)]


def joined_segment(piece_ids: Sequence[Sequence[int]], bounds: Sequence[int],
                   mentions: Sequence[LinkedMention]) -> Segment:
    """The segment of the tokenized pieces of ``text_pieces(text, bounds)``: their ids in order, and an entity span
    per candidate of each mention from the token count before its start to the count before its end."""
    ids: list[int] = []
    token_at: dict[int, int] = {}
    for piece, bound in zip(piece_ids, [*bounds, None], strict=True):
        ids.extend(piece)
        if bound is not None:
            token_at[bound] = len(ids)
    spans = tuple(EntitySpan(entity_id, token_at[mention.start], token_at[mention.end])
                  for mention in mentions for entity_id in mention.entity_ids)
    return Segment(tuple(ids), spans)


def kpr_sequence(segments: Sequence[Segment], prefix: Sequence[int], cls_id: int, sep_id: int, max_length: int,
                 max_entities: int) -> KPRSequence:
    """The model inputs of one text from its segments (the title and the text, or one): ``prefix`` + the segments
    joined by [SEP], cut to ``max_length - 2`` tokens, between [CLS] and [SEP]; the entities whose tokens all fit."""
    content: list[int] = list(prefix)
    spans: list[EntitySpan] = []
    for index, segment in enumerate(segments):
        if index:
            content.append(sep_id)
        offset = len(content)
        spans += [EntitySpan(span.entity_id, offset + span.start, offset + span.end) for span in segment.entities]
        content.extend(segment.ids)
    input_ids = (cls_id, *content[:max_length - 2], sep_id)
    # +1 for [CLS]; an entity is kept when its last token comes before the final [SEP], at max_length - 1
    fitting = [span for span in spans if span.end + 1 <= max_length - 1]
    kept = fitting[:max_entities]
    entities = EntityInputs(tuple(span.entity_id for span in kept),
                            tuple(tuple(range(span.start + 1, span.end + 1)) for span in kept))
    first = 1 + len(prefix) + len(segments[0].ids) + 1 if len(segments) > 1 else len(input_ids)
    return KPRSequence(input_ids, entities, min(first, len(input_ids)), len(spans) - len(fitting),
                       len(fitting) - len(kept), len(content) > max_length - 2)


def pair_token_types(sequence: KPRSequence) -> list[int]:
    """A tokenizer's own token types for the sequence (0 to the first segment's [SEP], 1 after), for an encoder
    recorded with ``token_types`` ``tokenizer`` (older index.json files)."""
    return [0] * sequence.first_length + [1] * (len(sequence.input_ids) - sequence.first_length)
