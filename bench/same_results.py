"""Whether two runs hold the same artifacts: every artifact the manifests list, each stage's dead letters by kind
and the stages' counters.

For checking that a change of the pipeline's graph leaves every result as it was:

    python -m bench.same_results OLD_OUT NEW_OUT [--ignore-counter NAME ...] [--ignore-metadata KEY ...]
        [--ignore-column NAME ...] [--ignore-artifact NAME ...]

Parquet artifacts compare their schema (column names and types), their files' metadata (each distinct one) and
their rows after sorting (row order and the split into files are no difference); FAISS shards
their (id, vector) pairs, the ids the index returns and ``index.json``; other files (the linker) byte for byte. A
file the manifest lists that cannot be read is a difference, not a traceback. Prints one line per artifact of each
stage the new run recorded (``same`` or what differs), one line per stage only the old run recorded (not compared:
the new run may have run fewer), and exits 1 when anything differs, 2 when a run has no manifest.

Runs of two checkouts read the model at two paths, which the runs record (``model``, nested in ``index.json`` too):
``--ignore-metadata model``. The stored windows of embed-entities are keyed by the model's content
(``kpr_store_salt``, ``window_key``); runs of two versions that key them apart compare by their vectors with
``--ignore-metadata kpr_store_salt --ignore-column window_key``. A resumed or
refreshed run reaches the same results with other work: ``--ignore-counter mentions_encoded mentions_reused
passages_encoded passages_reused passages_cut`` (the passages cut of those it encoded); a refresh compared with a
run from scratch also ``entities_reused entities_recomputed`` and ``--ignore-artifact entity_id_map`` (what it
maps from its previous run). A run of another
``--shards`` differs in ``shards_built`` and in its shards, which hold the same vectors under another split of the
ids.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from artifacts import layout
from artifacts.run.report.stages import artifact_of

MAX_SHOWN = 3
INDEX = "index"
# What reading a damaged or missing file raises: a difference to report, not a crash.
UNREADABLE = (OSError, RuntimeError, ValueError, pa.ArrowException)
NOT_COMPARED = "not in the new run: not compared"


@dataclass(frozen=True)
class Ignored:
    """What is not compared: counters by name, metadata keys (Parquet's, and index.json's fields at any depth),
    Parquet columns by name and artifacts by name."""

    counters: frozenset[str] = frozenset()
    metadata: frozenset[str] = frozenset()
    columns: frozenset[str] = frozenset()
    artifacts: frozenset[str] = frozenset()


def recorded_stages(run: Path) -> dict[str, dict[str, Any]]:
    """The stage records of a run's manifest, as JSON."""
    return json.loads((run / "manifest.json").read_text())["stages"]


def artifacts_of(record: dict[str, Any]) -> dict[str, list[str]]:
    """A stage record's output files by artifact, dead letters left out (compared by kind)."""
    artifacts: dict[str, list[str]] = {}
    for item in record["outputs"]:
        if not item["path"].startswith(f"{layout.ERRORS}/"):
            artifacts.setdefault(artifact_of(item["path"]), []).append(item["path"])
    return artifacts


def multiset_difference(old: list[Any], new: list[Any]) -> str:
    """How many items each side has and a few that only one side has (as many times as it has them more)."""
    old_count, new_count = Counter(map(repr, old)), Counter(map(repr, new))
    gone, added = sorted((old_count - new_count).elements()), sorted((new_count - old_count).elements())
    return (f"{len(old)} -> {len(new)}; only old: {[item[:200] for item in gone[:MAX_SHOWN]]}; "
            f"only new: {[item[:200] for item in added[:MAX_SHOWN]]}")


def parquet_content(run: Path, files: list[str], ignored: Ignored) -> tuple[pa.Schema, list[str], list[tuple]]:
    """(schema without metadata; the distinct metadata of its files, sorted; the rows, sorted), less what is
    ``ignored``."""
    tables = [pq.read_table(run / name) for name in sorted(files)]
    tables = [table.drop_columns([name for name in table.column_names if name in ignored.columns])
              for table in tables]
    metadata = sorted({repr(sorted((key.decode(), value.decode())
                                   for key, value in (table.schema.metadata or {}).items()
                                   if key.decode() not in ignored.metadata)) for table in tables})
    schema = tables[0].schema.remove_metadata()
    if any(table.schema.remove_metadata() != schema for table in tables):
        raise ValueError("its files have different schemas")
    rows = sorted((row for table in tables for row in zip(*(column.to_pylist() for column in table.columns),
                                                             strict=True)), key=repr)
    return schema, metadata, rows


def compare_parquet(old: Path, new: Path, old_files: list[str], new_files: list[str], ignored: Ignored) -> str:
    old_schema, old_metadata, old_rows = parquet_content(old, old_files, ignored)
    new_schema, new_metadata, new_rows = parquet_content(new, new_files, ignored)
    problems = []
    if old_schema != new_schema:
        problems.append(f"schema {old_schema.to_string()!r} -> {new_schema.to_string()!r}")
    if old_metadata != new_metadata:
        problems.append(f"metadata {multiset_difference(old_metadata, new_metadata)}")
    if old_rows != new_rows:
        problems.append(f"rows {multiset_difference(old_rows, new_rows)}")
    return "DIFFERENT: " + "; ".join(problems) if problems else "same"


