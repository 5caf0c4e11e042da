"""Entity ids agree across ``entities/``, ``dictionary/names/``, the linker and ``entity_embeddings/``; entity
vectors are finite, have the file's ``target_norm`` and are not all the same. Per-entity state is numpy bitmaps
(7M entities: a few MB)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from artifacts import faiss as faiss_shards
from artifacts import layout, tables
from artifacts.errors import InputError
from artifacts.linker import EntityLinker
from artifacts.run.validation.recorded import (
    MAX_EXAMPLES,
    VECTOR_COLUMN,
    RecordedRun,
    Tally,
    guarded,
    int_column,
    message,
    parquet_footer,
)

ENTITIES = f"{layout.ENTITIES}/"
NAMES = f"{layout.NAMES}/"
LINKER = layout.LINKER
EMBEDDINGS = f"{layout.ENTITY_EMBEDDINGS}/"
# |norm - target| / target allowed: float16 keeps about 3 significant digits per value.
NORM_TOLERANCE = {pa.float32(): 1e-3, pa.float16(): 1e-2}
# Vectors closer than this (relative to the largest value of the first) count as the same: those of entities whose
# inputs are all [CLS] [MASK] [SEP] differ only by the rounding of batches of other shapes.
SAME_VECTOR_TOLERANCE = 1e-3


@dataclass
class EntitySet:
    """What the checks need of ``entities/``: N, and bitmaps of the ids seen and of those with a QID."""

    count: int
    present: np.ndarray  # bool[count + 1]
    has_qid: np.ndarray  # bool[count + 1]
    linker: EntityLinker | None  # None: not loadable or not the size of entities/ (reported)

    def title_and_qid(self, entity_id: int) -> tuple[str, str | None]:
        """Title and QID of an entity as the linker stores them (titles.bin and kb_id.trie)."""
        assert self.linker is not None
        key = self.linker.kb_keys.restore_key(entity_id - 1)
        return self.linker.title(entity_id - 1), key if self.has_qid[entity_id] else None


def entity_ids(batch: pa.RecordBatch) -> np.ndarray:
    """The ``entity_id`` column as int64 (a null becomes 0, which no entity has)."""
    return int_column(batch, "entity_id")


def mark_ids(ids: np.ndarray, seen: np.ndarray, allowed: np.ndarray, where: str, tally: Tally,
             outside: str) -> np.ndarray:
    """Set ``ids`` in the bitmap ``seen``; tally ids not ``allowed`` (as ``outside``) and repeated ones.
    Returns the mask of rows whose id is allowed and seen for the first time."""
    in_range = (ids >= 1) & (ids < len(seen))
    known = in_range.copy()
    known[in_range] = allowed[ids[in_range]]
    tally.add_ids(f"{where}: {outside}", ids[~known])
    candidates = np.flatnonzero(known)
    _, first_in_batch = np.unique(ids[candidates], return_index=True)
    first = np.zeros(len(ids), dtype=bool)
    first[candidates[first_in_batch]] = True
    first &= ~seen[np.where(known, ids, 0)]
    tally.add_ids(f"{where}: repeated entity ids", ids[known & ~first])
    seen[ids[first]] = True
    return first


def check_entities(run: RecordedRun) -> tuple[EntitySet | None, list[str]]:
    """entities/ ids are exactly 1..N and agree with the linker: key id + 1 == entity_id, same title."""
    files = run.artifact(ENTITIES)
    if files is None:
        return None, []
    count = run.rows(files)
    linker, problems = load_linker(run, count)
    entities = EntitySet(count, np.zeros(count + 1, bool), np.zeros(count + 1, bool), linker)
    tally, unreadable = Tally(), []
    for relative in files:
        unreadable += guarded(relative, partial(scan_entities, run.path(relative), relative, entities, tally))
    # with rows missing, every later id check would only repeat that
    return (None if unreadable else entities), problems + unreadable + tally.messages()


def scan_entities(path: str, where: str, entities: EntitySet, tally: Tally) -> None:
    everything = np.ones(entities.count + 1, dtype=bool)
    for batch in tables.iter_file_batches([path], ["entity_id", "title", "qid"]):
        ids = entity_ids(batch)
        fine = mark_ids(ids, entities.present, everything, where, tally, f"entity ids outside 1..{entities.count}")
        entities.has_qid[ids[fine]] = pc.is_valid(batch.column("qid")).to_numpy(zero_copy_only=False)[fine]
        if entities.linker is not None:
            linker_mismatches(entities.linker, ids, batch, fine, where, tally)


def linker_mismatches(linker: EntityLinker, ids: np.ndarray, batch: pa.RecordBatch, fine: np.ndarray,
                      where: str, tally: Tally) -> None:
    """Entities whose key (QID, else title) is not key ``entity_id - 1`` of kb_id.trie, or whose title is
    not the linker's."""
    wrong_keys, wrong_titles = [], []
    rows = zip(ids.tolist(), batch.column("title").to_pylist(), batch.column("qid").to_pylist(), fine.tolist(),
               strict=True)
    for entity_id, title, qid, checked in rows:
        if not checked:
            continue
        if (qid or title) is None or linker.kb_keys.get(qid or title, -1) + 1 != entity_id:  # None: no key
            wrong_keys.append(entity_id)
        elif linker.title(entity_id - 1) != title:
            wrong_titles.append(entity_id)
    tally.add(f"{where}: entities whose key (QID, else title) is not id entity_id - 1 in {LINKER}/kb_id.trie",
              len(wrong_keys), wrong_keys)
    tally.add(f"{where}: entities whose title differs in {LINKER}/titles.bin", len(wrong_titles), wrong_titles)


