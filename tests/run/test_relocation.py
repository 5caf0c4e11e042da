"""A run is relocatable: index.json names the run's own artifacts relative to OUT (with their digests), so a
moved OUT searches exactly as in place and still validates; index.json files of older runs, which hold absolute
paths, are read as before."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from artifacts import layout
from artifacts.errors import InputError
from artifacts.faiss.info import artifact_digest, load_index_info
from artifacts.run import manifest
from artifacts.run.validation import validate_run
from encoders.kpr_checkpoint import init_kpr_checkpoint
from encoders.kpr_config import KPRSettings
from encoders.retrievers import EncoderOptions
from pipelines.index import index_inputs
from pipelines.launcher.cli import main
from tests.conftest import DIRECT, copy_stages
from transforms.index.graph import COUNTERS

QUERIES = ["Anarchism", "Autism", "Albedo", "political philosophy"]
BEFORE_INDEX = (layout.PARSE_STAGE, layout.DICTIONARY_STAGE, layout.MENTIONS_STAGE, layout.EMBED_ENTITIES_STAGE)


def search_json(output: Path, capsys: pytest.CaptureFixture) -> list[dict]:
    capsys.readouterr()
    assert main(["search", "--output", str(output), *[arg for query in QUERIES for arg in ("--query", query)],
                 "-k", "5", "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.fixture(scope="module")
def kpr_run(full_run: Path, tiny_bert: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``full_run``'s stages up to embed-entities, then an index built with a KPR encoder (which reads the run's
    linker and entity embeddings) in 2 shards."""
    root = tmp_path_factory.mktemp("kpr-run")
    output = root / "out"
    copy_stages(full_run, output, BEFORE_INDEX)
    init_kpr_checkpoint(str(tiny_bert), str(root / "kpr"), KPRSettings(entity_embedding_size=32))
    assert main(["index", "--output", str(output), "--encoder", str(root / "kpr"), "--encoder-type", "kpr",
                 "--max-length", "64", "--shards", "2", *DIRECT]) == 0
    return output


def test_index_json_names_the_runs_artifacts_relative_to_out_with_their_digests(kpr_run):
    text = (kpr_run / layout.INDEX / "index.json").read_text()
    assert str(kpr_run) not in text
    info = load_index_info(str(kpr_run / layout.INDEX))
    assert (info.encoder["linker"], info.encoder["entity_embeddings"]) == (layout.LINKER, layout.ENTITY_EMBEDDINGS)
    recorded = [(item.path, item.sha256) for record in manifest.load(str(kpr_run)).values()
                for item in record.outputs]
    assert info.inputs == {layout.LINKER: artifact_digest(recorded, layout.LINKER),
                           layout.ENTITY_EMBEDDINGS: artifact_digest(recorded, layout.ENTITY_EMBEDDINGS)}
    assert len(set(info.inputs.values())) == 2
    counted = manifest.load(str(kpr_run))[layout.INDEX_STAGE].counters
    assert counted["kpr_entities"] > 0 and set(counted) <= set(COUNTERS)


@pytest.mark.parametrize("run", ["kpr_run", "full_run"])
def test_a_moved_run_searches_exactly_as_in_place_and_validates(run, request, tmp_path, capsys):
    source = tmp_path / "before"
    shutil.copytree(request.getfixturevalue(run), source)
    in_place = search_json(source, capsys)
    assert sum(len(result["hits"]) for result in in_place) == 5 * len(QUERIES)

    moved = Path(shutil.move(source, tmp_path / "elsewhere" / "after"))
    assert not source.exists()
    assert validate_run(str(moved)) == []
    assert search_json(moved, capsys) == in_place


@pytest.mark.parametrize(("stage", "artifact"), [(layout.DICTIONARY_STAGE, layout.LINKER),
                                               (layout.EMBED_ENTITIES_STAGE, layout.ENTITY_EMBEDDINGS)])
def test_a_linker_or_entities_changed_after_the_index_was_built_are_refused(kpr_run, tmp_path, capsys, stage,
                                                                           artifact):
    """Its stage run again (another digest recorded): the refusal alone, not first a warning that the index answers
    from what that stage wrote before."""
    output = Path(shutil.copytree(kpr_run, tmp_path / "out"))
    records = manifest.load(str(output))
    record = records[stage]
    record.outputs = [item if not item.path.startswith(artifact + "/") else
                      manifest.OutputFile(item.path, item.bytes, "0" * 64, item.rows) for item in record.outputs]
    manifest.save(str(output), records)
    assert main(["search", "--output", str(output), "--query", "Anarchism"]) == 2
    assert capsys.readouterr().err == (f"error: {output / artifact} changed after the index was built from it: rerun "
                                       f"`python run_pipeline.py index --output {output} --force ...`\n")


@pytest.mark.parametrize("same_size", [False, True], ids=["replaced", "changed-in-place"])
def test_entity_embeddings_whose_files_changed_after_the_index_was_built_are_refused(kpr_run, tmp_path, capsys,
                                                                                     same_size):
    """The manifest unchanged, the file not: another file in its place (another size), or a byte changed with its
    size and modification time kept (hashed: the file was never remembered as verified)."""
    output = Path(shutil.copytree(kpr_run, tmp_path / "out"))
    target = sorted((output / layout.ENTITY_EMBEDDINGS).glob("*.parquet"))[0]
    stamp = target.stat()
    data = bytearray(target.read_bytes())
    if same_size:
        data[len(data) // 2] ^= 0xFF
    else:
        data += b"more"
    target.write_bytes(bytes(data))
    os.utime(target, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert main(["search", "--output", str(output), "--query", "Anarchism"]) == 2
    assert (f"error: {output / layout.ENTITY_EMBEDDINGS} changed after the index was built from it: rerun "
            f"`python run_pipeline.py index --output {output} --force ...`") in capsys.readouterr().err


def test_an_unrecorded_file_among_the_entity_embeddings_is_refused(kpr_run, tmp_path, capsys):
    """The query encoder reads every Parquet file of entity_embeddings/: one the manifest does not record (here a
    copy of a recorded one: its vectors would override theirs) changed a KPR search's answers without a word."""
    output = Path(shutil.copytree(kpr_run, tmp_path / "out"))
    recorded = sorted((output / layout.ENTITY_EMBEDDINGS).glob("*.parquet"))[0]
    stray = output / layout.ENTITY_EMBEDDINGS / "zz-extra.parquet"
    shutil.copyfile(recorded, stray)
    assert main(["search", "--output", str(output), "--query", "Anarchism", "--verify"]) == 2
    assert capsys.readouterr().err == (
        f"error: {stray} is not recorded in the manifest of {output} and the query encoder would read it: remove it "
        f"(`python run_pipeline.py validate --output {output}` lists every such file)\n")


def test_names_relative_to_out_are_located_and_absolute_ones_kept():
    relative = EncoderOptions("kpr", "model", linker=layout.LINKER, entity_embeddings=layout.ENTITY_EMBEDDINGS)
    assert relative.located("/runs/new") == EncoderOptions(
        "kpr", "model", linker="/runs/new/dictionary/linker", entity_embeddings="/runs/new/entity_embeddings")
    old = EncoderOptions("kpr", "model", linker="/runs/old/dictionary/linker",
                         entity_embeddings="gs://bucket/old/entity_embeddings")
    assert old.located("/runs/new") == old  # index.json of an older run: absolute paths, read as before
    dense = EncoderOptions("mean", "model")
    assert dense.located("/runs/new") == dense


def test_a_dense_encoder_records_no_run_inputs(full_run):
    assert load_index_info(str(full_run / layout.INDEX)).inputs == {}
    assert index_inputs(EncoderOptions("mean", "model"), str(full_run)) == {}
    with pytest.raises(InputError):
        load_index_info(str(full_run / "no-index"))
