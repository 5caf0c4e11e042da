"""KPR checkpoints: config.json (BERT fields + KPR fields, model_type kpr-bert) and safetensors weights under
the published parameter names; loading one, writing one, and a random-fusion checkpoint from a BERT."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict

import numpy as np
import torch
from torch import nn

from artifacts.errors import InputError
from encoders.kpr_config import CONFIG_NAME, KPR_FIELDS, MODEL_TYPE, KPRSettings, read_config, read_kpr_settings
from encoders.kpr_model import EntityFusionLayer, KPRModel
from encoders.models import ModelSpec, load_tokenizer, mean_input_embedding_norm

LOG = logging.getLogger("kpr")
WEIGHTS_NAME = "model.safetensors"
# A train.py checkpoint carries its training-time entity table; vectors come from entity_embeddings/, and of the
# table only the norm of its rows is read (its first rows: every row has the same norm).
TABLE_WEIGHT = "entity_fusion_layer.entity_embeddings.embeddings.weight"
# The table a model converted by the reference's scripts/build_hf_model.py ships beside its weights.
SHIPPED_TABLE = "entity_embeddings.npy"
NORM_ROWS = 1024  # the table rows (after [PAD]) whose norm is read
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
    model.entity_norm = mean_input_embedding_norm(model.bert)  # the norm train.py would give its entity table
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
    """Load a KPR checkpoint directory (published names); unknown or missing weights are an InputError. Its
    ``entity_norm`` is the norm its entity inputs were trained at (``trained_entity_norm``), else the mean norm of
    its input word embeddings (what train.py scales the entity table to)."""
    raw = read_config(directory)
    settings = read_kpr_settings(directory)
    model = KPRModel(bert_config(raw), settings)
    path = os.path.expanduser(str(directory))
    state, table_rows = _read_weights(path)
    if table_rows is not None:
        LOG.info("%s: ignoring %s but for its norm (entity vectors come from entity_embeddings/)", directory,
                 TABLE_WEIGHT)
    for name in [name for name in state if name.endswith("position_ids")]:
        del state[name]
    expected = model.state_dict()
    missing = [name for name in expected if name not in state and not name.startswith(_OPTIONAL_WEIGHTS)]
    unexpected = [name for name in state if name not in expected]
    if missing or unexpected:
        raise InputError(f"{directory} does not hold KPR weights: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    model.load_state_dict(state, strict=False)
    model.entity_norm = trained_entity_norm(table_rows, path) or mean_input_embedding_norm(model.bert)
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


def trained_entity_norm(table_rows: torch.Tensor | None, directory: str) -> float:
    """The mean L2 norm of the non-zero rows of the checkpoint's entity table (``table_rows``: its first rows), else
    of the table a converted model ships (``SHIPPED_TABLE``, read as a mapping); 0.0 when there is neither. The
    reference's build_hf_model.py scales the vectors it installs to this norm (a train.py checkpoint's last
    row, a converted model's row 1: every row has the same norm)."""
    shipped = os.path.join(directory, SHIPPED_TABLE)
    if table_rows is None and os.path.exists(shipped):
        try:
            table_rows = torch.from_numpy(np.array(np.load(shipped, mmap_mode="r")[:NORM_ROWS + 1], np.float32))
        except (OSError, ValueError) as error:
            raise InputError(f"{shipped}: not a readable .npy table of entity vectors ({error})") from error
    if table_rows is None or table_rows.ndim != 2:
        return 0.0
    norms = table_rows[1:].float().norm(dim=1)
    norms = norms[norms > 0]
    return float(norms.mean()) if len(norms) else 0.0


def _read_weights(directory: str) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
    """The weights by name, without the entity table (``TABLE_WEIGHT``), and the table's first ``NORM_ROWS`` + 1
    rows when there is one: the table (7M x 768 for English Wikipedia) is never read whole."""
    legacy = os.path.join(directory, "pytorch_model.bin")
    files = _safetensors_files(directory)
    if not files and os.path.exists(legacy):
        try:  # mapped, so that the entity table is never read whole
            state = torch.load(legacy, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the legacy (not zip) format cannot be mapped
            state = torch.load(legacy, map_location="cpu", weights_only=True)
        table = state.pop(TABLE_WEIGHT, None)
        return state, None if table is None else table[:NORM_ROWS + 1].clone()
    if not files:
        raise InputError(f"{directory} has no model.safetensors or pytorch_model.bin")
    from safetensors import safe_open

    state: dict[str, torch.Tensor] = {}
    table_rows = None
    for path in files:
        with safe_open(path, framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118 (a safe_open is not iterable)
                if name == TABLE_WEIGHT:
                    table_rows = weights.get_slice(name)[:NORM_ROWS + 1]
                else:
                    state[name] = weights.get_tensor(name)
    return state, table_rows


def _safetensors_files(directory: str) -> list[str]:
    """model.safetensors, or the files a model.safetensors.index.json names; none when there is neither."""
    single = os.path.join(directory, WEIGHTS_NAME)
    if os.path.exists(single):
        return [single]
    index = os.path.join(directory, "model.safetensors.index.json")
    if not os.path.exists(index):
        return []
    with open(index) as handle:
        return [os.path.join(directory, name) for name in sorted(set(json.load(handle)["weight_map"].values()))]
