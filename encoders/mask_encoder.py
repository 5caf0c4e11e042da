"""The [MASK] entity encoder: a mention replaced by one [MASK], the chosen layer's output at that position.

The batched forward pass and the Beam RunInference handler; the inputs are built in ``encoders/mask_inputs.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from artifacts.errors import BelowMinimumError, SettingError
from encoders.batching import (
    chunk_batches,
    estimated_tokens,
    forward_in_order,
    host_tensor,
    padded,
    to_device,
    to_host,
    token_budget_batches,
)
from encoders.mask_inputs import MIN_SEQ_LENGTH, MaskInput, check_max_seq_length, mask_inputs, special_ids
from encoders.models import (
    ModelSpec,
    check_model_spec,
    load_encoder,
    load_tokenizer,
    model_config,
    usable_positions,
    worker_device,
)


class MaskEncoder:
    """A loaded model that returns the chosen layer's vectors at the [MASK] positions (what load_model returns).

    Batches are padded with numpy and pinned in a prefetch thread while the previous forward pass runs; the
    results stay on the device until the last batch and come back in one copy."""

    def __init__(self, spec: ModelSpec, layer: int, max_tokens: int) -> None:
        import torch

        self.spec = spec
        self.layer = layer
        self.max_tokens = max_tokens
        self.model = load_encoder(spec)
        self.tokenizer = load_tokenizer(spec.name_or_path)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self._torch = torch

    def encode(self, inputs: Sequence[MaskInput]) -> np.ndarray:
        """float32 vectors, one per input, in input order; batches by token budget, sorted by length."""
        batches = token_budget_batches([len(item.input_ids) for item in inputs], self.max_tokens)
        prepared = ((batch, self._prepare([inputs[index] for index in batch])) for batch in batches)
        return forward_in_order(len(inputs), self.model.config.hidden_size, prepared, self._forward_host)

    def encode_rows(self, rows: Sequence[dict[str, Any]], max_seq_length: int,
                    window: str = "reference") -> np.ndarray:
        """float32 vectors of mention rows (entity_id, text, start, end), in row order. The rows are tokenized
        chunk by chunk in the prefetch thread, overlapping the forward passes of the previous chunk."""
        batches = chunk_batches(rows, self.max_tokens // max_seq_length, self.max_tokens,
                                partial(mask_inputs, tokenizer=self.tokenizer, max_seq_length=max_seq_length,
                                        window=window), partial(mask_element_tokens, max_seq_length))
        prepared = ((batch, self._prepare(inputs)) for batch, inputs in batches)
        return forward_in_order(len(rows), self.model.config.hidden_size, prepared, self._forward_host)

    def _prepare(self, batch: Sequence[MaskInput]) -> tuple:
        """Host tensors of one batch: padded ids, attention mask, [MASK] positions (pinned for CUDA)."""
        ids, attention = padded([item.input_ids for item in batch], self.pad_id)
        positions = np.fromiter((item.mask_position for item in batch), dtype=np.int64, count=len(batch))
        return tuple(host_tensor(array, self.spec.device) for array in (ids, attention, positions))

    def _forward_host(self, host: tuple):
        """The [MASK] vectors of one prepared batch, left on the device in the model's dtype."""
        torch = self._torch
        ids, attention, positions = (to_device(tensor, self.spec.device) for tensor in host)
        with torch.inference_mode():
            output = self.model(input_ids=ids, attention_mask=attention, output_hidden_states=self.layer != -1)
            states = output.last_hidden_state if self.layer == -1 else output.hidden_states[self.layer]
            return states[torch.arange(len(positions), device=states.device), positions]

    def _forward(self, batch: Sequence[MaskInput]) -> np.ndarray:
        """float32 vectors of one batch (no prefetch): the building block for benchmarks."""
        return to_host([self._forward_host(self._prepare(batch))])


