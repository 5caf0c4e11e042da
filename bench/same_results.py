"""Whether two runs hold the same artifacts: every Parquet artifact's rows compared after sorting, the linker files
byte for byte, each FAISS shard's (id, vector) pairs, the dead letters as sorted lines and the stages' counters.

For checking that a change of the pipeline's graph leaves every result as it was:

    python -m bench.same_results OLD_OUT NEW_OUT [--ignore-counter NAME ...]

Prints one line per artifact of the new run (``same`` or what differs; artifacts only the old run has are skipped:
the new run may have run fewer stages) and exits 1 when anything differs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PARQUET_ARTIFACTS = ("articles", "redirects", "entities", "dictionary/names", "mentions", "entity_embeddings",
                     "entity_id_map", "passages")
MAX_SHOWN = 3


def parquet_rows(directory: Path) -> list[tuple] | None:
    """Every row of the Parquet files under ``directory`` as tuples of plain values, sorted (None: no files)."""
    files = sorted(directory.rglob("*.parquet"))
    if not files:
        return None
    table = pa.concat_tables([pq.read_table(path) for path in files])
    columns = [table.column(name).to_pylist() for name in table.column_names]
    return sorted(zip(*columns, strict=True), key=repr)


def compare_parquet(old: Path, new: Path, artifact: str) -> str | None:
    """What differs between the rows of ``artifact`` in two runs (None: the same, or absent from both)."""
    old_rows, new_rows = parquet_rows(old / artifact), parquet_rows(new / artifact)
    if old_rows is None and new_rows is None:
        return None
    if new_rows is None:
        return None  # a stage the new run did not run
    if old_rows is None:
        return "DIFFERENT: only in new"
    if old_rows == new_rows:
        return "same"
    old_set, new_set = set(map(repr, old_rows)), set(map(repr, new_rows))
    gone, added = sorted(old_set - new_set)[:MAX_SHOWN], sorted(new_set - old_set)[:MAX_SHOWN]
    return (f"DIFFERENT: {len(old_rows)} rows -> {len(new_rows)}; only old: {[row[:200] for row in gone]}; "
            f"only new: {[row[:200] for row in added]}")


def compare_bytes(old: Path, new: Path, directory: str) -> str | None:
    """Files under ``directory`` byte for byte."""
    old_files = {path.relative_to(old / directory) for path in (old / directory).rglob("*") if path.is_file()}
    new_files = {path.relative_to(new / directory) for path in (new / directory).rglob("*") if path.is_file()}
    if not new_files:
        return None
    if old_files != new_files:
        return f"DIFFERENT files: only old {sorted(map(str, old_files - new_files))}, " \
               f"only new {sorted(map(str, new_files - old_files))}"
    changed = [str(name) for name in sorted(old_files) if (old / directory / name).read_bytes()
               != (new / directory / name).read_bytes()]
    return f"DIFFERENT bytes: {changed}" if changed else "same"


def shard_pairs(index_dir: Path, shard: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of one FAISS shard, in id order."""
    import faiss

    index = faiss.read_index(str(index_dir / f"{shard}.faiss"))
    ids = np.load(index_dir / f"{shard}.ids.npy")
    vectors = stored_vectors(index) if index.ntotal else np.zeros((0, index.d), np.float32)
    order = np.argsort(ids, kind="stable")
    return ids[order], vectors[order]


def stored_vectors(index) -> np.ndarray:
    """The vectors of a FAISS index in insertion order (an IDMap's inner index; an IVF index through its direct
    map: neither reconstructs by id as it is)."""
    import faiss

    if isinstance(index, faiss.IndexIDMap):
        index = faiss.downcast_index(index.index)
    with contextlib.suppress(RuntimeError):  # not IVF
        faiss.extract_index_ivf(index).make_direct_map()
    return index.reconstruct_n(0, index.ntotal)


