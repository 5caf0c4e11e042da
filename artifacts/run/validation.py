"""Validation of a run under OUT, for every stage its manifest records (a stage not run is not an error).

Checked: every recorded file is there with its recorded size and sha256; Parquet files open, have the recorded
rows and the contract schema; no unrecorded Parquet file sits in an artifact directory (readers glob them);
no stage was built from other upstream outputs than the recorded ones; entity ids agree across ``entities/``,
``dictionary/names/``, the linker's ``kb_id.trie`` and ``entity_embeddings/``; entity vectors are finite and
have the file's ``target_norm``; FAISS shards load and agree with their id maps and ``index.json``.

Big artifacts are streamed batch by batch and per-entity state is numpy bitmaps (7M entities: a few MB).
A file that already failed a check is not opened again by later ones (a corrupt FAISS file may not be safe to
load), so each corruption is reported once, naming its file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from artifacts import faiss as faiss_shards
from artifacts import fs, layout, schemas
from artifacts.errors import InputError
from artifacts.linker import EntityLinker
from artifacts.passages import shard_of
from artifacts.run import manifest

MAX_EXAMPLES = 5  # example ids per kind of problem: 7M bad rows make one line, not 7M
VECTOR_COLUMN = "embedding"
ENTITIES = f"{layout.ENTITIES}/"
NAMES = f"{layout.NAMES}/"
LINKER = layout.LINKER
EMBEDDINGS = f"{layout.ENTITY_EMBEDDINGS}/"
INDEX = layout.INDEX
# |norm - target| / target allowed: float16 keeps about 3 significant digits per value.
NORM_TOLERANCE = {pa.float32(): 1e-3, pa.float16(): 1e-2}


@dataclass(frozen=True)
class Validation:
    """The stages checked and the problems found (none: the run is valid)."""

    output: str
    stages: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def valid(self) -> bool:
        return not self.problems


def validate_run(output: str) -> list[str]:
    """Human-readable problems of the run under ``output``, each naming its file (empty: valid)."""
    return list(check_run(output).problems)


def check_run(output: str) -> Validation:
    """Validate every stage recorded in ``output``'s manifest."""
    try:
        stages = manifest.load(output)
    except (ValueError, KeyError, TypeError) as error:
        return Validation(output, (), (f"{manifest.MANIFEST_NAME}: unreadable ({error})",))
    if not stages:
        return Validation(output, (), (f"{manifest.MANIFEST_NAME}: missing or empty, no stage has completed "
                                       f"under {output}",))
    run = RecordedRun.of(output, stages)
    problems = stale_stages(stages)
    problems += integrity_problems(run)  # marks the files deeper checks must skip, so it goes first
    problems += parquet_problems(run)
    problems += stray_files(run)
    problems += semantic_problems(run)
    return Validation(output, tuple(sorted(stages)), tuple(problems))


def describe_problems(output: str, problems: list[str], limit: int = 10) -> str:
    """Why a command refuses the run: the first ``limit`` problems, one per line."""
    lines = [f"{output} does not validate ({len(problems)} problem(s)):", *problems[:limit]]
    if len(problems) > limit:
        lines.append(f"... and {len(problems) - limit} more: `python run_pipeline.py validate --output {output}`")
    return "\n  ".join(lines)


@dataclass
class RecordedRun:
    """The files a run's manifest records, and which of them already failed a check."""

    output: str
    stages: dict[str, manifest.StageRecord]
    files: dict[str, manifest.OutputFile]  # path relative to OUT -> its record
    broken: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, output: str, stages: dict[str, manifest.StageRecord]) -> RecordedRun:
        return cls(output, stages, {item.path: item for record in stages.values() for item in record.outputs})

    def path(self, relative: str) -> str:
        return fs.join(self.output, relative)

    def artifact(self, prefix: str) -> list[str] | None:
        """The recorded files under ``prefix`` (relative, sorted); None when one of them already failed."""
        relatives = sorted(path for path in self.files if path.startswith(prefix))
        return None if self.broken.intersection(relatives) else relatives

    def rows(self, relatives: Iterable[str]) -> int:
        return sum(self.files[relative].rows or 0 for relative in relatives)


