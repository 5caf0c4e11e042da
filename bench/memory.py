"""Memory and CPU of a whole process tree (a stage's child process and the Beam workers it starts), from /proc.

``ProcessTreeSampler`` reads /proc every ``every`` seconds in a thread: the summed RSS of the root and all its
descendants (its peak is the figure a machine must hold) and each process's CPU time as last seen. Linux only.
``run_measured`` runs one command under it and returns wall time, CPU seconds and peak tree RSS.

    with ProcessTreeSampler(process.pid) as sampler:
        process.wait()
    sampler.peak_rss_bytes, sampler.cpu_seconds
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessStat:
    """The fields of /proc/PID/stat a tree sample needs."""

    pid: int
    parent: int
    started: int  # clock ticks after boot: tells a reused pid from the process it replaced
    cpu_ticks: int  # user + system time of the process itself
    rss_bytes: int


def read_stat(pid: int) -> ProcessStat | None:
    """/proc/PID/stat of one process, or None if it has exited."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces and parentheses
    # fields[0] is field 3 (state): ppid is field 4, utime/stime 14/15, starttime 22, rss 24 (in pages)
    return ProcessStat(pid, int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]),
                       int(fields[21]) * _PAGE_BYTES)


def high_water_rss(pid: int) -> int:
    """VmHWM of one process (bytes): its peak RSS since its last exec, 0 if it has exited. Unlike the
    ``ru_maxrss`` of a child, it does not start from the RSS of the process that forked it."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return 0
    line = next((line for line in text.splitlines() if line.startswith("VmHWM:")), "VmHWM: 0 kB")
    return int(line.split()[1]) * 1024


def all_stats() -> list[ProcessStat]:
    """/proc/PID/stat of every process visible now."""
    stats = (read_stat(int(name)) for name in os.listdir("/proc") if name.isdigit())
    return [stat for stat in stats if stat is not None]


def tree_of(root: int, stats: Sequence[ProcessStat], known: set[tuple[int, int]]) -> list[ProcessStat]:
    """The processes of ``stats`` in the tree under ``root`` (the root included): descendants by parent pid, and
    processes seen in the tree before (``known``: (pid, start time)) even if their parent has exited since."""
    children: dict[int, list[ProcessStat]] = {}
    for stat in stats:
        children.setdefault(stat.parent, []).append(stat)
    tree = [stat for stat in stats if stat.pid == root or (stat.pid, stat.started) in known]
    seen = {stat.pid for stat in tree}
    index = 0
    while index < len(tree):
        for child in children.get(tree[index].pid, []):
            if child.pid not in seen:
                seen.add(child.pid)
                tree.append(child)
        index += 1
    return tree


class ProcessTreeSampler:
    """Peak summed RSS and CPU seconds of process ``root`` and all its descendants, sampled every ``every`` s."""

    def __init__(self, root: int, every: float = 0.1) -> None:
        self.root, self.every = root, every
        self.peak_rss_bytes = 0
        self.largest_process_bytes = 0  # the highest VmHWM of a single process of the tree
        self.most_processes = 0
        self._cpu_ticks: dict[tuple[int, int], int] = {}  # last seen CPU time of every process of the tree
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)

    def sample(self) -> int:
        """One reading: the tree's summed RSS now (bytes); updates the peak and the CPU times."""
        tree = tree_of(self.root, all_stats(), set(self._cpu_ticks))
        for stat in tree:
            self._cpu_ticks[(stat.pid, stat.started)] = stat.cpu_ticks
        rss = sum(stat.rss_bytes for stat in tree)
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        highest = max((high_water_rss(stat.pid) for stat in tree), default=0)
        self.largest_process_bytes = max(self.largest_process_bytes, highest)
        self.most_processes = max(self.most_processes, len(tree))
        return rss

    @property
    def cpu_seconds(self) -> float:
        """CPU seconds of every process seen in the tree, as last sampled (up to ``every`` s short per process)."""
        return sum(self._cpu_ticks.values()) / _TICKS

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> ProcessTreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Measured:
    """One command run under a ``ProcessTreeSampler``."""

    returncode: int
    wall_s: float
    cpu_s: float
    peak_rss_bytes: int
    processes: int  # the most processes the tree held at once
    max_process_rss_bytes: int  # the peak RSS of the largest single process of the tree (VmHWM)


@dataclass(frozen=True)
class Exit:
    """How a child ended: its exit code and the CPU seconds of it and its waited-for descendants."""

    returncode: int
    cpu_s: float


def exited(process: subprocess.Popen, status: int, usage: resource.struct_rusage) -> Exit:
    """``wait4``'s figures for ``process`` (its exit code recorded on it, as ``Popen.wait`` would). Not its
    ``ru_maxrss``: Linux counts in it the RSS of this process at the fork, so it is never below ours."""
    process.returncode = os.waitstatus_to_exitcode(status)
    return Exit(process.returncode, usage.ru_utime + usage.ru_stime)


def waited(process: subprocess.Popen, timeout_s: float | None, every: float = 0.05) -> Exit:
    """How ``process`` (started in a session of its own) ended, from ``wait4``; its whole process group is killed
    when it runs past ``timeout_s`` (exit code -9) or when this process is interrupted."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                return exited(process, status, usage)
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(process.args, timeout_s)
            time.sleep(every)
    except BaseException as error:
        os.killpg(process.pid, signal.SIGKILL)
        killed = exited(process, *os.wait4(process.pid, 0)[1:])
        if isinstance(error, subprocess.TimeoutExpired):
            return killed
        raise


def run_measured(command: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, every: float = 0.1, timeout_s: float | None = None) -> Measured:
    """Run ``command`` (stdout and stderr to ``log``) and measure its process tree. CPU seconds: the larger of
    the sampled tree's and the kernel's count for the child and its waited-for descendants (exact, but blind
    to any process that its parent did not wait for). Peak RSS: the sampled sum, and at least the largest process's
    own peak (VmHWM: a peak shorter than ``every`` falls between two sums, not out of a high-water mark)."""
    started = time.perf_counter()
    with log.open("wb") as output:
        process = subprocess.Popen(list(command), stdout=output, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                   start_new_session=True)
        with ProcessTreeSampler(process.pid, every) as sampler:
            exit_ = waited(process, timeout_s)
    wall = time.perf_counter() - started
    return Measured(exit_.returncode, wall, max(sampler.cpu_seconds, exit_.cpu_s),
                    max(sampler.peak_rss_bytes, sampler.largest_process_bytes), sampler.most_processes,
                    sampler.largest_process_bytes)
