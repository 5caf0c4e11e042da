"""The report's counters: each shown with the label and kind its stage declares (``artifacts.counters``); a
counter no stage declares is shown plainly, under its own name, as processed."""

from __future__ import annotations

from collections.abc import Mapping

from artifacts.counters import DROPPED, ERROR, PROCESSED, Counter
from artifacts.run.report.markup import esc, number, table

# Skipped bz2 streams are told with the pages they held ("2 streams (106 pages)"): a stream of ~100 pages
# must not read as one bad record.
BAD_STREAMS = "bad_streams"
PAGES_IN_BAD_STREAMS = "pages_in_bad_streams"
_KIND_ORDER = {PROCESSED: 0, DROPPED: 1, ERROR: 2}


def describe(name: str, declared: Mapping[str, Counter]) -> Counter:
    """The declaration of counter ``name``; undeclared: its name as label, kind processed (never guessed)."""
    return declared.get(name) or Counter(name, name)


def is_bad_input(counter: Counter) -> bool:
    """Whether a counter is added to the bad-input totals (bad input that no other counter already counts)."""
    return counter.kind == ERROR and not counter.detail


def bad_input(values: Mapping[str, int], declared: Mapping[str, Counter]) -> tuple[int, int, int]:
    """A stage's bad input: (records, skipped streams, the pages those held), by its ``declared`` counters."""
    records = sum(value for name, value in values.items()
                  if name != BAD_STREAMS and is_bad_input(describe(name, declared)))
    return records, values.get(BAD_STREAMS, 0), values.get(PAGES_IN_BAD_STREAMS, 0)


def bad_input_summary(records: int, streams: int, pages: int) -> str:
    """Bad input in words: records, and skipped streams with the pages they held ("2 streams (106 pages)")."""
    parts = [f"{records:,}"] if records or not streams else []
    if streams:
        parts.append(f"{streams:,} stream{'s' if streams != 1 else ''} ({pages:,} page{'s' if pages != 1 else ''})")
    return " + ".join(parts)


def _row(counter: Counter, value: int) -> str:
    css = counter.kind if counter.kind != PROCESSED and value else ("zero" if not value else "")
    badge = f'<span class="badge {counter.kind}-b">{esc(counter.kind)}</span>'
    return (f'<tr class="{css}"><td>{esc(counter.label)}</td><td><code>{esc(counter.name)}</code></td>'
            f'<td>{badge}</td><td class="num">{number(value)}</td></tr>')


def counters_section(values: Mapping[str, int], declared: Mapping[str, Counter]) -> str:
    """A stage's counters: what was dropped by design (how many of its counters are above zero: they count links,
    titles, pairs..., no sum of them means anything) and what was bad input, then one row per counter."""
    if not values:
        return '<h3>Counters</h3><p class="muted">none recorded</p>'
    counters = sorted((describe(name, declared) for name in values),
                      key=lambda counter: (_KIND_ORDER[counter.kind], counter.name))
    dropped = [values[counter.name] for counter in counters if counter.kind == DROPPED]
    errors = sum(values[counter.name] for counter in counters if is_bad_input(counter))
    above_zero = sum(1 for value in dropped if value)
    summary = (f'<p class="{"alert" if errors else "note"}">Dropped by design: <b>{above_zero}</b> of '
               f"{len(dropped)} counter{'s' if len(dropped) != 1 else ''} above zero (each in its own unit, below) · "
               f"bad input (counted and dead-lettered): <b>{esc(bad_input_summary(*bad_input(values, declared)))}</b>"
               "</p>")
    rows = [_row(counter, values[counter.name]) for counter in counters]
    return "<h3>Counters</h3>" + summary + table(["what", "counter", "kind", "count"], rows,
                                                 [False, False, False, True])
