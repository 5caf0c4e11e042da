"""--previous OLD_OUT: whether a stage may take vectors from a previous run (its records and options compared with
this run's), said in one line when it may not. Which vectors it lends: transforms/embed_entities/refresh.py and
transforms/index/refresh.py."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from artifacts import fs, layout
from artifacts.errors import InputError
from artifacts.run import manifest
from artifacts.run.validation import validate_run
from encoders.models import model_files

# Why a previous run cannot be reused, from its records and this run's: None when it can.
Compatibility = Callable[[dict[str, manifest.StageRecord]], str | None]
# Recorded options that name the previous run or say how to treat it, or what is kept: no change of them changes a
# vector.


class ReuseRefusedError(InputError):
    """--require-reuse was given and the previous run cannot be reused."""


@dataclass(frozen=True)
class RefreshConfig:
    """--previous and --require-reuse, as a stage's config carries them."""

    previous: str | None = None
    require_reuse: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RefreshConfig:
        """The flags; a damaged manifest of the previous run stops the stage (and `all`) before it starts."""
        previous = getattr(args, "previous", None)
        if previous and fs.resolved(str(previous)) == fs.resolved(str(args.output)):
            raise InputError(f"--previous {previous} is this run's own --output: a refresh takes vectors from another "
                             "run (name the earlier run's OUT, or leave --previous out: a rerun reuses its own work)")
        if previous:
            manifest.load(str(previous))
        return cls(str(previous) if previous else None, bool(getattr(args, "require_reuse", False)))


def previous_options(refresh: RefreshConfig) -> dict[str, Any]:
    """The recorded options naming the previous run (path and manifest sha256); none without --previous, so
    runs built from scratch keep their records, and a changed --previous reruns the stage. A previous run deleted
    since (``manifest.GONE``) reruns nothing: a completed refresh does not read it again."""
    if not refresh.previous:
        return {}
    return {manifest.PREVIOUS_OPTION: refresh.previous,
            manifest.PREVIOUS_SHA_OPTION: manifest.manifest_sha256(refresh.previous)}


def previous_lacks(previous: str, stages: tuple[str, ...]) -> str | None:
    """Why ``previous`` can lend nothing whatever this run computes: no manifest, or one of ``stages`` missing
    (cheap: what `all --require-reuse` checks before its first stage)."""
    if not fs.exists(manifest.manifest_path(previous)):
        return f"{previous} has no {manifest.MANIFEST_NAME}"
    records = manifest.load(previous)
    missing = [name for name in stages if name not in records]
    return f"{previous} is incomplete (no '{layout.command_of(missing[0])}' stage)" if missing else None


def previous_problem(previous: str, stages: tuple[str, ...], compatible: Compatibility) -> str | None:
    """Why ``previous`` cannot be reused: without a manifest or one of ``stages``, not a valid run, or
    incompatible."""
    lacking = previous_lacks(previous, stages)
    if lacking is not None:
        return lacking
    problems = validate_run(previous)
    if problems:
        return f"{previous} does not validate ({problems[0]})"
    return compatible(manifest.load(previous))


def reusable_previous(refresh: RefreshConfig, stage: str, stages: tuple[str, ...],
                      compatible: Compatibility, own_work: Callable[[], str | None] = lambda: None) -> str | None:
    """The previous run to reuse, or None, printing why in one line: then the stage reuses only what ``own_work()``
    says OUT itself lends (the stage's own committed work, of the same options; a rerun of a refresh whose OLD_OUT
    was deleted since), or with nothing recomputes everything (exit 2 with --require-reuse)."""
    if not refresh.previous:
        return None
    command = layout.command_of(stage)
    problem = previous_problem(refresh.previous, stages, compatible)
    if problem is None:
        print(f"[{command}] reusing vectors of {refresh.previous} where nothing changed", file=sys.stderr)
        return refresh.previous
    if (own := own_work()) is not None:
        print(f"[{command}] not reusing {refresh.previous} ({problem}): reusing {own} where nothing changed",
              file=sys.stderr)
    elif refresh.require_reuse:
        raise ReuseRefusedError(f"cannot reuse the previous run: {problem}")
    else:
        print(f"[{command}] recomputing everything: {problem}", file=sys.stderr)
    return None


def model_identity(name: str) -> str:
    """What a model is to the vectors stored for it: a local directory by the content of its files (a copy or a
    move of it, or its files touched, is the same model; other bytes in them another), a hub name by name."""
    pattern = model_files({"model": name}).get("model")
    return name if pattern is None else f"{manifest.CONTENT}{manifest.content_digest(pattern)}"


def fingerprint_changes(old: manifest.StageRecord, files: dict[str, str],
                        roles: Collection[str] | None = None) -> list[str]:
    """Roles of local model files (``files``: their patterns) that differ from the previous record's: by content
    where the record holds its digest (the same files elsewhere or touched are no change, other bytes of the same
    sizes and times are), else by fingerprint (paths, sizes, times: an older version's record); a model local in
    one run and not in the other is a change. Only those of ``roles`` where given."""
    files = {role: pattern for role, pattern in files.items() if roles is None or role in roles}
    recorded = {key.removeprefix("file:") for key in old.inputs if key.startswith("file:") and key != "file:corpus"
                and (roles is None or key.removeprefix("file:") in roles)}

    def differs(role: str) -> bool:
        content = old.inputs.get(f"{manifest.CONTENT}{role}")
        if content is not None:
            return content != manifest.content_digest(files[role])
        return old.inputs[f"file:{role}"] != manifest.file_fingerprint(files[role])

    return sorted((recorded ^ set(files)) | {role for role in recorded & set(files) if differs(role)})


def moved_model_option(old: manifest.StageRecord, recorded: dict[str, Any], current: dict[str, Any],
                       role: str, changed: Collection[str]) -> dict[str, Any]:
    """``recorded`` options with the option ``"model"`` (the path of the model of ``role``) as in ``current`` where
    the record holds the digest of that model's files and they are unchanged (``changed``: ``fingerprint_changes``):
    the same model at another path is no change."""
    if role in changed or f"{manifest.CONTENT}{role}" not in old.inputs or "model" not in current:
        return recorded
    return {**recorded, "model": current["model"]}
