"""The figures of ``bench/scale.py``: its measured stage runs, fits over the input size, the speed-up with more
workers and a projection for English Wikipedia on one 16-core 128 GB machine, as plain-text tables and JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# English Wikipedia and the DPR corpus (DESIGN.md, issue 19): the projection's assumed inputs.
ENWIKI = {"xml_mb": 95_000.0, "articles": 6.7e6, "links": 150e6, "entities": 7e6, "passages": 21e6}
MACHINE_WORKERS, MACHINE_MEMORY_GB = 16, 128
DPR_DIM = 768  # the index projection: DPR's passage vectors
# stage -> (the item its projected hours count, the enwiki figure of that item, or None: derived)
PROJECTED_ITEMS = {
    "parse": ("XML MB", ENWIKI["xml_mb"]),
    "dictionary": ("articles", ENWIKI["articles"]),
    "mentions": ("articles", ENWIKI["articles"]),
    "embed-entities": ("mentions", None),  # entities x measured mentions per entity
    "index": ("passages", ENWIKI["passages"]),
}


@dataclass
class StageRun:
    """One stage run on one dump with one worker count, as measured."""

    stage: str
    copies: int
    xml_bytes: int
    workers: int
    ok: bool
    wall_s: float
    cpu_s: float
    peak_rss_bytes: int
    processes: int
    items: dict[str, float] = field(default_factory=dict)  # rate figures: name -> count (the first is the main one)
    facts: dict[str, float] = field(default_factory=dict)  # other measured inputs of the projection
    no_op_processes: int | None = None  # processes where the no-op forward was installed
    log: str = ""
    max_process_rss_bytes: int = 0  # peak RSS of the largest single process, VmHWM (0: not measured)

    @property
    def xml_mb(self) -> float:
        return self.xml_bytes / 1e6

    @property
    def peak_rss_mb(self) -> float:
        return self.peak_rss_bytes / 1e6

    def rates(self) -> str:
        return ", ".join(f"{count / self.wall_s:,.1f} {name}/s" for name, count in self.items.items())


def describe(run: StageRun) -> str:
    """One line per run (the benchmark's progress)."""
    no_op = "" if run.no_op_processes is None else f", no-op model in {run.no_op_processes} process(es)"
    state = "ok" if run.ok else "FAILED"
    return (f"{run.stage:<15} x{run.copies:<3} {run.xml_mb:6.0f} MB XML  workers={run.workers}  {state}  "
            f"{run.wall_s:7.1f} s wall  {run.cpu_s:7.1f} s CPU  {run.peak_rss_mb:7.0f} MB peak tree RSS  "
            f"{run.rates()}{no_op}")


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through the points."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return slope, mean_y - slope * mean_x


def stage_order(stage: str, *rest: int) -> tuple[int, ...]:
    """Sort key: the stages in pipeline order, then the numbers given (size, workers)."""
    return (list(PROJECTED_ITEMS).index(stage), *rest)


def groups(runs: Sequence[StageRun]) -> dict[tuple[str, int], list[StageRun]]:
    """The successful runs by (stage, workers), smallest dump first."""
    grouped: dict[tuple[str, int], list[StageRun]] = {}
    for run in sorted(runs, key=lambda run: run.xml_bytes):
        if run.ok:
            grouped.setdefault((run.stage, run.workers), []).append(run)
    return grouped


def fits(runs: Sequence[StageRun]) -> list[dict[str, Any]]:
    """Per stage and worker count with two sizes or more: peak RSS MB and wall s against MB of XML."""
    found = []
    for (stage, workers), measured in sorted(groups(runs).items(), key=lambda item: stage_order(*item[0])):
        if len({run.xml_bytes for run in measured}) < 2:
            continue
        xs = [run.xml_mb for run in measured]
        rss_slope, rss_intercept = fit_line(xs, [run.peak_rss_mb for run in measured])
        wall_slope, wall_intercept = fit_line(xs, [run.wall_s for run in measured])
        found.append({"stage": stage, "workers": workers, "sizes": [run.copies for run in measured],
                      "rss_mb_per_xml_mb": rss_slope, "rss_intercept_mb": rss_intercept,
                      "wall_s_per_xml_mb": wall_slope, "wall_intercept_s": wall_intercept,
                      **vector_fit(measured)})
    return found


def vector_fit(measured: Sequence[StageRun]) -> dict[str, float]:
    """The index's peak RSS against the MB of vectors it built (one shard at these sizes): its growth per vector
    MB and the RSS at none; empty for other stages."""
    if not all("vector_mb" in run.facts for run in measured):
        return {}
    slope, intercept = fit_line([run.facts["vector_mb"] for run in measured], [run.peak_rss_mb for run in measured])
    return {"rss_mb_per_vector_mb": slope, "rss_intercept_vector_mb": intercept}


def index_memory_mb(fit: dict[str, Any]) -> tuple[float, str]:
    """Peak RSS of the index stage for DPR's passages: building one shard (its vectors chosen within the default
    --shard-memory-gb) or training on the largest sample, whichever holds more vectors, from the vector fit."""
    from artifacts.faiss import choice

    count = int(ENWIKI["passages"])
    shards = choice.shards_for_memory(count, DPR_DIM, int(choice.DEFAULT_SHARD_MEMORY_GB * choice.GB))
    shard_mb = choice.vector_bytes(count, DPR_DIM) / shards / 1e6
    sample_mb = choice.vector_bytes(choice.MAX_TRAIN_SAMPLE, DPR_DIM) / 1e6
    held = max(shard_mb, sample_mb)
    why = (f"index: RSS at no vectors + RSS per vector MB x {held:,.0f} MB (the larger of one shard: "
           f"{count / 1e6:.0f}M x {DPR_DIM} in {shards} shards within --shard-memory-gb "
           f"{choice.DEFAULT_SHARD_MEMORY_GB:g} = {shard_mb:,.0f} MB, and the training sample: "
           f"{choice.MAX_TRAIN_SAMPLE / 1e6:.0f}M vectors = {sample_mb:,.0f} MB)")
    return fit["rss_intercept_vector_mb"] + fit["rss_mb_per_vector_mb"] * held, why


def speedups(runs: Sequence[StageRun]) -> list[dict[str, Any]]:
    """Wall time with the fewest workers over wall time with each larger count, per stage and size; and CPU
    seconds with more workers over CPU seconds with the fewest (the work more workers add, whatever the load)."""
    by_key = {(run.stage, run.copies, run.workers): run for run in runs if run.ok}
    found = []
    for (stage, copies, workers), run in sorted(by_key.items(), key=lambda item: stage_order(*item[0])):
        fewest = min(count for (other, size, count) in by_key if (other, size) == (stage, copies))
        if workers > fewest:
            base = by_key[(stage, copies, fewest)]
            found.append({"stage": stage, "copies": copies, "workers": workers, "base_workers": fewest,
                          "speedup": base.wall_s / run.wall_s, "cpu_ratio": run.cpu_s / base.cpu_s})
    return found


def mentions_per_entity(runs: Sequence[StageRun], max_mentions: int) -> tuple[float, str]:
    """Sampled mentions per entity at the largest measured size, capped; the cap itself if not measured."""
    measured = [run for run in runs if run.ok and "mentions_per_entity" in run.facts]
    if not measured:
        return float(max_mentions), f"assumed: the cap, {max_mentions} (the mentions stage was not measured)"
    largest = max(measured, key=lambda run: (run.xml_bytes, -run.workers))
    value = min(largest.facts["mentions_per_entity"], max_mentions)
    return value, (f"{value:.2f} (at x{largest.copies}, cap {max_mentions}) x {ENWIKI['entities'] / 1e6:.0f}M "
                   f"entities = {value * ENWIKI['entities'] / 1e6:.1f}M mentions to embed")


def projected(measured: Sequence[StageRun], per_entity: float, fit: dict[str, Any] | None) -> dict[str, Any] | None:
    """One stage's projection from its runs with one worker count (smallest dump first) and their memory fit."""
    largest = measured[-1]
    unit, total = PROJECTED_ITEMS[largest.stage]
    if unit not in largest.items:
        return None
    total = total if total is not None else ENWIKI["entities"] * per_entity
    rate = largest.items[unit] / largest.wall_s / largest.workers
    rate_per_cpu_s = largest.items[unit] / largest.cpu_s
    memory = None
    if fit:
        fitted = index_memory_mb(fit)[0] if "rss_mb_per_vector_mb" in fit else (
            fit["rss_intercept_mb"] + fit["rss_mb_per_xml_mb"] * ENWIKI["xml_mb"])
        memory = max(fitted, max(run.peak_rss_mb for run in measured)) / 1e3  # a flat fit: what was measured
    return {"stage": largest.stage, "unit": unit, "items": total, "rate_per_worker": rate,
            "rate_measured_at": f"x{largest.copies}, {largest.workers} worker(s)",
            "hours": total / (rate * MACHINE_WORKERS) / 3600, "rate_per_cpu_s": rate_per_cpu_s,
            "hours_cpu_bound": total / (rate_per_cpu_s * MACHINE_WORKERS) / 3600, "peak_memory_gb": memory,
            "memory_workers": largest.workers}


def projection(runs: Sequence[StageRun], max_mentions: int) -> list[dict[str, Any]]:
    """Per stage, from its runs with the fewest workers: hours on MACHINE_WORKERS workers from the per-worker rate
    at the largest size, and peak memory = intercept + slope x enwiki's XML MB from their fit."""
    per_entity, _source = mentions_per_entity(runs, max_mentions)
    fitted = {(fit["stage"], fit["workers"]): fit for fit in fits(runs)}
    rows: dict[str, dict[str, Any]] = {}
    for (stage, workers), measured in sorted(groups(runs).items(), key=lambda item: item[0][1]):
        row = None if stage in rows else projected(measured, per_entity, fitted.get((stage, workers)))
        if row is not None:
            rows[stage] = row
    return sorted(rows.values(), key=lambda row: stage_order(row["stage"]))


def summary(runs: Sequence[StageRun], max_mentions: int) -> dict[str, Any]:
    """Every derived figure (the JSON beside the runs)."""
    return {"fits": fits(runs), "speedups": speedups(runs), "projection": projection(runs, max_mentions),
            "assumed": {**ENWIKI, "workers": MACHINE_WORKERS, "memory_gb": MACHINE_MEMORY_GB},
            "mentions_per_entity": mentions_per_entity(runs, max_mentions)[1]}


def print_runs(runs: Sequence[StageRun]) -> None:
    print("Stage runs (peak RSS: the child and all its Beam worker processes, summed, sampled every 0.1 s; "
          "largest process: its VmHWM)")
    print(f"{'stage':<15} {'size':>5} {'XML MB':>7} {'workers':>7} {'wall s':>8} {'CPU s':>8} {'peak RSS MB':>11}"
          f" {'largest process MB':>18}  items/s")
    for run in sorted(runs, key=lambda run: stage_order(run.stage, run.copies, run.workers)):
        rates = run.rates() if run.ok else f"FAILED (log {run.log})"
        largest = f"{run.max_process_rss_bytes / 1e6:.0f}" if run.max_process_rss_bytes else "-"
        print(f"{run.stage:<15} {'x' + str(run.copies):>5} {run.xml_mb:7.0f} {run.workers:7d} {run.wall_s:8.1f} "
              f"{run.cpu_s:8.1f} {run.peak_rss_mb:11.0f} {largest:>18}  {rates}")


def print_fits(runs: Sequence[StageRun]) -> None:
    print("\nGrowth with the dump (least squares over the sizes)")
    print(f"{'stage':<15} {'workers':>7} {'sizes':<14} {'RSS MB per XML MB':>17} {'RSS at 0 MB':>11} "
          f"{'wall s per XML MB':>17}")
    for fit in fits(runs):
        sizes = " ".join(f"x{size}" for size in fit["sizes"])
        vectors = (f"  ({fit['rss_mb_per_vector_mb']:.2f} RSS MB per MB of vectors built)"
                   if "rss_mb_per_vector_mb" in fit else "")
        print(f"{fit['stage']:<15} {fit['workers']:7d} {sizes:<14} {fit['rss_mb_per_xml_mb']:17.2f} "
              f"{fit['rss_intercept_mb']:11.0f} {fit['wall_s_per_xml_mb']:17.2f}{vectors}")


def print_speedups(runs: Sequence[StageRun]) -> None:
    found = speedups(runs)
    if not found:
        return
    print("\nSpeed-up with more workers (wall time of the fewest workers / wall time; CPU s: with more workers / "
          "with the fewest)")
    print(f"{'stage':<15} {'size':>5} {'workers':>7} {'speed-up':>8} {'CPU s':>6}")
    for item in found:
        print(f"{item['stage']:<15} {'x' + str(item['copies']):>5} {item['base_workers']:>3} -> {item['workers']:<2}"
              f" {item['speedup']:7.2f}x {item['cpu_ratio']:5.2f}x")


def print_projection(runs: Sequence[StageRun], max_mentions: int, no_op_model: bool) -> None:
    rows = projection(runs, max_mentions)
    if not rows:
        return
    print(f"\nProjection: English Wikipedia on one {MACHINE_WORKERS}-core {MACHINE_MEMORY_GB} GB machine")
    print(f"  assumed:  {ENWIKI['xml_mb']:,.0f} MB of XML, {ENWIKI['articles'] / 1e6:.1f}M articles, "
          f"{ENWIKI['links'] / 1e6:.0f}M links, {ENWIKI['entities'] / 1e6:.0f}M entities, "
          f"{ENWIKI['passages'] / 1e6:.0f}M passages;")
    print(f"            {MACHINE_WORKERS} workers, each as fast as one measured worker (linear scaling: compare the "
          "speed-ups above)")
    print("  measured: rates per worker at the largest size; the memory fits above (fewest workers);")
    print(f"            mentions per entity: {mentions_per_entity(runs, max_mentions)[1]}")
    print(f"  hours = items / (rate per worker x {MACHINE_WORKERS}); CPU-bound hours: the same from items per CPU "
          "second of the tree")
    print("            (each worker with a core to itself; on a shared machine the wall-clock rate is lower)")
    print(f"  peak memory = RSS at 0 MB + RSS MB per XML MB x {ENWIKI['xml_mb']:,.0f}, at least the largest measured")
    vector_fits = [fit for fit in fits(runs) if "rss_mb_per_vector_mb" in fit]
    if vector_fits:
        print(f"            {index_memory_mb(vector_fits[0])[1]}")
    if no_op_model:
        print("  embed-entities and index: host side only (--no-op-model: no model forward counted)")
    else:
        print("  embed-entities and index: with the model's forward on this machine's device")
    print(f"{'stage':<15} {'items':>14} {'rate per worker':>26}  {'measured at':<17} {'hours':>7} "
          f"{'CPU-bound':>9}  peak memory")
    for row in rows:
        memory = "n/a (one size)" if row["peak_memory_gb"] is None else f"{row['peak_memory_gb']:,.1f} GB"
        if row["peak_memory_gb"] is not None and row["peak_memory_gb"] > MACHINE_MEMORY_GB:
            memory += " (does not fit)"
        rate = f"{row['rate_per_worker']:,.1f} {row['unit']}/s"
        print(f"{row['stage']:<15} {row['items']:14,.0f} {rate:>26}  {row['rate_measured_at']:<17} "
              f"{row['hours']:7.2f} {row['hours_cpu_bound']:9.2f}  {memory}")


def print_report(runs: Sequence[StageRun], max_mentions: int, no_op_model: bool) -> None:
    """Every table: the runs, the growth fits, the speed-ups, the projection."""
    print_runs(runs)
    print_fits(runs)
    print_speedups(runs)
    print_projection(runs, max_mentions, no_op_model)
