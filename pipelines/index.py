"""index: a passage corpus encoded by a dense retriever into sharded FAISS indexes under OUT/index/.

Flags -> ``IndexConfig``; then three Beam pipelines (transforms/index/graph.py): ``ReadPassages | PreparePassages``
(the model's inputs built by every worker, written as files) and, beside it, ``EncodePassages`` (the processes
that hold the model encode the files as they come and stage the rows by hash bucket); once the exact count has
decided the number of shards and the index type, ``BuildIndex``.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from artifacts import fs, layout, schemas, tables
from artifacts.errors import InputError, SettingError
from artifacts.faiss import buckets, choice, files, info
from artifacts.faiss.build import trained_file_reason
from artifacts.passages import Passage
from artifacts.run import manifest, verified
from encoders.errors import MissingRunArtifactError
from encoders.loading import check_encoder_options
from encoders.models import check_device, model_files
from encoders.retrievers import EncoderOptions, dense_dim
from pipelines.launcher import disk_space, flags
from pipelines.launcher.stage import (
    Build,
    StageContext,
    model_workers,
    run_beam,
    run_model_beside,
    saved_tokenizer,
    summed,
    with_dead_letters,
)
from pipelines.refresh import (
    Compatibility,
    RefreshConfig,
    fingerprint_changes,
    model_identity,
    moved_model_option,
    previous_options,
    reusable_previous,
)
from transforms.common.dead_letters import WriteDeadLetters
from transforms.common.follow import FollowedFiles, files_per_step, rows_per_file
from transforms.common.worker_files import load_array, save_array
from transforms.index.corpus import ReadPassages, check_corpus, passage_counts
from transforms.index.forward import KeptPassages, kept_files, kept_keys
from transforms.index.graph import (
    COUNTERS,
    BuildIndex,
    EncodePassages,
    EncodingFiles,
    IndexConfig,
    IndexPlan,
    PreparePassages,
    StageKeptPassages,
)
from transforms.index.inputs import INPUT_FILE_ROWS, INPUT_PREFIX

# The flags of the encoder options not named after them, for messages (the library names options by field).
ENCODER_FLAGS = {"kind": "--encoder-type", "title": "--title-mode"}
# The artifacts of the run a KPR encoder reads, relative to OUT (recorded in index.json with their digests).
KPR_INPUTS = {"linker": layout.LINKER, "entity_embeddings": layout.ENTITY_EMBEDDINGS}


def encoder_options(args: argparse.Namespace) -> EncoderOptions:
    """The encoder of the flags; a KPR encoder names this run's linker and entity embeddings relative to OUT."""
    check_device(args.device)  # a name no worker can run on, wherever the workers run
    run_inputs = KPR_INPUTS if args.encoder_type == "kpr" else {}
    return EncoderOptions(
        kind=args.encoder_type, model=str(args.encoder), query_model=args.query_encoder,
        similarity=args.similarity or "", title=args.title_mode or "", query_prefix=args.query_prefix,
        passage_prefix=args.passage_prefix, max_length=args.max_length, device=args.device, dtype=args.dtype,
        batch_tokens=args.batch_tokens, **run_inputs,
        max_entities=args.max_entities if args.encoder_type == "kpr" else EncoderOptions.max_entities)  # kpr's alone


def check_encoder(options: EncoderOptions, device_here: bool = True,
                  roles: tuple[str, ...] = ("passage", "query")) -> None:
    """``check_encoder_options`` with the hint worded for the command line (the flag of a bad option)."""
    try:
        check_encoder_options(options, device_here, roles)
    except SettingError as error:
        raise flags.worded(error, ENCODER_FLAGS) from error
    except MissingRunArtifactError as error:
        raise InputError(f"{error.message}: run `python run_pipeline.py {layout.STAGE_COMMANDS[error.stage]}` "
                         "first") from error


def recorded_files(output: str) -> list[tuple[str, str]]:
    """(path relative to OUT, sha256) of every output the manifest of ``output`` records."""
    return [(item.path, item.sha256) for record in manifest.load(output).values() for item in record.outputs]


