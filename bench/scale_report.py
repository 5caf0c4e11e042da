"""The figures of ``bench/scale.py``: its measured stage runs, memory and CPU per output unit, the speed-up with more
workers and a projection for English Wikipedia on one 16-core 128 GB machine, as plain-text tables and JSON.

A stage's memory is fitted against what it outputs (titles, names, sampled mentions, ...), not against the dump's
bytes: that is what a stage must hold, and what grows from the synthetic dumps to English Wikipedia."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

# English Wikipedia and the DPR corpus (DESIGN.md, issue 26): the projection's assumed inputs. Sampled mentions:
# the upper end of 80-112M (128 per entity).
ENWIKI = {"XML MB": 95_000.0, "articles": 6.7e6, "titles": 17e6, "links": 150e6, "entities": 7e6, "names": 20e6,
          "mentions": 112e6, "passages": 21e6}
MACHINE_WORKERS, MACHINE_MEMORY_GB = 16, 128
# The memory projection fits the sizes from this many articles on: below it a stage's bounded buffers (a spill, a
# row group, spaCy's vocabulary of the text's words) are still filling, which is no growth with the output.
FIT_FROM_ARTICLES = 10_000
DPR_DIM = 768  # the index projection: DPR's passage vectors
# stage -> (the output unit its memory is fitted against, the unit its rate and hours count)
UNITS = {
    "parse": ("titles", "articles"),
    "dictionary": ("names", "articles"),
    "mentions": ("mentions", "articles"),
    "embed-entities": ("mentions", "mentions"),
    "index": ("vector MB", "passages"),
    "index-kpr": ("vector MB", "passages"),
}


@dataclass
class StageRun:
    """One stage run on one dump with one worker count, as measured; ``outputs``: what the dump holds and the
    stage wrote, by unit (articles, titles, names, entities, mentions, passages, vector MB)."""

    stage: str
    articles: int
    xml_bytes: int
    workers: int
    ok: bool
    wall_s: float
    cpu_s: float
    peak_rss_bytes: int
    processes: int
    max_process_rss_bytes: int = 0  # the peak RSS of the largest single process (VmHWM)
    outputs: dict[str, float] = field(default_factory=dict)
    no_op_processes: int | None = None  # processes where the no-op forward was installed
    log: str = ""

    @property
    def peak_rss_mb(self) -> float:
        return self.peak_rss_bytes / 1e6

    @property
    def largest_mb(self) -> float:
        return self.max_process_rss_bytes / 1e6

    def rate(self) -> float | None:
        """Items per second of the stage's rate unit."""
        count = self.outputs.get(UNITS[self.stage][1])
        return None if count is None else count / self.wall_s


def describe(run: StageRun) -> str:
    """One line per run (the benchmark's progress)."""
    no_op = "" if run.no_op_processes is None else f", no-op model in {run.no_op_processes} process(es)"
    outputs = ", ".join(f"{value:,.0f} {unit}" for unit, value in run.outputs.items())
    return (f"{run.stage:<15} {run.articles:>8,} articles  workers={run.workers}  {'ok' if run.ok else 'FAILED'}  "
            f"{run.wall_s:7.1f} s wall  {run.cpu_s:7.1f} s CPU  {run.peak_rss_mb:6.0f} MB tree  "
            f"{run.largest_mb:6.0f} MB largest  ({outputs}){no_op}")


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through the points."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return slope, mean_y - slope * mean_x


def stage_order(stage: str, *rest: int) -> tuple[int, ...]:
    """Sort key: the stages in pipeline order, then the numbers given (size, workers)."""
    return (list(UNITS).index(stage), *rest)


def groups(runs: Sequence[StageRun]) -> dict[tuple[str, int], list[StageRun]]:
    """The successful runs by (stage, workers), smallest dump first."""
    grouped: dict[tuple[str, int], list[StageRun]] = {}
    for run in sorted(runs, key=lambda run: run.articles):
        if run.ok:
            grouped.setdefault((run.stage, run.workers), []).append(run)
    return dict(sorted(grouped.items(), key=lambda item: stage_order(*item[0])))