class Tally:
    """Problems counted by kind, with the first few examples."""

    def __init__(self) -> None:
        self._found: dict[str, tuple[int, list[str]]] = {}

    def add(self, kind: str, count: int, examples: Iterable[Any]) -> None:
        if count:
            seen, kept = self._found.get(kind, (0, []))
            kept += [str(example) for example in list(examples)[:MAX_EXAMPLES - len(kept)]]
            self._found[kind] = (seen + count, kept)

    def add_ids(self, kind: str, ids: np.ndarray) -> None:
        self.add(kind, len(ids), ids[:MAX_EXAMPLES].tolist())

    def messages(self) -> list[str]:
        return [f"{kind}: {count} ({', '.join(kept)}{', ...' if count > len(kept) else ''})"
                for kind, (count, kept) in self._found.items()]


def _message(error: BaseException) -> str:
    text = error.message if isinstance(error, InputError) else str(error)
    return text.strip().splitlines()[-1] if text.strip() else type(error).__name__


def guarded(relative: str, check: Callable[[], list[str] | None]) -> list[str]:
    """Run a check that reads the rows of ``relative``: a file whose footer reads but whose data pages do not is
    one problem, not a crash."""
    try:
        return check() or []
    except (pa.ArrowException, OSError) as error:
        return [f"{relative}: rows cannot be read ({_message(error)})"]


# --- the manifest and the files ------------------------------------------------------------------------------


def stale_stages(stages: dict[str, manifest.StageRecord]) -> list[str]:
    """Stages whose recorded upstream fingerprints are not those of the recorded upstream outputs."""
    problems = []
    for name, record in sorted(stages.items()):
        for key, digest in sorted(record.inputs.items()):
            upstream = key.removeprefix("stage:")
            if upstream == key:
                continue  # an input file outside OUT: not part of the run
            if upstream not in stages:
                problems.append(f"{manifest.MANIFEST_NAME}: stage {name} read stage {upstream}, which is not recorded")
            elif stages[upstream].outputs_digest() != digest:
                problems.append(f"{manifest.MANIFEST_NAME}: stage {name} was built from other {upstream} outputs "
                                f"than the recorded ones: rerun {name}")
    return problems


def integrity_problems(run: RecordedRun) -> list[str]:
    """Recorded files that are missing or differ in size or sha256 from the manifest."""
    problems = []
    for record in run.stages.values():
        found = manifest.missing_or_changed(run.output, record, deep=True)
        problems += found
        run.broken.update(item.path for item in record.outputs
                          if any(problem.startswith(f"{item.path}: ") for problem in found))
    return problems


