"""OUT/manifest.json: a damaged one (cut short, not JSON, JSON of another shape, a missing or mistyped field) is met
by every command that reads it with one line naming the file, what is wrong and what to do, exit 2, and is left
byte for byte as it was; a recorded file that is gone is named with the stage to rerun."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from artifacts import layout
from artifacts.errors import DamagedManifestError
from artifacts.run import manifest
from artifacts.run.validation import validate_run
from pipelines.launcher.cli import main
from tests.builders import all_command, stage_command
from tests.conftest import BUNDLED_SAMPLE, DIRECT, REPO, copy_stages


def manifest_bytes(damage: str, data: bytes) -> bytes:
    """The recorded manifest ``data`` damaged as ``damage`` says."""
    if damage == "cut short":
        return data[:len(data) // 2]
    if damage == "not JSON":
        return b"<html><body>502 Bad Gateway</body></html>\n"
    if damage == "another shape":
        return json.dumps({"format": 1, "stages": [{"stage": "parse"}]}).encode()
    document = json.loads(data)
    if damage == "a missing field":
        del document["stages"]["dictionary"]["outputs"]
    else:  # a mistyped field
        document["stages"]["mentions"]["outputs"][0]["bytes"] = "1,024"
    return json.dumps(document).encode()


# what each damage is called in the line (after "OUT/manifest.json is damaged: "), from the damaged bytes
PROBLEMS: dict[str, Callable[[bytes], str]] = {
    "cut short": lambda damaged: f"it is cut short (its JSON ends after {len(damaged):,} bytes)",
    "not JSON": lambda _: "it is not JSON (Expecting value at line 1, column 1)",
    "another shape": lambda _: 'it has "stages" as a list, not an object',
    "a missing field": lambda _: "its stage 'dictionary' has no \"outputs\"",
    "a mistyped field": lambda _: "its stage 'mentions' outputs[0] has \"bytes\" as a string",
}
HINT = ("it is left as it is: restore it from a copy of the run (one that `publish` wrote), or delete it and run "
        "the stages again (they recompute everything)")
DAMAGES = list(PROBLEMS)


@pytest.mark.parametrize("damage", DAMAGES)
def test_each_damage_is_named(full_run: Path, damage: str) -> None:
    damaged = manifest_bytes(damage, (full_run / "manifest.json").read_bytes())
    with pytest.raises(DamagedManifestError) as raised:
        manifest.parse("OUT/manifest.json", damaged)
    assert raised.value.message == f"OUT/manifest.json is damaged: {PROBLEMS[damage](damaged)}"


def test_other_damages_are_named() -> None:
    cases = {b"": "it is empty", b"\xff\xfe{}": "byte 0 is not UTF-8 text",
             b'{"stages": {"parse": {"stage": "parse", "opt': "it is cut short (its JSON ends after 44 bytes)",
             b'{"stages": {"parse": [1]}}': "its stage 'parse' is a list, not an object",
             b'[]': 'it holds a list, not a manifest (an object with "stages")',
             b'{"format": 1}': 'it has no "stages"',
             b'{"stages": {"parse": {"stage": "parse", "options": {}, "inputs": {}, "outputs": [], '
             b'"wall_time_s": true}}}': "its stage 'parse' has \"wall_time_s\" as a boolean",
             **{b'{"stages": {"index": {"stage": "index", "options": {}, "inputs": {}, "outputs": [], '
                + field.encode() + b'}}}': problem for field, problem in (
                    ('"counters": {"passages": "many"}', "its stage 'index' has counters['passages'] as a string"),
                    ('"counters": {"passages": true}', "its stage 'index' has counters['passages'] as a boolean"),
                    ('"versions": {"python": 3}', "its stage 'index' has versions['python'] as a number"))},
             b'{"stages": {"index": {"stage": "index", "options": {}, "inputs": {"stage:parse": []}, "outputs": []}}}':
                "its stage 'index' has inputs['stage:parse'] as a list",
             b'{"format": 2, "stages": {}}': "it is of format 2, where this version reads format 1",
             b'{"format": "1", "stages": {}}': "it is of format '1', where this version reads format 1",
             **{b'{"stages": {"index": {"stage": "index", "options": {}, "inputs": {}, "outputs": [{"path": "'
                + path.encode() + b'", "bytes": 1, "sha256": "ab"}]}}}':
                f"its stage 'index' outputs[0] has \"path\" {path!r}, not a path below the run's directory"
                for path in ("../run2/index/a.faiss", "/etc/passwd", "index/../../x", "gs://b/x", "")},
             **{b'{"stages": {"index": {"stage": "index", "options": {}, "inputs": {}, "outputs": [{"path": "i/a", '
                + sizes.encode() + b', "sha256": "ab"}]}}}': f"its stage 'index' outputs[0] has {problem}, below zero"
                for sizes, problem in (('"bytes": 1, "rows": -1', '"rows" -1'), ('"bytes": -5', '"bytes" -5'))}}
    for data, problem in cases.items():
        with pytest.raises(DamagedManifestError) as raised:
            manifest.parse("m.json", data)
        assert raised.value.message == f"m.json is damaged: {problem}", data


def test_a_record_with_fields_of_a_later_version_reads() -> None:
    data = {"format": 1, "stages": {"parse": {"stage": "parse", "options": {"a": 1}, "inputs": {}, "outputs": [
        {"path": "articles/a.parquet", "bytes": 3, "sha256": "ab", "rows": 1, "codec": "zstd"}], "new": True}}}
    records = manifest.parse("m.json", json.dumps(data).encode())
    assert records["parse"].options == {"a": 1}
    assert records["parse"].outputs == [manifest.OutputFile("articles/a.parquet", 3, "ab", 1)]


def command_lines(out: Path, fresh: Path, work: Path, model: Path) -> dict[str, list[str]]:
    """Every command that reads OUT's manifest, as a user runs it on the full run in ``out`` (``--previous``: a
    stage of the intact copy ``fresh`` that names ``out`` as the previous run; ``work``: where evaluate's questions
    are and where export-kpr and publish would write)."""
    return {
        "parse": ["parse", "--dump", str(BUNDLED_SAMPLE), "--output", str(out), *DIRECT],
        **{command: stage_command(command, out, model) for command in
           ("dictionary", "mentions", "embed-entities", "index")},
        "all": all_command(out, model),
        "all --force": all_command(out, model, "--force"),
        "search": ["search", "--output", str(out), "--query", "Greek philosopher"],
        "evaluate": ["evaluate", "--output", str(out), "--questions", str(work / "questions.tsv")],
        "export-kpr": ["export-kpr", "--output", str(out), "--to", str(work / "kpr")],
        "validate": ["validate", "--output", str(out)],
        "diff --old": ["diff", "--old", str(out), "--new", str(fresh)],
        "diff --new": ["diff", "--old", str(fresh), "--new", str(out)],
        "report": ["report", "--output", str(out)],
        "report --previous": ["report", "--output", str(fresh), "--previous", str(out)],
        "publish": ["publish", "--output", str(out), "--to", str(work / "published")],
        "embed-entities --previous": stage_command("embed-entities", fresh, model, "--previous", str(out)),
        "index --previous": stage_command("index", fresh, model, "--previous", str(out)),
        "all --previous": all_command(fresh, model, "--previous", str(out)),
    }


COMMANDS = list(command_lines(Path("o"), Path("f"), Path("w"), Path("m")))


def files_and_bytes(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}


@pytest.fixture(scope="module")
def damaged_runs(full_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A copy of the full run per damage, its manifest damaged so (read-only to the tests: none may write)."""
    runs = {}
    for damage in DAMAGES:
        out = Path(shutil.copytree(full_run, tmp_path_factory.mktemp("damaged") / "out"))
        (out / "manifest.json").write_bytes(manifest_bytes(damage, (full_run / "manifest.json").read_bytes()))
        runs[damage] = out
    return runs


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_damaged_manifest_is_one_line_exit_2_and_left_as_it_was(command: str, damage: str,
                                                                  damaged_runs: dict[str, Path], full_run: Path,
                                                                  tiny_bert: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = damaged_runs[damage]
    fresh = Path(shutil.copytree(full_run, tmp_path / "fresh"))
    (tmp_path / "questions.tsv").write_text("who was Aristotle\t['philosopher']\n", encoding="utf-8")
    argv = command_lines(out, fresh, tmp_path, tiny_bert)[command]
    before, fresh_before = files_and_bytes(out), files_and_bytes(fresh)
    assert main(argv) == 2
    path = out / "manifest.json"
    problem = PROBLEMS[damage](path.read_bytes())
    assert capsys.readouterr().err.splitlines() == [f"error: {path} is damaged: {problem}; {HINT}"]
    assert files_and_bytes(out) == before, "nothing under the damaged run changed"
    assert files_and_bytes(fresh) == fresh_before, "nothing under the other run changed"
    assert not (tmp_path / "kpr").exists() and not (tmp_path / "published").exists()


ARTICLES = "articles/part-00000-of-00001.parquet"
EMBEDDINGS = "entity_embeddings/part-00000-of-00001.parquet"
SHARD = "index/shard-00000.faiss"
PARSE_CHANGED = ["error: the outputs of 'parse' under {out} changed after it ran ({file}: missing): rerun `python "
                 "run_pipeline.py parse --output {out} --force ...` first"]
INDEX_CHANGED = ["error: the index under {out} changed after it was recorded ({file}: missing): rerun `python "
                 "run_pipeline.py index --output {out} ... --force`"]
INVALID = ["error: {out} does not validate ({file}: missing): `python run_pipeline.py validate --output {out}` lists "
           "every problem"]
# command -> (the recorded file removed: one it reads, its exit status, its stderr with {out} and {file})
GONE = {
    "dictionary": (ARTICLES, 2, PARSE_CHANGED),
    "embed-entities": (ARTICLES, 2, PARSE_CHANGED),
    "search": (SHARD, 2, INDEX_CHANGED),
    "evaluate": (SHARD, 2, INDEX_CHANGED),
    "export-kpr": (EMBEDDINGS, 2, INVALID),
    "publish": (SHARD, 2, INVALID),
    "validate": (SHARD, 1, ["{file}: missing", "invalid: {out} (stages: dictionary, embed-entities, index, mentions, "
                                               "parse): 1 problem(s)"]),
    "diff --old": (EMBEDDINGS, 2, ["error: {out} is incomplete ({file}: missing, written by its 'embed-entities' "
                                   "stage): restore the file, or rerun `python run_pipeline.py embed-entities --output "
                                   "{out} --force ...`"]),
    "report": (SHARD, 2, ["error: {out} is incomplete ({file}: missing, written by its 'index' stage): restore the "
                          "file, or rerun `python run_pipeline.py index --output {out} --force ...`"]),
}


@pytest.mark.parametrize("command", list(GONE))
def test_a_recorded_file_that_is_gone_is_named_with_what_to_do(command: str, full_run: Path, tiny_bert: Path,
                                                               tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = Path(shutil.copytree(full_run, tmp_path / "out"))
    relative, status, expected = GONE[command]
    (out / relative).unlink()
    (tmp_path / "questions.tsv").write_text("who was Aristotle\t['philosopher']\n", encoding="utf-8")
    before = files_and_bytes(out)
    assert main(command_lines(out, full_run, tmp_path, tiny_bert)[command]) == status
    assert capsys.readouterr().err.splitlines() == [line.format(out=out, file=relative) for line in expected]
    assert files_and_bytes(out) == before


def test_a_run_being_written_is_said_to_be_so(full_run: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A reader that meets a file a stage is committing (a live process holds OUT's lock) says who writes OUT, not
    that the run is damaged and must be restored or rerun."""
    out = Path(shutil.copytree(full_run, tmp_path / "out"))
    (out / SHARD).unlink()
    with subprocess.Popen(["sleep", "60"]) as writer:
        info = {"host": socket.gethostname(), "pid": writer.pid, "command": "run_pipeline.py index", "started": "T"}
        (out / ".lock").write_text(json.dumps(info))
        try:
            assert main(["report", "--output", str(out)]) == 2
        finally:
            writer.kill()
    assert capsys.readouterr().err.splitlines() == [
        f"error: {out} is incomplete ({SHARD}: missing, written by its 'index' stage): {out} is being written by pid "
        f"{writer.pid} on {socket.gethostname()} (command run_pipeline.py index, since T): run this again once it "
        "ends"]


READERS_OF_A_RUN_BEING_PUBLISHED = {  # what each misses in a run without its manifest
    "search": "{out} has no manifest.json (no stage has finished there, or it was removed)",
    "report": "{out} has no manifest.json",
    "export-kpr": "{out} has no completed dictionary or embed-entities stage",
    "diff": "{out} is not a run: it has no manifest.json",
}


@pytest.mark.parametrize("command", sorted(READERS_OF_A_RUN_BEING_PUBLISHED))
def test_a_run_being_published_is_said_to_be_so(command: str, full_run: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A reader of a run that `publish` is copying in (no manifest until its last file is in) says what it missed
    and who writes the run, not what to run first: the run is on its way. An error of the command's own (a
    questions file not found) says nothing of the writer."""
    out = Path(shutil.copytree(full_run, tmp_path / "out"))
    (out / "manifest.json").unlink()
    argv = {"search": ["search", "--output", str(out), "--query", "Aristotle"],
            "report": ["report", "--output", str(out)],
            "export-kpr": ["export-kpr", "--output", str(out), "--to", str(tmp_path / "kpr")],
            "diff": ["diff", "--old", str(out), "--new", str(full_run)]}[command]
    with subprocess.Popen(["sleep", "60"]) as writer:
        info = {"host": socket.gethostname(), "pid": writer.pid, "command": "run_pipeline.py publish", "started": "T"}
        (out / ".lock").write_text(json.dumps(info))
        try:
            assert main(argv) == 2
            assert main(["evaluate", "--output", str(out), "--questions", str(tmp_path / "none.tsv")]) == 2
        finally:
            writer.kill()
    assert capsys.readouterr().err.splitlines() == [
        f"error: {READERS_OF_A_RUN_BEING_PUBLISHED[command].format(out=out)}: {out} is being written by pid "
        f"{writer.pid} on {socket.gethostname()} (command run_pipeline.py publish, since T): run this again once it "
        "ends", f"error: question file {tmp_path / 'none.tsv'} not found"]


def stage_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.endswith(("] running", "] skipped: outputs complete, inputs "
                                                                "and options unchanged"))]


def test_a_stage_whose_own_recorded_file_is_gone_runs_again(full_run: Path, tiny_bert: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The resume rule: `all` skips the stages whose recorded outputs are there and reruns the one whose are not
    (and those that read what it rewrote, when it changed)."""
    out = Path(shutil.copytree(full_run, tmp_path / "out"))
    (out / SHARD).unlink()
    assert main(all_command(out, tiny_bert, "--no-report")) == 0
    assert stage_lines(capsys.readouterr().err) == [
        f"[{command}] skipped: outputs complete, inputs and options unchanged"
        for command in ("parse", "dictionary", "mentions", "embed-entities")] + ["[index] running"]
    assert (out / SHARD).read_bytes() == (full_run / SHARD).read_bytes()


def test_a_dictionary_of_other_thresholds_reruns_no_stage_that_reads_only_its_entities(
        full_run: Path, tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """mentions and embed-entities read the dictionary's entities/ alone: another --min-link-prob changes its names
    and linker, not its entities, and they are skipped (they ran again: embed-entities' model pass, all of it with
    --no-mention-vectors), not stale. A record of an earlier version (the digest of all the dictionary's outputs)
    is kept while those outputs are the same, and runs the stage once when they change."""
    out = Path(shutil.copytree(full_run, tmp_path / "out"))
    stages = manifest.load(str(out))
    dictionary = stages[layout.DICTIONARY_STAGE]
    whole = manifest.stage_input(layout.DICTIONARY_STAGE)
    entities_only = manifest.stage_input(layout.DICTIONARY_STAGE, (layout.ENTITIES,))
    assert stages[layout.MENTIONS_STAGE].inputs[entities_only] == dictionary.outputs_digest((layout.ENTITIES,))
    del stages[layout.MENTIONS_STAGE].inputs[entities_only]
    stages[layout.MENTIONS_STAGE].inputs[whole] = dictionary.outputs_digest()  # as an earlier version recorded it
    manifest.save(str(out), stages)
    for command in ("mentions", "embed-entities"):
        assert main(stage_command(command, out, tiny_bert)) == 0
    assert stage_lines(capsys.readouterr().err) == [
        f"[{command}] skipped: outputs complete, inputs and options unchanged" for command in ("mentions",
                                                                                            "embed-entities")]
    assert main(stage_command("dictionary", out, tiny_bert, "--min-link-prob", "0.5")) == 0
    assert files_and_bytes(out / "entities") == files_and_bytes(full_run / "entities")
    assert files_and_bytes(out / "dictionary") != files_and_bytes(full_run / "dictionary")
    capsys.readouterr()
    for command in ("mentions", "embed-entities", "mentions"):
        assert main(stage_command(command, out, tiny_bert)) == 0
    assert stage_lines(capsys.readouterr().err) == [  # the earlier version's record, once
        "[mentions] running", *(f"[{command}] skipped: outputs complete, inputs and options unchanged"
                                for command in ("embed-entities", "mentions"))]
    assert files_and_bytes(out / "mentions") == files_and_bytes(full_run / "mentions")
    assert entities_only in manifest.load(str(out))[layout.MENTIONS_STAGE].inputs
    assert validate_run(str(out)) == []


def test_a_previous_run_with_a_file_gone_is_recomputed_saying_why(full_run: Path, tiny_bert: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """--previous: a previous run that does not validate is not reused (the refresh rule), and the line names the
    file; with --require-reuse it is one line and exit 2 (OUT holds no index of its own to lend vectors)."""
    previous = Path(shutil.copytree(full_run, tmp_path / "previous"))
    (previous / SHARD).unlink()
    out = tmp_path / "out"
    out.mkdir()
    copy_stages(full_run, out, tuple(name for name in manifest.load(str(full_run)) if name != layout.INDEX_STAGE))
    argv = stage_command("index", out, tiny_bert, "--previous", str(previous))
    assert main([*argv, "--require-reuse"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "[index] running", f"error: cannot reuse the previous run: {previous} does not validate ({SHARD}: missing)"]
    assert main(argv) == 0
    assert (f"[index] recomputing everything: {previous} does not validate ({SHARD}: missing)"
            in capsys.readouterr().err.splitlines())


def as_an_ordinary_user(arguments: list[str]) -> subprocess.CompletedProcess:
    """`run_pipeline.py arguments` with the file modes applying to it: as root, without the capabilities that
    bypass them."""
    command = [sys.executable, str(REPO / "run_pipeline.py"), *arguments]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: file modes do not apply")
        dropped = "-dac_override,-dac_read_search"
        command = ["setpriv", f"--bounding-set={dropped}", f"--inh-caps={dropped}", *command]
    return subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.parametrize(("locked", "named"), [("", "manifest.json"), ("manifest.json", "manifest.json"),
                                               ("articles", ARTICLES)])
def test_a_run_this_user_may_not_read_is_said_so_not_missing(full_run: Path, tmp_path: Path, locked: str,
                                                             named: str) -> None:
    """Another user's run (mode 700 on a shared disk): no manifest, so no stage completed, or its files missing,
    and the stages to compute again, where the user may only not read it."""
    out = Path(shutil.copytree(full_run, tmp_path / "out"))
    (out / locked).chmod(0)
    try:
        found = as_an_ordinary_user(["validate", "--output", str(out)])
    finally:
        (out / locked).chmod(0o755)
    assert (found.returncode, found.stderr.splitlines()) == (2, [
        f"error: {out / named}: Permission denied: this user may not change (or read) it (its permissions, a "
        "read-only filesystem, a file marked immutable with chattr +i): fix that and run the command again"])


def test_a_manifest_that_is_a_directory_is_damaged(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(DamagedManifestError, match=r"manifest\.json is damaged: it is a directory$"):
        manifest.load(str(tmp_path))


def test_a_temporary_left_by_a_writer_killed_as_it_replaced_the_manifest_goes_at_the_next_save(tmp_path: Path) -> None:
    """A SIGKILL between writing the new manifest beside the old one and renaming it over left the temporary in OUT
    for good (validate does not look at OUT's own files)."""
    left = tmp_path / ".manifest.json.0123abcd.tmp"
    left.write_bytes(b'{"stages": {}}')
    other = tmp_path / ".report.json.0123abcd.tmp"  # another file's: not the manifest writer's to remove
    other.write_bytes(b"{}")
    manifest.save(str(tmp_path), {})
    assert sorted(path.name for path in tmp_path.iterdir()) == [other.name, "manifest.json"]
