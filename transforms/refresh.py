"""Dump refreshes: which passage vectors of a previous run can be taken as they are, and what makes a previous
run's options differ (entity vectors: transforms/entity_refresh.py).

A passage's vector is a function of its id, title and text and the encoder, so an unchanged passage keeps its old
vector. Everything else is encoded again; the split below is a thin Beam adapter over a pure function.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import apache_beam as beam

from transforms.dead_letters import count

RUNTIME_OPTIONS = ("previous", "previous_manifest_sha256", "require_reuse")


def option_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``name: old -> new`` for every recorded option that differs (runtime-only options are ignored)."""
    names = sorted((set(old) | set(new)) - set(RUNTIME_OPTIONS))
    return [f"{name}: {old.get(name)!r} -> {new.get(name)!r}" for name in names if old.get(name) != new.get(name)]


# --- passages ------------------------------------------------------------------------------------------------


def passage_decision(passage_id: int, joined: dict[str, list[Any]]) -> Iterator[Any]:
    """A new passage whose title and text are unchanged: its old row (tagged ``reused``); else the passage."""
    olds = joined["old"]
    for passage in joined["new"]:
        old = olds[0] if len(olds) == 1 else None
        if old is not None and old["title"] == passage.title and old["text"] == passage.text:
            count("passages_reused")
            yield beam.pvalue.TaggedOutput("reused", old)
        else:
            yield passage


class SplitPassagesForRefresh(beam.PTransform):
    """Passages + the previous run's vector rows (passage_id, title, text, embedding) -> ``encode`` (new or
    changed passages) and ``reused`` (old rows of unchanged passages); removed passages are dropped."""

    def expand(self, inputs: dict[str, beam.PCollection]) -> dict[str, beam.PCollection]:
        decided = ({"new": inputs["passages"] | "KeyPassages" >> beam.Map(lambda p: (p.passage_id, p)),
                    "old": inputs["old_vectors"] | "KeyOldVectors" >> beam.Map(lambda r: (r["passage_id"], r))}
                   | "JoinById" >> beam.CoGroupByKey()
                   | "Decide" >> beam.FlatMapTuple(passage_decision).with_outputs("reused", main="encode"))
        return {"encode": decided.encode, "reused": decided.reused}
