"""A stage that fills the filesystem of OUT: one line (the stage, the filesystem, what it had written, what it
needs, that a rerun resumes) instead of Beam's traceback, and its staged files removed: a rerun starts the stage
afresh anyway, and the stages committed before it are kept.

Where what a command will write is known before it writes it (an index once its vectors are counted, the files
publish copies, an export), more than the free space of the destination's filesystem is refused up front, in one
line (``require_room``); on a remote filesystem the free space is not known and nothing is checked."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from artifacts import fs
from artifacts.errors import InputError, error_chain

# The write errors that say no more can be written where the output goes, and what a stage that met one did: the
# filesystem is full, this user's quota on it is used up, or a file grew past the size limit (ulimit -f, or the
# filesystem's largest file). What to do is the same: make room (or give another --output) and rerun.
NO_ROOM = {errno.ENOSPC: "ran out of disk space", errno.EDQUOT: "ran out of this user's disk quota",
           errno.EFBIG: "wrote a file past the size limit (ulimit -f, or the filesystem's largest file)"}


@dataclass(frozen=True)
class Space:
    """The filesystem of OUT (its mount point; for a remote OUT, the URL's bucket) and its free bytes (None: not
    known, remote)."""

    filesystem: str
    free: int | None


def mount_point(path: str) -> str:
    """The mount point of the local filesystem that holds ``path`` (or would hold it, once created)."""
    current = os.path.realpath(path)
    while not os.path.exists(current):
        current = os.path.dirname(current)
    while not os.path.ismount(current):
        current = os.path.dirname(current)
    return current


def space_of(output: str) -> Space:
    if not fs.is_local(output):
        scheme, _, rest = output.partition("://")
        return Space(f"{scheme}://{rest.split('/', 1)[0]}", None)
    mount = mount_point(output.removeprefix("file://"))
    stats = os.statvfs(mount)
    return Space(mount, stats.f_bavail * stats.f_frsize)


def no_room_in(text: str) -> int | None:
    """The ``NO_ROOM`` errno a text names (as Beam re-raises a worker's OSError: its text alone), None if none."""
    return next((code for code in NO_ROOM if f"[Errno {code}]" in text or os.strerror(code) in text), None)


def mentions_out_of_space(text: str) -> bool:
    return no_room_in(text) is not None


def out_of_space(error: BaseException) -> int | None:
    """The ``NO_ROOM`` errno of ``error`` (or of what it was raised from): an ``OSError``'s, or one its text names
    after Beam re-raised it; None if it is no such error."""
    for current in error_chain(error):
        code = current.errno if isinstance(current, OSError) and current.errno in NO_ROOM else no_room_in(str(current))
        if code is not None:
            return code
    return None


def staged_bytes(staging_root: str) -> int:
    return sum(fs.size(path) for path in fs.list_tree(staging_root))


def disk_full_error(command: str, output: str, staging_root: str, kept_root: str, at_start: Space,
                    kept_at_start: int = 0, code: int = errno.ENOSPC) -> InputError:
    """The one-line error of ``command`` having met the ``NO_ROOM`` error ``code`` writing under ``output``, having
    written its staged files and added to the work it keeps for a rerun (``kept_root``, left: ``kept_at_start``
    bytes of it there before); removes its staged files."""
    written = staged_bytes(staging_root) + max(0, staged_bytes(kept_root) - kept_at_start)
    now = space_of(output)
    fs.delete_tree(staging_root)
    # what other writers took of the free space meanwhile (a shared disk): then the stage may need far less
    others = at_start.free - written - now.free if at_start.free is not None and now.free is not None else 0
    if code != errno.ENOSPC:
        why = "it needs more room than it was given"
    elif at_start.free is None:
        why = "it needs more space than it had"
    elif others > max(written, at_start.free // 10):
        why = (f"other writers took {fs.human_size(others)} of the {fs.human_size(at_start.free)} that were free "
               "when it started")
    else:
        why = f"it needs more than the {fs.human_size(at_start.free)} that were free when it started"
    return InputError(f"{command} {NO_ROOM[code]} on {at_start.filesystem} (the filesystem of {output}) after "
                      f"writing {fs.human_size(written)}; {why}. Its staged files were removed: free some "
                      "space (or give another --output) and rerun the same command to resume")


def no_room_error(command: str, destination: str, flag: str, need: int, purpose: str, space: Space) -> InputError:
    """The one-line error of ``command`` needing ``need`` bytes on the filesystem of ``destination`` (given as
    ``flag``) for ``purpose`` (e.g. "to build the index"), where ``space`` has fewer free."""
    return InputError(f"{command} needs about {fs.human_size(need)} on {space.filesystem} (the filesystem of "
                      f"{destination}) {purpose}, and {fs.human_size(space.free or 0)} is free: free some space (or "
                      f"give another {flag}) and rerun the same command")


def require_room(command: str, destination: str, flag: str, need: int, purpose: str, space: Space) -> None:
    """Refuse (``no_room_error``) ``need`` bytes that ``space`` has not free; nothing when its free space is not
    known (a remote filesystem)."""
    if space.free is not None and need > space.free:
        raise no_room_error(command, destination, flag, need, purpose, space)
