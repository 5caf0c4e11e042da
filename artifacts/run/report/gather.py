"""The report's data, read from the manifest and streamed from the artifacts with bounded memory.

Tables are read batch by batch (``tables.iter_batches``) into numpy aggregates: exact value counts of small
integer columns, fixed-bin histograms, and bounded top-k selections. Nothing holds a whole table as Python
objects, so full Wikipedia (7M entities, millions of names) is fine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from artifacts import faiss as faiss_shards
from artifacts import layout, tables
from artifacts.run.manifest import OutputFile, StageRecord
from artifacts.run.report.stats import Histogram, TopK, ValueCounts

STAGE_ORDER = layout.STAGE_ORDER
BATCH = 65_536  # rows per streamed batch
UNIT_BINS = np.linspace(0.0, 1.0, 51)  # link probability and commonness: 2% bins


# --- stages --------------------------------------------------------------------------------------------------


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
        return layout.STAGE_COMMANDS.get(self.name, self.name.replace("_", "-"))


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
        inputs.append(StageInput(kind, input_name, fingerprint))
    return StageView(name, record, summarize_outputs(written),
                     [item for item in record.outputs if item.path.startswith(errors_prefix)], inputs)


def stage_views(records: dict[str, StageRecord]) -> list[StageView]:
    """Every known stage in pipeline order (run or not), then any other recorded stage."""
    names = [*STAGE_ORDER, *sorted(set(records) - set(STAGE_ORDER))]
    return [stage_view(name, records.get(name)) for name in names]


# --- entities ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopEntity:
    entity_id: int
    title: str
    link_count: int


@dataclass
class EntityStats:
    count: int
    with_qid: int
    link_count_values: np.ndarray  # distinct inbound link counts, ascending
    link_count_entities: np.ndarray  # entities with each of them
    top: list[TopEntity]

    @property
    def total_links(self) -> int:
        return int((self.link_count_values * self.link_count_entities).sum())

    @property
    def without_links(self) -> int:
        return int(self.link_count_entities[self.link_count_values <= 0].sum())

    def quantile(self, q: float) -> int:
        """The inbound link count below which a fraction ``q`` of the entities lie."""
        if not len(self.link_count_values):
            return 0
        cumulative = np.cumsum(self.link_count_entities)
        return int(self.link_count_values[np.searchsorted(cumulative, q * cumulative[-1])])


def entity_stats(output: str, top: int = 15, batch_size: int = BATCH) -> EntityStats:
    """Inbound link counts of ``entities/``: the exact distribution and the most linked entities."""
    distribution = ValueCounts()
    best: TopK[tuple[int, int]] = TopK(top)
    count = with_qid = 0
    for batch in tables.iter_batches(output, layout.ENTITIES, ["entity_id", "title", "qid", "link_count"], batch_size):
        ids = batch.column("entity_id").to_numpy(zero_copy_only=False).astype(np.int64)
        links = batch.column("link_count").to_numpy(zero_copy_only=False).astype(np.int64)
        count += batch.num_rows
        with_qid += batch.num_rows - batch.column("qid").null_count
        distribution.add(links)
        for row in np.lexsort((ids, -links))[:top]:
            key = (-int(links[row]), int(ids[row]))
            if best.worst() is None or key < best.worst():
                best.offer(key, TopEntity(int(ids[row]), batch.column("title")[int(row)].as_py(), int(links[row])))
    values, entities = distribution.result()
    return EntityStats(count, with_qid, values, entities, best.items())


def entity_titles(output: str, entity_ids: set[int]) -> dict[int, str]:
    """Titles of a few entities, by id (one streaming pass over ``entities/``)."""
    wanted = np.fromiter(sorted(entity_ids), dtype=np.int64)
    titles: dict[int, str] = {}
    if not len(wanted):
        return titles
    for batch in tables.iter_batches(output, layout.ENTITIES, ["entity_id", "title"]):
        ids = batch.column("entity_id").to_numpy(zero_copy_only=False).astype(np.int64)
        rows = np.nonzero(np.isin(ids, wanted))[0]
        if len(rows):
            picked = batch.column("title").take(pa.array(rows)).to_pylist()
            titles.update(zip(ids[rows].tolist(), picked, strict=True))
    return titles


# --- dictionary ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    entity_id: int
    title: str
    link_count: int
    commonness: float


@dataclass(frozen=True)
class AmbiguousName:
    name: str
    total_link_count: int
    doc_count: int
    link_prob: float
    candidates: list[Candidate]  # most common first


@dataclass
class DictionaryStats:
    pairs: int
    names: int
    candidates_per_name: np.ndarray  # [c] = names with c candidate entities
    link_prob: Histogram  # one count per name
    commonness: Histogram  # one count per (name, entity) pair
    ambiguous: list[AmbiguousName]

    @property
    def ambiguous_names(self) -> int:
        return int(self.candidates_per_name[2:].sum())


class _MostAmbiguous:
    """The ``k`` names with the best keys (most candidates, then most links, then name) and all their rows.

    A name's rows may be spread over batches and files; its key is the same on every row, so a name that is
    turned away once (or evicted) can never come back, and memory stays at ``k`` names.
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.keys: dict[str, tuple[int, int, str]] = {}
        self.rows: dict[str, list[tuple[int, int, float, int, float]]] = {}

    def worst(self) -> tuple[int, int, str] | None:
        return max(self.keys.values()) if len(self.keys) == self.k else None

    def offer(self, key: tuple[int, int, str], row: tuple[int, int, float, int, float]) -> None:
        name = key[2]
        if name not in self.keys:
            worst = self.worst()
            if worst is not None:
                if key >= worst:
                    return
                del self.keys[worst[2]], self.rows[worst[2]]
            self.keys[name], self.rows[name] = key, []
        self.rows[name].append(row)


