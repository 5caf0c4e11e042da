"""The dictionary's first read of the articles: every anchor (name, target) pair and every page's inbound links,
summed per bucket in the worker that read them (name buckets for pairs, title buckets for targets and pages) and
spilled to part files; unusable anchor texts counted or dead-lettered."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from artifacts.counters import declare, dropped, error
from artifacts.names import NameRules, name_problem, normalize_name, title_name
from transforms.common.dead_letters import DEAD_LETTER_TAG, count, dead_letter
from transforms.common.spill import SpillAndGroup
from transforms.dictionary.arrow_combine import bucketed_sums, summed_by
from transforms.dictionary.tables import PAIR_KEYS, PAIR_VALUES, TARGET_KEYS, TARGET_VALUES, LinkTally

BATCH_ROWS = 1 << 16  # rows a worker gathers before summing them into per-bucket tables
PAIRS_TAG, TARGETS_TAG = "pairs", "targets"

COUNTERS = declare(
    error("empty_names", "anchors with empty text"),
    error("names_with_control_characters", "anchors with control characters"),
    dropped("names_too_long", "anchors longer than --max-mention-length"),
)


def counted_links(article: dict[str, Any], bold_self_links: bool) -> list[dict[str, Any]]:
    """The links of an article the dictionary counts: all, but its links to itself where those are its bold name
    (parse's --first-bold-as-link)."""
    links = article["links"]
    return [link for link in links if link["target"] != article["title"]] if bold_self_links else links


def anchor_names(article: dict[str, Any], rules: NameRules,
                 links: list[dict[str, Any]]) -> Iterator[tuple[str, str] | beam.pvalue.TaggedOutput]:
    """(name, target) for every link of ``links`` (an article's counted links) and once for the article's own title
    minus ``(...)``; unusable anchor texts are counted (too long) or dead-lettered."""
    text = article["text"]
    sources = [(text[link["start"]:link["end"]], link["target"]) for link in links]
    sources.append((title_name(article["title"]), article["title"]))
    for raw, target in sources:
        name = normalize_name(raw, rules)
        problem = name_problem(name, rules)
        if problem is None:
            yield name, target
        elif problem == "names_too_long":
            count(problem)  # long anchors are common (whole sentences linked); counted, not dead-lettered
        else:
            yield dead_letter(problem, "unusable anchor text", page_id=article["page_id"], anchor=raw[:200])


def in_global_window(output: beam.pvalue.TaggedOutput) -> beam.pvalue.TaggedOutput:
    """An output of ``finish_bundle`` (which must carry its window)."""
    return beam.pvalue.TaggedOutput(output.tag, GlobalWindows.windowed_value(output.value))


class TallyLinks(beam.DoFn):
    """Articles -> tagged (bucket, table): anchor pairs by name bucket, link targets and pages by title bucket,
    each batch summed first; plus dead letters."""

    def __init__(self, rules: NameRules, buckets: int, bold_self_links: bool, batch_rows: int = BATCH_ROWS) -> None:
        self._rules, self._buckets, self._batch_rows = rules, buckets, batch_rows
        self._bold_self_links = bold_self_links

    def start_bundle(self) -> None:
        self._tally = LinkTally()

    def process(self, article: dict[str, Any]) -> Iterator[beam.pvalue.TaggedOutput]:
        links = counted_links(article, self._bold_self_links)
        for item in anchor_names(article, self._rules, links):
            if isinstance(item, beam.pvalue.TaggedOutput):
                yield item
            else:
                self._tally.add_pair(*item)
        self._tally.add_page(article["title"], article["page_id"], article["qid"], [link["target"] for link in links])
        if self._tally.rows >= self._batch_rows:
            yield from self._flush()

    def finish_bundle(self) -> Iterator[beam.pvalue.TaggedOutput]:
        yield from map(in_global_window, self._flush())

    def _flush(self) -> Iterator[beam.pvalue.TaggedOutput]:
        tally, self._tally = self._tally, LinkTally()
        if not tally.rows:
            return
        for bucket, table in bucketed_sums(tally.pair_table(), PAIR_KEYS, PAIR_VALUES, "name", self._buckets):
            yield beam.pvalue.TaggedOutput(PAIRS_TAG, (bucket, table))
        for bucket, table in bucketed_sums(tally.target_table(), TARGET_KEYS, TARGET_VALUES, "title",
                                           self._buckets):
            yield beam.pvalue.TaggedOutput(TARGETS_TAG, (bucket, table))


class SumLinksPerBucket(beam.PTransform):
    """Articles -> {"pairs": (name bucket, parts of its pair sums), "targets": (title bucket, parts of its target
    sums), "dead_letters"}; the parts are spilled under ``pair_parts`` and ``target_parts``."""

    def __init__(self, rules: NameRules, buckets: int, pair_parts: str, target_parts: str,
                 bold_self_links: bool = False) -> None:
        super().__init__()
        self._rules, self._buckets, self._bold_self_links = rules, buckets, bold_self_links
        self._pair_parts, self._target_parts = pair_parts, target_parts

    def expand(self, articles: beam.PCollection) -> dict[str, beam.PCollection]:
        tally = TallyLinks(self._rules, self._buckets, self._bold_self_links)
        tallied = articles | "TallyLinks" >> beam.ParDo(tally).with_outputs(PAIRS_TAG, TARGETS_TAG, DEAD_LETTER_TAG)
        return {
            "pairs": tallied[PAIRS_TAG] | "SumPairs" >> SpillAndGroup(self._pair_parts,
                                                                      summed_by(PAIR_KEYS, PAIR_VALUES)),
            "targets": tallied[TARGETS_TAG] | "SumTargets" >> SpillAndGroup(self._target_parts,
                                                                            summed_by(TARGET_KEYS, TARGET_VALUES)),
            "dead_letters": tallied[DEAD_LETTER_TAG],
        }
