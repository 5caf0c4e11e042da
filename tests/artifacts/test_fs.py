"""artifacts.fs: a file is replaced by rename on a local disk (one write on object stores), and a directory where
a file goes is refused and left with all its files; nothing is ever deleted as a tree; an input file is closed with
its decompressor."""

from __future__ import annotations

import bz2
import errno
import gzip
import hashlib
import os
from pathlib import Path

import pytest

from artifacts import fs
from artifacts.errors import InputError
from tests.builders import MirrorFileSystem, files_below, fill_with_files, mirrored


@pytest.mark.parametrize("remote", [False, True], ids=["local", "object-store"])
def test_a_directory_where_a_file_goes_is_refused_and_kept(tmp_path: Path, remote: bool) -> None:
    target = tmp_path / "out" / "sample"
    before = fill_with_files(target)
    path = mirrored(target) if remote else str(target)
    with pytest.raises(fs.DirectoryTargetError) as refused:
        fs.write_json_atomic(path, {"k": [1]})
    assert refused.value.message == f"{path} is a directory, not a file: it is left as it is"
    assert refused.value.path == path
    with pytest.raises(fs.DirectoryTargetError):
        fs.delete_file(path)
    assert files_below(target) == before
    assert sorted(os.listdir(tmp_path / "out")) == ["sample"]  # no temporary left beside it


def test_the_working_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = fill_with_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(fs.DirectoryTargetError) as refused:
        fs.write_bytes_atomic(".", b"{}")
    assert refused.value.message == ". is a directory, not a file: it is left as it is"
    assert files_below(tmp_path) == before


