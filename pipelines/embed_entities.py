"""embed-entities: [MASK] vectors of each entity's sampled mentions, averaged and norm-matched, as Parquet."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from artifacts import fs, layout, schemas, tables
from artifacts.errors import InputError, ModelError
from artifacts.run import manifest, verified
from artifacts.run.publish import copy_file
from encoders.models import model_files
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
    RefreshConfig,
    fingerprint_changes,
    model_identity,
    moved_model_option,
    previous_options,
    reusable_previous,
)
from transforms.common.mention_sampling import CHARS_PER_TOKEN
from transforms.embed_entities.gather import save_store_index
from transforms.embed_entities.graph import (
    COUNTERS,
    EmbedConfig,
    EmbedInputs,
    EncodeMentions,
    PrepareMentions,
    ReduceEntities,
    listed_parts,
    model_facts,
    read_facts,
    reuse_counters,
)
from transforms.embed_entities.window_store import model_salt, store_files, write_known_keys

PREVIOUS_STAGES = (layout.DICTIONARY_STAGE, layout.MENTIONS_STAGE, layout.EMBED_ENTITIES_STAGE)


class EmbedEntitiesStage:
    """Embed every entity from its sampled mentions with a BERT-family model ([MASK] in place of the mention)."""

    name = layout.EMBED_ENTITIES_STAGE
    outputs = layout.STAGE_OUTPUTS[layout.EMBED_ENTITIES_STAGE]
    counters = COUNTERS

    def config(self, args: argparse.Namespace) -> EmbedConfig:
        refresh = RefreshConfig.from_args(args)
        return EmbedConfig(
            model=str(args.model), layer=args.layer, max_seq_length=args.max_seq_length, device=args.device,
            dtype=args.dtype, batch_tokens=args.batch_tokens, embedding_dtype=args.embedding_dtype,
            mask_window=args.mask_window, previous=refresh.previous, require_reuse=refresh.require_reuse,
            model_workers=args.model_workers, keep_mention_vectors=getattr(args, "keep_mention_vectors", True))

    def upstream(self, config: EmbedConfig) -> tuple[str, ...]:
        # parse: articles/, where the mention windows are cut
        return (layout.PARSE_STAGE, layout.DICTIONARY_STAGE, layout.MENTIONS_STAGE)

    def options(self, config: EmbedConfig) -> dict[str, Any]:
        return {"model": config.model, "layer": config.layer, "max_seq_length": config.max_seq_length,
                "dtype": config.dtype, "embedding_dtype": config.embedding_dtype, "mask_window": config.mask_window,
                **({} if config.keep_mention_vectors else {"keep_mention_vectors": False}),
                **previous_options(refresh_of(config))}

    def external_inputs(self, config: EmbedConfig) -> dict[str, str]:
        return model_files({"model": config.model})

    def content_inputs(self, config: EmbedConfig) -> dict[str, str]:
        return self.external_inputs(config)

    def run(self, ctx: StageContext, config: EmbedConfig) -> dict[str, int]:
        chars = context_chars(ctx.output, config.max_seq_length)  # refused before anything is written
        mentions = tables.total_rows(ctx.output, layout.MENTIONS)
        facts = model_facts(config, mentions) if ctx.workers_run_here() else None
        salt = window_salt(config)
        previous = reusable_previous(refresh_of(config), self.name, PREVIOUS_STAGES,
                                     lambda old: incompatibility(old, recorded_mentions(ctx.output), config, salt),
                                     lambda: own_windows(ctx, config, salt))
        scratch = fs.join(ctx.staging_root, "work")
        renumbered = config.previous if previous is None and config.previous and entities_intact(config.previous) \
            else None
        kept_refresh = own_refresh(ctx.output, config) if config.previous and not (previous or renumbered) else None
        inputs = EmbedInputs(output=ctx.output, mentions=mentions, embeddings=ctx.staged(layout.ENTITY_EMBEDDINGS),
                             scratch=scratch, pending=ctx.kept_root, salt=salt,
                             store=ctx.staged(layout.MENTION_VECTORS), id_map=ctx.staged(layout.ENTITY_ID_MAP),
                             followers=model_workers(ctx, config.device, config.model_workers), previous=previous,
                             renumbered_from=renumbered, tokenizer=saved_tokenizer(ctx, config.model, scratch))
        # the windows stored before (a previous run's, this OUT's, a killed run's) are not encoded again
        stores = store_directories(ctx, previous)
        write_known_keys(store_files(stores, salt), inputs.files.known)
        prepare = PrepareMentions(config, inputs, facts, chars, ctx.progress("mentions prepared", mentions))

        def model(forward: StageContext) -> Build:
            encode = EncodeMentions(config, inputs, forward.progress_settings("mentions encoded", mentions))
            return with_dead_letters(forward, "EncodeMentions", encode, "vectors")

        # The GPU's pipeline runs beside the inputs' one, encoding the inputs as they are written.
        counters = run_model_beside(ctx, with_dead_letters(ctx, "PrepareMentions", prepare, "mentions"), model,
                                    inputs.files.followed)
        require_finite_vectors(config, counters)
        facts = read_facts(inputs)
        save_store_index(inputs.store_index, store_files(stores, salt))
        reduce = ReduceEntities(config, inputs, listed_parts(inputs), facts)
        reducing = ctx.with_workers_at_most(facts.buckets)  # a bucket is a unit of work: no idle worker to start
        counters = summed(counters, run_beam(reducing, with_dead_letters(reducing, "ReduceEntities", reduce,
                                                                         "entities")))
        counters = summed({"mentions_encoded": 0, "mentions_reused": 0}, counters)  # said also when none
        if kept_refresh is not None:
            keep_id_map(ctx, kept_refresh)
            if own_windows(ctx, config, salt) and layout.MENTIONS_STAGE not in rebuilt_upstream(ctx.output,
                                                                                             kept_refresh):
                counters |= {name: kept_refresh.counters.get(name, 0)  # its comparison with that run still holds
                             for name in ("entities_reused", "entities_recomputed")}
        return reuse_counters(counters) if config.previous else counters


def own_windows(ctx: StageContext, config: EmbedConfig, salt: str) -> str | None:
    """What this OUT's own store lends (read whether or not a previous run lends too), when its committed stage
    holds windows of this model cut with these options (a store of another --max-seq-length lends next to
    nothing)."""
    record = manifest.load(ctx.output).get(layout.EMBED_ENTITIES_STAGE)
    if record is None or window_changes(record, config) \
            or not store_files([ctx.final(layout.MENTION_VECTORS)], salt):
        return None
    return "the windows of this OUT's mention_vectors/"


def own_refresh(output: str, config: EmbedConfig) -> manifest.StageRecord | None:
    """This OUT's committed refresh from ``config.previous`` where that run can be read no more (deleted since) and
    OUT's entities are still those the refresh read: its entity id map (made of the entities alone) still holds,
    and could not be made again."""
    if fs.exists(manifest.manifest_path(str(config.previous))):  # it can be read: what it lends is decided anew
        return None
    record = manifest.load(output).get(layout.EMBED_ENTITIES_STAGE)
    if record is None or record.options.get(manifest.PREVIOUS_OPTION) != config.previous \
            or layout.DICTIONARY_STAGE in rebuilt_upstream(output, record):
        return None
    return record if any(item.path.startswith(f"{layout.ENTITY_ID_MAP}/") for item in record.outputs) else None


def rebuilt_upstream(output: str, record: manifest.StageRecord) -> list[str]:
    """The stages of ``output`` that ran again since ``record``'s stage read them."""
    return manifest.rebuilt_since(record, manifest.load(output))


