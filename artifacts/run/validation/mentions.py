"""``articles/`` holds each page id once; ``mentions/`` rows name entities 1..N and articles of ``articles/``, with
spans inside their text. Per-article state is two sorted numpy arrays (6.7M articles: about 110 MB)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow.compute as pc

from artifacts import layout, tables
from artifacts.run.validation.entities import entity_ids
from artifacts.run.validation.recorded import MAX_EXAMPLES, RecordedRun, Tally, guarded, int_column

ARTICLES = f"{layout.ARTICLES}/"
MENTIONS = f"{layout.MENTIONS}/"
ENTITIES = f"{layout.ENTITIES}/"


@dataclass(frozen=True)
class ArticleLengths:
    """The articles' page ids, sorted, and the length of each one's text (in characters, as spans count)."""

    page_ids: np.ndarray
    lengths: np.ndarray

    def lookup(self, page_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(whether each page id is an article's, its text's length where it is, else 0)."""
        if not len(self.page_ids):
            return np.zeros(len(page_ids), dtype=bool), np.zeros(len(page_ids), dtype=np.int64)
        at = np.minimum(np.searchsorted(self.page_ids, page_ids), len(self.page_ids) - 1)
        found = self.page_ids[at] == page_ids
        return found, np.where(found, self.lengths[at], 0)


def check_articles(run: RecordedRun) -> tuple[ArticleLengths | None, list[str]]:
    """Each page id once in ``articles/``; the articles' lengths for the mentions' check (None: unreadable)."""
    files = run.artifact(ARTICLES)
    if files is None:
        return None, []
    ids: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    problems: list[str] = []
    for relative in files:
        problems += guarded(relative, partial(read_lengths, run.path(relative), ids, lengths))
    if problems:
        return None, problems
    page_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
    order = np.argsort(page_ids, kind="stable")
    page_ids = page_ids[order]
    tally = Tally()
    tally.add_ids(f"{ARTICLES}: repeated page ids", np.unique(page_ids[1:][page_ids[1:] == page_ids[:-1]]))
    joined = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    return ArticleLengths(page_ids, joined[order]), tally.messages()


def read_lengths(path: str, ids: list[np.ndarray], lengths: list[np.ndarray]) -> None:
    for batch in tables.iter_file_batches([path], ["page_id", "text"]):
        ids.append(int_column(batch, "page_id"))
        lengths.append(pc.fill_null(pc.utf8_length(batch.column("text")), 0).to_numpy(
            zero_copy_only=False).astype(np.int64))


def check_mentions(run: RecordedRun, articles: ArticleLengths | None) -> list[str]:
    """mentions/ rows: entity ids 1..N (N: entities/), page ids of articles/ and spans inside their text."""
    files, entity_files = run.artifact(MENTIONS), run.artifact(ENTITIES)
    if files is None or entity_files is None:
        return []
    count, tally, problems = run.rows(entity_files), Tally(), []
    for relative in files:
        problems += guarded(relative, partial(scan_mentions, run.path(relative), relative, count, articles, tally))
    return problems + tally.messages()


def scan_mentions(path: str, where: str, count: int, articles: ArticleLengths | None, tally: Tally) -> None:
    for batch in tables.iter_file_batches([path], ["entity_id", "page_id", "start", "end"]):
        ids = entity_ids(batch)
        tally.add_ids(f"{where}: entity ids outside 1..{count}", ids[(ids < 1) | (ids > count)])
        if articles is None:
            continue
        page_ids = int_column(batch, "page_id")
        found, lengths = articles.lookup(page_ids)
        tally.add_ids(f"{where}: page ids not in {ARTICLES}", page_ids[~found])
        start, end = (int_column(batch, name, null=-1) for name in ("start", "end"))
        outside = found & ((start < 0) | (end <= start) | (end > lengths))
        tally.add(f"{where}: spans outside their article's text", int(outside.sum()),
                  (f"{page} [{first}:{last}]" for page, first, last in zip(
                      *(values[outside][:MAX_EXAMPLES].tolist() for values in (page_ids, start, end)), strict=True)))
