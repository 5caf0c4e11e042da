"""The worker processes a local run starts on this machine, and the CPU threads each of them gets.

With ``--direct_running_mode=multi_processing --direct_num_workers=N`` the DirectRunner starts N Python worker
processes on this machine. Each would size its thread pools for the whole machine (torch's intra-op threads,
OpenMP/MKL, the fast tokenizers' Rayon pool): N workers on C cores would run N x C threads and fight over the
cores (8 workers on a 16-core GPU server: 128 compute threads). Each worker gets C // N threads instead, through
the environment it inherits, unless the user set those variables. A step that has less work than workers (an index
of one shard) runs with fewer, in this process when one: a worker process costs seconds to start (it imports torch
and the model code).

Remote runners (Dataflow, Flink, Spark) size their own workers: nothing here applies to them.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grpc
from apache_beam.runners.portability.fn_api_runner import worker_handlers

from artifacts.errors import InputError, error_chain, first_line
from pipelines.launcher.worker_output import starts_worker_processes
from transforms.common.progress import direct_workers

# torch (OpenMP, MKL) and the fast tokenizers (Rayon) read these when a worker process starts.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")
WORKER_FLAGS = ("--direct_num_workers", "--direct_running_mode")
# What Beam's local runner raises when a worker process it was waiting on has gone (killed, crashed): the data
# channel to it closed, or the process's exit seen first.
WORKER_LOST = ("Channel closed prematurely", "Worker subprocess exited with return code")
EXIT_STATUS = re.compile(re.escape(WORKER_LOST[1]) + r" (-?\d+)")
SHELL_SIGNALLED = 128  # Beam starts a worker through the shell, which reports a child killed by signal N as 128 + N
NOTICE_AFTER_S = 10.0  # a stage still running this long after a worker's work was lost says so (lost_worker_noticed)


class WorkerLostError(InputError):
    """A worker process of a local run ended in the middle of its work: one line (raised in the launcher only),
    which says how when its exit status is known (``statuses``: those of the workers lost, as Beam saw them)."""

    def __init__(self, command: str, statuses: Sequence[int] = ()) -> None:
        super().__init__(f"{command}: {lost_worker_cause(statuses[0] if statuses else None)}")


def lost_worker_cause(status: int | None) -> str:
    """What the line of a lost worker says of its exit ``status`` (None: not known) and what to do."""
    what, advice = how_the_worker_ended(status)
    return f"{what}; {advice}"


def how_the_worker_ended(status: int | None) -> tuple[str, str]:
    """``lost_worker_cause``'s two parts: how a worker of exit ``status`` ended, and what to do."""
    resume, oom = "rerun the same command to resume", "by the kernel's out-of-memory killer when dmesg says so"
    if status is None:
        return f"a worker process ended in the middle of its work (killed: {oom}; or crashed)", resume
    ended_by = signal_of(status)
    if ended_by == signal.SIGKILL:
        return f"a worker process was killed (SIGKILL: {oom}) in the middle of its work", resume
    if ended_by is not None:
        return f"a worker process ended by {signal_name(ended_by)} in the middle of its work", resume
    return (f"a worker process exited with status {status} before its work was done (its own lines above say why)",
            f"{resume} once that is fixed")


def signal_of(status: int) -> int | None:
    """The signal that ended a worker of exit ``status`` (Popen's -N, or the shell's 128 + N), if one did."""
    if status < 0:
        return -status
    return status - SHELL_SIGNALLED if status > SHELL_SIGNALLED else None


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_status(error: BaseException) -> int | None:
    """The exit status in Beam's "Worker subprocess exited with return code N" of ``error``'s chain, if any."""
    for current in error_chain(error):
        if found := EXIT_STATUS.match(str(current)):
            return int(found.group(1))
    return None


