"""How a stage runs: resume check, staging, the Beam run, then an atomic commit into OUT and the manifest."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from artifacts import fs, layout
from artifacts.counters import Counter
from artifacts.errors import InputError, error_chain
from artifacts.run import lock, manifest, verified
from encoders.errors import GpuMemoryError, gpu_out_of_memory
from encoders.models import TOKENIZER_FILE, model_processes, save_tokenizer
from pipelines.launcher import disk_space, flags, jobs, local_workers
from pipelines.launcher.environment import environment_variable, environment_variables
from pipelines.launcher.flags import DEFAULT_INTERVAL_S
from pipelines.launcher.interrupt import CTRL_C_GRACE_S, INTERRUPTED_STEP
from transforms.common.dead_letters import COUNTER_NAMESPACE, WriteDeadLetters
from transforms.common.follow import FollowedFiles, mark_ended
from transforms.common.progress import LogProgress, ProgressSettings, worker_count

LOG = logging.getLogger("kpr")
STAGING_DIR = layout.STAGING
LAUNCHER_HASH_BYTES = 1 << 30
# Runners whose workers are processes of this machine.
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner", "FnApiRunner", "PrismRunner")
DESCRIBED_DIR = "described"  # under the stage's staging root: the workers' descriptions of the outputs
ConfigT = TypeVar("ConfigT")


@dataclass(frozen=True)
class StageContext:
    """Where a running stage writes, and the Beam options it runs with."""

    output: str
    stage: str
    beam_args: tuple[str, ...]
    progress_interval: float = DEFAULT_INTERVAL_S
    model_beam_args: tuple[str, ...] = ()  # --model-pipeline-options: added for the model's pipeline alone

    @property
    def staging_root(self) -> str:
        return fs.join(self.output, STAGING_DIR, self.stage)

    @property
    def kept_root(self) -> str:
        """What a run of the stage keeps for its rerun if it is killed (encoded vectors): not removed when the stage
        starts again, removed once it commits."""
        return fs.join(self.output, STAGING_DIR, f"{self.stage}{layout.KEPT}")

    def staged(self, artifact: str) -> str:
        """The staging directory of ``artifact`` (e.g. ``articles``); committed to OUT/artifact on success."""
        return fs.join(self.staging_root, artifact)

    def staged_prefix(self, artifact: str) -> str:
        """A file prefix inside the staged artifact directory, for Beam sinks."""
        return fs.join(self.staged(artifact), "part")

    @property
    def staged_errors(self) -> str:
        """Where the stage's dead letters are until it commits them to OUT/errors/STAGE/ (a failed stage's stay)."""
        return self.staged(layout.errors_of(self.stage))

    def errors_prefix(self, kind: str) -> str:
        """A file prefix for dead letters of ``kind``; committed to OUT/errors/STAGE/."""
        return fs.join(self.staged_errors, kind)

    def final(self, artifact: str) -> str:
        return fs.join(self.output, artifact)

    def pipeline_options(self) -> PipelineOptions:
        return beam_pipeline_options(self.beam_args)

    def workers_run_here(self) -> bool:
        return workers_run_here(self.beam_args)

    def with_workers_at_most(self, count: int) -> StageContext:
        """This context for a step with ``count`` independent pieces of work: no more local worker processes
        than that, none for one (``local_workers.at_most_workers``)."""
        return replace(self, beam_args=local_workers.at_most_workers(self.beam_args, count))

    def for_model(self, processes: int) -> StageContext:
        """This context for the pipeline that runs the model in ``processes`` processes: no more local worker
        processes, and the options of --model-pipeline-options after the command's (a later one wins)."""
        return replace(self, beam_args=(*self.with_workers_at_most(processes).beam_args, *self.model_beam_args))

    def progress_settings(self, unit: str, total: int | None = None) -> ProgressSettings:
        """What this stage's progress lines about ``unit`` say (``total`` of them in the stage) and how often."""
        return ProgressSettings(layout.command_of(self.stage), unit, total, worker_count(self.beam_args),
                                self.progress_interval)

    def progress(self, unit: str, total: int | None = None, weight: Callable[[Any], int] | None = None) -> LogProgress:
        """A pass-through step that logs how many ``unit`` this worker has done (an element: ``weight(element)``
        of them, else 1), its rate and the ETA."""
        return LogProgress(self.progress_settings(unit, total), weight)


