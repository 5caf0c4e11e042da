"""Loading a retriever (or what builds its inputs) by kind, dense or KPR, and checking its options before any work.

Above ``retrievers`` (the dense encoders) and ``kpr`` (the KPR encoder, a ``DenseEncoder``), so neither imports
the other back.
"""

from __future__ import annotations

from artifacts.errors import BelowMinimumError, SettingError
from encoders.kpr import KPREncoder, KPRInputs, check_kpr_options
from encoders.models import DTYPES, check_model_spec, usable_positions
from encoders.retrievers import (
    KINDS,
    MIN_MAX_LENGTH,
    SIMILARITIES,
    TITLE_MODES,
    TOKEN_TYPES,
    DenseEncoder,
    EncoderOptions,
    TextInputs,
    check_tokenizer,
)


def check_encoder_options(options: EncoderOptions, device_here: bool = True,
                          roles: tuple[str, ...] = ("passage", "query")) -> None:
    """Fail before any work starts, with one line naming the bad option (a ``SettingError``); the device only
    when ``device_here`` (see ``check_model_spec``); the models of ``roles`` only (a search loads the query's)."""
    _check_choices(options)
    if options.max_length < MIN_MAX_LENGTH:
        raise SettingError("max_length", options.max_length,
                           f"{{name}} {options.max_length} is too small (at least {MIN_MAX_LENGTH} tokens)")
    if options.batch_tokens < 1:
        raise BelowMinimumError("batch_tokens", options.batch_tokens, 1)
    for role in roles:
        check_model_spec(options.spec(role), device_here)
        limit = usable_positions(options.spec(role))
        if options.max_length > limit:
            raise SettingError("max_length", options.max_length, f"{{name}} {options.max_length}: "
                                                   f"{options.spec(role).name_or_path} takes at most {limit} tokens")
    specs = {options.spec(role).name_or_path: options.spec(role) for role in roles}
    if options.kind == "kpr":
        for path in specs:
            check_kpr_options(options, path)
        return
    for spec in specs.values():
        check_tokenizer(spec, options.kind)


def _check_choices(options: EncoderOptions) -> None:
    for option, value, allowed in (("kind", options.kind, KINDS), ("similarity", options.similarity, SIMILARITIES),
                                   ("title", options.title, TITLE_MODES), ("dtype", options.dtype, DTYPES),
                                   ("token_types", options.token_types, TOKEN_TYPES)):
        if (value or option == "kind") and value not in allowed:
            raise SettingError(option, value, f"{{name}} {value!r} is not one of {', '.join(allowed)}")


def load_inputs(options: EncoderOptions, role: str = "passage", tokenizer: str = "") -> TextInputs:
    """What builds the model inputs of the encoder of ``options`` (no model loaded: a CPU worker's part);
    ``tokenizer``: the role's tokenizer saved by ``models.save_tokenizer`` (else loaded by transformers)."""
    if options.kind == "kpr":
        return KPRInputs(options, role, tokenizer)
    return TextInputs(options, role, tokenizer)


def load_retriever(options: EncoderOptions, role: str = "passage") -> DenseEncoder:
    """The encoder of ``options`` for ``role`` ("passage" or "query"), loaded and in eval mode."""
    if options.kind == "kpr":
        return KPREncoder(options, role)
    return DenseEncoder(options, role)
