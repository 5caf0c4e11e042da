"""The [MASK] entity encoder: a mention replaced by one [MASK], the chosen layer's output at that position.

Pure input building (testable without a model), the batched forward pass, and the Beam RunInference handler.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from artifacts.errors import InputError
from encoders.batching import token_budget_batches
from encoders.models import (
    ModelSpec,
    check_model_spec,
    load_encoder,
    load_tokenizer,
    model_config,
    usable_positions,
)


@dataclass(frozen=True)
class MaskInput:
    """One mention ready for the model: token ids with one [MASK] at ``mask_position``."""

    entity_id: int
    input_ids: tuple[int, ...]
    mask_position: int


@dataclass(frozen=True)
class TokenIds:
    cls: int
    sep: int
    mask: int
    pad: int


def special_ids(tokenizer) -> TokenIds:
    """The special token ids a [MASK] input needs; a clear error for models without [MASK]."""
    if tokenizer.mask_token_id is None:
        raise InputError(f"the tokenizer of {tokenizer.name_or_path} has no [MASK] token: "
                         "entity embeddings need a masked-language-model vocabulary (a BERT-family model)")
    cls = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    sep = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    return TokenIds(cls=cls, sep=sep, mask=tokenizer.mask_token_id, pad=tokenizer.pad_token_id or 0)


MASK_WINDOWS = ("reference", "centered")


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


def masked_ids(left: Sequence[int], right: Sequence[int], ids: TokenIds, max_seq_length: int,
               window: str = "reference") -> tuple[list[int], int]:
    """[CLS] left [MASK] right [SEP] within ``max_seq_length``, the context cut by ``context_split``.
    Returns (ids, mask position)."""
    keep_left, keep_right = context_split(len(left), len(right), max_seq_length - 3, window)
    kept_left = list(left[len(left) - keep_left:]) if keep_left else []
    return [ids.cls, *kept_left, ids.mask, *right[:keep_right], ids.sep], 1 + keep_left


def mask_inputs(rows: Sequence[dict[str, Any]], tokenizer, max_seq_length: int,
                window: str = "reference") -> list[MaskInput]:
    """MaskInputs for mention rows (entity_id, text, start, end), tokenized in one batch call.

    The left context is right-stripped before tokenizing, as the reference does (no effect on WordPiece)."""
    ids = special_ids(tokenizer)
    lefts = [row["text"][:row["start"]].rstrip() for row in rows]
    rights = [row["text"][row["end"]:] for row in rows]
    encoded = tokenizer(lefts + rights, add_special_tokens=False)["input_ids"]
    result = []
    for index, row in enumerate(rows):
        token_ids, position = masked_ids(encoded[index], encoded[len(rows) + index], ids, max_seq_length, window)
        result.append(MaskInput(row["entity_id"], tuple(token_ids), position))
    return result


class MaskEncoder:
    """A loaded model that returns the chosen layer's vectors at the [MASK] positions (what load_model returns)."""

    def __init__(self, spec: ModelSpec, layer: int, max_tokens: int) -> None:
        import torch

        self.spec = spec
        self.layer = layer
        self.max_tokens = max_tokens
        self.model = load_encoder(spec)
        self.pad_id = load_tokenizer(spec.name_or_path).pad_token_id or 0
        self._torch = torch

    def encode(self, inputs: Sequence[MaskInput]) -> np.ndarray:
        """float32 vectors, one per input, in input order; batches by token budget, sorted by length."""
        vectors = np.zeros((len(inputs), self.model.config.hidden_size), dtype=np.float32)
        for batch in token_budget_batches([len(item.input_ids) for item in inputs], self.max_tokens):
            vectors[batch] = self._forward([inputs[index] for index in batch])
        return vectors

    def _forward(self, batch: Sequence[MaskInput]) -> np.ndarray:
        torch = self._torch
        longest = max(len(item.input_ids) for item in batch)
        ids = torch.full((len(batch), longest), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, item in enumerate(batch):
            ids[row, :len(item.input_ids)] = torch.tensor(item.input_ids)
            attention[row, :len(item.input_ids)] = 1
        positions = torch.tensor([item.mask_position for item in batch])
        with torch.inference_mode():
            output = self.model(input_ids=ids.to(self.spec.device), attention_mask=attention.to(self.spec.device),
                                output_hidden_states=self.layer != -1)
            states = output.last_hidden_state if self.layer == -1 else output.hidden_states[self.layer]
            picked = states[torch.arange(len(batch), device=states.device), positions.to(states.device)]
        return picked.float().cpu().numpy()


class MaskEncoderHandler(ModelHandler[MaskInput, PredictionResult, MaskEncoder]):
    """RunInference handler: one model per worker process; elements batched by count, then by token budget."""

    def __init__(self, spec: ModelSpec, layer: int = -1, max_tokens: int = 16384, max_batch_size: int = 256) -> None:
        super().__init__()
        if max_tokens < 1:  # checked here, on the driver: a worker would fail on every batch
            raise InputError(f"--batch-tokens must be at least 1, got {max_tokens}")
        self._spec = spec
        self._layer = layer
        self._max_tokens = max_tokens
        self._max_batch_size = max_batch_size

    def load_model(self) -> MaskEncoder:
        return MaskEncoder(self._spec, self._layer, self._max_tokens)

    def run_inference(self, batch: Sequence[MaskInput], model: MaskEncoder,
                      inference_args: dict[str, Any] | None = None) -> Iterable[PredictionResult]:
        vectors = model.encode(batch)
        return [PredictionResult(item, vector) for item, vector in zip(batch, vectors, strict=True)]

    def batch_elements_kwargs(self) -> dict[str, int]:
        return {"min_batch_size": 1, "max_batch_size": self._max_batch_size}

    def share_model_across_processes(self) -> bool:
        return False


def check_mask_model(spec: ModelSpec, layer: int = -1, max_seq_length: int | None = None) -> None:
    """Fail before any work starts: a missing model path, a bad dtype or device, a vocabulary with no [MASK],
    a --layer the model does not have, a --max-seq-length beyond its position embeddings (or below 3)."""
    check_model_spec(spec)
    special_ids(load_tokenizer(spec.name_or_path))
    config = model_config(spec)
    layers = config.num_hidden_layers  # hidden_states: the embedding output, then one entry per layer
    if not -(layers + 1) <= layer <= layers:
        raise InputError(f"--layer {layer}: {spec.name_or_path} has {layers} layers "
                         f"(hidden states {-(layers + 1)}..{layers}; -1 is the last layer)")
    if max_seq_length is not None:
        limit = usable_positions(spec)
        if not 3 <= max_seq_length <= limit:
            raise InputError(f"--max-seq-length {max_seq_length}: {spec.name_or_path} takes 3 to {limit} tokens "
                             "([CLS], [MASK], [SEP] and the context)")
