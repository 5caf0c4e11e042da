"""The KPR fields of a checkpoint's config.json, read without loading the model (the option checks need them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from artifacts.errors import InputError

CONFIG_NAME = "config.json"
MODEL_TYPE = "kpr-bert"  # config.json's model_type: a BERT with a fusion layer (transformers does not know it)
BASE_MODEL_TYPE = "bert"  # the model type whose tokenizer and encoder a KPR checkpoint extends


@dataclass(frozen=True)
class KPRSettings:
    """The KPR fields of a checkpoint's config.json (names as published)."""

    entity_embedding_size: int
    entity_fusion_activation: str = "sigmoid"
    num_entity_fusion_attention_heads: int = 1
    use_entity_position_embeddings: bool = True
    similarity_function: str = "cosine"
    similarity_temperature: float = 1.0
    entity_fusion_method: str = "multihead_attention"


KPR_FIELDS = tuple(KPRSettings.__dataclass_fields__)
# What the reference's KPR config class (src/kembed/configuration.py) takes for a field its config.json lacks; the
# checkpoints made here write every field (``init_kpr_checkpoint``)
REFERENCE_DEFAULTS = {"entity_fusion_method": "multihead_attention", "use_entity_position_embeddings": True,
                      "entity_fusion_activation": "softmax", "num_entity_fusion_attention_heads": 12,
                      "similarity_function": "dot", "similarity_temperature": 1.0}


def read_config(directory: str) -> dict:
    path = os.path.join(os.path.expanduser(str(directory)), CONFIG_NAME)
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:
        raise InputError(f"cannot read the KPR config {path}: {error}") from error


def read_kpr_settings(directory: str) -> KPRSettings:
    raw = read_config(directory)
    if "entity_embedding_size" not in raw:
        raise InputError(f"{directory} is not a KPR checkpoint: its config.json has no entity_embedding_size")
    settings = KPRSettings(**{**REFERENCE_DEFAULTS, **{name: raw[name] for name in KPR_FIELDS if name in raw}})
    if settings.entity_fusion_activation not in ("sigmoid", "softmax"):
        raise InputError(f"{directory}: entity_fusion_activation {settings.entity_fusion_activation!r} "
                         "is neither sigmoid nor softmax")
    if settings.similarity_function not in ("dot", "cosine"):
        raise InputError(f"{directory}: similarity_function {settings.similarity_function!r} is neither dot nor cosine")
    return settings
