"""Redirect resolution at corpus scale: chains followed by pointer jumping over joins, cycles dropped and counted.

Full English Wikipedia has ~10M redirects, too many for a side input, so every step is a keyed join.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam

from artifacts.counters import declare, dropped, error, processed
from transforms.dead_letters import count, dead_letter

# Pointer jumping doubles the followed chain length each round: 6 rounds follow chains of up to 64 hops.
JUMP_ROUNDS = 6

COUNTERS = declare(
    processed("redirects_resolved", "redirects resolved to their final target"),
    dropped("redirects_to_missing_articles", "redirects whose target is not an article of the dump"),
    error("redirect_cycles", "redirect chains that loop or exceed 64 hops"),
)


def pick_target(targets: Iterable[str]) -> str:
    """One target per redirect title where sources disagree (dump vs SQL table): the smallest, for determinism."""
    return min(targets)


def jump(title: str, joined: dict[str, list[Any]]) -> Iterator[tuple[str, str]]:
    """One pointer-jumping step for the redirects whose current target is ``title``.

    ``joined["sources"]`` are redirect titles currently pointing at ``title``; ``joined["next"]`` is where
    ``title`` itself redirects (empty if it is not a redirect). Each source moves one step further.
    """
    following = joined["next"]
    destination = following[0] if following else title
    for source in joined["sources"]:
        yield source, destination


def classify_final(target: str, joined: dict[str, list[Any]]) -> Iterator[Any]:
    """After jumping, a redirect that still points at a redirect is in a cycle (or a chain too long): drop it.

    A target that is also an article (a stale redirect row in the SQL table) counts as the article.
    """
    sources = sorted(joined["sources"])
    exists = bool(joined["articles"])
    if joined["redirect_titles"] and not exists:
        for source in sources:
            yield dead_letter("redirect_cycles", "redirect chain loops or is longer than 64 hops",
                              title=source, target=target)
        return
    for source in sources:
        count("redirects_resolved")
        if not exists:
            count("redirects_to_missing_articles")
        yield {"title": source, "target": target, "target_exists": exists}


class ResolveRedirects(beam.PTransform):
    """(title, target) redirect pairs + article titles -> final targets.

    Outputs a dict: ``redirects`` (dicts title/target/target_exists, chains followed, cycles removed) and
    ``dead_letters`` (the cycles).
    """

    def __init__(self, rounds: int = JUMP_ROUNDS) -> None:
        super().__init__()
        self._rounds = rounds

    def expand(self, inputs: dict[str, beam.PCollection]) -> dict[str, beam.PCollection]:
        pairs, article_titles = inputs["pairs"], inputs["article_titles"]
        current = (
            pairs
            | "GroupTargetsPerTitle" >> beam.GroupByKey()
            | "PickOneTarget" >> beam.MapTuple(lambda title, targets: (title, pick_target(targets)))
        )
        for round_number in range(self._rounds):
            current = (
                {
                    "sources": current | f"KeyByTarget{round_number}" >> beam.MapTuple(lambda s, t: (t, s)),
                    "next": current,
                }
                | f"JoinNextHop{round_number}" >> beam.CoGroupByKey()
                | f"Jump{round_number}" >> beam.FlatMapTuple(jump)
            )
        classified = (
            {
                "sources": current | "KeyByFinalTarget" >> beam.MapTuple(lambda s, t: (t, s)),
                "redirect_titles": current | "RedirectTitles" >> beam.MapTuple(lambda s, _t: (s, None)),
                "articles": article_titles | "ArticleTitleKeys" >> beam.Map(lambda title: (title, None)),
            }
            | "JoinFinalTargets" >> beam.CoGroupByKey()
            | "ClassifyFinal" >> beam.FlatMapTuple(classify_final).with_outputs("dead_letter", main="redirects")
        )
        return {"redirects": classified.redirects, "dead_letters": classified.dead_letter}