def index_inputs(encoder: EncoderOptions, output: str) -> dict[str, str]:
    """The run's artifacts the encoder reads (names relative to OUT) with their digests, for index.json."""
    names = [name for name in (encoder.linker, encoder.entity_embeddings) if name]
    recorded = recorded_files(output) if names else []
    return {name: info.artifact_digest(recorded, name) for name in names}


class IndexStage:
    """Encode a passage corpus with a dense retriever and build sharded FAISS indexes."""

    name = layout.INDEX_STAGE
    outputs = layout.STAGE_OUTPUTS[layout.INDEX_STAGE]
    counters = COUNTERS

    def config(self, args: argparse.Namespace) -> IndexConfig:
        encoder = encoder_options(args)
        refresh = RefreshConfig.from_args(args)
        # what a run does not read is its default (recorded: another value would run the stage again for nothing)
        words = IndexConfig.words_per_passage if args.corpus else args.words_per_passage  # articles' passages alone
        duplicates = args.on_duplicate_id if args.corpus else IndexConfig.on_duplicate_id  # a corpus's ids alone
        memory = IndexConfig.shard_memory_gb if args.shards else args.shard_memory_gb  # sizes the shards not given
        return IndexConfig(encoder=encoder, corpus=args.corpus, words_per_passage=words,
                           on_duplicate_id=duplicates, shards=args.shards,
                           shard_memory_gb=memory, index_factory=args.index_factory,
                           faiss_gpu=not args.no_faiss_gpu, previous=refresh.previous,
                           require_reuse=refresh.require_reuse, model_workers=args.model_workers)

    def upstream(self, config: IndexConfig) -> tuple[str, ...]:
        """Passages cut from the dump read parse's articles; a KPR encoder reads the linker and embeddings."""
        stages = (layout.PARSE_STAGE,) if config.cuts_articles else ()
        kpr = config.encoder.kind == "kpr"
        return stages + ((layout.DICTIONARY_STAGE, layout.EMBED_ENTITIES_STAGE) if kpr else ())

    def options(self, config: IndexConfig) -> dict[str, Any]:
        return {**config.recorded_options(), **previous_options(refresh_of(config))}

    def external_inputs(self, config: IndexConfig) -> dict[str, str]:
        inputs = {"corpus": config.corpus} if config.corpus else {}
        return {**inputs, **encoder_files(config)}

    def content_inputs(self, config: IndexConfig) -> dict[str, str]:
        return encoder_files(config)  # not the corpus: 13 GB for DPR's

    def run(self, ctx: StageContext, config: IndexConfig) -> dict[str, int]:
        located = config.encoder.located(ctx.output)
        check_encoder(located, ctx.workers_run_here())
        located = located.resolved()
        dim = dense_dim(located)
        check_query_encoder(located, dim)
        check_index_factory(config, dim)
        columns = check_corpus(config.corpus) if config.corpus else None
        if columns is None and not fs.list_files(tables.artifact_dir(ctx.output, layout.ARTICLES), "*.parquet"):
            raise InputError(f"no --corpus and no articles under {ctx.output}: "
                             "run `python run_pipeline.py parse` first or pass --corpus psgs_w100.tsv")
        def compatible(old: dict[str, manifest.StageRecord]) -> str | None:
            return incompatibility(old, config, located)

        @functools.cache
        def own_problem() -> str | None:  # why the index OUT holds lends no vector (None: it lends)
            return own_index_problem(ctx.output, compatible)

        lenders = lending_runs(ctx.output, config, compatible, own_problem)
        counts = passage_counts(config.corpus, tables.artifact_dir(ctx.output, layout.ARTICLES),
                                config.words_per_passage)
        bucket_count = choice.bucket_count(config.shards, counts.high, dim, config.shard_memory_bytes)
        encoding = Encoding(dim, columns, bucket_count, counts.high, counts.expected, lenders)
        kept = kept_passages(ctx, passage_side(config.recorded_options()["encoder"]),
                             tuple(name for name in self.upstream(config) if name != layout.PARSE_STAGE))
        killed = kept_files(kept.directory)  # what a killed run kept: its passages are not encoded again
        save_array(kept.known, kept_keys(killed))
        files = encoding_files(ctx, model_workers(ctx, located.device, config.model_workers), encoding.estimate)
        counters = encode(ctx, config, located, encoding, kept, files)
        if killed:
            run_beam(ctx, lambda pipeline: pipeline | "StageKept" >> StageKeptPassages(
                killed, save_array(fs.join(kept.reused, "all.npy"), reused_keys(kept)), files, bucket_count, dim))
        counters = {**counters, **build_index(ctx, config, located, dim, bucket_count, counters, lenders)}
        return summed({"passages_reused": 0, "passages_encoded": 0}, counters)  # said also when none


