"""embed-entities: [MASK] vectors of each entity's sampled mentions, averaged and norm-matched, as Parquet."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.ml.inference.base import PredictionResult, RunInference

from artifacts import schemas, tables
from artifacts.errors import InputError
from artifacts.run import manifest
from encoders.mask_encoder import MASK_WINDOWS, MaskEncoderHandler, check_mask_model
from encoders.models import ModelSpec, hidden_size, input_embedding_norm, model_files
from pipelines import flags
from pipelines.refresh import RefreshConfig, fingerprint_changes, previous_options, reusable_previous
from pipelines.stage import StageContext, run_beam
from transforms.dead_letters import WriteDeadLetters, count, dead_letter
from transforms.mention_sampling import CHARS_PER_TOKEN
from transforms.mention_windows import CutMentionWindows
from transforms.refresh import SplitEntitiesForRefresh, option_changes

EMBEDDING_DTYPES = {"float32": pa.float32(), "float16": pa.float16()}


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


class EmbedEntitiesStage:
    """Embed every entity from its sampled mentions with a BERT-family model ([MASK] in place of the mention)."""

    name = "embed_entities"
    outputs = ("entity_embeddings", "entity_id_map")
    flag_groups = (flags.RUNTIME, flags.SEQUENCE, flags.REFRESH)

    def config(self, args: argparse.Namespace) -> argparse.Namespace:
        return args  # transitional: the flags themselves until this stage has its frozen config

    def upstream(self, args: argparse.Namespace) -> tuple[str, ...]:
        return ("parse", "dictionary", "mentions")  # parse: articles/, where the mention windows are cut

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("embed-entities")
        group.add_argument("--model", help="local directory or hub name of a BERT-family model with [MASK]")
        group.add_argument("--layer", type=int, default=-1, help="hidden layer whose [MASK] output is used")
        group.add_argument("--embedding-dtype", choices=sorted(EMBEDDING_DTYPES), default="float32",
                           help="value type of the stored vectors")
        group.add_argument("--mask-window", choices=MASK_WINDOWS, default="reference",
                           help="context split around [MASK]: the paper's (larger half before) or centered")

    def options(self, args: argparse.Namespace) -> dict[str, Any]:
        return {"model": str(args.model), "layer": args.layer, "max_seq_length": args.max_seq_length,
                "dtype": args.dtype, "embedding_dtype": args.embedding_dtype, "mask_window": args.mask_window,
                **previous_options(RefreshConfig.from_args(args))}

    def external_inputs(self, args: argparse.Namespace) -> dict[str, str]:
        return model_files({"model": args.model})

    def run(self, ctx: StageContext, args: argparse.Namespace) -> dict[str, int]:
        if not args.model:
            raise InputError("embed-entities needs --model NAME_OR_PATH (a BERT-family model with [MASK])")
        spec = ModelSpec(str(args.model), args.device, args.dtype)
        check_mask_model(spec, args.layer, args.max_seq_length)
        target_norm = input_embedding_norm(spec)
        schema = schemas.entity_embeddings(hidden_size(spec), EMBEDDING_DTYPES[args.embedding_dtype]).with_metadata({
            "model": str(args.model), "layer": str(args.layer), "target_norm": repr(target_norm),
            "dtype": args.dtype, "embedding_dtype": args.embedding_dtype,
            "max_seq_length": str(args.max_seq_length), "mask_window": args.mask_window})
        handler = MaskEncoderHandler(spec, args.layer, args.batch_tokens, max_seq_length=args.max_seq_length,
                                     window=args.mask_window)
        previous = reusable_previous(RefreshConfig.from_args(args), self.name, PREVIOUS_STAGES,
                                     lambda old: incompatibility(old, args))
        chars = context_chars(args.output)

        def build(pipeline: beam.Pipeline) -> None:
            refs = pipeline | "ReadMentions" >> beam.io.ReadFromParquet(
                tables.parquet_pattern(args.output, "mentions"), columns=schemas.MENTIONS.names)
            refs, reused = split_for_refresh(pipeline, ctx, refs, args, previous)
            articles = pipeline | "ReadArticles" >> beam.io.ReadFromParquet(
                tables.parquet_pattern(args.output, "articles"), columns=["page_id", "text"])
            mentions = {"refs": refs, "articles": articles} | "CutMentionWindows" >> CutMentionWindows(chars)
            inputs = (mentions.mentions
                      | "BatchMentions" >> beam.BatchElements(min_batch_size=64, max_batch_size=512)
                      | "Embeddable" >> beam.FlatMap(embeddable).with_outputs("dead_letter", main="inputs"))
            vectors = (inputs.inputs | "EncodeMasks" >> RunInference(handler)
                       | "Progress" >> ctx.progress("mentions", tables.total_rows(args.output, "mentions"))
                       | "KeepFinite" >> beam.FlatMap(finite_vector).with_outputs("dead_letter", main="vectors"))
            means = vectors.vectors | "MeanPerEntity" >> beam.CombinePerKey(MeanVector())
            entities = (pipeline | "ReadEntities" >> beam.io.ReadFromParquet(
                tables.parquet_pattern(args.output, "entities"), columns=["entity_id", "title", "qid"])
                | "EntityInfo" >> beam.Map(lambda e: (e["entity_id"], (e["title"], e["qid"]))))
            rows = ({"entity": entities, "mean": means} | "JoinEntities" >> beam.CoGroupByKey()
                    | "NormMatch" >> beam.FlatMapTuple(embedding_row, target_norm).with_outputs(
                        "dead_letter", main="rows"))
            _ = with_reused(rows.rows, reused) | "WriteEmbeddings" >> beam.io.WriteToParquet(
                ctx.staged_prefix("entity_embeddings"), schema, file_name_suffix=".parquet",
                codec=schemas.PARQUET_CODEC)
            dead = ((mentions.dead_letter, inputs.dead_letter, vectors.dead_letter, rows.dead_letter)
                    | "AllDeadLetters" >> beam.Flatten())
            _ = dead | "WriteDeadLetters" >> WriteDeadLetters(ctx.errors_prefix("mentions"))

        counters = run_beam(ctx, build)
        return reuse_counters(counters) if args.previous else counters


def context_chars(output: str) -> int:
    """Characters of context per side of a mention, as the mentions stage cut them (its --max-seq-length);
    an error if ``mentions/`` holds the windows themselves (written before windows were cut at embed time)."""
    missing = set(schemas.MENTIONS.names) - set(tables.file_schema(tables.parquet_files(output, "mentions")[0]).names)
    if missing:
        raise InputError(f"{output}/mentions has no {', '.join(sorted(missing))} column (written by an older "
                         "version that stored context windows): run mentions again")
    return int(manifest.load(output)["mentions"].options["max_seq_length"]) * CHARS_PER_TOKEN


# --- refresh (--previous): vectors of entities whose sample did not change come from the previous run ---------

PREVIOUS_STAGES = ("dictionary", "mentions", "embed_entities")


def incompatibility(old: dict[str, manifest.StageRecord], args: argparse.Namespace) -> str | None:
    """Why the previous run's vectors differ from what this run would compute (None: they do not)."""
    changes = option_changes(old["embed_entities"].options, STAGE.options(args))
    changes += option_changes(old["mentions"].options, manifest.load(args.output)["mentions"].options)
    changes += [f"{role}: model files changed" for role in
                fingerprint_changes(old["embed_entities"], STAGE.external_inputs(args))]
    return f"it was built with other options ({'; '.join(changes)})" if changes else None


