"""The KPR encoder (Yamada et al. 2025): a ``DenseEncoder`` whose texts also go through the dictionary stage's
linker (every candidate of an ambiguous name); the entities found are fed, with their vectors from
``entity_embeddings/``, to the KPR model's fusion layer on top of [CLS] (``encoders/kpr_model.py``).
"""

from __future__ import annotations

import numpy as np
import torch

from artifacts import fs, layout, tables
from artifacts.errors import InputError
from encoders.errors import MissingRunArtifactError
from encoders.kpr_checkpoint import load_checkpoint
from encoders.kpr_config import read_kpr_settings
from encoders.kpr_entities import EntityTable, embedding_files, entity_inputs
from encoders.models import ModelSpec, load_tokenizer
from encoders.retrievers import DenseEncoder, EncoderOptions


def check_kpr_options(options: EncoderOptions) -> None:
    """A KPR checkpoint, a linker and entity embeddings of the checkpoint's entity size."""
    settings = read_kpr_settings(options.model)
    if not options.linker or not fs.exists(fs.join(options.linker, "config.json")):
        raise MissingRunArtifactError(f"the KPR encoder needs the dictionary stage's linker, not found at "
                                      f"{options.linker!r}", layout.DICTIONARY_STAGE)
    files = embedding_files(options.entity_embeddings)
    dim = tables.read_file(files[0], ["embedding"]).schema.field("embedding").type.list_size
    if dim != settings.entity_embedding_size:
        raise InputError(f"entity embeddings in {options.entity_embeddings} have {dim} dimensions but "
                         f"{options.model} expects entity_embedding_size {settings.entity_embedding_size}")


class KPREncoder(DenseEncoder):
    """A loaded KPR encoder: tokenization with offsets, the linker on the text, entity vectors, the model."""

    def _load_tokenizer(self, spec: ModelSpec):
        from transformers.utils import logging as transformers_logging

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
        model = load_checkpoint(spec.name_or_path, spec)
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
