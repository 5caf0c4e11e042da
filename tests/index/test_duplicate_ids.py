"""Duplicate ids decided from packed (id, line) arrays: the first (or last) row in file and line order is kept,
whatever the order the blocks arrive in and however the rows were cut into ranges and id groups."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from transforms.index.duplicate_ids import IdBlock, duplicate_drops, grouped_blocks, id_groups

# (file, range start, [(id, line)]): id 5 in three places, id 9 twice in one range, id 1 once
BLOCKS = [("b.tsv", 0, [(5, 2), (1, 3)]), ("a.tsv", 100, [(5, 9), (9, 10), (9, 12)]), ("a.tsv", 0, [(5, 4)])]


def blocks_of(spec) -> list[IdBlock]:
    return [IdBlock(path, start, np.array([row[0] for row in rows], np.int64),
                    np.array([row[1] for row in rows], np.int64)) for path, start, rows in spec]


def decided(blocks, keep="first") -> dict[tuple[str, int], dict[int, tuple[str, int]]]:
    result: dict[tuple[str, int], dict[int, tuple[str, int]]] = {}
    for key, drops in duplicate_drops(blocks, keep):
        result.setdefault(key, {}).update(drops.by_line())
    return result


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_the_first_or_last_row_in_file_and_line_order_is_kept_whatever_the_block_order(order):
    blocks = [blocks_of(BLOCKS)[index] for index in order]
    assert decided(blocks) == {("a.tsv", 100): {9: ("a.tsv", 4), 12: ("a.tsv", 10)},
                               ("b.tsv", 0): {2: ("a.tsv", 4)}}
    assert decided(blocks, "last") == {("a.tsv", 0): {4: ("b.tsv", 2)}, ("a.tsv", 100): {9: ("b.tsv", 2),
                                                                                          10: ("a.tsv", 12)}}
    with pytest.raises(ValueError, match="keep must be one of"):
        decided(blocks, "smallest")


def test_rows_split_into_id_groups_decide_the_same_as_together():
    rows = [(passage_id % 50, line) for line, passage_id in enumerate(range(2, 400, 3), start=2)]
    together = decided([IdBlock("c.tsv", 0, np.array([r[0] for r in rows]), np.array([r[1] for r in rows]))])
    split = {}
    for group_blocks in _by_group(grouped_blocks("c.tsv", 0, [r[0] for r in rows], [r[1] for r in rows], 4)):
        for key, drops in decided(group_blocks).items():
            split.setdefault(key, {}).update(drops)
    assert split == together and len(together[("c.tsv", 0)]) == len(rows) - 50
    assert decided([]) == {}


def _by_group(pairs) -> list[list[IdBlock]]:
    groups: dict[int, list[IdBlock]] = {}
    for group, block in pairs:
        groups.setdefault(group, []).append(block)
    return list(groups.values())


def test_id_groups_spread_sequential_and_strided_ids_evenly():
    for ids in (np.arange(100_000), np.arange(100_000) * 64):
        counts = np.bincount(id_groups(ids, 64), minlength=64)
        assert counts.min() > 0.8 * counts.mean()
    assert id_groups(np.array([2**62, 0]), 64).tolist() == id_groups(np.array([2**62, 0]), 64).tolist()
