"""The FAISS index: index.json reads, every shard loads and agrees with its id map and the index's counts."""

from __future__ import annotations

from typing import Any

import numpy as np

from artifacts import faiss as faiss_shards
from artifacts import layout, tables
from artifacts.errors import InputError
from artifacts.passages import shard_of
from artifacts.run.validation.recorded import MAX_EXAMPLES, RecordedRun, Tally, guarded, int_column, message

INDEX = layout.INDEX
NO_IDS = np.zeros(0, np.int64)


def check_index(run: RecordedRun) -> list[str]:
    """index.json reads; every listed shard loads, fits its id map and the index's dim; the counts add up."""
    index_json = f"{INDEX}/{faiss_shards.INDEX_JSON}"
    if index_json in run.broken:
        return []
    try:
        info = faiss_shards.load_index_info(run.path(INDEX))
    except (InputError, ValueError, TypeError) as error:
        return [f"{index_json}: unreadable ({message(error)})"]
    numbers = {faiss_shards.shard_name(number): number for number in range(info.shards)}
    names = [shard["name"] for shard in info.shard_files]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        return [f"{index_json}: shards listed more than once: {', '.join(repeated[:MAX_EXAMPLES])}"]
    problems = unlisted_files(run, info)  # a shard no passage hashes to is not listed: one left out is recorded
    for shard in info.shard_files:
        problems += check_shard(run, info, shard, numbers.get(shard["name"]))
    listed = sum(shard["count"] for shard in info.shard_files)
    if listed != info.count:
        problems.append(f"{index_json}: count {info.count}, its shards hold {listed}")
    return problems + trained_problems(run, info)


def unlisted_files(run: RecordedRun, info: faiss_shards.IndexInfo) -> list[str]:
    """Recorded files of the index that belong to no shard index.json lists: a search would never read them."""
    own = {f"{INDEX}/{name}" for name in (faiss_shards.INDEX_JSON, faiss_shards.TRAINED_NAME)}
    for shard in info.shard_files:
        own |= {f"{INDEX}/{shard['index']}", f"{INDEX}/{shard['ids']}"}
    stored = f"{INDEX}/{faiss_shards.EMBEDDINGS_DIR}/"
    own |= {f"{stored}{shard['name']}/" for shard in info.shard_files}
    # a shard's stored passages are one entry: its directory (thousands of bucket files at scale)
    entries = {"/".join(path.split("/")[:3]) + "/" if path.startswith(stored) else path
               for path in run.files if path.startswith(f"{INDEX}/")}
    return [f"{entry}: in the manifest, in no shard {INDEX}/{faiss_shards.INDEX_JSON} lists (a search reads none of "
            "it)" for entry in sorted(entries - own)]


def trained_problems(run: RecordedRun, info: faiss_shards.IndexInfo) -> list[str]:
    """trained.faiss is the empty trained index of index.json's factory and dim: a refresh starts its shards from
    it (one of another shape failed every shard)."""
    trained = f"{INDEX}/{faiss_shards.TRAINED_NAME}"
    if trained not in run.files or trained in run.broken:
        return []
    reason = faiss_shards.trained_file_reason(run.path(trained), info.factory, info.dim)
    return [] if reason is None else [f"{trained}: it {reason}"]


def check_passages(run: RecordedRun) -> list[str]:
    """Each passage id once in ``passages/`` (the corpus the index was built from, by id)."""
    files = run.artifact(f"{layout.PASSAGES}/")
    if files is None:
        return []
    found: list[np.ndarray] = []
    problems = [problem for relative in files for problem in
                guarded(relative, lambda relative=relative: found.append(passage_ids([run.path(relative)])))]
    if problems:
        return problems
    tally = Tally()
    tally.add_ids(f"{layout.PASSAGES}/: repeated passage ids", repeated(np.sort(np.concatenate([*found, NO_IDS]))))
    return tally.messages()


def passage_ids(paths: list[str]) -> np.ndarray:
    """The ``passage_id`` column of Parquet files, as one array."""
    return np.concatenate([*(int_column(batch, "passage_id") for batch in
                             tables.iter_file_batches(paths, ["passage_id"])), NO_IDS])