def parquet_footer(path: str) -> tuple[int, pa.Schema]:
    """Row count and Arrow schema (with its key/value metadata) of one Parquet file, from its footer."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        parquet = pq.ParquetFile(handle)
        return parquet.metadata.num_rows, parquet.schema_arrow


def parquet_problems(run: RecordedRun) -> list[str]:
    """Recorded Parquet files that do not open, have other row counts or break the schema contract."""
    problems = []
    for relative, item in sorted(run.files.items()):
        if not relative.endswith(".parquet") or relative in run.broken:
            continue
        try:
            rows, schema = parquet_footer(run.path(relative))
        except (pa.ArrowException, OSError) as error:
            run.broken.add(relative)
            problems.append(f"{relative}: not a readable Parquet file ({_message(error)})")
            continue
        if item.rows is not None and rows != item.rows:
            problems.append(f"{relative}: {rows} rows, manifest says {item.rows}")
        found = contract_problems(relative, schema)
        if found:
            run.broken.add(relative)  # later checks read these columns
            problems += [f"{relative}: {problem}" for problem in found]
    return problems


def artifact_directory(relative: str) -> str:
    """The artifact directory of a file under OUT (``errors/`` holds one directory per stage)."""
    parts = relative.split("/")
    return "/".join(parts[:2]) if parts[0] == layout.ERRORS and len(parts) > 2 else parts[0]


def stray_files(run: RecordedRun) -> list[str]:
    """Files in a recorded artifact directory that the manifest does not list: readers glob ``*.parquet`` (a
    stale or partial write would be read as part of the artifact), and a published copy would carry the rest."""
    problems = []
    for directory in sorted({artifact_directory(path) for path in run.files if "/" in path}):
        for path in fs.list_tree(run.path(directory)):
            relative = fs.relative(path, run.output)
            if relative not in run.files:
                why = "a stale or partial write" if relative.endswith(".parquet") else "no stage recorded it"
                problems.append(f"{relative}: not in the manifest ({why})")
    return problems


# --- schema contracts ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contract:
    """The columns an artifact's files must have (more are allowed) and, for vectors, the allowed value types
    of the fixed-size ``embedding`` column (its size D comes from the file)."""

    columns: pa.Schema
    vector_types: tuple[pa.DataType, ...] = ()


def _without_vector(schema: pa.Schema) -> pa.Schema:
    return schema.remove(schema.get_field_index(VECTOR_COLUMN))


CONTRACTS: dict[str, Contract] = {
    "articles/": Contract(schemas.ARTICLES),
    "redirects/": Contract(schemas.REDIRECTS),
    ENTITIES: Contract(schemas.ENTITIES),
    NAMES: Contract(schemas.NAMES),
    "mentions/": Contract(schemas.MENTIONS),
    "entity_id_map/": Contract(schemas.ENTITY_ID_MAP),
    EMBEDDINGS: Contract(_without_vector(schemas.entity_embeddings(1)), (pa.float32(), pa.float16())),
    f"{INDEX}/{faiss_shards.EMBEDDINGS_DIR}/": Contract(_without_vector(faiss_shards.embedding_schema(1)),
                                                       (pa.float32(),)),
}


def contract_problems(relative: str, schema: pa.Schema) -> list[str]:
    """How a file's schema breaks the contract of its artifact (none for artifacts without one)."""
    contract = next((item for prefix, item in CONTRACTS.items() if relative.startswith(prefix)), None)
    if contract is None:
        return []
    problems = [column_problem(schema, expected) for expected in contract.columns]
    if contract.vector_types:
        problems.append(vector_problem(schema, contract.vector_types))
    return [problem for problem in problems if problem]


def column_problem(schema: pa.Schema, expected: pa.Field) -> str | None:
    if expected.name not in schema.names:
        return f"column {expected.name} is missing"
    actual = schema.field(expected.name).type
    if actual.equals(expected.type):
        return None
    return f"column {expected.name} is {actual}, the contract says {expected.type}"


def vector_problem(schema: pa.Schema, value_types: tuple[pa.DataType, ...]) -> str | None:
    if VECTOR_COLUMN not in schema.names:
        return f"column {VECTOR_COLUMN} is missing"
    actual = schema.field(VECTOR_COLUMN).type
    if pa.types.is_fixed_size_list(actual) and actual.value_type in value_types and actual.list_size > 0:
        return None
    allowed = " or ".join(str(value_type) for value_type in value_types)
    return f"column {VECTOR_COLUMN} is {actual}, the contract says fixed_size_list<{allowed}>[D]"


# --- entities, names, linker, entity embeddings ---------------------------------------------------------------


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


def semantic_problems(run: RecordedRun) -> list[str]:
    problems: list[str] = []
    entities = None
    if layout.DICTIONARY_STAGE in run.stages:
        entities, found = check_entities(run)
        problems += found + check_names(run)
    if layout.EMBED_ENTITIES_STAGE in run.stages and entities is not None:
        problems += check_embeddings(run, entities)
    if INDEX in run.stages:
        problems += check_index(run)
    return problems


