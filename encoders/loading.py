"""Loading a retriever by kind (dense or KPR), checking its options before any work, and the RunInference handler.

Above ``retrievers`` (the dense encoders) and ``kpr`` (the KPR encoder, a ``DenseEncoder``), so neither imports
the other back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from artifacts.errors import BelowMinimumError, SettingError
from artifacts.passages import Passage
from encoders.batching import estimated_tokens
from encoders.kpr import KPREncoder, check_kpr_options
from encoders.models import DTYPES, check_model_spec, usable_positions, worker_device
from encoders.retrievers import (
    KINDS,
    SIMILARITIES,
    TITLE_MODES,
    TOKEN_TYPES,
    CountFn,
    DenseEncoder,
    EncoderOptions,
    check_tokenizer,
    ignore_count,
)


def check_encoder_options(options: EncoderOptions, device_here: bool = True) -> None:
    """Fail before any work starts, with one line naming the bad option (a ``SettingError``); the device only
    when ``device_here`` (see ``check_model_spec``)."""
    _check_choices(options)
    if options.max_length < 8:
        raise SettingError("max_length", options.max_length,
                           f"{{name}} {options.max_length} is too small (at least 8 tokens)")
    if options.batch_tokens < 1:
        raise BelowMinimumError("batch_tokens", options.batch_tokens, 1)
    for role in ("passage", "query"):
        check_model_spec(options.spec(role), device_here)
        limit = usable_positions(options.spec(role))
        if options.max_length > limit:
            raise SettingError("max_length", options.max_length, f"{{name}} {options.max_length}: "
                                                   f"{options.spec(role).name_or_path} takes at most {limit} tokens")
    if options.kind == "kpr":
        check_kpr_options(options)
        return
    for path in dict.fromkeys((options.spec("passage").name_or_path, options.spec("query").name_or_path)):
        check_tokenizer(path, options.kind)


def _check_choices(options: EncoderOptions) -> None:
    for option, value, allowed in (("kind", options.kind, KINDS), ("similarity", options.similarity, SIMILARITIES),
                                   ("title", options.title, TITLE_MODES), ("dtype", options.dtype, DTYPES),
                                   ("token_types", options.token_types, TOKEN_TYPES)):
        if (value or option == "kind") and value not in allowed:
            raise SettingError(option, value, f"{{name}} {value!r} is not one of {', '.join(allowed)}")


def load_retriever(options: EncoderOptions, role: str = "passage") -> DenseEncoder:
    """The encoder of ``options`` for ``role`` ("passage" or "query"), loaded and in eval mode."""
    if options.kind == "kpr":
        return KPREncoder(options, role)
    return DenseEncoder(options, role)


def passage_tokens(max_length: int, passage: Passage) -> int:
    """Estimated tokens of one passage (title and text), for batching RunInference elements by tokens."""
    return estimated_tokens(max_length, len(passage.title) + len(passage.text))


class PassageEncoderHandler(ModelHandler[Passage, PredictionResult, DenseEncoder]):
    """RunInference handler: elements batched by estimated tokens here (``batch_weight``, larger batches give
    better length bucketing), then by token budget inside ``encode_passages``. Each worker process loads its own
    encoder (on CUDA too: see ``MaskEncoderHandler``), turns its passages into model inputs (tokenizing, and for
    KPR the linker) and counts them in its own thread, where Beam counters count."""

    def __init__(self, options: EncoderOptions, batch_weight: int | None = None,
                 count: CountFn = ignore_count) -> None:
        super().__init__()
        self._options = options
        self._count = count  # what the inputs hold goes to the pipeline's counters through this
        self.batch_weight = batch_weight or 16 * options.batch_tokens  # estimated tokens per run_inference call

    def load_model(self) -> DenseEncoder:
        return load_retriever(self._options.with_runtime(device=worker_device(self._options.device)), "passage")

    def run_inference(self, batch: Sequence[Passage], model: DenseEncoder,
                      inference_args: dict[str, Any] | None = None) -> Iterable[PredictionResult]:
        vectors = model.encode_passages(batch, self._count)
        return [PredictionResult(passage, vector) for passage, vector in zip(batch, vectors, strict=True)]

    def batch_elements_kwargs(self) -> dict[str, Any]:
        # With element_size_fn, Beam's batch sizes count tokens. Large calls: better length bucketing, and the
        # prefetch thread's first batch (not overlapped with a forward pass) is a small share of each call.
        return {"min_batch_size": min(max(self._options.batch_tokens, self.batch_weight // 4), self.batch_weight),
                "max_batch_size": self.batch_weight,
                "element_size_fn": partial(passage_tokens, self._options.max_length)}

