"""The report's PNG plots, drawn with matplotlib's Agg canvas (no display, no pyplot global state)."""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from artifacts.run.report.dictionary import DictionaryStats
from artifacts.run.report.gather import EmbeddingStats, EntityStats
from artifacts.run.report.markup import duration
from artifacts.run.report.stages import StageView
from artifacts.run.report.stats import integer_log_edges

WIDTH = 10.0  # inches at DPI: 1000 px wide, shown at most 1000 px wide in the page
PANEL_HEIGHT = 3.3
DPI = 100
BAR = "#3b6ea5"
ACCENT = "#c0504d"


def _figure(panels: int, height: float = PANEL_HEIGHT, width: float = WIDTH):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, panels, squeeze=False)[0]
    for axis in axes:
        axis.grid(True, alpha=0.3, linewidth=0.6)
        axis.set_axisbelow(True)
        axis.tick_params(labelsize=9)
        for side in ("top", "right"):
            axis.spines[side].set_visible(False)
    return figure, axes


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _thousands(axis_object) -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    # min_n_ticks=1: on a narrow axis (every entity has one mention) one integer tick, not 0.8 1.0 1.2 all as "1"
    axis_object.set_major_locator(MaxNLocator(integer=True, nbins=6, min_n_ticks=1))
    axis_object.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))


def _title(axis, text: str) -> None:
    axis.set_title(text, fontsize=10.5, loc="left")


def timings(views: Sequence[StageView]) -> bytes:
    """Wall time per stage, as horizontal bars with their values."""
    ran = [view for view in views if view.record is not None]
    figure, (axis,) = _figure(1, height=0.9 + 0.42 * max(len(ran), 1), width=8.0)
    names = [view.command for view in ran]
    seconds = [view.record.wall_time_s for view in ran]
    positions = np.arange(len(ran))
    axis.barh(positions, seconds, color=BAR, height=0.6)
    axis.set_yticks(positions, names, fontsize=10)
    axis.invert_yaxis()
    axis.set_xlabel("wall time (s)", fontsize=9)
    axis.grid(True, axis="x", alpha=0.3)
    axis.grid(False, axis="y")
    top = max(seconds, default=1.0) or 1.0
    axis.set_xlim(0, top * 1.18)
    for position, value in zip(positions, seconds, strict=True):
        axis.text(value + top * 0.01, position, duration(value), va="center", fontsize=9)
    return _png(figure)


def entity_links(stats: EntityStats) -> bytes:
    """Inbound links per entity: a log-binned histogram and the rank-frequency curve, both log-log."""
    figure, (histogram, ranks) = _figure(2)
    values, entities = stats.link_count_values, stats.link_count_entities
    linked = values > 0
    if linked.any():
        # bins of whole link counts, growing geometrically: exact for small counts, smooth in the tail;
        # divided by the integers each bin holds, so the bars read as "entities with this many links"
        edges = integer_log_edges(int(values[linked].max()))
        counts, _ = np.histogram(values[linked], bins=edges, weights=entities[linked])
        histogram.stairs(counts / np.diff(edges), edges, fill=True, color=BAR, alpha=0.85)
        histogram.set_xscale("log")
        histogram.set_yscale("log")
        # the entity of rank r has the r-th most links: values in descending order, each as often as held
        descending = values[linked][::-1]
        last_rank = np.cumsum(entities[linked][::-1])
        first_rank = np.concatenate([[1], last_rank[:-1] + 1])
        ranks.plot(np.ravel(np.column_stack([first_rank, last_rank])), np.repeat(descending, 2), color=BAR)
        ranks.set_xscale("log")
        ranks.set_yscale("log")
    _title(histogram, "entities by inbound link count")
    histogram.set_xlabel("inbound links", fontsize=9)
    histogram.set_ylabel("entities per link count", fontsize=9)
    _title(ranks, "rank-frequency")
    ranks.set_xlabel("entity rank (most linked = 1)", fontsize=9)
    ranks.set_ylabel("inbound links", fontsize=9)
    return _png(figure)


def dictionary(stats: DictionaryStats) -> bytes:
    """Link probability per name, commonness per pair, candidate entities per name."""
    figure, (link_prob, commonness, candidates) = _figure(3)
    for axis, histogram, title, label, unit in (
            (link_prob, stats.link_prob, "link probability", "link probability", "names"),
            (commonness, stats.commonness, "commonness", "commonness", "name-entity pairs")):
        axis.stairs(histogram.counts, histogram.edges, fill=True, color=BAR, alpha=0.85)
        axis.set_xlim(0, 1)
        if histogram.counts.max(initial=0) > 0:
            axis.set_yscale("log")
            axis.set_ylim(bottom=0.7)
        _title(axis, title)
        axis.set_xlabel(f"{label} (2% bins)", fontsize=9)
        axis.set_ylabel(unit, fontsize=9)
    counts = stats.candidates_per_name
    shown = np.nonzero(counts)[0]
    shown = shown[shown > 0]
    candidates.bar(shown, counts[shown], color=BAR, width=0.8)
    if len(shown):
        candidates.set_yscale("log")
        candidates.set_ylim(bottom=0.7)
    _thousands(candidates.xaxis)
    _title(candidates, "candidates per name")
    candidates.set_xlabel("candidate entities", fontsize=9)
    candidates.set_ylabel("names", fontsize=9)
    return _png(figure)


def embeddings(stats: EmbeddingStats) -> bytes:
    """Relative distance of the vector norms from the target norm, and mentions averaged per entity."""
    figure, (norms, mentions) = _figure(2)
    target = stats.target_norm
    reference = target if target else float(np.mean(stats.norms)) if len(stats.norms) else 1.0
    deviation = stats.norms.astype(np.float64) / reference - 1.0
    if len(deviation):
        spread = float(np.abs(deviation).max()) or 1e-9
        norms.hist(deviation, bins=41, range=(-spread, spread), color=BAR, alpha=0.85)
        norms.axvline(0.0, color=ACCENT, linewidth=1.0, alpha=0.7)
        norms.set_yscale("log")
        norms.set_ylim(bottom=0.7)
    norms.ticklabel_format(axis="x", style="sci", scilimits=(-2, 2), useMathText=True)
    name = "target norm" if target else "mean norm"
    _title(norms, f"stored L2 norms ({name} {reference:.5g})")
    norms.set_xlabel(f"norm / {name} − 1", fontsize=9)
    norms.set_ylabel("entities", fontsize=9)
    counts = stats.mentions_per_entity
    shown = np.nonzero(counts)[0]
    mentions.bar(shown, counts[shown], color=BAR, width=0.8 if len(counts) < 40 else 1.0)
    _thousands(mentions.xaxis)
    _thousands(mentions.yaxis)
    _title(mentions, "mentions averaged per entity")
    mentions.set_xlabel("mentions", fontsize=9)
    mentions.set_ylabel("entities", fontsize=9)
    return _png(figure)
