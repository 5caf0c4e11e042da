"""Local worker processes: each gets its share of the machine's threads, and a step with one piece of work runs
in this process."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import apache_beam as beam
import grpc
import pytest
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner import worker_handlers

from encoders.models import worker_device
from pipelines.launcher.local_workers import (
    THREAD_VARIABLES,
    WorkerLostError,
    at_most_workers,
    local_worker_processes,
    lost_worker_notice,
    lost_worker_tracebacks_held,
    lost_workers_fail_their_bundles,
    lost_workers_handled,
    threads_per_worker,
    worker_lost,
    worker_thread_variables,
)
from pipelines.launcher.stage import StageContext, run_beam
from run_pipeline import MALLOC_SETTINGS
from tests.conftest import BUNDLED_SAMPLE, DIRECT, MULTI_PROCESS, REPO

EXITED = RuntimeError("Worker subprocess exited with return code 137")  # what Beam's run_worker thread raises


def test_workers_started_here_are_counted_from_the_direct_runner_flags_only():
    assert local_worker_processes(MULTI_PROCESS) == 2
    assert local_worker_processes(["--runner=DirectRunner", "--direct_running_mode", "multi_processing",
                                   "--direct_num_workers", "8"]) == 8
    assert local_worker_processes(DIRECT) == 0  # in this process
    assert local_worker_processes(["--runner=DirectRunner", "--direct_num_workers=4"]) == 0  # threads, in-process


def test_each_worker_gets_its_share_of_the_cores_and_user_settings_win():
    assert threads_per_worker(8, 16) == 2
    assert threads_per_worker(3, 2) == 1
    assert worker_thread_variables(MULTI_PROCESS, 16, {}) == {name: "8" for name in THREAD_VARIABLES}
    assert worker_thread_variables(MULTI_PROCESS, 16, {"OMP_NUM_THREADS": "3"}) == {
        "MKL_NUM_THREADS": "8", "RAYON_NUM_THREADS": "8"}
    assert worker_thread_variables(DIRECT, 16, {}) == {}


def test_a_step_with_fewer_pieces_than_workers_starts_fewer():
    assert at_most_workers(MULTI_PROCESS, 1) == tuple(DIRECT)
    assert at_most_workers(MULTI_PROCESS, 5) == tuple(MULTI_PROCESS)
    eight = ["--runner=DirectRunner", "--direct_running_mode", "multi_processing", "--direct_num_workers", "8",
             "--experiments=x"]
    assert at_most_workers(eight, 3) == ("--runner=DirectRunner", "--experiments=x",
                                         "--direct_running_mode=multi_processing", "--direct_num_workers=3")
    assert at_most_workers(DIRECT, 1) == tuple(DIRECT)


def seen_by_workers(ctx: StageContext, path: Path) -> list[dict]:
    """Run a pipeline whose elements report the process and thread settings they ran with."""
    def report(_: int) -> str:
        return json.dumps({"pid": os.getpid(), "worker": os.environ.get("WORKER_ID"),
                           "gpu": worker_device("cuda", gpus=2),
                           **{name: os.environ.get(name) for name in THREAD_VARIABLES}})

    run_beam(ctx, lambda pipeline: (pipeline | beam.Create(range(4)) | beam.Map(report)
                                    | beam.io.WriteToText(str(path / "seen"), file_name_suffix=".jsonl")))
    return [json.loads(line) for file in sorted(path.glob("seen*.jsonl")) for line in file.read_text().splitlines()]


def test_worker_processes_inherit_their_thread_share_and_one_piece_runs_here(tmp_path, monkeypatch):
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    ctx = StageContext(output=str(tmp_path), stage="probe", beam_args=tuple(MULTI_PROCESS))
    (tmp_path / "many").mkdir()
    many = seen_by_workers(ctx, tmp_path / "many")
    share = str(threads_per_worker(2, os.cpu_count() or 1))
    assert len(many) == 4 and all(row["pid"] != os.getpid() for row in many)
    # Beam numbers its worker processes, and `--device cuda` takes one of 2 GPUs by that number
    numbers = [int(re.fullmatch(r"worker_(\d+)", row["worker"]).group(1)) for row in many]
    assert [row["gpu"] for row in many] == [f"cuda:{number % 2}" for number in numbers]
    assert all(row[name] == share for row in many for name in THREAD_VARIABLES)
    assert all(name not in os.environ for name in THREAD_VARIABLES)  # restored after the run

    (tmp_path / "one").mkdir()
    one = seen_by_workers(ctx.with_workers_at_most(1), tmp_path / "one")
    assert [row["pid"] for row in one] == [os.getpid()] * 4
    assert all(row[name] is None for row in one for name in THREAD_VARIABLES)
    assert all(row["worker"] is None and row["gpu"] == "cuda" for row in one)


def test_the_command_line_gives_arrow_the_system_allocator_unless_set_and_freed_memory_back(tmp_path):
    script = ("import runpy, sys\nsys.argv = ['run_pipeline.py', '--help']\ntry:\n"
              "    runpy.run_path('run_pipeline.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
              "import os, pyarrow\nprint('POOL', pyarrow.default_memory_pool().backend_name, "
              "os.environ.get('MALLOC_MMAP_THRESHOLD_'), os.environ.get('MALLOC_ARENA_MAX'))\n")
    env = {name: value for name, value in os.environ.items()
           if name not in ("ARROW_DEFAULT_MEMORY_POOL", "MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX")}
    chosen = [subprocess.run([sys.executable, "-c", script], cwd=REPO, env={**env, **extra}, capture_output=True,
                             text=True, timeout=120).stdout.split("POOL ")[-1].strip()
              for extra in ({}, {"ARROW_DEFAULT_MEMORY_POOL": "jemalloc"}, {"MALLOC_MMAP_THRESHOLD_": "131072"})]
    (_, _, threshold), (_, _, arenas) = MALLOC_SETTINGS
    assert threshold == 1 << 20 and arenas == max(2, os.cpu_count() or 1)
    # the C library's settings, inherited by workers; a value the user set is left as it is
    assert chosen == [f"system {threshold} {arenas}", f"jemalloc {threshold} {arenas}", f"system 131072 {arenas}"]


def test_the_command_line_exits_with_its_code_after_the_atexit_handlers_without_collecting_what_is_alive():
    # what is alive at the exit is frozen, so a cycle is left to the OS; the atexit handlers (Beam stops its worker
    # pools in one) still run, and the code reaches the shell
    script = ("import atexit, gc\nfrom run_pipeline import exit_without_last_collections\n"
              "class Cycle:\n    def __del__(self):\n        print('COLLECTED', flush=True)\n"
              "cycle = Cycle(); cycle.me = cycle; del cycle\n"
              "atexit.register(lambda: print('ATEXIT', gc.get_freeze_count() > 0, flush=True))\n"
              "exit_without_last_collections(3)\n")
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 3, run.stderr
    assert run.stdout.split() == ["ATEXIT", "True"]


def test_cuda_spreads_a_run_of_workers_evenly_over_the_gpus():
    for first in (0, 3, 17):
        devices = [worker_device("cuda", f"worker_{first + offset}", 4) for offset in range(8)]
        assert sorted(devices) == [f"cuda:{gpu}" for gpu in range(4) for _ in range(2)]
    three = [worker_device("cuda", f"worker_{number}", 2) for number in (5, 6, 7)]
    assert sorted(three) == ["cuda:0", "cuda:1", "cuda:1"]


def test_a_device_that_names_one_place_stays_where_it_is():
    assert worker_device("cuda:3", "worker_1", 4) == "cuda:3"
    assert worker_device("cpu", "worker_1", 4) == "cpu"
    assert worker_device("cuda", "worker_5", 1) == "cuda"  # one GPU
    assert worker_device("cuda", "", 4) == "cuda"  # the launcher's own process: Beam did not number it


def test_each_model_is_loaded_on_its_workers_gpu(monkeypatch, tiny_bert):
    import torch

    from encoders.models import ModelSpec
    from encoders.retrievers import EncoderOptions
    from transforms.embed_entities import forward
    from transforms.index import forward as index_forward
    from transforms.index.inputs import encoder_key

    loaded = []
    monkeypatch.setattr(forward, "MaskEncoder", lambda spec, *_: loaded.append(spec.device))
    monkeypatch.setattr(index_forward, "load_retriever", lambda options, _role: loaded.append(options.device))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no GPU here to make current
    passages = EncoderOptions(model=str(tiny_bert), kind="mean", device="cuda")
    loads = (lambda: forward.load_encoder(forward.encoder_key(ModelSpec(str(tiny_bert), "cuda"), -1, 1024)),
             lambda: index_forward.load_keyed_encoder(encoder_key(passages)))
    for worker in ("worker_6", None):
        if worker is None:
            monkeypatch.delenv("WORKER_ID", raising=False)
        else:
            monkeypatch.setenv("WORKER_ID", worker)
        for load in loads:
            load()
    assert loaded == ["cuda:2", "cuda:2", "cuda", "cuda"]


def control_stream_broken(owing: bool) -> tuple[worker_handlers.ControlFuture | None,
                                                worker_handlers.ControlConnection]:
    """A control connection of a worker whose stream broke (the process died), with one request it owed an answer
    to when ``owing`` (else none: as a worker closed at the stage's end); that request (None if not owing)."""
    def broken_stream() -> Iterator[beam_fn_api_pb2.InstructionResponse]:
        yield from ()
        raise ConnectionError("Socket closed")

    connection = worker_handlers.ControlConnection()
    future = connection.push(beam_fn_api_pb2.InstructionRequest()) if owing else None
    connection.set_input(broken_stream())
    connection._read_thread.join(10)
    return future, connection


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_whose_control_stream_breaks_fails_the_answers_it_owed():
    """The runner's reader of a worker's control stream, the stream broken (the process died) with a request
    unanswered, and a request asked of it after: both fail with a lost worker's error inside the block; Beam alone
    left them waiting."""
    with lost_workers_fail_their_bundles():
        owed, connection = control_stream_broken(owing=True)
        asked_after = connection.push(beam_fn_api_pb2.InstructionRequest())  # the next bundle, to the dead worker
        for future in (owed, asked_after):
            with pytest.raises(RuntimeError) as raised:
                future.get(timeout=10)
            assert worker_lost(raised.value)
    outside, _ = control_stream_broken(owing=True)  # Beam's own reader: the request is left waiting
    assert not outside.is_done() and outside._exception is None


def test_a_worker_that_connects_after_the_runner_closed_it_is_told_at_once_that_there_is_no_more():
    """A stage that fails (another worker lost) closes its workers; one still starting then connects: its control
    stream ends at once, so that the process exits and the runner's wait for it ends. Beam's ``close`` told only a
    worker connected by then: the stage waited for ever (a parse worker killed as both started, 4 runs in 5)."""
    def connect_late(servicer: worker_handlers.BeamFnControlServicer) -> threading.Thread:
        servicer.get_conn_by_worker_id("worker_1").close()  # the runner closes its workers
        context = SimpleNamespace(invocation_metadata=lambda: [("worker_id", "worker_1")])
        stream = threading.Thread(target=lambda: list(servicer.Control(iter(()), context)), daemon=True)
        stream.start()  # the worker connects, as Beam's Control serves it
        stream.join(5)
        return stream

    with lost_workers_fail_their_bundles():
        assert not connect_late(worker_handlers.BeamFnControlServicer(None)).is_alive()
    assert connect_late(worker_handlers.BeamFnControlServicer(None)).is_alive()  # outside: waits for ever


def stderr_within(capsys, seconds: float, until: Callable[[str], bool] = lambda _: False) -> str:
    """What was written to stderr within ``seconds`` (sooner once ``until`` holds)."""
    deadline, written = time.monotonic() + seconds, ""
    while time.monotonic() < deadline and not until(written):
        time.sleep(0.05)
        written += capsys.readouterr().err
    return written


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_stage_that_goes_on_after_losing_a_workers_work_says_so_at_once_in_one_line(capsys):
    """A lost worker's bundle failed while the stage's other workers go on with theirs (a GPU stage's other model
    processes encode their shares: hours with several GPUs, before the stage's error): one warning line once the
    stage has gone on for the notice's delay, whatever else the lost worker is asked; none for a worker whose
    stream ended owing nothing (closed at the stage's end), none for a stage that ends within the delay."""
    notice = ("warning: embed-entities: a worker process ended in the middle of its work (killed: by the kernel's "
              "out-of-memory killer when dmesg says so; or crashed); the stage stops with an error once its other "
              "workers have ended the work they hold (Ctrl-C stops it now); rerun the same command to resume\n")
    with pytest.raises(WorkerLostError), lost_workers_handled("embed-entities", notice_after_s=0.3):
        control_stream_broken(owing=False)
        assert stderr_within(capsys, 0.6) == ""
        _, connection = control_stream_broken(owing=True)
        connection.push(beam_fn_api_pb2.InstructionRequest())  # the next bundle, to the dead worker
        assert stderr_within(capsys, 10, until=lambda written: written != "") == notice
        connection.push(beam_fn_api_pb2.InstructionRequest())
        assert stderr_within(capsys, 0.6) == ""
        raise WorkerLostError("embed-entities")
    with pytest.raises(WorkerLostError), lost_workers_handled("parse", notice_after_s=0.3):
        control_stream_broken(owing=True)
        raise WorkerLostError("parse")
    assert stderr_within(capsys, 0.6) == ""


def test_a_worker_process_that_ends_before_it_connects_ends_its_stage_in_one_line(tmp_path):
    """A worker whose Python cannot start (a broken environment; as one killed while it starts): its own lines,
    then the stage's one line, exit 2. Beam's runner left its bundle waiting for ever for output from the process
    that was gone (only the thread that awaited its exit saw it end, and raised into nothing)."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(  # only Beam's worker processes have this variable
        "import os, sys\nif os.environ.get('CONTROL_API_SERVICE_DESCRIPTOR'):\n"
        "    sys.stderr.write('this worker cannot start\\n')\n    sys.exit(3)\n")
    run = subprocess.run([sys.executable, "run_pipeline.py", "parse", "--dump", str(BUNDLED_SAMPLE), "--output",
                          str(tmp_path / "out"), *MULTI_PROCESS], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join([str(broken), str(REPO)])})
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.splitlines()[-1] == (  # Python's status after an error in sitecustomize
        "error: parse: a worker process exited with status 1 before its work was done (its own lines above say "
        "why); rerun the same command to resume once that is fixed")
    assert "this worker cannot start" in run.stderr
    assert "Exception in thread" not in run.stderr and "Worker subprocess exited" not in run.stderr


@pytest.mark.parametrize(("statuses", "cause"), [
    ((137,), "was killed (SIGKILL: by the kernel's out-of-memory killer when dmesg says so) in the middle of its "
             "work; rerun the same command to resume"),  # through the shell Beam starts it with
    ((-9, 1), "was killed (SIGKILL: by the kernel's out-of-memory killer when dmesg says so) in the middle of its "
              "work; rerun the same command to resume"),  # the first worker lost says it
    ((139,), "ended by SIGSEGV in the middle of its work; rerun the same command to resume"),
    ((-6,), "ended by SIGABRT in the middle of its work; rerun the same command to resume"),
    ((2,), "exited with status 2 before its work was done (its own lines above say why); rerun the same command to "
           "resume once that is fixed"),
    ((), "ended in the middle of its work (killed: by the kernel's out-of-memory killer when dmesg says so; or "
         "crashed); rerun the same command to resume"),  # its exit not seen yet: its streams' end was
])
def test_the_lost_workers_line_says_how_it_ended_when_its_exit_status_is_known(statuses, cause):
    assert WorkerLostError("parse", statuses).message == f"parse: a worker process {cause}"
    what, advice = cause.rsplit("; ", 1)  # the notice of a stage that goes on after the loss says the same
    assert lost_worker_notice("parse", statuses) == (
        f"warning: parse: a worker process {what}; the stage stops with an error once its other workers have ended "
        f"the work they hold (Ctrl-C stops it now); {advice}")


def test_the_exit_status_of_a_worker_lost_is_kept_from_the_thread_that_awaited_its_exit(monkeypatch,
                                                                                        thread_errors_and_log):
    """Beam's ``run_worker`` thread raises its worker's exit status into nothing: it is kept for the line, and the
    worker's channels fail what it owed."""
    exited = threading.Event()

    def start_worker_that_is_killed(self: worker_handlers.SubprocessSdkWorkerHandler) -> None:
        def run_worker() -> None:  # as Beam's: waits for the process, then raises its exit
            exited.wait(10)
            raise EXITED

        self.worker_thread = threading.Thread(target=run_worker)
        self.worker_thread.start()

    seen, _ = thread_errors_and_log
    monkeypatch.setattr(worker_handlers.SubprocessSdkWorkerHandler, "start_worker", start_worker_that_is_killed)
    with lost_workers_fail_their_bundles() as statuses:
        handler = object.__new__(worker_handlers.SubprocessSdkWorkerHandler)
        handler.control_conn, handler.data_conn = worker_handlers.ControlConnection(), SimpleNamespace(_closed=False)
        owed = handler.control_conn.push(beam_fn_api_pb2.InstructionRequest())
        handler.start_worker()
        exited.set()
        handler.worker_thread.join(10)
        raised_in_a_thread(other := ValueError("another thread's error"))
    assert statuses == [137] and seen == [EXITED, other]
    assert handler.data_conn._closed
    with pytest.raises(RuntimeError) as raised:
        owed.get(timeout=10)
    assert worker_lost(raised.value)


def raised_in_a_thread(error: BaseException) -> None:
    def target() -> None:
        raise error

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()


def logged_with(error: BaseException) -> None:
    try:
        raise error
    except type(error):
        logging.getLogger("apache_beam.runners.worker.data_plane").exception("Failed to read inputs in the data plane.")


@pytest.fixture
def thread_errors_and_log(monkeypatch) -> tuple[list[BaseException], io.StringIO]:
    """The thread errors that reach the excepthook, and what the root logger's handler writes."""
    seen: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    root = logging.getLogger()
    root.addHandler(handler)
    yield seen, log
    root.removeHandler(handler)


def test_what_beams_threads_print_as_a_worker_goes_is_held_and_the_lost_workers_line_says_it(
        thread_errors_and_log, capsys):
    seen, log = thread_errors_and_log
    hook = threading.excepthook
    with pytest.raises(WorkerLostError), lost_worker_tracebacks_held("parse"):
        raised_in_a_thread(EXITED)
        logged_with(grpc.RpcError())
        raised_in_a_thread(other := ValueError("a thread's own error"))
        logging.getLogger("apache_beam").error("an error of its own")
        raise WorkerLostError("parse")
    assert seen == [other]  # as it came; the lost worker's never
    assert "an error of its own" in log.getvalue() and "Failed to read inputs" not in log.getvalue()
    assert capsys.readouterr().err == ""
    assert threading.excepthook is hook
    logged_with(grpc.RpcError())  # the filter is gone with the block
    assert "Failed to read inputs" in log.getvalue()


def test_a_stage_that_ends_well_after_losing_a_worker_says_so_in_one_line_and_another_error_shows_them_all(
        thread_errors_and_log, capsys):
    seen, log = thread_errors_and_log
    with lost_worker_tracebacks_held("parse"):
        raised_in_a_thread(EXITED)
        logged_with(grpc.RpcError())
    assert seen == [] and log.getvalue() == ""
    assert capsys.readouterr().err == ("warning: parse: a worker process ended during the stage (killed or crashed); "
                                       "all of the stage's work was done all the same\n")
    with pytest.raises(ValueError), lost_worker_tracebacks_held("parse"):
        raised_in_a_thread(EXITED)
        logged_with(grpc.RpcError())
        assert seen == [] and log.getvalue() == ""
        raise ValueError("the stage's own failure")
    assert seen == [EXITED] and "Failed to read inputs" in log.getvalue()
    assert capsys.readouterr().err == ""


def test_unheld_what_beams_threads_print_as_a_worker_goes_shows_as_it_comes(thread_errors_and_log):
    seen, log = thread_errors_and_log
    with pytest.raises(WorkerLostError), lost_workers_handled("parse", hold=False):
        raised_in_a_thread(EXITED)
        logged_with(grpc.RpcError())
        assert seen == [EXITED] and "Failed to read inputs" in log.getvalue()
        raise WorkerLostError("parse")
    with pytest.raises(WorkerLostError), lost_workers_handled("parse"):
        raised_in_a_thread(EXITED)
        raise WorkerLostError("parse")
    assert seen == [EXITED]