class Stage(Protocol[ConfigT]):
    """A pipeline stage: reads what its ``upstream`` stages wrote under OUT, writes ``outputs``.

    The flags (``pipelines.launcher.commands``) become one frozen config (``config``), built and checked once before OUT
    is touched; every other method reads that config, never the flags.
    """

    name: str
    outputs: tuple[str, ...]
    counters: Mapping[str, Counter]  # every counter the stage counts, declared in its transforms module(s)

    def config(self, args: argparse.Namespace) -> ConfigT:
        """The stage's frozen config from the flags; an ``InputError`` names a missing or invalid flag."""
        ...

    def upstream(self, config: ConfigT) -> tuple[str, ...]:
        """The stages whose outputs under OUT this run of the stage reads (fingerprinted by their content)."""
        ...

    def options(self, config: ConfigT) -> dict[str, Any]:
        """The options that change the stage's results (recorded; a change reruns the stage)."""
        ...

    def external_inputs(self, config: ConfigT) -> dict[str, str]:
        """Input files from outside OUT, by role, as paths or patterns to fingerprint."""
        ...

    def content_inputs(self, config: ConfigT) -> dict[str, str]:
        """Those of ``external_inputs`` small enough to hash at every run (a local model's files): other files of
        the same sizes and times in their place rerun the stage, and a copy elsewhere is the same model to the
        vectors a refresh or a rerun reuses (``pipelines.refresh.model_identity``)."""
        ...

    def run(self, ctx: StageContext, config: ConfigT) -> dict[str, int]:
        """Write every output under ``ctx.staged(...)``; return counters beyond the Beam ones."""
        ...


def beam_pipeline_options(beam_args: Sequence[str]) -> PipelineOptions:
    """Beam options from the unknown command-line flags; the local DirectRunner unless one is named.

    Beam's own default would try to download the Prism runner, which fails offline.
    """
    args = list(beam_args)
    if not any(arg == "--runner" or arg.startswith("--runner=") for arg in args):
        args.append("--runner=DirectRunner")
    return PipelineOptions(args)


def workers_run_here(beam_args: Sequence[str]) -> bool:
    """Whether the Beam workers run on this machine (a local runner): then models, devices and files are checked
    here before anything runs, with one-line errors; on other runners the workers check them with their own torch
    and files (a CPU launcher may start a GPU job)."""
    runner = beam_pipeline_options(beam_args).view_as(StandardOptions).runner
    return runner_path(str(runner)).rsplit(".", 1)[-1] in LOCAL_RUNNERS


def runner_path(name: str) -> str:
    """The ``module.Class`` path Beam resolves a runner name to: a known runner's class name (any case, "Runner"
    optional, e.g. ``direct``), else the name itself (a path of the user's own runner class)."""
    known = {path.rsplit(".", 1)[-1].lower(): path for path in StandardOptions.ALL_KNOWN_RUNNERS}
    return known.get(name.lower(), known.get(name.lower() + "runner", name))


def saved_tokenizer(ctx: StageContext, model: str, directory: str) -> str:
    """The tokenizer of ``model`` saved under ``directory`` for the workers that build a GPU stage's inputs
    (``models.save_tokenizer``), and its path; "" where the launcher does not read the model's files (a remote
    runner: each worker loads the tokenizer itself)."""
    if not ctx.workers_run_here():
        return ""
    path = fs.join(directory, TOKENIZER_FILE)
    save_tokenizer(model, path)
    return path


Build = Callable[[beam.Pipeline], None]


def run_beam(ctx: StageContext, build: Build) -> dict[str, int]:
    """Build a pipeline with ``build``, run it to the end and return its ``kpr`` counters. Local worker processes
    share this machine's cores (``local_workers``)."""
    threads = local_workers.worker_thread_variables(ctx.beam_args, os.cpu_count() or 1, os.environ)
    with private_tempdir(), environment_variables(threads):
        return run_built(ctx, build)


