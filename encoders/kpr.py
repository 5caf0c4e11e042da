"""The KPR encoder (Yamada et al. 2025): a ``DenseEncoder`` whose texts also go through the dictionary stage's
linker (every candidate of an ambiguous name); the entities found are fed, with their vectors from
``entity_embeddings/``, to the KPR model's fusion layer on top of [CLS] (``encoders/kpr_model.py``).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from artifacts import fs, layout, tables
from artifacts.errors import InputError
from artifacts.passages import Passage
from encoders import batching
from encoders.errors import MissingRunArtifactError
from encoders.kpr_config import read_kpr_settings
from encoders.kpr_entities import EntityTable, KnownEntities, embedding_files
from encoders.kpr_inputs import (
    EntityInputs,
    KPRSequence,
    Segment,
    joined_segment,
    kpr_sequence,
    linked_mentions,
    mention_bounds,
    pair_token_types,
    text_pieces,
)
from encoders.models import ModelSpec, plain_token_ids
from encoders.retrievers import CountFn, DenseEncoder, EncoderOptions, ReadyInputs, TextInputs, passage_segments

# The counters of the entities an input drops, by the key that holds their number.
DROPPED_ENTITIES = (("kpr_entities_truncated", "entities_truncated"), ("kpr_entities_over_max", "entities_over_max"))


def check_kpr_options(options: EncoderOptions, model: str) -> None:
    """``model`` a KPR checkpoint, a linker and entity embeddings of the checkpoint's entity size."""
    settings = read_kpr_settings(model)
    if not options.linker or not fs.exists(fs.join(options.linker, "config.json")):
        raise MissingRunArtifactError(f"the KPR encoder needs the dictionary stage's linker, not found at "
                                      f"{options.linker!r}", layout.DICTIONARY_STAGE)
    files = embedding_files(options.entity_embeddings)
    dim = tables.read_file(files[0], ["embedding"]).schema.field("embedding").type.list_size
    if dim != settings.entity_embedding_size:
        raise InputError(f"entity embeddings in {options.entity_embeddings} have {dim} dimensions but "
                         f"{model} expects entity_embedding_size {settings.entity_embedding_size}")


