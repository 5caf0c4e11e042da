"""Publishing a validated run: every file its manifest lists (plus ``report/``; the stages' kept work, the window
vectors' store, only when asked) copied to DEST on any Beam filesystem, each copy checked, and ``DEST/manifest.json``
deleted first and written last, so a reader never takes a partial copy for a complete one. With ``latest``,
``DEST/../LATEST`` then names DEST (scheduled refreshes publish each run to ``ROOT/NAME`` and readers follow
``ROOT/LATEST``).

``DEST/.kpr-publish.json`` records the files a publish wrote: a later publish replaces or removes only those and
refuses, before copying anything, a DEST holding a file in its way that no publish wrote (artifacts.run.owned);
LATEST is replaced only when it is a pointer publish wrote. Nothing is ever deleted as a tree."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
from dataclasses import dataclass, replace

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from artifacts import fs, layout
from artifacts.errors import InputError, refuse_without_room
from artifacts.run import lock, manifest, owned
from artifacts.run.validation import require_valid

LATEST_NAME = "LATEST"  # beside the published runs: {"name": NAME, "manifest_sha256": ...}
RECORD_FILE = ".kpr-publish.json"  # the files a publish wrote into DEST (artifacts.run.owned)
WRITER = "publish"
# what RECORD_FILE says of a complete copy: the manifest sha256 of the run it was copied from, and its own
SOURCE_FACT, COPY_FACT = "source_manifest_sha256", "manifest_sha256"
REPORT_DIR = layout.REPORT  # the report command's HTML: published whether or not the manifest lists it
_COPY_CHUNK = 1 << 22


class LatestLocationError(InputError):
    """A LATEST pointer was asked for a destination that is not ROOT/NAME."""

    def __init__(self, destination: str) -> None:
        super().__init__(f"{destination}: a run published as the latest goes to ROOT/NAME (LATEST goes in ROOT)")
        self.destination = destination


class ForeignLatestError(InputError):
    """ROOT/LATEST exists but is not a pointer that publish wrote: it is not replaced."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} is not a LATEST pointer that publish wrote: it is left as it is (move it away "
                         "or publish under another ROOT)")
        self.path = path

    def __reduce__(self):
        return type(self), (self.path,)


class OverlappingDestinationError(InputError):
    """The destination is the run itself, or one lies inside the other."""

    def __init__(self, output: str, destination: str) -> None:
        super().__init__(f"{destination} overlaps the run {output}: publish to a place outside the run")
        self.output = output
        self.destination = destination


@dataclass(frozen=True)
class PublishedFile:
    path: str  # relative to OUT and to DEST
    bytes: int
    sha256: str


@dataclass(frozen=True)
class PublishSummary:
    destination: str
    files: tuple[PublishedFile, ...]
    removed: tuple[str, ...]  # directories of an earlier publish, replaced
    latest: str | None = None  # the LATEST pointer written after the manifest, if asked for
    unchanged: bool = False  # DEST held this very copy already, and LATEST named it: nothing but ``report`` copied
    report: tuple[str, ...] = ()  # with ``unchanged``: the report's files copied again (the run's report changed)

    @property
    def total_bytes(self) -> int:
        return sum(item.bytes for item in self.files)


def copy_file(source: str, destination: str) -> None:
    """Copy one file between any two Beam filesystems (``FileSystems.copy`` only works within one)."""
    fs.ensure_parent(destination)
    if FileSystems.get_scheme(source) == FileSystems.get_scheme(destination):
        FileSystems.copy([source], [destination])
        return
    with FileSystems.open(source, compression_type=CompressionTypes.UNCOMPRESSED) as reader, \
            FileSystems.create(destination, compression_type=CompressionTypes.UNCOMPRESSED) as writer:
        shutil.copyfileobj(reader, writer, _COPY_CHUNK)


def published_stages(stages: dict[str, manifest.StageRecord], kept: bool) -> dict[str, manifest.StageRecord]:
    """The records as published: without the outputs of kept work (``manifest.KEPT_ARTIFACTS``) unless ``kept``."""
    if kept:
        return stages
    return {name: replace(record, outputs=[item for item in record.outputs if not manifest.is_kept_work(item.path)])
            for name, record in stages.items()}


class StaleReportError(InputError):
    """OUT/report/ was built from another manifest.json than the run's (a stage ran, or was recorded, after it), or
    its stamp is missing (``unfinished``: the report stopped before its end, or is no report's)."""

    def __init__(self, output: str, unfinished: bool = False) -> None:
        why = ("holds no finished report (it has no stamp: a report that stopped part way, a full disk?)" if unfinished
               else f"was built before the run's last stage ran (from another {manifest.MANIFEST_NAME})")
        super().__init__(f"{fs.join(output, REPORT_DIR)} {why}: run `python run_pipeline.py report --output "
                         f"{shlex.quote(output)}` again, or remove the report to publish without one; nothing was "
                         "copied")


