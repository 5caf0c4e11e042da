"""embed-entities: each entity's vector, the mean of its sampled mentions' [MASK] vectors matched to the model's
mean input-embedding norm; with a previous run to reuse, unchanged entities keep their old vectors."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.ml.inference.base import PredictionResult, RunInference

from artifacts import schemas
from artifacts.counters import declare, dropped, error, processed
from encoders.mask_encoder import MaskEncoderHandler
from encoders.mask_inputs import MASK_WINDOWS
from encoders.models import ModelSpec
from transforms import mention_windows, refresh
from transforms.dead_letters import DEAD_LETTER_TAG, count, dead_letter
from transforms.mention_windows import CutMentionWindows
from transforms.refresh import SplitEntitiesForRefresh

EMBEDDING_DTYPES = {"float32": pa.float32(), "float16": pa.float16()}

COUNTERS = declare(
    processed("mentions_embedded", "mentions embedded"),
    processed("entities_embedded", "entities embedded"),
    dropped("entities_without_mentions", "entities without any mention to embed"),
    dropped("mentions_of_unknown_entities", "mentions of unknown entities", dead_lettered=True),
    error("bad_mention_spans", "mentions whose span lies outside their text"),
    error("empty_contexts", "mentions without any context around them"),
    error("non_finite_vectors", "vectors with NaN or inf (or a zero mean)"),
    *mention_windows.COUNTERS.values(),
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


def finite_vector(result: PredictionResult) -> Iterator[Any]:
    """(entity_id, float32 vector) of one inference result; a vector with NaN or inf is dead-lettered."""
    vector = np.asarray(result.inference, dtype=np.float32)
    example = result.example  # a mention row, or a MaskInput
    entity_id = example["entity_id"] if isinstance(example, dict) else example.entity_id
    if np.all(np.isfinite(vector)):
        yield entity_id, vector
    else:
        yield dead_letter("non_finite_vectors", "the model returned NaN or inf", entity_id=entity_id)


class MeanVector(beam.CombineFn):
    """(sum in float64, count) of an entity's mention vectors: distributed, order-independent to rounding."""

    def create_accumulator(self) -> tuple[np.ndarray | None, int]:
        return None, 0

    def add_input(self, accumulator, vector):
        total, seen = accumulator
        vector = vector.astype(np.float64)
        return (vector if total is None else total + vector), seen + 1

    def merge_accumulators(self, accumulators):
        total, seen = None, 0
        for part, part_seen in accumulators:
            if part is not None:
                total = part.copy() if total is None else total + part
            seen += part_seen
        return total, seen

    def extract_output(self, accumulator):
        return accumulator


def norm_matched(total: np.ndarray, seen: int, target_norm: float) -> np.ndarray | None:
    """The mean direction scaled to ``target_norm`` (None if the mean is zero or not finite)."""
    mean = total / seen
    norm = float(np.linalg.norm(mean))
    if not math.isfinite(norm) or norm == 0.0:
        return None
    return (mean / norm * target_norm).astype(np.float32)


def embedding_row(entity_id: int, joined: dict[str, list[Any]], target_norm: float = 1.0) -> Iterator[Any]:
    """The ``entity_embeddings/`` row of one entity from its (title, qid) and (sum, count) of mention vectors;
    mentions of an unknown entity and zero or non-finite means are dead-lettered."""
    entities, means = joined["entity"], joined["mean"]
    if not entities:
        if means:
            yield dead_letter("mentions_of_unknown_entities", "mentions of an entity_id not in entities/",
                              entity_id=entity_id, mention_count=means[0][1])
        return
    if not means:
        count("entities_without_mentions")
        return
    total, seen = means[0]
    vector = norm_matched(total, seen, target_norm)
    if vector is None:
        yield dead_letter("non_finite_vectors", "mean vector is zero or not finite", entity_id=entity_id)
        return
    count("entities_embedded")
    title, qid = entities[0]
    yield {"entity_id": entity_id, "title": title, "qid": qid, "embedding": vector.tolist(), "mention_count": seen}


def reuse_counters(counters: dict[str, int]) -> dict[str, int]:
    """The refresh counters (0 when nothing was reused); a reused entity is not "without mentions" although no
    mention of it reached the join with the entity table."""
    counters = {"entities_reused": 0, "entities_recomputed": 0, **counters}
    without = counters.pop("entities_without_mentions", 0) - counters["entities_reused"]
    return {**counters, "entities_without_mentions": without} if without else counters


