"""Mention sampling: a deterministic bottom-k sample of the links to each entity, and their context windows.

``mentions/`` stores references (page, link, span in the article text, digest of the window); the window itself is
cut again from ``articles/`` at embed time with :func:`mention_window`, so no article text is stored twice."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

# Characters of context kept on each side of a mention per token of --max-seq-length: English WordPiece
# tokens average well under 6 characters, so this leaves room for max_seq_length tokens on either side.
CHARS_PER_TOKEN = 6
# How far a window's edge moves, at most, to leave no word cut (English words are far shorter).
MAX_WORD_CHARS = 32


def sample_key(seed: int, entity_title: str, page_id: int, ordinal: int) -> int:
    """Seeded hash of (entity, source page, ordinal of this link among the page's links to the entity).

    Keyed on the title, not the entity id, so an entity whose links did not change keeps its sample.
    """
    digest = hashlib.blake2b(f"{seed}\x1f{entity_title}\x1f{page_id}\x1f{ordinal}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def link_ordinals(targets: Iterable[str]) -> Iterator[tuple[int, str, int]]:
    """(link index, target, ordinal of this link among the page's links to that target) of a page's links."""
    ordinals: dict[str, int] = {}
    for index, target in enumerate(targets):
        ordinal = ordinals.get(target, 0)
        ordinals[target] = ordinal + 1
        yield index, target, ordinal


def context_window(text: str, start: int, end: int, chars: int) -> tuple[str, int, int]:
    """The text around [start, end) cut to about ``chars`` characters per side; the new span. A cut inside a word
    moves to the word's end (any whitespace: a space, the line break after a list item), inward, unless that is
    more than ``MAX_WORD_CHARS`` away: in text without spaces (Chinese, Japanese) it stays where it is, and the
    cut word lies beyond the tokens kept (it moved to the one ASCII space near the mention: a window of nothing)."""
    left = max(0, start - chars)
    if left > 0 and not text[left - 1].isspace():  # do not start inside a word
        left = next((index + 1 for index in range(left, min(start, left + MAX_WORD_CHARS)) if text[index].isspace()),
                    left)
    right = min(len(text), end + chars)
    if right < len(text) and not text[right].isspace():  # nor end inside one
        right = next((index for index in range(right - 1, max(end, right - MAX_WORD_CHARS) - 1, -1)
                      if text[index].isspace()), right)
    return text[left:right], start - left, end - left


def link_span(link: dict[str, Any]) -> tuple[int, int]:
    """The span of a link's own text in its article: a link trail ("s" of [[lichen]]s) stays outside, as context."""
    return link["start"], link["end"] - (link.get("trail") or 0)


def window_digest(window: str, start: int, end: int) -> bytes:
    """16 bytes that change whenever the model's input would: the window's text and the span inside it."""
    return hashlib.blake2b(f"{start}\x1f{end}\x1f{window}".encode(), digest_size=16).digest()


def mention_ref(entity_id: int, article: dict[str, Any], link_index: int, chars: int) -> dict[str, Any]:
    """The ``mentions/`` row (``schemas.MENTIONS``) of an article's sampled link; ``chars`` as in context_window."""
    start, end = link_span(article["links"][link_index])
    return {"entity_id": entity_id, "page_id": article["page_id"], "link_index": link_index, "start": start,
            "end": end, "window_digest": window_digest(*context_window(article["text"], start, end, chars))}


def mention_window(ref: dict[str, Any], text: str, chars: int) -> dict[str, Any]:
    """The mention to embed of a ``mentions/`` row: its context window cut from the article text ``text``."""
    window, start, end = context_window(text, ref["start"], ref["end"], chars)
    return {"entity_id": ref["entity_id"], "page_id": ref["page_id"], "text": window, "start": start, "end": end}
