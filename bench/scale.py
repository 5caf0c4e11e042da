"""How every stage scales with the size of the dump and the number of workers (issue 19's benchmark).

Builds synthetic multistream dumps from the real gensim sample (``bench/synthetic.py``: --sizes copies of its 206
pages, 6.1 MB of XML each, with the multistream index; cached in --work), then for each size and worker count runs
the stages in order, each as a child process (``python run_pipeline.py STAGE … --runner=DirectRunner``, Beam's
multi_processing mode for more than 1 worker), and measures the child's whole process tree (Beam's worker
subprocesses included, ``bench/memory.py``): wall time, CPU seconds, peak summed RSS, and items/s from the
stage's record in OUT/manifest.json. Then prints the tables: the runs; the slopes of peak RSS and of wall time over
MB of XML; the 2-worker speed-up; a projection for English Wikipedia on one 16-core 128 GB machine
(``bench/scale_report.py``).

``--no-op-model`` puts ``bench/no_op_model`` first on the children's PYTHONPATH: its ``sitecustomize`` replaces
the model forward of embed-entities and index in every interpreter of the run (the worker subprocesses too) by
equal unit vectors of the right size, so those stages measure what the host side can feed.

    python -m bench.scale --sizes 10 20 40 --workers 1 2 --no-op-model [--work DIR] [--json FILE]
    python -m bench.scale --sizes 2 4 --stages parse dictionary --workers 1      # a quick check, a few minutes
    python -m bench.scale --report a.json b.json     # the tables of several saved runs together (speed-ups)

--sizes 10 20 40 --workers 1 --no-op-model took an hour on 2 shared CPU cores (load 8-15; 20 minutes of CPU;
embed-entities and parse dominate); each further worker count about as long again. Memory figures do not depend
on the machine's load; wall times and speed-ups do (the CPU seconds beside them help to tell).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.memory import run_measured
from bench.paths import GENSIM, REPO, minilm_path
from bench.scale_report import StageRun, describe, print_report, summary
from bench.synthetic import ENTITY_MODES, SyntheticDump, synthetic_dump

STAGES = ("parse", "dictionary", "mentions", "embed-entities", "index")
NO_OP_MODEL = REPO / "bench" / "no_op_model"
MARKERS = "KPR_NO_OP_MODEL_MARKERS"  # read by bench/no_op_model/sitecustomize.py
MODEL_STAGES = ("embed-entities", "index")
_LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class Settings:
    """What every stage run of one benchmark shares."""

    work: Path
    max_mentions: int
    max_seq_length: int
    model: str
    device: str
    no_op_model: bool
    timeout_s: float | None


def stage_flags(stage: str, dump: SyntheticDump, settings: Settings) -> list[str]:
    """The stage's own options, as the benchmark runs it."""
    if stage == "parse":
        return ["--dump", str(dump.dump), "--dump-index", str(dump.index)]
    if stage == "dictionary":
        return ["--include-red-links"]
    if stage == "mentions":
        return ["--max-mentions", str(settings.max_mentions), "--max-seq-length", str(settings.max_seq_length)]
    if stage == "embed-entities":
        return ["--model", settings.model, "--max-seq-length", str(settings.max_seq_length), "--device",
                settings.device]
    return ["--encoder", settings.model, "--encoder-type", "mean", "--max-length", "128", "--index-factory", "Flat",
            "--device", settings.device]


def beam_flags(workers: int) -> list[str]:
    """DirectRunner, in ``workers`` worker processes when more than one."""
    many = ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"] if workers > 1 else []
    return ["--runner=DirectRunner", *many]


def child_env(settings: Settings, markers: Path) -> dict[str, str]:
    """The children's environment: offline models, and the no-op model first on PYTHONPATH when asked for."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if settings.no_op_model:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NO_OP_MODEL), env.get("PYTHONPATH")]))
        env[MARKERS] = str(markers)
    return env


def output_rows(record, artifact: str) -> int:
    """Rows of ``artifact``'s Parquet files as the stage record lists them."""
    return sum(item.rows or 0 for item in record.outputs if item.path.startswith(artifact + "/")
               and item.path.endswith(".parquet"))


def counted(record, counter: str, artifact: str) -> float:
    """A stage counter, or the rows of ``artifact`` when the stage no longer counts it."""
    value = record.counters.get(counter)
    return float(value if value is not None else output_rows(record, artifact))


def stage_items(stage: str, output: Path, dump: SyntheticDump) -> tuple[dict[str, float], dict[str, float]]:
    """(items the stage's rate is counted in, other measured figures) from OUT/manifest.json."""
    from artifacts.run import manifest

    records = manifest.load(str(output))
    parse = records["parse"]
    articles = counted(parse, "articles", "articles")
    if stage == "parse":
        return {"pages": counted(parse, "pages_read", "articles"), "XML MB": dump.xml_bytes / 1e6}, {}
    if stage == "dictionary":
        return {"articles": articles}, {"entities": float(output_rows(records["dictionary"], "entities"))}
    if stage == "mentions":
        mentions = records["mentions"]
        sampled = counted(mentions, "mentions_sampled", "mentions")
        with_mentions = mentions.counters.get("entities_with_mentions") or output_rows(records["dictionary"],
                                                                                       "entities")
        return ({"articles": articles, "links": float(parse.counters.get("links", 0))},
                {"mentions": sampled, "mentions_per_entity": sampled / max(with_mentions, 1)})
    if stage == "embed-entities":
        return {"mentions": counted(records["embed_entities"], "mentions_embedded", "mentions")}, {}
    passages = counted(records["index"], "passages_encoded", "passages")
    dim = json.loads((output / "index" / "index.json").read_text())["dim"]
    return {"passages": passages}, {"vector_mb": passages * dim * 4 / 1e6}