# --- transforms -----------------------------------------------------------------------------------------------


class EncodeMentions(beam.PTransform):
    """Mention rows (entity_id, page_id, text, start, end) -> (entity_id, [MASK] vector) (main ``vectors``);
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


class EntityVectors(beam.PTransform):
    """``vectors`` (entity_id, mention vector) + ``entities`` (entity_id, title, qid rows) -> one
    ``entity_embeddings/`` row per entity with mentions: the mean direction at ``target_norm`` (main ``rows``;
    ``dead_letter``: mentions of unknown entities, zero or non-finite means)."""

    def __init__(self, target_norm: float) -> None:
        super().__init__()
        self._target_norm = target_norm

    def expand(self, inputs: dict[str, beam.PCollection]) -> beam.pvalue.DoOutputsTuple:
        means = inputs["vectors"] | "MeanPerEntity" >> beam.CombinePerKey(MeanVector())
        entities = inputs["entities"] | "EntityInfo" >> beam.Map(lambda e: (e["entity_id"], (e["title"], e["qid"])))
        return ({"entity": entities, "mean": means} | "JoinEntities" >> beam.CoGroupByKey()
                | "NormMatch" >> beam.FlatMapTuple(embedding_row, self._target_norm).with_outputs(
                    DEAD_LETTER_TAG, main="rows"))


class EmbedEntities(beam.PTransform):
    """``refs`` (mentions/ rows), ``articles`` (page_id, text) and ``entities`` (entity_id, title, qid), and with
    a previous run to reuse its ``old_mentions``, ``old_entities`` and ``old_embeddings`` -> ``rows``
    (entity_embeddings/ rows), ``dead_letter`` and, when reusing, ``id_map`` (entity_id_map/ rows).

    Windows of ``context_chars`` characters per side are cut around each mention, encoded, averaged per entity
    and scaled to ``target_norm``."""

    def __init__(self, config: EmbedConfig, target_norm: float, context_chars: int,
                 progress: beam.PTransform | None = None) -> None:
        super().__init__()
        self._config = config
        self._target_norm = target_norm
        self._chars = context_chars
        self._progress = progress

    def expand(self, inputs: dict[str, beam.PCollection]) -> dict[str, beam.PCollection]:
        refs, split = self._split_for_refresh(inputs)
        mentions = ({"refs": refs, "articles": inputs["articles"]}
                    | "CutMentionWindows" >> CutMentionWindows(self._chars))
        vectors = mentions.mentions | "EncodeMentions" >> EncodeMentions(self._config, self._progress)
        rows = ({"vectors": vectors["vectors"], "entities": inputs["entities"]}
                | "EntityVectors" >> EntityVectors(self._target_norm))
        dead = ((mentions[DEAD_LETTER_TAG], vectors[DEAD_LETTER_TAG], rows[DEAD_LETTER_TAG])
                | "AllDeadLetters" >> beam.Flatten())
        if split is None:
            return {"rows": rows.rows, DEAD_LETTER_TAG: dead}
        return {"rows": (rows.rows, split["reused"]) | "WithReused" >> beam.Flatten(), DEAD_LETTER_TAG: dead,
                "id_map": split["id_map"]}

    def _split_for_refresh(self, inputs: dict[str, beam.PCollection]) -> tuple[beam.PCollection, Any]:
        """(refs to encode, the refresh split or None). Without old inputs every entity is encoded; when a
        previous run was named but refused, each is counted as recomputed."""
        refs = inputs["refs"]
        if "old_mentions" not in inputs:
            if self._config.previous:
                _ = (refs | "EntityIds" >> beam.Map(lambda row: row["entity_id"]) | "Distinct" >> beam.Distinct()
                     | "CountRecomputed" >> beam.Map(lambda _: count("entities_recomputed")))
            return refs, None
        split = ({"mentions": refs, "entities": inputs["entities"],
                  **{name: inputs[name] for name in ("old_mentions", "old_entities", "old_embeddings")}}
                 | "SplitForRefresh" >> SplitEntitiesForRefresh())
        return split["encode"], split