def lending_runs(output: str, config: IndexConfig, compatible: Compatibility,
                 own_problem: Callable[[], str | None]) -> tuple[str, ...]:
    """The runs whose index lends the vectors of the passages unchanged since, in the order asked: --previous OLD_OUT
    (when it can lend), then OUT itself when it holds an index of this encoder (``own_problem()`` None): a rerun of a
    refresh takes the passages new since OLD_OUT from its own index, a rerun in place all of them."""
    if not config.previous:
        return tuple(filter(None, [own_index(output, own_problem())]))
    own = "the vectors of the index this OUT holds"
    previous = reusable_previous(refresh_of(config), layout.INDEX_STAGE, (layout.INDEX_STAGE,), compatible,
                                 lambda: None if own_problem() else own)
    if (problem := own_problem()) is not None:
        if previous and problem != NO_INDEX:
            print(f"[index] the index this OUT holds lends no vector ({problem})", file=sys.stderr)
        return (previous,) if previous else ()
    if previous:
        print(f"[index] and {own} (of this encoder) where those of {previous} do not serve", file=sys.stderr)
    return (*filter(None, [previous]), output)


def factory_flag_error(error: choice.FactoryError) -> InputError:
    return InputError(f"--index-factory {error.factory!r}: {error.problem}")


def check_query_encoder(options: EncoderOptions, dim: int) -> None:
    """A one-line error for a --query-encoder whose vectors are not the passages' size: every search of the index
    would be refused (its config says so before any passage is encoded)."""
    if options.query_model:
        query_dim = dense_dim(replace(options, model=options.query_model))
        if query_dim != dim:
            raise InputError(f"--query-encoder {options.query_model} gives {query_dim}-dim vectors and --encoder "
                             f"{options.model} {dim}-dim ones: every search of this index would be refused")


def check_index_factory(config: IndexConfig, dim: int) -> None:
    """--index-factory against the encoder's vector size, before any passage is encoded (its IVF lists against
    the corpus are checked once the passages are counted)."""
    if not config.index_factory:
        return
    try:
        choice.check_factory_string(config.index_factory, dim)
    except choice.FactoryError as error:
        raise factory_flag_error(error) from error


def check_before_encoding(config: IndexConfig, device_here: bool) -> None:
    """What `all` checks of the index stage before its first stage: the encoder (not a KPR one, which also needs
    the linker and entity embeddings that the run makes), the corpus's header and the index factory."""
    if config.encoder.kind != "kpr":
        check_encoder(config.encoder, device_here)
    if config.corpus:
        check_corpus(config.corpus)
    check_index_factory(config, dense_dim(config.encoder))


def encoder_files(config: IndexConfig) -> dict[str, str]:
    """The local model files of the encoders, by role (fingerprinted: replaced weights rerun the stage)."""
    return model_files({PASSAGE_ROLE: config.encoder.model, QUERY_ROLE: config.encoder.query_model})


def refresh_of(config: IndexConfig) -> RefreshConfig:
    return RefreshConfig(config.previous, config.require_reuse)


PASSAGES_ROW_GROUP_BYTES = 8 << 20  # what the passages/ writer holds (Beam's default, 64 MB, is a corpus's text here)
PREVIOUS_DIGESTS_DIR = "previous-digests"  # --previous: the old shards' (id, digest) tables, in the staging root


def work_dir(ctx: StageContext) -> str:
    """The encoding's own files (inputs, kept keys, the saved tokenizer): removed with the staging directory."""
    return fs.join(ctx.staging_root, "work")


