"""embed-entities: each entity's vector, the mean of its sampled mentions' [MASK] vectors matched to the model's
mean input-embedding norm. A mention window is encoded once: its vector is kept in a store keyed by the model's
input (``window_store``), which the rerun of a killed stage and a refresh with a previous run read.

Three Beam pipelines, so that each part runs where it should (every core for the CPU work, one process per GPU
for the model): ``PrepareMentions`` cuts the windows and builds the model's inputs and their keys (``inputs``),
written as files and listed; ``EncodeMentions`` reads them, encodes the windows not stored yet and stores them,
and writes every mention's window key bucketed as the store (``forward``), listed; ``ReduceEntities`` finds each
mention's vector in the store bucket by bucket, writing this run's store (``gather``), and reduces each bucket of
entities to their vectors (``entity_vectors``). What travels between them is listed files, read by the launcher
to start the next pipeline.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import partial

import apache_beam as beam
import numpy as np
import pyarrow as pa

from artifacts import fs, layout, schemas, tables
from artifacts.counters import declare
from artifacts.errors import BelowMinimumError, ModelError
from encoders.mask_encoder import check_mask_model
from encoders.mask_inputs import MASK_WINDOWS, check_max_seq_length
from encoders.models import STORED_DTYPES, ModelSpec, check_device, hidden_size, input_embedding_norm
from transforms.common.dead_letters import DEAD_LETTER_TAG
from transforms.common.follow import FollowedFiles, RunFollowers, files_per_step, listed, rows_per_file
from transforms.common.packed import CountEntities
from transforms.common.parquet_rows import ReadParquetRowGroups
from transforms.common.progress import ProgressSettings
from transforms.embed_entities import entity_vectors, gather, mention_windows, refresh
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
from transforms.embed_entities.gather import GatherMentionVectors
from transforms.embed_entities.inputs import COUNTERS as INPUT_COUNTERS
from transforms.embed_entities.inputs import INPUT_FILE_ROWS, INPUT_PREFIX, BuildMentionInputs, PrepareMentionInputs
from transforms.embed_entities.mention_windows import REF_COLUMNS, CutMentionWindows, ref_array
from transforms.embed_entities.refresh import DecideRefresh, map_ids
from transforms.embed_entities.window_store import store_bits

EMBEDDING_DTYPES = {name: pa.type_for_alias(name) for name in STORED_DTYPES}

COUNTERS = declare(
    *INPUT_COUNTERS.values(),
    *FORWARD_COUNTERS.values(),
    *mention_windows.COUNTERS.values(),
    *entity_vectors.COUNTERS.values(),
    *gather.COUNTERS.values(),
    *refresh.ENTITY_COUNTERS.values(),
)


@dataclass(frozen=True)
class EmbedConfig:
    """How entities are embedded: ``model`` (a local directory or hub name of a BERT-family model with [MASK]),
    the hidden ``layer`` read at the [MASK] position, inputs of at most ``max_seq_length`` tokens with the
    context split ``mask_window``, run on ``device`` in ``dtype`` with ``batch_tokens`` padded tokens per forward
    pass; vectors stored as ``embedding_dtype``. ``previous``: a run whose vectors may be reused (refused with
    an error instead of recomputing when ``require_reuse``). ``model_workers``: how many worker processes of a
    local run hold the model (None: one per GPU, or every worker on the CPU). ``keep_mention_vectors``: whether
    the window vectors' store is kept with the run (``mention_vectors/``) for a later refresh."""

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
    keep_mention_vectors: bool = True

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
    target_norm = input_embedding_norm(config.spec)
    if not math.isfinite(target_norm) or target_norm <= 0:
        raise ModelError(config.model, f"the word embeddings of {config.model} have a mean norm of {target_norm}: "
                         "entity vectors are scaled to it (norm-matched), so it must be a positive number; the "
                         "weights are damaged or untrained")
    largest = float(np.finfo(np.float16).max)
    if config.embedding_dtype == "float16" and target_norm > largest:  # a component is at most the norm
        raise ModelError(config.model, f"the word embeddings of {config.model} have a mean norm of {target_norm:.6g}, "
                         f"beyond float16's {largest:,.0f}: entity vectors scaled to it cannot be stored as "
                         "--embedding-dtype float16 (use float32)")
    return ModelFacts(dim, target_norm, vector_buckets(mentions, dim), store_bits(mentions, dim))


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
    return (pipeline | label >> ReadParquetRowGroups(tables.parquet_files(output, layout.MENTIONS), REF_COLUMNS)
            | f"{label}Packed" >> beam.Map(ref_array))