def keep_id_map(ctx: StageContext, record: manifest.StageRecord) -> None:
    """The committed refresh's entity id map staged again, said in a line."""
    maps = [item.path for item in record.outputs if item.path.startswith(f"{layout.ENTITY_ID_MAP}/")]
    for path in maps:
        copy_file(fs.join(ctx.output, path), fs.join(ctx.staging_root, path))
    print(f"[embed-entities] keeping the entity id map of the refresh from {record.options[manifest.PREVIOUS_OPTION]} "
          "this OUT holds (that run can be read no more; OUT's entities are those it mapped)", file=sys.stderr)


def entities_intact(previous: str) -> bool:
    """Whether the previous run's entities/ are as its manifest records (then its ids map to this run's, whether or
    not it lends vectors: a copy published without its mention vectors, a run of another model)."""
    record = manifest.load(previous).get(layout.DICTIONARY_STAGE)
    entities = [item for item in record.outputs if item.path.startswith(f"{layout.ENTITIES}/")] if record else []
    return bool(entities) and verified.changed_files(previous, entities, hash_remote=False) is None


def require_finite_vectors(config: EmbedConfig, counters: dict[str, int]) -> None:
    """A ``ModelError`` when no vector the model returned was finite: every mention would be dead-lettered and the
    stage would commit no entity vector (a few non-finite ones are dead-lettered and counted)."""
    encoded, bad = counters.get("mentions_encoded", 0), counters.get("non_finite_windows", 0)
    if encoded and bad >= encoded:
        raise ModelError(config.model, f"every vector {config.model} returned was NaN or infinite ({bad:,} of "
                         f"{encoded:,} windows, computed in {config.dtype}, stored as float16: at most 65,504): its "
                         "weights are damaged, or its values overflow; nothing was committed")