def require_current_report(output: str) -> None:
    """A StaleReportError when OUT has a report whose stamp names another manifest than OUT's (or none)."""
    report_files = fs.list_tree(fs.join(output, REPORT_DIR))
    if not report_files:
        return
    stamp = report_stamp(output)
    if stamp != fs.sha256(manifest.manifest_path(output)):
        raise StaleReportError(output, unfinished=not stamp)


def planned_files(output: str, stages: dict[str, manifest.StageRecord]) -> list[PublishedFile]:
    """Every file the manifest lists, plus the report's files, sorted by path."""
    files = {item.path: PublishedFile(item.path, item.bytes, item.sha256)
             for record in stages.values() for item in record.outputs}
    for path in fs.list_tree(fs.join(output, REPORT_DIR)):
        relative = fs.relative(path, output)
        files.setdefault(relative, PublishedFile(relative, fs.size(path), fs.sha256(path)))
    return [files[path] for path in sorted(files)]


def require_publishable(destination: str, files: list[PublishedFile]) -> frozenset[str]:
    """The files an earlier publish recorded in DEST; a ForeignFileError names the first file in the way of this
    publish (where a file goes, or in an artifact directory it fills or any stage writes: one this run has none
    of would hold it in the copy, which would not validate) that no publish wrote."""
    stage_trees = {directory.split("/")[0] for stage, directories in layout.STAGE_OUTPUTS.items()
                   for directory in (*directories, layout.errors_of(stage))}
    trees = sorted({item.path.split("/")[0] for item in files if "/" in item.path} | stage_trees)
    return owned.require_owned(destination, RECORD_FILE, [item.path for item in files] + [manifest.MANIFEST_NAME],
                               trees, WRITER)


def remove_previous(destination: str, earlier: frozenset[str], files: list[PublishedFile]) -> tuple[str, ...]:
    """Delete an earlier publish's files that this run does not have (they would stay and be read as part of
    it); returns the top-level names of the earlier publish's files replaced or removed."""
    owned.remove_stale(destination, earlier, [item.path for item in files])
    return tuple(sorted({relative.split("/")[0] for relative in earlier} - {manifest.MANIFEST_NAME}))


def copy_problem(path: str, item: PublishedFile) -> str | None:
    """How a copy differs from its source: size anywhere, sha256 too on a local disk (cheap to read back)."""
    size = fs.size(path)
    if size != item.bytes:
        return f"{size} bytes, the source has {item.bytes}"
    if fs.is_local(path) and fs.sha256(path) != item.sha256:
        return "sha256 differs from the source"
    return None


def copy_checked(output: str, destination: str, item: PublishedFile, left: str | None = None) -> None:
    """Copy one file of the run, read back; a failure says what ``destination`` is left as (``left``: without a
    manifest.json)."""
    source, target = fs.join(output, item.path), fs.join(destination, item.path)
    left = left or f"{destination} has no manifest.json, publish again"
    try:
        copy_file(source, target)
    except OSError as error:  # BeamIOError is an OSError
        raise InputError(f"copying {source} to {target} failed ({error}): {left}") from error
    problem = copy_problem(target, item)
    if problem is not None:
        raise InputError(f"{target}: {problem}: {left}")


def report_stamp(output: str) -> str:
    """The sha256 of the manifest OUT's report was built from, as its stamp says ("": no stamp)."""
    stamp = fs.join(output, REPORT_DIR, layout.REPORT_STAMP)
    return fs.read_bytes(stamp).decode("ascii", errors="replace").strip() if fs.exists(stamp) else ""


def restamp_report(destination: str, files: list[PublishedFile], published_manifest: bytes) -> None:
    """The copied report's stamp names the manifest the copy gets (the run's without its kept work, unless that
    was published too): the copy's report is as current as the run's, and the copy can be published again."""
    if any(item.path == f"{REPORT_DIR}/{layout.REPORT_STAMP}" for item in files):
        stamp_report(destination, published_manifest)


def stamp_report(destination: str, published_manifest: bytes) -> None:
    """The report's stamp in the copy ``destination`` names its manifest, ``published_manifest``."""
    digest = hashlib.sha256(published_manifest).hexdigest()
    if report_stamp(destination) != digest:
        fs.write_bytes_atomic(fs.join(destination, REPORT_DIR, layout.REPORT_STAMP), f"{digest}\n".encode())


def _absolute(path: str) -> str:
    """A local ``path`` absolute, without ``file://`` (a link in it kept: LATEST goes beside the name given); a URL
    less its final /."""
    return os.path.abspath(path.removeprefix("file://")) if fs.is_local(path) else path.rstrip("/")