def entity_ids(batch: pa.RecordBatch) -> np.ndarray:
    """The ``entity_id`` column as int64 (a null becomes 0, which no entity has)."""
    return pc.fill_null(batch.column("entity_id"), 0).to_numpy(zero_copy_only=False).astype(np.int64)


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
    for batch in faiss_shards.iter_parquet_batches([path], ["entity_id", "title", "qid"]):
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
        if linker.kb_keys.get(qid or title, -1) + 1 != entity_id:
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
        return None, [f"{LINKER}: does not load ({_message(error)})"]
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
    for batch in faiss_shards.iter_parquet_batches([path], ["entity_id"]):
        ids = entity_ids(batch)
        tally.add_ids(f"{where}: entity ids outside 1..{count}", ids[(ids < 1) | (ids > count)])


def check_embeddings(run: RecordedRun, entities: EntitySet) -> list[str]:
    """entity_embeddings/: ids of entities/, each once, the same title and QID; finite vectors of one
    dimension whose L2 norm is the file's ``target_norm``."""
    files = run.artifact(EMBEDDINGS)
    if files is None:
        return []
    embedded = np.zeros(entities.count + 1, dtype=bool)
    tally, problems = Tally(), []
    for relative in files:
        problems += guarded(relative, partial(scan_embeddings, run.path(relative), relative, entities, embedded,
                                              tally))
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


def scan_embeddings(path: str, where: str, entities: EntitySet, embedded: np.ndarray,
                    tally: Tally) -> list[str]:
    """One embeddings file (its schema already matches the contract)."""
    _, schema = parquet_footer(path)
    norm = target_norm(schema)
    tolerance = NORM_TOLERANCE[schema.field(VECTOR_COLUMN).type.value_type]
    for batch in faiss_shards.iter_parquet_batches([path], ["entity_id", "title", "qid", VECTOR_COLUMN]):
        ids = entity_ids(batch)
        fine = mark_ids(ids, embedded, entities.present, where, tally, "entity ids not in entities/")
        if entities.linker is not None:
            name_mismatches(entities, ids, batch, fine, where, tally)
        vector_problems(batch, ids, norm, tolerance, where, tally)
    return [] if norm is not None else [f"{where}: no positive target_norm in the file metadata"]


def name_mismatches(entities: EntitySet, ids: np.ndarray, batch: pa.RecordBatch, fine: np.ndarray, where: str,
                    tally: Tally) -> None:
    rows = zip(ids.tolist(), batch.column("title").to_pylist(), batch.column("qid").to_pylist(), fine.tolist(),
               strict=True)
    wrong = [entity_id for entity_id, title, qid, checked in rows
             if checked and (title, qid) != entities.title_and_qid(entity_id)]
    tally.add(f"{where}: title or qid differs from entities/", len(wrong), wrong)


def vector_problems(batch: pa.RecordBatch, ids: np.ndarray, norm: float | None, tolerance: float, where: str,
                    tally: Tally) -> None:
    column = batch.column(VECTOR_COLUMN)
    if column.null_count:
        tally.add_ids(f"{where}: null embeddings", ids[column.is_null().to_numpy(zero_copy_only=False)])
        return
    vectors = faiss_shards.table_vectors(batch, VECTOR_COLUMN)
    finite = np.isfinite(vectors).all(axis=1)
    tally.add_ids(f"{where}: vectors with non-finite values", ids[~finite])
    if norm is None:
        return
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    off = np.flatnonzero(finite & (np.abs(norms - norm) > tolerance * norm))
    tally.add(f"{where}: L2 norm differs from target_norm {norm:.6g}", len(off),
              (f"{ids[row]} (norm {norms[row]:.6g})" for row in off[:MAX_EXAMPLES]))


# --- the FAISS index -----------------------------------------------------------------------------------------