def window_salt(config: EmbedConfig) -> str:
    """The model's part of every window key: the model (a local one by its files' content, wherever it lies), the
    layer and dtype. The empty mapping stands where a local model's file fingerprints stood before 2026-12-07: a
    hub model's stores keep their keys."""
    return model_salt([model_identity(config.model), {}, config.layer, config.dtype])


def store_directories(ctx: StageContext, previous: str | None) -> list[str]:
    """Where windows encoded before may be stored: what a killed run kept, this OUT's store (an earlier run of
    the stage) and the previous run's in a refresh."""
    return [ctx.kept_root, ctx.final(layout.MENTION_VECTORS),
            *([fs.join(previous, layout.MENTION_VECTORS)] if previous else [])]


def refresh_of(config: EmbedConfig) -> RefreshConfig:
    return RefreshConfig(config.previous, config.require_reuse)


def context_chars(output: str, max_seq_length: int) -> int:
    """Characters of context per side of a mention, as the mentions stage cut them (its --max-seq-length);
    an error if ``mentions/`` holds the windows themselves (written before windows were cut at embed time), or
    if this stage's ``max_seq_length`` asks for more tokens than the mentions were cut for (its windows would
    silently be the narrower ones)."""
    names = tables.file_schema(tables.parquet_files(output, layout.MENTIONS)[0]).names
    missing = set(schemas.MENTIONS.names) - set(names)
    if missing:
        raise InputError(f"{output}/mentions has no {', '.join(sorted(missing))} column (written by an older "
                         "version that stored context windows): run mentions again")
    cut_for = int(manifest.load(output)[layout.MENTIONS_STAGE].options["max_seq_length"])
    if max_seq_length > cut_for:
        raise InputError(f"--max-seq-length {max_seq_length} is more than the {cut_for} tokens the mentions under "
                         f"{output} were cut for: run `python run_pipeline.py mentions --output {shlex.quote(output)} "
                         f"--max-seq-length {max_seq_length}` first, or give --max-seq-length {cut_for} or less")
    return cut_for * CHARS_PER_TOKEN


# options that change how the entity vectors are stored, not the windows' vectors (stored as float16 whatever they are)
STORAGE_OPTIONS = ("embedding_dtype",)


def window_changes(record: manifest.StageRecord, config: EmbedConfig) -> list[str]:
    """What differs between the recorded run and ``config`` that changes the windows' vectors: options, and the
    model's files (by content: the same model at another path is no change)."""
    def of_windows(options: dict[str, Any]) -> dict[str, Any]:
        return {name: value for name, value in options.items() if name not in STORAGE_OPTIONS}

    changed = fingerprint_changes(record, STAGE.external_inputs(config))
    current = of_windows(STAGE.options(config))
    recorded = moved_model_option(record, of_windows(record.options), current, "model", changed)
    return manifest.option_changes(recorded, current) + [f"{role}: model files changed" for role in changed]


def recorded_mentions(output: str) -> dict[str, Any]:
    """The options the mentions under ``output`` were sampled with."""
    return manifest.load(output)[layout.MENTIONS_STAGE].options


def incompatibility(old: dict[str, manifest.StageRecord], mentions_options: dict[str, Any], config: EmbedConfig,
                    salt: str) -> str | None:
    """Why the previous run's vectors differ from what this run would compute from mentions sampled with
    ``mentions_options``, or it kept none (None: they do not)."""
    stage, mentions = layout.EMBED_ENTITIES_STAGE, layout.MENTIONS_STAGE
    changes = window_changes(old[stage], config)
    changes += [f"mentions' {change}" for change in manifest.option_changes(old[mentions].options, mentions_options)]
    if changes:
        return f"it was built with other options ({'; '.join(changes)})"
    stores = [fs.join(str(config.previous), layout.MENTION_VECTORS)]
    if not store_files(stores, salt):
        if store_files(stores, None):  # of this model and options: keyed as an earlier version keyed them
            return ("it stored its mention vectors under the keys an earlier version gave a local model (by its files' "
                    "paths and times, before 2026-12-07), which this one does not read")
        return ("it kept no mention vectors (built with --no-mention-vectors, published without "
                "--with-mention-vectors, or by an older version)")
    return None


STAGE = EmbedEntitiesStage()
