"""transforms/embed_entities/graph.py, inputs.py and entity_vectors.py in memory (hand-written vectors), the
stage's three pipelines on a tiny model, and the embed-entities stage's config."""

from __future__ import annotations

import shutil
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from artifacts import fs, schemas
from artifacts.errors import BelowMinimumError, ModelError
from artifacts.run import manifest
from encoders.models import ModelSpec, input_embedding_norm
from pipelines.embed_entities import STAGE
from pipelines.launcher.cli import build_parser, main
from pipelines.launcher.stage import collect_counters
from tests.builders import article, artifact_rows, write_entities, write_parsed
from tests.conftest import BUNDLED_SAMPLE, DIRECT
from transforms.common.follow import mark_ended
from transforms.common.mention_sampling import window_digest
from transforms.common.packed import bucket_of
from transforms.common.progress import ProgressSettings
from transforms.embed_entities.entity_vectors import (
    MENTION_KEY,
    EntityVectors,
    ModelFacts,
    PartWriter,
    entity_sums,
    mention_vector_table,
    norm_matched,
    part_bytes,
    read_mention_vectors,
    vector_buckets,
    write_bucketed_part,
)
from transforms.embed_entities.gather import save_store_index
from transforms.embed_entities.graph import (
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
from transforms.embed_entities.inputs import embeddable
from transforms.embed_entities.window_store import MIN_BITS, model_salt, read_bucket, store_files, write_known_keys


def vector(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def run_counted(build) -> dict[str, int]:
    """Run a TestPipeline built by ``build`` to the end; its kpr counters."""
    pipeline = TestPipeline(runner="DirectRunner")
    build(pipeline)
    result = pipeline.run()
    result.wait_until_finish()
    return collect_counters(result)


def random_mentions(count: int, entities: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = np.zeros(count, dtype=MENTION_KEY)
    keys["entity_id"] = rng.integers(1, entities + 1, count)
    keys["page_id"] = rng.permutation(count)
    keys["link_index"] = rng.integers(0, 50, count)
    return keys, (rng.normal(size=(count, dim)) * 10 ** rng.uniform(-3, 3, size=(count, 1))).astype(np.float32)


def plain_sums(keys: np.ndarray, vectors: np.ndarray) -> dict[int, tuple[list[float], int]]:
    """Per entity: its vectors added one by one in float64 in (page, link) order, and their count."""
    found: dict[int, tuple[np.ndarray, int]] = {}
    for row in sorted(range(len(keys)), key=lambda row: keys[row].tolist()):
        entity_id = int(keys[row]["entity_id"])
        total, seen = found.get(entity_id, (np.zeros(vectors.shape[1]), 0))
        found[entity_id] = (total + vectors[row].astype(np.float64), seen + 1)
    return {entity_id: (total.tolist(), seen) for entity_id, (total, seen) in found.items()}


def test_entity_sums_add_in_page_and_link_order_whatever_order_the_vectors_come_in():
    keys, vectors = random_mentions(500, 30, 8)
    found = list(entity_sums(keys, vectors))
    assert all(total.dtype == np.float64 for _, total, _ in found)
    assert {entity_id: (total.tolist(), seen) for entity_id, total, seen in found} == plain_sums(keys, vectors)
    shuffled = np.random.default_rng(1).permutation(len(keys))
    again = list(entity_sums(keys[shuffled], vectors[shuffled]))
    assert [(entity_id, total.tobytes(), seen) for entity_id, total, seen in again] == [
        (entity_id, total.tobytes(), seen) for entity_id, total, seen in found]


def test_a_bucket_reduce_of_vector_parts_equals_a_plain_mean(tmp_path: Path):
    keys, vectors = random_mentions(300, 20, 6, seed=2)
    parts = (write_bucketed_part(str(tmp_path / "a.arrow"), mention_vector_table(keys[:100], vectors[:100]),
                                 bucket_of(keys["entity_id"][:100], 3))
             + write_bucketed_part(str(tmp_path / "b.arrow"), mention_vector_table(keys[100:], vectors[100:]),
                                   bucket_of(keys["entity_id"][100:], 3)))
    assert sorted(bucket for bucket, _ in parts) == [0, 0, 1, 1, 2, 2]  # a record batch per bucket of each file
    for bucket in range(3):
        mine = [part for key, part in parts if key == bucket]
        found = list(entity_sums(*read_mention_vectors(mine, 6)))
        in_bucket = {int(entity_id) for entity_id in keys["entity_id"] if entity_id % 3 == bucket}
        assert [entity_id for entity_id, _, _ in found] == sorted(in_bucket)
        for entity_id, total, seen in found:
            rows = keys["entity_id"] == entity_id
            np.testing.assert_allclose(total / seen, vectors[rows].astype(np.float64).mean(axis=0), rtol=1e-12)
            mean = vectors[rows].astype(np.float64).mean(axis=0)
            np.testing.assert_allclose(norm_matched(total, seen, 3.0), mean / np.linalg.norm(mean) * 3.0, rtol=1e-6)


def test_vector_buckets_and_part_files_stay_within_their_memory_budgets():
    assert vector_buckets(0, 768) == 1 and vector_buckets(20_000, 384) == 1
    assert vector_buckets(80_000_000, 768) == 1832
    assert (part_bytes(1), part_bytes(916), part_bytes(1832)) == (32 << 20, 916 << 18, 256 << 20)


def entity_rows(output: Path) -> list[dict]:
    return sorted(artifact_rows(output, "entity_embeddings"), key=lambda row: row["entity_id"])


def test_entity_vectors_are_norm_matched_means_with_unknown_and_zero_means_dead_lettered(tmp_path: Path):
    vectors = [(1, vector(3, 4)), (1, vector(3, 4)), (3, vector(1, -1)), (3, vector(-1, 1)), (9, vector(1, 0)),
               (9, vector(0, 1))]
    write_entities(tmp_path, ["Paris", "Lyon", "Nice"], {"Paris": "Q90", "Nice": "Q33959"})
    facts = ModelFacts(dim=2, target_norm=10.0, buckets=2, store_bits=4)
    schema = schemas.entity_embeddings(2)

    keys = np.array([(entity_id, page_id, 0) for page_id, (entity_id, _) in enumerate(vectors)], dtype=MENTION_KEY)
    writer = PartWriter(str(tmp_path / "parts"), facts.buckets)
    parts = writer.add(keys[:3], np.stack([value for _, value in vectors[:3]]))
    parts += writer.add(keys[3:], np.stack([value for _, value in vectors[3:]])) + writer.flush()

    def build(pipeline: beam.Pipeline) -> None:
        dead = ({"parts": pipeline | "Parts" >> beam.Create(parts),
                 "facts": pipeline | "Facts" >> beam.Create([facts])}
                | EntityVectors(str(tmp_path), str(tmp_path / "scratch"), str(tmp_path / "entity_embeddings"),
                                lambda _: schema))
        assert_that(dead, equal_to([
            {"kind": "non_finite_vectors", "reason": "mean vector is zero or not finite", "entity_id": 3},
            {"kind": "mentions_of_unknown_entities", "reason": "mentions of an entity_id not in entities/",
             "entity_id": 9, "mention_count": 2}]))

    assert run_counted(build) == {"entities_embedded": 1, "entities_without_mentions": 1,
                                  "mentions_of_unknown_entities": 1, "non_finite_vectors": 1}
    assert sorted(path.name for path in (tmp_path / "entity_embeddings").iterdir()) == [
        "part-00000-of-00002.parquet", "part-00001-of-00002.parquet"]  # one per bucket, an empty one included
    assert entity_rows(tmp_path) == [{"entity_id": 1, "title": "Paris", "qid": "Q90", "embedding": [6.0, 8.0],
                                      "mention_count": 2}]
    written = pq.read_schema(tmp_path / "entity_embeddings" / "part-00001-of-00002.parquet")
    assert written.field("embedding").type.value_field.name == "item"  # as Beam's WriteToParquet writes lists


def test_rows_that_cannot_be_embedded_are_dead_lettered():
    good = {"entity_id": 1, "page_id": 5, "text": "see Paris here", "start": 4, "end": 9}
    outside = {**good, "entity_id": 2, "start": 9, "end": 20}
    alone = {"entity_id": 3, "page_id": 6, "text": " Paris ", "start": 1, "end": 6}

    def build(pipeline: beam.Pipeline) -> None:
        out = (pipeline | beam.Create([[good, outside, alone, good]])
               | beam.FlatMap(embeddable).with_outputs("dead_letter", main="rows"))
        assert_that(out.rows, equal_to([[good, good]]), label="Rows")
        assert_that(out.dead_letter, equal_to([
            {"kind": "bad_mention_spans", "reason": "mention cannot be embedded", "entity_id": 2, "page_id": 5,
             "start": 9, "end": 20},
            {"kind": "empty_contexts", "reason": "mention cannot be embedded", "entity_id": 3, "page_id": 6,
             "start": 1, "end": 6}]), label="DeadLetters")

    assert run_counted(build) == {"bad_mention_spans": 1, "empty_contexts": 1}  # the others: once tokenized


def ref(entity_id: int, page_id: int, link_index: int, start: int, end: int, text: str) -> dict:
    return {"entity_id": entity_id, "page_id": page_id, "link_index": link_index, "start": start, "end": end,
            "window_digest": window_digest(text, start, end)}


@pytest.mark.parametrize("written_twice", [False, True])
def test_embed_entities_with_model_facts_from_a_worker_and_a_refused_previous_run(tiny_bert, tmp_path: Path,
                                                                                  written_twice: bool):
    """Files in, files out; the model is checked and measured by a worker (facts None), as on a remote runner.
    ``written_twice``: an input file is also taken under another name, as when a cluster retries a bundle of the
    inputs' job after a follower took the failed attempt's file: the same entities, each mention once."""
    paris, lyon = "they went to Paris by train", "the old town of Lyon is large"
    write_parsed(tmp_path, [article(5, "A", paris, [("Paris", "Paris")]),
                            article(6, "B", lyon, [("Lyon", "Lyon")])])
    write_entities(tmp_path, ["Paris", "Lyon", "Nice"], {"Paris": "Q90"})
    refs = [ref(1, 5, 0, 13, 18, paris), ref(1, 6, 0, 16, 20, lyon), ref(2, 6, 1, 16, 20, lyon),
            ref(2, 8, 0, 0, 4, "gone")]
    (tmp_path / "mentions").mkdir()
    pq.write_table(pa.Table.from_pylist(refs, schema=schemas.MENTIONS), tmp_path / "mentions" / "part-0.parquet")
    config = EmbedConfig(model=str(tiny_bert), max_seq_length=32, previous="/refused/run")
    inputs = EmbedInputs(str(tmp_path), mentions=4, embeddings=str(tmp_path / "entity_embeddings"),
                         scratch=str(tmp_path / "scratch"), pending=str(tmp_path / "pending"), salt=model_salt(["m"]),
                         store=str(tmp_path / "mention_vectors"), followers=2)
    write_known_keys([], inputs.files.known)  # the launcher: no window stored before

    def prepare(pipeline: beam.Pipeline) -> None:
        dead = pipeline | PrepareMentions(config, inputs, facts=None, context_chars=100)
        assert_that(dead, equal_to([
            {"kind": "mention_pages_missing", "reason": "the page of a sampled mention is not in articles/",
             "entity_id": 2, "page_id": 8, "link_index": 0}]))

    assert run_counted(prepare) == {"entities_recomputed": 2, "mentions_embedded": 3, "mention_pages_missing": 1}
    facts = read_facts(inputs)
    assert facts == ModelFacts(32, input_embedding_norm(ModelSpec(str(tiny_bert))), 1, MIN_BITS)
    mark_ended(inputs.files.followed, None)  # the launcher: the inputs have ended, the followers stop
    if written_twice:
        listed = fs.read_json(inputs.files.followed.ended)["files"]
        again = inputs.files.followed.path_for(1)
        fs.write_bytes_atomic(again, fs.read_bytes(listed[0]))
        fs.write_json_atomic(inputs.files.followed.ended, {"files": [*listed, again]})
    # the two refs of page 6 at 16-20 have the same window, whatever their entity: encoded once
    progress = ProgressSettings("embed-entities", "mentions", total=4, workers=2, interval=3600)
    encode = EncodeMentions(config, inputs, progress=progress)
    encoded = run_counted(lambda pipeline: pipeline | encode)
    if written_twice:  # which follower takes which file is drawn: the copy's windows encoded again or not
        assert encoded["mentions_encoded"] + encoded["mentions_reused"] == 6
    else:
        assert encoded == {"mentions_encoded": 2, "mentions_reused": 1}
    parts = listed_parts(inputs)
    assert {bucket for bucket, _ in parts} <= set(range(1 << MIN_BITS))
    save_store_index(inputs.store_index, store_files([inputs.pending], inputs.salt))  # the launcher
    reduced = run_counted(lambda pipeline: pipeline | ReduceEntities(config, inputs, parts, facts))
    assert reduced == {"entities_embedded": 2, "entities_without_mentions": 1,
                       **({"mentions_taken_twice": 3} if written_twice else {})}
    stored = store_files([inputs.store], inputs.salt)  # the run's store: its 2 windows, a file per bucket
    assert sum(len(read_bucket(stored, bucket, MIN_BITS, 32)[0]) for bucket in range(1 << MIN_BITS)) == 2
    norm = input_embedding_norm(ModelSpec(str(tiny_bert)))
    assert [(row["entity_id"], row["title"], row["qid"], row["mention_count"], len(row["embedding"]),
             round(float(np.linalg.norm(row["embedding"])), 4)) for row in entity_rows(tmp_path)] == [
        (1, "Paris", "Q90", 2, 32, round(norm, 4)), (2, "Lyon", None, 1, 32, round(norm, 4))]


def test_reuse_counters_are_zero_when_nothing_was_reused_or_recomputed():
    assert reuse_counters({"entities_embedded": 4}) == {"entities_reused": 0, "entities_recomputed": 0,
                                                        "entities_embedded": 4}
    assert reuse_counters({"entities_reused": 3, "entities_without_mentions": 5}) == {
        "entities_reused": 3, "entities_recomputed": 0, "entities_without_mentions": 5}


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
                                     "previous": str(tmp_path), "previous_manifest_sha256": manifest.GONE}


def test_missing_or_bad_flags_are_one_line_errors_naming_the_flag(tmp_path, capsys):
    """Refused by the command line as it reads the flags; the library's config refuses the value too."""
    command = ["embed-entities", "--output", str(tmp_path / "out")]
    for extra, line in (((), "error: embed-entities needs --model NAME_OR_PATH (a BERT-family model with [MASK])"),
                        (("--model", "m", "--batch-tokens", "0"), "error: --batch-tokens must be at least 1, got 0")):
        assert main([*command, *extra]) == 2
        assert capsys.readouterr().err.splitlines() == [line]
    assert not (tmp_path / "out").exists()
    with pytest.raises(BelowMinimumError, match="batch_tokens must be at least 1, got 0"):
        EmbedConfig(model="m", batch_tokens=0)


def test_a_layer_the_model_lacks_is_worded_with_its_flag_on_the_command_line(tiny_bert, tmp_path, capsys):
    argv = ["all", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp_path / "out"), "--model", str(tiny_bert),
            "--layer", "5", "--encoder", "x", *DIRECT]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --layer 5: {tiny_bert} has 2 layers (hidden states -3..2; -1 is the last layer)"]
    assert not (tmp_path / "out").exists()


def test_entity_vectors_beyond_float16_are_refused_before_any_work(tiny_bert: Path, tmp_path: Path) -> None:
    """Word embeddings of norm ~1e6: --embedding-dtype float16 stored every entity vector as inf, the stage exited 0
    and validate then refused the run."""
    from transformers import AutoModel

    model = Path(shutil.copytree(tiny_bert, tmp_path / "model"))
    weights = AutoModel.from_pretrained(str(model))
    weights.get_input_embeddings().weight.data *= 1e7
    weights.save_pretrained(str(model))
    norm = input_embedding_norm(ModelSpec(str(model)))
    assert norm > 65504
    with pytest.raises(ModelError) as refused:
        model_facts(EmbedConfig(model=str(model), embedding_dtype="float16", max_seq_length=64), 10)
    assert refused.value.message == (
        f"the word embeddings of {model} have a mean norm of {norm:.6g}, beyond float16's 65,504: entity vectors "
        "scaled to it cannot be stored as --embedding-dtype float16 (use float32)")
    assert model_facts(EmbedConfig(model=str(model), max_seq_length=64), 10).target_norm == norm


def test_weights_cut_short_are_a_model_error_naming_the_model(tiny_bert: Path, tmp_path: Path) -> None:
    model = Path(shutil.copytree(tiny_bert, tmp_path / "model"))
    with open(model / "model.safetensors", "r+b") as weights:
        weights.truncate(1000)  # a copy that ran out of disk
    with pytest.raises(ModelError) as refused:
        input_embedding_norm(ModelSpec(str(model)))  # what embed-entities reads before it starts its pipelines
    assert refused.value.message == (f"cannot load a model from {model}: Error while deserializing header: invalid "
                                     "header length")
