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
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
from apache_beam.runners.portability.fn_api_runner import worker_handlers

from artifacts.errors import InputError, error_chain, first_line
from pipelines.launcher.worker_output import starts_worker_processes

# torch (OpenMP, MKL) and the fast tokenizers (Rayon) read these when a worker process starts.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")
WORKER_FLAGS = ("--direct_num_workers", "--direct_running_mode")
# What Beam's local runner raises when a worker process it was waiting on has gone (killed, crashed): the data
# channel to it closed, or the process's exit seen first.
WORKER_LOST = ("Channel closed prematurely", "Worker subprocess exited with return code")


class WorkerLostError(InputError):
    """A worker process of a local run ended in the middle of its work: one line (raised in the launcher only)."""

    def __init__(self, command: str) -> None:
        super().__init__(f"{command}: a worker process ended in the middle of its work (killed: by the kernel's "
                         "out-of-memory killer when dmesg says so; or crashed); rerun the same command to resume")


def worker_lost(error: BaseException) -> bool:
    """Whether ``error``, or an error that led to it, is Beam's local runner losing a worker process."""
    return any(isinstance(current, RuntimeError) and str(current).startswith(WORKER_LOST)
               for current in error_chain(error))


@contextlib.contextmanager
def lost_workers_fail_their_bundles() -> Iterator[None]:
    """For the block: a worker process that dies fails what the runner asks of it, instead of leaving Beam's local
    runner waiting for the answers for ever. The runner's thread that reads a worker's control stream
    (``ControlConnection._read``) ends when the process dies, leaving unset the answers it was owed, and the runner
    goes on asking the dead process (``push``) for the next bundles: a bundle that expects no more data then waited
    for ever (seen about once in ten kills of a model process mid-stage). Here the reader, as it ends, fails what
    was owed and marks the connection lost, and a request pushed after that fails at once, with ``WORKER_LOST``'s
    message: the stage ends with ``WorkerLostError``'s line."""
    connection = worker_handlers.ControlConnection
    read, push = connection._read, connection.push

    def read_failing_unanswered(self: worker_handlers.ControlConnection) -> None:
        ended: BaseException | None = None
        try:
            read(self)
        except Exception as error:
            ended = error
            raise
        finally:
            self._kpr_lost = RuntimeError(f"{WORKER_LOST[0]}: a worker's control stream ended"
                                          + (f" ({first_line(ended)})" if ended else ""))
            for future in list(self._futures_by_id.values()):
                future.abort(self._kpr_lost)

    def push_failing_when_lost(self: worker_handlers.ControlConnection, request: Any) -> Any:
        future = push(self, request)
        lost = getattr(self, "_kpr_lost", None)
        if future is not None and lost is not None:
            future.abort(lost)
        return future

    connection._read, connection.push = read_failing_unanswered, push_failing_when_lost
    try:
        yield
    finally:
        connection._read, connection.push = read, push


def local_worker_processes(beam_args: Sequence[str]) -> int:
    """How many worker processes the run starts on this machine (0: the workers run in this process, or on a
    remote runner)."""
    if not starts_worker_processes(list(beam_args)):
        return 0
    workers = PipelineOptions(list(beam_args)).view_as(DirectOptions).direct_num_workers or 0
    return workers if workers > 0 else os.cpu_count() or 1


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
