"""Byte ranges aligned on line starts: every line read exactly once, by the range its first byte is in, with the
same number as when the file is read whole, whatever the range size."""

from __future__ import annotations

import io
import itertools
import random

import pytest

from transforms.index import line_ranges
from transforms.index.line_ranges import LineRange, numbered, numbered_lines, range_lines, split_file


def contents() -> list[bytes]:
    """Files with empty lines, lines longer than a range, CRLF, no final line break, one line, nothing."""
    rng = random.Random(7)
    lines = [b"x" * rng.choice([0, 1, 2, 5, 40, 300]) + rng.choice([b"\n", b"\r\n"]) for _ in range(200)]
    return [b"".join(lines), b"".join(lines) + b"tail without a line break", b"\n\n\n", b"one line", b"",
            b"id\ttext\ttitle\n" + b"a" * 5000 + b"\nb\n"]


def ranges_of(size: int, step: int) -> list[LineRange]:
    return [LineRange("f", start, min(start + step, size)) for start in range(0, max(size, 1), step)]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 1000, 1 << 20])
def test_ranges_read_every_line_once_with_its_whole_file_number(step):
    for content in contents():
        whole = list(enumerate(io.BytesIO(content).readlines(), start=1))
        counted = [(line_range, sum(1 for _ in range_lines(io.BytesIO(content), line_range.start, line_range.end)))
                   for line_range in ranges_of(len(content), step)]
        read = [item for line_range in numbered(counted) for item in numbered_lines(
            line_range, range_lines(io.BytesIO(content), line_range.start, line_range.end))]
        assert read == whole


def test_files_are_cut_into_contiguous_ranges_bounded_in_size(monkeypatch):
    monkeypatch.setattr(line_ranges, "MIN_RANGE_BYTES", 10)
    ranges = split_file("big.tsv", 1000, compressed=False)
    assert ranges[0].start == 0 and ranges[-1].end == 1000
    assert all(left.end == right.start for left, right in itertools.pairwise(ranges))
    assert {line_range.end - line_range.start for line_range in ranges[:-1]} == {16}  # ceil(1000 / 64)
    assert split_file("big.tsv.gz", 1000, compressed=True) == [LineRange("big.tsv.gz", 0, 1000, True)]
    assert split_file("empty.tsv", 0, compressed=False) == [LineRange("empty.tsv", 0, 1)]
    assert line_ranges.range_bytes(10**12) == line_ranges.MAX_RANGE_BYTES


def test_first_lines_are_prefix_sums_in_byte_order_whatever_the_count_order():
    counted = [(LineRange("f", 20, 30), 4), (LineRange("f", 0, 10), 3), (LineRange("f", 10, 20), 0)]
    assert [(item.start, item.first_line) for item in numbered(counted)] == [(0, 1), (10, 4), (20, 4)]
    with pytest.raises(ValueError, match="no first line number"):
        numbered_lines(LineRange("f", 0, 10), [])