# --- transforms -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EmbedInputs:
    """Where the stage reads and writes: ``output`` (the OUT with articles/, entities/ and mentions/ and how many
    ``mentions`` it holds), ``embeddings``, ``id_map`` and ``store`` (the directories of the entity_embeddings/,
    entity_id_map/ and mention_vectors/ files it writes), ``scratch`` (a directory for the files its pipelines and
    workers share), ``pending`` (where the windows it encodes are stored until it commits: kept if it is killed),
    ``salt`` (the model's part of every window key), ``followers`` (the processes that hold the model, each
    encoding the input files written for it), ``previous`` (an OUT whose vectors may be reused, or None),
    ``renumbered_from`` (an OUT that lends no vector but whose entity ids the id map maps, or None) and
    ``tokenizer`` (the model's tokenizer saved for the inputs' workers, ``models.save_tokenizer``; "":
    each loads it with transformers)."""

    output: str
    mentions: int
    embeddings: str
    scratch: str
    pending: str
    salt: str
    store: str
    followers: int = 1
    id_map: str = ""
    previous: str | None = None
    renumbered_from: str | None = None
    tokenizer: str = ""

    def under_scratch(self, name: str) -> str:
        return fs.join(self.scratch, name)

    @property
    def rows_per_file(self) -> int:
        """Mentions an input file holds (``follow.rows_per_file``)."""
        return rows_per_file(self.mentions, INPUT_FILE_ROWS)

    @property
    def files(self) -> InputFiles:
        step = files_per_step(self.rows_per_file, INPUT_FILE_ROWS)
        followed = FollowedFiles(self.under_scratch("inputs"), INPUT_PREFIX, self.under_scratch("inputs.list"),
                                 self.under_scratch("inputs.ended"), self.followers, step)
        return InputFiles(self.under_scratch("model-facts.json"), followed, self.under_scratch("known-keys.u64"),
                          self.pending, self.under_scratch("refs"))

    @property
    def store_index(self) -> str:
        """The list of store files the reduce reads (``gather.save_store_index``)."""
        return self.under_scratch("store-index.json")


