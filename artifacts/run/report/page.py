"""The report as one self-contained HTML page (inline CSS, no scripts, no network); all text is escaped."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from artifacts import layout
from artifacts.run.report import counters as counter_info
from artifacts.run.report.data import ReportData
from artifacts.run.report.gather import ArtifactSummary, StageView

MAX_CANDIDATES_SHOWN = 8
_PACKAGE_ORDER = ("python", "kpr-pipeline", "apache-beam", "pyarrow", "numpy", "torch", "transformers",
                  "faiss-cpu", "faiss-gpu", "marisa-trie", "mwparserfromhell", "spacy")
_ARROW_FLOATS = {"float": "float32", "halffloat": "float16", "double": "float64"}
_KIND_ORDER = {counter_info.PROCESSED: 0, counter_info.DROPPED: 1, counter_info.ERROR: 2}

CSS = """
*{box-sizing:border-box}
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",sans-serif;color:#1d2330;
 background:#f4f5f8;margin:0}
main{max-width:1100px;margin:0 auto;padding:24px 28px 64px}
h1{font-size:26px;margin:0 0 2px}
h2{font-size:20px;margin:0 0 6px;display:flex;gap:10px;align-items:center}
h3{font-size:12.5px;margin:20px 0 6px;color:#4a5368;text-transform:uppercase;letter-spacing:.05em}
section{background:#fff;border:1px solid #dfe3ea;border-radius:10px;padding:18px 24px 20px;margin:18px 0}
a{color:#2b5ea7}
.sub{color:#6a7386;margin:0 0 14px}
nav{display:flex;flex-wrap:wrap;gap:6px;margin:14px 0 4px}
nav a{text-decoration:none;background:#fff;border:1px solid #dfe3ea;border-radius:14px;padding:2px 12px;
 font-size:13.5px}
table{border-collapse:collapse;width:100%;font-size:14px;margin:4px 0}
th,td{padding:5px 10px;border-bottom:1px solid #edf0f4;text-align:left;vertical-align:top}
th{font-weight:600;color:#4a5368;background:#f8f9fb;font-size:13px}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.kv td:first-child{color:#4a5368;white-space:nowrap;width:1%}
table.kv td{border-bottom:1px solid #f1f3f6}
tr.dropped td{background:#fff9e8}
tr.error td{background:#fdeeee}
tr.zero td{color:#8a92a3;background:none}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;font-size:12px;font-weight:600;white-space:nowrap}
.ok{background:#e1f3e6;color:#1f6b35}.notrun{background:#eceef2;color:#6a7386}
.dropped-b{background:#fbefcc;color:#7a5600}.error-b{background:#f9d6d6;color:#8a1f1f}
.processed-b{background:#e6edf8;color:#2e4d7a}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(165px,1fr));gap:10px;margin:12px 0}
.card{background:#fff;border:1px solid #dfe3ea;border-radius:10px;padding:10px 14px}
.card .v{font-size:21px;font-weight:600;font-variant-numeric:tabular-nums}
.card .l{font-size:12.5px;color:#6a7386}
img.plot{max-width:100%;height:auto;display:block;margin:10px 0}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f1f3f6;padding:1px 4px;
 border-radius:3px;word-break:break-word}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:28px}
@media (max-width:820px){.grid2{grid-template-columns:1fr}}
.muted{color:#6a7386}
.meta{margin:2px 0 4px}
.meta b{font-variant-numeric:tabular-nums}
.note{background:#f6f8fb;border-left:4px solid #9fb3d1;padding:8px 12px;margin:10px 0}
.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:8px 12px;margin:10px 0}
.alert{background:#fdeeee;border-left:4px solid #d04545;padding:8px 12px;margin:10px 0}
.big{font-size:30px;font-weight:650;font-variant-numeric:tabular-nums}
.cand{display:inline-flex;align-items:center;gap:5px;margin:1px 14px 1px 0;white-space:nowrap}
.bar{display:inline-block;width:44px;height:7px;background:#e6e9ef;border-radius:4px;overflow:hidden}
.bar span{display:block;height:100%;background:#3b6ea5}
.pct{color:#4a5368;font-size:12.5px;font-variant-numeric:tabular-nums}
ul.read{margin:4px 0;padding-left:20px}
td.amb-name{min-width:12em;font-weight:500}
.nested{font-size:13px;line-height:1.45}
.nested span{color:#4a5368}
footer{color:#8a92a3;font-size:12.5px;margin-top:24px}
"""


# --- formatting ----------------------------------------------------------------------------------------------


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def number(value: int | float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,}" if isinstance(value, (int, np.integer)) else f"{value:,.3g}"


def size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{int(value):,} B" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def duration(seconds: float) -> str:
    """The exact recorded wall time, plus minutes/hours when that reads better."""
    exact = f"{seconds:,.3f} s"
    if seconds < 60:
        return exact
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    human = f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"
    return f"{exact} ({human})"


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def _table(headers: Sequence[str], rows: Iterable[str], numeric: Sequence[bool] = (), attrs: str = "") -> str:
    head = "".join(f'<th class="num">{esc(h)}</th>' if i < len(numeric) and numeric[i] else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    return f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _kv(pairs: Iterable[tuple[str, str]]) -> str:
    """A two-column table; values are HTML already."""
    rows = "".join(f"<tr><td>{esc(key)}</td><td>{value}</td></tr>" for key, value in pairs)
    return f'<table class="kv"><tbody>{rows}</tbody></table>'


def _plot(data: ReportData, key: str, alt: str) -> str:
    name = data.plots.get(key)
    return f'<img class="plot" src="{esc(name)}" alt="{esc(alt)}">' if name else ""


def _problem(data: ReportData, section: str) -> str:
    problem = data.problems.get(section)
    return f'<p class="warn">Could not read this part: {esc(problem)}</p>' if problem else ""


def _option_value(value: Any) -> str:
    if isinstance(value, dict):
        return '<div class="nested">' + "<br>".join(f"<span>{esc(key)}</span> {_option_value(item)}"
                                                    for key, item in sorted(value.items())) + "</div>"
    if isinstance(value, list):
        return f"<code>{esc(json.dumps(value))}</code>"
    if value is None:
        return '<span class="muted">none</span>'
    return f"<code>{esc(json.dumps(value))}</code>" if isinstance(value, str) else esc(value)


# --- the page ------------------------------------------------------------------------------------------------


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
    cards = [("stages run", f"{len(done)} of {len(data.views)}"), ("total wall time", duration(total).split(" (")[0])]
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
    totals: dict[str, int] = {}
    for view in done:
        for name, value in view.record.counters.items():
            totals[name] = totals.get(name, 0) + value
    cards.append(("bad input records", counter_info.bad_input_summary(totals)))
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
            f'<td class="num">{esc(duration(view.record.wall_time_s))}</td>'
            f"<td>{esc(view.record.finished_at)}</td></tr>" for view in done]
    return (f'<section id="timings"><h2>Timings</h2>{_plot(data, "timings", "wall time per stage")}'
            f'{_table(["stage", "wall time", "finished (UTC)"], rows, [False, True])}</section>')


def _stage(view: StageView, data: ReportData) -> str:
    anchor = f'id="stage-{esc(view.name)}"'
    if view.record is None:
        return (f'<section {anchor}><h2>{esc(view.command)} <span class="badge notrun">not run</span></h2>'
                f'<p class="muted">not run: OUT/manifest.json has no record of this stage.</p></section>')
    record = view.record
    parts = [f'<h2>{esc(view.command)} <span class="badge ok">done</span></h2>',
             f'<p class="meta">wall time <b>{esc(duration(record.wall_time_s))}</b> · finished '
             f'{esc(record.finished_at)} UTC</p>',
             '<div class="grid2"><div>', _read(view, data), _options(record.options), "</div><div>",
             _written(view.artifacts), "</div></div>", _counters(record.counters), _dead_letters(view)]
    extra = {layout.DICTIONARY_STAGE: _dictionary_extras, layout.EMBED_ENTITIES_STAGE: _embedding_extras,
             layout.INDEX_STAGE: _index_extras}.get(view.name)
    if extra is not None:
        parts.append(extra(data))
    return f"<section {anchor}>{''.join(parts)}</section>"


def _read(view: StageView, data: ReportData) -> str:
    items = []
    for item in view.inputs:
        title = f' title="fingerprint {esc(item.fingerprint)}"'
        if item.kind == "stage":
            upstream = data.view(item.name)
            written = ", ".join(f"{esc(artifact.name)} ({number(artifact.rows)} rows)" if artifact.rows is not None
                                else esc(artifact.name) for artifact in (upstream.artifacts if upstream else []))
            items.append(f'<li{title}>outputs of <a href="#stage-{esc(item.name)}">{esc(item.name.replace("_", "-"))}'
                         f"</a>{': ' + written if written else ''}</li>")
        else:
            rows = _rows_of(data.view(layout.PARSE_STAGE), item.name) if item.name == layout.ARTICLES else None
            detail = f" ({number(rows)} rows)" if rows is not None else ""
            items.append(f"<li{title}>input <code>{esc(item.name)}</code>{detail} "
                         f'<span class="muted">fingerprint {esc(item.fingerprint[:12])}…</span></li>')
    listing = f'<ul class="read">{"".join(items)}</ul>' if items else '<p class="muted">nothing recorded</p>'
    return f"<h3>Read</h3>{listing}"


def _options(options: dict[str, Any]) -> str:
    if not options:
        return '<h3>Options</h3><p class="muted">none</p>'
    return "<h3>Options</h3>" + _kv((key, _option_value(value)) for key, value in sorted(options.items()))


def _written(artifacts: list[ArtifactSummary]) -> str:
    if not artifacts:
        return '<h3>Written</h3><p class="muted">no files</p>'
    rows = [f"<tr><td><code>{esc(item.name)}/</code></td><td class=\"num\">{number(item.files)}</td>"
            f'<td class="num">{number(item.rows)}</td><td class="num" title="{item.bytes:,} bytes">'
            f"{esc(size(item.bytes))}</td></tr>" for item in sorted(artifacts, key=lambda artifact: artifact.name)]
    return "<h3>Written</h3>" + _table(["artifact", "files", "rows", "size"], rows, [False, True, True, True])


def _counters(values: dict[str, int]) -> str:
    if not values:
        return '<h3>Counters</h3><p class="muted">none recorded</p>'
    infos = sorted((counter_info.describe_counter(name) for name in values),
                   key=lambda info: (_KIND_ORDER[info.kind], info.name))
    rows = []
    for info in infos:
        value = values[info.name]
        css = info.kind if info.kind != counter_info.PROCESSED and value else ("zero" if not value else "")
        badge = f'<span class="badge {info.kind}-b">{esc(info.kind)}</span>'
        rows.append(f'<tr class="{css}"><td>{esc(info.label)}</td><td><code>{esc(info.name)}</code></td>'
                    f'<td>{badge}</td><td class="num">{number(value)}</td></tr>')
    dropped = sum(values[i.name] for i in infos if i.kind == counter_info.DROPPED)
    errors = sum(values[i.name] for i in infos if counter_info.is_bad_input(i.name))
    summary = (f'<p class="{"alert" if errors else "note"}">Dropped by design: <b>{number(dropped)}</b> · '
               f"bad input (counted and dead-lettered): <b>{esc(counter_info.bad_input_summary(values))}</b></p>")
    return "<h3>Counters</h3>" + summary + _table(["what", "counter", "kind", "count"], rows,
                                                  [False, False, False, True])


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
            "where):</p>" + _table(["file", "size"], rows, [False, True]))


# --- per-stage analyses --------------------------------------------------------------------------------------


def _dictionary_extras(data: ReportData) -> str:
    return _entities_part(data) + _names_part(data)


def _entities_part(data: ReportData) -> str:
    stats = data.entities
    if stats is None:
        return "<h3>Entities</h3>" + _problem(data, "entities")
    summary = _kv([
        ("entities", number(stats.count)),
        ("with a Wikidata QID", f"{number(stats.with_qid)} ({percent(stats.with_qid / max(stats.count, 1))})"),
        ("inbound links", number(stats.total_links)),
        ("inbound links per entity", f"median {number(stats.quantile(0.5))} · 90th percentile "
                                     f"{number(stats.quantile(0.9))} · 99th percentile "
                                     f"{number(stats.quantile(0.99))} · "
                                     f"max {number(int(stats.link_count_values.max(initial=0)))}"),
        ("entities without inbound links", number(stats.without_links)),
    ])
    rows = [f'<tr><td class="num">{rank}</td><td>{esc(item.title)}</td><td class="num">{number(item.entity_id)}</td>'
            f'<td class="num">{number(item.link_count)}</td></tr>' for rank, item in enumerate(stats.top, 1)]
    top = _table(["#", "entity", "entity_id", "inbound links"], rows, [True, False, True, True])
    return ("<h3>Entities: inbound link frequency</h3>" + summary
            + _plot(data, "entity-links", "inbound links per entity, log-log") + "<h3>Most linked entities</h3>" + top)


def _names_part(data: ReportData) -> str:
    stats = data.dictionary
    if stats is None:
        return "<h3>Names</h3>" + _problem(data, "dictionary")
    mean = stats.pairs / max(stats.names, 1)
    summary = _kv([
        ("names", number(stats.names)),
        ("name-entity pairs", number(stats.pairs)),
        ("ambiguous names (2+ candidates)",
         f"{number(stats.ambiguous_names)} ({percent(stats.ambiguous_names / max(stats.names, 1))})"),
        ("candidates per name", f"mean {mean:.2f} · max {number(len(stats.candidates_per_name) - 1)}"),
    ])
    return ("<h3>Names: link probability and commonness</h3>" + summary
            + _plot(data, "dictionary", "link probability, commonness and candidates per name")
            + '<p class="muted">Link probability is counted once per name; commonness once per name-entity pair. '
              "Log scale on the counts.</p>"
            + _ambiguous(stats.ambiguous))


def _ambiguous(names: list) -> str:
    if not names:
        return '<h3>Most ambiguous names</h3><p class="muted">No name has more than one candidate entity.</p>'
    rows = []
    for item in names:
        shown = item.candidates[:MAX_CANDIDATES_SHOWN]
        chips = "".join(
            f'<span class="cand" title="entity_id {item_candidate.entity_id}, {item_candidate.link_count:,} links">'
            f'{esc(item_candidate.title)} <span class="bar"><span style="width:{100 * item_candidate.commonness:.0f}%">'
            f'</span></span><span class="pct">{percent(item_candidate.commonness)}</span></span>'
            for item_candidate in shown)
        more = len(item.candidates) - len(shown)
        if more > 0:
            chips += f'<span class="muted">+{more} more</span>'
        rows.append(f'<tr><td class="amb-name">{esc(item.name)}</td><td class="num">{number(len(item.candidates))}</td>'
                    f'<td class="num">{number(item.total_link_count)}</td>'
                    f'<td class="num">{percent(item.link_prob)}</td><td>{chips}</td></tr>')
    return ('<h3>Most ambiguous names</h3><p class="muted">Names with the most candidate entities (ties: most links '
            "first); candidates by commonness.</p>"
            + _table(["name", "candidates", "links", "link prob.", "candidate entities (commonness)"], rows,
                     [False, True, True, True], ' id="ambiguous-names"'))


def _embedding_extras(data: ReportData) -> str:
    stats = data.embeddings
    if stats is None:
        return "<h3>Entity embeddings</h3>" + _problem(data, "embeddings")
    meta = stats.metadata
    norms = stats.norms.astype(np.float64)
    spread = (f"min {norms.min():.6g} · mean {norms.mean():.6g} · max {norms.max():.6g} · "
              f"std {norms.std():.3g}") if len(norms) else "—"
    target = stats.target_norm
    deviation = f"{np.abs(norms - target).max() / target:.2e}" if target and len(norms) else "—"
    mentions = stats.mentions_per_entity
    total_mentions = int((np.arange(len(mentions)) * mentions).sum())
    summary = _kv([
        ("entity vectors", number(stats.count)),
        ("dimension", number(stats.dim)),
        ("model", f"<code>{esc(meta.get('model', '?'))}</code> (layer {esc(meta.get('layer', '?'))}, "
                  f"computed in {esc(meta.get('dtype', '?'))})"),
        ("stored as", esc(meta.get("embedding_dtype") or _ARROW_FLOATS.get(stats.value_type, stats.value_type))),
        ("target norm (file metadata)", esc(meta.get("target_norm", "—"))),
        ("stored norms", esc(spread)),
        ("largest relative distance from the target", esc(deviation)),
        ("mentions averaged", f"{number(total_mentions)} (mean {total_mentions / max(stats.count, 1):.2f} per "
                              f"entity, max {number(len(mentions) - 1)})"),
    ])
    return ("<h3>Entity embeddings</h3>" + summary
            + _plot(data, "entity-embeddings", "norm distribution and mentions per entity"))


def _index_extras(data: ReportData) -> str:
    info = data.index_info
    if info is None:
        return "<h3>Index</h3>" + _problem(data, "index")
    files = data.index_files
    used = [shard for shard in info.shard_files if shard.get("count")]
    encoder = info.encoder
    disk = (f"{esc(size(files.total))} in all: FAISS {esc(size(files.faiss))} · id maps {esc(size(files.id_maps))} · "
            f"stored vectors and texts {esc(size(files.embeddings))}") if files else "—"
    summary = _kv([
        ("factory", f"<code>{esc(info.factory)}</code>"),
        ("metric", esc(info.metric)),
        ("dimension", number(info.dim)),
        ("shards", f"{number(info.shards)} ({number(len(used))} with passages)"),
        ("passages", number(info.count)),
        ("trained on", f"{number(info.train_sample)} vectors" if info.train_sample else "no training needed"),
        ("encoder", f"<code>{esc(encoder.get('model', '?'))}</code> ({esc(encoder.get('kind', '?'))}, "
                    f"{esc(encoder.get('dtype', '?'))})"),
        ("on disk", disk),
    ])
    return "<h3>Index</h3>" + summary + _recall(data)


def _recall(data: ReportData) -> str:
    result = data.recall
    if result is None:
        return "<h3>Recall</h3>" + (_problem(data, "recall") or '<p class="muted">not measured</p>')
    if result.subset:
        how = (f"measured on a subset: exact search over the first {number(result.exact_vectors)} of "
               f"{number(result.total_vectors)} stored vectors (shard by shard, in file order; shards are hash "
               "partitions of the passage ids), the FAISS index restricted to the same passages with an ID selector")
    else:
        how = f"exact search over all {number(result.exact_vectors)} stored vectors"
    return (f"<h3>Recall</h3><p><span class=\"big\">{result.recall:.3f}</span> recall@{result.k} of the FAISS "
            f"index ({esc(result.search_settings)}) against exact {esc(data.index_info.metric)} search</p>"
            f'<p class="muted">{number(result.queries)} queries: stored passage vectors picked by a hash of their '
            f"ids; {esc(how)}; ties with the k-th exact score count as hits. Took {result.seconds:,.1f} s.</p>")


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
