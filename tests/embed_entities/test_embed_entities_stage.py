"""The embed-entities stage end to end: [MASK] vectors checked by hand, dtypes, one and two workers, non-finite
vectors dead-lettered, the mention windows cut from articles/ at embed time."""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from transformers import AutoModel, AutoTokenizer

from artifacts import tables
from artifacts.errors import InputError
from artifacts.run import manifest
from encoders.mask_inputs import mask_inputs
from encoders.models import ModelSpec, input_embedding_norm
from pipelines.launcher.cli import main
from tests.builders import CAPITALS, article, article_texts, ref_rows, write_parsed
from tests.conftest import DIRECT, MULTI_PROCESS, copy_stages, torch_free_workers, write_tiny_bert
from transforms.common.mention_sampling import CHARS_PER_TOKEN, mention_ref, mention_window, window_digest
from transforms.embed_entities.entity_vectors import norm_matched
from transforms.embed_entities.forward import storable_rows
from transforms.embed_entities.inputs import WINDOW_REF
from transforms.embed_entities.mention_windows import CutMentionWindows


def test_non_finite_vectors_are_dead_lettered_for_every_mention_of_their_window():
    """A window shared by mentions (identical inputs: one encoded row) whose vector was not finite lost them all
    while one dead letter named only the encoded one's entity (no page, no link)."""
    mentions = np.array([(5, 1, 0, 10), (6, 1, 1, 11), (7, 1, 2, 12), (8, 2, 0, 10)], dtype=WINDOW_REF)
    rows = np.array([0, 1, 2])  # the mention of entity 8 shares entity 5's window
    vectors = np.array([[np.nan, 1.0], [0.5, 1.0], [1e5, 1.0]], dtype=np.float32)  # 1e5: beyond the store's float16
    finite, failed, records = storable_rows(mentions, rows, vectors)
    assert (finite.tolist(), failed.tolist()) == ([False, True, False], [True, False, True, True])
    assert [{key: record.value[key] for key in ("kind", "entity_id", "page_id", "link_index")}
            for record in records] == [
        {"kind": "non_finite_vectors", "entity_id": 5, "page_id": 1, "link_index": 0},
        {"kind": "non_finite_vectors", "entity_id": 7, "page_id": 1, "link_index": 2},
        {"kind": "non_finite_vectors", "entity_id": 8, "page_id": 2, "link_index": 0}]
    assert norm_matched(np.zeros(3), 2, 1.0) is None
    np.testing.assert_allclose(norm_matched(np.array([3.0, 4.0]), 2, 2.0), [1.2, 1.6])


def mention_windows(output: Path) -> list[dict]:
    """The mention rows embed-entities encodes: each ref's window cut from its article (no Beam)."""
    texts, chars = article_texts(output), 512 * CHARS_PER_TOKEN  # the mentions stage's default --max-seq-length
    return [mention_window(ref, texts[ref["page_id"]], chars)
            for ref in tables.read_table(str(output), "mentions").to_pylist()]


def build_embeddings(output: Path, model: Path, *extra: str) -> None:
    write_parsed(output, CAPITALS)
    assert main(["dictionary", "--output", str(output), *DIRECT]) == 0
    assert main(["mentions", "--output", str(output), "--max-mentions", "2", *DIRECT]) == 0
    assert main(["embed-entities", "--output", str(output), "--model", str(model), "--max-seq-length", "64",
                 *extra, *DIRECT]) == 0


