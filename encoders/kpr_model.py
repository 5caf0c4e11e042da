"""The KPR model (Yamada et al. 2025): BERT plus a context-entity fusion layer on top of [CLS], as torch modules.

Each entity input is its frozen embedding from ``entity_embeddings/`` projected by a dense layer (no bias), plus
the mean of learned position embeddings over the entity's token positions, then LayerNorm. A learned no-op key is
always present. [CLS] is the query, the entities the keys and values; the attention weights are
``sigmoid(score - log n)`` (n: non-padding keys, the no-op included) or a softmax; the output is
``LayerNorm(dropout(attention output) + [CLS])``, L2-normalized for cosine models.

Parameter names are those of the published KPR checkpoints, so their weights load as they are
(``encoders/kpr_checkpoint.py``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from artifacts.errors import InputError
from encoders.kpr_config import KPRSettings


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
        # The L2 norm the entity inputs were trained at: the run's vectors are scaled to it (``KPREncoder``), as
        # the reference's build_hf_model.py scales the table it installs. Set when a checkpoint is loaded.
        self.entity_norm = 0.0
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
