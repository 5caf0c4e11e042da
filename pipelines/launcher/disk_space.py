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

# How an out-of-space error reads once Beam has re-raised a worker's OSError as its own exception.
OUT_OF_SPACE_TEXT = f"[Errno {errno.ENOSPC}]"


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


def mentions_out_of_space(text: str) -> bool:
    return OUT_OF_SPACE_TEXT in text or os.strerror(errno.ENOSPC) in text


def out_of_space(error: BaseException) -> bool:
    """Whether ``error`` (or what it was raised from) is a full disk: an ``OSError`` ENOSPC, or its text after
    Beam re-raised it."""
    return any((isinstance(current, OSError) and current.errno == errno.ENOSPC) or mentions_out_of_space(str(current))
               for current in error_chain(error))


def staged_bytes(staging_root: str) -> int:
    return sum(fs.size(path) for path in fs.list_tree(staging_root))


def disk_full_error(command: str, output: str, staging_root: str, at_start: Space) -> InputError:
    """The one-line error of ``command`` having filled the filesystem of ``output``; removes its staged files."""
    written = staged_bytes(staging_root)
    fs.delete_tree(staging_root)
    need = (f"more than the {fs.human_size(at_start.free)} that were free when it started" if at_start.free is not None
            else "more space than it had")
    return InputError(f"{command} ran out of disk space on {at_start.filesystem} (the filesystem of {output}) after "
                      f"writing {fs.human_size(written)}; it needs {need}. Its staged files were removed: free some "
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
