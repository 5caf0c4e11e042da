"""bench.same_results: the proof that a change keeps every artifact, so each kind of difference must show."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from bench.same_results import NOT_COMPARED, Ignored, compare_runs, shard_pairs


def rewrite(path: Path, change: Callable[[pa.Table], pa.Table]) -> None:
    table = pq.read_table(path)
    pq.write_table(change(table), path)


def first(run: Path, artifact: str) -> Path:
    return sorted((run / artifact).rglob("*.parquet"))[0]


def bump_first_float(table: pa.Table, column: str) -> pa.Table:
    values = table.column(column).to_pylist()
    values[0] = [values[0][0] + 1.0, *values[0][1:]]
    return table.set_column(table.schema.get_field_index(column), table.schema.field(column),
                            pa.array(values, table.schema.field(column).type))


def vector_column(table: pa.Table) -> str:
    return next(field.name for field in table.schema if pa.types.is_list(field.type)
                or pa.types.is_fixed_size_list(field.type))


def change_mention_vector(run: Path) -> None:
    path = first(run, "mention_vectors")
    rewrite(path, lambda table: bump_first_float(table, vector_column(table)))


def change_passage_vector(run: Path) -> None:
    path = first(run, "index/embeddings")
    rewrite(path, lambda table: bump_first_float(table, vector_column(table)))


def remove_passages_file(run: Path) -> None:
    first(run, "passages").unlink()


def change_target_norm(run: Path) -> None:
    path = first(run, "entity_embeddings")
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"target_norm": b"123.0"}), path)


def widen_entity_ids(run: Path) -> None:
    rewrite(first(run, "entities"), lambda table: table.set_column(
        table.schema.get_field_index("entity_id"), "entity_id", pc.cast(table.column("entity_id"), pa.int64())))


def duplicate_entity_row(run: Path) -> None:
    rewrite(first(run, "entities"), lambda table: pa.concat_tables([table, table.slice(0, 1)]))


def add_dead_letter(run: Path, stage: str) -> None:
    path = sorted((run / "errors" / stage).glob("*.jsonl"))[0]
    path.write_text(path.read_text() + '{"why": "a dead letter"}\n')


def remove_shard_ids(run: Path) -> None:
    next((run / "index").glob("*.ids.npy")).unlink()


def change_returned_ids(run: Path) -> None:
    path = next((run / "index").glob("shard-*.faiss"))
    index = faiss.read_index(str(path))
    ids = faiss.vector_to_array(index.id_map)
    faiss.copy_array_to_vector(ids + 1_000_000, index.id_map)
    faiss.write_index(index, str(path))


CHANGES = {
    "mention_vectors": change_mention_vector,
    "index/embeddings": change_passage_vector,
    "passages": remove_passages_file,
    "entity_embeddings": change_target_norm,
    "entities": widen_entity_ids,
    "index": remove_shard_ids,
}


@pytest.fixture
def runs(full_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    return Path(shutil.copytree(full_run, tmp_path / "old")), Path(shutil.copytree(full_run, tmp_path / "new"))


def outcomes(old: Path, new: Path) -> dict[str, str]:
    return dict(compare_runs(old, new))


@pytest.mark.parametrize("artifact", sorted(CHANGES))
def test_each_changed_artifact_is_different_and_nothing_else(runs, artifact):
    old, new = runs
    assert set(outcomes(old, new).values()) == {"same"}
    CHANGES[artifact](new)
    found = outcomes(old, new)
    assert found[artifact].startswith("DIFFERENT"), found[artifact]
    assert {name for name, outcome in found.items() if outcome != "same"} == {artifact}


def test_row_order_and_files_are_no_difference_but_a_repeated_row_is_shown(runs):
    old, new = runs
    path = first(new, "entities")
    table = pq.read_table(path)
    path.unlink()
    half = table.num_rows // 2
    pq.write_table(table.slice(half), path.with_name("b.parquet"))
    pq.write_table(table.slice(0, half), path.with_name("a.parquet"))
    manifest = json.loads((new / "manifest.json").read_text())  # it lists both halves, as a stage would
    outputs = manifest["stages"]["dictionary"]["outputs"]
    at = next(index for index, item in enumerate(outputs) if item["path"] == f"entities/{path.name}")
    outputs[at:at + 1] = [{**outputs[at], "path": f"entities/{name}"} for name in ("a.parquet", "b.parquet")]
    (new / "manifest.json").write_text(json.dumps(manifest))
    assert outcomes(old, new)["entities"] == "same"
    duplicate_entity_row(new)
    shown = outcomes(old, new)["entities"]
    assert shown.startswith("DIFFERENT: rows ") and 'only old: []; only new: ["(' in shown, shown


def test_a_dead_letter_of_another_stage_and_ids_search_would_return_differ(runs):
    old, new = runs
    add_dead_letter(old, "parse")
    add_dead_letter(new, "index")  # the same line, another stage's
    assert sum(outcome.startswith("DIFFERENT") for name, outcome in outcomes(old, new).items()
               if name.startswith("errors/")) == 2
    shutil.rmtree(new)
    shutil.copytree(old, new)
    change_returned_ids(new)
    assert "search returns" in outcomes(old, new)["index"]


def test_what_two_checkouts_record_differently_can_be_left_out(runs):
    """A model at another path: index.json's nested encoder.model, the stored windows' salt and keys."""
    old, new = runs
    info = json.loads((new / "index" / "index.json").read_text())
    info["encoder"]["model"] = "/elsewhere/model"
    (new / "index" / "index.json").write_text(json.dumps(info))
    path = first(new, "mention_vectors")
    table = pq.read_table(path)
    keys = pc.add(table.column("window_key"), pa.scalar(1, pa.uint64()))
    table = table.set_column(table.schema.get_field_index("window_key"), table.schema.field("window_key"), keys)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"kpr_store_salt": b"00"}), path)
    found = outcomes(old, new)
    assert "encoder.model" in found["index"] and "metadata" in found["mention_vectors"]
    assert "rows" in found["mention_vectors"]
    ignored = Ignored(metadata=frozenset({"model", "kpr_store_salt"}), columns=frozenset({"window_key"}))
    assert set(dict(compare_runs(old, new, ignored)).values()) == {"same"}


def test_an_artifact_only_a_refresh_writes_can_be_left_out(runs):
    """A refresh writes entity_id_map/, which a run from scratch has not: no flag left it out."""
    old, new = runs
    manifest = json.loads((new / "manifest.json").read_text())
    entities = next(item for item in manifest["stages"]["embed_entities"]["outputs"]
                    if item["path"].startswith("entity_embeddings/"))
    (new / "entity_id_map").mkdir()
    shutil.copyfile(new / entities["path"], new / "entity_id_map" / "part-00000.parquet")
    manifest["stages"]["embed_entities"]["outputs"].append({**entities, "path": "entity_id_map/part-00000.parquet"})
    (new / "manifest.json").write_text(json.dumps(manifest))
    assert outcomes(old, new)["entity_id_map"] == "DIFFERENT: only in new"
    assert set(dict(compare_runs(old, new, Ignored(artifacts=frozenset({"entity_id_map"})))).values()) == {"same"}


def test_a_stage_the_new_run_did_not_record_is_said_not_compared(runs):
    old, new = runs
    manifest = json.loads((new / "manifest.json").read_text())
    del manifest["stages"]["index"]
    (new / "manifest.json").write_text(json.dumps(manifest))
    found = compare_runs(old, new)
    assert found[-1] == ("index", NOT_COMPARED)
    assert {outcome for _, outcome in found[:-1]} == {"same"}


def test_a_benchmark_says_nothing_of_beams_optional_gcp_libraries():
    """``python -m bench.same_results --help`` printed Beam's "WARNING:root:apitools not found" first, where the
    command line leaves it out."""
    done = subprocess.run([sys.executable, "-m", "bench.same_results", "--help"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=120, check=True)
    assert done.stdout.startswith("usage: ") and done.stderr == ""


def test_an_ivf_shard_holding_passage_ids_is_read_by_id(tmp_path):
    """An IVF index takes the passage ids itself (no IDMap): its direct map failed on ids that are no 0..n-1, and
    the vectors read back were uninitialised memory (every IVF run differed from itself)."""
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((64, 8)).astype(np.float32)
    ids = rng.choice(1_000_000, size=64, replace=False).astype(np.int64)
    index = faiss.index_factory(8, "IVF2,Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add_with_ids(vectors, ids)
    faiss.write_index(index, str(tmp_path / "shard-00000.faiss"))
    np.save(tmp_path / "shard-00000.ids.npy", ids)
    found_ids, found_vectors = shard_pairs(tmp_path, "shard-00000")
    order = np.argsort(ids)
    assert np.array_equal(found_ids, ids[order]) and np.array_equal(found_vectors, vectors[order])
    for wrong in (np.concatenate([ids[:-1], [ids.max() + 1]]), np.concatenate([ids[:-1], ids[:1]])):  # one twice
        np.save(tmp_path / "shard-00000.ids.npy", wrong)
        with pytest.raises(ValueError, match=r"the ids its search returns are not those of shard-00000\.ids\.npy"):
            shard_pairs(tmp_path, "shard-00000")
