"""A job that runs elsewhere (a job service's, a cluster's): Ctrl-C while waiting cancels it, and its failure on the
workers is one line naming the job's last error line, our own input errors as they are."""

from __future__ import annotations

import threading
import time

import apache_beam as beam
import grpc
import pytest
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability import local_job_service

from artifacts.errors import InputError, input_error_message
from pipelines.launcher import jobs

WORKER_TRACEBACK = """Traceback (most recent call last):
  File "apache_beam/runners/worker/sdk_worker.py", line 311, in _execute
    response = task()
  File "/usr/lib/python3/importlib/__init__.py", line 126, in import_module
ModuleNotFoundError: No module named 'transforms' [while running 'ReadPages/Read']
"""


class RemoteJob:
    """A submitted job's result as the portable runner returns it: ``wait_until_finish`` raises ``raised``."""

    def __init__(self, raised: BaseException | None, cancel_fails: bool = False) -> None:
        self.raised, self.cancel_fails, self.cancelled = raised, cancel_fails, 0

    def wait_until_finish(self) -> str:
        if self.raised is not None:
            raise self.raised
        return "DONE"

    def cancel(self) -> None:
        self.cancelled += 1
        if self.cancel_fails:
            raise RuntimeError("the job service is gone")


@pytest.mark.parametrize("cancel_fails", [False, True])
def test_ctrl_c_while_waiting_cancels_the_job_and_is_raised_on(cancel_fails):
    job = RemoteJob(KeyboardInterrupt(), cancel_fails)
    with pytest.raises(KeyboardInterrupt):
        jobs.waited(job)
    assert job.cancelled == 1


def test_a_job_that_ends_is_not_cancelled():
    job = RemoteJob(None)
    jobs.waited(job)
    assert job.cancelled == 0


def test_a_job_failed_on_its_workers_is_one_line_with_its_last_error():
    with pytest.raises(jobs.JobFailedError) as failed:
        jobs.waited(RemoteJob(RuntimeError(WORKER_TRACEBACK)))
    assert input_error_message(failed.value) == (
        "the runner's job failed: ModuleNotFoundError: No module named 'transforms' [while running 'ReadPages/Read'] "
        "(the whole error is in the job's log, its workers', and printed here with --verbose)")
    long = jobs.last_line("x" * 1000)
    assert long == "x" * jobs.MAX_CAUSE_CHARS + "..." and jobs.last_line("\n \n") == "no message"


def test_a_worker_pool_that_does_not_answer_is_named_by_its_grpc_status_and_details():
    unanswered = (WORKER_TRACEBACK.rsplit("\n", 2)[0] + "\ngrpc._channel._InactiveRpcError: <_InactiveRpcError of RPC "
                  "that terminated with:\n\tstatus = StatusCode.UNAVAILABLE\n\tdetails = \"failed to connect to all "
                  "addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused\"\n\tdebug_error_string = "
                  "\"UNAVAILABLE:failed to connect to all addresses\"\n>\n")
    with pytest.raises(jobs.JobFailedError) as failed:
        jobs.waited(RemoteJob(RuntimeError(unanswered)))
    assert input_error_message(failed.value) == (
        "the runner's job failed: StatusCode.UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
        "ipv4:127.0.0.1:1: Connection refused (the whole error is in the job's log, its workers', and printed here "
        "with --verbose)")


def test_our_input_error_raised_on_a_worker_is_said_as_it_is_and_where():
    """A model directory the launcher has and the workers lack was "X/config.json does not exist", read on the
    machine where it does."""
    worker_error = InputError("device cuda was asked for but no CUDA device is available")
    error = RuntimeError(f"{WORKER_TRACEBACK}{worker_error} [while running 'EncodeMentions']")
    with pytest.raises(InputError) as raised:
        jobs.waited(RemoteJob(error))
    assert raised.value.__cause__ is error
    assert input_error_message(raised.value) == ("device cuda was asked for but no CUDA device is available (on the "
                                                 "runner's workers)")


def test_a_job_service_gone_while_waiting_is_one_line():
    with pytest.raises(InputError) as gone:
        jobs.waited(RemoteJob(grpc.RpcError()))
    assert input_error_message(gone.value) == (
        "the job service stopped answering (RpcError): the job may have stopped with it; rerun the same command once "
        "it runs again to resume")


