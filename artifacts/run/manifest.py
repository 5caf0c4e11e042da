"""OUT/manifest.json: what each stage wrote, from what, with which options; the commit record of a run.

A stage counts as complete only when its record is in the manifest; the record is written after the stage's
outputs are in place, so a run killed at any point never leaves a half-written stage that looks finished.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import platform
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata as importlib_metadata
from typing import Any

import pyarrow as pa

from artifacts import fs, layout, tables
from artifacts.errors import DamagedManifestError
from artifacts.names import DEFAULT_LANGUAGE

MANIFEST_NAME = layout.MANIFEST
FORMAT = 1  # the manifest's "format": what this version writes and reads
_VERSIONED_PACKAGES = (
    "kpr-pipeline", "apache-beam", "mwparserfromhell", "spacy", "torch", "transformers", "pyarrow",
    "numpy", "faiss-cpu", "faiss-gpu", "marisa-trie",
)


# Outputs that keep a stage's work for its reruns and refreshes, read by no other stage and not published unless asked.
KEPT_ARTIFACTS = (layout.MENTION_VECTORS,)


def is_kept_work(path: str) -> bool:
    """Whether the output ``path`` (relative to OUT) is kept work (``KEPT_ARTIFACTS``)."""
    return path.split("/", 1)[0] in KEPT_ARTIFACTS


@dataclass(frozen=True)
class OutputFile:
    path: str  # relative to OUT, forward slashes
    bytes: int
    sha256: str
    rows: int | None = None


@dataclass
class StageRecord:
    stage: str
    options: dict[str, Any]
    inputs: dict[str, str]
    outputs: list[OutputFile]
    counters: dict[str, int] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    wall_time_s: float = 0.0
    finished_at: str = ""
    # the paths (or URLs, patterns) of the files behind its "file:" inputs, by role: which dump, tables, corpus or
    # model a run was built from; never compared (the fingerprints are)
    sources: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def outputs_digest(self, artifacts: tuple[str, ...] = ()) -> str:
        """One hash over the checksums of the stage's outputs, or of those of its ``artifacts`` (``entities``): the
        fingerprint downstream stages record (kept work that no stage reads, ``KEPT_ARTIFACTS``, left out: a run
        published without it is the same to its readers)."""
        digest = hashlib.sha256()
        prefixes = tuple(f"{artifact}/" for artifact in artifacts)
        for item in sorted(self.outputs, key=lambda output: output.path):
            if is_kept_work(item.path) or (prefixes and not item.path.startswith(prefixes)):
                continue
            digest.update(f"{item.path}\t{item.sha256}\n".encode())
        return digest.hexdigest()


def manifest_path(output: str) -> str:
    return fs.join(output, MANIFEST_NAME)


def manifest_sha256(output: str) -> str:
    """The sha256 of the manifest of ``output`` (``GONE`` where there is none): what changes first when a stage
    commits into it (its record dropped) or a publish replaces it (its manifest removed). A
    ``DamagedManifestError`` when it cannot be read (a directory in its place)."""
    path = manifest_path(output)
    return hashlib.sha256(_read(path)).hexdigest() if fs.exists(path) else GONE


def _read(path: str) -> bytes:
    """The bytes of the manifest at ``path``; a ``DamagedManifestError`` when it cannot be read."""
    try:
        return fs.read_bytes(path)
    except IsADirectoryError as error:
        raise DamagedManifestError(path, "it is a directory") from error
    except PermissionError:  # not damaged: the command line names it and what to fix
        raise
    except OSError as error:
        raise DamagedManifestError(path, f"it cannot be read ({error.strerror or error})") from error


def load(output: str) -> dict[str, StageRecord]:
    """The completed stages recorded under ``output`` (empty if there is no manifest yet); a
    ``DamagedManifestError`` when the file is there but is not a manifest."""
    path = manifest_path(output)
    return parse(path, _read(path)) if fs.exists(path) else {}


# The fields of a stage record and of an output file, with the JSON types they must have; the first ones required.
_RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "stage": str, "options": dict, "inputs": dict, "outputs": list, "counters": dict, "versions": dict,
    "wall_time_s": (int, float), "finished_at": str, "sources": dict}
_RECORD_REQUIRED = ("stage", "options", "inputs", "outputs")
_OUTPUT_FIELDS: dict[str, type | tuple[type, ...]] = {"path": str, "bytes": int, "sha256": str,
                                                      "rows": (int, type(None))}
_OUTPUT_REQUIRED = ("path", "bytes", "sha256")
# The JSON types of the values of a record's mappings (options hold any JSON value).
_MAPPING_VALUES: dict[str, type | tuple[type, ...]] = {"counters": int, "versions": str, "inputs": str,
                                                       "sources": str}


def parse(path: str, data: bytes) -> dict[str, StageRecord]:
    """The stage records of the manifest ``data`` read from ``path``; ``DamagedManifestError`` saying what is
    wrong when it is not one."""
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise DamagedManifestError(path, f"byte {error.start:,} is not UTF-8 text") from error
    except json.JSONDecodeError as error:
        if not data.strip():
            raise DamagedManifestError(path, "it is empty") from error
        # the text ended inside a value (strings hold no raw line breaks: one left open ran to the end)
        if error.pos >= len(data.rstrip()) or error.msg.startswith("Unterminated string"):
            raise DamagedManifestError(path, f"it is cut short (its JSON ends after {len(data):,} bytes)") from error
        raise DamagedManifestError(path, f"it is not JSON ({error.msg} at line {error.lineno}, column "
                                         f"{error.colno})") from error
    if not isinstance(document, dict):
        raise DamagedManifestError(path, f"it holds {_json_type(document)}, not a manifest (an object with "
                                         "\"stages\")")
    if not isinstance(document.get("stages"), dict):
        shape = "has no \"stages\"" if "stages" not in document else (
            f"has \"stages\" as {_json_type(document['stages'])}, not an object")
        raise DamagedManifestError(path, f"it {shape}")
    if "format" in document and (type(document["format"]) is not int or document["format"] != FORMAT):
        raise DamagedManifestError(path, f"it is of format {document['format']!r}, where this version reads format "
                                         f"{FORMAT}")
    return {name: _record(path, name, value) for name, value in document["stages"].items()}


def _mapping_problem(value: dict[str, Any]) -> str | None:
    """A value of the record's counters, versions or inputs that is not of its type (``"many"`` as a counter)."""
    for field_name, expected in _MAPPING_VALUES.items():
        for key, item in value.get(field_name, {}).items():
            if isinstance(item, bool) or not isinstance(item, expected):
                return f"has {field_name}[{key!r}] as {_json_type(item)}"
    return None


