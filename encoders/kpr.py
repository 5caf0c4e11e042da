"""The KPR encoder (Yamada et al. 2025): a ``DenseEncoder`` whose texts also go through the dictionary stage's
linker (every candidate of an ambiguous name); the entities found are fed, with their vectors from
``entity_embeddings/``, to the KPR model's fusion layer on top of [CLS] (``encoders/kpr_model.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from artifacts import fs, layout, tables
from artifacts.errors import InputError
from encoders import batching
from encoders.errors import MissingRunArtifactError
from encoders.kpr_checkpoint import load_checkpoint
from encoders.kpr_config import read_kpr_settings
from encoders.kpr_entities import EntityInputs, EntityTable, KnownEntities, embedding_files, entity_inputs
from encoders.models import ModelSpec, load_tokenizer
from encoders.retrievers import CountFn, DenseEncoder, EncoderOptions, TextInputs


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


def entity_arrays(found: list[EntityInputs]) -> tuple[np.ndarray, np.ndarray]:
    """(entity ids (B, E), token positions (B, E, P)) int64, zero-padded; E and P at least 1."""
    entities = max(1, max(len(item.entity_ids) for item in found))
    span = max([1] + [len(tokens) for item in found for tokens in item.positions])
    ids = np.zeros((len(found), entities), dtype=np.int64)
    positions = np.zeros((len(found), entities, span), dtype=np.int64)
    for row, item in enumerate(found):
        ids[row, :len(item.entity_ids)] = item.entity_ids
        for column, tokens in enumerate(item.positions):
            positions[row, column, :len(tokens)] = tokens
    return ids, positions


class KPRInputs(TextInputs):
    """KPR model inputs: token ids with character offsets, and the dictionary stage's linker on each segment,
    every candidate with an entity embedding (``entity_ids``, ``entity_positions``; ``entities_dropped`` over
    ``max_entities``). Built where the texts are (a worker process), without the model or the entity vectors."""

    def __init__(self, options: EncoderOptions, role: str = "passage") -> None:
        from artifacts.linker import EntityLinker

        super().__init__(options, role)
        self.linker = EntityLinker.load(self.options.linker)
        self.known = KnownEntities(self.options.entity_embeddings)

    def _load_tokenizer(self, spec: ModelSpec):
        from transformers.utils import logging as transformers_logging

        level = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity_error()  # it warns that "kpr-bert" is no model type it knows
        try:
            return load_tokenizer(spec.name_or_path)
        finally:
            transformers_logging.set_verbosity(level)

    def features(self, firsts: list[str], seconds: list[str] | None) -> list[dict[str, Any]]:
        encoded = self.tokenize(firsts, seconds, offsets=True)
        features = []
        for index, (found, dropped) in enumerate(self._linked(encoded, firsts, seconds)):
            item = {"input_ids": encoded["input_ids"][index], "entity_ids": found.entity_ids,
                    "entity_positions": found.positions, "entities_dropped": dropped}
            if "token_type_ids" in encoded:
                item["token_type_ids"] = encoded["token_type_ids"][index]
            features.append(item)
        return features

    def _linked(self, encoded, firsts: list[str], seconds: list[str] | None) -> list[tuple[EntityInputs, int]]:
        """(entity inputs, entities dropped over ``max_entities``) of each tokenized text: the linker's mentions
        of every segment, every candidate with an embedding."""
        mentions = [self.linker.detect_batch(texts) for texts in ([firsts] if seconds is None else [firsts, seconds])]
        return [entity_inputs([per_segment[index] for per_segment in mentions], encoded["offset_mapping"][index],
                              encoded.sequence_ids(index), self.known.has, self.options.max_entities)
                for index in range(len(firsts))]

    def linked_entities(self, firsts: list[str], seconds: list[str] | None) -> list[EntityInputs]:
        """The entity inputs the fusion layer gets for each text."""
        return [EntityInputs(item["entity_ids"], item["entity_positions"]) for item in self.features(firsts, seconds)]

    def count(self, features: Sequence[dict[str, Any]], count: CountFn) -> None:
        count("kpr_entities", sum(len(item["entity_ids"]) for item in features))
        dropped = sum(item["entities_dropped"] for item in features)
        if dropped:
            count("kpr_entities_over_max", dropped)


class KPREncoder(DenseEncoder):
    """A loaded KPR encoder: ``KPRInputs``, the entity vectors by id, the model."""

    def _load_inputs(self) -> KPRInputs:
        return KPRInputs(self.options, self.role)

    def _load_model(self, spec: ModelSpec):
        self.entities = EntityTable(self.options.entity_embeddings)
        model = load_checkpoint(spec.name_or_path, spec)
        if self.entities.dim != model.settings.entity_embedding_size:
            raise InputError(f"entity embeddings have {self.entities.dim} dimensions, the KPR model "
                             f"expects {model.settings.entity_embedding_size}")
        return model

    def linked_entities(self, firsts: list[str], seconds: list[str] | None) -> list[EntityInputs]:
        return self.inputs.linked_entities(firsts, seconds)

    def _host_inputs(self, batch: list[dict[str, Any]]) -> dict[str, Any]:
        ids, positions = entity_arrays([EntityInputs(item["entity_ids"], item["entity_positions"]) for item in batch])
        arrays = {"entity_ids": ids, "entity_embeds": self.entities.lookup(ids), "entity_position_ids": positions}
        return {**super()._host_inputs(batch),
                **{name: batching.host_tensor(array, self.options.device) for name, array in arrays.items()}}

    def _forward_inputs(self, inputs: dict[str, Any]):
        """The fused vectors of one batch, left on the device (float32)."""
        with torch.inference_mode():
            return self.model(**inputs)