def buckets_dir(ctx: StageContext) -> str:
    """Where encoded rows are staged by bucket (not an artifact: removed with the stage's staging directory)."""
    return fs.join(ctx.staging_root, files.BUCKETS_DIR)


@dataclass(frozen=True)
class Encoding:
    """What the encoding pipelines are given: the vectors' size, the corpus's columns (None: passages cut from
    articles), the buckets to stage by, the passages estimated on the high side (``estimate``: sizes the input
    files) and as likely more as fewer (``expected``: for progress) and the runs that lend vectors, in order."""

    dim: int
    columns: tuple[int, int, int] | None
    bucket_count: int
    estimate: int
    expected: int
    lenders: tuple[str, ...]


def kept_passages(ctx: StageContext, encoder: dict[str, Any], upstream: tuple[str, ...]) -> KeptPassages:
    """Where the stage keeps what it encodes for a rerun, with the encoder's part of every passage key: its recorded
    options (``encoder``: the passage side's), its model (a local one by its files' content, wherever it lies) and
    the outputs of the ``upstream`` stages a KPR encoder reads (linker, entity embeddings). Not the index's own
    settings (factory, shards: a rerun with another factory after one that failed reuses every passage) nor where
    the passages came from: a key holds the passage's id and content."""
    records = manifest.load(ctx.output)
    identity = [manifest.canonical_options({"encoder": {**encoder, "model": model_identity(encoder["model"])}}),
                {},  # where a local model's file fingerprints stood before 2026-12-07: a hub model's keys are kept
                [records[name].outputs_digest() for name in upstream if name in records]]
    salt = hashlib.blake2b(json.dumps(identity, sort_keys=True).encode(), digest_size=16).hexdigest()
    work = work_dir(ctx)
    return KeptPassages(ctx.kept_root, fs.join(work, "known-keys.npy"), fs.join(work, "reused"), salt)


def reused_keys(kept: KeptPassages) -> np.ndarray:
    """The keys every follower saved of the passages it did not encode, sorted."""
    return np.sort(np.concatenate([np.zeros(0, np.uint64),
                                   *(load_array(path) for path in fs.list_files(kept.reused, "reused-*.npy"))]))


def encoding_files(ctx: StageContext, followers: int, estimate: int) -> EncodingFiles:
    """Where the encoding pipelines write, with input files for ``estimate`` passages (0: as many as read) and
    ``followers`` processes that hold the model."""
    work = work_dir(ctx)
    rows = rows_per_file(estimate, INPUT_FILE_ROWS) if estimate else INPUT_FILE_ROWS
    inputs = FollowedFiles(fs.join(work, "inputs"), INPUT_PREFIX, fs.join(work, "inputs.list"),
                           fs.join(work, "inputs.ended"), followers, files_per_step(rows, INPUT_FILE_ROWS))
    return EncodingFiles(inputs, buckets_dir(ctx), rows)


def encode(ctx: StageContext, config: IndexConfig, encoder: EncoderOptions, encoding: Encoding,
           kept: KeptPassages, files: EncodingFiles) -> dict[str, int]:
    """The passages read and their inputs built by every worker (``prepare``), encoded beside it by the processes
    that hold the model (``EncodePassages``); the counters of both."""
    files = replace(files, tokenizer=saved_tokenizer(ctx, encoder.spec("passage").name_or_path, work_dir(ctx)))

    def model(forward: StageContext) -> Build:
        encode_passages = EncodePassages(encoder, files, encoding.bucket_count, encoding.dim, kept,
                                         forward.progress_settings("passages encoded", encoding.expected))
        return with_dead_letters(forward, "EncodePassages", encode_passages, "vectors")

    return run_model_beside(ctx, lambda pipeline: prepare(pipeline, ctx, config, encoder, encoding, files, kept.salt),
                            model, files.inputs)