def check_index(run: RecordedRun) -> list[str]:
    """index.json reads; every listed shard loads, fits its id map and the index's dim; the counts add up."""
    index_json = f"{INDEX}/{faiss_shards.INDEX_JSON}"
    if index_json in run.broken:
        return []
    try:
        info = faiss_shards.load_index_info(run.path(INDEX))
    except (InputError, ValueError, TypeError) as error:
        return [f"{index_json}: unreadable ({_message(error)})"]
    numbers = {faiss_shards.shard_name(number): number for number in range(info.shards)}
    problems = []
    for shard in info.shard_files:
        problems += check_shard(run, info, shard, numbers.get(shard.get("name", "")))
    listed = sum(int(shard.get("count", 0)) for shard in info.shard_files)
    if listed != info.count:
        problems.append(f"{index_json}: count {info.count}, its shards hold {listed}")
    return problems


def check_shard(run: RecordedRun, info: faiss_shards.IndexInfo, shard: dict[str, Any],
                number: int | None) -> list[str]:
    index_file, ids_file = f"{INDEX}/{shard.get('index')}", f"{INDEX}/{shard.get('ids')}"
    problems = [f"{path}: listed in {INDEX}/{faiss_shards.INDEX_JSON} but not in the manifest"
                for path in (index_file, ids_file) if path not in run.files]
    if number is None:
        problems.append(f"{INDEX}/{faiss_shards.INDEX_JSON}: {shard.get('name')!r} is not a shard of a "
                        f"{info.shards}-shard index")
    if problems:
        return problems
    ids = None
    if ids_file not in run.broken:
        ids, found = load_id_map(run.path(ids_file), ids_file)
        problems += found
    if ids is not None:
        problems += id_map_problems(ids, ids_file, int(shard.get("count", -1)), number, info.shards)
    if index_file not in run.broken:
        problems += faiss_problems(run.path(index_file), index_file, info.dim, ids, ids_file)
    return problems


def load_id_map(path: str, where: str) -> tuple[np.ndarray | None, list[str]]:
    try:
        ids = faiss_shards.read_npy(path)
    except (ValueError, OSError) as error:
        return None, [f"{where}: not a readable .npy file ({_message(error)})"]
    if ids.ndim != 1 or ids.dtype != np.int64:
        return None, [f"{where}: {ids.dtype} array of shape {ids.shape}, expected int64 passage ids"]
    return ids, []


def id_map_problems(ids: np.ndarray, where: str, listed: int, number: int, shards: int) -> list[str]:
    """The id map has the listed count, no repeated id, and only ids that hash to its shard (so no passage id
    can be in two shards: globally unique without holding every shard's ids at once)."""
    problems = []
    if len(ids) != listed:
        problems.append(f"{where}: {len(ids)} ids, {INDEX}/{faiss_shards.INDEX_JSON} says {listed}")
    repeated = len(ids) - len(np.unique(ids))
    if repeated:
        problems.append(f"{where}: {repeated} repeated passage ids")
    elsewhere = [passage_id for passage_id in ids.tolist() if shard_of(passage_id, shards) != number]
    if elsewhere:
        problems.append(f"{where}: {len(elsewhere)} passage ids of other shards "
                        f"({', '.join(map(str, elsewhere[:MAX_EXAMPLES]))})")
    return problems


def faiss_problems(path: str, where: str, dim: int, ids: np.ndarray | None, ids_file: str) -> list[str]:
    try:
        index = faiss_shards.read_index(path)
    except (RuntimeError, InputError) as error:
        return [f"{where}: does not load with faiss ({_message(error)})"]
    problems = []
    if index.d != dim:
        problems.append(f"{where}: {index.d} dims, {INDEX}/{faiss_shards.INDEX_JSON} says {dim}")
    if ids is not None and index.ntotal != len(ids):
        problems.append(f"{where}: {index.ntotal} vectors, its id map {ids_file} has {len(ids)} ids")
    return problems