def compare_index(old: Path, new: Path) -> str | None:
    """Each FAISS shard's (id, vector) pairs and index.json's fields (shard files byte for byte, if they are)."""
    old_dir, new_dir = old / "index", new / "index"
    old_has, new_has = (old_dir / "index.json").exists(), (new_dir / "index.json").exists()
    if not old_has and not new_has:
        return None
    if old_has != new_has:
        return "only in " + ("old" if old_has else "new")
    old_info, new_info = json.loads((old_dir / "index.json").read_text()), json.loads((new_dir / "index.json")
                                                                                       .read_text())
    problems = [f"index.json {key}: {old_info.get(key)!r} -> {new_info.get(key)!r}"
                for key in sorted(set(old_info) | set(new_info))
                if key != "shard_files" and old_info.get(key) != new_info.get(key)]
    for shard in sorted(item["name"] for item in old_info["shard_files"]):
        old_ids, old_vectors = shard_pairs(old_dir, shard)
        new_ids, new_vectors = shard_pairs(new_dir, shard)
        if not (np.array_equal(old_ids, new_ids) and np.array_equal(old_vectors, new_vectors)):
            problems.append(f"{shard}: ids or vectors differ")
        elif (old_dir / f"{shard}.faiss").read_bytes() != (new_dir / f"{shard}.faiss").read_bytes():
            problems.append(f"{shard}: same (id, vector) pairs, file bytes differ (insertion order)")
    return "; ".join(problems) if problems else "same"


def dead_letters(directory: Path) -> list[str]:
    return sorted(line for path in directory.rglob("*") if path.is_file()
                  for line in path.read_text(encoding="utf-8").splitlines())


def compare_errors(old: Path, new: Path) -> str | None:
    old_lines, new_lines = dead_letters(old / "errors"), dead_letters(new / "errors")
    if not old_lines and not new_lines:
        return None
    if old_lines == new_lines:
        return "same"
    gone, added = sorted(set(old_lines) - set(new_lines)), sorted(set(new_lines) - set(old_lines))
    return f"DIFFERENT: {len(old_lines)} -> {len(new_lines)} lines; only old {gone[:MAX_SHOWN]}; " \
           f"only new {added[:MAX_SHOWN]}"


def compare_counters(old: Path, new: Path, ignored: set[str]) -> list[tuple[str, str]]:
    """Per stage of both manifests: the counters that differ (a counter absent from one side counts as 0)."""
    old_stages = json.loads((old / "manifest.json").read_text())["stages"]
    new_stages = json.loads((new / "manifest.json").read_text())["stages"]
    results = []
    for stage in sorted(set(old_stages) & set(new_stages)):
        old_counters, new_counters = old_stages[stage]["counters"], new_stages[stage]["counters"]
        changed = {name: (old_counters.get(name, 0), new_counters.get(name, 0))
                   for name in sorted((set(old_counters) | set(new_counters)) - ignored)
                   if old_counters.get(name, 0) != new_counters.get(name, 0)}
        results.append((f"counters {stage}", f"DIFFERENT: {changed}" if changed else "same"))
    return results


def compare_runs(old: Path, new: Path, ignored_counters: set[str]) -> list[tuple[str, str]]:
    results = [(artifact, compare_parquet(old, new, artifact)) for artifact in PARQUET_ARTIFACTS]
    results += [("dictionary/linker", compare_bytes(old, new, "dictionary/linker")),
                ("index", compare_index(old, new)), ("errors", compare_errors(old, new))]
    results = [(name, outcome) for name, outcome in results if outcome is not None]
    return results + compare_counters(old, new, ignored_counters)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--ignore-counter", nargs="*", default=[], help="counters not compared")
    args = parser.parse_args()
    results = compare_runs(args.old, args.new, set(args.ignore_counter))
    for name, outcome in results:
        print(f"{name:<22} {outcome}")
    return 0 if all(outcome == "same" for _, outcome in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