def compare_bytes(old: Path, new: Path, old_files: list[str], new_files: list[str], _: Ignored) -> str:
    """Files byte for byte."""
    if sorted(old_files) != sorted(new_files):
        return (f"DIFFERENT files: only old {sorted(set(old_files) - set(new_files))}, "
                f"only new {sorted(set(new_files) - set(old_files))}")
    changed = [name for name in sorted(old_files) if (old / name).read_bytes() != (new / name).read_bytes()]
    return f"DIFFERENT bytes: {changed}" if changed else "same"


def stored_vectors(index, ids: np.ndarray) -> np.ndarray:
    """The vectors of a FAISS shard in the order of its ``ids`` (``.ids.npy``: the order they were added in): an
    IDMap's inner index holds them in that order (an inner IVF index through its direct map); an IVF index that
    holds the passage ids itself reconstructs them by id (through a hash-table direct map: its ids are no 0..n-1);
    a ``RuntimeError`` where it holds no such id."""
    import faiss

    if isinstance(index, faiss.IndexIDMap):
        index = faiss.downcast_index(index.index)
        with contextlib.suppress(RuntimeError):  # not IVF
            faiss.extract_index_ivf(index).make_direct_map()
        return index.reconstruct_n(0, index.ntotal)
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:  # not IVF: in insertion order
        return index.reconstruct_n(0, index.ntotal)
    ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
    return index.reconstruct_batch(np.ascontiguousarray(ids, dtype=np.int64))


