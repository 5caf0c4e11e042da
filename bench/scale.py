"""How every stage scales with English Wikipedia's shape and with the number of workers (issue 26's benchmark).

Builds enwiki-shaped synthetic multistream dumps (``bench/synthetic.py``: titles, redirects, links, entities,
anchor names and sampled mentions all grow with the articles as in English Wikipedia; cached in --work), then for
each size and worker count runs the stages in order, each as a child process (``python run_pipeline.py STAGE …
--runner=DirectRunner``, Beam's multi_processing mode for more than 1 worker), and measures the child's whole
process tree (Beam's worker subprocesses included, ``bench/memory.py``): wall time, CPU seconds, peak summed RSS and
the peak of the largest single process. With the outputs each stage wrote (titles, names, entities, sampled
mentions, passages, from OUT/manifest.json) it prints: the runs; memory per output unit; CPU per article; the
speed-up with more workers; a projection for English Wikipedia on one 16-core 128 GB machine
(``bench/scale_report.py``).

``--no-op-model`` puts ``bench/no_op_model`` first on the children's PYTHONPATH: its ``sitecustomize`` replaces
the model forward of embed-entities and index in every interpreter of the run (the worker subprocesses too) by
unit vectors of the right size (from the input's ids, at no cost), so those stages measure what the host side can
feed. ``--stand-in RATE``
also paces that forward as ONE GPU of RATE padded tokens a second shared by every process of the stage (an H200's
ceilings: 4,326 mentions a second at 512 tokens = 2,214,912; 18,498 at 128 = 2,367,744; 15,560 DPR passages of
141 tokens = 2,193,960), waiting without CPU; ``--cores N`` runs each stage on the first N cores (taskset). The
stage ``index-kpr`` is the index with ``--encoder-type kpr``: a KPR checkpoint of the model (random fusion weights,
made once in --work) that links the passages with the run's dictionary and injects its entity embeddings.

    python -m bench.scale --articles 2500 10000 40000 160000 --workers 1 --no-op-model --work DIR --json FILE
    python -m bench.scale --articles 40000 --workers 1 2 --no-op-model --work DIR --json FILE2
    python -m bench.scale --articles 2000 8000 --stages parse dictionary mentions      # a quick check
    python -m bench.scale --report FILE FILE2     # the tables of several saved runs together

On a GPU server, the GPU stages with a real BERT-base forward and more worker processes on the one GPU (each loads
its own model):

    python -m bench.scale --articles 10000 --workers 1 4 8 16 --stages embed-entities index \
        --model random-bert-base --device cuda --dtype bfloat16 --batch-tokens 65536 --work DIR --json FILE

Memory figures do not depend on the machine's load; wall times and speed-ups do (the CPU seconds beside them help
to tell).
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

from bench.common import RANDOM_BERT_BASE, chosen_model, forget_kept_work
from bench.memory import run_measured
from bench.paths import REPO, minilm_path
from bench.scale_report import StageRun, describe, print_report, summary
from bench.synthetic import Shape, SyntheticDump, synthetic_dump

STAGES = ("parse", "dictionary", "mentions", "embed-entities", "index", "index-kpr")
# What each stage reads, as the benchmark runs it (the index cuts its passages from parse's articles and encodes
# them with a mean-pooling encoder; index-kpr is the index with a KPR encoder, which links them with the run's
# dictionary and injects its entity embeddings): a measured stage is run after these, unmeasured.
NEEDS = {"parse": (), "dictionary": ("parse",), "mentions": ("parse", "dictionary"),
         "embed-entities": ("parse", "dictionary", "mentions"), "index": ("parse",),
         "index-kpr": ("parse", "dictionary", "mentions", "embed-entities")}
NO_OP_MODEL = REPO / "bench" / "no_op_model"
MARKERS = "KPR_NO_OP_MODEL_MARKERS"  # read by bench/no_op_model/sitecustomize.py
STAND_IN = "KPR_STAND_IN"  # the same: TOKENS_PER_SECOND:CLOCK_FILE
MODEL_STAGES = ("embed-entities", "index", "index-kpr")
_LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class Settings:
    """What every stage run of one benchmark shares."""

    work: Path
    max_mentions: int
    max_seq_length: int
    model: str
    device: str
    runtime: tuple[str, ...]  # the GPU stages' --dtype, --batch-tokens and --progress-interval
    no_op_model: bool
    timeout_s: float | None
    stand_in: float | None  # padded tokens a second of the one stand-in GPU (no-op model only)
    cores: int | None  # the stages run on this many cores
    model_workers: int | None  # the GPU stages' --model-workers
    checkout: Path  # the code measured: this repository, or another checkout of it (an older commit)


def command(stage: str) -> str:
    """The pipeline command a benchmark stage runs."""
    return "index" if stage == "index-kpr" else stage


def kpr_encoder(settings: Settings, output: Path) -> str:
    """A KPR checkpoint of the benchmark's model (random fusion weights) sized for ``output``'s entity embeddings,
    made once in the work directory."""
    from bench.kpr import kpr_checkpoint

    checkpoint = settings.work / "kpr-checkpoints" / Path(settings.model).name
    if not (checkpoint / "config.json").exists():
        kpr_checkpoint(settings.model, str(output), str(checkpoint))
    return str(checkpoint)


def stage_flags(stage: str, dump: SyntheticDump, settings: Settings, output: Path) -> list[str]:
    """The stage's own options, as the benchmark runs it."""
    if stage == "parse":
        return ["--dump", str(dump.dump), "--dump-index", str(dump.index)]
    if stage == "dictionary":
        return []
    if stage == "mentions":
        return ["--max-mentions", str(settings.max_mentions), "--max-seq-length", str(settings.max_seq_length)]
    one_gpu = ["--model-workers", str(settings.model_workers)] if settings.model_workers else []
    if stage == "embed-entities":
        return ["--model", settings.model, "--max-seq-length", str(settings.max_seq_length), "--device",
                settings.device, *settings.runtime, *one_gpu]
    encoder = ["--encoder", settings.model, "--encoder-type", "mean"] if stage == "index" else \
        ["--encoder", kpr_encoder(settings, output), "--encoder-type", "kpr"]
    return [*encoder, "--max-length", "128", "--index-factory", "Flat", "--device", settings.device,
            *settings.runtime, *one_gpu]