def _record(path: str, name: str, value: Any) -> StageRecord:
    problem = _shape_problem(value, _RECORD_FIELDS, _RECORD_REQUIRED)
    problem = problem or _mapping_problem(value)
    for index, item in enumerate(value.get("outputs", []) if problem is None else []):
        item_problem = _shape_problem(item, _OUTPUT_FIELDS, _OUTPUT_REQUIRED)
        if item_problem is None and not fs.stays_below(item["path"]):
            item_problem = f"has \"path\" {item['path']!r}, not a path below the run's directory"
        negative = [key for key in ("bytes", "rows") if item_problem is None and (item.get(key) or 0) < 0]
        if negative:
            item_problem = f"has \"{negative[0]}\" {item[negative[0]]}, below zero"
        if item_problem:
            problem = f"outputs[{index}] {item_problem}"
            break
    if problem:
        raise DamagedManifestError(path, f"its stage {name!r} {problem}")
    known = {key: field_value for key, field_value in value.items() if key in _RECORD_FIELDS}
    outputs = [OutputFile(**{key: item[key] for key in _OUTPUT_FIELDS if key in item}) for item in value["outputs"]]
    return StageRecord(**{**known, "outputs": outputs})


def _shape_problem(value: Any, fields: Mapping[str, type | tuple[type, ...]], required: tuple[str, ...]) -> str | None:
    """What keeps ``value`` from being an object with ``fields`` of their types (``required`` present), or None."""
    if not isinstance(value, dict):
        return f"is {_json_type(value)}, not an object"
    missing = [key for key in required if key not in value]
    if missing:
        return f"has no \"{missing[0]}\""
    for key, expected in fields.items():
        wrong_bool = isinstance(value.get(key), bool) and expected is not bool
        if key in value and (wrong_bool or not isinstance(value[key], expected)):
            return f"has \"{key}\" as {_json_type(value[key])}"
    return None


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def encoded(stages: dict[str, StageRecord]) -> bytes:
    """The bytes of the manifest.json that records ``stages``."""
    document = {"format": FORMAT, "stages": {name: stages[name].to_json() for name in sorted(stages)}}
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode("utf-8")


def save(output: str, stages: dict[str, StageRecord]) -> None:
    """Replace OUT/manifest.json (by its writer, which holds OUT's lock: a temporary sibling left there by a writer
    killed as it replaced it goes first)."""
    fs.remove_temporaries(manifest_path(output))
    fs.write_bytes_atomic(manifest_path(output), encoded(stages))


