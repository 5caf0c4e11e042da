"""The [MASK] entity encoder: a mention replaced by one [MASK], the chosen layer's output at that position.

The batched forward pass over ready inputs; the inputs are built in ``encoders/mask_inputs.py``, by other
processes than the one that holds the model (``transforms/embed_entities/inputs.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from artifacts.errors import SettingError
from encoders.batching import (
    QueuedForwards,
    host_tensor,
    padded_packed,
    queue_forwards,
    to_device,
    token_budget_batches,
)
from encoders.mask_inputs import (
    MIN_SEQ_LENGTH,
    MaskInput,
    PackedMaskInputs,
    check_max_seq_length,
    special_ids,
)
from encoders.models import (
    ModelSpec,
    check_model_spec,
    check_reads_plain_text,
    check_vocabulary,
    load_encoder,
    load_tokenizer,
    model_config,
    usable_positions,
)


class MaskEncoder:
    """A loaded model that returns the chosen layer's vectors at the [MASK] positions.

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
        """float32 vectors, one per input, in input order (``encode_packed`` of them)."""
        return self.encode_packed(PackedMaskInputs.of(inputs))

    def encode_packed(self, packed: PackedMaskInputs, out: np.ndarray | None = None) -> np.ndarray:
        """float32 vectors of ready inputs (``PackedMaskInputs``), in their order (into ``out`` when given)."""
        return self.queue_packed(packed).collect(out)

    def queue_packed(self, packed: PackedMaskInputs, on_batch: Callable[[list[int]], None] | None = None
                     ) -> QueuedForwards:
        """The forward passes of ready inputs, queued (their vectors collected later, in the inputs' order):
        batched by token budget, sorted by length, padded with numpy and pinned in the prefetch thread while the
        previous forward pass runs; ``on_batch`` gets each batch's rows as it is run (``queue_forwards``)."""
        batches = token_budget_batches(packed.lengths.tolist(), self.max_tokens)
        prepared = ((batch, self._prepare_packed(packed, np.asarray(batch))) for batch in batches)
        return queue_forwards(len(packed), self.model.config.hidden_size, prepared, self._forward_host, on_batch)

    def _prepare_packed(self, packed: PackedMaskInputs, rows: np.ndarray) -> tuple:
        """Host tensors of the rows ``rows`` of packed inputs: padded ids, attention mask, [MASK] positions."""
        ids, attention = padded_packed(packed.ids, packed.offsets, rows, self.pad_id)
        positions = packed.positions[rows].astype(np.int64)
        return tuple(host_tensor(array, self.spec.device) for array in (ids, attention, positions))

    def _forward_host(self, host: tuple):
        """The [MASK] vectors of one prepared batch, left on the device in the model's dtype."""
        torch = self._torch
        ids, attention, positions = (to_device(tensor, self.spec.device) for tensor in host)
        with torch.inference_mode():
            output = self.model(input_ids=ids, attention_mask=attention, output_hidden_states=self.layer != -1)
            states = output.last_hidden_state if self.layer == -1 else output.hidden_states[self.layer]
            return states[torch.arange(len(positions), device=states.device), positions]


def check_mask_model(spec: ModelSpec, layer: int = -1, max_seq_length: int | None = None,
                     device_here: bool = True) -> None:
    """Fail before any work starts: a missing model path, a bad dtype or device, a vocabulary with no [MASK],
    a ``layer`` the model does not have, a ``max_seq_length`` beyond its position embeddings or too short for
    context."""
    check_model_spec(spec, device_here)
    tokenizer = load_tokenizer(spec.name_or_path)
    special_ids(tokenizer)
    check_reads_plain_text(tokenizer, spec.name_or_path, "encode the mentions' contexts")
    check_vocabulary(tokenizer, spec)
    layers = model_config(spec).num_hidden_layers  # hidden_states: the embedding output, then one entry per layer
    if not -(layers + 1) <= layer <= layers:
        raise SettingError("layer", layer, f"{{name}} {layer}: {spec.name_or_path} has {layers} layers "
                           f"(hidden states {-(layers + 1)}..{layers}; -1 is the last layer)")
    if max_seq_length is not None:
        limit = usable_positions(spec)
        check_max_seq_length(max_seq_length)
        if max_seq_length > limit:
            raise SettingError("max_seq_length", max_seq_length, f"{{name}} {max_seq_length}: {spec.name_or_path} "
                               f"takes {MIN_SEQ_LENGTH} to {limit} tokens ([CLS], [MASK], [SEP] and the context)")
