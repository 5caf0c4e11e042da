"""The stages as the manifest records them: what each read and wrote, its dead letters, and the index's files."""

from __future__ import annotations

from dataclasses import dataclass, field

from artifacts import faiss as faiss_shards
from artifacts import layout
from artifacts.run.manifest import STAGE_INPUT, OutputFile, StageRecord, stage_read

STAGE_ORDER = layout.STAGE_ORDER


@dataclass(frozen=True)
class ArtifactSummary:
    """The files of one artifact directory a stage wrote (e.g. ``dictionary/names``)."""

    name: str
    files: int
    rows: int | None  # None: no Parquet file (tries, arrays, FAISS files)
    bytes: int


@dataclass(frozen=True)
class StageInput:
    kind: str  # "stage" (an upstream stage's outputs) or "file" (an input fingerprinted by the stage)
    name: str
    fingerprint: str
    artifacts: tuple[str, ...] = ()  # of a stage: those read, where not all
    source: str = ""  # of a file: its path as recorded (none in a record from before they were)


@dataclass
class StageView:
    """One stage as the manifest records it (``record`` is None when the stage has not run)."""

    name: str
    record: StageRecord | None
    artifacts: list[ArtifactSummary] = field(default_factory=list)
    dead_letters: list[OutputFile] = field(default_factory=list)
    inputs: list[StageInput] = field(default_factory=list)

    @property
    def command(self) -> str:
        return layout.command_of(self.name)


def artifact_of(path: str) -> str:
    """The artifact directory of an output file: its folder, at most two levels deep."""
    folders = path.split("/")[:-1]
    return "/".join(folders[:2]) if folders else path


def summarize_outputs(outputs: list[OutputFile]) -> list[ArtifactSummary]:
    grouped: dict[str, list[OutputFile]] = {}
    for item in outputs:
        grouped.setdefault(artifact_of(item.path), []).append(item)
    summaries = []
    for name, items in grouped.items():
        counted = [item.rows for item in items if item.rows is not None]
        summaries.append(ArtifactSummary(name, len(items), sum(counted) if counted else None,
                                         sum(item.bytes for item in items)))
    return summaries


def stage_view(name: str, record: StageRecord | None) -> StageView:
    if record is None:
        return StageView(name, None)
    errors_prefix = f"{layout.errors_of(name)}/"
    written = [item for item in record.outputs if not item.path.startswith(errors_prefix)]
    inputs = []
    for key, fingerprint in sorted(record.inputs.items()):
        kind, _, input_name = key.partition(":")
        input_name, artifacts = stage_read(key) if key.startswith(STAGE_INPUT) else (input_name, ())
        inputs.append(StageInput(kind, input_name, fingerprint, artifacts, record.sources.get(input_name, "")))
    return StageView(name, record, summarize_outputs(written),
                     [item for item in record.outputs if item.path.startswith(errors_prefix)], inputs)


def stage_views(records: dict[str, StageRecord]) -> list[StageView]:
    """Every known stage in pipeline order (run or not), then any other recorded stage."""
    names = [*STAGE_ORDER, *sorted(set(records) - set(STAGE_ORDER))]
    return [stage_view(name, records.get(name)) for name in names]




@dataclass(frozen=True)
class IndexFiles:
    """Bytes on disk of the index stage's ``index/`` files, by role (from the manifest)."""

    faiss: int
    id_maps: int
    embeddings: int
    other: int

    @property
    def total(self) -> int:
        return self.faiss + self.id_maps + self.embeddings + self.other


def index_files(record: StageRecord) -> IndexFiles:
    faiss = id_maps = embeddings = other = 0
    for item in record.outputs:
        if not item.path.startswith("index/"):
            continue
        if item.path.endswith(".faiss"):
            faiss += item.bytes
        elif item.path.endswith(".ids.npy"):
            id_maps += item.bytes
        elif item.path.startswith(f"index/{faiss_shards.EMBEDDINGS_DIR}/"):
            embeddings += item.bytes
        else:
            other += item.bytes
    return IndexFiles(faiss, id_maps, embeddings, other)