def worker_lost(error: BaseException) -> bool:
    """Whether ``error``, or an error that led to it, is Beam's local runner losing a worker process."""
    return any(isinstance(current, RuntimeError) and str(current).startswith(WORKER_LOST)
               for current in error_chain(error))


def stream_broken(error: BaseException) -> bool:
    """Whether ``error``, or an error that led to it, is a worker lost (``worker_lost``) or a gRPC stream that
    broke: what Beam's threads here raise and log as a worker process they talk to goes."""
    return worker_lost(error) or any(isinstance(current, grpc.RpcError) for current in error_chain(error))


@contextlib.contextmanager
def lost_workers_handled(command: str, hold: bool = True, notice_after_s: float = NOTICE_AFTER_S) -> Iterator[None]:
    """Around a stage's execution (``command``: its command-line name): a worker process that is lost fails the
    bundles it was asked for (``lost_workers_fail_their_bundles``) and the stage with ``WorkerLostError``'s line,
    which says how it ended; with ``hold`` (a local run without --verbose) the tracebacks Beam's threads print as
    they lose it are held (``lost_worker_tracebacks_held``). In this order: a thread's error goes to the first's
    hook, which fails the worker's bundles, then to the second's. The block's own one-line errors (a full disk, a
    GPU out of memory) stay as they are. The stage's error comes once its other workers have ended what they hold
    (a GPU stage's other model processes encode their shares: hours on a machine of several GPUs); a block still
    running ``notice_after_s`` after a lost worker's work was failed says so at once (``lost_worker_noticed``)."""
    held = lost_worker_tracebacks_held(command) if hold else contextlib.nullcontext()
    statuses: list[int] = []
    with (held, lost_worker_noticed(command, statuses, notice_after_s) as noticed,
          lost_workers_fail_their_bundles(statuses, noticed)):
        try:
            yield
        except Exception as error:
            if worker_lost(error) and not isinstance(error, InputError):
                raise WorkerLostError(command, statuses) from error
            raise


@contextlib.contextmanager
def lost_worker_noticed(command: str, statuses: Sequence[int], after_s: float) -> Iterator[Callable[[], None]]:
    """For the block: yields what to call as a lost worker's work is failed (from any thread, any number of times);
    if the block is still running ``after_s`` after the first call, one warning line says which worker was lost
    (the first of ``statuses``, the exit statuses seen by then) and that the stage stops once the rest has
    ended. A block that ends sooner says nothing here (its own error says it)."""
    timer = threading.Timer(after_s, lambda: print(lost_worker_notice(command, statuses), file=sys.stderr,
                                                   flush=True))
    timer.daemon = True
    lock = threading.Lock()

    def failed() -> None:
        with lock:
            if timer.ident is None:  # not started yet (a thread starts once)
                timer.start()

    try:
        yield failed
    finally:
        timer.cancel()  # a timer started after this never fires: it sees itself cancelled


def lost_worker_notice(command: str, statuses: Sequence[int]) -> str:
    """The warning line of ``lost_worker_noticed``."""
    what, advice = how_the_worker_ended(statuses[0] if statuses else None)
    return (f"warning: {command}: {what}; the stage stops with an error once its other workers have ended the work "
            f"they hold (Ctrl-C stops it now); {advice}")


