"""embed-entities: each entity's vector, the mean of its sampled mentions' [MASK] vectors matched to the model's
mean input-embedding norm; with a previous run to reuse, unchanged entities keep their old vectors."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.ml.inference.base import PredictionResult, RunInference

from artifacts import layout, schemas, tables
from artifacts.counters import declare, error, processed
from encoders.mask_encoder import MaskEncoderHandler, check_mask_model
from encoders.mask_inputs import MASK_WINDOWS, check_max_seq_length
from encoders.models import STORED_DTYPES, ModelSpec, check_device, hidden_size, input_embedding_norm
from transforms.common.dead_letters import DEAD_LETTER_TAG, count, dead_letter
from transforms.common.packed import CountEntities
from transforms.embed_entities import entity_vectors, mention_windows, refresh
from transforms.embed_entities.entity_vectors import EntityVectors, ModelFacts, vector_buckets
from transforms.embed_entities.mention_windows import REF_COLUMNS, CutMentionWindows, ref_array
from transforms.embed_entities.refresh import RefreshSplit

EMBEDDING_DTYPES = {name: pa.type_for_alias(name) for name in STORED_DTYPES}

COUNTERS = declare(
    processed("mentions_embedded", "mentions embedded"),
    error("bad_mention_spans", "mentions whose span lies outside their text"),
    error("empty_contexts", "mentions without any context around them"),
    error("non_finite_vectors", "vectors with NaN or inf (or a zero mean)"),
    *mention_windows.COUNTERS.values(),
    *entity_vectors.COUNTERS.values(),
    *refresh.ENTITY_COUNTERS.values(),
)


@dataclass(frozen=True)
class EmbedConfig:
    """How entities are embedded: ``model`` (a local directory or hub name of a BERT-family model with [MASK]),
    the hidden ``layer`` read at the [MASK] position, inputs of at most ``max_seq_length`` tokens with the
    context split ``mask_window``, run on ``device`` in ``dtype`` with ``batch_tokens`` padded tokens per forward
    pass; vectors stored as ``embedding_dtype``. ``previous``: a run whose vectors may be reused (refused with
    an error instead of recomputing when ``require_reuse``)."""

    model: str
    layer: int = -1
    max_seq_length: int = 512
    device: str = "cpu"
    dtype: str = "float32"
    batch_tokens: int = 16384
    embedding_dtype: str = "float32"
    mask_window: str = "reference"
    previous: str | None = None
    require_reuse: bool = False

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model is required")
        if self.batch_tokens < 1:
            raise ValueError(f"batch_tokens must be at least 1, got {self.batch_tokens}")
        if self.embedding_dtype not in EMBEDDING_DTYPES:
            raise ValueError(f"embedding_dtype must be one of {', '.join(EMBEDDING_DTYPES)}")
        if self.mask_window not in MASK_WINDOWS:
            raise ValueError(f"mask_window must be one of {', '.join(MASK_WINDOWS)}")
        check_max_seq_length(self.max_seq_length)
        check_device(self.device)  # also when the workers run elsewhere: a name no worker can run on

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(self.model, self.device, self.dtype)

    def handler(self) -> MaskEncoderHandler:
        """The RunInference handler that tokenizes mention rows and returns their [MASK] vectors."""
        return MaskEncoderHandler(self.spec, self.layer, self.batch_tokens, max_seq_length=self.max_seq_length,
                                  window=self.mask_window)


def embeddings_schema(config: EmbedConfig, dim: int, target_norm: float) -> pa.Schema:
    """The ``entity_embeddings/`` schema, with the options that made the vectors as metadata."""
    return schemas.entity_embeddings(dim, EMBEDDING_DTYPES[config.embedding_dtype]).with_metadata({
        "model": config.model, "layer": str(config.layer), "target_norm": repr(target_norm),
        "dtype": config.dtype, "embedding_dtype": config.embedding_dtype,
        "max_seq_length": str(config.max_seq_length), "mask_window": config.mask_window})


# --- elements -------------------------------------------------------------------------------------------------


def mention_problem(row: dict[str, Any]) -> str | None:
    """Why a mention row cannot be embedded, or None."""
    text, start, end = row["text"], row["start"], row["end"]
    if not 0 <= start < end <= len(text):
        return "bad_mention_spans"
    if not (text[:start].strip() or text[end:].strip()):
        return "empty_contexts"
    return None


def embeddable(rows: list[dict[str, Any]]) -> Iterator[Any]:
    """Mention rows the model can embed (tokenized later, inside the RunInference handler, where tokenizing
    overlaps the forward passes); the others dead-lettered."""
    good = 0
    for row in rows:
        problem = mention_problem(row)
        if problem is None:
            good += 1
            yield row
        else:
            yield dead_letter(problem, "mention cannot be embedded", entity_id=row["entity_id"],
                              page_id=row["page_id"], start=row["start"], end=row["end"])
    if good:
        count("mentions_embedded", good)


def mention_key(example: Any) -> tuple[int, int, int]:
    """(entity_id, page_id, link_index) of an inference example: a mention row, or a MaskInput (entity only)."""
    if isinstance(example, dict):
        return example["entity_id"], example.get("page_id", -1), example.get("link_index", -1)
    return example.entity_id, -1, -1


def finite_vector(result: PredictionResult) -> Iterator[Any]:
    """(mention key, float32 vector) of one inference result; a vector with NaN or inf is dead-lettered."""
    vector = np.asarray(result.inference, dtype=np.float32)
    key = mention_key(result.example)
    if np.all(np.isfinite(vector)):
        yield key, vector
    else:
        yield dead_letter("non_finite_vectors", "the model returned NaN or inf", entity_id=key[0])


def model_facts(config: EmbedConfig, mentions: int) -> ModelFacts:
    """Check the model (one-line errors: path, device, [MASK], layer, sequence length) and read what the workers
    must know of it; ``mentions``: how many mention vectors may be reduced (sets the buckets). Run where the
    model will run: by the launcher of a local run, by a worker otherwise."""
    check_mask_model(config.spec, config.layer, config.max_seq_length)
    dim = hidden_size(config.spec)
    return ModelFacts(dim, input_embedding_norm(config.spec), vector_buckets(mentions, dim))


def reuse_counters(counters: dict[str, int]) -> dict[str, int]:
    """The refresh counters, 0 when nothing was reused or recomputed."""
    return {"entities_reused": 0, "entities_recomputed": 0, **counters}


# --- transforms -----------------------------------------------------------------------------------------------


class EncodeMentions(beam.PTransform):
    """Mention rows (entity_id, page_id, link_index, text, start, end) -> ((entity_id, page_id, link_index),
    [MASK] vector) (main ``vectors``);
    rows that cannot be embedded and non-finite vectors go to ``dead_letter``. ``progress``: an optional
    pass-through step after the model (a progress log)."""

    def __init__(self, config: EmbedConfig, progress: beam.PTransform | None = None) -> None:
        super().__init__()
        self._config = config
        self._progress = progress

    def expand(self, mentions: beam.PCollection) -> dict[str, beam.PCollection]:
        inputs = (mentions
                  | "BatchMentions" >> beam.BatchElements(min_batch_size=64, max_batch_size=512)
                  | "Embeddable" >> beam.FlatMap(embeddable).with_outputs(DEAD_LETTER_TAG, main="inputs"))
        results = inputs.inputs | "EncodeMasks" >> RunInference(self._config.handler())
        if self._progress is not None:
            results = results | "Progress" >> self._progress
        vectors = results | "KeepFinite" >> beam.FlatMap(finite_vector).with_outputs(DEAD_LETTER_TAG, main="vectors")
        dead = (inputs[DEAD_LETTER_TAG], vectors[DEAD_LETTER_TAG]) | "EncodeDeadLetters" >> beam.Flatten()
        return {"vectors": vectors.vectors, DEAD_LETTER_TAG: dead}


@dataclass(frozen=True)
class EmbedInputs:
    """Where EmbedEntities reads and writes: ``output`` (the OUT with articles/, entities/ and mentions/ and how
    many ``mentions`` it holds), ``embeddings`` and ``id_map`` (the directories of the entity_embeddings/ and, in
    a refresh, entity_id_map/ files), ``scratch`` (a directory for files the workers share) and ``previous`` (an
    OUT whose vectors may be reused, or None)."""

    output: str
    mentions: int
    embeddings: str
    scratch: str
    id_map: str = ""
    previous: str | None = None


class EmbedEntities(beam.PTransform):
    """``EmbedInputs`` -> the ``entity_embeddings/`` files (written by the buckets' reduce) and, when reusing a
    previous run, the ``entity_id_map/`` file; returns the dead letters.

    Windows of ``context_chars`` characters per side are cut around each mention, encoded, averaged per entity
    and scaled to the model's target norm. ``facts``: the model's ``ModelFacts`` when the launcher computed them
    (a local run), else None (a worker computes them)."""

    def __init__(self, config: EmbedConfig, inputs: EmbedInputs, facts: ModelFacts | None, context_chars: int,
                 progress: beam.PTransform | None = None) -> None:
        super().__init__()
        self._config, self._inputs, self._facts = config, inputs, facts
        self._chars = context_chars
        self._progress = progress

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        inputs = self._inputs
        facts = self._model_facts(pipeline)
        refs, reused = self._split_for_refresh(read_refs(pipeline, inputs.output, "ReadMentions"), facts)
        mentions = refs | "CutMentionWindows" >> CutMentionWindows(inputs.output, inputs.scratch, self._chars)
        vectors = mentions["mentions"] | "EncodeMentions" >> EncodeMentions(self._config, self._progress)
        reduced = {"vectors": vectors["vectors"], "facts": facts, **({} if reused is None else {"reused": reused})}
        reduce_dead = reduced | "EntityVectors" >> EntityVectors(inputs.output, inputs.scratch, inputs.embeddings,
                                                                 partial(facts_schema, self._config))
        return (mentions[DEAD_LETTER_TAG], vectors[DEAD_LETTER_TAG], reduce_dead) | "AllDeadLetters" >> beam.Flatten()

    def _model_facts(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        if self._facts is not None:
            return pipeline | "ModelFacts" >> beam.Create([self._facts])
        return (pipeline | "Model" >> beam.Create([self._config])
                | "ModelFacts" >> beam.Map(model_facts, self._inputs.mentions))

    def _split_for_refresh(self, refs: beam.PCollection,
                           facts: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection | None]:
        """(packed refs to encode, (bucket, Part) of reused old vectors or None). Without a previous run every
        entity is encoded; when a previous run was named but refused, each is counted as recomputed."""
        inputs = self._inputs
        if inputs.previous is None:
            if self._config.previous:
                _ = refs | "CountRecomputed" >> CountEntities("entities_recomputed")
            return refs, None
        split = refs | "SplitForRefresh" >> RefreshSplit(inputs.previous, inputs.output, inputs.scratch,
                                                         inputs.id_map, facts)
        return split["encode"], split["reused"]


def facts_schema(config: EmbedConfig, facts: ModelFacts) -> pa.Schema:
    """The ``entity_embeddings/`` schema of vectors of ``facts``' model."""
    return embeddings_schema(config, facts.dim, facts.target_norm)


def read_refs(pipeline: beam.pvalue.PBegin, output: str, label: str) -> beam.PCollection:
    """``output``'s mentions/ as packed refs (one array per row group)."""
    return (pipeline | label >> beam.io.ReadFromParquetBatched(tables.parquet_pattern(output, layout.MENTIONS),
                                                               columns=REF_COLUMNS)
            | f"{label}Packed" >> beam.Map(ref_array))
