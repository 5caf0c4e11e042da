"""validate, export-kpr and publish on a full run of the bundled sample (the shared ``full_run`` fixture):
a valid run passes; each kind of corruption is caught by validate, naming its file, and refused by publish;
publish copies everything with the manifest last; export-kpr loads with plain numpy and marisa_trie, and its
``embeddings.pt`` reads back as the reference's training code reads it."""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from unittest import mock

import marisa_trie
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from artifacts import faiss as faiss_shards
from artifacts import fs, tables
from artifacts.errors import InputError
from artifacts.run import kpr_export, lock, manifest, owned, verified
from artifacts.run import publish as publish_module
from artifacts.run.validation import validate_run
from pipelines.launcher.cli import main
from tests.builders import article, files_below, fill_with_files, mirrored, record, stage_command, write_parsed
from tests.conftest import REPO

EMBEDDINGS = "entity_embeddings/part-00000-of-00001.parquet"
ENTITIES = "entities/part-00000-of-00001.parquet"
ARTICLES = "articles/part-00000-of-00001.parquet"
REDIRECTS = "redirects/part-00000-of-00001.parquet"
LINKER = "dictionary/linker"
SHARD = "index/shard-00001.faiss"
SHARD_IDS = "index/shard-00001.ids.npy"
STAGES = "dictionary, embed-entities, index, mentions, parse"


@pytest.fixture
def run(full_run: Path, tmp_path: Path) -> Path:
    """A private copy of the full run, free to corrupt."""
    return Path(shutil.copytree(full_run, tmp_path / "out"))


def rewrite_parquet(out: Path, relative: str, change: Callable[[pa.Table], pa.Table]) -> None:
    """Rewrite a Parquet file with pyarrow (schema metadata kept) and record it, so only semantic checks
    can tell."""
    path = out / relative
    pq.write_table(change(pq.read_table(path)), path)
    record(out, relative)


def set_vector(table: pa.Table, row: int, vector: np.ndarray) -> pa.Table:
    vectors = faiss_shards.table_vectors(table).copy()
    vectors[row] = vector
    column = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), vectors.shape[1])
    return table.set_column(table.schema.get_field_index("embedding"), table.schema.field("embedding"), column)


def embedding_row(out: Path, row: int) -> tuple[int, np.ndarray, float]:
    """Entity id and vector of a row of the embeddings file, and the file's target norm."""
    table = pq.read_table(out / EMBEDDINGS)
    target = float(table.schema.metadata[b"target_norm"])
    return table.column("entity_id")[row].as_py(), faiss_shards.table_vectors(table)[row].copy(), target


def entity_count(out: Path) -> int:
    return pq.read_metadata(out / ENTITIES).num_rows


# --- validate ------------------------------------------------------------------------------------------------


