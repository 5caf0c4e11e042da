"""A pipeline submitted to a runner that runs it elsewhere (a job service and its workers, a cluster): submitted,
waited for, cancelled at Ctrl-C (it would run on, its workers held, and a rerun would do its work a second time
beside it), and its failures said in one line, as a local run's are. A local runner has run the pipeline to its
end once it is submitted: waiting for it returns at once."""

from __future__ import annotations

import contextlib
import fcntl
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import apache_beam as beam
import grpc
from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, SetupOptions
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.runners.portability import portable_runner

from artifacts.errors import InputError, input_error_message

MAX_CAUSE_CHARS = 300  # of the job's last error line, in the one line that says it failed
# A gRPC call's error as its repr says it: "status = StatusCode.UNAVAILABLE", then "details = "..."".
GRPC_STATUS = re.compile(r'^\s*status = (StatusCode\.\w+)\s*\n\s*details = "(.*)"\s*$', re.MULTILINE)
MESSAGE_THREAD = "wait_until_finish_read"  # the thread in which Beam's portable runner reads the job's messages


T = TypeVar("T")


class JobFailedError(InputError):
    """The runner ran the job and it failed on its workers (not one of our input errors)."""


def submitted(pipeline: beam.Pipeline) -> Any:
    """``pipeline.run()``; a job service that does not answer within --job_server_timeout as one line. A job
    submitted to a job service is followed for as long as it runs (``follow_past_deadlines``)."""
    options = pipeline.options.view_as(PortableOptions)
    try:
        result = pipeline.run()
    except grpc.FutureTimeoutError as error:
        raise InputError(f"no job service answered at --job_endpoint {options.job_endpoint} within "
                         f"{options.job_server_timeout} s (--job_server_timeout): start it, or check the address and "
                         "the network") from error
    if isinstance(result, portable_runner.PipelineResult):
        follow_past_deadlines(result, options.job_server_timeout)
    return result


def follow_past_deadlines(result: portable_runner.PipelineResult, timeout: float) -> None:
    """Beam opens the streams that follow a submitted job's state and messages with --job_server_timeout as their
    deadline (apache/beam#35867): a job that ran longer (5 minutes by default: any real dump) ended the wait as if the
    job service had gone, the job left running beside a rerun (and a LOOPBACK environment's workers stopped). Each
    stream is opened again as its deadline passes; a job service that then sends no state within ``timeout`` has
    stopped answering."""
    service, job = result._job_service, result._job_id  # Beam's result exposes neither
    first_states, first_messages = result._state_stream, result._message_stream
    states_ended = threading.Event()

    def states() -> Iterator[Any]:
        try:
            yield from resumed(first_states, lambda: service.GetStateStream(
                beam_job_api_pb2.GetJobStateRequest(job_id=job), timeout=timeout), answers_first=True)
        finally:
            states_ended.set()

    messages = resumed(first_messages, lambda: service.GetMessageStream(
        beam_job_api_pb2.JobMessagesRequest(job_id=job), timeout=timeout), until=states_ended)
    result._state_stream, result._message_stream = states(), messages


def resumed(first: Iterable[T], reopened: Callable[[], Iterable[T]], answers_first: bool = False,
            until: threading.Event | None = None) -> Iterator[T]:
    """What the stream ``first`` gives, then, each time a stream's deadline passes, what ``reopened()`` gives,
    until one ends (or ``until`` is set). With ``answers_first``, a stream opened again that gives nothing before
    its deadline is the job service not answering: its error is raised."""
    stream: Iterable[T] = first
    while True:
        answered = False
        try:
            for item in stream:
                answered = True
                yield item
            return
        except grpc.RpcError as error:
            stream_expired = isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            if not stream_expired or (answers_first and not answered and stream is not first) or (
                    until is not None and until.is_set()):
                raise
        stream = reopened()


@contextlib.contextmanager
def setup_file_held(options: PipelineOptions) -> Iterator[None]:
    """Held while a runner submits a job whose workers get this project from ``--setup_file``: Beam builds its
    package in the setup file's folder (setuptools writes the egg-info there), and two commands started at once
    from one checkout built over each other (Beam's fallback build saved them, its errors printed on a run that
    succeeded). A lock on the setup file itself, which every run of this project takes."""
    setup_file = options.view_as(SetupOptions).setup_file
    if not setup_file:
        yield
        return
    with open(setup_file, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # let go as the file is closed
        yield


def waited(result: Any) -> None:
    """Wait for the end of the job of ``result``. Ctrl-C cancels it; a failure that is not one of our input errors
    (those are said as they are, on the runner's workers) is a JobFailedError naming the job's last error line."""
    if isinstance(result, portable_runner.PipelineResult):  # its thread reading the job's messages may end with it
        hide_job_stream_errors()
    try:
        result.wait_until_finish()
    except KeyboardInterrupt:
        cancel(result)
        raise
    except grpc.RpcError as error:  # the job service went away (stopped, its machine lost, the network)
        raise InputError(f"the job service stopped answering ({rpc_summary(error)}): the job may have stopped with "
                         "it; rerun the same command once it runs again to resume") from error
    except RuntimeError as error:
        if (message := input_error_message(error)) is not None:  # where: a path this machine has, they may lack
            raise InputError(f"{message} (on the runner's workers)") from error
        raise JobFailedError(f"the runner's job failed: {last_line(str(error))} (the whole error is in the job's "
                             "log, its workers', and printed here with --verbose)") from error


def cancel(result: Any) -> None:
    """Ask the runner to cancel the job of ``result``; a runner that cannot (one that already ended it, a job
    service gone) is left as it is: the command is ending."""
    with contextlib.suppress(Exception):
        result.cancel()


def last_line(text: str) -> str:
    """The last line of ``text`` that holds a word or a number (a traceback's exception), cut to MAX_CAUSE_CHARS;
    of a gRPC call's error (a worker pool that does not answer), whose repr ends in its debug string and a ``>``,
    its status and details."""
    lines = [line.strip() for line in text.splitlines() if any(character.isalnum() for character in line)]
    line = lines[-1] if lines else "no message"
    calls = GRPC_STATUS.findall(text) if line.startswith("debug_error_string =") else []
    if calls:
        line = "{}: {}".format(*calls[-1])
    return line if len(line) <= MAX_CAUSE_CHARS else f"{line[:MAX_CAUSE_CHARS]}..."


def rpc_summary(error: grpc.RpcError) -> str:
    """``StatusCode.UNAVAILABLE: Stream removed`` of a gRPC error (its type's name when it has no status)."""
    if isinstance(error, grpc.Call):
        return f"{error.code()}: {error.details()}"
    return type(error).__name__


class JobStreamErrorsHidden:
    """A ``threading.excepthook``: the traceback of Beam's thread reading a job's messages, which ends with the job
    service's stream (said in one line by ``waited``), is not printed; any other thread's goes to the hook that was
    there before (``then``: Python's own, or the one a local run sets while it runs, ``local_workers``)."""

    def __init__(self, then: Callable[[threading.ExceptHookArgs], object]) -> None:
        self.then = then

    def __call__(self, args: threading.ExceptHookArgs) -> None:
        if args.thread is not None and args.thread.name == MESSAGE_THREAD and isinstance(args.exc_value,
                                                                                          grpc.RpcError):
            return
        self.then(args)


def hide_job_stream_errors() -> None:
    """Put ``JobStreamErrorsHidden`` before the thread hook there is (once: it stays for the process's jobs)."""
    if not isinstance(threading.excepthook, JobStreamErrorsHidden):
        threading.excepthook = JobStreamErrorsHidden(threading.excepthook)