def log_tail(log: Path) -> str:
    """The last lines of a child's log."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])


def run_stage(stage: str, dump: SyntheticDump, workers: int, output: Path, settings: Settings,
              measured: bool) -> StageRun:
    """One stage as a child process under the tree sampler (``measured``: with --force; otherwise resumed, only
    to provide what a measured stage reads)."""
    name = f"x{dump.copies}-{dump.entities}-w{workers}-{stage}"
    log, markers = settings.work / "logs" / f"{name}.log", settings.work / "markers" / name
    log.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(markers, ignore_errors=True)
    markers.mkdir(parents=True)
    command = [sys.executable, str(REPO / "run_pipeline.py"), stage, "--output", str(output),
               *stage_flags(stage, dump, settings), *(["--force"] if measured else []), *beam_flags(workers)]
    result = run_measured(command, log, child_env(settings, markers), REPO, timeout_s=settings.timeout_s)
    run = StageRun(stage, dump.copies, dump.xml_bytes, workers, result.returncode == 0, result.wall_s,
                   result.cpu_s, result.peak_rss_bytes, result.processes, log=str(log),
                   max_process_rss_bytes=result.max_process_rss_bytes)
    if settings.no_op_model and stage in MODEL_STAGES:
        run.no_op_processes = len({marker.name.split("-")[0] for marker in markers.iterdir()})
    if run.ok:
        try:
            run.items, run.facts = stage_items(stage, output, dump)
        except KeyError as missing:  # a stage record or counter the rewritten stages no longer write
            print(f"  {stage}: no item counts in {output}/manifest.json ({missing!r} missing)", flush=True)
    return run


def run_size(dump: SyntheticDump, workers: int, stages: Sequence[str], settings: Settings) -> list[StageRun]:
    """The chosen stages (and any earlier stage they need, unmeasured) on one dump with one worker count; stops
    at the first failure."""
    output = settings.work / "out" / f"x{dump.copies}-{dump.entities}-w{workers}"
    last = max(STAGES.index(stage) for stage in stages)
    runs = []
    for stage in STAGES[:last + 1]:
        run = run_stage(stage, dump, workers, output, settings, measured=stage in stages)
        if stage in stages:
            runs.append(run)
            print(describe(run), flush=True)
        if not run.ok:
            print(f"  {stage} failed (log {run.log}); later stages of x{dump.copies} workers={workers} skipped:\n"
                  + log_tail(Path(run.log)), flush=True)
            break
    return runs


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 20, 40], help="copies of the sample's pages")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Beam worker processes")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--entities", choices=ENTITY_MODES, default="keep",
                        help="keep: copies link where the sample does; grow: copy c links to copy c's pages")
    parser.add_argument("--work", type=Path, help="cache of dumps, outputs and logs (default: a temporary directory)")
    parser.add_argument("--max-mentions", type=int, default=16)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--model", help="[MASK] model and passage encoder (default: the packaged MiniLM)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--no-op-model", action="store_true", help="model forward replaced by equal unit vectors")
    parser.add_argument("--stage-timeout", type=float, help="seconds before a stage run is killed (default: none)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: print the tables of the runs saved in these --json files together")
    return parser.parse_args(argv)


def benchmark(args: argparse.Namespace, work: Path) -> list[StageRun]:
    """Every chosen stage on every size and worker count, in the order given; dumps built or reused in ``work``."""
    settings = Settings(work, args.max_mentions, args.max_seq_length, args.model or minilm_path(), args.device,
                        args.no_op_model, args.stage_timeout)
    stages = [stage for stage in STAGES if stage in args.stages]
    runs: list[StageRun] = []
    for copies in args.sizes:
        dump = synthetic_dump(GENSIM, copies, args.entities, work / "dumps" / f"x{copies}-{args.entities}")
        print(f"dump x{copies} ({args.entities}): {dump.pages:,} pages, {dump.xml_bytes / 1e6:.0f} MB XML, "
              f"{dump.dump.stat().st_size / 1e6:.0f} MB bz2", flush=True)
        for workers in args.workers:
            runs += run_size(dump, workers, stages, settings)
            if args.json:
                save(args, runs)
    return runs


def save(args: argparse.Namespace, runs: list[StageRun]) -> None:
    """All figures as JSON (rewritten after each size, so an interrupted run keeps what it measured)."""
    settings = {name: str(value) if isinstance(value, Path) else value for name, value in vars(args).items()}
    document = {"settings": settings, "runs": [asdict(run) for run in runs], **summary(runs, args.max_mentions)}
    args.json.write_text(json.dumps(document, indent=1))


def saved_runs(paths: Sequence[Path]) -> tuple[list[StageRun], dict]:
    """The runs of several --json files, and the settings of the first."""
    documents = [json.loads(path.read_text()) for path in paths]
    return [StageRun(**run) for document in documents for run in document["runs"]], documents[0]["settings"]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # `kill PID` stops the stage being measured too (its process group is killed on the way out)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.report:
        runs, settings = saved_runs(args.report)
        print_report(runs, settings["max_mentions"], settings["no_op_model"])
        return
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
          f"no-op model: {'on' if args.no_op_model else 'off'}; entities: {args.entities}", flush=True)
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
        runs = benchmark(args, args.work.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="kpr-scale-") as work:
            runs = benchmark(args, Path(work))
    print(f"load average {os.getloadavg()[0]:.1f} at the end\n")
    print_report(runs, args.max_mentions, args.no_op_model)
    if args.json:
        save(args, runs)


if __name__ == "__main__":
    main()
