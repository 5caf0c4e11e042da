"""An exclusive lock on OUT for the commands that write it (`all` and every stage).

The lock is the file OUT/.lock holding the host, pid, command and start time of its holder. On a local OUT it is
created atomically (O_CREAT | O_EXCL); a lock left by a dead process on this host (its pid runs no more, or names a
process started since: reused after a reboot or a container's restart) is taken over, under an
exclusive ``flock`` of the stale file so that of several runs taking it over at once only one wins. On a Beam
filesystem URL (gs://, s3://, ...) the lock is best effort: created only if absent, which two runs starting in
the same instant can both pass, and a stale lock there is never taken over (its host may be another machine):
remove OUT/.lock by hand once no run writes OUT.
"""

from __future__ import annotations

import calendar
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from artifacts import fs, layout
from artifacts.errors import InputError

LOCK_NAME = layout.LOCK
# How long an empty lock file is taken for one being written: a run writes it right after creating it.
UNWRITTEN_SECONDS = 10.0
# How much later than its lock a lock's pid may have started and still be its holder: the boot time a process's
# start is reckoned from moves with the clock's adjustments.
CLOCK_SLACK_SECONDS = 60.0


@dataclass(frozen=True)
class LockInfo:
    host: str
    pid: int
    command: str
    started: str

    def mine(self) -> bool:
        """Whether this process holds the lock: its host and pid, and not a lock taken before this process started
        (one whose run had this pid before a container's restart)."""
        return self.host == socket.gethostname() and self.pid == os.getpid() and not self.pid_reused()

    def pid_reused(self) -> bool:
        """Whether the process of the lock's pid started after the lock was taken (the pid names another process)."""
        started, taken = process_start_time(self.pid), lock_time(self.started)
        return started is not None and taken is not None and started > taken + CLOCK_SLACK_SECONDS

    def stale_reason(self) -> str | None:
        """Why no process holds the lock, when it was taken on this host: its pid runs no more, or names a process
        started after the lock was taken (the pid was reused); None when its holder may run."""
        if self.host != socket.gethostname():
            return None
        if not pid_alive(self.pid):
            return "no longer running"
        if self.pid_reused():
            return "the pid is another process's now, started after the lock was taken"
        return None

    def stale(self) -> bool:
        return self.stale_reason() is not None

    def writing(self, output: str) -> str:
        """What the holder does to ``output``, in the words every reader of a run says it."""
        return (f"{output} is being written by pid {self.pid} on {self.host} (command {self.command}, "
                f"since {self.started})")


class OutputLocked(InputError):
    """OUT is locked by another run."""