def latest_location(destination: str) -> tuple[str, str]:
    """(the directory holding LATEST, the run's NAME) of a destination ``ROOT/NAME``."""
    parent, _, name = _absolute(destination).rpartition("/")
    if not name or not parent or parent.endswith(":/"):
        raise LatestLocationError(destination)
    return parent, name


def write_latest(destination: str) -> str:
    """Point ``ROOT/LATEST`` at the published run ``destination`` = ROOT/NAME (after its manifest is written)."""
    root, name = latest_location(destination)
    pointer = {"name": name, "manifest_sha256": fs.sha256(manifest.manifest_path(destination))}
    path = fs.join(root, LATEST_NAME)
    fs.write_bytes_atomic(path, (json.dumps(pointer, sort_keys=True) + "\n").encode("utf-8"))
    return path


def is_pointer(value: object) -> bool:
    return isinstance(value, dict) and set(value) == {"name", "manifest_sha256"}


def read_pointer(path: str) -> dict[str, str] | None:
    """The LATEST pointer at ``path``; None where there is none, or something else (a directory, other JSON)."""
    if fs.is_directory(path) or not fs.exists(path):
        return None
    try:
        pointer = fs.read_json(path)
    except ValueError:  # UnicodeDecodeError included
        return None
    return pointer if is_pointer(pointer) else None


def require_replaceable_latest(destination: str) -> None:
    """Refuse (before copying anything) a ROOT/LATEST that is a directory or not a pointer publish wrote, and a
    run to be published as ROOT/LATEST itself (it copied the whole run, then could not write the pointer there)."""
    root, name = latest_location(destination)
    if name == LATEST_NAME:
        raise InputError(f"--latest: {destination} is where the {LATEST_NAME} pointer goes: publish the run under "
                         "another NAME; nothing was copied")
    path = fs.join(root, LATEST_NAME)
    if (fs.is_directory(path) or fs.exists(path)) and read_pointer(path) is None:
        raise ForeignLatestError(path)


def require_not_the_latest(destination: str) -> None:
    """Refuse a ``destination`` ROOT/NAME that ROOT/LATEST names: its manifest.json is removed while the copy goes,
    and LATEST's readers must always find a complete run (and LATEST the manifest it names). A local destination
    is looked at as written and with its links resolved (``ROOT/current`` linked to the run LATEST names)."""
    for location in dict.fromkeys((destination, fs.resolved(destination))):
        try:
            root, name = latest_location(location)
        except LatestLocationError:
            continue  # not ROOT/NAME: no LATEST can name it
        pointer = read_pointer(fs.join(root, LATEST_NAME))
        if pointer is not None and pointer["name"] == name:
            raise InputError(f"--to {destination} is the run {fs.join(root, LATEST_NAME)} names: its readers would "
                             "find it incomplete while the copy goes; publish under another NAME (with --latest to "
                             "move LATEST to it); nothing was copied")


def is_the_latest_copy(destination: str, published: bytes) -> bool:
    """Whether ``destination`` already holds the copy whose manifest is ``published``, every file of it of the size
    it records, and ROOT/LATEST names it: a rerun of a publish --latest killed after it wrote LATEST (a scheduler's
    retry) has nothing left to copy but the report (``copy_report_again``; a copy that lost files since is the run
    LATEST names, and not published into)."""
    try:
        root, name = latest_location(destination)
    except LatestLocationError:
        return False
    pointer = read_pointer(fs.join(root, LATEST_NAME))
    path = manifest.manifest_path(destination)
    return (pointer is not None and pointer["name"] == name
            and pointer.get("manifest_sha256") == hashlib.sha256(published).hexdigest()
            and fs.exists(path) and fs.read_bytes(path) == published
            and not manifest.files_missing_or_changed(destination, [item for record in manifest.load(destination)
                                                                    .values() for item in record.outputs]))


def report_digests(root: str) -> dict[str, str]:
    """The sha256 of every file of the report under ``root``, by its path relative to ``root``, but its stamp (a
    copy's names the copy's manifest)."""
    stamp = f"{REPORT_DIR}/{layout.REPORT_STAMP}"
    return {relative: fs.sha256(path) for path in fs.list_tree(fs.join(root, REPORT_DIR))
            if (relative := fs.relative(path, root)) != stamp}


