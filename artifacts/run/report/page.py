"""The report as one self-contained HTML page (inline CSS, no scripts, no network); all text is escaped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from artifacts import layout
from artifacts.run import manifest
from artifacts.run.report import analyses
from artifacts.run.report.counters import bad_input, bad_input_summary, counters_section
from artifacts.run.report.data import ReportData
from artifacts.run.report.markup import (
    CSS,
    duration,
    esc,
    exact_duration,
    kv,
    number,
    option_value,
    plot,
    size,
    table,
)
from artifacts.run.report.stages import ArtifactSummary, StageView

_PACKAGE_ORDER = ("python", "kpr-pipeline", "apache-beam", "pyarrow", "numpy", "torch", "transformers",
                  "faiss-cpu", "faiss-gpu", "marisa-trie", "mwparserfromhell", "spacy")


def render(data: ReportData, seconds: float, first: Sequence[str] = ()) -> str:
    """The page; ``first``: sections (HTML) shown right after the header."""
    body = [_header(data), *first, _timings(data)]
    body += [_stage(view, data) for view in data.views]
    body += [_versions(data),
             f"<footer>Written by <code>python run_pipeline.py report</code> in {seconds:,.1f} s at "
             f"{esc(data.generated_at)} from {esc(data.output)}/manifest.json.</footer>"]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>kpr-pipeline report: {esc(data.output)}</title><style>{CSS}</style></head>"
            f"<body><main>{''.join(body)}</main></body></html>\n")


def _rows_of(view: StageView | None, artifact: str) -> int | None:
    if view is None:
        return None
    return next((item.rows for item in view.artifacts if item.name == artifact), None)


def _header(data: ReportData) -> str:
    done = [view for view in data.views if view.record is not None]
    total = sum(view.record.wall_time_s for view in done)
    cards = [("stages run", f"{len(done)} of {len(data.views)}"), ("total wall time", duration(total))]
    for stage, artifact, label in ((layout.PARSE_STAGE, layout.ARTICLES, "articles"),
                                   (layout.DICTIONARY_STAGE, layout.ENTITIES, "entities"),
                                   (layout.DICTIONARY_STAGE, layout.NAMES, "name-entity pairs"),
                                   (layout.MENTIONS_STAGE, layout.MENTIONS, "mentions"),
                                   (layout.EMBED_ENTITIES_STAGE, layout.ENTITY_EMBEDDINGS, "entity vectors"),
                                   (layout.INDEX_STAGE, layout.PASSAGES, "passages"),
                                   (layout.INDEX_STAGE, f"{layout.INDEX}/embeddings", "indexed vectors")):
        rows = _rows_of(data.view(stage), artifact)
        if rows is not None:
            cards.append((label, number(rows)))
    if data.recall is not None:
        cards.append((f"index recall@{data.recall.k}", f"{data.recall.recall:.3f}"))
    per_stage = [bad_input(view.record.counters, data.declared.get(view.name, {})) for view in done]
    records, streams, pages = (sum(column) for column in zip(*per_stage, strict=True)) if per_stage else (0, 0, 0)
    cards.append(("bad input records", bad_input_summary(records, streams, pages)))
    card_html = "".join(f'<div class="card"><div class="v">{esc(value)}</div><div class="l">{esc(label)}</div></div>'
                        for label, value in cards)
    links = "".join(f'<a href="#stage-{esc(view.name)}">{esc(view.command)}'
                    f'{"" if view.record is not None else " · not run"}</a>' for view in data.views)
    return (f"<header><h1>kpr-pipeline report</h1><p class=\"sub\"><code>{esc(data.output)}</code> · "
            f"generated {esc(data.generated_at)}</p><div class=\"cards\">{card_html}</div>"
            f"<nav><a href=\"#timings\">timings</a>{links}<a href=\"#versions\">versions</a></nav></header>")


def _timings(data: ReportData) -> str:
    done = [view for view in data.views if view.record is not None]
    if not done:
        return '<section id="timings"><h2>Timings</h2><p class="muted">No stage has run yet.</p></section>'
    rows = [f'<tr><td><a href="#stage-{esc(view.name)}">{esc(view.command)}</a></td>'
            f'<td class="num">{exact_duration(view.record.wall_time_s)}</td>'
            f"<td>{esc(view.record.finished_at)}</td></tr>" for view in done]
    return (f'<section id="timings"><h2>Timings</h2>{plot(data, "timings", "wall time per stage")}'
            f'{table(["stage", "wall time", "finished (UTC)"], rows, [False, True])}</section>')


def _stage(view: StageView, data: ReportData) -> str:
    anchor = f'id="stage-{esc(view.name)}"'
    if view.record is None:
        return (f'<section {anchor}><h2>{esc(view.command)} <span class="badge notrun">not run</span></h2>'
                f'<p class="muted">not run: OUT/manifest.json has no record of this stage.</p></section>')
    record = view.record
    parts = [f'<h2>{esc(view.command)} <span class="badge ok">done</span></h2>',
             f'<p class="meta">wall time <b>{exact_duration(record.wall_time_s)}</b> · finished '
             f'{esc(record.finished_at)} UTC</p>',
             '<div class="grid2"><div>', _read(view, data), _options(record.options), "</div><div>",
             _written(view.artifacts), "</div></div>",
             counters_section(record.counters, data.declared.get(view.name, {})), _dead_letters(view)]
    extra = {layout.DICTIONARY_STAGE: analyses.dictionary_extras,
             layout.EMBED_ENTITIES_STAGE: analyses.embedding_extras,
             layout.INDEX_STAGE: analyses.index_extras}.get(view.name)
    if extra is not None:
        parts.append(extra(data))
    return f"<section {anchor}>{''.join(parts)}</section>"


def _read(view: StageView, data: ReportData) -> str:
    items = []
    for item in view.inputs:
        title = f' title="fingerprint {esc(item.fingerprint)}"'
        if item.kind == "stage":
            upstream = data.view(item.name)
            read = [artifact for artifact in (upstream.artifacts if upstream else [])
                    if not item.artifacts or artifact.name in item.artifacts]
            written = ", ".join(f"{esc(artifact.name)} ({number(artifact.rows)} rows)" if artifact.rows is not None
                                else esc(artifact.name) for artifact in read)
            items.append(f'<li{title}>outputs of <a href="#stage-{esc(item.name)}">{esc(layout.command_of(item.name))}'
                         f"</a>{': ' + written if written else ''}</li>")
        else:
            rows = _rows_of(data.view(layout.PARSE_STAGE), item.name) if item.name == layout.ARTICLES else None
            detail = f" ({number(rows)} rows)" if rows is not None else ""
            what = "the files' content" if f"{item.kind}:" == manifest.CONTENT else "fingerprint"
            source = f" <code>{esc(item.source)}</code>" if item.source else ""
            items.append(f"<li{title}>input <code>{esc(item.name)}</code>{source}{detail} "
                         f'<span class="muted">{what} {esc(item.fingerprint[:12])}…</span></li>')
    listing = f'<ul class="read">{"".join(items)}</ul>' if items else '<p class="muted">nothing recorded</p>'
    return f"<h3>Read</h3>{listing}"


def _options(options: dict[str, Any]) -> str:
    if not options:
        return '<h3>Options</h3><p class="muted">none</p>'
    return "<h3>Options</h3>" + kv((key, option_value(value)) for key, value in sorted(options.items()))


def _kept_note(artifact: str) -> str:
    """A kept-work artifact's note: a published copy holds it only when asked, and this page is copied as it is."""
    if not manifest.is_kept_work(artifact):
        return ""
    return ' <span class="muted">(kept work: a publish copies it only with <code>--with-mention-vectors</code>)</span>'