def describe_file(output: str, path: str) -> OutputFile:
    rows = tables.parquet_row_count(path) if path.endswith(".parquet") else None
    return OutputFile(path=fs.relative(path, output), bytes=fs.size(path), sha256=fs.sha256(path), rows=rows)


def describe_outputs(output: str, directories: list[str]) -> list[OutputFile]:
    """Checksums and row counts of every file below the given artifact directories of ``output``."""
    files: list[OutputFile] = []
    for directory in directories:
        files.extend(describe_file(output, path) for path in fs.list_tree(fs.join(output, directory)))
    return files


def recorded_files(output: str, artifact: str, suffix: str = ".parquet",
                   stages: Mapping[str, StageRecord] | None = None) -> list[str]:
    """The files of ``artifact`` (e.g. ``entities``) ending in ``suffix`` that the manifest of ``output`` records,
    as paths under ``output``, sorted. Readers take these rather than a glob: a stray, stale or half-written
    file beside them is never read. ``MissingArtifactError`` when none is recorded."""
    stages = load(output) if stages is None else stages
    prefix = f"{artifact}/"
    relatives = sorted(item.path for record in stages.values() for item in record.outputs
                       if item.path.startswith(prefix) and item.path.endswith(suffix))
    if not relatives:
        raise tables.MissingArtifactError(f"no {artifact}/*{suffix} recorded in {manifest_path(output)}")
    return [fs.join(output, relative) for relative in relatives]


def recorded_batches(output: str, artifact: str, columns: list[str] | None = None,
                     batch_size: int = 65536) -> Iterator[pa.RecordBatch]:
    """Stream the Parquet files of ``artifact`` that the manifest records, batch by batch."""
    return tables.iter_file_batches(recorded_files(output, artifact), columns, batch_size)


def missing_or_changed(output: str, record: StageRecord, deep: bool = False) -> list[str]:
    """Problems with a stage's recorded outputs: missing files, other sizes, and with ``deep`` other hashes."""
    return files_missing_or_changed(output, record.outputs, deep)


def files_missing_or_changed(output: str, items: Iterable[OutputFile], deep: bool = False) -> list[str]:
    """``missing_or_changed`` of some of a run's recorded outputs, ``items``."""
    problems: list[str] = []
    for item in items:
        path = fs.join(output, item.path)
        if not fs.exists(path):
            problems.append(f"{item.path}: missing")
        elif fs.size(path) != item.bytes:
            problems.append(f"{item.path}: a directory, where the manifest records a file" if fs.is_directory(path)
                            else f"{item.path}: {fs.size(path)} bytes, manifest says {item.bytes}")
        elif deep and fs.sha256(path) != item.sha256:
            problems.append(f"{item.path}: sha256 differs from the manifest")
    return problems


def artifact_directory(relative: str) -> str:
    """The artifact directory of a file under OUT (``errors/`` holds one directory per stage)."""
    parts = relative.split("/")
    return "/".join(parts[:2]) if parts[0] == layout.ERRORS and len(parts) > 2 else parts[0]


def unrecorded_files(output: str, record: StageRecord) -> list[str]:
    """Files (relative to OUT) in the artifact directories of a stage's recorded outputs that the record does not
    list: a stray, stale or partial file that a reader globbing the directory would take as part of it."""
    recorded = {item.path for item in record.outputs}
    directories = sorted({artifact_directory(path) for path in recorded if "/" in path})
    found = (fs.relative(path, output) for directory in directories
             for path in fs.list_tree(fs.join(output, directory)))
    return sorted(relative for relative in found if relative not in recorded)


def file_fingerprint(pattern: str) -> str:
    """A cheap fingerprint of input files: path, size and modification time of every match."""
    matches = fs.metadata_of(pattern)
    parts = sorted(f"{m.path}:{m.size_in_bytes}:{int(m.last_updated_in_seconds)}" for m in matches)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest() if parts else "missing"


# A recorded option whose value cannot be known now (what it names is gone: a deleted --previous run): it matches
# whatever the record holds, so a stage completed with it stays complete.
GONE = "(gone)"  # no option holds it as a value of its own
# how a refresh with --previous records the run it read, in the options of the stages that reuse it
PREVIOUS_OPTION, PREVIOUS_SHA_OPTION = "previous", "previous_manifest_sha256"
# recorded options that say how a stage ran, not what it made
RUNTIME_OPTIONS = (PREVIOUS_OPTION, PREVIOUS_SHA_OPTION, "require_reuse", "keep_mention_vectors")
# options recorded only when not their default, so that runs from before the option keep their records (parse's
# pre-pass, the dictionary's tokenizer language): absent means the default
UNRECORDED_DEFAULTS = {"prepass": True, "language": DEFAULT_LANGUAGE}


