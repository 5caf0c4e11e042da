"""artifacts.run.owned: what is in the way of a command's files, refused unless an earlier run recorded it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from artifacts.run import owned
from tests.builders import files_below, fill_with_files

RECORD = ".record.json"


def test_in_the_way_finds_files_directories_and_tree_contents(tmp_path: Path) -> None:
    fill_with_files(tmp_path, ("vocab.tsv", "linker/a.trie", "linker/sub/b.npy", "other.txt", "index"))
    (tmp_path / "vectors.npy").mkdir()
    (tmp_path / "empty").mkdir()
    found = owned.in_the_way(str(tmp_path), ["vocab.tsv", "vectors.npy", "missing.txt", "linker/c.trie"],
                             ["linker", "absent", "index", "empty"])
    assert found == ["index", "linker/a.trie", "linker/sub/b.npy", "vectors.npy/", "vocab.tsv"]


def test_a_file_no_run_recorded_is_refused_and_kept(tmp_path: Path) -> None:
    before = fill_with_files(tmp_path, ("vocab.tsv", "notes.txt"))
    with pytest.raises(owned.ForeignFileError) as refused:
        owned.require_owned(str(tmp_path), RECORD, ["vocab.tsv", "vectors.npy"], [], "export-kpr")
    assert refused.value.path == str(tmp_path / "vocab.tsv")
    assert refused.value.message == (f"{tmp_path / 'vocab.tsv'} is in the way and no earlier export-kpr wrote it: "
                                     "it is left as it is (move it away or write somewhere else)")
    assert files_below(tmp_path) == before


def test_recorded_files_are_owned_and_only_they_are_removed(tmp_path: Path) -> None:
    fill_with_files(tmp_path, ("vocab.tsv", "linker/old.trie", "notes.txt"))
    owned.save_record(str(tmp_path), RECORD, ["linker/old.trie", "vocab.tsv", "vocab.tsv"])
    earlier = owned.require_owned(str(tmp_path), RECORD, ["vocab.tsv", "linker/new.trie"], ["linker"], "export-kpr")
    assert earlier == {"vocab.tsv", "linker/old.trie"}
    assert owned.remove_stale(str(tmp_path), earlier, ["vocab.tsv", "linker/new.trie"]) == ["linker/old.trie"]
    assert sorted(files_below(tmp_path)) == [RECORD, "notes.txt", "vocab.tsv"]


def test_a_directory_at_a_recorded_file_path_is_refused(tmp_path: Path) -> None:
    owned.save_record(str(tmp_path), RECORD, ["vocab.tsv"])
    before = fill_with_files(tmp_path / "vocab.tsv")
    with pytest.raises(owned.ForeignFileError) as refused:
        owned.require_owned(str(tmp_path), RECORD, ["vocab.tsv"], [], "publish")
    assert refused.value.relative == "vocab.tsv/"
    assert files_below(tmp_path / "vocab.tsv") == before


def test_a_record_that_is_not_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / RECORD).write_text("my own notes")
    with pytest.raises(owned.InputError, match="is not a record of written files"):
        owned.load_record(str(tmp_path), RECORD)
    assert (tmp_path / RECORD).read_text() == "my own notes"


def test_a_recorded_directory_owns_what_is_below_it_and_is_not_removed_as_a_file(tmp_path: Path) -> None:
    fill_with_files(tmp_path, (".staging/a", ".staging/deep/b", "stale.txt"))
    owned.save_record(str(tmp_path), RECORD, [".staging/", "stale.txt"])
    earlier = owned.require_owned(str(tmp_path), RECORD, ["vocab.tsv"], [".staging"], "export-kpr")
    assert owned.is_owned(".staging/deep/b", earlier) and not owned.is_owned(".staging-other/b", earlier)
    assert owned.remove_stale(str(tmp_path), earlier, ["vocab.tsv"]) == ["stale.txt"]
    assert sorted(files_below(tmp_path)) == [".record.json", ".staging/a", ".staging/deep/b"]


@pytest.mark.parametrize("entry", ["../outside.txt", "linker/../../outside.txt", "OUTSIDE", "", 3])
def test_a_record_naming_a_file_outside_its_directory_is_refused_and_nothing_is_removed(tmp_path: Path,
                                                                                       entry: object) -> None:
    directory = tmp_path / "export"
    fill_with_files(directory, ("vocab.tsv",))
    (tmp_path / "outside.txt").write_text("the user's")
    entry = str(tmp_path / "outside.txt") if entry == "OUTSIDE" else entry
    (directory / RECORD).write_text(json.dumps({"files": ["vocab.tsv", entry]}))
    with pytest.raises(owned.InputError) as refused:
        owned.require_owned(str(directory), RECORD, ["vocab.tsv"], [], "export-kpr")
    assert refused.value.message == (f"{directory / RECORD} is not a record of written files: it lists {entry!r}, "
                                     f"which is not a path below {directory}; nothing was changed (move the record "
                                     "away to write here)")
    assert (tmp_path / "outside.txt").read_text() == "the user's"
    assert sorted(files_below(directory)) == [RECORD, "vocab.tsv"]


def test_a_directory_where_a_stale_file_was_recorded_is_left_alone(tmp_path: Path) -> None:
    """It was deleted as a file once the export had replaced its vocabulary: the command failed, with the new
    vocabulary committed and no record of it, and failed the same way at every rerun."""
    fill_with_files(tmp_path, ("vocab.tsv", "linker/trie", "old.bin"))
    (tmp_path / RECORD).write_text(json.dumps({"files": ["vocab.tsv", "linker", "linker/trie", "old.bin"]}))
    earlier = owned.require_owned(str(tmp_path), RECORD, ["vocab.tsv", "linker/trie"], [], "export-kpr")
    assert owned.remove_stale(str(tmp_path), earlier, ["vocab.tsv", "linker/trie"]) == ["old.bin"]
    assert sorted(files_below(tmp_path)) == [RECORD, "linker/trie", "vocab.tsv"]


def test_removing_stale_files_removes_the_directories_they_emptied_and_no_other(tmp_path: Path) -> None:
    fill_with_files(tmp_path, ("a/b/c/old.bin", "a/b/other/old.bin", "a/keep/mine.txt", "empty-before/x.bin"))
    (tmp_path / "a" / "b" / "users-empty").mkdir()
    removed = owned.remove_stale(str(tmp_path), ["a/b/c/old.bin", "a/b/other/old.bin", "a/keep/old.bin"], [])
    assert removed == ["a/b/c/old.bin", "a/b/other/old.bin", "a/keep/old.bin"]
    assert sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*")) == [
        "a", "a/b", "a/b/users-empty", "a/keep", "a/keep/mine.txt", "empty-before", "empty-before/x.bin"]