def shard_pairs(index_dir: Path, shard: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of one FAISS shard in id order: the ids its search returns (an IDMap's own), which must be
    those of its ``.ids.npy``."""
    import faiss

    index = faiss.read_index(str(index_dir / f"{shard}.faiss"))
    ids = np.load(index_dir / f"{shard}.ids.npy")
    differ = ValueError(f"{shard}: the ids its search returns are not those of {shard}.ids.npy")
    if index.ntotal != len(ids) or len(np.unique(ids)) != len(ids) or (isinstance(index, faiss.IndexIDMap)
                                    and not np.array_equal(faiss.vector_to_array(index.id_map), ids)):
        raise differ
    try:
        vectors = stored_vectors(index, ids) if index.ntotal else np.zeros((0, index.d), np.float32)
    except RuntimeError as error:  # an IVF index without one of the ids
        raise differ from error
    order = np.argsort(ids, kind="stable")
    return ids[order], vectors[order]


def fields(value: Any, ignored: frozenset[str], path: str = "") -> dict[str, Any]:
    """A JSON object's fields at every depth by dotted path (``encoder.model``), those named in ``ignored`` (at any
    depth) left out."""
    if not isinstance(value, dict):
        return {path: value}
    return {found: item for key, child in value.items() if key not in ignored
            for found, item in fields(child, ignored, f"{path}.{key}" if path else key).items()}


def compare_index(old: Path, new: Path, old_files: list[str], new_files: list[str], ignored: Ignored) -> str:
    """Each FAISS shard's (id, vector) pairs and index.json's fields (shard files byte for byte, if they are)."""
    old_dir, new_dir = old / INDEX, new / INDEX
    old_info, new_info = (json.loads((directory / "index.json").read_text()) for directory in (old_dir, new_dir))
    old_fields, new_fields = (fields(info, ignored.metadata | {"shard_files"}) for info in (old_info, new_info))
    problems = [f"index.json {key}: {old_fields.get(key)!r} -> {new_fields.get(key)!r}"
                for key in sorted(set(old_fields) | set(new_fields)) if old_fields.get(key) != new_fields.get(key)]
    old_shards, new_shards = ({item["name"] for item in info["shard_files"]} for info in (old_info, new_info))
    if old_shards != new_shards:
        problems.append(f"shards: only old {sorted(old_shards - new_shards)}, "
                        f"only new {sorted(new_shards - old_shards)}")
    for shard in sorted(old_shards & new_shards):
        old_ids, old_vectors = shard_pairs(old_dir, shard)
        new_ids, new_vectors = shard_pairs(new_dir, shard)
        if not (np.array_equal(old_ids, new_ids) and np.array_equal(old_vectors, new_vectors)):
            problems.append(f"{shard}: ids or vectors differ")
        elif (old_dir / f"{shard}.faiss").read_bytes() != (new_dir / f"{shard}.faiss").read_bytes():
            problems.append(f"{shard}: same (id, vector) pairs, file bytes differ (insertion order)")
    return "DIFFERENT: " + "; ".join(problems) if problems else "same"


Comparison = Callable[[Path, Path, list[str], list[str], Ignored], str]


def comparison_of(artifact: str, files: list[str]) -> Comparison:
    if artifact == INDEX:
        return compare_index
    return compare_parquet if all(name.endswith(".parquet") for name in files) else compare_bytes


def compare_artifact(old: Path, new: Path, artifact: str, old_files: list[str], new_files: list[str],
                     ignored: Ignored) -> str:
    compare = comparison_of(artifact, old_files + new_files)
    try:
        return compare(old, new, old_files, new_files, ignored)
    except UNREADABLE as error:
        return f"DIFFERENT: cannot be read ({type(error).__name__}: {str(error)[:300]})"


def dead_letters(run: Path, stage: str) -> dict[str, list[str]]:
    """A stage's dead letters by kind (``pages`` of ``errors/parse/pages-00000-of-00001.jsonl``), sorted lines."""
    kinds: dict[str, list[str]] = {}
    for path in sorted((run / layout.ERRORS / stage).glob("*")):
        if path.is_file():
            kind = path.name.split("-", 1)[0]
            kinds.setdefault(kind, []).extend(path.read_text(encoding="utf-8").splitlines())
    return {kind: sorted(lines) for kind, lines in kinds.items()}


def compare_errors(old: Path, new: Path, stage: str) -> list[tuple[str, str]]:
    old_kinds, new_kinds = dead_letters(old, stage), dead_letters(new, stage)
    results = []
    for kind in sorted(set(old_kinds) | set(new_kinds)):
        old_lines, new_lines = old_kinds.get(kind, []), new_kinds.get(kind, [])
        if old_lines or new_lines:
            outcome = "same" if old_lines == new_lines else f"DIFFERENT: {multiset_difference(old_lines, new_lines)}"
            results.append((f"{layout.ERRORS}/{stage}/{kind}", outcome))
    return results


def compare_counters(old_record: dict, new_record: dict, ignored: frozenset[str]) -> str:
    """The counters that differ (a counter absent from one side counts as 0)."""
    old_counters, new_counters = old_record["counters"], new_record["counters"]
    changed = {name: (old_counters.get(name, 0), new_counters.get(name, 0))
               for name in sorted((set(old_counters) | set(new_counters)) - ignored)
               if old_counters.get(name, 0) != new_counters.get(name, 0)}
    return f"DIFFERENT: {changed}" if changed else "same"


def compare_stage(old: Path, new: Path, stage: str, old_record: dict[str, Any] | None, new_record: dict[str, Any],
                  ignored: Ignored) -> list[tuple[str, str]]:
    if old_record is None:
        return [(stage, "DIFFERENT: only the new run recorded it")]
    old_artifacts, new_artifacts = artifacts_of(old_record), artifacts_of(new_record)
    results = []
    for artifact in sorted((set(old_artifacts) | set(new_artifacts)) - ignored.artifacts):
        if artifact not in new_artifacts or artifact not in old_artifacts:
            results.append((artifact, f"DIFFERENT: only in {'old' if artifact in old_artifacts else 'new'}"))
        else:
            results.append((artifact, compare_artifact(old, new, artifact, old_artifacts[artifact],
                                                       new_artifacts[artifact], ignored)))
    results += compare_errors(old, new, stage)
    return [*results, (f"counters {stage}", compare_counters(old_record, new_record, ignored.counters))]


def compare_runs(old: Path, new: Path, ignored: Ignored = Ignored()) -> list[tuple[str, str]]:
    old_stages, new_stages = recorded_stages(old), recorded_stages(new)
    order = [*layout.STAGE_ORDER, *sorted((set(old_stages) | set(new_stages)) - set(layout.STAGE_ORDER))]
    return [result for stage in order if stage in old_stages or stage in new_stages
            for result in ([(stage, NOT_COMPARED)] if stage not in new_stages else
                           compare_stage(old, new, stage, old_stages.get(stage), new_stages[stage], ignored))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--ignore-counter", nargs="*", default=[], help="counters not compared")
    parser.add_argument("--ignore-metadata", nargs="*", default=[],
                        help="Parquet metadata keys and index.json fields (at any depth) not compared (e.g. model: "
                             "the model's path differs between two checkouts' environments)")
    parser.add_argument("--ignore-column", nargs="*", default=[], help="Parquet columns not compared")
    parser.add_argument("--ignore-artifact", nargs="*", default=[],
                        help="artifacts not compared (e.g. entity_id_map, which a refresh writes)")
    args = parser.parse_args()
    for run in (args.old, args.new):
        if not (run / "manifest.json").is_file():
            print(f"{run} has no manifest.json: not a run")
            return 2
    results = compare_runs(args.old, args.new, Ignored(*map(frozenset, (args.ignore_counter, args.ignore_metadata,
                                                                         args.ignore_column, args.ignore_artifact))))
    for name, outcome in results:
        print(f"{name:<32} {outcome}")
    return 0 if all(outcome in ("same", NOT_COMPARED) for _, outcome in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