def run_built(ctx: StageContext, build: Build) -> dict[str, int]:
    return finished(started(ctx, build))


def started(ctx: StageContext, build: Build) -> Any:
    """The result of the pipeline ``build`` builds, submitted (a local runner runs it to the end here)."""
    pipeline = beam.Pipeline(options=ctx.pipeline_options())
    build(pipeline)
    if ctx.workers_run_here():  # a local runner runs the pipeline to the end here and builds no package
        return jobs.submitted(pipeline)
    with jobs.setup_file_held(pipeline.options):
        return jobs.submitted(pipeline)


def finished(result: Any) -> dict[str, int]:
    """The ``kpr`` counters of a submitted pipeline, once it has ended (Ctrl-C meanwhile cancels its job)."""
    jobs.waited(result)
    return collect_counters(result)


def run_beams_together(first: tuple[StageContext, Build], second: tuple[StageContext, Build],
                       first_ended: Callable[[BaseException | None], None]) -> tuple[dict[str, int], dict[str, int]]:
    """Run two pipelines at the same time, ``second`` in a thread of its own, each to the end; their counters.
    ``first_ended(error)`` is called once ``first`` has ended (``error``: what it raised, or None), so that a
    second that follows the first's outputs learns that there will be no more. The first's error is raised
    before the second's. The worker processes of both share this machine's cores as the first's do.

    After Ctrl-C the second gets the grace that worker processes get to stop on their own, no more (the command
    then ends this process): the KeyboardInterrupt may have come just as the first's thread took a lock that the
    second's needs, before anything could release it. Python's import lock is one: taken in a C call, it stays
    taken when the signal is raised as that call returns, and the second imports the model's libraries as it
    starts (a run of `all` stopped by Ctrl-C at the index's first progress line once waited for ever in CI)."""
    threads = local_workers.worker_thread_variables(first[0].beam_args, os.cpu_count() or 1, os.environ)
    ended: dict[str, Any] = {}

    def cancel_second() -> None:  # a remote job: it would run on, holding its workers
        if "result" in ended:
            jobs.cancel(ended["result"])

    def run_second() -> None:
        try:
            ended["result"] = started(*second)  # a remote job, submitted: cancelled at Ctrl-C
            ended["counters"] = finished(ended["result"])
        except BaseException as error:  # raised in the caller's thread, after the first's
            ended["error"] = error

    with private_tempdir(), environment_variables(threads):
        beside = threading.Thread(target=run_second, name="second-pipeline", daemon=True)
        try:
            if first[0].workers_run_here():  # a local runner runs the first to the end as it is submitted
                beside.start()
                counters = run_built(*first)
            else:  # submitted one after the other: each stages the project (an sdist built in the checkout)
                result = started(*first)
                beside.start()
                counters = finished(result)
        except BaseException as error:
            first_ended(error)
            if isinstance(error, KeyboardInterrupt):
                cancel_second()
            if beside.is_alive():
                beside.join(CTRL_C_GRACE_S if interrupted_in_a_step(error) else None)
            raise
        first_ended(None)
        try:
            beside.join()
        except KeyboardInterrupt:  # while the second ran on alone
            cancel_second()
            raise
    if "error" in ended:
        raise ended["error"]
    return counters, ended["counters"]


def with_dead_letters(ctx: StageContext, name: str, transform: beam.PTransform, kind: str) -> Build:
    """One of a stage's pipelines: ``transform`` from the root (it returns its dead letters), written as ``kind``."""
    def build(pipeline: beam.Pipeline) -> None:
        dead = pipeline | name >> transform
        _ = dead | "WriteDeadLetters" >> WriteDeadLetters(ctx.errors_prefix(kind))

    return build


def summed(first: Mapping[str, int], second: Mapping[str, int]) -> dict[str, int]:
    """Two pipelines' counters added, by name (as ``collect_counters`` gives one pipeline's)."""
    return {name: first.get(name, 0) + second.get(name, 0) for name in sorted({*first, *second})}