def _name_hashes(batch: pa.RecordBatch) -> np.ndarray:
    # Python's string hash: stable within this process, which is all the grouping below needs
    names = batch.column("name").to_pylist()
    return np.fromiter((hash(name) for name in names), dtype=np.int64, count=len(names))


def dictionary_stats(output: str, top: int = 20, batch_size: int = BATCH) -> DictionaryStats:
    """Histograms of ``dictionary/names`` and its most ambiguous names, in two streaming passes.

    Pass 1 counts the rows (candidates) of every name by a 64-bit hash of the name (numpy arrays, one entry per
    name, no Python objects) and takes the commonness histogram. Pass 2 looks each row's candidate count up,
    weights the link probability histogram to one count per name, and keeps the rows of the ``top`` names
    with the most candidates (ties: more links first, then by name).
    """
    per_name = ValueCounts()
    commonness = Histogram(UNIT_BINS)
    pairs = 0
    for batch in tables.iter_batches(output, layout.NAMES, ["name", "commonness"], batch_size):
        pairs += batch.num_rows
        per_name.add(_name_hashes(batch))
        commonness.add(batch.column("commonness").to_numpy(zero_copy_only=False))
    hashes, candidates = per_name.result()
    candidates_per_name = np.bincount(candidates) if len(candidates) else np.zeros(1, np.int64)
    threshold = max(2, int(np.partition(candidates, len(candidates) - top)[len(candidates) - top])
                    if len(candidates) >= top else 2)

    link_prob = Histogram(UNIT_BINS)
    chosen = _MostAmbiguous(top)
    columns = ["name", "entity_id", "link_count", "total_link_count", "doc_count", "link_prob", "commonness"]
    for batch in tables.iter_batches(output, layout.NAMES, columns, batch_size):
        row_candidates = candidates[np.searchsorted(hashes, _name_hashes(batch))]
        values = {column: batch.column(column).to_numpy(zero_copy_only=False) for column in columns[1:]}
        link_prob.add(values["link_prob"], weights=1.0 / row_candidates)
        keep = row_candidates >= threshold
        worst = chosen.worst()
        if worst is not None:  # cheap vectorized pre-filter: rows that cannot beat the worst kept name
            keep &= (-row_candidates < worst[0]) | ((-row_candidates == worst[0]) &
                                                     (-values["total_link_count"] <= worst[1]))
        rows = np.nonzero(keep)[0]
        names = batch.column("name").take(pa.array(rows)).to_pylist() if len(rows) else []
        for row, name in zip(rows.tolist(), names, strict=True):
            key = (-int(row_candidates[row]), -int(values["total_link_count"][row]), name)
            chosen.offer(key, (int(values["entity_id"][row]), int(values["link_count"][row]),
                               float(values["commonness"][row]), int(values["doc_count"][row]),
                               float(values["link_prob"][row])))
    ambiguous = _ambiguous_names(output, chosen)
    return DictionaryStats(pairs, len(hashes), candidates_per_name, link_prob, commonness, ambiguous)


def _ambiguous_names(output: str, chosen: _MostAmbiguous) -> list[AmbiguousName]:
    titles = entity_titles(output, {row[0] for rows in chosen.rows.values() for row in rows})
    result = []
    for key in sorted(chosen.keys.values()):
        rows = chosen.rows[key[2]]
        candidates = sorted((Candidate(entity_id, titles.get(entity_id, f"#{entity_id}"), link_count, common)
                             for entity_id, link_count, common, _, _ in rows),
                            key=lambda candidate: (-candidate.commonness, -candidate.link_count,
                                                   candidate.entity_id))
        result.append(AmbiguousName(key[2], -key[1], rows[0][3], rows[0][4], candidates))
    return result


# --- entity embeddings ---------------------------------------------------------------------------------------


@dataclass
class EmbeddingStats:
    count: int
    dim: int
    value_type: str  # of the stored values (float32, float16)
    metadata: dict[str, str]  # of the first file: model, layer, target_norm, dtype, ...
    norms: np.ndarray  # float32, one per entity (4 bytes each: 28 MB for 7M entities)
    mentions_per_entity: np.ndarray  # [m] = entities embedded from m mentions

    @property
    def target_norm(self) -> float | None:
        try:
            return float(self.metadata["target_norm"])
        except (KeyError, ValueError):
            return None


def embedding_stats(output: str) -> EmbeddingStats:
    """Norms of the stored entity vectors and the mentions each was averaged over."""
    files = tables.parquet_files(output, layout.ENTITY_EMBEDDINGS)
    metadata = tables.file_metadata(files[0])
    norms: list[np.ndarray] = []
    mentions = np.zeros(1, dtype=np.int64)
    dim, value_type = 0, ""
    for batch in tables.iter_batches(output, layout.ENTITY_EMBEDDINGS, ["embedding", "mention_count"], 16384):
        column = batch.column("embedding")
        dim, value_type = column.type.list_size, str(column.type.value_type)
        norms.append(np.linalg.norm(faiss_shards.table_vectors(batch), axis=1).astype(np.float32))
        counts = np.bincount(batch.column("mention_count").to_numpy(zero_copy_only=False).astype(np.int64))
        if len(counts) > len(mentions):
            mentions = np.pad(mentions, (0, len(counts) - len(mentions)))
        mentions[:len(counts)] += counts
    all_norms = np.concatenate(norms) if norms else np.zeros(0, np.float32)
    return EmbeddingStats(len(all_norms), dim, value_type, metadata, all_norms, mentions)


# --- the index -----------------------------------------------------------------------------------------------


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
