"""`all`: every stage in order, resume after a kill, reruns driven by options and inputs, progress lines."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from artifacts import layout
from artifacts.errors import SettingError
from artifacts.run import manifest
from pipelines import run_all
from pipelines.launcher import stage
from pipelines.launcher.cli import build_parser, command_parser, main
from tests.builders import all_command, artifact_rows, signal_all_in_embed_entities
from tests.conftest import BUNDLED_SAMPLE, DIRECT, copy_stages

# Artifacts compared row by row; the key columns give the order rows are compared in.
ARTIFACT_KEYS = {
    "articles": ["page_id"],
    "redirects": ["title"],
    "entities": ["entity_id"],
    "dictionary/names": ["name", "entity_id"],
    "mentions": ["entity_id", "page_id", "start"],
    "entity_embeddings": ["entity_id"],
    "passages": ["passage_id"],
}


def sorted_rows(output: Path, artifact: str) -> list[dict]:
    rows = artifact_rows(output, artifact)
    return sorted(rows, key=lambda row: [row[key] for key in ARTIFACT_KEYS[artifact]])


def index_ids(output: Path) -> dict[str, list[int]]:
    info = json.loads((output / "index" / "index.json").read_text())
    return {"count": info["count"], "ids": sorted(
        row["passage_id"] for path in (output / "index" / "embeddings").rglob("*.parquet")
        for row in pq.read_table(path, columns=["passage_id"]).to_pylist())}


def assert_same_artifacts(actual: Path, expected: Path) -> None:
    """The same rows in key order; vectors equal to float tolerance (batches may differ between runs)."""
    for artifact in ARTIFACT_KEYS:
        got, want = sorted_rows(actual, artifact), sorted_rows(expected, artifact)
        assert len(got) == len(want) > 0, artifact
        if artifact == "entity_embeddings":
            np.testing.assert_allclose([row.pop("embedding") for row in got],
                                       [row.pop("embedding") for row in want], rtol=1e-4, atol=1e-5)
        assert got == want, artifact
    assert index_ids(actual) == index_ids(expected)


def finished_at(output: Path) -> dict[str, str]:
    return {name: record.finished_at for name, record in manifest.load(str(output)).items()}


@pytest.fixture(scope="module")
def all_run(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> Path:
    output = tmp_path_factory.mktemp("all") / "out"
    assert main(all_command(output, tiny_bert)) == 0
    return output


# --- the whole pipeline ----------------------------------------------------------------------------------------


def test_all_equals_the_stages_run_one_by_one_and_validates_and_reports(all_run, full_run):
    assert set(manifest.load(str(all_run))) == {"parse", "dictionary", "mentions", "embed_entities", "index"}
    assert_same_artifacts(all_run, full_run)
    assert (all_run / "report" / "index.html").stat().st_size > 0
    assert main(["validate", "--output", str(all_run)]) == 0


def test_a_second_run_skips_every_stage(all_run, tiny_bert, capsys):
    before = finished_at(all_run)
    assert main(all_command(all_run, tiny_bert, "--no-report")) == 0
    err = capsys.readouterr().err
    for name in ("parse", "dictionary", "mentions", "embed-entities", "index"):
        assert f"[{name}] skipped: outputs complete, inputs and options unchanged" in err
        assert f"[{name}] running" not in err
    assert finished_at(all_run) == before


def test_a_changed_option_reruns_that_stage_and_what_reads_it(all_run, tiny_bert, tmp_path, capsys):
    output = tmp_path / "out"
    shutil.copytree(all_run, output)
    before = finished_at(output)
    assert main(all_command(output, tiny_bert, "--no-report", "--seed", "7")) == 0
    err = capsys.readouterr().err
    after = finished_at(output)
    assert [name for name in before if before[name] != after[name]] == ["embed_entities", "mentions"]
    assert "[index] skipped" in err  # passages are cut from the articles, which did not change
    assert main(["validate", "--output", str(output)]) == 0


def test_force_reruns_the_named_stage(all_run, tiny_bert, tmp_path, capsys):
    output = tmp_path / "out"
    shutil.copytree(all_run, output)
    before = finished_at(output)
    assert main(all_command(output, tiny_bert, "--no-report", "--force", "dictionary")) == 0
    after = finished_at(output)
    assert before["dictionary"] != after["dictionary"]
    assert before["parse"] == after["parse"]
    assert_same_artifacts(output, all_run)


def test_a_run_killed_inside_a_stage_resumes_to_the_same_artifacts(all_run, full_run, tiny_bert, tmp_path):
    """SIGKILL the whole process group once embed-entities is writing into its staging area, then rerun.
    OUT starts with the first three stages of ``full_run``, so that the run gets to embed-entities at once."""
    output = tmp_path / "out"
    killed_run = signal_all_in_embed_entities(full_run, tiny_bert, output, signal.SIGKILL)
    assert killed_run.returncode == -signal.SIGKILL, "the run was killed before it could finish"
    killed = manifest.load(str(output))
    assert set(killed) == {"parse", "dictionary", "mentions"}, "a killed stage never looks finished"

    result = killed_run.rerun()
    assert result.returncode == 0, result.stderr
    for name in ("parse", "dictionary", "mentions"):
        assert f"[{name}] skipped" in result.stderr
    for name in ("embed-entities", "index"):
        assert f"[{name}] running" in result.stderr
    assert not (output / stage.STAGING_DIR / "embed_entities").exists()
    assert_same_artifacts(output, all_run)


def test_a_crash_while_committing_leaves_the_stage_unfinished_and_a_rerun_repairs_it(
        all_run, tiny_bert, tmp_path, monkeypatch):
    output = tmp_path / "out"
    shutil.copytree(all_run, output)
    moves = []
    real_rename = stage.FileSystems.rename

    def rename_then_die(sources, destinations):
        real_rename(sources, destinations)
        if any(f"/{layout.STAGING}/" in path for path in destinations):
            return  # the Beam sinks' own renames, inside the staging directory
        moves.append(sources)
        # after the old record is dropped and the first file moved into OUT, before the new record (counted by
        # the commit's own moves: the manifest itself is replaced by os.replace, not through FileSystems)
        raise OSError("simulated crash while committing")

    monkeypatch.setattr(stage.FileSystems, "rename", rename_then_die)
    with pytest.raises(OSError, match="simulated crash"):
        main(["mentions", "--output", str(output), "--max-mentions", "4", "--max-seq-length", "64", "--force",
              *DIRECT])
    monkeypatch.undo()
    assert "mentions" not in manifest.load(str(output))
    assert main(all_command(output, tiny_bert, "--no-report")) == 0
    assert main(["validate", "--output", str(output)]) == 0
    assert_same_artifacts(output, all_run)


# --- options and preflight -------------------------------------------------------------------------------------


def test_all_takes_every_flag_of_every_stage_with_its_default():
    """`all` gives one value to an option several stages define: one definition, the same flag and default as in
    the stage's own command."""
    parser = build_parser()
    in_all = {flag: action.default for action in command_parser(parser, "all")._actions
              for flag in action.option_strings}
    for command in layout.STAGE_COMMANDS.values():
        for action in command_parser(parser, command)._actions:
            for flag in set(action.option_strings) - {"--force"}:
                assert in_all[flag] == action.default, (command, flag)
    args, _ = parser.parse_known_args(["all", "--output", "o", "--device", "cuda", "--max-seq-length", "96"])
    assert (args.device, args.max_seq_length, args.batch_tokens) == ("cuda", 96, 16384)