def run_model_beside(ctx: StageContext, prepare: Build, model: Callable[[StageContext], Build],
                     followed: FollowedFiles) -> dict[str, int]:
    """A GPU stage's encoding: the inputs' pipeline ``prepare`` on every worker and, beside it, the model's
    (``model(its context)``) in the processes that hold the model (``followed.followers``, from
    ``model_workers``), told when the first has ended; the two pipelines' counters summed."""
    forward = ctx.for_model(followed.followers)
    started, ended = time.perf_counter(), []

    def inputs_ended(error: BaseException | None) -> None:
        ended.append(time.perf_counter() - started)
        mark_ended(followed, error)

    prepared, encoded = run_beams_together((ctx, prepare), (forward, model(forward)), inputs_ended)
    print(f"[{layout.command_of(ctx.stage)}] inputs' pipeline ended after {ended[0]:.1f}s, the model's after "
          f"{time.perf_counter() - started:.1f}s", file=sys.stderr, flush=True)
    return summed(prepared, encoded)


def model_workers(ctx: StageContext, device: str, configured: int | None) -> int:
    """How many processes hold the model: ``--model-workers``, else on a local runner one per GPU (more would share
    a GPU: slower, README "GPUs"), else the workers of the model's pipeline."""
    local = model_processes(device) if ctx.workers_run_here() else None
    return configured or local or worker_count((*ctx.beam_args, *ctx.model_beam_args))


TEMPDIR_PREFIX = "kpr-run-"  # then the command's pid@host, a dash and tempfile's letters (no dash among them)


def tempdir_prefix() -> str:
    return f"{TEMPDIR_PREFIX}{os.getpid()}@{socket.gethostname()}-"


def remove_dead_runs_tempdirs() -> None:
    """Remove the private temporary roots of commands killed outright (SIGKILL, the out-of-memory killer) on this
    host (a temp directory may be shared with other hosts, as the lock's pid is only tested on its own host): those
    whose pid runs no process any more."""
    host = socket.gethostname()
    for path in Path(tempfile.gettempdir()).glob(f"{TEMPDIR_PREFIX}*@*-*"):
        pid, _, rest = path.name.removeprefix(TEMPDIR_PREFIX).partition("@")
        if pid.isdigit() and rest.rpartition("-")[0] == host and not lock.pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def private_tempdir() -> Iterator[str]:
    """Run with a private temporary root, removed afterwards, in this process (``tempfile``) and in the worker
    processes it starts (``TMPDIR``, which they inherit). Left in the system temp directory otherwise: the
    runner's empty ``beam-temp*`` (its job server's, when that server does not start) and SDK-dependency ``tmp*``
    directories on every run, torch's ``torchinductor_<user>`` in each worker."""
    remove_dead_runs_tempdirs()
    root = tempfile.mkdtemp(prefix=tempdir_prefix())
    previous, tempfile.tempdir = tempfile.tempdir, root
    try:
        with environment_variable("TMPDIR", root):
            yield root
    finally:
        tempfile.tempdir = previous
        shutil.rmtree(root, ignore_errors=True)


def collect_counters(result: Any) -> dict[str, int]:
    counters: dict[str, int] = {}
    for item in result.metrics().query(MetricsFilter().with_namespace(COUNTER_NAMESPACE))["counters"]:
        value = item.committed if item.committed is not None else item.attempted
        counters[item.key.metric.name] = counters.get(item.key.metric.name, 0) + int(value or 0)
    return dict(sorted(counters.items()))


