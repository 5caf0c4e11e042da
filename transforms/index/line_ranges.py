"""Byte ranges of a text file aligned on line starts, so that many workers read one big file, each its own lines,
with exact line numbers.

Pure functions only. A range owns the lines that START at a byte offset in [start, end): a reader seeks to
``start - 1`` and skips the rest of the line it lands in, then reads lines while they start before ``end``. Every
line belongs to exactly one range, whatever the range size. A first pass counts the lines of each range; prefix
sums over a file's ranges give each range the number of its first line. A compressed file cannot be read from
the middle: it is one range, read from its start by one worker.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import BinaryIO

MAX_RANGE_BYTES = 64 << 20  # a range of a big file: about a minute of reading and parsing for one worker
MIN_RANGE_BYTES = 1 << 20  # smaller ranges cost more in scheduling than they save
RANGES_PER_FILE = 64  # a file is cut into about this many ranges (within the bounds above): even a small corpus
# spreads over several workers


@dataclass(frozen=True)
class LineRange:
    """The lines of ``path`` that start at a byte offset in [start, end). ``compressed``: the whole file, read from
    its start. ``first_line``: the 1-based number of its first line in the file (0 while unknown)."""

    path: str
    start: int
    end: int
    compressed: bool = False
    first_line: int = 0

    @property
    def key(self) -> tuple[str, int]:
        """The range's identity: its file and first byte."""
        return self.path, self.start


def range_bytes(size: int) -> int:
    """The size of the ranges a file of ``size`` bytes is cut into."""
    return min(MAX_RANGE_BYTES, max(MIN_RANGE_BYTES, math.ceil(size / RANGES_PER_FILE)))


def split_file(path: str, size: int, compressed: bool) -> list[LineRange]:
    """The ranges of one file, in file order; one range for a compressed or empty file."""
    if compressed or size == 0:
        return [LineRange(path, 0, max(size, 1), compressed)]
    step = range_bytes(size)
    return [LineRange(path, start, min(start + step, size)) for start in range(0, size, step)]


def range_lines(handle: BinaryIO, start: int, end: int) -> Iterator[bytes]:
    """The lines (each with its line break) of a seekable binary file that start at a byte offset in [start, end).
    With ``start`` 0 the handle is not seeked (it may be a decompressing reader)."""
    position = start
    if start > 0:
        handle.seek(start - 1)
        position = start - 1 + len(handle.readline())  # the end of the line that started before the range
    while position < end:
        line = handle.readline()
        if not line:
            return
        yield line
        position += len(line)


def numbered(counted: Iterable[tuple[LineRange, int]]) -> list[LineRange]:
    """The ranges of one file with the number of their first line, from each range's line count (prefix sums in
    byte order)."""
    ranges, first_line = [], 1
    for line_range, count in sorted(counted, key=lambda item: item[0].start):
        ranges.append(replace(line_range, first_line=first_line))
        first_line += count
    return ranges


def numbered_lines(line_range: LineRange, lines: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a numbered range's lines."""
    if line_range.first_line < 1:
        raise ValueError(f"range {line_range.key} has no first line number yet")
    return enumerate(lines, start=line_range.first_line)