def test_embed_entities_hand_checked(minilm_path, tmp_path, capfd):
    build_embeddings(tmp_path, minilm_path)
    mentions = mention_windows(tmp_path)
    log = capfd.readouterr().err  # where the stage's time went: its model process, its two pipelines' ends
    windows = len({(row["text"][:row["start"]], row["text"][row["end"]:]) for row in mentions})
    assert re.search(rf"\[embed-entities\] model process 1 of 1: {windows:,} windows encoded for {len(mentions):,} "
                     r"mentions in [\d.]+s: waiting for inputs [\d.]+s \(\d+%\), model [\d.]+s", log), log
    assert re.search(r"\[embed-entities\] inputs' pipeline ended after [\d.]+s, the model's after [\d.]+s", log), log
    per_entity = {}
    for row in mentions:
        per_entity.setdefault(row["entity_id"], []).append(row)
    assert {len(rows) for rows in per_entity.values()} <= {1, 2}
    embeddings = {row["entity_id"]: row for row in tables.read_table(str(tmp_path), "entity_embeddings").to_pylist()}
    metadata = tables.file_metadata(tables.parquet_files(str(tmp_path), "entity_embeddings")[0])
    model = AutoModel.from_pretrained(minilm_path).eval()
    expected_norm = float(model.get_input_embeddings().weight.detach().norm(dim=1).mean())
    assert float(metadata["target_norm"]) == pytest.approx(expected_norm, rel=1e-6)
    assert metadata["layer"] == "-1" and metadata["model"] == str(minilm_path)

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    for entity_id, rows in per_entity.items():
        vectors = []
        for row in rows:  # by hand: the mention replaced by [MASK], the last layer at that position
            text = row["text"][:row["start"]] + tokenizer.mask_token + row["text"][row["end"]:]
            encoded = tokenizer(text, return_tensors="pt")
            with torch.inference_mode():
                states = model(**encoded).last_hidden_state[0]
            position = encoded["input_ids"][0].tolist().index(tokenizer.mask_token_id)
            vectors.append(states[position].numpy())
        mean = np.mean(vectors, axis=0)
        expected = mean / np.linalg.norm(mean) * expected_norm
        stored = np.array(embeddings[entity_id]["embedding"])
        # from mention vectors kept as float16 (the window store): within its rounding, the same direction
        np.testing.assert_allclose(stored, expected, rtol=2e-3, atol=2e-3 * float(np.abs(expected).max()))
        assert float(stored @ expected / np.linalg.norm(stored) / np.linalg.norm(expected)) >= 0.99999
        assert embeddings[entity_id]["mention_count"] == len(rows)
        assert math.isclose(float(np.linalg.norm(stored)), expected_norm, rel_tol=1e-5)


def test_float16_output_and_bfloat16_compute(tiny_bert, tmp_path):
    build_embeddings(tmp_path, tiny_bert, "--dtype", "bfloat16", "--embedding-dtype", "float16")
    path = tables.parquet_files(str(tmp_path), "entity_embeddings")[0]
    table = pq.read_table(path)
    assert table.schema.field("embedding").type == pa.list_(pa.float16(), 32)
    norms = np.linalg.norm(np.array(table.column("embedding").to_pylist(), dtype=np.float32), axis=1)
    np.testing.assert_allclose(norms, input_embedding_norm(ModelSpec(str(tiny_bert))), rtol=2e-3)


def test_a_link_trail_stays_outside_the_mask_from_parse_to_model_input(tiny_bert, single_stream_sample):
    from transforms.parse.dump_reader import iter_pages, read_siteinfo
    from transforms.parse.graph import classify_page
    from transforms.parse.wikitext import WikitextOptions

    siteinfo = read_siteinfo(str(single_stream_sample))
    page = next(page for page in iter_pages(str(single_stream_sample), siteinfo)
                if getattr(page, "title", "") == "Autism")
    [article] = [item for item in classify_page(page, siteinfo, WikitextOptions()) if isinstance(item, dict)]
    index = next(i for i, link in enumerate(article["links"]) if link["target"] == "Neuron")
    link = article["links"][index]
    # the anchor keeps the trail (the dictionary's name), the trail length is recorded beside it
    assert (article["text"][link["start"]:link["end"]], link["trail"]) == ("neurons", 1)
    ref = mention_ref(9, article, index, 30)
    assert (ref["page_id"], ref["link_index"], article["text"][ref["start"]:ref["end"]]) == (page.page_id, index,
                                                                                           "neuron")
    row = mention_window(ref, article["text"], 30)
    assert row["text"][row["start"]:row["end"]] == "neuron" and row["text"][row["end"]:].startswith("s that")
    assert ref["window_digest"] == window_digest(row["text"], row["start"], row["end"])
    [item] = mask_inputs([row], AutoTokenizer.from_pretrained(tiny_bert), 512)
    tokens = AutoTokenizer.from_pretrained(tiny_bert).convert_ids_to_tokens(list(item.input_ids))
    assert tokens[item.mask_position - 3:item.mask_position + 4] == ["an", "excess", "of", "[MASK]", "s", "that",
                                                                     "causes"]