def unless_default(name: str, value: Any) -> dict[str, Any]:
    """``{name: value}``, or nothing when ``value`` is the default of an option recorded only when not it."""
    return {} if value == UNRECORDED_DEFAULTS[name] else {name: value}


def option_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``name: old -> new`` for every recorded option that differs (runtime-only options are ignored; one recorded
    only when not its default is its default where absent)."""
    names = sorted((set(old) | set(new)) - set(RUNTIME_OPTIONS))
    values = [(name, *(options.get(name, UNRECORDED_DEFAULTS.get(name)) for options in (old, new))) for name in names]
    return [f"{name}: {before!r} -> {after!r}" for name, before, after in values if before != after]


STAGE_INPUT = "stage:"  # the recorded input key of an upstream stage's outputs (``stage_input``)
CONTENT = "content:"  # the recorded input key of a content digest (``Stage.content_inputs``), then its role


def same_options(recorded: dict[str, Any], options: dict[str, Any]) -> bool:
    """Whether a stage's ``options`` are those ``recorded``, an option now ``GONE`` matching any recorded value."""
    return recorded.keys() == options.keys() and all(value == GONE or recorded[name] == value
                                                     for name, value in options.items())


def content_digest(pattern: str) -> str:
    """sha256 over the names and bytes of every file ``pattern`` matches (a local model's few files: others of the
    same sizes and times in their place change it, not ``file_fingerprint``)."""
    matches = sorted(m.path for m in fs.metadata_of(pattern))
    digest = hashlib.sha256()
    for path in matches:
        digest.update(f"{fs.basename(path)}:{fs.sha256(path)}\n".encode())
    return digest.hexdigest() if matches else "missing"


def software_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in _VERSIONED_PACKAGES:
        try:
            versions[package] = importlib_metadata.version(package)
        except importlib_metadata.PackageNotFoundError:
            continue
    return versions


ISO_TIME = "%Y-%m-%dT%H:%M:%SZ"


def now_iso() -> str:
    return time.strftime(ISO_TIME, time.gmtime())


def finished_time(record: StageRecord) -> float | None:
    """When the stage of ``record`` finished (seconds since the epoch), from its ``finished_at``; None if unknown."""
    try:
        return float(calendar.timegm(time.strptime(record.finished_at or "", ISO_TIME)))
    except ValueError:
        return None


def canonical_options(options: dict[str, Any]) -> dict[str, Any]:
    """Options as they compare after a JSON round trip (tuples become lists)."""
    return json.loads(json.dumps(options, sort_keys=True))


def stage_input(upstream: str, artifacts: tuple[str, ...] = ()) -> str:
    """The input under which a stage records the outputs of ``upstream`` it reads: all of them (``stage:parse``) or
    its ``artifacts`` (``stage:dictionary/entities``: a dictionary of other thresholds, the same entities, is no
    change to a stage that reads only those)."""
    return f"{STAGE_INPUT}{upstream}" + (f"/{','.join(artifacts)}" if artifacts else "")


def read_outputs(record: StageRecord) -> list[tuple[str, tuple[str, ...], str]]:
    """(stage, the artifacts of it read or () for all, the digest of what was read) of each stage of the run whose
    outputs ``record``'s stage read (inputs outside OUT are not part of the run)."""
    return [(*stage_read(key), digest) for key, digest in sorted(record.inputs.items()) if key.startswith(STAGE_INPUT)]


def stage_read(key: str) -> tuple[str, tuple[str, ...]]:
    """The stage and the artifacts of it read (() for all) of a ``stage_input`` key."""
    upstream, _, artifacts = key.removeprefix(STAGE_INPUT).partition("/")
    return upstream, tuple(artifacts.split(",")) if artifacts else ()


def read_stages(record: StageRecord) -> list[str]:
    """The stages of the run whose outputs ``record``'s stage read."""
    return [upstream for upstream, _, _ in read_outputs(record)]


def rebuilt_since(record: StageRecord, stages: dict[str, StageRecord]) -> list[str]:
    """The recorded stages whose outputs are not those ``record``'s stage read: they ran again since."""
    return [upstream for upstream, artifacts, digest in read_outputs(record)
            if upstream in stages and stages[upstream].outputs_digest(artifacts) != digest]
