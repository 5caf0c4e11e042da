"""The tokens on either side of a mention, tokenizing only as many characters as the token budget needs.

A mention's window holds about 6 characters per model token on each side, while its [MASK] input keeps at most
the budget of both sides together (about half on each side). Each side is first tokenized from a slice of
about the characters its share needs, taken at the end nearest the mention. The slice cuts a word: the slice's
text before its first space (a left side) or after its last (a right side) is dropped before tokenizing, and the
tokens of the rest equal the whole side's tokens nearest the mention, because tokenizers split words at spaces
(WordPiece, byte-level BPE and SentencePiece alike) and normalize character by character. When a slice yields
fewer tokens than the caller ``needed`` to decide its split exactly, that side is tokenized whole. The kept
tokens are therefore exactly those that tokenizing whole sides would keep.

By the same rule a text's tokens are its pieces' tokens in order when it is cut at spaces, each space going with the
piece after it. The sides of one call are cut into sentences (at a space after a full stop) and each distinct
sentence is tokenized once: the windows of an article's nearby mentions share most of their sentences (at 512
tokens a side spans some ten of them), so the tokenizer reads a fraction of the characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain, pairwise

from encoders.models import plain_token_ids

# English WordPiece takes 4.9 characters per token on Wikipedia text (median of the sample's mention contexts,
# 5.4 at the 95th percentile): a slice rarely yields too few tokens, and is tokenized again whole when it does.
CHARS_PER_TOKEN_GUESS = 6
SLICE_MARGIN = 32  # characters: the cut word and a little slack
# Where a slice is cut: the space, which every tokenizer family here splits words at (a SentencePiece Metaspace
# does not split at tabs or newlines; control characters Python calls whitespace are deleted inside words).
WORD_BREAK = " "
# Where sides are cut into the pieces tokenized once each: a space after a full stop (any space would be exact).
PIECE_BREAK = re.compile(r"(?<=\.) ")

# needed(other): tokens a sliced side must yield, given the other side's token count (None: sliced too)
Needed = Callable[[int | None], int]


@dataclass(frozen=True)
class Side:
    """A side's token ids: all of them (``whole``), or the tokens of a slice nearest the mention."""

    ids: list[int]
    whole: bool


def slice_chars(needed: Needed, other_chars: int) -> int:
    """Characters a side is first sliced to: what ``needed`` asks given the other side's length, at
    ``CHARS_PER_TOKEN_GUESS`` characters per token, plus ``SLICE_MARGIN``."""
    return CHARS_PER_TOKEN_GUESS * needed(other_chars // CHARS_PER_TOKEN_GUESS) + SLICE_MARGIN


def without_cut_word(text: str, from_end: bool) -> str:
    """A slice without the word it may have cut: a left slice (``from_end``) from its first word break on, the
    break kept (a byte-level BPE puts a space into the next word's token), a right slice up to its last break;
    empty when the slice has no break. Its tokens are then those of the whole side around the same words."""
    if from_end:
        start = text.find(WORD_BREAK)
        return text[start:] if start >= 0 else ""
    end = text.rfind(WORD_BREAK)
    return text[:end] if end >= 0 else ""


def piece_bounds(text: str) -> list[int]:
    """Where ``text`` is cut into pieces: its start, every ``PIECE_BREAK`` (the space opens the next piece), its end."""
    return [0, *(match.start() for match in PIECE_BREAK.finditer(text)), len(text)]


def shared_token_ids(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """The token ids of each text (``plain_token_ids``'), every distinct piece among the texts tokenized once."""
    pieces = [[text[start:end] for start, end in pairwise(piece_bounds(text)) if end > start] for text in texts]
    distinct = list(dict.fromkeys(chain.from_iterable(pieces)))
    ids = dict(zip(distinct, plain_token_ids(tokenizer, distinct), strict=True))
    return [list(chain.from_iterable(ids[piece] for piece in text_pieces)) for text_pieces in pieces]


def tokenized_sides(tokenizer, texts: Sequence[str], limits: Sequence[int | None],
                    from_end: Sequence[bool]) -> list[Side]:
    """Each text tokenized whole (limit None, or a text no longer than its limit) or sliced to ``limit``
    characters at its end (``from_end``: a left side) or start (a right side), in one batch call. A slow
    tokenizer tokenizes whole texts (slicing is checked on the fast families only)."""
    if not tokenizer.is_fast:
        return [Side(ids, True) for ids in plain_token_ids(tokenizer, texts)]
    sliced = [limit is not None and len(text) > limit for text, limit in zip(texts, limits, strict=True)]
    inputs = [text if not cut else without_cut_word(text[len(text) - limit:] if end else text[:limit], end)
              for text, limit, cut, end in zip(texts, limits, sliced, from_end, strict=True)]
    return [Side(ids, not cut) for ids, cut in zip(shared_token_ids(tokenizer, inputs), sliced, strict=True)]


def enough(side: Side, other: Side, needed: Needed) -> bool:
    """Whether ``side`` decides the split as its whole would: it is whole, or yields what ``needed`` asks."""
    return side.whole or len(side.ids) >= needed(len(other.ids) if other.whole else None)


def context_sides(tokenizer, lefts: Sequence[str], rights: Sequence[str],
                  needed: Needed) -> list[tuple[Side, Side]]:
    """(left, right) Sides of each mention, sliced where that is exact, else whole. ``lefts``: the text before
    each mention, ``rights``: the text after it. A slow tokenizer tokenizes whole sides."""
    count = len(lefts)
    if not count:
        return []
    limits = [slice_chars(needed, len(other)) for other in (*rights, *lefts)]
    sides = tokenized_sides(tokenizer, [*lefts, *rights], limits, [True] * count + [False] * count)
    texts = [*lefts, *rights]
    while True:
        short = [index for index in range(2 * count)
                 if not enough(sides[index], sides[(index + count) % (2 * count)], needed)]
        if not short:
            return list(zip(sides[:count], sides[count:], strict=True))
        redone = tokenized_sides(tokenizer, [texts[index] for index in short], [None] * len(short),
                                 [index < count for index in short])
        for index, side in zip(short, redone, strict=True):
            sides[index] = side