def test_refs_of_a_missing_page_are_dead_lettered(tmp_path):
    write_parsed(tmp_path, [article(5, "P", "see Paris here", [("Paris", "Paris")])])
    ref = {"entity_id": 3, "page_id": 8, "link_index": 1, "start": 4, "end": 9, "window_digest": b"x" * 16}
    with TestPipeline(runner="DirectRunner") as pipeline:
        cut = (pipeline | beam.Create([ref_rows([ref, {**ref, "page_id": 5, "link_index": 0}])])
               | CutMentionWindows(str(tmp_path), str(tmp_path / "scratch"), 100))
        assert_that(cut["mentions"], equal_to([{"entity_id": 3, "page_id": 5, "link_index": 0, "text": "see Paris here",
                                                "start": 4, "end": 9}]), label="Mentions")
        assert_that(cut["dead_letter"], equal_to([{"kind": "mention_pages_missing", "entity_id": 3, "page_id": 8,
                                                   "link_index": 1,
                                                   "reason": "the page of a sampled mention is not in articles/"}]),
                    label="DeadLetters")


def test_mentions_with_stored_windows_ask_for_a_rerun(tmp_path):
    """An OUT whose mentions/ an older version wrote (windows stored as text): a one-line error, not a traceback."""
    from pipelines.embed_entities import context_chars

    (tmp_path / "mentions").mkdir()
    old = pa.table({"entity_id": pa.array([1], pa.int32()), "page_id": pa.array([5], pa.int64()),
                    "text": ["see Paris here"], "start": pa.array([4], pa.int32()), "end": pa.array([9], pa.int32())})
    pq.write_table(old, tmp_path / "mentions" / "part-0.parquet")
    with pytest.raises(InputError, match=r"mentions has no link_index, window_digest column .*run mentions again"):
        context_chars(str(tmp_path), 64)


def test_more_tokens_than_the_mentions_were_cut_for_is_refused(tiny_bert, tmp_path, capsys):
    """The windows are cut to the mentions stage's --max-seq-length: asking embed-entities for more gave the
    narrower windows without a word (and recorded the larger value)."""
    write_parsed(tmp_path, CAPITALS)
    assert main(["dictionary", "--output", str(tmp_path), *DIRECT]) == 0
    assert main(["mentions", "--output", str(tmp_path), "--max-seq-length", "64", *DIRECT]) == 0
    capsys.readouterr()
    assert main(["embed-entities", "--output", str(tmp_path), "--model", str(tiny_bert), "--max-seq-length", "128",
                 *DIRECT]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --max-seq-length 128 is more than the 64 tokens the mentions under {tmp_path} were cut for: run "
        f"`python run_pipeline.py mentions --output {tmp_path} --max-seq-length 128` first, or give "
        "--max-seq-length 64 or less")
    assert not (tmp_path / "entity_embeddings").exists()
    # nothing left in its staging directory (the tokenizer and the stored windows' keys were) that no run removes
    assert [path for path in (tmp_path / ".staging").rglob("*") if path.is_file()] == []