def test_a_file_is_replaced_by_rename(tmp_path: Path) -> None:
    fill_with_files(tmp_path)
    target = tmp_path / "results.json"
    target.write_text("old")
    inode = target.stat().st_ino
    fs.write_bytes_atomic(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert target.stat().st_ino != inode  # a new file renamed over the old one, not the old one rewritten
    assert sorted(os.listdir(tmp_path)) == ["data", "notes.txt", "results.json"]  # no temporary left


def test_a_new_file_gets_its_parent_and_the_usual_permissions(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir" / "results.json"
    fs.write_json_atomic(str(target), {"a": 1})
    assert target.read_text() == '{\n  "a": 1\n}\n'
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("remote", [False, True], ids=["local", "object-store"])
def test_a_files_digest_covers_every_chunk_and_the_short_last_one(tmp_path: Path, remote: bool) -> None:
    data = os.urandom(2 * fs._CHUNK + 12_345)  # two whole chunks read into the same buffer, then a part of one
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert fs.sha256(mirrored(path) if remote else str(path)) == hashlib.sha256(data).hexdigest()
    path.write_bytes(b"")
    assert fs.sha256(str(path)) == hashlib.sha256(b"").hexdigest()


def test_a_similarly_named_file_of_the_user_is_not_the_temporary(tmp_path: Path) -> None:
    own = tmp_path / "results.json.tmp"
    own.write_text("mine")
    fs.write_bytes_atomic(str(tmp_path / "results.json"), b"new")
    assert own.read_text() == "mine"


def test_object_store_file_is_written_whole(tmp_path: Path) -> None:
    target = tmp_path / "results.json"
    target.write_text("old")
    fs.write_bytes_atomic(mirrored(target), b"new")
    assert target.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["results.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    target = tmp_path / "results.json"
    target.write_text("old")

    def failing_replace(source: str, destination: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        fs.write_bytes_atomic(str(target), b"new")
    assert target.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["results.json"]


def test_a_file_written_through_an_atomic_target_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "store.parquet"
    target.write_bytes(b"old")
    with fs.atomic_target(str(target)) as local, open(local, "wb") as out:
        out.write(b"new, ")
        assert target.read_bytes() == b"old"  # written beside it until the block ends
        out.write(b"streamed")
    assert target.read_bytes() == b"new, streamed"
    with pytest.raises(ValueError, match="writer failed"), fs.atomic_target(str(target)) as local:
        Path(local).write_bytes(b"half")
        raise ValueError("writer failed")
    assert target.read_bytes() == b"new, streamed"
    assert sorted(os.listdir(tmp_path)) == ["store.parquet"]  # no temporary left
    with fs.atomic_target(mirrored(target)) as local:
        Path(local).write_bytes(b"uploaded")
    assert target.read_bytes() == b"uploaded"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device that is always full)")
def test_a_full_disk_met_through_an_atomic_target_names_the_file(tmp_path: Path) -> None:
    """A write's ENOSPC carries no file name: `report` on a full disk said "no space left" without saying where."""
    target = tmp_path / "report" / "index.html"
    with pytest.raises(OSError) as raised, fs.atomic_target(str(target)), open("/dev/full", "wb", buffering=0) as out:
        out.write(b"page")
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(target))
    assert str(target) in str(raised.value) and os.listdir(target.parent) == []


def test_delete_file_removes_a_file_and_ignores_a_missing_one(tmp_path: Path) -> None:
    target = tmp_path / "LOCK"
    target.write_text("x")
    fs.delete_file(str(target))
    fs.delete_file(str(target))
    assert not target.exists()


@pytest.mark.parametrize("remote", [False, True])
def test_a_tree_is_deleted_on_an_object_store_too(tmp_path: Path, remote: bool) -> None:
    """On an object store a directory is a prefix, which exists() does not see and a delete of its name does not
    empty: every file below it goes, the files of a name it prefixes ("index-old/") stay."""
    fill_with_files(tmp_path / "out" / "index")
    kept = fill_with_files(tmp_path / "out" / "index-old")
    directory = mirrored(tmp_path / "out" / "index") if remote else str(tmp_path / "out" / "index")
    assert fs.is_directory(directory) and fs.exists(directory) != remote
    fs.delete_tree(directory)
    assert fs.list_tree(directory) == [] and not fs.is_directory(directory)
    assert files_below(tmp_path / "out") == {f"index-old/{name}": data for name, data in kept.items()}
    fs.delete_tree(directory)  # nothing there: nothing to do


@pytest.mark.parametrize(("name", "compress"), [("lines.bz2", bz2.compress), ("lines.gz", gzip.compress),
                                                ("lines.tsv", bytes)])
def test_a_decompressed_input_closes_its_file_with_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
                                                       compress) -> None:
    path = tmp_path / name
    path.write_bytes(compress(b"first\nsecond\n"))
    opened = []
    real_open = fs.open_input
    monkeypatch.setattr(fs, "open_input", lambda where: opened.append(real_open(where)) or opened[-1])
    with fs.open_decompressed(str(path)) as stream:
        assert stream.readline() == b"first\n"
        assert not opened[0].closed
    assert opened[0].closed  # bz2 and gzip leave a file object they are handed open
    assert fs.is_compressed(str(path)) == (compress is not bytes)


def test_remote_files_are_read_several_at_a_time_in_their_order(tmp_path: Path) -> None:
    """A reduce reads one bucket from each of hundreds of files: where they are remote, the reads overlap (an
    object store answers each request after tens of ms); the results come in the files' order."""
    paths = []
    for index in range(40):
        (tmp_path / f"{index}.bin").write_bytes(bytes([index]) * (index + 1))
        paths.append(str(tmp_path / f"{index}.bin"))
    MirrorFileSystem.log.clear(delay=0.05)
    assert list(fs.read_each([mirrored(path) for path in paths], fs.read_bytes)) == [
        bytes([index]) * (index + 1) for index in range(40)]
    assert fs.REMOTE_READS // 2 < MirrorFileSystem.log.most_at_once <= fs.REMOTE_READS
    MirrorFileSystem.log.clear()
    under_way, most = [0], [0]

    def local_read(path: str) -> bytes:
        under_way[0] += 1
        most[0] = max(most[0], under_way[0])
        data = fs.read_bytes(path)
        under_way[0] -= 1
        return data

    assert list(fs.read_each(paths, local_read)) == [bytes([index]) * (index + 1) for index in range(40)]
    assert most == [1]  # local files one at a time


def test_a_failed_remote_read_is_raised_in_order(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"a")
    paths = [mirrored(tmp_path / "a.bin"), mirrored(tmp_path / "missing.bin"), mirrored(tmp_path / "a.bin")]
    read = fs.read_each(paths, fs.read_bytes)
    assert next(read) == b"a"
    with pytest.raises(OSError, match="missing"):
        next(read)


@pytest.fixture()
def gcs_bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``gs://bucket/NAME`` read through Beam's GCS reader and google's ``BlobReader`` as they are, only their HTTP
    requests answered from ``tmp_path/NAME``; returns the list each request's bytes are appended to."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.storage import Blob

    fetched: list[int] = []

    def reload(blob: Blob, *args, **kwargs) -> None:
        blob._properties.update(size=str((tmp_path / blob.name).stat().st_size), contentEncoding=None)

    def download_as_bytes(blob: Blob, *args, start: int = 0, end: int | None = None, **kwargs) -> bytes:
        with open(tmp_path / blob.name, "rb") as handle:
            handle.seek(start or 0)
            data = handle.read() if end is None else handle.read(end - (start or 0))
        fetched.append(len(data))
        return data

    monkeypatch.setattr(Blob, "reload", reload)
    monkeypatch.setattr(Blob, "download_as_bytes", download_as_bytes)
    monkeypatch.setattr(google.auth, "default", lambda *args, **kwargs: (AnonymousCredentials(), "project"))
    return fetched


def test_a_scattered_read_from_gcs_fetches_about_what_it_asks(tmp_path: Path, gcs_bucket: list[int]) -> None:
    """On GCS Beam's reader fetches 16 MB (or the rest of the file) at each read outside its buffer; a read through
    ``fs.open_ranges`` fetches what it asks or 256 KB, and exactly what it asks with ``read_ahead=0``."""
    data = os.urandom(20 << 20)
    (tmp_path / "part.arrow").write_bytes(data)
    with fs.open_ranges("gs://bucket/part.arrow") as handle:
        handle.seek(1_000_000)
        assert handle.read(65_536) == data[1_000_000:1_065_536]
        handle.seek(5_000_000)
        assert handle.read(400_000) == data[5_000_000:5_400_000]
    assert gcs_bucket == [fs.RANGE_READ_BYTES, 400_000]
    gcs_bucket.clear()
    with fs.open_ranges("gs://bucket/part.arrow", read_ahead=0) as handle:
        handle.seek(123)
        assert handle.read(4_567) == data[123:4_690]
    assert gcs_bucket == [4_567]
    gcs_bucket.clear()
    with fs.open_read("gs://bucket/part.arrow") as handle:  # Beam's reader as it is
        handle.seek(1_000_000)
        assert handle.read(65_536) == data[1_000_000:1_065_536]
    assert gcs_bucket == [16 << 20]


def test_a_directory_another_process_makes_meanwhile_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two commands starting at once on a new directory (two exports into DIR, two stages on a new OUT): Beam's local
    mkdirs refuses a directory that exists, which the other process made between this one's check and its mkdirs."""
    from apache_beam.io.filesystems import FileSystems

    target, checked = tmp_path / "out", []
    exists = FileSystems.exists

    def made_after_the_check(path: str) -> bool:
        checked.append(path)
        if len(checked) == 1:
            target.mkdir()  # by the other process, just after this check
            return False
        return exists(path)

    monkeypatch.setattr(FileSystems, "exists", staticmethod(made_after_the_check))
    fs.mkdirs(str(target))
    assert target.is_dir() and len(checked) == 2
    file = tmp_path / "a-file"
    file.write_text("x")
    with pytest.raises(OSError):  # a real failure still raises
        fs.mkdirs(str(file / "below"))


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_directory_nothing_can_be_written_in_is_refused_whoever_runs(tmp_path: Path) -> None:
    """Root passes every permission check, also in /proc: a stage then stopped with a traceback when it made OUT (or
    evaluate when it wrote its report, after the search). A file is made and removed to be sure."""
    with pytest.raises(InputError, match=r"--output /proc/kpr is not writable \(/proc: "):
        fs.require_writable_directory("/proc/kpr", "--output")
    fs.require_writable_directory(str(tmp_path / "new" / "run"), "--output")
    assert list(tmp_path.iterdir()) == []  # nothing made, nothing left


def test_a_path_with_glob_characters_names_its_file_alone(tmp_path):
    """Beam's match reads ``x[1]`` as the class ``[1]``: a part file so named was 'no file matches' (or ``x1``'s
    file beside it was read in its place), and its fingerprint 'missing' whatever it held (a changed dump kept the
    run's stale articles). A glob is still one, its ``[`` escaped as ``[[]``."""
    from artifacts.run import manifest

    (tmp_path / "x[1]").mkdir()
    (tmp_path / "x1").mkdir()
    named, other = tmp_path / "x[1]" / "d.bz2", tmp_path / "x1" / "d.bz2"
    named.write_bytes(b"named")
    other.write_bytes(b"the other file")
    for path in (named, mirrored(named)):
        assert fs.expand_glob(str(path)) == fs.matching_files(str(path)) == [str(path)]
    assert fs.expand_glob(str(tmp_path / "x[1]" / "*.bz2")) == [str(other)]
    assert fs.expand_glob(str(tmp_path / "x[[]1]" / "*.bz2")) == [str(named)]
    before = manifest.file_fingerprint(str(named))
    assert before not in ("missing", manifest.file_fingerprint(str(other)))
    named.write_bytes(b"named, changed")
    assert manifest.file_fingerprint(str(named)) != before