def mask_element_tokens(max_seq_length: int, element: MaskInput | dict[str, Any]) -> int:
    """Tokens one RunInference element will take: exact for a MaskInput, estimated from the characters of a
    mention row (tokenized later, in the handler)."""
    if isinstance(element, MaskInput):
        return len(element.input_ids)
    return estimated_tokens(max_seq_length, len(element["text"]))


class MaskEncoderHandler(ModelHandler[Any, PredictionResult, MaskEncoder]):
    """RunInference handler. Elements are MaskInputs, or mention rows (entity_id, text, start, end) when
    ``max_seq_length`` is given: those are tokenized chunk by chunk in a prefetch thread, overlapping the forward
    passes. Elements are batched by estimated tokens (``batch_weight`` per call), then by ``max_tokens`` per forward.
    ``window``: the context split around [MASK] (``context_split``) of rows tokenized here.

    Each worker process loads its own model, on CUDA too (Beam's default). One model shared by the processes
    (``share_model_across_processes``) bought nothing: on one GPU, 8 worker processes ran slower than 1 whether
    they shared a model (an H100) or each had its own (an H200) (README, "At full scale")."""

    def __init__(self, spec: ModelSpec, layer: int = -1, max_tokens: int = 16384, max_seq_length: int | None = None,
                 batch_weight: int | None = None, window: str = "reference") -> None:
        super().__init__()
        if max_tokens < 1:  # checked here, on the driver: a worker would fail on every batch
            raise BelowMinimumError("batch_tokens", max_tokens, 1)
        self._spec = spec
        self._layer = layer
        self._max_tokens = max_tokens
        self._max_seq_length = max_seq_length
        self._window = window
        self.batch_weight = batch_weight or 16 * max_tokens  # tokens per run_inference call

    def load_model(self) -> MaskEncoder:
        return MaskEncoder(replace(self._spec, device=worker_device(self._spec.device)), self._layer,
                           self._max_tokens)

    def run_inference(self, batch: Sequence[Any], model: MaskEncoder,
                      inference_args: dict[str, Any] | None = None) -> Iterable[PredictionResult]:
        if self._max_seq_length is None:
            vectors = model.encode(batch)
        else:
            vectors = model.encode_rows(batch, self._max_seq_length, self._window)
        return [PredictionResult(item, vector) for item, vector in zip(batch, vectors, strict=True)]

    def batch_elements_kwargs(self) -> dict[str, Any]:
        cap = self._max_seq_length or self._max_tokens  # MaskInputs are counted exactly, the cap is unused
        # With element_size_fn, Beam's batch sizes count tokens. Large calls: better length bucketing, and the
        # prefetch thread's first batch (not overlapped with a forward pass) is a small share of each call.
        return {"min_batch_size": min(max(self._max_tokens, self.batch_weight // 4), self.batch_weight),
                "max_batch_size": self.batch_weight,
                "element_size_fn": partial(mask_element_tokens, cap)}


def check_mask_model(spec: ModelSpec, layer: int = -1, max_seq_length: int | None = None,
                     device_here: bool = True) -> None:
    """Fail before any work starts: a missing model path, a bad dtype or device, a vocabulary with no [MASK],
    a ``layer`` the model does not have, a ``max_seq_length`` beyond its position embeddings or too short for
    context."""
    check_model_spec(spec, device_here)
    special_ids(load_tokenizer(spec.name_or_path))
    config = model_config(spec)
    layers = config.num_hidden_layers  # hidden_states: the embedding output, then one entry per layer
    if not -(layers + 1) <= layer <= layers:
        raise SettingError("layer", layer, f"{{name}} {layer}: {spec.name_or_path} has {layers} layers "
                           f"(hidden states {-(layers + 1)}..{layers}; -1 is the last layer)")
    if max_seq_length is not None:
        limit = usable_positions(spec)
        check_max_seq_length(max_seq_length)
        if max_seq_length > limit:
            raise SettingError("max_seq_length", max_seq_length, f"{{name}} {max_seq_length}: {spec.name_or_path} "
                               f"takes {MIN_SEQ_LENGTH} to {limit} tokens ([CLS], [MASK], [SEP] and the context)")