def input_fingerprints(stage: Stage[ConfigT], config: ConfigT, output: str,
                       completed: dict[str, manifest.StageRecord]) -> dict[str, str]:
    """Fingerprints of everything the stage reads: external files and upstream stages' outputs."""
    inputs = {f"file:{role}": manifest.file_fingerprint(pattern)
              for role, pattern in sorted(stage.external_inputs(config).items()) if pattern}
    inputs.update({f"{manifest.CONTENT}{role}": manifest.content_digest(pattern)
                   for role, pattern in sorted(stage.content_inputs(config).items())})
    for upstream in stage.upstream(config):
        record = completed.get(upstream)
        command = layout.command_of(upstream)
        if record is None:
            raise InputError(
                f"{output} has no completed '{command}' stage, which '{layout.command_of(stage.name)}' reads: "
                f"run `python run_pipeline.py {command} --output {shlex.quote(output)} ...` first"
            )
        problems = manifest.missing_or_changed(output, record)
        if problems:
            raise changed_after_it_ran(output, upstream, problems[0])
        rebuilt = manifest.rebuilt_since(record, completed)
        if rebuilt:
            raise InputError(
                f"'{command}' under {output} was built from other outputs of '{layout.command_of(rebuilt[0])}' than "
                f"the ones there now (it ran again since), and '{layout.command_of(stage.name)}' would read both: "
                f"rerun `python run_pipeline.py {command} --output {shlex.quote(output)} ...` first"
            )
        strays = manifest.unrecorded_files(output, record)
        if strays:
            raise InputError(
                f"{fs.join(output, strays[0])} is not an output of '{command}' (its manifest record does not list "
                f"it) and '{layout.command_of(stage.name)}' would read it: remove it, or rerun `python run_pipeline.py "
                f"{command} --output {shlex.quote(output)} --force ...`"
            )
        inputs.update([upstream_input(stage.name, upstream, record, completed.get(stage.name))])
    return inputs


def upstream_input(name: str, upstream: str, record: manifest.StageRecord,
                   own: manifest.StageRecord | None) -> tuple[str, str]:
    """The recorded input of the outputs of ``upstream`` (``record``) that stage ``name`` reads: those of its
    ``layout.READS``, or all; all where ``own`` (its record) holds their digest so (an earlier version's record, of
    the same outputs: the stage is not run again for it)."""
    read = layout.READS.get(name, {}).get(upstream, ())
    whole = manifest.stage_input(upstream)
    if read and own is not None and own.inputs.get(whole) == record.outputs_digest():
        return whole, own.inputs[whole]
    return manifest.stage_input(upstream, read), record.outputs_digest(read)


def changed_after_it_ran(output: str, upstream: str, problem: str) -> InputError:
    command = layout.command_of(upstream)
    return InputError(f"the outputs of '{command}' under {output} changed after it ran ({problem}): rerun `python "
                      f"run_pipeline.py {command} --output {shlex.quote(output)} --force ...` first")


def check_input_content(ctx: StageContext, stage: Stage[ConfigT], config: ConfigT,
                        completed: dict[str, manifest.StageRecord]) -> None:
    """The upstream outputs ``stage`` reads, against their sha256 in the manifest: a file damaged in place keeps its
    size, and read it would be the stage's input (garbage rows, or an error deep in a worker). Files remembered
    from their commit on this machine (``verified.remember``) are only stat'ed; others are hashed where the launcher
    hashes outputs (``recorded_hashed_here``: not beyond ``LAUNCHER_HASH_BYTES`` with workers elsewhere)."""
    for upstream in stage.upstream(config):
        record = completed[upstream]
        if recorded_hashed_here(ctx, record.outputs):  # their sizes were checked against the manifest
            problem = verified.changed_content(ctx.output, record.outputs)
            if problem is not None:
                raise changed_after_it_ran(ctx.output, upstream, problem)


def skip_reason(stage: Stage, record: manifest.StageRecord | None, options: dict[str, Any],
                inputs: dict[str, str], output: str) -> str | None:
    """Why the recorded run of ``stage`` can be reused, or None when it must run. A content digest the record does
    not hold (written by a version that did not take it) is no change: its files' fingerprints decide."""
    if record is None or not manifest.same_options(record.options, options):
        return None
    if record.inputs != {key: value for key, value in inputs.items()
                         if not key.startswith(manifest.CONTENT) or key in record.inputs}:
        return None
    missing = next(iter(manifest.missing_or_changed(output, record)), None)
    if (damaged := missing or verified.changed_local_content(output, record.outputs)) is not None:  # or in place
        print(f"[{layout.command_of(stage.name)}] {damaged}: it runs again", file=sys.stderr)
        return None
    return "outputs complete, inputs and options unchanged"


def committed_directories(stage: Stage) -> list[str]:
    """Every directory under OUT that ``commit`` writes the stage's artifacts into (``errors`` and
    ``errors/STAGE``): a file in the way of one is refused before the stage runs, not deleted nor met at its end."""
    return sorted({"/".join(parts[:depth]) for parts in (artifact.split("/") for artifact in committed(stage))
                   for depth in range(1, len(parts) + 1)})


