"""bench.measure's profile of one run: what took its time, busiest first."""

from __future__ import annotations

import torch

from bench.measure import busiest_ops


def test_the_busiest_ops_of_a_run_come_first_with_their_share_and_calls():
    # products large enough (2.7 GFLOP) that a one-off op descheduled on a loaded machine (milliseconds of its wall
    # time) cannot outweigh them: with 384 x 384 under CI's load, aten::fill_ once came first
    left, right = torch.randn(768, 768), torch.randn(768, 768)

    def run() -> None:
        for _ in range(3):
            left @ right  # the matrix products take nearly all of the run's time
        torch.ones(4).add_(1)

    lines = busiest_ops(run, "cpu", count=2)
    assert len(lines) == 2
    share, calls, word, name = lines[0].split(maxsplit=3)
    assert (name, calls, word) == ("aten::mm", "3", "calls")
    assert 50.0 < float(share.rstrip("%")) <= 100.0
    assert "aten::mm" not in lines[1]