def memory_fit(measured: Sequence[StageRun], from_articles: int = 0) -> dict[str, Any] | None:
    """Peak RSS (tree and largest process) against the stage's output unit, over the sizes of at least
    ``from_articles`` articles: bytes per unit and MB at none (None: fewer than two such sizes)."""
    unit = UNITS[measured[0].stage][0]
    points = [run for run in measured if unit in run.outputs and run.articles >= from_articles]
    if len({run.outputs[unit] for run in points}) < 2:
        return None
    xs = [run.outputs[unit] for run in points]
    tree, tree_at_0 = fit_line(xs, [run.peak_rss_mb for run in points])
    largest, largest_at_0 = fit_line(xs, [run.largest_mb for run in points])
    return {"unit": unit, "tree_bytes_per_unit": tree * 1e6, "tree_mb_at_0": tree_at_0,
            "largest_bytes_per_unit": largest * 1e6, "largest_mb_at_0": largest_at_0,
            "largest_measured": max(xs), "from_articles": min(run.articles for run in points)}


def projection_fit(measured: Sequence[StageRun]) -> dict[str, Any] | None:
    """The fit a projection uses: from ``FIT_FROM_ARTICLES`` on when two sizes are that large, else all sizes."""
    return memory_fit(measured, FIT_FROM_ARTICLES) or memory_fit(measured)


def cpu_per_article(measured: Sequence[StageRun]) -> list[dict[str, float]]:
    """CPU milliseconds per article at each size, and between consecutive sizes (the marginal cost; none between
    repeated runs of one size)."""
    rows, previous = [], None
    for run in measured:
        row = {"articles": run.articles, "cpu_ms_per_article": 1e3 * run.cpu_s / run.articles}
        if previous is not None and run.articles != previous.articles:
            row["marginal_cpu_ms_per_article"] = 1e3 * (run.cpu_s - previous.cpu_s) / (run.articles - previous.articles)
        rows.append(row)
        previous = run
    return rows


def amdahl_fit(runs: Sequence[StageRun]) -> tuple[float, float]:
    """(s, p) of the least-squares fit of wall time = s + p / workers (Amdahl's law) over a stage's runs on one
    input: ``s`` the seconds that do not spread over the workers (start-up, single-worker steps)."""
    parallel, serial = fit_line([1 / run.workers for run in runs], [run.wall_s for run in runs])
    return serial, parallel


def mean_run(runs: Sequence[StageRun]) -> StageRun:
    """Repeated runs of one stage, size and worker count as one: their mean wall and CPU seconds, their largest
    memory."""
    return replace(runs[0], wall_s=sum(run.wall_s for run in runs) / len(runs),
                   cpu_s=sum(run.cpu_s for run in runs) / len(runs),
                   peak_rss_bytes=max(run.peak_rss_bytes for run in runs),
                   max_process_rss_bytes=max(run.max_process_rss_bytes for run in runs))


def speedups(runs: Sequence[StageRun]) -> list[dict[str, Any]]:
    """Per stage and size: wall time with the fewest workers over wall time with each larger count, the seconds that
    do not spread (``amdahl_fit``'s s) and their share of each run as fitted (s / (s + p / N): a measured wall time
    below the fit's s would make it more than all of it), CPU seconds with more over with the fewest, and
    the largest process with more workers over the whole tree with the fewest (what one process must hold). Repeated
    runs of one worker count (alternated rounds) count by their means."""
    groups: dict[tuple[str, int], list[StageRun]] = {}
    for run in runs:
        if run.ok:
            groups.setdefault((run.stage, run.articles), []).append(run)
    found = []
    for (stage, articles), group in sorted(groups.items(), key=lambda item: stage_order(*item[0])):
        by_workers: dict[int, list[StageRun]] = {}
        for run in group:
            by_workers.setdefault(run.workers, []).append(run)
        base, *more = [mean_run(by_workers[count]) for count in sorted(by_workers)]
        serial, parallel = amdahl_fit([base, *more]) if more else (0.0, base.wall_s)
        found += [{"stage": stage, "articles": articles, "workers": run.workers, "base_workers": base.workers,
                   "speedup": base.wall_s / run.wall_s, "serial_s": serial,
                   "serial_share": serial / (serial + parallel / run.workers),
                   "cpu_ratio": run.cpu_s / base.cpu_s, "largest_mb": run.largest_mb,
                   "base_largest_mb": base.largest_mb} for run in more]
    return found