def copy_report_again(output: str, destination: str, published: bytes) -> tuple[str, ...]:
    """The files of the run's report that the copy ``destination`` of it lacks or holds otherwise (a report written
    again since, as `all` does at every run; a plot lost from the copy), copied into it and recorded as publish's,
    its stamp naming the copy's manifest ``published``; their paths. The copy's manifest is not touched: the run
    LATEST names stays complete for its readers."""
    require_current_report(output)
    theirs = report_digests(destination)
    stale = tuple(relative for relative, digest in report_digests(output).items() if theirs.get(relative) != digest)
    if not stale:
        return ()
    for relative in stale:
        path = fs.join(output, relative)
        copy_checked(output, destination, PublishedFile(relative, fs.size(path), fs.sha256(path)),
                     f"{destination}'s manifest.json is as it was: publish --latest again")
    stamp_report(destination, published)
    owned.add_to_record(destination, RECORD_FILE, [*stale, f"{REPORT_DIR}/{layout.REPORT_STAMP}"])
    return stale


def source_manifest_sha256(copy: str) -> str | None:
    """The manifest sha256 of the run a published ``copy`` was copied from (its own differs: it is written without
    the kept work), while the copy's manifest is the one that publish wrote; else None."""
    path = fs.join(copy, RECORD_FILE)
    try:
        facts = fs.read_json(path) if fs.exists(path) else None
        if isinstance(facts, dict) and isinstance(facts.get(SOURCE_FACT), str) \
                and facts.get(COPY_FACT) == fs.sha256(manifest.manifest_path(copy)):
            return facts[SOURCE_FACT]
    except (OSError, ValueError):
        pass
    return None


def latest_run(root: str) -> str:
    """The published run ``ROOT/LATEST`` names (for readers of scheduled publishes)."""
    path = fs.join(root, LATEST_NAME)
    if not fs.exists(path):
        raise InputError(f"{root} has no {LATEST_NAME}: nothing was published there as the latest run")
    return fs.join(root, fs.read_json(path)["name"])


def bytes_to_copy(destination: str, files: list[PublishedFile], earlier: frozenset[str]) -> int:
    """What copying ``files`` adds to the filesystem of ``destination``: their bytes, less those of the files an
    earlier publish wrote there (``earlier``), which are removed or overwritten as the copy goes."""
    replaced = (fs.join(destination, relative) for relative in earlier)
    freed = sum(fs.size(path) for path in replaced if fs.exists(path) and not fs.is_directory(path))
    return max(sum(item.bytes for item in files) - freed, 0)


def publish_run(output: str, destination: str, latest: bool = False, free_bytes: int | None = None,
                kept: bool = False) -> PublishSummary:
    """Copy the validated run under ``output`` to ``destination``; its manifest.json is written last, then
    with ``latest`` the LATEST pointer beside ``destination``. A copy that needs more than ``free_bytes`` (the
    free space of the destination's filesystem, where known) is refused before anything is written. The kept
    work of its stages (``mention_vectors/``) is copied only when ``kept``."""
    if latest:
        require_replaceable_latest(destination)  # refuse before copying anything
        published = manifest.encoded(published_stages(manifest.load(output), kept))
        if is_the_latest_copy(destination, published):
            with lock.hold(destination, WRITER):  # takes over the lock of a publish killed once it was done
                return PublishSummary(destination, (), (), fs.join(latest_location(destination)[0], LATEST_NAME),
                                      unchanged=True, report=copy_report_again(output, destination, published))
    require_not_the_latest(destination)
    if fs.overlaps(output, destination):
        raise OverlappingDestinationError(output, destination)
    require_valid(output, with_kept_work=kept)
    require_current_report(output)
    source = manifest.manifest_sha256(output)
    stages = published_stages(manifest.load(output), kept)
    files = planned_files(output, stages)
    earlier = require_publishable(destination, files)  # refused before the lock makes DEST
    refuse_without_room(destination, free_bytes, lambda: bytes_to_copy(destination, files, earlier))
    with lock.hold(destination, WRITER):  # another publish to DEST meanwhile is refused
        # again: a publish that ended meanwhile changed DEST, or (with --latest) pointed LATEST at it
        require_not_the_latest(destination)
        earlier = require_publishable(destination, files)
        written = [item.path for item in files] + [manifest.MANIFEST_NAME]
        owned.save_record(destination, RECORD_FILE, [*earlier, *written])  # a killed publish still owns its files
        fs.delete_file(manifest.manifest_path(destination))  # first: from here on DEST does not look complete
        removed = remove_previous(destination, earlier, files)
        for item in files:
            copy_checked(output, destination, item)
        published = manifest.encoded(stages)
        restamp_report(destination, files, published)
        fs.write_bytes_atomic(manifest.manifest_path(destination), published)
        owned.save_record(destination, RECORD_FILE, written, {SOURCE_FACT: source,
                                                              COPY_FACT: hashlib.sha256(published).hexdigest()})
        return PublishSummary(destination, tuple(files), removed, write_latest(destination) if latest else None)
