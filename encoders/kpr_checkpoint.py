"""KPR checkpoints: config.json (BERT fields + KPR fields, model_type kpr-bert) and safetensors weights under
the published parameter names; loading one, writing one, and a random-fusion checkpoint from a BERT."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict

import torch
from torch import nn

from artifacts.errors import InputError
from encoders.kpr_config import CONFIG_NAME, KPR_FIELDS, MODEL_TYPE, KPRSettings, read_config, read_kpr_settings
from encoders.kpr_model import EntityFusionLayer, KPRModel
from encoders.models import ModelSpec, load_tokenizer

LOG = logging.getLogger("kpr")
WEIGHTS_NAME = "model.safetensors"
# The published checkpoints may carry their training-time entity table; vectors come from entity_embeddings/.
_IGNORED_WEIGHTS = ("entity_fusion_layer.entity_embeddings.embeddings.weight",)
_OPTIONAL_WEIGHTS = ("bert.pooler.",)  # the pooler is not used by KPR


def bert_config(raw: dict):
    from transformers import BertConfig

    skipped = {*KPR_FIELDS, "model_type", "architectures", "auto_map", "entity_vocab_size"}
    return BertConfig.from_dict({key: value for key, value in raw.items() if key not in skipped})


def from_bert(bert_path: str, settings: KPRSettings, seed: int = 0) -> KPRModel:
    """A KPR model with the weights of a BERT checkpoint and randomly initialized fusion layers."""
    from transformers import BertModel

    bert = BertModel.from_pretrained(os.path.expanduser(str(bert_path)))
    torch.manual_seed(seed)
    model = KPRModel(bert.config, settings)
    model.bert.load_state_dict(bert.state_dict())
    if model.entity_fusion_layer is not None:
        _init_fusion(model.entity_fusion_layer, bert.config.initializer_range)
    return model.eval()


def save_checkpoint(model: KPRModel, directory: str) -> None:
    """config.json (BERT fields + KPR fields, model_type kpr-bert) and model.safetensors."""
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    config = {**model.config.to_dict(), **asdict(model.settings), "model_type": MODEL_TYPE,
              "architectures": ["KPRModelForBert"]}
    with open(os.path.join(directory, CONFIG_NAME), "w") as handle:
        json.dump(config, handle, indent=2, sort_keys=True)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, os.path.join(directory, WEIGHTS_NAME))


def load_checkpoint(directory: str, spec: ModelSpec | None = None) -> KPRModel:
    """Load a KPR checkpoint directory (published names); unknown or missing weights are an InputError."""
    raw = read_config(directory)
    settings = read_kpr_settings(directory)
    model = KPRModel(bert_config(raw), settings)
    state = _read_weights(os.path.expanduser(str(directory)))
    for name in [name for name in state if name in _IGNORED_WEIGHTS or name.endswith("position_ids")]:
        if name in _IGNORED_WEIGHTS:
            LOG.info("%s: ignoring %s (entity vectors come from entity_embeddings/)", directory, name)
        del state[name]
    expected = model.state_dict()
    missing = [name for name in expected if name not in state and not name.startswith(_OPTIONAL_WEIGHTS)]
    unexpected = [name for name in state if name not in expected]
    if missing or unexpected:
        raise InputError(f"{directory} does not hold KPR weights: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.load_state_dict(state, strict=False)
    spec = spec or ModelSpec(str(directory))
    return model.to(device=spec.device, dtype=spec.torch_dtype()).eval()


def init_kpr_checkpoint(bert_path: str, directory: str, settings: KPRSettings, seed: int = 0) -> KPRModel:
    """Write a KPR checkpoint (weights, config, the BERT's tokenizer) whose fusion layers are random: what the
    pipeline can run without a trained KPR model (tests, benchmarks)."""
    model = from_bert(bert_path, settings, seed)
    save_checkpoint(model, directory)
    load_tokenizer(bert_path).save_pretrained(directory)
    return model


def _init_fusion(layer: EntityFusionLayer, std: float) -> None:
    for module in layer.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
            with torch.no_grad():
                module.weight[0].zero_()
    nn.init.normal_(layer.noop_embeddings, std=std)


def _read_weights(directory: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    single = os.path.join(directory, WEIGHTS_NAME)
    if os.path.exists(single):
        return load_file(single)
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as handle:
            files = sorted(set(json.load(handle)["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(os.path.join(directory, name)))
        return state
    legacy = os.path.join(directory, "pytorch_model.bin")
    if os.path.exists(legacy):
        return torch.load(legacy, map_location="cpu", weights_only=True)
    raise InputError(f"{directory} has no model.safetensors or pytorch_model.bin")
