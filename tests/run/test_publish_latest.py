"""publish --latest: ROOT/LATEST names the newest complete publish, moved only after its manifest is written."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from artifacts import fs
from artifacts.run import publish as publish_module
from artifacts.run.validation import validate_run
from pipelines.launcher.cli import main
from tests.builders import files_below, fill_with_files


@pytest.fixture
def run(full_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(full_run, tmp_path / "out"))


def pointer(root: Path) -> dict:
    return json.loads((root / "LATEST").read_text())


def manifest_sha256(published: Path) -> str:
    return hashlib.sha256((published / "manifest.json").read_bytes()).hexdigest()


def test_latest_names_the_published_run(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "published"
    assert main(["publish", "--output", str(run), "--to", str(root / "2026-01")]) == 0
    assert not (root / "LATEST").exists()  # only with --latest

    assert main(["publish", "--output", str(run), "--to", str(root / "2026-01"), "--latest"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"{root / 'LATEST'} now names {root / '2026-01'}"
    assert pointer(root) == {"name": "2026-01", "manifest_sha256": manifest_sha256(root / "2026-01")}
    assert publish_module.latest_run(str(root)) == str(root / "2026-01")
    assert sorted(path.name for path in root.iterdir()) == ["2026-01", "LATEST"]  # no temporary left


def test_latest_moves_only_after_a_complete_publish(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "published"
    assert main(["publish", "--output", str(run), "--to", str(root / "2026-01"), "--latest"]) == 0
    before = (root / "LATEST").read_bytes()
    real_copy = publish_module.copy_file
    copies: list[str] = []

    def failing_copy(source: str, target: str) -> None:
        if len(copies) == 4:
            raise OSError("connection reset")
        copies.append(target)
        real_copy(source, target)

    monkeypatch.setattr(publish_module, "copy_file", failing_copy)
    assert main(["publish", "--output", str(run), "--to", str(root / "2026-02"), "--latest"]) == 2
    assert "connection reset" in capsys.readouterr().err
    assert len(copies) == 4 and not (root / "2026-02" / "manifest.json").exists()
    assert (root / "LATEST").read_bytes() == before  # readers still find the complete 2026-01
    assert validate_run(publish_module.latest_run(str(root))) == []

    monkeypatch.setattr(publish_module, "copy_file", real_copy)
    real_replace = fs.write_bytes_atomic
    manifest_there: list[bool] = []

    def watched_replace(path: str, data: bytes) -> None:
        if path == str(root / "LATEST"):
            manifest_there.append((root / "2026-02" / "manifest.json").exists())
        real_replace(path, data)

    monkeypatch.setattr(fs, "write_bytes_atomic", watched_replace)
    assert main(["publish", "--output", str(run), "--to", str(root / "2026-02"), "--latest"]) == 0
    assert manifest_there == [True]
    assert pointer(root) == {"name": "2026-02", "manifest_sha256": manifest_sha256(root / "2026-02")}


def test_the_run_latest_came_to_name_while_waiting_is_not_published_into(run: Path, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Another publish --latest to ROOT/B ended (LATEST moved to B) after this publish to ROOT/B checked LATEST and
    before it took the lock: it is refused under the lock too (it rewrote the run LATEST named, both exit 0)."""
    root = tmp_path / "published"
    assert main(["publish", "--output", str(run), "--to", str(root / "B"), "--latest"]) == 0
    (root / "LATEST").write_text(json.dumps({"name": "A", "manifest_sha256": "0" * 64}) + "\n")
    real_hold = publish_module.lock.hold

    def hold_after_another_publish(destination: str, command: str):
        (root / "LATEST").write_text(json.dumps({"name": "B", "manifest_sha256": manifest_sha256(root / "B")}) + "\n")
        return real_hold(destination, command)

    monkeypatch.setattr(publish_module.lock, "hold", hold_after_another_publish)
    before = files_below(root / "B")
    assert main(["publish", "--output", str(run), "--to", str(root / "B")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --to {root / 'B'} is the run {root / 'LATEST'} names")
    assert files_below(root / "B") == before and validate_run(publish_module.latest_run(str(root))) == []


def test_latest_needs_a_root_and_a_name(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["publish", "--output", str(run), "--to", "gs://bucket", "--latest"]) == 2
    assert capsys.readouterr().err == ("error: --to gs://bucket: with --latest publish to ROOT/NAME "
                                       "(LATEST goes in ROOT)\n")


def test_latest_run_without_a_pointer(tmp_path: Path) -> None:
    with pytest.raises(publish_module.InputError, match="has no LATEST: nothing was published there"):
        publish_module.latest_run(str(tmp_path))


@pytest.mark.parametrize("users_latest", ["a directory of files", "a file"])
def test_a_latest_that_publish_did_not_write_is_refused_before_copying(run: Path, tmp_path: Path, users_latest: str,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "published"
    if users_latest == "a file":
        fill_with_files(root, ("LATEST", "notes.txt"))
    else:
        fill_with_files(root / "LATEST")
    before = files_below(root)
    assert main(["publish", "--output", str(run), "--to", str(root / "2026-01"), "--latest"]) == 2
    assert capsys.readouterr().err == (f"error: --latest: {root / 'LATEST'} is not a LATEST pointer that publish "
                                       "wrote: nothing was copied (move it away or publish under another ROOT)\n")
    assert files_below(root) == before
    assert not (root / "2026-01").exists()


def test_the_run_latest_names_is_not_published_into(run: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Publishing into ROOT/NAME removes its manifest.json while it copies: not the run LATEST names (its readers
    would find it incomplete, then LATEST would name a manifest that is not there), with --latest or without."""
    root = tmp_path / "published"
    assert main(["publish", "--output", str(run), "--to", str(root / "2026-01"), "--latest"]) == 0
    before = files_below(root)
    capsys.readouterr()
    for other in ([], ["--latest", "--with-mention-vectors"]):  # without --latest, or another copy of the run
        assert main(["publish", "--output", str(run), "--to", str(root / "2026-01"), *other]) == 2
        assert capsys.readouterr().err == (
            f"error: --to {root / '2026-01'} is the run {root / 'LATEST'} names: its readers would find it "
            "incomplete while the copy goes; publish under another NAME (with --latest to move LATEST to it); "
            "nothing was copied\n")
        assert files_below(root) == before
    (root / "current").symlink_to(root / "2026-01")  # a link to it is it (it was published into)
    assert main(["publish", "--output", str(run), "--to", str(root / "current")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --to {root / 'current'} is the run {root / 'LATEST'} names: ")
    (root / "current").unlink()
    assert files_below(root) == before
    # the same publish --latest again (a scheduler's retry of one killed once it had written LATEST): nothing to do
    assert main(["publish", "--output", str(run), "--to", str(root / "2026-01"), "--latest"]) == 0
    assert capsys.readouterr().out == (f"{root / '2026-01'} holds this run already and {root / 'LATEST'} names it: "
                                       "nothing to copy\n")
    assert files_below(root) == before
    # a copy that lost a file since does not hold this run (it said so): refused, another NAME with --latest repairs
    lost = next((root / "2026-01" / "entities").glob("*.parquet"))
    lost.rename(tmp_path / "lost.parquet")
    assert main(["publish", "--output", str(run), "--to", str(root / "2026-01"), "--latest"]) == 2
    assert capsys.readouterr().err.startswith(f"error: --to {root / '2026-01'} is the run {root / 'LATEST'} names: ")
    (tmp_path / "lost.parquet").rename(lost)
    assert main(["publish", "--output", str(run), "--to", str(root / "2026-02"), "--latest"]) == 0
    assert main(["publish", "--output", str(run), "--to", str(root / "2026-01")]) == 0  # no longer the latest
    assert pointer(root) == {"name": "2026-02", "manifest_sha256": manifest_sha256(root / "2026-02")}


def test_the_same_publish_latest_again_copies_the_runs_report_again(run: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """publish --latest again said "holds this run already ... nothing to copy" of a copy whose report had lost a
    plot, or whose run's report was written again since (as `all` does at every run): the copy kept the old page.
    Its report is copied again; the rest of the copy, its manifest first, is left as it is."""
    root, copy = tmp_path / "published", tmp_path / "published" / "2026-01"
    command = ["publish", "--output", str(run), "--to", str(copy), "--latest"]
    assert main(["report", "--output", str(run), "--recall-queries", "5"]) == 0
    assert main(command) == 0
    plot = next((copy / "report").glob("*.png"))
    plot.unlink()
    assert main(["report", "--output", str(run), "--recall-queries", "7"]) == 0
    page = run / "report" / "index.html"
    assert (copy / "report" / "index.html").read_bytes() != page.read_bytes()
    manifest_before = (copy / "manifest.json").stat()
    capsys.readouterr()
    assert main(command) == 0
    assert capsys.readouterr().out == (f"{copy} holds this run already and {root / 'LATEST'} names it: its report "
                                       "copied again (2 files)\n")  # the page and the lost plot (drawn the same)
    assert (copy / "report" / "index.html").read_bytes() == page.read_bytes() and plot.exists()
    assert (copy / "manifest.json").stat() == manifest_before
    assert validate_run(str(copy)) == []
    assert main(["report", "--output", str(run), "--recall-queries", "9"]) == 0  # the page alone changes
    capsys.readouterr()
    assert main(command) == 0
    assert capsys.readouterr().out.endswith("its report copied again (1 file)\n")
    assert main(command) == 0
    assert capsys.readouterr().out.endswith("names it: nothing to copy\n")
    assert main(["publish", "--output", str(copy), "--to", str(tmp_path / "again")]) == 0  # the copy's report current


def test_a_run_is_not_published_as_latest_where_the_pointer_goes(run: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """--to ROOT/LATEST --latest copied the whole run into ROOT/LATEST, then failed to write the pointer there (and
    every later publish --latest under ROOT was refused for a foreign LATEST)."""
    root = tmp_path / "published"
    assert main(["publish", "--output", str(run), "--to", str(root / "LATEST"), "--latest"]) == 2
    assert capsys.readouterr().err == (f"error: --latest: {root / 'LATEST'} is where the LATEST pointer goes: "
                                       "publish the run under another NAME; nothing was copied\n")
    assert not root.exists()
