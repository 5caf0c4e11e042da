"""embed-entities: the context windows of the sampled mentions, cut from ``articles/`` at embed time.

``mentions/`` holds references into the articles; joining them with the articles by page moves each article's
text through the shuffle once, however many of its links were sampled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam

from artifacts.counters import declare, dropped
from transforms.dead_letters import DEAD_LETTER_TAG, dead_letter
from transforms.mention_sampling import mention_window

COUNTERS = declare(
    dropped("mention_pages_missing", "mentions whose page is not in articles/", dead_lettered=True),
)


def windows_of_page(page_id: int, joined: dict[str, list[Any]], chars: int = 0) -> Iterator[Any]:
    """The mention rows (entity_id, page_id, text, start, end) of one page's refs; refs of a missing page are
    dead-lettered."""
    texts, refs = joined["text"], joined["refs"]
    if not texts:
        for ref in refs:
            yield dead_letter("mention_pages_missing", "the page of a sampled mention is not in articles/",
                              entity_id=ref["entity_id"], page_id=page_id, link_index=ref["link_index"])
        return
    for ref in sorted(refs, key=lambda ref: (ref["link_index"], ref["entity_id"])):
        yield mention_window(ref, texts[0], chars)


class CutMentionWindows(beam.PTransform):
    """``refs`` (mentions/ rows) + ``articles`` (page_id, text) -> mention rows with their context windows of
    about ``chars`` characters per side (main output ``mentions``; ``dead_letter``: refs of missing pages)."""

    def __init__(self, chars: int) -> None:
        super().__init__()
        self._chars = chars

    def expand(self, inputs: dict[str, beam.PCollection]) -> beam.pvalue.DoOutputsTuple:
        return (
            {"refs": inputs["refs"] | "RefsByPage" >> beam.Map(lambda ref: (ref["page_id"], ref)),
             "text": inputs["articles"] | "TextByPage" >> beam.Map(lambda article: (article["page_id"],
                                                                                    article["text"]))}
            | "JoinRefsWithArticles" >> beam.CoGroupByKey()
            | "CutWindows" >> beam.FlatMapTuple(windows_of_page, self._chars).with_outputs(
                DEAD_LETTER_TAG, main="mentions")
        )