def beam_flags(workers: int) -> list[str]:
    """DirectRunner, in ``workers`` worker processes when more than one."""
    many = ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"] if workers > 1 else []
    return ["--runner=DirectRunner", *many]


def child_env(settings: Settings, markers: Path) -> dict[str, str]:
    """The children's environment: offline models, and the no-op model first on PYTHONPATH when asked for (paced
    as one GPU with a stand-in rate: its clock file beside the markers)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if settings.no_op_model:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NO_OP_MODEL), env.get("PYTHONPATH")]))
        env[MARKERS] = str(markers)
    if settings.stand_in:
        env[STAND_IN] = f"{settings.stand_in}:{markers.parent / (markers.name + '.gpu-clock')}"
    return env


def on_cores(command: list[str], cores: int | None) -> list[str]:
    """``command`` restricted to the first ``cores`` cores (all when None)."""
    return ["taskset", "-c", f"0-{cores - 1}", *command] if cores else command


def output_rows(record, artifact: str) -> int:
    """Rows of ``artifact``'s Parquet files as the stage record lists them."""
    return sum(item.rows or 0 for item in record.outputs if item.path.startswith(artifact + "/")
               and item.path.endswith(".parquet"))


def stage_outputs(stage: str, output: Path, dump: SyntheticDump) -> dict[str, float]:
    """What the dump holds and the stage wrote, by unit (the first after articles: what its memory is fitted
    against), from OUT/manifest.json."""
    from artifacts.run import manifest

    records = manifest.load(str(output))
    found = {"articles": float(dump.articles)}
    if stage == "parse":
        parse = records["parse"]
        return {**found, "titles": float(output_rows(parse, "articles") + output_rows(parse, "redirects")),
                "links": float(parse.counters.get("links", 0))}
    if command(stage) == "index":
        passages = float(output_rows(records["index"], "passages"))
        dim = json.loads((output / "index" / "index.json").read_text())["dim"]
        return {**found, "vector MB": passages * dim * 4 / 1e6, "passages": passages}
    entities = float(output_rows(records["dictionary"], "entities"))
    if stage == "dictionary":
        return {**found, "names": float(output_rows(records["dictionary"], "dictionary/names")), "entities": entities}
    if stage == "mentions":
        return {**found, "mentions": float(output_rows(records["mentions"], "mentions")), "entities": entities}
    return {**found, "mentions": float(records["embed_entities"].counters.get("mentions_embedded", 0)),
            "entities": entities}