def prepare(pipeline: beam.Pipeline, ctx: StageContext, config: IndexConfig, encoder: EncoderOptions,
            encoding: Encoding, files: EncodingFiles, salt: str) -> None:
    """ReadPassages | PreparePassages (each passage keyed under the encoder of ``salt``), plus the passages cut
    from articles and the dead letters."""
    passages, dead = pipeline | "ReadPassages" >> ReadPassages(config.corpus, encoding.columns, ctx.output,
                                                               config.words_per_passage, config.on_duplicate_id)
    if encoding.columns is None:
        _ = (passages | "PassageRows" >> beam.Map(Passage.to_row)
             | "WritePassages" >> beam.io.WriteToParquet(ctx.staged_prefix(layout.PASSAGES), schemas.PASSAGES,
                                                         file_name_suffix=".parquet", codec=schemas.PARQUET_CODEC,
                                                         row_group_buffer_size=PASSAGES_ROW_GROUP_BYTES))
    _ = passages | "PreparePassages" >> PreparePassages(
        encoder, files, encoding.bucket_count, encoding.dim, salt, ctx.progress("passages prepared", encoding.expected),
        encoding.lenders, fs.join(ctx.staging_root, PREVIOUS_DIGESTS_DIR))
    _ = dead | "WriteDeadLetters" >> WriteDeadLetters(ctx.errors_prefix("passages"))


def shard_count(config: IndexConfig, total: int, dim: int, bucket_count: int) -> int:
    """--shards, else the fewest shards within --shard-memory-gb (said on stderr when they must hold more)."""
    if config.shards:
        return config.shards
    chosen = choice.chosen_shards(total, dim, config.shard_memory_bytes, bucket_count)
    if choice.shards_for_memory(total, dim, config.shard_memory_bytes) > chosen:
        print(f"[{layout.INDEX_STAGE}] {total:,} passages need more than {bucket_count} shards to stay within "
              f"--shard-memory-gb {config.shard_memory_gb}: {chosen} shards of "
              f"{choice.vector_bytes(total, dim) / chosen / choice.GB:.1f} GB of vectors; rerun with --shards N",
              file=sys.stderr)
    return chosen


def no_passage_message(ctx: StageContext, config: IndexConfig, read_counters: Mapping[str, int]) -> str:
    """Why no passage reached the index: every one was dead-lettered (named where the dead letters are: the
    stage did not commit them), or the input has none (a corpus with its header only, articles without text)."""
    source = config.corpus or ctx.final(layout.ARTICLES)
    dead = sum(value for name, value in read_counters.items() if name in COUNTERS and COUNTERS[name].dead_lettered)
    if dead:
        return f"no passage of {source} could be indexed: {dead:,} dead-lettered, see {ctx.staged_errors}"
    if config.corpus:
        return f"corpus {source} has a header only: no passage to index"
    return f"{source} has no article text to cut into passages"


def plan_index(ctx: StageContext, config: IndexConfig, encoder: EncoderOptions, dim: int, bucket_count: int,
               read_counters: Mapping[str, int]) -> IndexPlan:
    """The shards, index type, sample and index.json fields, from the exact count of the staged vectors
    (``read_counters``: those of reading and encoding the passages, to say why there is none)."""
    index_dir = ctx.staged(layout.INDEX)
    records = buckets.read_bucket_files(fs.list_files(buckets_dir(ctx), f"{files.BUCKET_LIST_NAME}*"))
    total = sum(record.rows for record in records)
    if total == 0:
        raise InputError(no_passage_message(ctx, config, read_counters))
    shards = shard_count(config, total, dim, bucket_count)
    factory = config.index_factory or choice.default_factory(total, dim)
    try:
        choice.check_factory(factory, total, dim)
    except choice.FactoryError as error:
        raise factory_flag_error(error) from error
    sample_size = choice.training_sample_size(factory, total, dim)
    estimate = choice.memory_estimate(factory, total, dim)
    specs = tuple((files.shard_name(shard), tuple((bucket, tuple(paths)) for bucket, paths in grouped))
                  for shard, grouped in sorted(buckets.shard_buckets(records, shards).items()))
    print(f"[{layout.INDEX_STAGE}] {total:,} passages x {dim} dims, {shards} shard(s): {factory}, "
          f"{estimate.describe(shards)}", file=sys.stderr)
    for line in choice.thin_training(factory, total, dim):
        print(f"[{layout.INDEX_STAGE}] {line}", file=sys.stderr)
    stored = replace(encoder, linker=config.encoder.linker, entity_embeddings=config.encoder.entity_embeddings)
    # index.json names the run's artifacts relative to OUT, so a moved run reads its own linker and embeddings
    fields = {"factory": factory, "metric": encoder.similarity, "dim": dim, "count": total, "shards": shards,
              "encoder": stored.to_json(), "train_sample": sample_size,
              "inputs": index_inputs(config.encoder, ctx.output)}
    plan = IndexPlan(index_dir, specs, factory, dim, sample_size, config.faiss_gpu, fields)
    require_room_to_build(ctx, plan, estimate.index_bytes)
    return plan


