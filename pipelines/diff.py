"""diff: what changed between two runs (logic: artifacts.run.diff)."""

from __future__ import annotations

import argparse
import json
import sys

from artifacts.run import lock
from artifacts.run.diff.keyed import Change
from artifacts.run.diff.runs import PARTS, RunDiff, VectorReuse, diff_runs


def _change_line(label: str, change: Change | None, changed: str) -> str:
    if change is None:
        return f"{label:<18} not compared: its stage has not run in both"
    line = (f"{label:<18} {change.old:>10,} {change.new:>10,} {change.added:>10,} {change.removed:>10,}")
    return line + (f" {change.changed:>10,}  ({changed})" if changed else "")


def _reuse_line(label: str, reuse: VectorReuse | None, computed: str) -> list[str]:
    if reuse is None:
        return []
    return [f"{label}: {computed} {reuse.shown(reuse.computed)}, reused {reuse.shown(reuse.reused)}"]


def render_text(diff: RunDiff) -> str:
    """A compact table of ``diff`` for people."""
    lines = [f"old {diff.old}", f"new {diff.new}", "",
             f"{'':<18} {'old':>10} {'new':>10} {'added':>10} {'removed':>10} {'changed':>10}"]
    lines += [_change_line(label, getattr(diff, attribute), changed) for label, attribute, changed in PARTS]
    lines.append("")
    lines += _reuse_line("entity vectors", diff.entity_reuse, "recomputed")
    histogram = diff.entity_vectors
    if histogram is None:
        lines.append("entity vectors     not compared: embed-entities has not run in both")
    elif not histogram.comparable:
        lines.append(f"entity vectors {histogram.not_compared()}")
    else:
        lines.append(f"entity vectors in both runs (matched by QID, else title): {histogram.matched:,}; "
                     "cosine old vs new:")
        lines += [f"  {label:<16} {count:>10,}" for label, count in histogram.as_dict().items()]
    lines += _reuse_line("passages", diff.passage_reuse, "encoded")
    if diff.passage_sources is not None:
        lines.append("passages: the indexed ones, matched by id, title and text compared; old: "
                     f"{diff.passage_sources[0]}; new: {diff.passage_sources[1]}")
    return "\n".join(lines)


def note_writers(runs: tuple[str, ...], what: str) -> None:
    """A note for each of ``runs`` that another command is writing now (a stage committing into it): ``what`` the
    command made shows the stages that run had committed when it was read."""
    for run in dict.fromkeys(runs):
        if (writer := lock.live_writer(run)) is not None:
            print(f"note: {writer.writing(run)}: {what} shows the stages it had committed when it was read",
                  file=sys.stderr)


class DiffCommand:
    """diff: articles, redirects, entities, names and passages added/removed/changed between two runs, entity
    vectors and passages reused vs recomputed, and how far the entity vectors moved (cosine histogram)."""

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        diff = diff_runs(args.old, args.new)
        note_writers((args.old, args.new), "this comparison")
        for problem in diff.stale:  # its parts are compared as they are, and are not what a rerun would make
            print(f"warning: {problem}", file=sys.stderr)
        for changes in diff.options:  # what differs may come of them, not of the dumps
            print(f"note: built with other options: {changes}", file=sys.stderr)
        print(json.dumps(diff.to_json(), indent=2) if args.json else render_text(diff))
        return 0


COMMAND = DiffCommand()
