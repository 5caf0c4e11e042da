"""Dump refreshes: what makes a previous run's recorded options differ from this run's. Which vectors a previous
run lends this one: entity vectors in transforms/embed_entities/refresh.py, passage vectors in
transforms/index/refresh.py.
"""

from __future__ import annotations

from typing import Any

RUNTIME_OPTIONS = ("previous", "previous_manifest_sha256", "require_reuse")


def option_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``name: old -> new`` for every recorded option that differs (runtime-only options are ignored)."""
    names = sorted((set(old) | set(new)) - set(RUNTIME_OPTIONS))
    return [f"{name}: {old.get(name)!r} -> {new.get(name)!r}" for name in names if old.get(name) != new.get(name)]
