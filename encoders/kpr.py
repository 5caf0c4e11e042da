"""The KPR encoder (Yamada et al. 2025): BERT plus a context-entity fusion layer on top of [CLS].

Entities are found in the input by the dictionary stage's linker (every candidate of an ambiguous name); each
entity input is its frozen embedding from ``entity_embeddings/`` projected by a dense layer (no bias), plus the
mean of learned position embeddings over the entity's token positions, then LayerNorm. A learned no-op key is
always present. [CLS] is the query, the entities the keys and values; the attention weights are
``sigmoid(score - log n)`` (n: non-padding keys, the no-op included) or a softmax; the output is
``LayerNorm(dropout(attention output) + [CLS])``, L2-normalized for cosine models.

Parameter and config names are those of the published KPR checkpoints, so their weights load as they are.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from artifacts import fs, tables
from artifacts.errors import InputError
from encoders.kpr_config import CONFIG_NAME, KPR_FIELDS, KPRSettings, read_config, read_kpr_settings
from encoders.models import ModelSpec
from encoders.retrievers import DenseEncoder, EncoderOptions

LOG = logging.getLogger("kpr")
WEIGHTS_NAME = "model.safetensors"
MODEL_TYPE = "kpr-bert"
# The published checkpoints may carry their training-time entity table; vectors come from entity_embeddings/.
_IGNORED_WEIGHTS = ("entity_fusion_layer.entity_embeddings.embeddings.weight",)
_OPTIONAL_WEIGHTS = ("bert.pooler.",)  # the pooler is not used by KPR


def bert_config(raw: dict):
    from transformers import BertConfig

    skipped = {*KPR_FIELDS, "model_type", "architectures", "auto_map", "entity_vocab_size"}
    return BertConfig.from_dict({key: value for key, value in raw.items() if key not in skipped})


class EntityEmbeddings(nn.Module):
    """Entity input vectors: dense(frozen embedding) + mean position embedding over its tokens, LayerNorm."""

    def __init__(self, config, settings: KPRSettings) -> None:
        super().__init__()
        self.use_positions = settings.use_entity_position_embeddings
        # position 0 is [CLS], never an entity token: it doubles as the padding position
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size, padding_idx=0)
        self.dense = nn.Linear(settings.entity_embedding_size, config.hidden_size, bias=False)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, entity_embeds: torch.Tensor, entity_position_ids: torch.Tensor) -> torch.Tensor:
        embeddings = self.dense(entity_embeds)
        if self.use_positions:
            positions = self.position_embeddings(entity_position_ids).sum(dim=2)
            counts = entity_position_ids.ne(0).sum(dim=2).clamp(min=1).unsqueeze(-1)
            embeddings = embeddings + positions / counts
        return self.dropout(self.LayerNorm(embeddings))


class EntityFusionAttention(nn.Module):
    """Multi-head attention of one query ([CLS]) over the entity keys, sigmoid or softmax weights."""

    def __init__(self, config, settings: KPRSettings) -> None:
        super().__init__()
        if config.hidden_size % settings.num_entity_fusion_attention_heads:
            raise InputError(f"hidden size {config.hidden_size} is not a multiple of "
                             f"{settings.num_entity_fusion_attention_heads} entity fusion heads")
        self.heads = settings.num_entity_fusion_attention_heads
        self.head_size = config.hidden_size // self.heads
        self.activation = settings.entity_fusion_activation
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)

    def _split(self, states: torch.Tensor) -> torch.Tensor:
        batch, length, _ = states.shape
        return states.view(batch, length, self.heads, self.head_size).transpose(1, 2)

    def forward(self, query: torch.Tensor, keys: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        """query (B, 1, H), keys (B, K, H), padding (B, K) True where a key is padding -> (B, 1, H)."""
        q, k, v = self._split(self.query(query)), self._split(self.key(keys)), self._split(self.value(keys))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_size)  # (B, heads, 1, K)
        scores = scores + padding[:, None, None, :].to(scores.dtype) * torch.finfo(scores.dtype).min
        if self.activation == "sigmoid":  # sigmoid attention with the -log(n) bias (arXiv:2409.04431)
            keys_present = padding.logical_not().sum(dim=-1).to(scores.dtype)[:, None, None, None]
            weights = torch.sigmoid(scores - torch.log(keys_present))
        else:
            weights = torch.softmax(scores, dim=-1)
        context = torch.matmul(weights, v).transpose(1, 2)  # (B, 1, heads, head_size)
        return context.reshape(query.shape)


class EntityFusionLayer(nn.Module):
    def __init__(self, config, settings: KPRSettings) -> None:
        super().__init__()
        self.entity_embeddings = EntityEmbeddings(config, settings)
        self.entity_fusion_layer = EntityFusionAttention(config, settings)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.noop_embeddings = nn.Parameter(torch.zeros(1, 1, config.hidden_size))

    def forward(self, cls: torch.Tensor, entity_ids: torch.Tensor, entity_embeds: torch.Tensor,
                entity_position_ids: torch.Tensor) -> torch.Tensor:
        """cls (B, H); entity_ids (B, E) with 0 = padding; entity_embeds (B, E, De); positions (B, E, P)."""
        batch = cls.shape[0]
        entities = self.entity_embeddings(entity_embeds, entity_position_ids)
        keys = torch.cat([self.noop_embeddings.expand(batch, 1, -1).to(entities.dtype), entities], dim=1)
        padding = torch.cat([torch.zeros(batch, 1, dtype=torch.bool, device=cls.device), entity_ids.eq(0)], dim=1)
        query = cls.unsqueeze(1)
        fused = self.entity_fusion_layer(query, keys, padding)
        return self.LayerNorm(self.dropout(fused) + query).squeeze(1)


class KPRModel(nn.Module):
    """``bert`` + ``entity_fusion_layer``: the published KPR model for BERT-family checkpoints."""

    def __init__(self, config, settings: KPRSettings) -> None:
        super().__init__()
        from transformers import BertModel

        self.config = config
        self.settings = settings
        self.bert = BertModel(config)
        self.entity_fusion_layer = (EntityFusionLayer(config, settings)
                                    if settings.entity_fusion_method != "none" else None)

    def forward(self, input_ids, attention_mask, entity_ids, entity_embeds, entity_position_ids,
                token_type_ids=None) -> torch.Tensor:
        cls = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                        token_type_ids=token_type_ids).last_hidden_state[:, 0]
        vectors = cls if self.entity_fusion_layer is None else self.entity_fusion_layer(
            cls, entity_ids, entity_embeds.to(cls.dtype), entity_position_ids)
        if self.settings.similarity_function == "cosine":
            vectors = nn.functional.normalize(vectors.float(), p=2, dim=-1)
        return vectors.float()

    @classmethod
    def from_bert(cls, bert_path: str, settings: KPRSettings, seed: int = 0) -> KPRModel:
        """A KPR model with the weights of a BERT checkpoint and randomly initialized fusion layers."""
        from transformers import BertModel

        bert = BertModel.from_pretrained(os.path.expanduser(str(bert_path)))
        torch.manual_seed(seed)
        model = cls(bert.config, settings)
        model.bert.load_state_dict(bert.state_dict())
        if model.entity_fusion_layer is not None:
            _init_fusion(model.entity_fusion_layer, bert.config.initializer_range)
        return model.eval()

    def save_pretrained(self, directory: str) -> None:
        """config.json (BERT fields + KPR fields, model_type kpr-bert) and model.safetensors."""
        from safetensors.torch import save_file

        os.makedirs(directory, exist_ok=True)
        config = {**self.config.to_dict(), **asdict(self.settings), "model_type": MODEL_TYPE,
                  "architectures": ["KPRModelForBert"]}
        with open(os.path.join(directory, CONFIG_NAME), "w") as handle:
            json.dump(config, handle, indent=2, sort_keys=True)
        state = {name: tensor.contiguous() for name, tensor in self.state_dict().items()}
        save_file(state, os.path.join(directory, WEIGHTS_NAME))

    @classmethod
    def from_pretrained(cls, directory: str, spec: ModelSpec | None = None) -> KPRModel:
        """Load a KPR checkpoint directory (published names); unknown or missing weights are an InputError."""
        raw = read_config(directory)
        settings = read_kpr_settings(directory)
        model = cls(bert_config(raw), settings)
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
    from encoders.models import load_tokenizer

    model = KPRModel.from_bert(bert_path, settings, seed)
    model.save_pretrained(directory)
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


# --- entity inputs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntityInputs:
    """The entities of one text: ids and, per entity, its token positions (all > 0)."""

    entity_ids: tuple[int, ...]
    positions: tuple[tuple[int, ...], ...]


def mention_token_positions(start: int, end: int, offsets: Sequence[tuple[int, int]],
                            sequence_ids: Sequence[int | None], segment: int) -> tuple[int, ...]:
    """Token indices of ``segment`` whose character span overlaps [start, end) (special tokens never)."""
    pairs = enumerate(zip(offsets, sequence_ids, strict=True))
    return tuple(index for index, ((token_start, token_end), sequence) in pairs
                 if sequence == segment and token_end > token_start and token_start < end and token_end > start)


def entity_inputs(mentions_by_segment: Sequence[Sequence], offsets: Sequence[tuple[int, int]],
                  sequence_ids: Sequence[int | None], has_embedding: Callable[[int], bool],
                  max_entities: int) -> tuple[EntityInputs, int]:
    """Entity inputs of one tokenized text from the linker's mentions of each segment, in text order, every
    candidate of a mention with the mention's positions. Candidates without an embedding and mentions cut off by
    truncation are skipped; entities beyond ``max_entities`` are dropped. Returns (inputs, entities dropped)."""
    ids: list[int] = []
    positions: list[tuple[int, ...]] = []
    dropped = 0
    for segment, mentions in enumerate(mentions_by_segment):
        for mention in mentions:
            tokens = mention_token_positions(mention.start, mention.end, offsets, sequence_ids, segment)
            if not tokens:
                continue
            for candidate in mention.candidates:
                if not has_embedding(candidate.entity_id):
                    continue
                if len(ids) >= max_entities:
                    dropped += 1
                    continue
                ids.append(candidate.entity_id)
                positions.append(tokens)
    return EntityInputs(tuple(ids), tuple(positions)), dropped


class EntityTable:
    """Entity vectors by entity_id (row 0 = padding, zeros), memory-mapped from a local file so 7M x 768
    vectors cost page cache, not process memory; built once per worker from ``entity_embeddings/*.parquet``."""

    def __init__(self, output_dir: str) -> None:
        self.directory = output_dir
        files = _embedding_files(output_dir)
        import pyarrow.parquet as pq
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        largest, dim, value_type = 0, None, np.float32
        for path in files:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
                parquet = pq.ParquetFile(handle)
                embedding = parquet.schema_arrow.field("embedding").type
                dim = embedding.list_size
                value_type = np.float16 if str(embedding.value_type) in ("halffloat", "float16") else np.float32
                for batch in parquet.iter_batches(columns=["entity_id"]):
                    ids = batch.column(0).to_numpy()
                    largest = max(largest, int(ids.max()) if len(ids) else 0)
        self.dim = int(dim or 0)
        self._local = tempfile.mkdtemp(prefix="kpr-entities-")
        self.vectors = np.lib.format.open_memmap(os.path.join(self._local, "vectors.npy"), mode="w+",
                                                 dtype=value_type, shape=(largest + 1, self.dim))
        self.present = np.zeros(largest + 1, dtype=bool)
        for path in files:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
                for batch in pq.ParquetFile(handle).iter_batches(columns=["entity_id", "embedding"]):
                    ids = batch.column(0).to_numpy().astype(np.int64)
                    values = batch.column(1).flatten().to_numpy(zero_copy_only=False).reshape(len(ids), self.dim)
                    self.vectors[ids] = values
                    self.present[ids] = True
        self.vectors.flush()

    def has(self, entity_id: int) -> bool:
        return 0 < entity_id < len(self.present) and bool(self.present[entity_id])

    def lookup(self, entity_ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.vectors[entity_ids], dtype=np.float32)


def _embedding_files(output_dir: str) -> list[str]:
    files = fs.list_files(output_dir, "*.parquet") if fs.exists(output_dir) else []
    if not files:
        raise InputError(f"no entity embeddings in {output_dir}: run `python run_pipeline.py embed-entities` first")
    return files


def check_kpr_options(options: EncoderOptions) -> None:
    """A KPR checkpoint, a linker and entity embeddings of the checkpoint's entity size."""
    settings = read_kpr_settings(options.model)
    if not options.linker or not fs.exists(fs.join(options.linker, "config.json")):
        raise InputError(f"the KPR encoder needs the dictionary stage's linker, not found at {options.linker!r}: "
                         "run `python run_pipeline.py dictionary` first")
    files = _embedding_files(options.entity_embeddings)
    dim = tables.read_file(files[0], ["embedding"]).schema.field("embedding").type.list_size
    if dim != settings.entity_embedding_size:
        raise InputError(f"entity embeddings in {options.entity_embeddings} have {dim} dimensions but "
                         f"{options.model} expects entity_embedding_size {settings.entity_embedding_size}")


class KPREncoder(DenseEncoder):
    """A loaded KPR encoder: tokenization with offsets, the linker on the text, entity vectors, the model."""

    def _load_tokenizer(self, spec: ModelSpec):
        from transformers.utils import logging as transformers_logging

        from encoders.models import load_tokenizer

        level = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity_error()  # it warns that "kpr-bert" is no model type it knows
        try:
            return load_tokenizer(spec.name_or_path)
        finally:
            transformers_logging.set_verbosity(level)

    def _load_model(self, spec: ModelSpec):
        from artifacts.linker import EntityLinker

        self.linker = EntityLinker.load(self.options.linker)
        self.entities = EntityTable(self.options.entity_embeddings)
        model = KPRModel.from_pretrained(spec.name_or_path, spec)
        if self.entities.dim != model.settings.entity_embedding_size:
            raise InputError(f"entity embeddings have {self.entities.dim} dimensions, the KPR model "
                             f"expects {model.settings.entity_embedding_size}")
        return model

    def _features(self, firsts: list[str], seconds: list[str] | None) -> list[dict[str, list]]:
        encoded = self._tokenize(firsts, seconds, offsets=True)
        segments = [firsts] if seconds is None else [firsts, seconds]
        mentions = [self.linker.detect_batch(texts) for texts in segments]
        features = []
        for index in range(len(firsts)):
            found, dropped = entity_inputs([per_segment[index] for per_segment in mentions],
                                           encoded["offset_mapping"][index], encoded.sequence_ids(index),
                                           self.entities.has, self.options.max_entities)
            self.count("kpr_entities", len(found.entity_ids))
            if dropped:
                self.count("kpr_entities_over_max", dropped)
            item = {"input_ids": encoded["input_ids"][index], "entity_ids": found.entity_ids,
                    "entity_positions": found.positions}
            if "token_type_ids" in encoded:
                item["token_type_ids"] = encoded["token_type_ids"][index]
            features.append(item)
        return features

    def _forward(self, batch: list[dict[str, list]]) -> np.ndarray:
        inputs = self._collate(batch)
        entities = max(1, max(len(item["entity_ids"]) for item in batch))
        span = max([1] + [len(tokens) for item in batch for tokens in item["entity_positions"]])
        ids = np.zeros((len(batch), entities), dtype=np.int64)
        positions = np.zeros((len(batch), entities, span), dtype=np.int64)
        for row, item in enumerate(batch):
            ids[row, :len(item["entity_ids"])] = item["entity_ids"]
            for column, tokens in enumerate(item["entity_positions"]):
                positions[row, column, :len(tokens)] = tokens
        device = self.options.device
        embeds = torch.from_numpy(self.entities.lookup(ids)).to(device)
        with torch.inference_mode():
            vectors = self.model(entity_ids=torch.from_numpy(ids).to(device), entity_embeds=embeds,
                                 entity_position_ids=torch.from_numpy(positions).to(device), **inputs)
        return vectors.cpu().numpy()