def require_replaceable(stage: Stage, ctx: StageContext) -> None:
    """An InputError, before the stage runs, where ``commit`` could not replace what OUT holds (once it has dropped
    the stage's record): a directory of the stage's artifacts, staging or kept work (those it replaces, whole), or
    one above them, whose entries this user may not change."""
    replaced = {*committed(stage), fs.relative(ctx.staging_root, ctx.output), fs.relative(ctx.kept_root, ctx.output)}
    for target in sorted({STAGING_DIR, *replaced, *committed_directories(stage)}):
        if (locked := fs.unchangeable_directory(fs.join(ctx.output, target), target in replaced)) is not None:
            raise InputError(f"{locked}: this user may not change what it holds (its permissions, or a read-only "
                             f"filesystem), and {layout.command_of(stage.name)} replaces {target}/ as it commits: "
                             "fix that and run the command again")


def committed(stage: Stage) -> list[str]:
    """The artifacts ``commit`` moves into OUT: the stage's outputs and its dead letters."""
    return [*stage.outputs, layout.errors_of(stage.name)]


def commit(ctx: StageContext, stage: Stage, record: manifest.StageRecord, started: float) -> manifest.StageRecord:
    """Move staged outputs into OUT, then record them: the manifest entry is the commit point. Its wall time runs
    from ``started`` (``time.time()``) to then, when it finished: hashing the outputs is part of the stage's time."""
    completed = manifest.load(ctx.output)
    completed.pop(stage.name, None)
    manifest.save(ctx.output, completed)
    artifacts = committed(stage)
    for artifact in artifacts:
        fs.delete_tree(ctx.final(artifact))
        for source in fs.list_tree(ctx.staged(artifact)):
            destination = fs.join(ctx.final(artifact), fs.relative(source, ctx.staged(artifact)))
            fs.ensure_parent(destination)
            FileSystems.rename([source], [destination])
    record.outputs = described_outputs(ctx, artifacts)
    if recorded_hashed_here(ctx, record.outputs):
        verified.remember(ctx.output, record.outputs)  # hashed just now: the next stage here only stats them
    record.wall_time_s, record.finished_at = round(time.time() - started, 3), manifest.now_iso()
    completed = manifest.load(ctx.output)
    completed[stage.name] = record
    manifest.save(ctx.output, completed)
    fs.delete_tree(ctx.staging_root)
    fs.delete_tree(ctx.kept_root)
    return record


def remove_leftovers(ctx: StageContext, record: manifest.StageRecord) -> None:
    """What a run killed right after writing its record left (``commit`` removes both just after): the staging
    directory (every run clears it as it starts) and the kept work, unless it was written after the record (by a
    later run of other options, killed: its rerun finds it)."""
    fs.delete_tree(ctx.staging_root)
    newest, recorded = fs.newest_update(ctx.kept_root), manifest.finished_time(record)
    if newest is not None and recorded is not None and newest < recorded + 1:  # finished_at: whole seconds
        fs.delete_tree(ctx.kept_root)


def hashes_here(ctx: StageContext, paths: Sequence[str]) -> bool:
    """Whether the launcher hashes the output files ``paths``: on a local runner always (the files are on this
    machine: no worker process to start), on another up to ``LAUNCHER_HASH_BYTES`` in all (beyond, it would
    download every output: an index of English Wikipedia is ~100 GB)."""
    return within_launcher_share(ctx, lambda: sum(fs.size(path) for path in paths))


def recorded_hashed_here(ctx: StageContext, items: Sequence[manifest.OutputFile]) -> bool:
    """``hashes_here`` for recorded files, by the sizes the manifest records (no request per file)."""
    return within_launcher_share(ctx, lambda: sum(item.bytes for item in items))


def within_launcher_share(ctx: StageContext, total_bytes: Callable[[], int]) -> bool:
    return ctx.workers_run_here() or total_bytes() <= LAUNCHER_HASH_BYTES