def repeated(ordered: np.ndarray) -> np.ndarray:
    """The values a sorted array holds more than once, once each."""
    return np.unique(ordered[1:][ordered[1:] == ordered[:-1]])


def check_shard(run: RecordedRun, info: faiss_shards.IndexInfo, shard: dict[str, Any],
                number: int | None) -> list[str]:
    index_file, ids_file = f"{INDEX}/{shard['index']}", f"{INDEX}/{shard['ids']}"
    problems = [f"{path}: listed in {INDEX}/{faiss_shards.INDEX_JSON} but not in the manifest"
                for path in (index_file, ids_file) if path not in run.files]
    if number is None:
        problems.append(f"{INDEX}/{faiss_shards.INDEX_JSON}: {shard['name']!r} is not a shard of a "
                        f"{info.shards}-shard index")
    if problems:
        return problems
    ids = None
    if ids_file not in run.broken:
        ids, found = load_id_map(run.path(ids_file), ids_file)
        problems += found
    map_problems = id_map_problems(ids, ids_file, shard["count"], number, info.shards) if ids is not None else []
    problems += map_problems
    if index_file not in run.broken:
        problems += faiss_problems(run.path(index_file), index_file, info.dim, ids, ids_file)
    stored_dir = f"{INDEX}/{faiss_shards.EMBEDDINGS_DIR}/{shard['name']}/"
    stored = run.artifact(stored_dir)
    if stored is not None and run.rows(stored) != shard["count"]:
        problems.append(f"{stored_dir}: {run.rows(stored)} passages, "
                        f"{INDEX}/{faiss_shards.INDEX_JSON} says its shard holds {shard['count']}")
    elif stored is not None and ids is not None and not map_problems:  # a bad map: named once, above
        problems += guarded(stored_dir, lambda: stored_id_problems([run.path(path) for path in stored], ids,
                                                                   stored_dir, ids_file))
    return problems


def stored_id_problems(paths: list[str], ids: np.ndarray, where: str, ids_file: str) -> list[str]:
    """The shard's stored passages are those of its id map, each once: search reads a hit's passage by its id."""
    stored, mapped = np.sort(passage_ids(paths)), np.sort(ids)
    if np.array_equal(stored, mapped):
        return []
    missing, extra = np.setdiff1d(mapped, stored), np.setdiff1d(stored, mapped)
    found = [f"{len(values)} {what} ({', '.join(map(str, values[:MAX_EXAMPLES].tolist()))})"
             for what, values in (("ids of the map not stored", missing), ("stored ids not in the map", extra),
                                  ("ids stored more than once", repeated(stored))) if len(values)]
    return [f"{where}: its passages are not those of {ids_file}: {'; '.join(found)}"]


def load_id_map(path: str, where: str) -> tuple[np.ndarray | None, list[str]]:
    try:
        ids = faiss_shards.read_npy(path)
    except (ValueError, OSError) as error:
        return None, [f"{where}: not a readable .npy file ({message(error)})"]
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
        return [f"{where}: does not load with faiss ({message(error)})"]
    problems = []
    if index.d != dim:
        problems.append(f"{where}: {index.d} dims, {INDEX}/{faiss_shards.INDEX_JSON} says {dim}")
    if ids is not None and index.ntotal != len(ids):
        problems.append(f"{where}: {index.ntotal} vectors, its id map {ids_file} has {len(ids)} ids")
    stored = faiss_shards.stored_ids(index)
    if ids is not None and stored is not None and index.ntotal == len(ids):
        unmapped = np.setdiff1d(stored, ids)
        if len(unmapped) or len(np.unique(stored)) != len(stored):
            shown = ", ".join(map(str, unmapped[:MAX_EXAMPLES].tolist()))
            problems.append(f"{where}: its passage ids are not those of its id map {ids_file} ({len(unmapped)} "
                            f"not in it{': ' + shown if shown else ''})")
    return problems
