"""pipelines/launcher/stage.py: two pipelines run together (the model's beside the inputs'), the second told when
the first has ended, errors raised in order; the model's pipeline with options of its own."""

from __future__ import annotations

import fcntl
import signal
import threading
import time
from functools import partial
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import WorkerOptions

from pipelines.launcher import stage as launcher_stage
from pipelines.launcher.interrupt import CTRL_C_GRACE_S
from pipelines.launcher.stage import StageContext, interrupted_in_a_step, model_workers, run_beams_together
from tests.conftest import DIRECT
from transforms.common.dead_letters import count


def counted(name: str, element: object) -> object:
    count(name)
    return element


def wait_for(element: object, marker: str) -> object:
    """Until the first pipeline has ended (its marker), as a follower of its outputs waits."""
    deadline = time.monotonic() + 60
    while not Path(marker).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(marker)
        time.sleep(0.05)
    if Path(marker).read_text() == "failed":
        raise RuntimeError("the first pipeline failed")
    count("followed")
    return element


def mark_ended(marker: Path, ended: list, error: BaseException | None) -> None:
    """What the launcher does when the first pipeline ends: the second learns of it (here by a marker file)."""
    ended.append(error)
    marker.write_text("failed" if error else "done")


def fail(element: object) -> object:
    raise ValueError("the first pipeline's own error")


def test_the_second_pipeline_runs_beside_the_first_and_learns_when_it_ends(tmp_path):
    marker, ended = tmp_path / "ended", []
    ctx = StageContext(output=str(tmp_path), stage="probe", beam_args=tuple(DIRECT))
    first_ended = partial(mark_ended, marker, ended)

    first = (ctx, lambda pipeline: pipeline | beam.Create([1, 2, 3]) | beam.Map(lambda item: counted("first", item)))
    second = (ctx, lambda pipeline: pipeline | beam.Create([None]) | beam.Map(wait_for, str(marker)))
    assert run_beams_together(first, second, first_ended) == ({"first": 3}, {"followed": 1})
    assert ended == [None]


def test_the_first_pipelines_error_is_raised_once_the_second_has_stopped(tmp_path):
    marker, ended = tmp_path / "ended", []
    ctx = StageContext(output=str(tmp_path), stage="probe", beam_args=tuple(DIRECT))
    first_ended = partial(mark_ended, marker, ended)

    first = (ctx, lambda pipeline: pipeline | beam.Create([1]) | beam.Map(fail))
    second = (ctx, lambda pipeline: pipeline | beam.Create([None]) | beam.Map(wait_for, str(marker)))
    with pytest.raises(ValueError, match="the first pipeline's own error"):
        run_beams_together(first, second, first_ended)
    assert len(ended) == 1 and "the first pipeline's own error" in str(ended[0])


def interrupt(element: object) -> object:
    raise KeyboardInterrupt  # Ctrl-C, as the in-process runner's steps get it in the main thread


def test_after_ctrl_c_the_second_pipeline_gets_the_grace_not_a_wait(tmp_path):
    """Ctrl-C in the first pipeline may have left taken a lock that the second needs (Python's import lock): the
    interruption is raised once the second has had CTRL_C_GRACE_S to stop on its own, whether it has or not.
    Here the second waits for a file that is written only afterwards, as it would wait for ever for the lock."""
    release, told = tmp_path / "release", []
    ctx = StageContext(output=str(tmp_path), stage="probe", beam_args=tuple(DIRECT))

    def first_ended(error: BaseException | None) -> None:
        told.append((time.monotonic(), error))

    first = (ctx, lambda pipeline: pipeline | beam.Create([1]) | beam.Map(interrupt))
    second = (ctx, lambda pipeline: pipeline | beam.Create([None]) | beam.Map(wait_for, str(release)))
    with pytest.raises(BaseException) as raised:
        run_beams_together(first, second, first_ended)
    waited = time.monotonic() - told[0][0]
    stuck = [thread for thread in threading.enumerate() if thread.name == "second-pipeline"]
    release.write_text("done")  # the second ends now
    for thread in stuck:
        thread.join(60)
    assert interrupted_in_a_step(raised.value) and interrupted_in_a_step(told[0][1])
    assert CTRL_C_GRACE_S <= waited < CTRL_C_GRACE_S + 2
    assert len(stuck) == 1 and not stuck[0].is_alive()