def load_linker(run: RecordedRun, count: int) -> tuple[EntityLinker | None, list[str]]:
    """The linker, if it loads and its key trie, titles and candidate rows fit N entities."""
    if run.artifact(LINKER + "/") is None:
        return None, []
    try:
        linker = EntityLinker.load(run.path(LINKER))
    except (InputError, OSError, ValueError, RuntimeError, KeyError) as error:
        return None, [f"{LINKER}: does not load ({message(error)})"]
    sizes = {"kb_id.trie": (len(linker.kb_keys), "keys"),
             "title_offsets.npy": (len(linker.title_offsets) - 1, "titles")}
    problems = [f"{LINKER}/{name}: {size} {what}, entities/ has {count} entities"
                for name, (size, what) in sizes.items() if size != count]
    beyond = int(np.count_nonzero(linker.data[:, 0] >= count)) if len(linker.data) else 0
    if beyond:
        problems.append(f"{LINKER}/data.npy: {beyond} candidate rows name a kb index beyond the {count} entities")
    return (None if problems else linker), problems


def check_names(run: RecordedRun) -> list[str]:
    """dictionary/names/ rows name entities 1..N."""
    entity_files, files = run.artifact(ENTITIES), run.artifact(NAMES)
    if entity_files is None or files is None:
        return []
    count = run.rows(entity_files)
    tally, problems = Tally(), []
    for relative in files:
        problems += guarded(relative, partial(scan_names, run.path(relative), relative, count, tally))
    return problems + tally.messages()


def scan_names(path: str, where: str, count: int, tally: Tally) -> None:
    for batch in tables.iter_file_batches([path], ["entity_id"]):
        ids = entity_ids(batch)
        tally.add_ids(f"{where}: entity ids outside 1..{count}", ids[(ids < 1) | (ids > count)])