class KPRInputs(TextInputs):
    """KPR model inputs as the reference builds them (``encoders/kpr_inputs.py``): token ids, and the dictionary
    stage's linker on each segment, every candidate with an entity embedding (``entity_ids``, ``entity_positions``;
    ``entities_truncated``: cut off by ``max_length``, ``entities_over_max``: over ``max_entities``). Built where
    the texts are (a worker process), without the model or the entity vectors."""

    def __init__(self, options: EncoderOptions, role: str = "passage", tokenizer: str = "") -> None:
        from artifacts.linker import EntityLinker

        super().__init__(options, role, tokenizer)
        self.linker = EntityLinker.load(self.options.linker)
        self.known = KnownEntities(self.options.entity_embeddings)

    def passages(self, passages: Sequence[Passage]) -> list[dict[str, Any]]:
        """The inputs of each passage: the prefix's tokens before the title's (the reference's prefix)."""
        return self.sequences(*passage_segments(passages, self.options.title), self.options.passage_prefix)

    def queries(self, queries: Sequence[str]) -> list[dict[str, Any]]:
        return self.sequences(list(queries), None, self.options.query_prefix)

    def features(self, firsts: list[str], seconds: list[str] | None) -> list[dict[str, Any]]:
        return self.sequences(firsts, seconds, "")

    def sequences(self, firsts: list[str], seconds: list[str] | None, prefix: str) -> list[dict[str, Any]]:
        """The model inputs of texts of one segment (``firsts``) or two (``seconds``: after [SEP]), ``prefix``
        tokenized on its own and put first; every segment linked alone."""
        columns = [self.segments(texts) for texts in ([firsts] if seconds is None else [firsts, seconds])]
        prefix_ids = plain_token_ids(self.tokenizer, [prefix])[0] if prefix else []
        return [self._item(kpr_sequence([column[index] for column in columns], prefix_ids,
                                        self.tokenizer.cls_token_id, self.tokenizer.sep_token_id,
                                        self.options.max_length, self.options.max_entities))
                for index in range(len(firsts))]

    def segments(self, texts: list[str]) -> list[Segment]:
        """Each text linked, cut at its mentions with an embedded candidate, its pieces tokenized (all the texts'
        pieces in one call) and joined again. Texts are read composed (NFC), as MediaWiki stores every page and so
        the linker's names: a query typed with decomposed accents (``o`` + U+0300) finds the names it shows."""
        texts = [unicodedata.normalize("NFC", text) for text in texts]
        linked = [linked_mentions(mentions, self.known.has) for mentions in self.linker.detect_batch(texts)]
        bounds = [mention_bounds(mentions) for mentions in linked]
        pieces = [text_pieces(text, cuts) for text, cuts in zip(texts, bounds, strict=True)]
        flat = [piece for parts in pieces for piece in parts]
        ids = plain_token_ids(self.tokenizer, flat) if flat else []
        segments, start = [], 0
        for parts, cuts, mentions in zip(pieces, bounds, linked, strict=True):
            segments.append(joined_segment(ids[start:start + len(parts)], cuts, mentions))
            start += len(parts)
        return segments

    def _item(self, sequence: KPRSequence) -> dict[str, Any]:
        item = {"input_ids": list(sequence.input_ids), "entity_ids": sequence.entities.entity_ids,
                "entity_positions": sequence.entities.positions, "entities_truncated": sequence.truncated,
                "entities_over_max": sequence.over_max, "cut": sequence.cut}
        if self.options.feeds_token_types:
            item["token_type_ids"] = pair_token_types(sequence)
        return item

    def linked_entities(self, firsts: list[str], seconds: list[str] | None) -> list[EntityInputs]:
        """The entity inputs the fusion layer gets for each text."""
        return [EntityInputs(item["entity_ids"], item["entity_positions"]) for item in self.features(firsts, seconds)]

    def count(self, features: Sequence[dict[str, Any]], count: CountFn) -> None:
        super().count(features, count)
        count("kpr_entities", sum(len(item["entity_ids"]) for item in features))
        for name, key in DROPPED_ENTITIES:
            dropped = sum(item[key] for item in features)
            if dropped:
                count(name, dropped)


class KPREncoder(DenseEncoder):
    """A loaded KPR encoder: ``KPRInputs``, the entity vectors by id, the model."""

    def _load_inputs(self) -> KPRInputs:
        return KPRInputs(self.options, self.role)

    def _load_model(self, spec: ModelSpec):
        from encoders.kpr_checkpoint import load_checkpoint  # torch: the model's process only, not the inputs'

        model = load_checkpoint(spec.name_or_path, spec)
        # the resolved similarity (--similarity over the checkpoint's): the index's metric, its vectors' norms
        model.settings = replace(model.settings, similarity_function=self.options.similarity)
        self.entities = EntityTable(self.options.entity_embeddings, model.entity_norm)
        if self.entities.dim != model.settings.entity_embedding_size:
            raise InputError(f"entity embeddings have {self.entities.dim} dimensions, the KPR model "
                             f"expects {model.settings.entity_embedding_size}")
        return model

    def linked_entities(self, firsts: list[str], seconds: list[str] | None) -> list[EntityInputs]:
        return self.inputs.linked_entities(firsts, seconds)

    def _host_inputs(self, ready: ReadyInputs, rows: np.ndarray) -> dict[str, Any]:
        """A batch's padded inputs (``DenseEncoder._host_inputs``) and its entities: ids (rows, E) and token
        positions (rows, E, P) int64, zero-padded, E and P at least 1, and the entities' vectors."""
        if ready.entity_ids is None or ready.entity_positions is None:
            raise ValueError("a KPR encoder's ready inputs need their entity_ids and entity_positions")
        ids = ready.entity_ids.padded(rows, 0, 1)[0]
        positions = ready.entity_positions.padded(rows)
        arrays = {"entity_ids": ids, "entity_embeds": self.entities.lookup(ids), "entity_position_ids": positions}
        return {**super()._host_inputs(ready, rows),
                **{name: batching.host_tensor(array, self.options.device) for name, array in arrays.items()}}

    def _forward_inputs(self, inputs: dict[str, Any]):
        """The fused vectors of one batch, left on the device (float32)."""
        import torch

        with torch.inference_mode():
            return self.model(**inputs)