def described_outputs(ctx: StageContext, artifacts: Sequence[str]) -> list[manifest.OutputFile]:
    """Size, sha256 and rows of every committed output file: by the launcher, a file a thread on each core
    (hashing and reading release the GIL: the 1.1 GB of an index of 307,087 passages in 0.4 s on 2 cores, where a
    pipeline's worker processes took seconds to start), or by the workers, file by file in parallel
    (``hashes_here``)."""
    paths = [path for artifact in artifacts for path in fs.list_tree(ctx.final(artifact))]
    if hashes_here(ctx, paths):
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="describe") as pool:
            return list(pool.map(partial(manifest.describe_file, ctx.output), paths))
    described = fs.join(ctx.staging_root, DESCRIBED_DIR, "part")

    def build(pipeline: beam.Pipeline) -> None:
        _ = (pipeline | "OutputFiles" >> beam.Create(paths) | "Spread" >> beam.Reshuffle()
             | "Describe" >> beam.Map(lambda path: json.dumps(asdict(manifest.describe_file(ctx.output, path))))
             | "Write" >> beam.io.WriteToText(described, file_name_suffix=".jsonl"))

    run_beam(ctx, build)
    lines = [line for path in fs.list_files(fs.join(ctx.staging_root, DESCRIBED_DIR), "*.jsonl")
             for line in fs.read_bytes(path).decode("utf-8").splitlines()]
    return sorted((manifest.OutputFile(**json.loads(line)) for line in lines), key=lambda item: item.path)


class StageInterrupted(KeyboardInterrupt):
    """Ctrl-C while a stage ran; ``command`` is its command-line name."""

    def __init__(self, command: str) -> None:
        super().__init__(command)
        self.command = command


def command_line() -> str:
    """This process's command line, as recorded in the lock on OUT."""
    return shlex.join(["python", *sys.argv])[:300]


def execute(stage: Stage, args: argparse.Namespace, beam_args: Sequence[str],
            force: bool = False) -> tuple[manifest.StageRecord, bool]:
    """Run ``stage`` unless its recorded outputs are still valid; commit it, holding the lock on OUT.
    Returns its record and whether it ran (False: skipped as up to date)."""
    # A missing option or input fails here, before OUT is created or locked.
    config = stage.config(args)
    options = manifest.canonical_options(stage.options(config))
    stage.external_inputs(config)
    context = StageContext(output=args.output, stage=stage.name, beam_args=tuple(beam_args),
                           model_beam_args=flags.model_pipeline_options(args),
                           progress_interval=getattr(args, "progress_interval", DEFAULT_INTERVAL_S))
    # what Beam's threads print as they lose a local worker process is held back, as its other lines, unless --verbose
    hold = workers_run_here(beam_args) and not getattr(args, "verbose", False)
    try:
        with (lock.hold(args.output, command_line()),
              local_workers.lost_workers_handled(layout.command_of(stage.name), hold)):
            return _execute_within_limits(stage, config, context, options, force)
    except StageInterrupted:
        raise
    except KeyboardInterrupt:
        raise StageInterrupted(layout.command_of(stage.name)) from None
    except Exception as error:
        if interrupted_in_a_step(error):
            raise StageInterrupted(layout.command_of(stage.name)) from None
        raise


def _execute_within_limits(stage: Stage[ConfigT], config: ConfigT, ctx: StageContext, options: dict[str, Any],
                           force: bool) -> tuple[manifest.StageRecord, bool]:
    """``_execute``; a full filesystem or a GPU out of memory is one line (a lost worker process too:
    ``local_workers.lost_workers_handled``), and a full filesystem leaves no staged files (removed under the
    lock)."""
    at_start, kept_at_start = disk_space.space_of(ctx.output), disk_space.staged_bytes(ctx.kept_root)
    try:
        return _execute(stage, config, ctx, options, force)
    except Exception as error:
        if (code := disk_space.out_of_space(error)) is not None:
            raise disk_space.disk_full_error(layout.command_of(stage.name), ctx.output, ctx.staging_root,
                                             ctx.kept_root, at_start, kept_at_start, code) from error
        if gpu_out_of_memory(error):
            raise GpuMemoryError(layout.command_of(stage.name)) from error
        raise