def test_a_model_that_returns_no_finite_vector_is_an_error_not_an_empty_commit(tiny_bert, tmp_path, capsys):
    """NaN weights past the word embeddings: every vector was dead-lettered, the stage exited 0 with no entity vector
    (validate passed, export-kpr wrote zeros)."""
    model = AutoModel.from_pretrained(tiny_bert)
    with torch.no_grad():
        model.encoder.layer[-1].output.dense.weight.fill_(float("nan"))
    broken = Path(shutil.copytree(tiny_bert, tmp_path / "nan-model"))
    model.save_pretrained(broken)
    output = tmp_path / "out"
    write_parsed(output, CAPITALS)
    assert main(["dictionary", "--output", str(output), *DIRECT]) == 0
    assert main(["mentions", "--output", str(output), "--max-mentions", "2", "--max-seq-length", "64", *DIRECT]) == 0
    capsys.readouterr()
    assert main(["embed-entities", "--output", str(output), "--model", str(broken), "--max-seq-length", "64",
                 *DIRECT]) == 2
    assert re.fullmatch(rf"error: every vector {broken} returned was NaN or infinite \(\d+ of \d+ windows, computed "
                        r"in float32, stored as float16: at most 65,504\): its weights are damaged, or its values "
                        r"overflow; nothing was committed", capsys.readouterr().err.splitlines()[-1])
    assert not (output / "entity_embeddings").exists() and "embed_entities" not in manifest.load(str(output))


def test_windows_are_stored_under_the_model_files_content(tiny_bert, tmp_path):
    """Other weights copied in place with the old sizes and times (cp -p, rsync -a) rerun the stage, which takes
    none of the old weights' vectors for theirs (they were reused); the same files at another path with new times
    are the same model: a rerun reuses every window (they were all encoded again)."""
    model, output = tmp_path / "model", tmp_path / "out"
    shutil.copytree(tiny_bert, model)
    build_embeddings(output, model)
    weights = model / "model.safetensors"
    times = os.stat(weights)
    other = write_tiny_bert(tmp_path / "other", seed=1) / "model.safetensors"
    assert other.stat().st_size == times.st_size and other.read_bytes() != weights.read_bytes()
    shutil.copyfile(other, weights)
    os.utime(weights, ns=(times.st_atime_ns, times.st_mtime_ns))

    def embed(path: Path) -> dict[str, int]:
        assert main(["embed-entities", "--output", str(output), "--model", str(path), "--max-seq-length", "64",
                     *DIRECT]) == 0
        return manifest.load(str(output))["embed_entities"].counters

    counters = embed(model)
    assert counters["mentions_encoded"] > 0 and counters["mentions_reused"] == 0
    vectors = tables.read_table(str(output), "entity_embeddings").to_pylist()
    moved = tmp_path / "moved"
    shutil.copytree(model, moved, copy_function=shutil.copyfile)  # new modification times
    counters = embed(moved)
    assert counters["mentions_encoded"] == 0 and counters["mentions_reused"] > 0
    assert tables.read_table(str(output), "entity_embeddings").to_pylist() == vectors


def test_entity_embeddings_are_the_same_for_one_and_two_workers(tiny_bert, tmp_path, system_temp):
    """One worker and two worker processes beside one model process (as on a GPU) give the same rows (the two build
    the inputs and reduce without importing torch or transformers: the launcher saved the tokenizer for them); the
    run leaves nothing in the temp directory the worker processes are started with (``system_temp``)."""
    one, two = tmp_path / "one", tmp_path / "two"
    build_embeddings(one, tiny_bert)  # one DirectRunner worker
    copy_stages(one, two, ("parse", "dictionary", "mentions"))
    with torch_free_workers():
        assert main(["embed-entities", "--output", str(two), "--model", str(tiny_bert), "--max-seq-length", "64",
                     "--model-workers", "1", *MULTI_PROCESS]) == 0

    def rows(output):
        return sorted(tables.read_table(str(output), "entity_embeddings").to_pylist(), key=lambda r: r["entity_id"])

    first, second = rows(one), rows(two)
    assert [(r["entity_id"], r["title"], r["mention_count"]) for r in first] == [
        (r["entity_id"], r["title"], r["mention_count"]) for r in second]
    assert len(first) >= 3
    np.testing.assert_allclose([r["embedding"] for r in first], [r["embedding"] for r in second],
                               rtol=1e-5, atol=1e-6)
    assert os.listdir(system_temp) == []


def test_shards_are_cut_into_buckets_of_at_most_64_and_at_least_64_buckets():
    from transforms.embed_entities.mention_windows import shards_per_bucket

    assert ([shards_per_bucket(shards) for shards in (0, 1, 63, 64, 160, 1024, 4096, 22_000)]
            == [1, 1, 1, 1, 2, 16, 64, 64])
