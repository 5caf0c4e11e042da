"""What the report shows, gathered before the page is written (``build`` fills it, ``page`` renders it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from artifacts import faiss as faiss_shards
from artifacts.counters import Counter
from artifacts.run.diff.runs import RunDiff
from artifacts.run.report.dictionary import DictionaryStats
from artifacts.run.report.gather import EmbeddingStats, EntityStats
from artifacts.run.report.recall import RecallResult
from artifacts.run.report.stages import IndexFiles, StageView


@dataclass
class ReportData:
    """Everything the page shows; a section whose artifact could not be read has a line in ``problems``."""

    output: str
    generated_at: str
    views: list[StageView]
    declared: Mapping[str, Mapping[str, Counter]]  # the stages' counter declarations, by stage and counter name
    entities: EntityStats | None = None
    dictionary: DictionaryStats | None = None
    embeddings: EmbeddingStats | None = None
    index_info: faiss_shards.IndexInfo | None = None
    index_files: IndexFiles | None = None
    recall: RecallResult | None = None
    previous: str | None = None  # the previous run this one is compared with
    changes: RunDiff | None = None
    problems: dict[str, str] = field(default_factory=dict)
    stale: list[str] = field(default_factory=list)  # stages built from other upstream outputs than the recorded
    plots: dict[str, str] = field(default_factory=dict)  # plot -> PNG file name beside index.html

    def view(self, stage: str) -> StageView | None:
        return next((view for view in self.views if view.name == stage and view.record is not None), None)