@contextlib.contextmanager
def lost_workers_fail_their_bundles(statuses: list[int] | None = None,
                                    failed: Callable[[], None] = lambda: None) -> Iterator[list[int]]:
    """For the block: a worker process that dies fails what the runner asks of it, instead of leaving Beam's local
    runner waiting for the answers for ever. Beam's runner learns of a worker's end in two threads, neither of which
    fails its bundles: the one that reads the worker's control stream (``ControlConnection._read``), which ends
    when the process dies and leaves unset the answers it was owed (the runner then goes on asking the dead
    process, ``push``, for the next bundles: a bundle that expects no more data waited for ever, about once in ten
    kills of a model process mid-stage), and the one that waits for the process's exit (``run_worker``), which
    raises into nothing, the only sign of a worker that died before it connected (its requests queued for ever:
    seen killing a parse worker as it started). Here either one, as it ends, fails what was owed and marks the
    connection lost, and a request pushed after that fails at once, with ``WORKER_LOST``'s message: the stage ends
    with ``WorkerLostError``'s line. A worker that connects after the runner closed it (the stage failed, another
    worker lost, as this one still started) is told at once that there is no more (Beam's ``close`` tells only a
    worker connected by then: this one's control stream waited for ever, and the runner for its exit). Yields
    ``statuses`` (a new list if None), to which the exit statuses of the workers lost are added as their exits are
    seen: the one sign of how a worker ended, there before the stage's error (Beam's runner joins the thread that
    awaited a worker's exit as it closes its workers, before its error leaves the pipeline). ``failed`` is called
    each time something a lost worker was asked for is failed."""
    connection, handler = worker_handlers.ControlConnection, worker_handlers.SubprocessSdkWorkerHandler
    read, push, close, start_worker = connection._read, connection.push, connection.close, handler.start_worker
    thread_hook = threading.excepthook
    exits: dict[threading.Thread, worker_handlers.SubprocessSdkWorkerHandler] = {}  # by the thread awaiting its exit
    statuses = [] if statuses is None else statuses

    def read_failing_unanswered(self: worker_handlers.ControlConnection) -> None:
        ended: BaseException | None = None
        try:
            read(self)
        except Exception as error:
            ended = error
            raise
        finally:
            if lose(self, RuntimeError(f"{WORKER_LOST[0]}: a worker's control stream ended"
                                       + (f" ({first_line(ended)})" if ended else ""))):
                failed()

    def push_failing_when_lost(self: worker_handlers.ControlConnection, request: Any) -> Any:
        future = push(self, request)
        lost = getattr(self, "_kpr_lost", None)
        if future is not None and lost is not None:
            future.abort(lost)
            failed()
        return future

    def close_ending_a_late_stream(self: worker_handlers.ControlConnection) -> None:
        if self._state == worker_handlers.BeamFnControlServicer.UNSTARTED_STATE:  # its stream's first request
            self._push_queue.put(worker_handlers.BeamFnControlServicer._DONE_MARKER)
        close(self)

    def start_watched_worker(self: worker_handlers.SubprocessSdkWorkerHandler) -> None:
        start_worker(self)
        exits[self.worker_thread] = self

    def exit_fails_its_bundles(args: Any) -> None:  # threading.ExceptHookArgs
        lost = exits.get(args.thread)
        if lost is not None and args.exc_value is not None and worker_lost(args.exc_value):
            if (status := exit_status(args.exc_value)) is not None:
                statuses.append(status)
            if lose(lost.control_conn, args.exc_value):
                failed()
            # As the reader of its data stream marks it when the stream ends: the bundle's wait for the worker's
            # output then fails (``input_elements`` checks it; a failed answer it does not see).
            lost.data_conn._closed = True
        thread_hook(args)

    connection._read, connection.push, connection.close, handler.start_worker = (
        read_failing_unanswered, push_failing_when_lost, close_ending_a_late_stream, start_watched_worker)
    threading.excepthook = exit_fails_its_bundles
    try:
        yield statuses
    finally:
        connection._read, connection.push, connection.close, handler.start_worker = read, push, close, start_worker
        threading.excepthook = thread_hook


def lose(connection: worker_handlers.ControlConnection, error: BaseException) -> bool:
    """Mark ``connection``'s worker lost with ``error``: what it owes fails with it, and so will what is asked
    of it later (``lost_workers_fail_their_bundles``); whether it owed anything. Beam's ``ControlConnection.abort``
    but for the mark, and for iterating a copy: the runner's threads may push while this runs in another."""
    connection._kpr_lost = error
    owed = list(connection._futures_by_id.values())
    for future in owed:
        future.abort(error)
    return bool(owed)


