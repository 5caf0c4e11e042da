"""transforms/embed_entities.py in memory (hand-written vectors), and the embed-entities stage's config."""

from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from artifacts.errors import InputError
from pipelines.cli import build_parser, main
from pipelines.embed_entities import STAGE
from pipelines.stage import collect_counters
from tests.conftest import BUNDLED_SAMPLE, DIRECT
from transforms.embed_entities import (
    EmbedConfig,
    EmbedEntities,
    EntityVectors,
    MeanVector,
    embeddable,
    reuse_counters,
)
from transforms.mention_sampling import window_digest


def vector(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def run_counted(build) -> dict[str, int]:
    """Run a TestPipeline built by ``build`` to the end; its kpr counters."""
    pipeline = TestPipeline(runner="DirectRunner")
    build(pipeline)
    result = pipeline.run()
    result.wait_until_finish()
    return collect_counters(result)


def test_mean_vector_sums_in_float64_and_counts_per_entity():
    with TestPipeline(runner="DirectRunner") as pipeline:
        sums = (pipeline | beam.Create([(1, vector(1, 2)), (1, vector(3, 4)), (1, vector(0, 0.5)), (2, vector(0, 5))])
                | beam.CombinePerKey(MeanVector())
                | beam.MapTuple(lambda entity_id, acc: (entity_id, acc[0].dtype.name, acc[0].tolist(), acc[1])))
        assert_that(sums, equal_to([(1, "float64", [4.0, 6.5], 3), (2, "float64", [0.0, 5.0], 1)]))


def test_mean_vector_merges_partial_sums_and_empty_accumulators():
    combine = MeanVector()
    part = combine.add_input(combine.create_accumulator(), vector(1, 1))
    merged = combine.merge_accumulators([combine.create_accumulator(), part, (np.array([2.0, 3.0]), 2)])
    assert (merged[0].tolist(), merged[1]) == ([3.0, 4.0], 3)
    assert combine.merge_accumulators([combine.create_accumulator()]) == (None, 0)
    assert part[0].tolist() == [1.0, 1.0], "merging does not change its inputs"


def test_entity_vectors_are_norm_matched_means_with_unknown_and_zero_means_dead_lettered():
    vectors = [(1, vector(3, 4)), (1, vector(3, 4)), (3, vector(1, -1)), (3, vector(-1, 1)), (9, vector(1, 0)),
               (9, vector(0, 1))]
    entities = [{"entity_id": 1, "title": "Paris", "qid": "Q90"}, {"entity_id": 2, "title": "Lyon", "qid": None},
                {"entity_id": 3, "title": "Nice", "qid": "Q33959"}]

    def build(pipeline: beam.Pipeline) -> None:
        out = ({"vectors": pipeline | "Vectors" >> beam.Create(vectors),
                "entities": pipeline | "Entities" >> beam.Create(entities)} | EntityVectors(target_norm=10.0))
        assert_that(out.rows, equal_to([{"entity_id": 1, "title": "Paris", "qid": "Q90", "embedding": [6.0, 8.0],
                                         "mention_count": 2}]), label="Rows")
        assert_that(out.dead_letter, equal_to([
            {"kind": "non_finite_vectors", "reason": "mean vector is zero or not finite", "entity_id": 3},
            {"kind": "mentions_of_unknown_entities", "reason": "mentions of an entity_id not in entities/",
             "entity_id": 9, "mention_count": 2}]), label="DeadLetters")

    assert run_counted(build) == {"entities_embedded": 1, "entities_without_mentions": 1,
                                  "mentions_of_unknown_entities": 1, "non_finite_vectors": 1}


def test_rows_that_cannot_be_embedded_are_dead_lettered_and_the_others_counted():
    good = {"entity_id": 1, "page_id": 5, "text": "see Paris here", "start": 4, "end": 9}
    outside = {**good, "entity_id": 2, "start": 9, "end": 20}
    alone = {"entity_id": 3, "page_id": 6, "text": " Paris ", "start": 1, "end": 6}

    def build(pipeline: beam.Pipeline) -> None:
        out = (pipeline | beam.Create([[good, outside, alone, good]])
               | beam.FlatMap(embeddable).with_outputs("dead_letter", main="rows"))
        assert_that(out.rows, equal_to([good, good]), label="Rows")
        assert_that(out.dead_letter, equal_to([
            {"kind": "bad_mention_spans", "reason": "mention cannot be embedded", "entity_id": 2, "page_id": 5,
             "start": 9, "end": 20},
            {"kind": "empty_contexts", "reason": "mention cannot be embedded", "entity_id": 3, "page_id": 6,
             "start": 1, "end": 6}]), label="DeadLetters")

    assert run_counted(build) == {"mentions_embedded": 2, "bad_mention_spans": 1, "empty_contexts": 1}


def ref(entity_id: int, page_id: int, link_index: int, start: int, end: int, text: str) -> dict:
    return {"entity_id": entity_id, "page_id": page_id, "link_index": link_index, "start": start, "end": end,
            "window_digest": window_digest(text, start, end)}


def test_embed_entities_from_refs_with_a_refused_previous_run_counts_every_entity_recomputed(tiny_bert):
    paris, lyon = "they went to Paris by train", "the old town of Lyon is large"
    refs = [ref(1, 5, 0, 13, 18, paris), ref(1, 6, 0, 16, 20, lyon), ref(2, 6, 1, 16, 20, lyon),
            ref(2, 8, 0, 0, 4, "gone")]
    entities = [{"entity_id": 1, "title": "Paris", "qid": "Q90"}, {"entity_id": 2, "title": "Lyon", "qid": None},
                {"entity_id": 3, "title": "Nice", "qid": None}]
    config = EmbedConfig(model=str(tiny_bert), max_seq_length=32, previous="/refused/run")

    def build(pipeline: beam.Pipeline) -> None:
        out = ({"refs": pipeline | "Refs" >> beam.Create(refs),
                "articles": pipeline | "Articles" >> beam.Create([{"page_id": 5, "text": paris},
                                                                  {"page_id": 6, "text": lyon}]),
                "entities": pipeline | "Entities" >> beam.Create(entities)}
               | EmbedEntities(config, target_norm=2.0, context_chars=100))
        assert set(out) == {"rows", "dead_letter"}
        summary = out["rows"] | beam.Map(lambda row: (row["entity_id"], row["title"], row["qid"], row["mention_count"],
                                                      len(row["embedding"]),
                                                      round(float(np.linalg.norm(row["embedding"])), 4)))
        assert_that(summary, equal_to([(1, "Paris", "Q90", 2, 32, 2.0), (2, "Lyon", None, 1, 32, 2.0)]),
                    label="Rows")
        assert_that(out["dead_letter"], equal_to([
            {"kind": "mention_pages_missing", "reason": "the page of a sampled mention is not in articles/",
             "entity_id": 2, "page_id": 8, "link_index": 0}]), label="DeadLetters")

    assert run_counted(build) == {"entities_embedded": 2, "entities_recomputed": 2, "entities_without_mentions": 1,
                                  "mentions_embedded": 3, "mention_pages_missing": 1}


def test_reuse_counters_do_not_count_reused_entities_as_without_mentions():
    assert reuse_counters({"entities_embedded": 4}) == {"entities_reused": 0, "entities_recomputed": 0,
                                                        "entities_embedded": 4}
    assert reuse_counters({"entities_reused": 3, "entities_without_mentions": 5}) == {
        "entities_reused": 3, "entities_recomputed": 0, "entities_without_mentions": 2}
    assert reuse_counters({"entities_reused": 3, "entities_without_mentions": 3}) == {
        "entities_reused": 3, "entities_recomputed": 0}


# --- the stage: flags -> EmbedConfig -> recorded options ---------------------------------------------------------


def stage_args(*flags: str):
    args, _ = build_parser().parse_known_args(["embed-entities", "--output", "o", *flags])
    return args


def test_flags_become_a_config_and_the_recorded_options_keep_their_keys_and_values():
    config = STAGE.config(stage_args("--model", "m", "--device", "cuda:1", "--batch-tokens", "99"))
    assert config == EmbedConfig(model="m", layer=-1, max_seq_length=512, device="cuda:1", dtype="float32",
                                 batch_tokens=99, embedding_dtype="float32", mask_window="reference")
    assert STAGE.options(config) == {"model": "m", "layer": -1, "max_seq_length": 512, "dtype": "float32",
                                     "embedding_dtype": "float32", "mask_window": "reference"}
    config = STAGE.config(stage_args("--model", "m", "--layer", "2", "--max-seq-length", "64", "--dtype", "bfloat16",
                                     "--embedding-dtype", "float16", "--mask-window", "centered"))
    assert STAGE.options(config) == {"model": "m", "layer": 2, "max_seq_length": 64, "dtype": "bfloat16",
                                     "embedding_dtype": "float16", "mask_window": "centered"}


def test_a_previous_run_is_carried_and_recorded_by_manifest_digest(tmp_path):
    config = STAGE.config(stage_args("--model", "m", "--previous", str(tmp_path), "--require-reuse"))
    assert (config.previous, config.require_reuse) == (str(tmp_path), True)
    assert STAGE.options(config) == {"model": "m", "layer": -1, "max_seq_length": 512, "dtype": "float32",
                                     "embedding_dtype": "float32", "mask_window": "reference",
                                     "previous": str(tmp_path), "previous_manifest_sha256": ""}


def test_missing_or_bad_flags_are_one_line_errors_naming_the_flag():
    with pytest.raises(InputError) as raised:
        STAGE.config(stage_args())
    assert raised.value.message == "embed-entities needs --model NAME_OR_PATH (a BERT-family model with [MASK])"
    with pytest.raises(InputError) as raised:
        STAGE.config(stage_args("--model", "m", "--batch-tokens", "0"))
    assert raised.value.message == "--batch-tokens must be at least 1, got 0"
    with pytest.raises(ValueError, match="batch_tokens must be at least 1, got 0"):
        EmbedConfig(model="m", batch_tokens=0)


def test_a_layer_the_model_lacks_is_worded_with_its_flag_on_the_command_line(tiny_bert, tmp_path, capsys):
    argv = ["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp_path / "out"), "--model", str(tiny_bert),
            "--layer", "5", "--encoder", "x", *DIRECT]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --layer 5: {tiny_bert} has 2 layers (hidden states -3..2; -1 is the last layer)"]
    assert not (tmp_path / "out").exists()