def interrupted_in_a_step(error: BaseException) -> bool:
    """Whether ``error`` is Ctrl-C that reached a step running in this process (re-raised by Beam as another
    exception, the KeyboardInterrupt as its context)."""
    return any(isinstance(current, KeyboardInterrupt) or str(current).startswith(INTERRUPTED_STEP)
               for current in error_chain(error))


def kept_previous_digest(options: dict[str, Any], record: manifest.StageRecord | None) -> dict[str, Any]:
    """``options`` with the previous run's manifest digest the stage's record holds where that run is gone now
    (``manifest.GONE``) and was the same path: a rerun of a refresh still derives from it (its entity id map, its own
    store of that run's vectors), and ``diff`` or ``report`` against a copy of it match it by that digest."""
    previous, digest = manifest.PREVIOUS_OPTION, manifest.PREVIOUS_SHA_OPTION
    if options.get(digest) != manifest.GONE or record is None or record.options.get(previous) != options[previous]:
        return options
    return {**options, digest: record.options.get(digest, manifest.GONE)}


def _execute(stage: Stage[ConfigT], config: ConfigT, ctx: StageContext, options: dict[str, Any],
             force: bool) -> tuple[manifest.StageRecord, bool]:
    output = ctx.output
    started = time.time()  # the stage's wall time: its inputs fingerprinted to its outputs hashed and recorded
    completed = manifest.load(output)
    inputs = input_fingerprints(stage, config, output, completed)
    reason = None if force else skip_reason(stage, completed.get(stage.name), options, inputs, output)
    if reason is not None:
        print(f"[{layout.command_of(stage.name)}] skipped: {reason}", file=sys.stderr)
        remove_leftovers(ctx, completed[stage.name])
        return completed[stage.name], False
    check_input_content(ctx, stage, config, completed)
    for target in (STAGING_DIR, *committed_directories(stage)):
        fs.require_directory_target(fs.join(output, target))
    require_replaceable(stage, ctx)
    fs.delete_tree(ctx.staging_root)
    print(f"[{layout.command_of(stage.name)}] running", file=sys.stderr)
    counters = stage.run(ctx, config)
    require_previous_unchanged(layout.command_of(stage.name), options)
    record = manifest.StageRecord(
        stage=stage.name, options=kept_previous_digest(options, completed.get(stage.name)), inputs=inputs, outputs=[],
        counters=counters,
        versions=manifest.software_versions(),
        sources={role: pattern for role, pattern in sorted(stage.external_inputs(config).items()) if pattern},
    )
    record = commit(ctx, stage, record, started)
    print_summary(record)
    return record, True


def require_previous_unchanged(command: str, options: dict[str, Any]) -> None:
    """An InputError, before anything is committed, when the ``--previous`` run a refresh read changed while it ran
    (its manifest is not the one recorded when the stage started: a stage of it committed meanwhile): what the
    stage took from it may be of two versions (vectors of other options, or none found)."""
    previous, recorded = options.get(manifest.PREVIOUS_OPTION), options.get(manifest.PREVIOUS_SHA_OPTION)
    if not previous or recorded in (None, manifest.GONE):
        return
    if manifest.manifest_sha256(previous) != recorded:
        raise InputError(f"--previous {previous} changed while {command} read it (a stage of it committed "
                         "meanwhile): what was taken from it could mix two versions, so nothing was committed; run "
                         f"the same command again once nothing writes {previous}")


def print_summary(record: manifest.StageRecord) -> None:
    rows = {item.path.split("/")[0]: 0 for item in record.outputs if item.rows is not None}
    for item in record.outputs:
        if item.rows is not None:
            rows[item.path.split("/")[0]] += item.rows
    lines = [f"[{layout.command_of(record.stage)}] done in {record.wall_time_s:.1f}s"]
    lines += [f"  {artifact}: {count:,} rows" for artifact, count in sorted(rows.items())]
    # A counter named like an artifact with the same count repeats its row count: printed once, as rows.
    lines += [f"  {name}: {value:,}" for name, value in record.counters.items() if rows.get(name) != value]
    print("\n".join(lines), file=sys.stderr)