def split_for_refresh(pipeline: beam.Pipeline, ctx: StageContext, mentions: beam.PCollection,
                      args: argparse.Namespace, previous: str | None) -> tuple[beam.PCollection, Any]:
    """(mentions to encode, reused embedding rows or None); writes the old->new entity id map."""
    if previous is None:
        if args.previous:  # refused: every entity is recomputed, and the record says so
            _ = (mentions | "EntityIds" >> beam.Map(lambda row: row["entity_id"]) | "Distinct" >> beam.Distinct()
                 | "CountRecomputed" >> beam.Map(lambda _: count("entities_recomputed")))
        return mentions, None

    def read(label: str, output: str, artifact: str, columns: list[str] | None = None) -> beam.PCollection:
        return pipeline | label >> beam.io.ReadFromParquet(tables.parquet_pattern(output, artifact), columns=columns)

    entity_columns = ["entity_id", "title", "qid"]
    split = {"mentions": mentions, "entities": read("ReadEntityKeys", args.output, "entities", entity_columns),
             "old_mentions": read("ReadOldMentions", previous, "mentions"),
             "old_entities": read("ReadOldEntities", previous, "entities", entity_columns),
             "old_embeddings": read("ReadOldEmbeddings", previous, "entity_embeddings"),
             } | "SplitForRefresh" >> SplitEntitiesForRefresh()
    _ = split["id_map"] | "WriteIdMap" >> beam.io.WriteToParquet(
        ctx.staged_prefix("entity_id_map"), schemas.ENTITY_ID_MAP, file_name_suffix=".parquet",
        codec=schemas.PARQUET_CODEC)
    return split["encode"], split["reused"]


def reuse_counters(counters: dict[str, int]) -> dict[str, int]:
    """The refresh counters (0 when nothing was reused); a reused entity is not "without mentions" although no
    mention of it reached the join with the entity table."""
    counters = {"entities_reused": 0, "entities_recomputed": 0, **counters}
    without = counters.pop("entities_without_mentions", 0) - counters["entities_reused"]
    return {**counters, "entities_without_mentions": without} if without else counters


def with_reused(rows: beam.PCollection, reused: beam.PCollection | None) -> beam.PCollection:
    return rows if reused is None else (rows, reused) | "WithReused" >> beam.Flatten()


STAGE = EmbedEntitiesStage()