def index_memory_mb(fit: dict[str, Any]) -> tuple[float, str]:
    """Peak RSS of the index stage for DPR's passages: building one shard (its vectors chosen within the default
    --shard-memory-gb) or training on the largest sample, whichever holds more vectors, from the vector fit."""
    from artifacts.faiss import choice

    count = int(ENWIKI["passages"])
    shards = choice.shards_for_memory(count, DPR_DIM, int(choice.DEFAULT_SHARD_MEMORY_GB * choice.GB))
    shard_mb = choice.vector_bytes(count, DPR_DIM) / shards / 1e6
    sample_mb = choice.vector_bytes(choice.MAX_TRAIN_SAMPLE, DPR_DIM) / 1e6
    held = max(shard_mb, sample_mb)
    why = (f"index: MB at 0 + MB per vector MB x {held:,.0f} MB (the larger of one shard: {count / 1e6:.0f}M x "
           f"{DPR_DIM} in {shards} shards within --shard-memory-gb {choice.DEFAULT_SHARD_MEMORY_GB:g} = "
           f"{shard_mb:,.0f} MB, and the training sample: {choice.MAX_TRAIN_SAMPLE / 1e6:.0f}M vectors = "
           f"{sample_mb:,.0f} MB)")
    return fit["tree_mb_at_0"] + fit["tree_bytes_per_unit"] / 1e6 * held, why


def mentions_per_entity(runs: Sequence[StageRun]) -> float | None:
    """Sampled mentions per entity at the largest measured size."""
    measured = [run for run in runs if run.ok and run.stage == "mentions" and run.outputs.get("entities")]
    if not measured:
        return None
    largest = max(measured, key=lambda run: (run.articles, -run.workers))
    return largest.outputs["mentions"] / largest.outputs["entities"]


def projected(measured: Sequence[StageRun]) -> dict[str, Any]:
    """One stage's projection from its runs with one worker count (smallest dump first)."""
    largest = measured[-1]
    unit, rate_unit = UNITS[largest.stage]
    fit = projection_fit(measured)
    row: dict[str, Any] = {"stage": largest.stage, "unit": unit, "rate_unit": rate_unit, "workers": largest.workers,
                           "measured_at": largest.articles}
    rate = largest.rate()
    if rate is not None:
        items = ENWIKI[rate_unit]
        row.update(items=items, rate_per_worker=rate / largest.workers,
                   hours=items / (rate / largest.workers * MACHINE_WORKERS) / 3600,
                   hours_cpu_bound=items / (largest.outputs[rate_unit] / largest.cpu_s * MACHINE_WORKERS) / 3600)
    if fit is not None:
        if unit == "vector MB":
            memory, row["memory_basis"] = index_memory_mb(fit)
        else:
            memory = fit["tree_mb_at_0"] + fit["tree_bytes_per_unit"] / 1e6 * ENWIKI[unit]
            row["memory_basis"] = (f"{fit['tree_mb_at_0']:,.0f} MB + {fit['tree_bytes_per_unit']:,.1f} B x "
                                   f"{ENWIKI[unit] / 1e6:,.0f}M {unit} (x{ENWIKI[unit] / fit['largest_measured']:,.0f}"
                                   f" the largest measured)")
        row["peak_memory_gb"] = max(memory, max(run.peak_rss_mb for run in measured)) / 1e3
    return row