def _written(artifacts: list[ArtifactSummary]) -> str:
    if not artifacts:
        return '<h3>Written</h3><p class="muted">no files</p>'
    rows = [f"<tr><td><code>{esc(item.name)}/</code>{_kept_note(item.name)}</td>"
            f'<td class="num">{number(item.files)}</td>'
            f'<td class="num">{number(item.rows)}</td><td class="num" title="{item.bytes:,} bytes">'
            f"{esc(size(item.bytes))}</td></tr>" for item in sorted(artifacts, key=lambda artifact: artifact.name)]
    return "<h3>Written</h3>" + table(["artifact", "files", "rows", "size"], rows, [False, True, True, True])


def _dead_letters(view: StageView) -> str:
    files = view.dead_letters
    written = [item for item in files if item.bytes]
    if not files:
        return ""
    if not written:
        return (f'<h3>Dead letters</h3><p class="muted">none: {len(files)} empty file(s) in '
                f'<a href="../errors/{esc(view.name)}/">errors/{esc(view.name)}/</a></p>')
    rows = [f'<tr><td><a href="../{esc(item.path)}">{esc(item.path)}</a></td>'
            f'<td class="num">{esc(size(item.bytes))}</td></tr>' for item in written]
    return ("<h3>Dead letters</h3><p>Records that could not be processed, one JSON line each (kind, reason, "
            "where):</p>" + table(["file", "size"], rows, [False, True]))


def _versions(data: ReportData) -> str:
    found: dict[str, dict[str, list[str]]] = {}
    for view in data.views:
        if view.record is not None:
            for package, version in view.record.versions.items():
                found.setdefault(package, {}).setdefault(version, []).append(view.command)
    if not found:
        return '<section id="versions"><h2>Software versions</h2><p class="muted">none recorded</p></section>'
    order = sorted(found, key=lambda name: (_PACKAGE_ORDER.index(name) if name in _PACKAGE_ORDER else 99, name))
    rows = []
    for package in order:
        versions = found[package]
        if len(versions) == 1:
            cell = esc(next(iter(versions)))
        else:
            cell = "<br>".join(f"{esc(version)} <span class=\"muted\">({esc(', '.join(stages))})</span>"
                               for version, stages in sorted(versions.items()))
        rows.append(f"<tr><td>{esc(package)}</td><td>{cell}</td></tr>")
    differ = any(len(versions) > 1 for versions in found.values())
    note = '<p class="warn">Stages ran with different versions.</p>' if differ else ""
    return (f'<section id="versions"><h2>Software versions</h2>{note}'
            f'<table class="kv"><tbody>{"".join(rows)}</tbody></table></section>')