def log_tail(log: Path) -> str:
    """The last lines of a child's log."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-_LOG_TAIL_LINES:])


def run_stage(stage: str, dump: SyntheticDump, workers: int, output: Path, settings: Settings,
              measured: bool) -> StageRun:
    """One stage as a child process under the tree sampler (``measured``: with --force; otherwise resumed, only
    to provide what a measured stage reads)."""
    name = f"{settings.checkout.name}-a{dump.articles}-w{workers}-{stage}"
    log, markers = settings.work / "logs" / f"{name}.log", settings.work / "markers" / name
    log.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(markers, ignore_errors=True)
    markers.mkdir(parents=True)
    if measured:
        forget_kept_work(output, command(stage))
    line = [sys.executable, str(settings.checkout / "run_pipeline.py"), command(stage), "--output", str(output),
            *stage_flags(stage, dump, settings, output), *(["--force"] if measured else []), *beam_flags(workers)]
    result = run_measured(on_cores(line, settings.cores), log, child_env(settings, markers), settings.checkout,
                          timeout_s=settings.timeout_s)
    run = StageRun(stage, dump.articles, dump.xml_bytes, workers, result.returncode == 0, result.wall_s,
                   result.cpu_s, result.peak_rss_bytes, result.processes, result.max_process_rss_bytes, log=str(log))
    if settings.no_op_model and stage in MODEL_STAGES:
        run.no_op_processes = len({marker.name.split("-")[0] for marker in markers.iterdir()})
    if run.ok:
        run.outputs = stage_outputs(stage, output, dump)
    return run


def run_size(dump: SyntheticDump, workers: int, stages: Sequence[str], settings: Settings) -> list[StageRun]:
    """The chosen stages (and the earlier stages they read, unmeasured) on one dump with one worker count; stops
    at the first failure."""
    output = settings.work / "out" / settings.checkout.name / f"a{dump.articles}-w{workers}"
    needed = {stage for chosen in stages for stage in (chosen, *NEEDS[chosen])}
    runs = []
    for stage in (stage for stage in STAGES if stage in needed):
        run = run_stage(stage, dump, workers, output, settings, measured=stage in stages)
        if stage in stages:
            runs.append(run)
            print(describe(run), flush=True)
        if not run.ok:
            print(f"  {stage} failed (log {run.log}); later stages of {dump.articles} articles, {workers} workers "
                  "skipped:\n"
                  + log_tail(Path(run.log)), flush=True)
            break
    return runs


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--articles", type=int, nargs="+", default=[2_500, 10_000, 40_000],
                        help="sizes of the synthetic dumps, in articles")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic dumps")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Beam worker processes")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--work", type=Path, help="cache of dumps, outputs and logs (default: a temporary directory)")
    parser.add_argument("--max-mentions", type=int, default=128)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--model", help=f"[MASK] model and passage encoder: 'minilm' (the packaged MiniLM, the "
                                        f"default), '{RANDOM_BERT_BASE}' (built in --work) or a path")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", help="the GPU stages' weights and compute")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="the GPU stages' padded tokens per forward")
    parser.add_argument("--no-op-model", action="store_true", help="model forward replaced by cheap unit vectors")
    parser.add_argument("--stand-in", type=float, metavar="TOKENS_PER_S",
                        help="the no-op forward paced as one GPU of this many padded tokens a second")
    parser.add_argument("--cores", type=int, help="run each stage on the first N cores (default: all)")
    parser.add_argument("--model-workers", type=int,
                        help="the GPU stages' --model-workers (default: the stage's own; 1 with --stand-in, which "
                             "stands in for one GPU: one process holds it)")
    parser.add_argument("--stage-timeout", type=float, help="seconds before a stage run is killed (default: none)")
    parser.add_argument("--checkout", type=Path, default=REPO,
                        help="measure the code of this checkout (e.g. a git worktree of an older commit)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: print the tables of the runs saved in these --json files together")
    args = parser.parse_args(argv)
    args.no_op_model = args.no_op_model or bool(args.stand_in)  # a stand-in GPU paces the no-op model
    return args


def benchmark(args: argparse.Namespace, work: Path) -> list[StageRun]:
    """Every chosen stage on every size and worker count, in the order given; dumps built or reused in ``work``."""
    model = chosen_model(args.model, str(work)) if args.model else minilm_path()
    # progress lines every 5 s: each worker's steady rate, in the stage's log
    runtime = ("--dtype", args.dtype, "--batch-tokens", str(args.batch_tokens), "--progress-interval", "5")
    settings = Settings(work, args.max_mentions, args.max_seq_length, model, args.device, runtime,
                        args.no_op_model, args.stage_timeout, args.stand_in, args.cores,
                        args.model_workers or (1 if args.stand_in else None), args.checkout.resolve())
    stages = [stage for stage in STAGES if stage in args.stages]
    runs: list[StageRun] = []
    for articles in args.articles:
        dump = synthetic_dump(Shape(articles, args.seed), work / "dumps" / f"a{articles}-s{args.seed}")
        counts = dump.counts
        print(f"dump of {articles:,} articles: {counts.pages_read:,} pages, {counts.titles:,} titles, "
              f"{counts.links:,} links, {counts.anchor_names:,} anchor names, {dump.xml_bytes / 1e6:.0f} MB XML, "
              f"{dump.dump.stat().st_size / 1e6:.0f} MB bz2", flush=True)
        for workers in args.workers:
            runs += run_size(dump, workers, stages, settings)
            if args.json:
                save(args, runs)
    return runs


def save(args: argparse.Namespace, runs: list[StageRun]) -> None:
    """All figures as JSON (rewritten after each size, so an interrupted run keeps what it measured)."""
    settings = {name: str(value) if isinstance(value, Path) else value for name, value in vars(args).items()}
    document = {"settings": settings, "runs": [asdict(run) for run in runs], **summary(runs)}
    args.json.write_text(json.dumps(document, indent=1))


def saved_runs(paths: Sequence[Path]) -> tuple[list[StageRun], dict]:
    """The runs of several --json files, and the settings of the first."""
    missing = [path for path in paths if not path.is_file()]
    if missing:
        sys.exit(f"error: --report {missing[0]}: no such file (a --json file of an earlier run)")
    documents = [json.loads(path.read_text()) for path in paths]
    return [StageRun(**run) for document in documents for run in document["runs"]], documents[0]["settings"]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # `kill PID` stops the stage being measured too (its process group is killed on the way out)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.report:
        runs, settings = saved_runs(args.report)
        print_report(runs, settings["no_op_model"], settings.get("stand_in"))
        return
    print(f"{os.cpu_count()} CPUs (stages on {args.cores or 'all'}), load average {os.getloadavg()[0]:.1f} at start; "
          f"no-op model: {'on' if args.no_op_model else 'off'}"
          + (f", paced as one GPU of {args.stand_in:,.0f} tokens a second" if args.stand_in else ""), flush=True)
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
        runs = benchmark(args, args.work.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="kpr-scale-") as work:
            runs = benchmark(args, Path(work))
    print(f"load average {os.getloadavg()[0]:.1f} at the end\n")
    print_report(runs, args.no_op_model, args.stand_in)
    if args.json:
        save(args, runs)


if __name__ == "__main__":
    main()
