"""Page and passage ids: non-negative int64s, as the artifacts store them (no pyarrow here: the dump reader and the
corpus reader parse ids before anything heavy is imported)."""

from __future__ import annotations

MAX_INT64 = (1 << 63) - 1  # page ids, passage ids (and multistream offsets) are stored as int64


def int64_of(raw: str) -> int | None:
    """The number ``raw``'s ASCII digits write (leading zeros allowed) when it fits a non-negative int64; None for
    anything else."""
    if not raw.isascii() or not raw.isdigit():
        return None
    value = int(raw.lstrip("0")[:20] or "0")  # a 20th digit is past int64 already
    return value if value <= MAX_INT64 else None