def projection(runs: Sequence[StageRun]) -> list[dict[str, Any]]:
    """Per stage, from its runs with the fewest workers: hours on MACHINE_WORKERS workers at the per-worker rate
    of the largest size, and peak memory from the fit against the stage's output unit."""
    rows: dict[str, dict[str, Any]] = {}
    for (stage, _workers), measured in sorted(groups(runs).items(), key=lambda item: item[0][1]):
        rows.setdefault(stage, projected(measured))
    return sorted(rows.values(), key=lambda row: stage_order(row["stage"]))


def summary(runs: Sequence[StageRun]) -> dict[str, Any]:
    """Every derived figure (the JSON beside the runs)."""
    measured = groups(runs)
    return {"memory": {f"{stage} w{workers}": memory_fit(found) for (stage, workers), found in measured.items()},
            "memory_projected": {f"{stage} w{workers}": projection_fit(found)
                                 for (stage, workers), found in measured.items()},
            "cpu_per_article": {f"{stage} w{workers}": cpu_per_article(found)
                                for (stage, workers), found in measured.items()},
            "speedups": speedups(runs), "projection": projection(runs),
            "mentions_per_entity": mentions_per_entity(runs),
            "assumed": {**ENWIKI, "workers": MACHINE_WORKERS, "memory_gb": MACHINE_MEMORY_GB}}


def print_runs(runs: Sequence[StageRun]) -> None:
    print("Stage runs (tree: the stage's process and all its Beam worker processes, summed, sampled every 0.1 s; "
          "largest: the peak of the largest single process, VmHWM)")
    print(f"{'stage':<15} {'articles':>8} {'workers':>7} {'wall s':>8} {'CPU s':>8} {'tree MB':>8} {'largest MB':>10}"
          f"  outputs")
    for run in sorted(runs, key=lambda run: stage_order(run.stage, run.articles, run.workers)):
        outputs = ", ".join(f"{value:,.0f} {unit}" for unit, value in run.outputs.items()) if run.ok else \
            f"FAILED (log {run.log})"
        print(f"{run.stage:<15} {run.articles:8,} {run.workers:7d} {run.wall_s:8.1f} {run.cpu_s:8.1f} "
              f"{run.peak_rss_mb:8.0f} {run.largest_mb:10.0f}  {outputs}")


def print_memory(runs: Sequence[StageRun]) -> None:
    print("\nMemory per output unit (least squares: peak RSS against what the stage wrote; over every size, and from "
          f"{FIT_FROM_ARTICLES:,} articles on, which the projection uses)")
    print(f"{'stage':<15} {'workers':>7} {'unit':<10} {'sizes from':>10} {'tree B/unit':>11} {'tree MB at 0':>12} "
          f"{'largest B/unit':>14} {'largest MB at 0':>15}")
    for (stage, workers), measured in groups(runs).items():
        for fit in (memory_fit(measured), memory_fit(measured, FIT_FROM_ARTICLES)):
            if fit is not None:
                print(f"{stage:<15} {workers:7d} {fit['unit']:<10} {fit['from_articles']:10,} "
                      f"{fit['tree_bytes_per_unit']:11,.1f} {fit['tree_mb_at_0']:12,.0f} "
                      f"{fit['largest_bytes_per_unit']:14,.1f} {fit['largest_mb_at_0']:15,.0f}")


def print_cpu(runs: Sequence[StageRun]) -> None:
    print("\nCPU per article (ms; marginal: between this size and the one before)")
    for (stage, workers), measured in groups(runs).items():
        cells = [f"{row['articles']:,}: {row['cpu_ms_per_article']:.2f}"
                 + (f" (marginal {row['marginal_cpu_ms_per_article']:.2f})"
                    if "marginal_cpu_ms_per_article" in row else "") for row in cpu_per_article(measured)]
        print(f"{stage:<15} w{workers}  " + "; ".join(cells))


def print_speedups(runs: Sequence[StageRun]) -> None:
    found = speedups(runs)
    if not found:
        return
    print("\nMore workers (speed-up: wall time of the fewest / wall time; not parallel: s of wall = s + p / workers "
          "fitted over the stage's worker counts on that dump, and its share of the run (meaningful with a core a "
          "worker); CPU s: with more / with the fewest; largest process with more workers against the whole tree "
          "with the fewest)")
    print(f"{'stage':<15} {'articles':>8} {'workers':>7} {'speed-up':>8} {'not parallel':>18} {'CPU s':>6} "
          f"{'largest MB':>10} {'was (tree)':>10}")
    for item in found:
        print(f"{item['stage']:<15} {item['articles']:8,} {item['base_workers']:>3} -> {item['workers']:<2}"
              f" {item['speedup']:7.2f}x {item['serial_s']:8.1f} s, {item['serial_share']:5.0%}"
              f" {item['cpu_ratio']:5.2f}x "
              f"{item['largest_mb']:10.0f} "
              f"{item['base_largest_mb']:10.0f}")


def print_projection(runs: Sequence[StageRun], no_op_model: bool, stand_in: float | None = None) -> None:
    rows = projection(runs)
    if not rows:
        return
    print(f"\nProjection: English Wikipedia on one {MACHINE_WORKERS}-core {MACHINE_MEMORY_GB} GB machine")
    print("  assumed:  " + ", ".join(f"{value / 1e6:,.1f}M {unit}" if unit != "XML MB" else f"{value:,.0f} MB of XML"
                                      for unit, value in ENWIKI.items()) + " (mentions: the upper end of 80-112M)")
    print(f"            {MACHINE_WORKERS} workers, each as fast as one measured worker (linear scaling: compare the "
          "speed-ups above)")
    per_entity = mentions_per_entity(runs)
    if per_entity is not None:
        print(f"  measured: {per_entity:.1f} sampled mentions per entity at the largest size "
              f"(x {ENWIKI['entities'] / 1e6:.0f}M entities = {per_entity * ENWIKI['entities'] / 1e6:.0f}M)")
    print(f"  memory = MB at 0 + bytes per output unit x enwiki's units (the fits from {FIT_FROM_ARTICLES:,} articles "
          "on where two sizes are that large, else from the smallest: 'sizes from' above; fewest workers), at least "
          "the largest measured")
    if stand_in:
        print(f"  embed-entities and index: each run's forward paced as ONE GPU of {stand_in:,.0f} tokens a second "
              "shared by its workers (--stand-in): their hours assume a share of such a GPU per worker as measured, "
              f"{MACHINE_WORKERS} shares; README 'GPUs' projects one card")
    elif no_op_model:
        print("  embed-entities and index: host side only (--no-op-model: no model forward counted)")
    print(f"{'stage':<15} {'items':>14} {'rate per worker':>24} {'hours':>7} {'CPU-bound':>9}  peak memory")
    for row in rows:
        memory = "n/a (one size)" if "peak_memory_gb" not in row else f"{row['peak_memory_gb']:,.1f} GB"
        if row.get("peak_memory_gb", 0) > MACHINE_MEMORY_GB:
            memory += " (does not fit)"
        if "items" in row:
            rate = f"{row['rate_per_worker']:,.1f} {row['rate_unit']}/s"
            print(f"{row['stage']:<15} {row['items']:14,.0f} {rate:>24} {row['hours']:7.2f} "
                  f"{row['hours_cpu_bound']:9.2f}  {memory}")
        else:
            print(f"{row['stage']:<15} {'':>14} {'':>24} {'':>7} {'':>9}  {memory}")
        if "memory_basis" in row:
            print(f"{'':<15} memory: {row['memory_basis']}")


def print_report(runs: Sequence[StageRun], no_op_model: bool, stand_in: float | None = None) -> None:
    """Every table: the runs, memory and CPU per unit, the speed-ups, the projection."""
    print_runs(runs)
    print_memory(runs)
    print_cpu(runs)
    print_speedups(runs)
    print_projection(runs, no_op_model, stand_in)