def require_room_to_build(ctx: StageContext, plan: IndexPlan, index_bytes: int) -> None:
    """Refuse, before the build, an index that will not fit on the filesystem of OUT: its files (``index_bytes``,
    as estimated) and its shards' vector files (the staged buckets rewritten sorted, about their size), while the
    staged buckets are still there (they are removed after the build)."""
    space = disk_space.space_of(ctx.output)
    if space.free is None:
        return
    vectors = sum(fs.size(path) for path in plan.staged_files)
    purpose = (f"to build the index ({fs.human_size(index_bytes)} of index files, {fs.human_size(vectors)} of shard "
               "vectors)")
    disk_space.require_room(layout.STAGE_COMMANDS[ctx.stage], ctx.output, "--output", index_bytes + vectors, purpose,
                            space)


def build_index(ctx: StageContext, config: IndexConfig, encoder: EncoderOptions, dim: int, bucket_count: int,
                read_counters: Mapping[str, int], lenders: tuple[str, ...] = ()) -> dict[str, int]:
    plan = plan_index(ctx, config, encoder, dim, bucket_count, read_counters)
    reused_trained = previous_quantizer(lenders, plan.index_dir, plan.factory, dim) if plan.sample_size else None
    # one worker per shard at most: each builds whole shards
    counters = run_beam(ctx.with_workers_at_most(len(plan.shards)),
                        lambda pipeline: pipeline | "BuildIndex" >> BuildIndex(plan, reused_trained))
    fs.delete_tree(buckets_dir(ctx))
    return {**counters, "train_sample": plan.sample_size}


# --- refresh (--previous): vectors of unchanged passages come from the previous run ---------------------------


def incompatibility(old: dict[str, manifest.StageRecord], config: IndexConfig,
                    encoder: EncoderOptions) -> str | None:
    """Why the previous run's passage vectors differ from what this encoder computes (None: they do not)."""
    if encoder.kind == "kpr":
        return "KPR passage vectors depend on this run's linker and entity embeddings"
    record = old[layout.INDEX_STAGE]
    # the passage model's files only (by content: the same model at another path is no change); a changed corpus is
    # what a refresh is for
    changed = fingerprint_changes(record, encoder_files(config), roles=(PASSAGE_ROLE,))
    current = passage_side(effective_encoder(STAGE.options(config)["encoder"]))
    recorded = moved_model_option(record, passage_side(effective_encoder(record.options.get("encoder", {}))), current,
                                  PASSAGE_ROLE, changed)
    changes = manifest.option_changes(recorded, current) + [f"{role}: model files changed" for role in changed]
    return f"it was built with another encoder ({'; '.join(changes)})" if changes else None


# encoder options that change the query vectors alone (a search can even take another query encoder): passage vectors
# of an index built with others are reused
QUERY_ONLY_OPTIONS = ("query_model", "query_prefix")
PASSAGE_ROLE = "encoder"  # the role of the passage model's files (``encoder_files``)
QUERY_ROLE = "query_encoder"  # the role of a query model of its own (--query-encoder)


def passage_side(encoder: dict[str, Any]) -> dict[str, Any]:
    """Recorded encoder options without those that change only the query vectors."""
    return {name: value for name, value in encoder.items() if name not in QUERY_ONLY_OPTIONS}


def effective_encoder(recorded: dict[str, Any]) -> dict[str, Any]:
    """Recorded options of a DPR, BGE or mean encoder with the kind's defaults filled in: an option left at its
    default and the default named (``--similarity cosine`` of a mean encoder) are one encoder."""
    return EncoderOptions.from_json(recorded).resolved().to_json()