class PrepareMentions(beam.PTransform):
    """A pipeline's root -> the model inputs of every mention, with their window keys, written under the scratch
    directory and listed (``inputs.list``); the model's facts saved (``model-facts.json``); in a refresh, the
    refresh decided (``refresh.DecideRefresh``). Returns the dead letters (refs of missing pages, rows that cannot
    be embedded).

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
        _ = self._model_facts(pipeline) | "SaveModelFacts" >> beam.Map(write_facts, inputs.files.facts)
        refs = read_refs(pipeline, inputs.output, "ReadMentions")
        if inputs.previous is not None:
            _ = pipeline | "DecideRefresh" >> DecideRefresh(inputs.previous, inputs.output, inputs.scratch,
                                                            inputs.id_map)
        elif config.previous:  # named but refused: every entity is recomputed, its ids still mapped where they can be
            _ = refs | "CountRecomputed" >> CountEntities("entities_recomputed")
            if inputs.renumbered_from is not None:
                _ = (pipeline | "RenumberedFrom" >> beam.Create([inputs.renumbered_from])
                     | "WriteIdMap" >> beam.Map(map_ids, inputs.output, inputs.id_map))
        mentions = refs | "CutMentionWindows" >> CutMentionWindows(inputs.output, inputs.scratch, self._chars)
        build = BuildMentionInputs(config.model, config.max_seq_length, config.mask_window, inputs.salt,
                                   inputs.files.followed, inputs.rows_per_file, inputs.tokenizer)
        prepared = mentions["mentions"] | "PrepareInputs" >> PrepareMentionInputs(build, self._progress)
        _ = prepared["files"] | "ListInputFiles" >> beam.io.WriteToText(inputs.files.followed.listing)
        return (mentions[DEAD_LETTER_TAG], prepared[DEAD_LETTER_TAG]) | "AllDeadLetters" >> beam.Flatten()

    def _model_facts(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        if self._facts is not None:
            return pipeline | "ModelFacts" >> beam.Create([self._facts])
        return (pipeline | "Model" >> beam.Create([self._config])
                | "ModelFacts" >> beam.Map(model_facts, self._inputs.mentions))


class EncodeMentions(beam.PTransform):
    """A pipeline's root, run beside ``PrepareMentions``' -> the window keys of the mentions of the inputs it
    writes, the windows not stored before encoded and stored (pending files) as they appear by the inputs'
    ``followers`` (one per process that holds the model); the keys written as parts bucketed as the store under the
    scratch directory and listed (``refs.list``). Returns the dead letters (non-finite vectors). The launcher ends
    it (``follow.mark_ended``) once the inputs' pipeline has ended."""

    def __init__(self, config: EmbedConfig, inputs: EmbedInputs, progress: ProgressSettings) -> None:
        super().__init__()
        self._config, self._inputs, self._progress = config, inputs, progress

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        config, inputs = self._config, self._inputs
        follower = FollowInputFiles(config.spec, config.layer, config.batch_tokens, inputs.files, inputs.salt,
                                    inputs.mentions, self._progress)
        encoded = pipeline | "Encode" >> RunFollowers(follower, inputs.followers, "parts")
        _ = (encoded["parts"] | "PartLines" >> beam.Map(part_line)
             | "ListRefs" >> beam.io.WriteToText(inputs.under_scratch("refs.list")))
        return encoded[DEAD_LETTER_TAG]


class ReduceEntities(beam.PTransform):
    """A pipeline's root -> the ``entity_embeddings/`` files (one per bucket of entity ids) from the listed
    ``parts`` of mentions' window keys and the stored vectors; the run's store written (unless not kept). Returns
    the dead letters (mentions without a vector, unknown entities, zero means)."""

    def __init__(self, config: EmbedConfig, inputs: EmbedInputs, parts: list[tuple[int, Part]],
                 facts: ModelFacts) -> None:
        super().__init__()
        self._config, self._inputs, self._parts, self._facts = config, inputs, parts, facts

    def expand(self, pipeline: beam.pvalue.PBegin) -> beam.PCollection:
        inputs = self._inputs
        facts = pipeline | "ModelFacts" >> beam.Create([self._facts])
        store = inputs.store if self._config.keep_mention_vectors else None
        gathered = ({"refs": pipeline | "Refs" >> beam.Create(self._parts), "facts": facts}
                    | "GatherVectors" >> GatherMentionVectors(inputs.store_index, inputs.under_scratch("parts"),
                                                              store, inputs.salt))
        dead = ({"parts": gathered["parts"], "facts": facts}
                | "EntityVectors" >> EntityVectors(inputs.output, inputs.scratch, inputs.embeddings,
                                                   partial(facts_schema, self._config)))
        return (gathered[DEAD_LETTER_TAG], dead) | "AllDeadLetters" >> beam.Flatten()


def read_facts(inputs: EmbedInputs) -> ModelFacts:
    """The facts ``PrepareMentions`` saved."""
    return ModelFacts(**fs.read_json(inputs.files.facts))


def listed_parts(inputs: EmbedInputs) -> list[tuple[int, Part]]:
    """The parts of window keys ``EncodeMentions`` listed."""
    return [line_part(line) for line in listed(inputs.under_scratch("refs.list"))]
