"""What the report shows, gathered before the page is written (``build`` fills it, ``page`` renders it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from artifacts import faiss as faiss_shards
from artifacts.run.diff.runs import RunDiff
from artifacts.run.report import gather
from artifacts.run.report.recall import RecallResult


@dataclass
class ReportData:
    """Everything the page shows; a section whose artifact could not be read has a line in ``problems``."""

    output: str
    generated_at: str
    views: list[gather.StageView]
    entities: gather.EntityStats | None = None
    dictionary: gather.DictionaryStats | None = None
    embeddings: gather.EmbeddingStats | None = None
    index_info: faiss_shards.IndexInfo | None = None
    index_files: gather.IndexFiles | None = None
    recall: RecallResult | None = None
    previous: str | None = None  # the previous run this one is compared with
    changes: RunDiff | None = None
    problems: dict[str, str] = field(default_factory=dict)
    plots: dict[str, str] = field(default_factory=dict)  # plot -> PNG file name beside index.html

    def view(self, stage: str) -> gather.StageView | None:
        return next((view for view in self.views if view.name == stage and view.record is not None), None)