# ``own_index_problem`` of an OUT without a committed index
NO_INDEX = "it holds no index"


def own_index_problem(output: str, compatible: Compatibility) -> str | None:
    """None when OUT holds a committed index of this encoder whose files that lend vectors (index.json and the
    shards' embeddings) are as recorded, else why not (``NO_INDEX`` when it has none yet). A FAISS file lost or
    damaged since is built again from the embeddings (and a trained quantizer, checked where it is reused)."""
    records = manifest.load(output)
    record = records.get(layout.INDEX_STAGE)
    if record is None:
        return NO_INDEX
    index_dir = f"{layout.INDEX}/"
    lending = [item for item in record.outputs if item.path == f"{index_dir}{files.INDEX_JSON}"
               or item.path.startswith(f"{index_dir}{files.EMBEDDINGS_DIR}/")]
    return compatible(records) or verified.changed_files(output, lending, hash_remote=False)


def own_index(output: str, problem: str | None) -> str | None:
    """OUT itself as the run that lends passage vectors when it can (``problem`` None, ``own_index_problem``): a
    rerun in place (another --index-factory or --shards, a changed corpus, articles parsed again, which leaves the
    rest of OUT stale until it reruns) encodes only the passages that are new or changed, as a refresh from OUT
    would. None when OUT has no index yet, and when it cannot lend (printing why: every passage is encoded
    again)."""
    if problem == NO_INDEX:
        return None
    if problem is not None:
        print(f"[index] encoding every passage: the index this OUT holds lends no vector ({problem})",
              file=sys.stderr)
        return None
    print("[index] reusing the vectors of the index this OUT holds where nothing changed", file=sys.stderr)
    return output


def previous_quantizer(lenders: tuple[str, ...], index_dir: str, factory: str, dim: int) -> str | None:
    """The trained index of the first run in ``lenders`` whose factory and dimension agree, copied into
    ``index_dir``; None (and, where a run lends vectors, a line saying why the quantizer is trained again)
    otherwise."""
    unfit = []
    for run in lenders:
        trained = fs.join(run, layout.INDEX, files.TRAINED_NAME)
        why = (unfit_quantizer(trained, info.load_index_info(fs.join(run, layout.INDEX)), factory, dim)
               or unrecorded_quantizer(run))
        if why is None:
            path = fs.join(index_dir, files.TRAINED_NAME)
            fs.mkdirs(index_dir)  # a local copy makes no directory
            FileSystems.copy([trained], [path])
            print(f"[index] reusing the trained quantizer of {run} ({factory} x {dim})", file=sys.stderr)
            return path
        unfit.append(f"{run} {why}")
    if unfit:
        print(f"[index] training the quantizer again: {'; '.join(unfit)}", file=sys.stderr)
    return None


def unrecorded_quantizer(run: str) -> str | None:
    """Why the trained.faiss of ``run`` is not the one its index stage recorded (changed or lost since; one of the
    same shape would start every shard on other centroids), else None."""
    path = f"{layout.INDEX}/{files.TRAINED_NAME}"
    items = [item for item in manifest.load(run)[layout.INDEX_STAGE].outputs if item.path == path]
    if not items:
        return f"recorded no {files.TRAINED_NAME}"
    changed = verified.changed_files(run, items, hash_remote=False)
    return None if changed is None else f"has a {files.TRAINED_NAME} other than it recorded ({changed})"


def unfit_quantizer(trained: str, old: info.IndexInfo, factory: str, dim: int) -> str | None:
    """Why the trained index ``trained`` of an index ``old`` cannot start the shards of ``factory`` x ``dim`` (its
    file read back: one of another shape would fail every shard); None when it can."""
    if (old.factory, old.dim) != (factory, dim):
        return f"has {old.factory} x {old.dim}, this one needs {factory} x {dim}"
    if not fs.exists(trained):
        return f"has no {files.TRAINED_NAME}"
    reason = trained_file_reason(trained, factory, dim)
    return None if reason is None else f"has a {files.TRAINED_NAME} that {reason}"


STAGE = IndexStage()