@contextlib.contextmanager
def lost_worker_tracebacks_held(command: str) -> Iterator[None]:
    """For the block: the tracebacks that Beam's threads here print as a worker process goes (its streams' readers,
    the thread that waited for its exit, the closing of its handler: ~140 lines, within milliseconds of the loss,
    in threads that learn of it before anything here can) are held, not printed. The block's ``WorkerLostError``
    says it in one line (and Ctrl-C in its own); a block that ends well lost a worker that owed nothing (idle after
    its last bundle), and gets one warning line; a block that ends in any other error gets them printed as they
    came. What the worker process itself printed as it ended (a crash's own lines) passes as it comes."""
    held_records: list[logging.LogRecord] = []
    held_errors: list[Any] = []  # threading.ExceptHookArgs
    lock = threading.Lock()
    thread_hook = threading.excepthook
    handlers = list(logging.getLogger().handlers)

    def hold_thread_error(args: Any) -> None:
        if args.exc_value is None or not stream_broken(args.exc_value):
            thread_hook(args)
            return
        with lock:
            held_errors.append(args)

    def hold_record(record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None or not stream_broken(error):
            return True
        with lock:
            held_records.append(record)
        return False

    threading.excepthook = hold_thread_error
    for handler in handlers:
        handler.addFilter(hold_record)
    said, failed = False, False
    try:
        yield
    except (WorkerLostError, KeyboardInterrupt):
        said = True
        raise
    except BaseException:
        failed = True
        raise
    finally:
        threading.excepthook = thread_hook
        for handler in handlers:
            handler.removeFilter(hold_record)
        with lock:
            if failed:
                for record in held_records:
                    logging.getLogger(record.name).handle(record)
                for args in held_errors:
                    thread_hook(args)
            elif not said and (held_records or held_errors):
                print(f"warning: {command}: a worker process ended during the stage (killed or crashed); all of "
                      "the stage's work was done all the same", file=sys.stderr)


def local_worker_processes(beam_args: Sequence[str]) -> int:
    """How many worker processes the run starts on this machine (0: the workers run in this process, or on a
    remote runner)."""
    return direct_workers(beam_args) if starts_worker_processes(list(beam_args)) else 0


def threads_per_worker(workers: int, cpus: int) -> int:
    """CPU threads for each of ``workers`` processes sharing ``cpus`` cores: at least one."""
    return max(1, cpus // max(1, workers))


def worker_thread_variables(beam_args: Sequence[str], cpus: int, environment: Mapping[str, str]) -> dict[str, str]:
    """The thread-count variables to set for the worker processes of this run, which inherit them (none the user
    set already)."""
    workers = local_worker_processes(beam_args)
    if workers <= 1:
        return {}
    threads = str(threads_per_worker(workers, cpus))
    return {name: threads for name in THREAD_VARIABLES if name not in environment}


def without_worker_flags(beam_args: Sequence[str]) -> list[str]:
    """``beam_args`` without the DirectRunner's worker flags (``--flag=value`` or ``--flag value``)."""
    kept: list[str] = []
    skip_value = False
    for arg in beam_args:
        if skip_value:
            skip_value = False
        elif arg in WORKER_FLAGS:
            skip_value = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in WORKER_FLAGS)):
            kept.append(arg)
    return kept


def at_most_workers(beam_args: Sequence[str], count: int) -> tuple[str, ...]:
    """``beam_args`` for a step with ``count`` independent pieces of work: at most ``count`` local worker processes,
    none (this process) for one. Unchanged for remote runners and runs that already start no more."""
    workers = local_worker_processes(beam_args)
    if workers <= max(1, count):
        return tuple(beam_args)
    kept = without_worker_flags(beam_args)
    if count <= 1:
        return tuple(kept)
    return (*kept, "--direct_running_mode=multi_processing", f"--direct_num_workers={count}")
