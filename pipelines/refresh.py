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


def fingerprint_changes(old: manifest.StageRecord, files: dict[str, str],
                        roles: Collection[str] | None = None) -> list[str]:
    """Roles of model files whose fingerprint (paths, sizes, times) differs from the previous record, or their
    content where the record holds its digest (other files of the same sizes and times in their place); only
    those of ``roles`` where given."""
    new = {f"file:{role}": manifest.file_fingerprint(pattern) for role, pattern in files.items()
           if roles is None or role in roles}
    recorded = {key: value for key, value in old.inputs.items() if key.startswith("file:") and key != "file:corpus"
                and (roles is None or key.removeprefix("file:") in roles)}
    changed = {key.removeprefix("file:") for key in set(new) | set(recorded) if new.get(key) != recorded.get(key)}
    changed |= {role for role, pattern in files.items() if (roles is None or role in roles)
                and f"{manifest.CONTENT}{role}" in old.inputs
                and old.inputs[f"{manifest.CONTENT}{role}"] != manifest.content_digest(pattern)}
    return sorted(changed)