class RemoteJob:
    """A job submitted to a runner that runs it elsewhere: it runs until ``ends`` is set, or until cancelled."""

    def __init__(self, ends: threading.Event) -> None:
        self.ends, self.cancelled = ends, 0

    def wait_until_finish(self) -> None:
        self.ends.wait(60)

    def cancel(self) -> None:
        self.cancelled += 1
        self.ends.set()


def test_ctrl_c_while_a_remote_model_job_runs_on_alone_cancels_it(tmp_path, monkeypatch):
    """The inputs' job has ended and the launcher waits for the model's job: Ctrl-C (a real SIGINT to the main
    thread) cancels that job on its runner, which would run on, holding its workers."""
    remote = StageContext(output=str(tmp_path), stage="index", beam_args=(
        "--runner=PortableRunner", "--job_endpoint=localhost:8099", "--environment_type=EXTERNAL",
        "--environment_config=localhost:50000"))
    inputs_done, model_runs = threading.Event(), threading.Event()
    inputs_done.set()
    submitted = {"inputs": RemoteJob(inputs_done), "model": RemoteJob(model_runs)}
    monkeypatch.setattr(launcher_stage, "started", lambda ctx, build: submitted[build])
    monkeypatch.setattr(launcher_stage, "collect_counters", lambda result: {})
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal
    main_thread = threading.main_thread().ident
    timer = threading.Timer(1.0, signal.pthread_kill, (main_thread, signal.SIGINT))
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            run_beams_together((remote, "inputs"), (remote, "model"), lambda error: None)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert (submitted["inputs"].cancelled, submitted["model"].cancelled) == (0, 1)


def held_by_another(path: Path) -> bool:
    """Whether a lock on ``path`` (``jobs.setup_file_held``'s) is held elsewhere: another command's would wait."""
    with path.open("rb") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


@pytest.mark.parametrize("remote", [True, False], ids=["remote", "local"])
def test_a_remote_job_is_submitted_with_its_setup_file_locked(tmp_path, monkeypatch, remote):
    """Beam builds the package of --setup_file in its folder as it submits the job: two commands started at once
    from one checkout built over each other. A local runner builds none, and runs its pipeline to the end."""
    setup = tmp_path / "setup.py"
    setup.write_text("")
    flags = (("--runner=PortableRunner", "--job_endpoint=localhost:8099", "--environment_type=EXTERNAL",
              "--environment_config=localhost:50000") if remote else DIRECT)
    ctx = StageContext(output=str(tmp_path), stage="index", beam_args=(*flags, f"--setup_file={setup}"))
    held = []
    monkeypatch.setattr(launcher_stage.jobs, "submitted", lambda pipeline: held.append(held_by_another(setup)))
    launcher_stage.started(ctx, lambda pipeline: None)
    assert held == [remote] and not held_by_another(setup)

def test_the_models_pipeline_takes_its_own_options_after_the_commands():
    """--model-pipeline-options: the model's workers (machine, count) on a cluster; a later option wins."""
    remote = StageContext(output="gs://b/out", stage="index", beam_args=(
        "--runner=DataflowRunner", "--num_workers=16", "--machine_type=n2-standard-16"),
        model_beam_args=("--num_workers=4", "--machine_type=g2-standard-8"))
    assert model_workers(remote, "cuda", None) == 4  # one model process a worker of the model's pipeline
    assert model_workers(remote, "cuda", 2) == 2  # --model-workers wins
    assert remote.for_model(4).pipeline_options().view_as(WorkerOptions).machine_type == "g2-standard-8"
    assert remote.pipeline_options().view_as(WorkerOptions).machine_type == "n2-standard-16"
    local = StageContext(output="out", stage="index", beam_args=(
        "--direct_running_mode=multi_processing", "--direct_num_workers=2"), model_beam_args=("--experiments=probe",))
    assert local.for_model(1).beam_args == ("--experiments=probe",)  # one process: the launcher's own
    assert local.for_model(2).beam_args == (*local.beam_args, "--experiments=probe")
