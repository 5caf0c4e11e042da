"""[MASK] inputs: a mention replaced by one [MASK], its context cut to the token budget around it (pure input
building, testable without a model; the model and the Beam handler are in ``encoders/mask_encoder.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from artifacts.errors import ModelError, SettingError
from encoders.batching import PackedLists
from encoders.context_tokens import context_sides


@dataclass(frozen=True)
class MaskInput:
    """One mention ready for the model: token ids with one [MASK] at ``mask_position``."""

    entity_id: int
    input_ids: tuple[int, ...]
    mask_position: int


@dataclass(frozen=True)
class PackedMaskInputs:
    """The inputs of many mentions as arrays, as an Arrow list column stores them: mention i's token ids are
    ``ids[offsets[i]:offsets[i + 1]]``, its [MASK] at ``positions[i]``."""

    ids: np.ndarray  # int32
    offsets: np.ndarray  # int64, one more than the mentions
    positions: np.ndarray  # int32

    @classmethod
    def of(cls, inputs: Sequence[MaskInput]) -> PackedMaskInputs:
        ids = PackedLists.of([item.input_ids for item in inputs])
        positions = np.fromiter((item.mask_position for item in inputs), dtype=np.int32, count=len(inputs))
        return cls(ids.values, ids.offsets, positions)

    @classmethod
    def joined(cls, parts: Sequence[PackedMaskInputs]) -> PackedMaskInputs:
        """The inputs of ``parts`` one after the other."""
        lengths = np.concatenate([part.lengths for part in parts])
        return cls(np.concatenate([part.ids for part in parts]), np.concatenate([[0], np.cumsum(lengths)]),
                   np.concatenate([part.positions for part in parts]))

    def __len__(self) -> int:
        return len(self.positions)

    def take(self, rows: np.ndarray) -> PackedMaskInputs:
        """The inputs of ``rows``, in that order (these inputs themselves when ``rows`` are all, in order)."""
        if len(rows) == len(self) and np.array_equal(rows, np.arange(len(self))):
            return self
        lengths = self.lengths[rows]
        starts = self.offsets[rows]
        spans = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        ids = self.ids[np.arange(int(lengths.sum())) + spans]
        return PackedMaskInputs(ids, np.concatenate([[0], np.cumsum(lengths)]), self.positions[rows])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass(frozen=True)
class TokenIds:
    cls: int
    sep: int
    mask: int
    pad: int


def special_ids(tokenizer) -> TokenIds:
    """The special token ids a [MASK] input needs; a clear error for models without [MASK]."""
    if tokenizer.mask_token_id is None:
        raise ModelError(tokenizer.name_or_path, f"the tokenizer of {tokenizer.name_or_path} has no [MASK] token: "
                         "entity embeddings need a masked-language-model vocabulary (a BERT-family model)")
    cls = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    for token, found in (("[CLS] (or a BOS)", cls), ("[SEP] (or an EOS)", sep)):
        if found is None:
            raise ModelError(tokenizer.name_or_path, f"the tokenizer of {tokenizer.name_or_path} has no {token} "
                             "token: a [MASK] input is [CLS] context [MASK] context [SEP]")
    return TokenIds(cls=cls, sep=sep, mask=tokenizer.mask_token_id, pad=tokenizer.pad_token_id or 0)


MASK_WINDOWS = ("reference", "centered")
SPECIAL_TOKENS = 3  # [CLS], [MASK], [SEP]
# A token of context on each side of the mention (a budget of 2: ``context_split`` then keeps one on each side that
# has any, where a budget of 1 keeps none for a mention at the start of its text). With no context every input is
# [CLS] [MASK] [SEP] and every entity gets the same vector.
MIN_SEQ_LENGTH = SPECIAL_TOKENS + 2


def check_max_seq_length(max_seq_length: int) -> None:
    """A ``SettingError`` for an input length that leaves no room for context."""
    if max_seq_length < MIN_SEQ_LENGTH:
        raise SettingError("max_seq_length", max_seq_length,
                           f"{{name}} must be at least {MIN_SEQ_LENGTH}, got {max_seq_length}: [CLS], [MASK], [SEP] "
                           "and a token of context on each side of the mention (without context every entity gets "
                           "the same vector)")


def context_split(left: int, right: int, budget: int, window: str = "reference") -> tuple[int, int]:
    """How many tokens of the ``left`` and ``right`` context to keep within ``budget``.

    ``reference`` is the paper's rule (knowledgeable-embedding's entity-embedding script): a left side shorter
    than half the budget (budget // 2) is kept whole and the right side gets the rest; else a right side shorter
    than half is kept whole and the left side gets the rest; else the right side gets half and the left side the
    rest, so an odd budget puts the extra token BEFORE the mask (509 -> 255 before, 254 after). Like the
    reference, a left side of exactly half leaves that extra token unused. ``centered`` is the older rule: the
    larger half after the mask (254 before, 255 after), a short side's surplus to the other side.
    """
    half = budget // 2
    if window == "centered":
        keep_left = min(left, max(half, budget - right))
        return keep_left, min(right, budget - keep_left)
    if left < half:
        return left, min(right, budget - left)
    if right < half:
        return min(left, budget - right), right
    return min(left, budget - half), half


def tokens_needed(budget: int, other: int | None) -> int:
    """Tokens a side known only in part must have for ``context_split`` (either window) to keep what it would
    keep of the whole side: ``budget`` less the other side's share, ``other`` being the other side's length, or
    None when that side is known only in part too (it then has at least its own share).

    Proof sketch: a side's kept count is its length only when that length is below its share; above, it is
    min(length, c) for a c that depends on the other side alone and is at most ``budget - min(other, half)``, and
    the comparisons with half agree too. Both sides partial: each has at least ``budget - half`` >= half tokens,
    so both keep their fixed shares. tests/encoders/test_context_tokens.py checks it exhaustively on small budgets.
    """
    half = budget // 2
    return budget - (half if other is None else min(other, half))


def masked_ids(left: Sequence[int], right: Sequence[int], ids: TokenIds, max_seq_length: int,
               window: str = "reference") -> tuple[list[int], int]:
    """[CLS] left [MASK] right [SEP] within ``max_seq_length``, the context cut by ``context_split``.
    Returns (ids, mask position)."""
    keep_left, keep_right = context_split(len(left), len(right), max_seq_length - SPECIAL_TOKENS, window)
    kept_left = list(left[len(left) - keep_left:]) if keep_left else []
    return [ids.cls, *kept_left, ids.mask, *right[:keep_right], ids.sep], 1 + keep_left


def mask_inputs(rows: Sequence[dict[str, Any]], tokenizer, max_seq_length: int,
                window: str = "reference") -> list[MaskInput]:
    """MaskInputs for mention rows (entity_id, text, start, end), tokenized in batch calls, each side only as
    far as the budget needs (``context_sides``; the kept tokens equal those of tokenizing whole sides).

    The left context is right-stripped before tokenizing, as the reference does (no effect on WordPiece)."""
    if not rows:
        return []
    ids = special_ids(tokenizer)
    lefts = [row["text"][:row["start"]].rstrip() for row in rows]
    rights = [row["text"][row["end"]:] for row in rows]
    sides = context_sides(tokenizer, lefts, rights, partial(tokens_needed, max_seq_length - SPECIAL_TOKENS))
    result = []
    for row, (left, right) in zip(rows, sides, strict=True):
        token_ids, position = masked_ids(left.ids, right.ids, ids, max_seq_length, window)
        result.append(MaskInput(row["entity_id"], tuple(token_ids), position))
    return result