def test_force_names_stages():
    assert run_all.forced_stages(None) == set()
    assert run_all.forced_stages([]) == {"parse", "dictionary", "mentions", "embed_entities", "index"}
    assert run_all.forced_stages(["embed-entities", "parse"]) == {"embed_entities", "parse"}


def test_missing_encoder_stops_before_any_stage_runs(tiny_bert, tmp_path, capsys):
    output = tmp_path / "out"
    argv = ["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(output), "--model", str(tiny_bert), *DIRECT]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == "error: index needs --encoder NAME_OR_PATH (a dense retriever or a " \
                                              "KPR checkpoint)"
    assert not (output / "manifest.json").exists()


def test_missing_model_stops_before_any_stage_runs(tmp_path, capsys):
    argv = ["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp_path), "--model", str(tmp_path / "nope"),
            "--encoder", "x", *DIRECT]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and str(tmp_path / "nope") in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "manifest.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_is_checked_here_only_when_the_workers_run_here(tiny_bert, tmp_path):
    """A CPU launcher may start a GPU job on a remote runner (its workers check their own device when they load
    the model); with a local runner the missing GPU is one line before anything runs."""
    args = build_parser().parse_args(["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp_path), "--model",
                                      str(tiny_bert), "--encoder", str(tiny_bert), "--encoder-type", "mean",
                                      "--device", "cuda"])
    with pytest.raises(SettingError, match="no CUDA device is available"):
        run_all.preflight(args, list(DIRECT))
    run_all.preflight(args, ["--runner=DataflowRunner"])
    assert stage.workers_run_here([]) and stage.workers_run_here(["--runner=FnApiRunner"])
    assert not stage.workers_run_here(["--runner", "apache_beam.runners.portability.flink_runner.FlinkRunner"])



def test_a_stage_whose_inputs_vanished_names_the_stage_to_rerun(full_run, tiny_bert, tmp_path, capsys):
    output = tmp_path / "out"
    shutil.copytree(full_run, output)
    shutil.rmtree(output / "entity_embeddings")
    argv = ["index", "--output", str(output), "--encoder", str(tiny_bert), "--encoder-type", "kpr", *DIRECT]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the outputs of 'embed-entities' under ") and "missing" in err
    assert f"rerun `python run_pipeline.py embed-entities --output {output} --force ...` first" in err


def test_a_stray_file_in_an_upstream_artifact_is_refused_before_the_stage_reads_it(full_run, tmp_path, capsys):
    """A Parquet file that parse did not write, in articles/: dictionary would glob it as articles; it refuses,
    naming the file, and writes nothing."""
    output = tmp_path / "out"
    copy_stages(full_run, output, ("parse",))
    stray = output / "articles" / "part-99999-of-99999.parquet"
    shutil.copyfile(next((output / "articles").glob("*.parquet")), stray)
    assert main(["dictionary", "--output", str(output), *DIRECT]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {stray} is not an output of 'parse' (its manifest record does not list it) and 'dictionary' "
        f"would read it: remove it, or rerun `python run_pipeline.py parse --output {output} --force ...`"]
    assert not (output / "entities").exists() and set(manifest.load(str(output))) == {"parse"}
    stray.unlink()
    assert main(["dictionary", "--output", str(output), *DIRECT]) == 0
