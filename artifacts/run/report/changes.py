"""The report's "Changes since the previous run" section: the numbers of ``diff`` between the previous run
(recorded in the manifest by a refresh with ``--previous``, or named by ``report --previous``) and this one."""

from __future__ import annotations

from dataclasses import dataclass

from artifacts import fs
from artifacts.errors import InputError
from artifacts.run import manifest
from artifacts.run.diff.keyed import Change
from artifacts.run.diff.runs import PARTS, RunDiff, VectorReuse, diff_runs
from artifacts.run.manifest import PREVIOUS_OPTION, PREVIOUS_SHA_OPTION, StageRecord
from artifacts.run.report.markup import esc, kv, number, table

# how a refresh with --previous records the reused run: an input "file:previous=OLD_OUT" (its manifest's
# fingerprint), or options "previous" and "previous_manifest_sha256" (pipelines/refresh.py)
PREVIOUS_INPUT = "file:previous="


@dataclass(frozen=True)
class PreviousRun:
    """The run a refresh reused: its path and its manifest's sha256 when the refresh read it (None: not recorded)."""

    path: str
    manifest_sha256: str | None = None


def recorded_previous(records: dict[str, StageRecord]) -> PreviousRun | None:
    """The previous run a refresh of this run reused, as its stages record it (None: built from scratch)."""
    for record in records.values():
        for name in record.inputs:
            if name.startswith(PREVIOUS_INPUT) and len(name) > len(PREVIOUS_INPUT):
                return PreviousRun(name[len(PREVIOUS_INPUT):])
        previous = record.options.get(PREVIOUS_OPTION)
        if isinstance(previous, str) and previous:
            return PreviousRun(previous, record.options.get(PREVIOUS_SHA_OPTION) or None)
    return None


def diff_with_recorded(previous: PreviousRun, output: str) -> RunDiff:
    """``diff_runs`` of the recorded previous run and ``output``; an InputError when the run at its path is no longer
    the one the refresh read (another run written there since: its numbers would not be this run's changes)."""
    path = manifest.manifest_path(previous.path)
    if not fs.exists(previous.path):
        raise InputError(f"the run this one was refreshed from, {previous.path}, is gone (no such directory now); "
                         "report --previous OLD_OUT compares with another run")
    if previous.manifest_sha256 and fs.exists(path) and fs.sha256(path) != previous.manifest_sha256:
        raise InputError(f"the run at {previous.path} has changed since this run was refreshed from it (its "
                         f"{manifest.MANIFEST_NAME} is not the one recorded); report --previous {previous.path} "
                         "compares with it as it is now")
    return diff_runs(previous.path, output)


def _change_row(label: str, change: Change | None, changed: str) -> str:
    if change is None:
        return (f'<tr><td>{esc(label)}</td><td colspan="5" class="muted">not compared: its stage has not run in '
                "both</td></tr>")
    cells = "".join(f'<td class="num">{number(value)}</td>' for value in
                    (change.old, change.new, change.added, change.removed))
    what = f'{number(change.changed)} <span class="muted">{esc(changed)}</span>' if changed else "—"
    return f'<tr><td>{esc(label)}</td>{cells}<td class="num">{what}</td></tr>'


def _reuse(reuse: VectorReuse | None, computed: str) -> str:
    if reuse is None:
        return '<span class="muted">not compared</span>'
    shown = [reuse.shown(value) for value in (reuse.computed, reuse.reused)]
    return f"{computed} {esc(shown[0])} · reused {esc(shown[1])}"


def _cosines(diff: RunDiff) -> str:
    histogram = diff.entity_vectors
    if histogram is None:
        return ""
    if not histogram.comparable:
        return f'<h3>How far the entity vectors moved</h3><p class="warn">{esc(histogram.not_compared())}.</p>'
    rows = [f'<tr><td>{esc(label)}</td><td class="num">{number(count)}</td></tr>'
            for label, count in histogram.as_dict().items()]
    return (f"<h3>How far the entity vectors moved</h3><p class=\"muted\">Cosine similarity of the old and new "
            f"vector of the {number(histogram.matched)} entities embedded in both runs (matched by QID, else "
            "title).</p>" + table(["cosine", "entities"], rows, [False, True], ' id="vector-cosines"'))


def changes_section(previous: str, diff: RunDiff | None, problem: str | None) -> str:
    """The section's HTML; ``problem`` when the previous run could not be compared."""
    head = (f'<section id="changes"><h2>Changes since the previous run</h2><p class="sub">previous run '
            f"<code>{esc(previous)}</code></p>")
    if diff is None:
        return head + f'<p class="warn">Could not compare: {esc(problem or "unknown reason")}</p></section>'
    # the previous run's stale stages (this run's are the page's own warnings): its numbers are not what a rerun makes
    head += "".join(f'<p class="warn">{esc(stale)}</p>' for stale in diff.stale if stale.startswith(f"{diff.old}: "))
    # what differs may come of the options, not of the dumps
    head += "".join(f'<p class="warn">Built with other options: {esc(changes)}</p>' for changes in diff.options)
    rows = [_change_row(label, getattr(diff, attribute), changed) for label, attribute, changed in PARTS]
    numbers = table(["", "old", "new", "added", "removed", "changed"], rows, [False, True, True, True, True, True],
                    ' id="changes-table"')
    reuse = kv([("entity vectors", _reuse(diff.entity_reuse, "recomputed")),
                 ("passage vectors", _reuse(diff.passage_reuse, "encoded"))])
    return head + numbers + _sources(diff) + "<h3>Reused from the previous run</h3>" + reuse + _cosines(diff) + (
        "</section>")


def _sources(diff: RunDiff) -> str:
    if diff.passage_sources is None:
        return ""
    old, new = diff.passage_sources
    return (f'<p class="muted">Passages: the indexed ones, matched by id, their title and text compared; old: '
            f"{esc(old)}; new: {esc(new)}.</p>")