def test_valid_run_validates(full_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert validate_run(str(full_run)) == []
    assert main(["validate", "--output", str(full_run)]) == 0
    assert capsys.readouterr().out == f"valid: {full_run} (stages: {STAGES})\n"


def test_only_recorded_stages_are_checked(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stages = manifest.load(str(run))
    manifest.save(str(run), {name: stages[name] for name in ("parse", "dictionary")})
    for directory in ("mentions", "entity_embeddings", "mention_vectors", "index", "passages", "errors/embed_entities",
                      "errors/index"):
        shutil.rmtree(run / directory)  # as a run that has got to dictionary has them
    assert main(["validate", "--output", str(run)]) == 0
    assert capsys.readouterr().out == f"valid: {run} (stages: dictionary, parse)\n"


def test_the_files_of_a_stage_cut_off_in_its_commit_are_flagged(run: Path, capsys: pytest.CaptureFixture[str]
                                                                 ) -> None:
    """SIGKILL while the index stage commits: its record was taken out of the manifest first (a stage is complete
    only once recorded), some of its files were moved into OUT/index/. validate names them."""
    stages = manifest.load(str(run))
    del stages["index"]
    manifest.save(str(run), stages)
    shutil.rmtree(run / "passages")
    (run / "index" / "shard-00001.faiss").unlink()  # not moved yet
    shutil.rmtree(run / "errors" / "index")
    why = "not in the manifest (no 'index' stage is recorded: one cut off before its commit ended)"
    expected = sorted(f"index/{path.relative_to(run / 'index')}: {why}" for path in (run / "index").rglob("*")
                      if path.is_file())
    assert "index/shard-00000.faiss: " + why in expected
    assert main(["validate", "--output", str(run)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        *expected, f"invalid: {run} (stages: dictionary, embed-entities, mentions, parse): {len(expected)} problem(s)"]


def test_missing_manifest_is_a_problem(tmp_path: Path) -> None:
    assert validate_run(str(tmp_path)) == [
        f"manifest.json: missing or empty, no stage has completed under {tmp_path}"]


def truncate_articles(out: Path) -> list[str]:
    size = (out / ARTICLES).stat().st_size
    with open(out / ARTICLES, "r+b") as handle:
        handle.truncate(size // 2)
    return [f"{ARTICLES}: {size // 2} bytes, manifest says {size}"]


def flip_shard_bytes(out: Path) -> list[str]:
    data = bytearray((out / SHARD).read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(255 - value for value in data[middle:middle + 8])
    (out / SHARD).write_bytes(bytes(data))
    return [f"{SHARD}: sha256 differs from the manifest"]


def non_finite_embedding(out: Path) -> list[str]:
    entity_id, vector, _ = embedding_row(out, 3)
    vector[5] = np.nan
    rewrite_parquet(out, EMBEDDINGS, lambda table: set_vector(table, 3, vector))
    return [f"{EMBEDDINGS}: vectors with non-finite values: 1 ({entity_id})"]


def wrong_norm_embedding(out: Path) -> list[str]:
    entity_id, vector, target = embedding_row(out, 7)
    rewrite_parquet(out, EMBEDDINGS, lambda table: set_vector(table, 7, vector * 1.01))
    norm = float(np.linalg.norm((vector * 1.01).astype(np.float64)))
    return [f"{EMBEDDINGS}: L2 norm differs from target_norm {target:.6g}: 1 ({entity_id} (norm {norm:.6g}))"]


def change_embedding_ids(out: Path, change: Callable[[np.ndarray], None]) -> None:
    def rewrite(table: pa.Table) -> pa.Table:
        ids = table.column("entity_id").to_numpy().copy()
        change(ids)
        return table.set_column(0, table.schema.field(0), pa.array(ids, pa.int32()))

    rewrite_parquet(out, EMBEDDINGS, rewrite)


def one_vector_for_every_entity(out: Path) -> list[str]:
    """What inputs without context give (every mention [CLS] [MASK] [SEP]): each entity the same vector, with the
    target norm, so no per-vector check can tell."""
    _, vector, _ = embedding_row(out, 0)
    rows = pq.read_metadata(out / EMBEDDINGS).num_rows

    def same_vectors(table: pa.Table) -> pa.Table:
        for row in range(rows):
            table = set_vector(table, row, vector)
        return table

    rewrite_parquet(out, EMBEDDINGS, same_vectors)
    return [f"entity_embeddings/: all {rows} vectors are the same: the embeddings tell no entity from another "
            "(mentions embedded without context?)"]


def unknown_entity_embedding(out: Path) -> list[str]:
    unknown = entity_count(out) + 1
    change_embedding_ids(out, lambda ids: ids.__setitem__(0, unknown))
    return [f"{EMBEDDINGS}: entity ids not in entities/: 1 ({unknown})"]


def repeated_entity_embedding(out: Path) -> list[str]:
    repeated = pq.read_table(out / EMBEDDINGS).column("entity_id")[0].as_py()
    change_embedding_ids(out, lambda ids: ids.__setitem__(9, repeated))
    return [f"{EMBEDDINGS}: repeated entity ids: 1 ({repeated})"]


def stray_parquet(out: Path) -> list[str]:
    stray = "entities/part-00001-of-00002.parquet"
    shutil.copy(out / ENTITIES, out / stray)
    return [f"{stray}: not in the manifest (a stale or partial write)"]


def stray_other_files(out: Path) -> list[str]:
    (out / "entities" / "stray.txt").write_text("left here by hand\n")
    shutil.copy(next((out / "index").glob("*.faiss")), out / "index" / "extra.faiss")
    return ["entities/stray.txt: not in the manifest (no stage recorded it)",
            "index/extra.faiss: not in the manifest (no stage recorded it)"]


def unreadable_recorded_parquet(out: Path) -> list[str]:
    path = out / EMBEDDINGS  # no stage reads entity embeddings, so none becomes stale
    path.write_bytes(path.read_bytes()[:1000])
    stages = manifest.load(str(out))
    stages["embed_entities"].outputs = [
        replace(item, bytes=1000, sha256=fs.sha256(str(path))) if item.path == EMBEDDINGS else item
        for item in stages["embed_entities"].outputs]
    manifest.save(str(out), stages)
    return [f"{EMBEDDINGS}: not a readable Parquet file"]  # a prefix: pyarrow's own words follow


def repeated_passage_id(out: Path) -> list[str]:
    ids = np.load(out / SHARD_IDS)
    missing = ids[1]
    ids[1] = ids[0]
    faiss_shards.write_npy(str(out / SHARD_IDS), ids)
    record(out, SHARD_IDS)
    return [f"{SHARD_IDS}: 1 repeated passage ids",
            f"{SHARD}: its passage ids are not those of its id map {SHARD_IDS} (1 not in it: {missing})"]


def edit_index_json(out: Path, change: Callable[[dict], None]) -> None:
    path = out / "index" / "index.json"
    info = json.loads(path.read_text())
    change(info)
    path.write_text(json.dumps(info))
    record(out, "index/index.json")


def shard_listed_twice(out: Path) -> list[str]:
    """index.json naming one shard twice (its count added twice): a search would return its passages twice."""
    def change(info: dict) -> None:
        info["shard_files"].append(info["shard_files"][-1])
        info["count"] += info["shard_files"][-1]["count"]

    edit_index_json(out, change)
    return ["index/index.json: shards listed more than once: shard-00001"]


def index_json_count_not_a_number(out: Path) -> list[str]:
    edit_index_json(out, lambda info: info["shard_files"][0].update(count="many"))
    return [f"index/index.json: unreadable ({out}/index/index.json is damaged: a shard's count is \"many\", not a "
            "whole number)"]


def index_json_without_its_counts(out: Path) -> list[str]:
    """Was "unreadable (IndexInfo.__init__() missing 2 required positional arguments: 'count' and 'shards')"."""
    def change(info: dict) -> None:
        del info["count"], info["shards"]

    edit_index_json(out, change)
    return [f"index/index.json: unreadable ({out}/index/index.json is damaged: it has no count, shards)"]


def faiss_id_renamed(out: Path) -> list[str]:
    """A shard whose FAISS ids (what a search returns) are not its id map's: one renamed."""
    import faiss

    index = faiss_shards.read_index(str(out / SHARD), mmap=False)
    ids = faiss_shards.stored_ids(index)
    ids[0] = 987654321987
    faiss.copy_array_to_vector(ids, index.id_map)
    faiss_shards.write_index(index, str(out / SHARD))
    record(out, SHARD)
    return [f"{SHARD}: its passage ids are not those of its id map {SHARD_IDS} (1 not in it: 987654321987)"]


def a_stored_passage_not_indexed(out: Path) -> list[str]:
    """The shard, its id map and index.json agree on one passage fewer than index/embeddings/ stores."""
    index = faiss_shards.read_index(str(out / SHARD), mmap=False)
    ids = np.load(out / SHARD_IDS)
    index.remove_ids(ids[-1:])
    faiss_shards.write_index(index, str(out / SHARD))
    faiss_shards.write_npy(str(out / SHARD_IDS), ids[:-1])
    for relative in (SHARD, SHARD_IDS):
        record(out, relative)

    def change(info: dict) -> None:
        info["shard_files"][1]["count"] -= 1
        info["count"] -= 1

    edit_index_json(out, change)
    return [f"index/embeddings/shard-00001/: {len(ids)} passages, index/index.json says its shard holds "
            f"{len(ids) - 1}"]


def a_stored_passage_under_another_ones_id(out: Path) -> list[str]:
    """One stored passage's id set to another's of the shard: the counts still agree, search finds the id map's
    passage in none of the stored files (validate said valid, search told to run validate)."""
    stored = sorted((out / "index" / "embeddings" / "shard-00001").glob("*.parquet"))[0]
    table = pq.read_table(stored)
    ids = table.column("passage_id").to_pylist()
    lost, ids[0] = ids[0], ids[1]
    rewrite_parquet(out, str(stored.relative_to(out)), lambda table: table.set_column(
        table.schema.get_field_index("passage_id"), table.schema.field("passage_id"), pa.array(ids, pa.int64())))
    return [f"index/embeddings/shard-00001/: its passages are not those of {SHARD_IDS}: 1 ids of the map not stored "
            f"({lost}); 1 ids stored more than once ({ids[1]})"]


def passages_break_contract(out: Path) -> list[str]:
    """passages/ had no contract: its columns renamed validated."""
    relative = sorted((out / "passages").glob("*.parquet"))[0].relative_to(out)
    rewrite_parquet(out, str(relative), lambda table: table.rename_columns(["pid", "title", "body"]))
    return [f"{relative}: column passage_id is missing", f"{relative}: column text is missing"]


def a_passage_id_twice_in_passages(out: Path) -> list[str]:
    relative = sorted((out / "passages").glob("*.parquet"))[0].relative_to(out)
    ids = pq.read_table(out / relative).column("passage_id").to_pylist()
    ids[1] = ids[0]
    rewrite_parquet(out, str(relative), lambda table: table.set_column(
        0, table.schema.field("passage_id"), pa.array(ids, pa.int64())))
    return [f"passages/: repeated passage ids: 1 ({ids[0]})"]


def manifest_miscounts_rows(out: Path) -> list[str]:
    """The manifest's row count of entities/ wrong, the file as recorded: one problem, not every check that
    counts entities from it (the names' and embeddings' ids "outside 1..N", the linker's size...)."""
    stages = manifest.load(str(out))
    stages["dictionary"].outputs = [replace(item, rows=item.rows - 1) if item.path == ENTITIES else item
                                    for item in stages["dictionary"].outputs]
    manifest.save(str(out), stages)
    return [f"{ENTITIES}: {entity_count(out)} rows, manifest says {entity_count(out) - 1}"]


def an_entity_without_title_or_qid(out: Path) -> list[str]:
    """An entity whose title and QID are null: it has no key (was a traceback from the key trie)."""
    table = pq.read_table(out / ENTITIES)
    row = next(row for row, qid in enumerate(table.column("qid").to_pylist()) if qid is None)
    titles = table.column("title").to_pylist()
    titles[row] = None
    pq.write_table(table.set_column(table.schema.get_field_index("title"), table.schema.field("title"),
                                    pa.array(titles, pa.string())), out / ENTITIES)
    record(out, ENTITIES)
    return [*(f"manifest.json: stage {stage} was built from other dictionary outputs than the recorded ones: rerun "
              f"{stage}" for stage in ("mentions", "embed-entities")),
            f"{ENTITIES}: entities whose key (QID, else title) is not id entity_id - 1 in {LINKER}/kb_id.trie: "
            f"1 ({table.column('entity_id')[row].as_py()})"]


MENTIONS = "mentions/part-00000-of-00001.parquet"


def mentions_outside_entities_and_articles(out: Path) -> list[str]:
    """A mention of an entity id past N, one of a page that is no article, one whose span ends past its text."""
    table = pq.read_table(out / MENTIONS)
    columns = {name: table.column(name).to_pylist() for name in ("entity_id", "page_id", "end")}
    beyond = entity_count(out) + 1
    columns["entity_id"][0], columns["page_id"][1], columns["end"][2] = beyond, 123456789, 10**8
    for name, values in columns.items():
        index = table.schema.get_field_index(name)
        table = table.set_column(index, table.schema.field(index), pa.array(values, table.schema.field(index).type))
    pq.write_table(table, out / MENTIONS)
    record(out, MENTIONS)
    start, page = table.column("start")[2].as_py(), table.column("page_id")[2].as_py()
    return ["manifest.json: stage embed-entities was built from other mentions outputs than the recorded ones: rerun "
            "embed-entities", f"{MENTIONS}: entity ids outside 1..{beyond - 1}: 1 ({beyond})",
            f"{MENTIONS}: page ids not in articles/: 1 (123456789)",
            f"{MENTIONS}: spans outside their article's text: 1 ({page} [{start}:100000000])"]


def title_differs(out: Path) -> list[str]:
    entity_id = pq.read_table(out / EMBEDDINGS).column("entity_id")[2].as_py()

    def change(table: pa.Table) -> pa.Table:
        titles = table.column("title").to_pylist()
        titles[2] += " (renamed)"
        return table.set_column(1, table.schema.field(1), pa.array(titles, pa.string()))

    rewrite_parquet(out, EMBEDDINGS, change)
    return [f"{EMBEDDINGS}: title or qid differs from entities/: 1 ({entity_id})"]


# parse's outputs changed after dictionary, embed_entities and mentions (its articles) and index (its passages) read
# them: all stale now, said in the pipeline's order (it was the names')
STALE_AFTER_PARSE = [f"manifest.json: stage {stage} was built from other parse outputs than the recorded ones: rerun "
                     f"{stage}" for stage in ("dictionary", "mentions", "embed-entities", "index")]


def redirects_break_contract(out: Path) -> list[str]:
    def change(table: pa.Table) -> pa.Table:
        return table.set_column(1, pa.field("target", pa.large_string()), table.column(1).cast(pa.large_string()))

    rewrite_parquet(out, REDIRECTS, change)
    return [*STALE_AFTER_PARSE, f"{REDIRECTS}: column target is large_string, the contract says string"]


def mention_vectors_break_contract(out: Path) -> list[str]:
    """A file of embed-entities' window store rewritten with float32 vectors: a change no stage reads (kept work is
    not in the fingerprint downstream stages record), and the contract still flags it."""
    relative = str(sorted((out / "mention_vectors").glob("*.parquet"))[0].relative_to(out))

    def change(table: pa.Table) -> pa.Table:
        return table.set_column(1, "embedding", table.column(1).cast(pa.list_(pa.float32(), 32)))

    rewrite_parquet(out, relative, change)
    return [f"{relative}: column embedding is fixed_size_list<element: float>[32], the contract says "
            "fixed_size_list<halffloat>[D]"]


def index_json_leaves_out_a_shard(out: Path) -> list[str]:
    """index.json of 2 shards listing one (its count too): every check of the listed shard passed, and a search
    read half the passages."""
    def change(info: dict) -> None:
        info["count"] -= info["shard_files"].pop()["count"]

    edit_index_json(out, change)
    lost = "in the manifest, in no shard index/index.json lists (a search reads none of it)"
    return [f"index/embeddings/shard-00001/: {lost}",
            f"{SHARD}: {lost}", f"{SHARD_IDS}: {lost}"]


def trained_index_of_another_shape(out: Path) -> list[str]:
    """trained.faiss of 8 dims: nothing read it but a refresh, whose every shard failed on it."""
    import faiss

    trained = "index/trained.faiss"
    faiss_shards.write_index(faiss.IndexFlatIP(8), str(out / trained))
    record(out, trained)
    dim = json.loads((out / "index" / "index.json").read_text())["dim"]
    return [f"{trained}: it is an IndexFlatIP of 8 dims where Flat x {dim} makes an IndexIDMap of {dim}"]


def move_recorded(out: Path, relative: str, to: str | None) -> None:
    """Move a recorded file to ``to`` (None: delete it) and its record with it."""
    stages = manifest.load(str(out))
    for stage in stages.values():
        stage.outputs = [replace(item, path=to) if item.path == relative else item for item in stage.outputs
                         if item.path != relative or to is not None]
    if to is None:
        (out / relative).unlink()
    else:
        (out / relative).rename(out / to)
    manifest.save(str(out), stages)


def an_embeddings_part_gone(out: Path) -> list[str]:
    """The first of two entity_embeddings/ parts, with its record: readers took the other for all of them (an
    entity without its vector exported as a zero row)."""
    move_recorded(out, EMBEDDINGS, "entity_embeddings/part-00001-of-00002.parquet")
    return ["entity_embeddings/: 1 of its 2 parts are not in the manifest (part-00000-of-00002.parquet)"]


def no_embeddings_recorded(out: Path) -> list[str]:
    move_recorded(out, EMBEDDINGS, None)
    return ["entity_embeddings/: no file in the manifest (embed-entities writes one per bucket of entities)"]


def damaged_pages_the_manifest_vouches_for(out: Path) -> list[str]:
    """A data page overwritten, the file recorded again: its footer reads, its rows do not (the reader's own error
    was the command's, exit 2, telling to run validate)."""
    damage_in_place(out / EMBEDDINGS, pq.read_metadata(out / EMBEDDINGS).row_group(0).column(0).data_page_offset)
    record(out, EMBEDDINGS)
    return [f"{EMBEDDINGS}: rows cannot be read"]  # a prefix: pyarrow's own words follow


def a_directory_where_a_file_is_recorded(out: Path) -> list[str]:
    (out / REDIRECTS).unlink()
    (out / REDIRECTS).mkdir()
    (out / REDIRECTS / "x").write_text("x")
    return [f"{REDIRECTS}: a directory, where the manifest records a file",
            f"{REDIRECTS}/x: not in the manifest (no stage recorded it)"]


def manifest_of_no_row_count(out: Path) -> list[str]:
    """A Parquet file recorded without its rows: one problem (the checks that count entities from the manifest
    took it for 0 rows)."""
    stages = manifest.load(str(out))
    stages["dictionary"].outputs = [replace(item, rows=None) if item.path == ENTITIES else item
                                    for item in stages["dictionary"].outputs]
    manifest.save(str(out), stages)
    return [f"{ENTITIES}: the manifest records no row count"]


CORRUPTIONS = [truncate_articles, flip_shard_bytes, non_finite_embedding, wrong_norm_embedding,
               one_vector_for_every_entity, unknown_entity_embedding, repeated_entity_embedding, stray_parquet,
               stray_other_files, unreadable_recorded_parquet,
               repeated_passage_id, title_differs, redirects_break_contract, mention_vectors_break_contract,
               shard_listed_twice, index_json_count_not_a_number, index_json_without_its_counts, faiss_id_renamed,
               a_stored_passage_not_indexed, a_stored_passage_under_another_ones_id, passages_break_contract,
               a_passage_id_twice_in_passages,
               manifest_miscounts_rows, an_entity_without_title_or_qid, mentions_outside_entities_and_articles,
               index_json_leaves_out_a_shard, trained_index_of_another_shape, an_embeddings_part_gone,
               no_embeddings_recorded, damaged_pages_the_manifest_vouches_for, a_directory_where_a_file_is_recorded,
               manifest_of_no_row_count]
PREFIXES = (unreadable_recorded_parquet, damaged_pages_the_manifest_vouches_for)  # pyarrow's words follow


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda corrupt: corrupt.__name__)
def test_corruption_is_caught_and_refused(corrupt: Callable[[Path], list[str]], run: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    expected = corrupt(run)
    problems = validate_run(str(run))
    if corrupt in PREFIXES:
        assert len(problems) == 1 and problems[0].startswith(expected[0] + " (")
        expected = problems
    assert problems == expected

    assert main(["validate", "--output", str(run)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [*expected, f"invalid: {run} (stages: {STAGES}): {len(expected)} problem(s)"]

    destination = tmp_path / "published"
    # kept work (mention_vectors/) counts only for a publish that copies it
    kept = ["--with-mention-vectors"] if corrupt is mention_vectors_break_contract else []
    assert main(["publish", "--output", str(run), "--to", str(destination), *kept]) == 2
    err = capsys.readouterr().err
    more = f" (and {len(expected) - 1} more)" if len(expected) > 1 else ""
    assert err == (f"error: {run} does not validate ({expected[0]}{more}): `python run_pipeline.py validate --output "
                   f"{run}` lists every problem\n")
    assert not destination.exists()


def test_a_stage_of_no_command_is_a_problem(run: Path) -> None:
    stages = manifest.load(str(run))
    stages["foo"] = replace(stages["parse"], stage="foo", outputs=[])
    manifest.save(str(run), stages)
    assert validate_run(str(run)) == ["manifest.json: stage 'foo' is none of this pipeline's (parse, dictionary, "
                                      "mentions, embed_entities, index)"]


def test_an_article_page_id_twice_is_a_problem(run: Path) -> None:
    def change(table: pa.Table) -> pa.Table:
        ids = table.column("page_id").to_pylist()
        ids[1] = ids[0]
        return table.set_column(0, table.schema.field(0), pa.array(ids, pa.int64()))

    first = pq.read_table(run / ARTICLES).column("page_id")[0].as_py()
    rewrite_parquet(run, ARTICLES, change)
    assert f"articles/: repeated page ids: 1 ({first})" in validate_run(str(run))


def test_entity_ids_outside_1_to_n(run: Path) -> None:
    """Dictionary names pointing past the last entity."""
    names = "dictionary/names/part-00000-of-00001.parquet"
    count = entity_count(run)

    def change(table: pa.Table) -> pa.Table:
        ids = table.column("entity_id").to_numpy().copy()
        ids[:3] = [0, count + 1, count + 2]
        return table.set_column(1, table.schema.field(1), pa.array(ids, pa.int32()))

    rewrite_parquet(run, names, change)
    problems = validate_run(str(run))
    assert f"{names}: entity ids outside 1..{count}: 3 (0, {count + 1}, {count + 2})" in problems
    assert all(problem.startswith(("manifest.json: stage", names)) for problem in problems)


def damage_in_place(path: Path, at: int) -> None:
    """Overwrite 64 bytes of ``path`` from byte ``at`` (negative: from its end), its size unchanged: what a stage's
    check of its inputs' sizes lets through."""
    data = bytearray(path.read_bytes())
    start = at % len(data)
    data[start:start + 64] = b"X" * 64
    path.write_bytes(bytes(data))


DAMAGED_INPUTS = [("dictionary", "articles", "footer"), ("mentions", "entities", "footer"),
                  ("embed-entities", "mentions", "footer"), ("embed-entities", "mentions", "pages")]


@pytest.mark.parametrize(("command", "artifact", "where"), DAMAGED_INPUTS)
def test_a_stage_whose_input_was_damaged_in_place_refuses_it_before_reading(
        command: str, artifact: str, where: str, run: Path, tiny_bert: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    damaged = sorted((run / artifact).glob("*.parquet"))[0]
    damage_in_place(damaged, -200 if where == "footer" else damaged.stat().st_size // 3)
    assert main(stage_command(command, run, tiny_bert, "--force")) == 2
    upstream = {"articles": "parse", "entities": "dictionary", "mentions": "mentions"}[artifact]
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: the outputs of '{upstream}' under {run} changed after it ran ({artifact}/{damaged.name}: its sha256 "
        f"differs from the manifest's): rerun `python run_pipeline.py {upstream} --output {run} --force ...` first")


def test_a_stage_refuses_an_upstream_built_from_other_outputs_than_those_there_now(
        run: Path, tiny_bert: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """parse ran again (other articles) and dictionary did not: mentions would read the new articles with the old
    entities, and validate would only say so afterwards."""
    rewrite_parquet(run, ARTICLES, lambda table: table.slice(1))
    assert main(stage_command("mentions", run, tiny_bert, "--force")) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: 'dictionary' under {run} was built from other outputs of 'parse' than the ones there now (it ran "
        f"again since), and 'mentions' would read both: rerun `python run_pipeline.py dictionary --output {run} ...` "
        "first")


@pytest.mark.parametrize(("in_the_way", "command"), [(".staging", "mentions"), ("report", "report"),
                                                    ("errors/mentions", "mentions"), ("mentions", "mentions")])
def test_a_file_where_a_directory_goes_is_one_line(run: Path, tiny_bert: Path, capsys: pytest.CaptureFixture[str],
                                                    in_the_way: str, command: str) -> None:
    """A plain file at OUT/.staging or OUT/report: every stage, or the report (and so the end of `all`), ended in a
    traceback. At an artifact's place (OUT/mentions, OUT/errors/mentions) the user's file was deleted without a word
    (a file at OUT/errors: the stage ran to its commit, which dropped its record and ended in a traceback). They are
    refused before the stage runs."""
    shutil.rmtree(run / in_the_way, ignore_errors=True)
    (run / in_the_way).write_text("mine")
    argv = stage_command(command, run, tiny_bert, "--force") if command == "mentions" else [
        "report", "--output", str(run)]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {run / in_the_way} is a file, where a directory goes: move it away (it is left as it is)")
    assert (run / in_the_way).read_text() == "mine"
    assert "mentions" in manifest.load(str(run))


@pytest.mark.parametrize(("command", "artifact"), [(command, artifact) for command, artifact, where in DAMAGED_INPUTS
                                                    if where == "footer"])
def test_a_damaged_parquet_input_the_manifest_vouches_for_is_named_in_one_line(
        command: str, artifact: str, run: Path, tiny_bert: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file the stage cannot check (on a cluster the launcher hashes at most LAUNCHER_HASH_BYTES) or damaged
    before its stage hashed it: the reader names it. (Damage inside zstd-compressed pages may also decode, silently,
    as other values: zstd frames carry no checksum here; only the sha256 check sees that.)"""
    damaged = sorted((run / artifact).glob("*.parquet"))[0]
    damage_in_place(damaged, -200)  # its footer
    stages = manifest.load(str(run))  # its sha256 recorded as if its stage had written it so
    for stage in stages.values():
        stage.outputs = [replace(item, sha256=fs.sha256(str(damaged))) if item.path == f"{artifact}/{damaged.name}"
                         else item for item in stage.outputs]
    manifest.save(str(run), stages)
    assert main(stage_command(command, run, tiny_bert, "--force")) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"error: {damaged} cannot be read as Parquet (")
    assert err.splitlines()[-1].endswith("): it is damaged or was changed after the stage that wrote it; `python "
                                         "run_pipeline.py validate --output OUT` checks every file of a run against "
                                         "its manifest")
    assert "Traceback" not in err


def test_a_stage_hashes_its_inputs_once_and_the_next_one_here_trusts_its_commit(
        run: Path, tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(verified.CACHE_ENV, str(tmp_path / "verified.json"))
    hashed: list[str] = []
    real_sha256 = fs.sha256
    monkeypatch.setattr(fs, "sha256", lambda path: hashed.append(path) or real_sha256(path))
    assert main(stage_command("dictionary", run, tiny_bert, "--force")) == 0
    articles = [str(path) for path in sorted((run / "articles").glob("*.parquet"))]
    entities = [str(path) for path in sorted((run / "entities").glob("*.parquet"))]
    assert all(hashed.count(path) == 1 for path in articles + entities)  # its input checked; its output at commit
    hashed.clear()
    assert main(stage_command("mentions", run, tiny_bert, "--force")) == 0
    assert not set(hashed) & set(articles + entities)  # read, not hashed again: remembered from the commit
    remembered = json.loads((tmp_path / "verified.json").read_text())
    assert {key for key in remembered if key.startswith(str(run / "entities") + "/")} == set(entities)


def test_damaged_pages_are_named_by_each_reader(run: Path) -> None:
    from transforms.common.parquet_rows import read_table, row_ranges

    articles = sorted((run / "articles").glob("*.parquet"))[0]
    damage_in_place(articles, articles.stat().st_size // 3)  # inside the first row group's pages
    with pytest.raises(tables.DamagedParquetError) as refused:
        list(tables.iter_file_batches([str(articles)]))
    assert refused.value.path == str(articles)
    with pytest.raises(tables.DamagedParquetError):
        tables.read_file(str(articles))
    with pytest.raises(tables.DamagedParquetError):
        read_table(next(row_ranges(str(articles))), None)


# --- publish -------------------------------------------------------------------------------------------------


def fake_report(out: Path) -> None:
    """A report of ``out`` as it is now: its page and the stamp of the manifest it was built from."""
    (out / "report").mkdir()
    (out / "report" / "index.html").write_text("<html>report</html>")
    (out / "report" / "manifest.sha256").write_text(hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest())


def test_publish_refuses_a_report_built_before_the_last_stage(run: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A report older than the manifest (a stage recorded after it) would be published as the run's: refused, and
    so is a report that names no manifest (one cut short: its stamp is removed first and written last; it was said
    to be built before the last stage); the report command's own stamp is accepted."""
    assert main(["report", "--output", str(run), "--recall-queries", "5"]) == 0
    records = manifest.load(str(run))
    records["index"].counters["passages_encoded"] += 1  # as a rerun of the stage records it
    manifest.save(str(run), records)
    destination = tmp_path / "published"
    for without_stamp in (False, True):
        if without_stamp:  # no stamp: no telling which run it shows
            (run / "report" / "manifest.sha256").unlink()
        assert main(["publish", "--output", str(run), "--to", str(destination)]) == 2
        why = ("holds no finished report (it has no stamp: a report that stopped part way, a full disk?)"
               if without_stamp else "was built before the run's last stage ran (from another manifest.json)")
        assert capsys.readouterr().err == (
            f"error: {run / 'report'} {why}: run `python run_pipeline.py report --output {run}` again, or remove the "
            "report to publish without one; "
            "nothing was copied\n")
        assert not destination.exists()
    assert main(["report", "--output", str(run), "--recall-queries", "5"]) == 0
    assert main(["publish", "--output", str(run), "--to", str(destination)]) == 0
    assert (destination / "report" / "index.html").read_bytes() == (run / "report" / "index.html").read_bytes()


@pytest.mark.parametrize("with_vectors", [False, True])
def test_publish_copies_everything(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   with_vectors: bool) -> None:
    """Every recorded file and the report; embed-entities' kept window vectors only when asked (without them the
    published manifest does not list them, and the copy validates)."""
    fake_report(run)
    destination = tmp_path / "published"
    assert main(["publish", "--output", str(run), "--to", str(destination),
                 *(["--with-mention-vectors"] if with_vectors else [])]) == 0
    out, err = capsys.readouterr()
    assert "--with-mention-vectors" not in err

    recorded = sorted(item.path for stage in manifest.load(str(run)).values() for item in stage.outputs)
    assert any(path.startswith("mention_vectors/") for path in recorded)
    listed = [path for path in recorded if with_vectors or not path.startswith("mention_vectors/")]
    copied = sorted(str(path.relative_to(destination)) for path in destination.rglob("*") if path.is_file())
    report = ["report/index.html", "report/manifest.sha256"]
    assert copied == sorted([*listed, *report, "manifest.json", ".kpr-publish.json"])
    assert owned.load_record(str(destination), ".kpr-publish.json") == {*listed, *report, "manifest.json"}
    assert sorted(item.path for stage in manifest.load(str(destination)).values() for item in stage.outputs) == listed
    copied.remove(".kpr-publish.json")
    for relative in copied:
        assert filecmp.cmp(run / relative, destination / relative, shallow=False) or (
            relative in ("manifest.json", "report/manifest.sha256") and not with_vectors), relative
        assert f"  {relative} (" in out or relative == "manifest.json"
    data_bytes = sum((run / relative).stat().st_size for relative in copied if relative != "manifest.json")
    assert out.splitlines()[-2:] == ["  manifest.json (written last)",
                                     f"published {run} to {destination}: {len(copied)} files, {data_bytes:,} bytes"]
    assert validate_run(str(destination)) == []


def test_a_republish_without_mention_vectors_leaves_no_empty_directory(run: Path, tmp_path: Path) -> None:
    """The earlier publish's files this one does not have are removed, and the directories they emptied with them."""
    destination = tmp_path / "published"
    assert main(["publish", "--output", str(run), "--to", str(destination), "--with-mention-vectors"]) == 0
    assert list((destination / "mention_vectors").rglob("*.parquet"))
    assert main(["publish", "--output", str(run), "--to", str(destination)]) == 0
    assert not (destination / "mention_vectors").exists()
    assert [path for path in destination.rglob("*") if path.is_dir() and not any(path.iterdir())] == []
    assert validate_run(str(destination)) == []


def test_with_mention_vectors_from_a_run_that_keeps_none_says_so(run: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A copy published without the mention vectors, published on with --with-mention-vectors: the copy has none, and
    the user who asked for them learns it (a refresh from it encodes every window)."""
    plain = tmp_path / "plain"
    assert main(["publish", "--output", str(run), "--to", str(plain)]) == 0
    capsys.readouterr()
    assert main(["publish", "--output", str(plain), "--to", str(tmp_path / "again"), "--with-mention-vectors"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"note: --with-mention-vectors: {plain} keeps no mention vectors (its embed-entities ran with "
        "--no-mention-vectors, did not run, or it is a copy published without them): the copy has none, and a "
        "refresh from it encodes every window"]
    assert not (tmp_path / "again" / "mention_vectors").exists()


def test_validate_names_the_live_writer_of_a_run_it_finds_changing(run: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A stage committing into OUT moves its files in: validate said "not in the manifest (a stale or partial write)"
    and "invalid", where publish and export-kpr name the writer."""
    expected = stray_parquet(run)
    with lock.hold(str(run), "python run_pipeline.py dictionary"):
        holder = lock.read(str(run))
        with mock.patch.object(lock.LockInfo, "mine", lambda info: False):  # another process's
            assert main(["validate", "--output", str(run)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        *expected, f"{run} is being written by pid {holder.pid} on {holder.host} (command python run_pipeline.py "
                   f"dictionary, since {holder.started}): run validate again once it ends",
        f"invalid: {run} (stages: {STAGES}): 1 problem(s)"]


def test_a_run_whose_kept_work_is_gone_publishes_exports_diffs_and_reports_without_it(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """mention_vectors/ deleted (kept work no stage reads): publish without --with-mention-vectors, export-kpr, diff
    and report refused the run, and only a rerun of embed-entities (hours of GPU) made it usable again."""
    fake_report(run)
    shutil.rmtree(run / "mention_vectors")
    assert main(["validate", "--output", str(run)]) == 1  # validate still says so
    assert "mention_vectors/part-" in capsys.readouterr().err
    assert main(["publish", "--output", str(run), "--to", str(tmp_path / "published")]) == 0
    assert validate_run(str(tmp_path / "published")) == []
    assert main(["export-kpr", "--output", str(run), "--to", str(tmp_path / "kpr")]) == 0
    capsys.readouterr()
    assert main(["diff", "--old", str(tmp_path / "published"), "--new", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entities"]["added"] == 0
    assert main(["report", "--output", str(run), "--recall-queries", "2"]) == 0
    assert main(["publish", "--output", str(run), "--to", str(tmp_path / "with"), "--with-mention-vectors"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {run} does not validate (mention_vectors/part-")


@pytest.mark.parametrize("with_vectors", [False, True])
def test_a_published_copy_can_be_published_again(run: Path, tmp_path: Path, with_vectors: bool) -> None:
    """The copy's report stamp names the manifest the copy got (without mention_vectors/ unless asked): its report
    is current, where the stamp copied as it was named the run's manifest and the copy's publish was refused."""
    fake_report(run)
    first, second = tmp_path / "first", tmp_path / "second"
    vectors = ["--with-mention-vectors"] if with_vectors else []
    assert main(["publish", "--output", str(run), "--to", str(first), *vectors]) == 0
    stamp = (first / "report" / "manifest.sha256").read_text().strip()
    assert stamp == hashlib.sha256((first / "manifest.json").read_bytes()).hexdigest()
    assert main(["publish", "--output", str(first), "--to", str(second), *vectors]) == 0
    assert (second / "manifest.json").read_bytes() == (first / "manifest.json").read_bytes()
    assert validate_run(str(second)) == []


def test_publish_writes_the_manifest_last(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    destination = tmp_path / "published"
    assert main(["publish", "--output", str(run), "--to", str(destination)]) == 0
    stale = destination / "entities" / "part-00009-of-00010.parquet"  # left by an earlier publish
    shutil.copy(destination / ENTITIES, stale)
    written = owned.load_record(str(destination), publish_module.RECORD_FILE)
    owned.save_record(str(destination), publish_module.RECORD_FILE, [*written, str(stale.relative_to(destination))])
    real_copy = publish_module.copy_file
    copies: list[str] = []

    def watched_copy(source: str, target: str) -> None:
        assert not (destination / "manifest.json").exists()  # deleted before the first copy
        copies.append(target)
        real_copy(source, target)

    monkeypatch.setattr(publish_module, "copy_file", watched_copy)
    assert main(["publish", "--output", str(run), "--to", str(destination)]) == 0
    published = publish_module.published_stages(manifest.load(str(run)), kept=False)  # without mention_vectors/
    assert len(copies) == sum(len(stage.outputs) for stage in published.values())
    assert not stale.exists()
    assert manifest.load(str(destination)) == published
    assert validate_run(str(destination)) == []

    def failing_copy(source: str, target: str) -> None:
        if len(copies) == 4:
            raise OSError("connection reset")
        watched_copy(source, target)

    copies.clear()
    monkeypatch.setattr(publish_module, "copy_file", failing_copy)
    assert main(["publish", "--output", str(run), "--to", str(destination)]) == 2
    assert "connection reset" in capsys.readouterr().err
    assert (destination / ARTICLES).exists()  # copying had started (files go in path order) ...
    assert not (destination / "manifest.json").exists()  # ... but the copy never looks complete
    assert validate_run(str(destination))[0].startswith("manifest.json: missing")


def test_publish_refuses_a_destination_inside_the_run(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["publish", "--output", str(run), "--to", str(run / "published")]) == 2
    assert capsys.readouterr().err == (f"error: --to {run / 'published'} overlaps --output {run}: "
                                       "publish to a place outside the run\n")


def test_publish_into_a_directory_of_other_files_keeps_them(run: Path, tmp_path: Path) -> None:
    destination = tmp_path / "published"
    before = fill_with_files(destination)
    for _ in range(2):  # the second publish replaces the first's files, and only them
        assert main(["publish", "--output", str(run), "--to", str(destination)]) == 0
        assert {name: files_below(destination)[name] for name in before} == before
    assert validate_run(str(destination)) == []


@pytest.mark.parametrize(("users_file", "shown"), [("articles/my-own.parquet", "articles/my-own.parquet"),
                                                  ("report/index.html", "report/index.html"),
                                                  ("manifest.json/mine.txt", "manifest.json/"),
                                                  # a directory some stage writes, which this run has none of: the
                                                  # copy held the file, and did not validate
                                                  ("entity_id_map/mine.parquet", "entity_id_map/mine.parquet")])
def test_publish_refuses_a_file_it_did_not_write(run: Path, tmp_path: Path, users_file: str, shown: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    fake_report(run)
    destination = tmp_path / "published"
    before = fill_with_files(destination, ("notes.txt", "data/a.csv", users_file))
    assert main(["publish", "--output", str(run), "--to", str(destination)]) == 2
    assert capsys.readouterr().err == (f"error: --to {destination} already holds {destination}/{shown}, which no "
                                       "earlier publish wrote: nothing was copied (move it away or publish to "
                                       "another place)\n")
    assert files_below(destination) == before  # nothing deleted, nothing copied


def test_publish_refuses_a_file_it_did_not_write_after_an_earlier_publish(run: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    destination = tmp_path / "published"
    assert main(["publish", "--output", str(run), "--to", str(destination)]) == 0
    mine = destination / "entities" / "mine.parquet"
    shutil.copy(run / ENTITIES, mine)
    before = files_below(destination)
    assert main(["publish", "--output", str(run), "--to", str(destination)]) == 2
    assert f"already holds {mine}, which no earlier publish wrote" in capsys.readouterr().err
    assert files_below(destination) == before  # the earlier publish is still complete, manifest included


@pytest.mark.parametrize("command", ["publish", "export-kpr"])
def test_a_record_naming_a_file_outside_the_destination_deletes_nothing(command: str, full_run: Path,
                                                                         tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    destination, users = tmp_path / "written", tmp_path / "users-notes.txt"
    assert main([command, "--output", str(full_run), "--to", str(destination)]) == 0
    users.write_text("the user's")
    record = ".kpr-publish.json" if command == "publish" else kpr_export.RECORD_FILE
    written = owned.load_record(str(destination), record)
    owned.save_record(str(destination), record, [*written, "../users-notes.txt"])  # damaged or hand-edited
    before = files_below(destination)
    assert main([command, "--output", str(full_run), "--to", str(destination)]) == 2
    assert capsys.readouterr().err == (f"error: {destination / record} is not a record of written files: it lists "
                                       f"'../users-notes.txt', which is not a path below {destination}; nothing "
                                       "was changed (move the record away to write here)\n")
    assert users.read_text() == "the user's"
    assert files_below(destination) == before


@pytest.mark.parametrize("command", ["publish", "export-kpr"])
def test_a_destination_another_run_of_the_command_writes_is_refused_and_left_to_it(
        command: str, full_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    destination = tmp_path / "written"
    assert main([command, "--output", str(full_run), "--to", str(destination)]) == 0
    assert not (destination / lock.LOCK_NAME).exists()  # released
    with lock.hold(str(destination), command):  # as another run of it holds it while it writes
        holder = lock.read(str(destination))
        before = files_below(destination)
        with mock.patch.object(lock.LockInfo, "mine", lambda info: False):  # not this process's own: another's
            assert main([command, "--output", str(full_run), "--to", str(destination)]) == 2
        assert capsys.readouterr().err == (f"error: {destination} is in use by pid {holder.pid} on {holder.host} "
                                           f"since {holder.started} (command {command}); remove "
                                           f"{destination / lock.LOCK_NAME} if that command no longer writes "
                                           f"{destination}\n")
        assert files_below(destination) == before


# --- export-kpr ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("inside", ["", "articles", "published/kpr"])
def test_export_refuses_a_directory_overlapping_the_run(run: Path, inside: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    target = run / inside if inside else run
    before = files_below(run)
    assert main(["export-kpr", "--output", str(run), "--to", str(target)]) == 2
    assert capsys.readouterr().err == (f"error: --to {target} overlaps --output {run}: export to a place outside "
                                       "the run\n")
    assert files_below(run) == before
    assert validate_run(str(run)) == []


def test_export_refuses_a_link_into_the_run(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "kpr"
    link.symlink_to(run / "articles", target_is_directory=True)
    before = files_below(run)
    assert main(["export-kpr", "--output", str(run), "--to", str(link)]) == 2
    assert capsys.readouterr().err == f"error: --to {link} overlaps --output {run}: export to a place outside the run\n"
    assert files_below(run) == before


@pytest.mark.parametrize(("users_file", "shown"), [("entity_vocab.tsv", "entity_vocab.tsv"),
                                                  ("entity_linker/my.txt", "entity_linker/my.txt"),
                                                  ("embeddings.pt", "embeddings.pt"),
                                                  ("entity_embeddings.npy/x.bin", "entity_embeddings.npy/"),
                                                  (".kpr-export.json/y.txt", ".kpr-export.json/"),
                                                  (".export-staging/z.txt", ".export-staging/z.txt")])
def test_export_refuses_a_file_it_did_not_write(full_run: Path, tmp_path: Path, users_file: str, shown: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    export = tmp_path / "kpr"
    before = fill_with_files(export, ("notes.txt", "data/a.csv", "data/deep/b.bin", users_file))
    assert main(["export-kpr", "--output", str(full_run), "--to", str(export)]) == 2
    assert capsys.readouterr().err == (f"error: --to {export} already holds {export}/{shown}, which no earlier "
                                       "export-kpr wrote: nothing was written (move it away or export to another "
                                       "directory)\n")
    assert files_below(export) == before


def test_export_into_a_directory_of_other_files_keeps_them(full_run: Path, tmp_path: Path) -> None:
    export = tmp_path / "kpr"
    before = fill_with_files(export)
    for _ in range(2):
        assert main(["export-kpr", "--output", str(full_run), "--to", str(export)]) == 0
        after = files_below(export)
        assert {name: after[name] for name in before} == before
    linker = sorted(f"entity_linker/{path.name}" for path in (full_run / "dictionary" / "linker").iterdir())
    assert owned.load_record(str(export), ".kpr-export.json") == {"entity_vocab.tsv", "entity_embeddings.npy",
                                                                    "embeddings.pt", *linker}
    assert sorted(after) == sorted([*before, ".kpr-export.json", "entity_vocab.tsv", "entity_embeddings.npy",
                                    "embeddings.pt", *linker])


def test_export_replaces_its_own_files_and_removes_its_stale_ones(full_run: Path, tmp_path: Path) -> None:
    export = tmp_path / "kpr"
    assert main(["export-kpr", "--output", str(full_run), "--to", str(export)]) == 0
    stale = export / "entity_linker" / "from-an-older-linker.bin"
    stale.write_bytes(b"old")
    record = owned.load_record(str(export), kpr_export.RECORD_FILE)
    owned.save_record(str(export), kpr_export.RECORD_FILE, [*record, "entity_linker/from-an-older-linker.bin"])
    vocab = export / "entity_vocab.tsv"
    vocab.write_text("[PAD]\t0\n")  # an export's own file, changed since: replaced
    assert main(["export-kpr", "--output", str(full_run), "--to", str(export)]) == 0
    assert not stale.exists()
    assert len(vocab.read_text().splitlines()) == entity_count(full_run) + 1
    assert owned.load_record(str(export), kpr_export.RECORD_FILE) == record


def test_a_killed_exports_staging_directory_is_its_own(full_run: Path, tmp_path: Path) -> None:
    export = tmp_path / "kpr"
    fill_with_files(export, (".export-staging/entity_vocab.tsv", ".export-staging/entity_linker/x"))
    owned.save_record(str(export), kpr_export.RECORD_FILE, [".export-staging/"])  # as a killed export left it
    assert main(["export-kpr", "--output", str(full_run), "--to", str(export)]) == 0
    assert not (export / ".export-staging").exists()
    assert ".export-staging/" not in owned.load_record(str(export), kpr_export.RECORD_FILE)
    assert (export / "entity_vocab.tsv").read_text().startswith("[PAD]\t0\n")


def test_an_export_past_the_file_size_limit_is_one_line(full_run: Path, tmp_path: Path) -> None:
    """embeddings.pt past `ulimit -f` (or a disk filled meanwhile): torch.save's RuntimeError ("unexpected pos 704 vs
    598"), which names no errno, was a traceback and exit 1."""
    assert main(["export-kpr", "--output", str(full_run), "--to", str(tmp_path / "whole")]) == 0
    tensor = (tmp_path / "whole" / "embeddings.pt").stat().st_size
    scratch = ((tmp_path / "whole" / "entity_embeddings.npy").stat().st_size - 128) * 2 + 128  # its float32 rows
    limit = (scratch + tensor) // 2  # the scratch rows fit, embeddings.pt does not

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    found = subprocess.run([sys.executable, str(REPO / "run_pipeline.py"), "export-kpr", "--output", str(full_run),
                            "--to", str(tmp_path / "limited")], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                           preexec_fn=limited, capture_output=True, text=True, timeout=300, check=False)
    assert (found.returncode, found.stderr.splitlines()[-1:]) == (2, [
        "error: a write refused (File too large) ([Errno 27] File too large): the output (or the file the standard "
        "output was redirected to) is incomplete; free some space (or raise the limit) and run the command again"])


def test_the_exports_memory_maps_hold_their_blocks_before_rows_are_written(tmp_path: Path) -> None:
    """A sparse file's map ran out of disk as rows were written: a SIGBUS ("Bus error", exit 135, the export's
    staging and lock left), where allocating first is an OSError the command line says in one line."""
    path = tmp_path / "rows.npy"
    rows = kpr_export.allocated_memmap(str(path), np.float32, (4096, 64))
    assert path.stat().st_blocks * 512 >= path.stat().st_size >= 4096 * 64 * 4
    assert rows.shape == (4096, 64) and not rows.any()


def test_export_kpr_loads_with_numpy_and_marisa(full_run: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    export = tmp_path / "kpr"
    for _ in range(2):  # a second export replaces the first
        assert main(["export-kpr", "--output", str(full_run), "--to", str(export)]) == 0
    assert sorted(path.name for path in export.iterdir()) == [".kpr-export.json", "embeddings.pt",
                                                               "entity_embeddings.npy", "entity_linker",
                                                               "entity_vocab.tsv"]
    entities = pq.read_table(full_run / ENTITIES).sort_by("entity_id")
    keys = pc.coalesce(entities.column("qid"), entities.column("title")).to_pylist()
    count = len(keys)

    vocab = (export / "entity_vocab.tsv").read_text(encoding="utf-8").splitlines()
    assert vocab == ["[PAD]\t0", *(f"{key}\t{index}" for index, key in enumerate(keys, 1))]

    embeddings = pq.read_table(full_run / EMBEDDINGS)
    vectors = np.load(export / "entity_embeddings.npy")
    dim = embeddings.schema.field("embedding").type.list_size
    assert vectors.dtype == np.float16 and vectors.shape == (count + 1, dim)
    assert not vectors[0].any()
    ids = embeddings.column("entity_id").to_numpy()
    assert np.array_equal(vectors[ids], faiss_shards.table_vectors(embeddings).astype(np.float16))

    trie = marisa_trie.Trie()
    trie.load(str(export / "entity_linker" / "kb_id.trie"))
    assert len(trie) == count
    for line in vocab[1:]:
        key, index = line.split("\t")
        assert trie[key] + 1 == int(index)

    linker = full_run / "dictionary" / "linker"
    assert sorted(path.name for path in (export / "entity_linker").iterdir()) == sorted(
        path.name for path in linker.iterdir())
    for path in linker.iterdir():
        assert (export / "entity_linker" / path.name).read_bytes() == path.read_bytes()
    assert capsys.readouterr().out.splitlines()[-3:] == [
        f"  entities: {count:,}", f"  dim: {dim}", "  entities without embeddings (zero rows): 0"]


def load_tsv_mapping(path: Path) -> dict[str, int]:
    """The reference's ``kembed.utils.load_tsv_mapping(path, int)``, by its rules: each line stripped on the right,
    split on tabs, the first two fields are key and value, a later line wins."""
    mapping = {}
    with open(path) as lines:
        for line in lines:
            key, value = line.rstrip().split("\t")[:2]
            mapping[key] = int(value)
    return mapping


def reference_entity_table(entity_vocab_file: Path, entity_embedding_dir: Path, norm: float) -> torch.Tensor:
    """The entity embedding table the reference's ``train.py`` builds (``build_hf_model.py`` does the same, then
    ``.half()``): ``embeddings.pt`` and ``entity_vocab.tsv`` read from ``--entity_embedding_dir``, one row per
    ``--entity_vocab_file`` index (index 0 must be ``[PAD]`` and stays zero), L2-normalized, times ``norm``."""
    entity_vocab = load_tsv_mapping(entity_vocab_file)
    entity_embeddings = torch.load(os.path.join(entity_embedding_dir, "embeddings.pt"), weights_only=True)
    embedding_entity_vocab = load_tsv_mapping(entity_embedding_dir / "entity_vocab.tsv")
    table = torch.zeros(len(entity_vocab), entity_embeddings.size(1))
    for kb_id, index in entity_vocab.items():
        if index == 0:
            assert kb_id == "[PAD]"
            continue
        table[index] = entity_embeddings[embedding_entity_vocab[kb_id]]
    return F.normalize(table, p=2, dim=-1) * norm


def test_export_kpr_reads_as_the_reference_training_reads_it(full_run: Path, tmp_path: Path) -> None:
    """DIR is both the reference's --entity_vocab_file (DIR/entity_vocab.tsv) and its --entity_embedding_dir:
    every entity's row of embeddings.pt is its float32 vector, entity_embeddings.npy's row in float16."""
    export = tmp_path / "kpr"
    assert main(["export-kpr", "--output", str(full_run), "--to", str(export)]) == 0
    embeddings = pq.read_table(full_run / EMBEDDINGS)
    ids = embeddings.column("entity_id").to_numpy()
    vectors = faiss_shards.table_vectors(embeddings)
    count = entity_count(full_run)
    assert len(ids) == count  # every entity of the sample has a vector: no row below is zero by accident

    tensor = torch.load(export / "embeddings.pt", weights_only=True)
    assert tensor.dtype == torch.float32 and tuple(tensor.shape) == (count + 1, vectors.shape[1])
    assert not tensor[0].any()
    assert np.array_equal(tensor.numpy()[ids], vectors)
    assert np.array_equal(tensor.numpy().astype(np.float16), np.load(export / "entity_embeddings.npy"))
    target = float(embeddings.schema.metadata[b"target_norm"])
    np.testing.assert_allclose(np.linalg.norm(tensor.numpy()[1:], axis=1), target, rtol=1e-5)

    norm = 3.5  # the reference's scale: the mean norm of the trained model's input token embeddings
    table = reference_entity_table(export / "entity_vocab.tsv", export, norm)
    assert tuple(table.shape) == (count + 1, vectors.shape[1]) and not table[0].any()
    expected = torch.tensor(vectors) / torch.tensor(vectors).norm(dim=1, keepdim=True) * norm
    torch.testing.assert_close(table[torch.tensor(ids)], expected)


def test_the_export_keys_entities_as_the_dictionary_built_their_ids():
    """An empty QID is no QID: the dictionary keys the entity by its title in kb_id.trie, and so does the export
    (it kept the empty string)."""
    batch = pa.record_batch({"qid": ["Q1", "", None], "title": ["A", "B", "C"]})
    assert kpr_export.entity_key_column(batch).to_pylist() == ["Q1", "B", "C"]


def test_embeddings_written_to_a_remote_store_are_the_local_ones(full_run: Path, tmp_path: Path,
                                                                   system_temp: Path) -> None:
    """On an object store both files are written locally (with the float32 scratch rows beside them), uploaded,
    and the local copies removed."""
    keys = kpr_export.entity_keys(str(full_run))
    local, remote = tmp_path / "local", tmp_path / "remote"
    written = [kpr_export.write_embeddings(str(full_run), staging, keys) for staging in (str(local), mirrored(remote))]
    assert written[0] == written[1] == (pq.read_schema(full_run / EMBEDDINGS).field("embedding").type.list_size, 0,
                                        ())
    assert os.listdir(system_temp) == []
    assert sorted(path.name for path in local.iterdir()) == sorted(path.name for path in remote.iterdir()) == [
        "embeddings.pt", "entity_embeddings.npy"]
    assert (remote / "entity_embeddings.npy").read_bytes() == (local / "entity_embeddings.npy").read_bytes()
    assert torch.equal(torch.load(remote / "embeddings.pt", weights_only=True),
                       torch.load(local / "embeddings.pt", weights_only=True))


@pytest.mark.parametrize("row", ["first", "middle", "last"])
def test_export_zero_rows_for_entities_without_embeddings(run: Path, tmp_path: Path, row: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A zero row is exported as it is; the first or last one is said in a warning (the reference's
    build_hf_model.py scales every entity vector to the norm of row 1 or of the last row of the model it converts)."""
    ids = sorted(pq.read_table(run / EMBEDDINGS).column("entity_id").to_pylist())
    assert ids[0] == 1 and ids[-1] == entity_count(run)
    dropped = [ids[4], {"first": ids[0], "middle": ids[5], "last": ids[-1]}[row]]
    rewrite_parquet(run, EMBEDDINGS, lambda table: table.filter(
        pc.invert(pc.is_in(table.column("entity_id"), pa.array(dropped, pa.int32())))))
    assert validate_run(str(run)) == []  # an entity without mentions has no embedding: not a problem
    assert main(["export-kpr", "--output", str(run), "--to", str(tmp_path / "kpr")]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "  entities without embeddings (zero rows): 2"
    warned = {"first": f"warning: entity 1 of {ids[-1]:,} has no embedding, a zero row in this export: a model "
                       "build_hf_model.py builds with it has a zero row 1, and every later knowledge update of that "
                       "model makes every entity vector zero: it scales them to the updated model's row 1\n",
              "middle": "",
              "last": f"warning: entity {ids[-1]:,} of {ids[-1]:,} has no embedding, a zero row in this export: a "
                      "model train.py trains with it (its entity table) and build_hf_model.py then builds has every "
                      "entity vector zero: it scales them to that table's last row\n"}[row]
    assert captured.err == warned
    vectors = np.load(tmp_path / "kpr" / "entity_embeddings.npy")
    assert [int(row) for row in np.flatnonzero(~vectors.any(axis=1))] == [0, *sorted(dropped)]
    tensor = torch.load(tmp_path / "kpr" / "embeddings.pt", weights_only=True).numpy()
    assert [int(row) for row in np.flatnonzero(~tensor.any(axis=1))] == [0, *sorted(dropped)]


def test_export_refuses_a_run_without_entities(tiny_bert: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """No link reached an article: the run validates with no entity, and export-kpr stopped on an IndexError."""
    run = tmp_path / "out"
    write_parsed(run, [article(1, "Lonely", "An article that links nowhere.", []),
                       article(2, "Alone", "Neither does this one.", [])])
    for command in ("dictionary", "mentions", "embed-entities"):
        assert main(stage_command(command, run, tiny_bert)) == 0
    assert validate_run(str(run)) == []
    capsys.readouterr()
    assert main(["export-kpr", "--output", str(run), "--to", str(tmp_path / "kpr")]) == 2
    assert capsys.readouterr().err == (f"error: {run} has no entity (no link of its articles reached an article): "
                                       "nothing to export\n")
    assert not (tmp_path / "kpr").exists()


def test_export_of_a_linker_of_another_language_warns_that_the_reference_tokenizes_english(
        tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reference's DictionaryEntityLinker tokenizes with spacy.blank("en") whatever it loads: a linker built
    with --language it is exported as it is (its config names the language), with a warning."""
    run = tmp_path / "out"
    write_parsed(run, [article(1, "Argento", "L'Argento è un metallo.", []),
                       article(2, "Metallo", "Come l'Argento. Argento e oro.", [("Argento", "Argento")])])
    for command, extra in (("dictionary", ("--language", "it")), ("mentions", ()), ("embed-entities", ())):
        assert main(stage_command(command, run, tiny_bert, *extra)) == 0
    assert validate_run(str(run)) == []
    capsys.readouterr()
    assert main(["export-kpr", "--output", str(run), "--to", str(tmp_path / "kpr")]) == 0
    assert capsys.readouterr().err == (
        "warning: the linker was built with --language it: the reference's DictionaryEntityLinker finds names on "
        "English token boundaries (spacy.blank(\"en\")): KPR finds a name only where English tokens part it (not "
        "after an elision such as l'Argento, nor inside unspaced text)\n")
    assert json.loads((tmp_path / "kpr" / "entity_linker" / "config.json").read_text())["language"] == "it"


def test_export_refuses_a_run_without_entity_embeddings(run: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    stages = manifest.load(str(run))
    del stages["embed_entities"]
    manifest.save(str(run), stages)
    export = tmp_path / "kpr"
    assert main(["export-kpr", "--output", str(run), "--to", str(export)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {run} has no completed embed-entities stage")
    assert not export.exists()


def test_export_refuses_an_invalid_run(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    expected = stray_parquet(run)
    export = tmp_path / "kpr"
    assert main(["export-kpr", "--output", str(run), "--to", str(export)]) == 2
    assert capsys.readouterr().err == (f"error: {run} does not validate ({expected[0]}): `python run_pipeline.py "
                                       f"validate --output {run}` lists every problem\n")
    assert not export.exists()


# --- readers read what the manifest records ------------------------------------------------------------------


def test_recorded_files_are_the_manifests_not_the_folders(run: Path) -> None:
    stray = run / "entities" / "part-stray.parquet"
    shutil.copy(run / ENTITIES, stray)
    assert manifest.recorded_files(str(run), "entities") == [str(run / ENTITIES)]
    assert manifest.recorded_files(str(run), "entity_embeddings") == [str(run / EMBEDDINGS)]  # not entities/
    linker = manifest.recorded_files(str(run), "dictionary/linker", suffix="")
    assert linker == sorted(str(path) for path in (run / "dictionary" / "linker").rglob("*") if path.is_file())
    assert sum(batch.num_rows for batch in manifest.recorded_batches(str(run), "entities")) == entity_count(run)
    with pytest.raises(tables.MissingArtifactError) as missing:
        manifest.recorded_files(str(run), "passages", stages={})
    assert missing.value.message == f"no passages/*.parquet recorded in {run / 'manifest.json'}"


def test_export_reads_no_stray_entity_file(run: Path) -> None:
    stray = run / "entities" / "part-stray.parquet"
    entities = pq.read_table(run / ENTITIES)
    pq.write_table(pa.concat_tables([entities, entities.slice(0, 3)]), stray)  # extra rows, repeated ids
    keys = kpr_export.entity_keys(str(run))
    assert len(keys) == entity_count(run)  # a glob would read the stray rows and refuse the repeated ids
    rows = sorted(entities.to_pylist(), key=lambda row: row["entity_id"])
    assert keys.to_pylist() == [row["qid"] or row["title"] for row in rows]


def test_library_errors_are_typed_and_name_no_flag(tmp_path: Path) -> None:
    """artifacts/run raises typed errors worded without CLI flags; pipelines/ words the hint with the flags."""
    from artifacts.run.report.build import NoManifestError, write_report

    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(publish_module.OverlappingDestinationError) as overlap:
        publish_module.publish_run(str(out), str(out / "published"))
    assert (overlap.value.output, overlap.value.destination) == (str(out), str(out / "published"))
    with pytest.raises(publish_module.LatestLocationError) as latest:
        publish_module.publish_run(str(out), "gs://bucket", latest=True)
    assert latest.value.destination == "gs://bucket"
    with pytest.raises(kpr_export.MissingStagesError) as missing:
        kpr_export.check_exportable(str(out))
    assert missing.value.missing == ("dictionary", "embed_entities")
    with pytest.raises(NoManifestError) as no_manifest:
        write_report(str(out), {})
    for error in (overlap, latest, missing, no_manifest):
        assert "--" not in error.value.message and "run_pipeline" not in error.value.message, error.value.message
    assert not (out / "published").exists() and not (out / "report").exists()


@pytest.mark.parametrize("key", ["Q43\r", "a\tb", "two\nlines", "[PAD]"])
def test_the_vocabulary_refuses_keys_its_readers_would_split_or_take_for_padding(key: str) -> None:
    """The KPR reference reads entity_vocab.tsv as text lines split at tabs: a carriage return ends a line there
    too, and a second ``[PAD]`` replaces the padding row's key."""
    def lines(keys: list[str]) -> list[str]:
        kb_keys = marisa_trie.Trie(keys)
        return list(kpr_export.vocab_lines(sorted(keys, key=kb_keys.get), 1, kb_keys))

    assert sorted(line.split("\t")[0] for line in lines(["Q1", "Mercury (planet)"])) == ["Mercury (planet)", "Q1"]
    with pytest.raises(InputError, match="is \\[PAD\\] or has a tab or line break"):
        lines(["Q1", key])


def flip_middle(path: Path) -> None:
    """16 bytes in the middle of ``path`` inverted: its size stays, its sha256 does not."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 16] = bytes(byte ^ 0xFF for byte in data[middle:middle + 16])
    path.write_bytes(bytes(data))


def test_report_and_diff_refuse_a_file_changed_in_place(run: Path, full_run: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """16 flipped bytes of the entity embeddings: report crashed on infinite norms, diff showed them as data."""
    damaged = next((run / "entity_embeddings").glob("*.parquet"))
    flip_middle(damaged)
    capsys.readouterr()
    for command in (["report", "--output", str(run)], ["diff", "--old", str(full_run), "--new", str(run)]):
        assert main(command) == 2, command
        assert (f"is incomplete (entity_embeddings/{damaged.name}: its sha256 differs from the manifest's, written "
                "by its 'embed-entities' stage)") in capsys.readouterr().err, command


def test_a_stage_whose_output_changed_in_place_runs_again(run: Path, tiny_bert: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Rerunning after the damage skipped every stage and failed validation, run after run."""
    damaged = next((run / "articles").glob("*.parquet"))
    flip_middle(damaged)
    assert main(stage_command("parse", run, tiny_bert)) == 0
    assert (f"[parse] articles/{damaged.name}: its sha256 differs from the manifest's: it runs again"
            in capsys.readouterr().err)
    assert main(stage_command("dictionary", run, tiny_bert)) == 0
    assert "[dictionary] skipped" in capsys.readouterr().err
    assert validate_run(str(run)) == []


def test_a_stage_whose_output_was_cut_short_or_deleted_says_why(run: Path, tiny_bert: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A file of another size or a missing one reran the stage without a word (one changed in place says why)."""
    cut = next((run / "articles").glob("*.parquet"))
    size = cut.stat().st_size
    cut.write_bytes(cut.read_bytes()[:1000])
    assert main(stage_command("parse", run, tiny_bert)) == 0
    assert f"[parse] articles/{cut.name}: 1000 bytes, manifest says {size}: it runs again" in capsys.readouterr().err
    gone = next((run / "redirects").glob("*.parquet"))
    gone.unlink()
    assert main(stage_command("parse", run, tiny_bert)) == 0
    assert f"[parse] redirects/{gone.name}: missing: it runs again" in capsys.readouterr().err
    assert validate_run(str(run)) == []