def check_embeddings(run: RecordedRun, entities: EntitySet) -> list[str]:
    """entity_embeddings/: ids of entities/, each once, the same title and QID; finite vectors of one
    dimension whose L2 norm is the file's ``target_norm``."""
    files = run.artifact(EMBEDDINGS)
    if files is None:
        return []
    embedded = np.zeros(entities.count + 1, dtype=bool)
    tally, problems, spread = Tally(), [], Spread()
    for relative in files:
        problems += guarded(relative, partial(scan_embeddings, run.path(relative), relative, entities, embedded,
                                              tally, spread))
    if spread.rows > 1 and not spread.differs:
        problems.append(f"{EMBEDDINGS}: all {spread.rows} vectors are the same: the embeddings tell no entity from "
                        "another (mentions embedded without context?)")
    dims = {relative: parquet_footer(run.path(relative))[1].field(VECTOR_COLUMN).type.list_size
            for relative in files}
    if len(set(dims.values())) > 1:
        problems.append(f"{EMBEDDINGS}: vectors of different dimensions: "
                        + ", ".join(f"{relative} {dim}" for relative, dim in dims.items()))
    return problems + tally.messages()


def target_norm(schema: pa.Schema) -> float | None:
    """The ``target_norm`` of an embeddings file's metadata (None if missing or not a positive number)."""
    raw = (schema.metadata or {}).get(b"target_norm")
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and np.isfinite(value) and value > 0 else None


@dataclass
class Spread:
    """Whether the vectors of a table differ at all: the first vector, kept to compare every later one with."""

    first: np.ndarray | None = None
    rows: int = 0
    differs: bool = False

    def add(self, vectors: np.ndarray) -> None:
        if not len(vectors):
            return
        if self.first is None:
            self.first = vectors[0].astype(np.float64)
        self.rows += len(vectors)
        if not self.differs:
            scale = max(float(np.abs(self.first).max()), np.finfo(np.float32).tiny)
            self.differs = bool((np.abs(vectors - self.first) > SAME_VECTOR_TOLERANCE * scale).any())


def scan_embeddings(path: str, where: str, entities: EntitySet, embedded: np.ndarray,
                    tally: Tally, spread: Spread) -> list[str]:
    """One embeddings file (its schema already matches the contract)."""
    _, schema = parquet_footer(path)
    norm = target_norm(schema)
    tolerance = NORM_TOLERANCE[schema.field(VECTOR_COLUMN).type.value_type]
    for batch in tables.iter_file_batches([path], ["entity_id", "title", "qid", VECTOR_COLUMN]):
        ids = entity_ids(batch)
        fine = mark_ids(ids, embedded, entities.present, where, tally, "entity ids not in entities/")
        if entities.linker is not None:
            name_mismatches(entities, ids, batch, fine, where, tally)
        vector_problems(batch, ids, norm, tolerance, where, tally, spread)
    return [] if norm is not None else [f"{where}: no positive target_norm in the file metadata"]


def name_mismatches(entities: EntitySet, ids: np.ndarray, batch: pa.RecordBatch, fine: np.ndarray, where: str,
                    tally: Tally) -> None:
    rows = zip(ids.tolist(), batch.column("title").to_pylist(), batch.column("qid").to_pylist(), fine.tolist(),
               strict=True)
    wrong = [entity_id for entity_id, title, qid, checked in rows
             if checked and (title, qid) != entities.title_and_qid(entity_id)]
    tally.add(f"{where}: title or qid differs from entities/", len(wrong), wrong)


def vector_problems(batch: pa.RecordBatch, ids: np.ndarray, norm: float | None, tolerance: float, where: str,
                    tally: Tally, spread: Spread) -> None:
    column = batch.column(VECTOR_COLUMN)
    if column.null_count:
        tally.add_ids(f"{where}: null embeddings", ids[column.is_null().to_numpy(zero_copy_only=False)])
        return
    vectors = faiss_shards.table_vectors(batch, VECTOR_COLUMN)
    finite = np.isfinite(vectors).all(axis=1)
    spread.add(vectors[finite])
    tally.add_ids(f"{where}: vectors with non-finite values", ids[~finite])
    if norm is None:
        return
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    off = np.flatnonzero(finite & (np.abs(norms - norm) > tolerance * norm))
    tally.add(f"{where}: L2 norm differs from target_norm {norm:.6g}", len(off),
              (f"{ids[row]} (norm {norms[row]:.6g})" for row in off[:MAX_EXAMPLES]))

