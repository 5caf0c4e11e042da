"""Token-budget batching with length bucketing: no padding every sequence to the longest in the corpus."""

from __future__ import annotations

from collections.abc import Sequence


def token_budget_batches(lengths: Sequence[int], max_tokens: int, max_batch_size: int = 1024) -> list[list[int]]:
    """Group item indices into batches whose padded size (batch size x longest item) stays within ``max_tokens``.

    Items are sorted by length first (stable, so equal lengths keep their order), which keeps padding small.
    An item longer than the budget gets a batch of its own. Every index appears in exactly one batch.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        longest = max(lengths[index], 1)  # sorted ascending: the new item is the longest so far
        if current and (longest * (len(current) + 1) > max_tokens or len(current) >= max_batch_size):
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches
