"""embed-entities: each entity's vector, the mean of its sampled mentions' [MASK] vectors matched to the model's
mean input-embedding norm; with a previous run to reuse, unchanged entities keep their old vectors.

Three Beam pipelines, so that each part runs where it should (every core for the CPU work, one process per GPU
for the model): ``PrepareMentions`` cuts the windows and builds the model's inputs (``inputs``), written as files
and listed; ``EncodeMentions`` reads them, runs the model and writes the vectors as parts bucketed by entity
(``forward``), listed; ``ReduceEntities`` reduces each bucket to its entities' vectors (``entity_vectors``). What
travels between them is listed files, read by the launcher to start the next pipeline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial

import apache_beam as beam
import pyarrow as pa

from artifacts import fs, layout, schemas, tables
from artifacts.counters import declare
from artifacts.errors import BelowMinimumError
from encoders.mask_encoder import check_mask_model
from encoders.mask_inputs import MASK_WINDOWS, check_max_seq_length
from encoders.models import STORED_DTYPES, ModelSpec, check_device, hidden_size, input_embedding_norm
from transforms.common.dead_letters import DEAD_LETTER_TAG
from transforms.common.follow import FollowedFiles, RunFollowers, listed
from transforms.common.packed import CountEntities
from transforms.embed_entities import entity_vectors, mention_windows, refresh
from transforms.embed_entities.entity_vectors import (
    EntityVectors,
    ModelFacts,
    Part,
    line_part,
    part_line,
    vector_buckets,
)
from transforms.embed_entities.forward import COUNTERS as FORWARD_COUNTERS
from transforms.embed_entities.forward import FollowInputFiles, InputFiles
from transforms.embed_entities.inputs import COUNTERS as INPUT_COUNTERS
from transforms.embed_entities.inputs import INPUT_PREFIX, PrepareMentionInputs
from transforms.embed_entities.mention_windows import REF_COLUMNS, CutMentionWindows, ref_array
from transforms.embed_entities.refresh import RefreshSplit

EMBEDDING_DTYPES = {name: pa.type_for_alias(name) for name in STORED_DTYPES}

COUNTERS = declare(
    *INPUT_COUNTERS.values(),
    *FORWARD_COUNTERS.values(),
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
    an error instead of recomputing when ``require_reuse``). ``model_workers``: how many worker processes of a
    local run hold the model (None: one per GPU, or every worker on the CPU)."""

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
    model_workers: int | None = None

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model is required")
        if self.batch_tokens < 1:  # checked here, on the driver: the model's part would fail on every batch
            raise BelowMinimumError("batch_tokens", self.batch_tokens, 1)
        if self.embedding_dtype not in EMBEDDING_DTYPES:
            raise ValueError(f"embedding_dtype must be one of {', '.join(EMBEDDING_DTYPES)}")
        if self.mask_window not in MASK_WINDOWS:
            raise ValueError(f"mask_window must be one of {', '.join(MASK_WINDOWS)}")
        check_max_seq_length(self.max_seq_length)
        check_device(self.device)  # also when the workers run elsewhere: a name no worker can run on

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(self.model, self.device, self.dtype)



def embeddings_schema(config: EmbedConfig, dim: int, target_norm: float) -> pa.Schema:
    """The ``entity_embeddings/`` schema, with the options that made the vectors as metadata."""
    return schemas.entity_embeddings(dim, EMBEDDING_DTYPES[config.embedding_dtype]).with_metadata({
        "model": config.model, "layer": str(config.layer), "target_norm": repr(target_norm),
        "dtype": config.dtype, "embedding_dtype": config.embedding_dtype,
        "max_seq_length": str(config.max_seq_length), "mask_window": config.mask_window})


# --- elements -------------------------------------------------------------------------------------------------


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


def write_facts(facts: ModelFacts, path: str) -> ModelFacts:
    """Save ``facts`` where the stage's later pipelines read them."""
    fs.write_json_atomic(path, asdict(facts))
    return facts


def facts_schema(config: EmbedConfig, facts: ModelFacts) -> pa.Schema:
    """The ``entity_embeddings/`` schema of vectors of ``facts``' model."""
    return embeddings_schema(config, facts.dim, facts.target_norm)


def read_refs(pipeline: beam.pvalue.PBegin, output: str, label: str) -> beam.PCollection:
    """``output``'s mentions/ as packed refs (one array per row group)."""
    return (pipeline | label >> beam.io.ReadFromParquetBatched(tables.parquet_pattern(output, layout.MENTIONS),
                                                               columns=REF_COLUMNS)
            | f"{label}Packed" >> beam.Map(ref_array))


# --- transforms -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbedInputs:
    """Where the stage reads and writes: ``output`` (the OUT with articles/, entities/ and mentions/ and how many
    ``mentions`` it holds), ``embeddings`` and ``id_map`` (the directories of the entity_embeddings/ and, in a
    refresh, entity_id_map/ files), ``scratch`` (a directory for the files its pipelines and workers share) and
    ``previous`` (an OUT whose vectors may be reused, or None)."""

    output: str
    mentions: int
    embeddings: str
    scratch: str
    id_map: str = ""
    previous: str | None = None

    def under_scratch(self, name: str) -> str:
        return fs.join(self.scratch, name)

    @property
    def files(self) -> InputFiles:
        followed = FollowedFiles(self.under_scratch("inputs"), INPUT_PREFIX, self.under_scratch("inputs.list"),
                                 self.under_scratch("inputs.ended"))
        return InputFiles(self.under_scratch("model-facts.json"), followed, self.under_scratch("parts"))


class PrepareMentions(beam.PTransform):
    """A pipeline's root -> the model inputs of every mention to encode, written under the scratch directory and
    listed (``inputs.list``); the model's facts saved (``model-facts.json``); in a refresh, the reused vectors'
    parts listed (``reused.list``). Returns the dead letters (refs of missing pages, rows that cannot be embedded).

    ``facts``: the model's ``ModelFacts`` when the launcher computed them (a local run), else None (a worker
    computes them). ``context_chars``: characters of window per side of a mention."""

    def __init__(self, config: EmbedConfig, inputs: EmbedInputs, facts: ModelFacts | None, context_chars: int,
                 progress: beam.PTransform | None = None) -> None:
        super().__init__()
        self._config, self._inputs, self._facts = config, inputs, facts
        self._chars = context_chars
        self._progress = progress

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        config, inputs = self._config, self._inputs
        facts = self._model_facts(pipeline) | "SaveModelFacts" >> beam.Map(write_facts, inputs.files.facts)
        refs, reused = self._split_for_refresh(read_refs(pipeline, inputs.output, "ReadMentions"), facts)
        mentions = refs | "CutMentionWindows" >> CutMentionWindows(inputs.output, inputs.scratch, self._chars)
        prepared = mentions["mentions"] | "PrepareInputs" >> PrepareMentionInputs(
            config.model, config.max_seq_length, config.mask_window, inputs.files.followed.directory, self._progress)
        _ = prepared["files"] | "ListInputFiles" >> beam.io.WriteToText(inputs.files.followed.listing)
        if reused is not None:
            _ = (reused | "ReusedLines" >> beam.Map(part_line)
                 | "ListReused" >> beam.io.WriteToText(inputs.under_scratch("reused.list")))
        return (mentions[DEAD_LETTER_TAG], prepared[DEAD_LETTER_TAG]) | "AllDeadLetters" >> beam.Flatten()

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


class EncodeMentions(beam.PTransform):
    """A pipeline's root, run beside ``PrepareMentions``' -> the [MASK] vectors of the inputs it writes, encoded as
    they appear by ``followers`` followers (one per process that holds the model), written as parts bucketed by
    entity under the scratch directory and listed (``parts.list``). Returns the dead letters (non-finite vectors).
    The launcher ends it (``follow.mark_ended``) once the inputs' pipeline has ended."""

    def __init__(self, config: EmbedConfig, inputs: EmbedInputs, followers: int,
                 progress: beam.PTransform | None = None) -> None:
        super().__init__()
        self._config, self._inputs, self._followers = config, inputs, followers
        self._progress = progress

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        config, inputs = self._config, self._inputs
        follower = FollowInputFiles(config.spec, config.layer, config.batch_tokens, inputs.files)
        encoded = pipeline | "Encode" >> RunFollowers(follower, self._followers, "parts", self._progress)
        _ = (encoded["parts"] | "PartLines" >> beam.Map(part_line)
             | "ListParts" >> beam.io.WriteToText(inputs.under_scratch("parts.list")))
        return encoded[DEAD_LETTER_TAG]


class ReduceEntities(beam.PTransform):
    """A pipeline's root -> the ``entity_embeddings/`` files (one per bucket of entity ids) from the listed
    ``parts`` of mention vectors and reused vectors. Returns the dead letters (unknown entities, zero means)."""

    def __init__(self, config: EmbedConfig, inputs: EmbedInputs, parts: list[tuple[int, Part]],
                 facts: ModelFacts) -> None:
        super().__init__()
        self._config, self._inputs, self._parts, self._facts = config, inputs, parts, facts

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        inputs = self._inputs
        return ({"parts": pipeline | "Parts" >> beam.Create(self._parts),
                 "facts": pipeline | "ModelFacts" >> beam.Create([self._facts])}
                | "EntityVectors" >> EntityVectors(inputs.output, inputs.scratch, inputs.embeddings,
                                                   partial(facts_schema, self._config)))


def read_facts(inputs: EmbedInputs) -> ModelFacts:
    """The facts ``PrepareMentions`` saved."""
    return ModelFacts(**fs.read_json(inputs.files.facts))


def listed_parts(inputs: EmbedInputs) -> list[tuple[int, Part]]:
    """The parts ``EncodeMentions`` listed, and the reused ones ``PrepareMentions`` listed."""
    return [line_part(line) for name in ("parts.list", "reused.list") for line in listed(inputs.under_scratch(name))]
