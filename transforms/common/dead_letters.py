"""Counting and dead-lettering: nothing is dropped without a Beam counter, odd input also goes to OUT/errors/."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

COUNTER_NAMESPACE = "kpr"
DEAD_LETTER_TAG = "dead_letter"


def count(name: str, value: int = 1) -> None:
    """Increment the pipeline counter ``name`` (collected into the manifest at the end of the stage)."""
    Metrics.counter(COUNTER_NAMESPACE, name).inc(value)


def count_some(name: str, value: int) -> None:
    """``count`` unless ``value`` is 0: a counter that nothing counted stays out of the manifest (as a per-item
    counter would) when a step counts many items at once."""
    if value:
        count(name, value)


def count_fields(counts: Any) -> None:
    """``count_some`` for every field of the dataclass ``counts``, each field named as its counter."""
    for field in fields(counts):
        count_some(field.name, getattr(counts, field.name))


def dead_letter(kind: str, reason: str, **fields: Any) -> beam.pvalue.TaggedOutput:
    """A tagged output record for ``OUT/errors/``; also counts it as ``kind``."""
    count(kind)
    return beam.pvalue.TaggedOutput(DEAD_LETTER_TAG, {"kind": kind, "reason": reason, **fields})


def _to_json_line(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, ensure_ascii=False, default=str)


class WriteDeadLetters(beam.PTransform):
    """Write dead-letter records as JSON lines under ``prefix`` (one file even when there are none)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix

    def expand(self, records: beam.PCollection) -> beam.pvalue.PDone:
        return (
            records
            | "ToJsonLine" >> beam.Map(_to_json_line)
            | "WriteJsonLines" >> beam.io.WriteToText(self._prefix, file_name_suffix=".jsonl", num_shards=1)
        )
