"""HTML building blocks of the report: the stylesheet, escaping, number formats, tables, plots and notes."""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from artifacts.run.report.data import ReportData

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
    """A wall time as a person reads it: ``4.2 s``, ``27 min 18 s``, ``3 h 05 min``."""
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def exact_duration(seconds: float) -> str:
    """``duration`` with the recorded seconds, exact, on hover."""
    return f'<span title="{seconds:,.3f} s">{esc(duration(seconds))}</span>'


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def table(headers: Sequence[str], rows: Iterable[str], numeric: Sequence[bool] = (), attrs: str = "") -> str:
    head = "".join(f'<th class="num">{esc(h)}</th>' if i < len(numeric) and numeric[i] else f"<th>{esc(h)}</th>"
                   for i, h in enumerate(headers))
    return f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def kv(pairs: Iterable[tuple[str, str]]) -> str:
    """A two-column table; values are HTML already."""
    rows = "".join(f"<tr><td>{esc(key)}</td><td>{value}</td></tr>" for key, value in pairs)
    return f'<table class="kv"><tbody>{rows}</tbody></table>'


def plot(data: ReportData, key: str, alt: str) -> str:
    name = data.plots.get(key)
    return f'<img class="plot" src="{esc(name)}" alt="{esc(alt)}">' if name else ""


def problem(data: ReportData, section: str) -> str:
    problem = data.problems.get(section)
    return f'<p class="warn">Could not read this part: {esc(problem)}</p>' if problem else ""


def option_value(value: Any) -> str:
    if isinstance(value, dict):
        return '<div class="nested">' + "<br>".join(f"<span>{esc(key)}</span> {option_value(item)}"
                                                    for key, item in sorted(value.items())) + "</div>"
    if isinstance(value, list):
        return f"<code>{esc(json.dumps(value))}</code>"
    if value is None:
        return '<span class="muted">none</span>'
    if value == "":
        return '<span class="muted">default</span>'
    return f"<code>{esc(json.dumps(value))}</code>" if isinstance(value, str) else esc(value)