def test_the_traceback_of_the_thread_reading_a_jobs_messages_is_hidden_and_other_threads_go_to_the_hook_before(
        monkeypatch):
    """Beam's thread reading a job's messages ends with the job service's stream: the one line says it. The hook
    there was (Python's, or a local run's, ``local_workers``) still gets every other thread's error."""
    before: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: before.append(args.thread.name))
    jobs.hide_job_stream_errors()
    jobs.hide_job_stream_errors()  # once: not a hook around a hook
    assert isinstance(threading.excepthook, jobs.JobStreamErrorsHidden)
    assert not isinstance(threading.excepthook.then, jobs.JobStreamErrorsHidden)
    for name, error in ((jobs.MESSAGE_THREAD, grpc.RpcError()), (jobs.MESSAGE_THREAD, ValueError()),
                        ("another", grpc.RpcError())):
        thread = threading.Thread(target=lambda: None, name=name)
        threading.excepthook(threading.ExceptHookArgs((type(error), error, None, thread)))
    assert before == [jobs.MESSAGE_THREAD, "another"]


def test_a_job_that_runs_past_the_job_server_timeout_is_followed_to_its_end():
    """Beam gives the streams that follow a job --job_server_timeout as their deadline: a job running longer (any
    real dump, at Beam's 300 s) ended the command as a job service gone, the job left running on its workers (and a
    LOOPBACK environment's stopped). Here a 2 s timeout and a job of about 6 s, on Beam's own job service."""
    service = local_job_service.LocalJobServicer()
    port = service.start_grpc_server(0)
    try:
        pipeline = beam.Pipeline(options=PipelineOptions([
            "--runner=PortableRunner", f"--job_endpoint=localhost:{port}", "--environment_type=LOOPBACK",
            "--job_server_timeout=2"]))
        _ = (pipeline | beam.Create([1, 2, 3]) | "Slowly" >> beam.Map(lambda item: time.sleep(2) or item)
             | "Count" >> beam.Map(lambda _: Metrics.counter("kpr", "done").inc()))
        started = time.monotonic()
        result = jobs.submitted(pipeline)
        jobs.waited(result)
        assert time.monotonic() - started > 4  # past two deadlines
        assert result.state == "DONE"
        assert [counter.committed for counter in result.metrics().query()["counters"]] == [3]
    finally:
        service.stop()


class Expired(grpc.RpcError, grpc.Call):
    """A gRPC stream's error as its deadline passes (``code`` ``DEADLINE_EXCEEDED``), or another status."""

    def __init__(self, status: grpc.StatusCode = grpc.StatusCode.DEADLINE_EXCEEDED) -> None:
        self.status = status

    def code(self) -> grpc.StatusCode:
        return self.status

    def details(self) -> str:
        return "Stream removed"

    def initial_metadata(self) -> None: ...
    def trailing_metadata(self) -> None: ...
    def is_active(self) -> bool: return False
    def time_remaining(self) -> None: ...
    def cancel(self) -> bool: return False
    def add_callback(self, callback) -> bool: return False


def stream(*items, then: BaseException | None = None):
    yield from items
    if then is not None:
        raise then


def test_a_stream_is_opened_again_as_its_deadline_passes_and_not_for_any_other_error():
    reopened = iter([stream(3, then=Expired()), stream(4)])
    assert list(jobs.resumed(stream(1, 2, then=Expired()), lambda: next(reopened))) == [1, 2, 3, 4]
    with pytest.raises(Expired) as gone:
        list(jobs.resumed(stream(1, then=Expired(grpc.StatusCode.UNAVAILABLE)), lambda: stream(2)))
    assert gone.value.code() == grpc.StatusCode.UNAVAILABLE
    ended = threading.Event()
    ended.set()  # the job's states have ended: its messages are not followed again
    assert list(jobs.resumed(stream(1), lambda: stream(2), until=ended)) == [1]
    with pytest.raises(Expired):
        list(jobs.resumed(stream(1, then=Expired()), lambda: stream(2), until=ended))


def test_a_job_service_that_sends_no_state_before_the_deadline_has_stopped_answering():
    """The job service sends a job's state as soon as its stream opens: a stream opened again that ends at its
    deadline with nothing is a service that does not answer, said as one (not followed for ever)."""
    opened = []

    def silent():
        opened.append(1)
        return stream(then=Expired())

    with pytest.raises(Expired):
        list(jobs.resumed(stream(1, then=Expired()), silent, answers_first=True))
    assert opened == [1]
    assert list(jobs.resumed(stream(1, then=Expired()), lambda: stream(2), answers_first=True)) == [1, 2]