def pid_alive(pid: int) -> bool:
    """Whether a process of this host has ``pid``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def process_start_time(pid: int) -> float | None:
    """When the process ``pid`` of this host started, in seconds since the epoch (Linux's /proc); None elsewhere."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            ticks = int(handle.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime; the name may hold ")"
        with open("/proc/stat", encoding="utf-8") as handle:
            boot = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def lock_time(started: str) -> float | None:
    """A lock's ``started`` in seconds since the epoch; None when it is no time ``current`` writes."""
    try:
        return calendar.timegm(time.strptime(started, "%Y-%m-%dT%H:%M:%SZ"))
    except (TypeError, ValueError):
        return None


def current(command: str) -> LockInfo:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return LockInfo(socket.gethostname(), os.getpid(), command, started)


def read(output: str) -> LockInfo | None:
    """The lock on ``output``, or None when there is none (or it is unreadable, e.g. being written)."""
    try:
        return _parsed(fs.read_bytes(fs.join(output, LOCK_NAME)))
    except OSError:
        return None


def _create(path: str, info: LockInfo) -> bool:
    """Create the lock file; False when it already exists."""
    data = json.dumps(asdict(info)).encode("utf-8")
    if not fs.is_local(path):
        if fs.exists(path):
            return False
        fs.write_bytes(path, data)
        return True
    try:
        descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
    except OSError as error:  # a full disk: no empty lock left for the next run to wait on
        os.unlink(path)
        raise InputError(f"{path}: the run's lock could not be written ({error.strerror or error}): free some space "
                         "(or fix what refused the write) and run the command again") from error
    return True


def _parsed(data: bytes) -> LockInfo | None:
    try:
        info = LockInfo(**json.loads(data.decode("utf-8")))
    except (ValueError, TypeError):
        return None
    return info if type(info.pid) is int and 0 < info.pid < 2**31 else None  # a pid os.kill can test


def _take_over(path: str) -> bool:
    """Remove the local lock file ``path`` if a dead process of this host holds it; False when it is gone or live.

    Under an exclusive flock of the file, it is removed only if ``path`` still names the file locked and that
    file still holds a stale lock: another run that took it over first has removed it (another file, or none, at
    ``path`` now) or written its own (live) lock there, and this run leaves both alone.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    with os.fdopen(descriptor, "rb") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            same_file = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            return False
        data = handle.read()
        holder = _parsed(data)
        stale = holder.stale() if holder is not None else _left_empty(data, handle.fileno())
        if not (same_file and stale):
            return False
        os.remove(path)
        return True


def _left_empty(data: bytes, descriptor: int) -> bool:
    """Whether a lock file is empty and has been for ``UNWRITTEN_SECONDS``: its run was killed between creating it
    and writing it (microseconds apart), and no run holds it."""
    return not data and time.time() - os.fstat(descriptor).st_mtime > UNWRITTEN_SECONDS


def _is_empty(path: str) -> bool:
    """Whether the local file ``path`` is there and empty."""
    try:
        return os.stat(path).st_size == 0
    except FileNotFoundError:
        return False


def acquire(output: str, command: str) -> bool:
    """Lock ``output`` for this process. Returns False when this process already holds it (nested use)."""
    path = fs.join(output, LOCK_NAME)
    fs.require_file_target(path)  # a directory there reads as no lock, and a takeover would open it
    info = current(command)
    for _ in range(3):  # another try after a stale lock was removed, by this run or by another
        if _create(path, info):
            return True
        holder = read(output)
        if holder is not None and holder.mine():
            return False
        reason = holder.stale_reason() if holder is not None else None
        if reason is not None and fs.is_local(path):
            if _take_over(path):
                print(f"taking over the stale lock of pid {holder.pid} ({reason}) on {output}", file=sys.stderr)
            continue
        if holder is None and fs.is_local(path) and _take_over(path):
            print(f"taking over the empty lock on {output} (its run was killed as it took it)", file=sys.stderr)
            continue
        if holder is None and fs.is_local(path) and _is_empty(path):
            raise OutputLocked(f"{output} is in use: {path} is empty: a run is writing it, or was killed as it took "
                               f"it (an empty lock is taken over once it is {UNWRITTEN_SECONDS:.0f} s old: rerun "
                               "then)")
        if holder is None:
            raise OutputLocked(f"{output} is in use: {path} exists but cannot be read; remove it if no command "
                               f"writes {output}")
        raise OutputLocked(f"{output} is in use by pid {holder.pid} on {holder.host} since {holder.started} "
                           f"(command {holder.command}); remove {path} if that command no longer writes {output}")
    raise OutputLocked(f"{output} is in use: could not take the lock {path}")


def live_writer(output: str) -> LockInfo | None:
    """Who holds the lock on ``output`` when another live process does (a stage committing into it), else None."""
    holder = read(output)
    return holder if holder is not None and not holder.mine() and not holder.stale() else None


def release(output: str) -> None:
    holder = read(output)
    if holder is not None and holder.mine():
        fs.delete_file(fs.join(output, LOCK_NAME))


@contextmanager
def hold(output: str, command: str) -> Iterator[None]:
    """Hold the lock on ``output`` for the block (re-entrant within one process: the outer holder releases)."""
    fs.mkdirs(output)
    taken = acquire(output, command)
    try:
        yield
    finally:
        if taken:
            release(output)
