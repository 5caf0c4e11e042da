"""The index stage end to end: the 751 real DPR passages with the packaged MiniLM, bad rows and duplicates among
20 of the bundled real passages, passages cut from articles, a trained IVF index, 1 vs 2 workers, one-line errors."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import faiss
import numpy as np
import pytest
from transformers import AutoTokenizer

from artifacts import faiss as faiss_shards
from artifacts import layout, tables
from artifacts.errors import InputError
from artifacts.passages import Passage, shard_of
from artifacts.run import manifest
from artifacts.run.validation import validate_run
from encoders.loading import load_retriever
from encoders.retrievers import EncoderOptions
from pipelines.index import check_encoder
from pipelines.launcher import stage as launcher_stage
from pipelines.launcher.cli import main
from tests.builders import article, dpr_passages, stage_command, stored_rows, write_parsed
from tests.conftest import BUNDLED_PASSAGES, DIRECT, MULTI_PROCESS, PASSAGES, torch_free_workers

SUBSET = PASSAGES / "psgs_w100_subset_from_haystack_nqdev.tsv"


def test_real_passages_are_stored_by_shard_with_their_vectors(minilm_index, minilm_path):
    rows = stored_rows(minilm_index)
    passages = {passage.passage_id: passage for passage in dpr_passages(SUBSET)}
    assert set(rows) == set(passages)
    assert all(row["shard"] == faiss_shards.shard_name(shard_of(passage_id, 3)) for passage_id, row in rows.items())
    assert all((row["title"], row["text"]) == (passages[pid].title, passages[pid].text) for pid, row in rows.items())
    some = sorted(passages)[:4]
    encoder = load_retriever(EncoderOptions("mean", str(minilm_path)))
    expected = encoder.encode_passages([passages[passage_id] for passage_id in some])
    np.testing.assert_allclose(np.array([rows[passage_id]["embedding"] for passage_id in some]), expected, atol=1e-5)
    info = json.loads((minilm_index / "index" / "index.json").read_text())
    assert (info["factory"], info["metric"], info["dim"], info["count"], info["shards"]) == ("Flat", "cosine", 384,
                                                                                             751, 3)
    assert [item["count"] for item in info["shard_files"]] == [
        sum(1 for row in rows.values() if row["shard"] == name) for name in ("shard-00000", "shard-00001",
                                                                           "shard-00002")]
    assert info["encoder"]["kind"] == "mean" and info["encoder"]["title"] == "join"
    record = manifest.load(str(minilm_index))["index"]
    assert record.counters["passages_read"] == record.counters["passages_encoded"] == 751
    # the passages whose tokens run past --max-length (256) are counted: their end is not encoded
    texts = [f"{passage.title} {passage.text}" for passage in passages.values()]
    whole = AutoTokenizer.from_pretrained(minilm_path)(texts, verbose=False)
    assert record.counters["passages_cut"] == sum(len(ids) > 256 for ids in whole["input_ids"]) == 1


def test_sharded_search_equals_one_index_on_the_real_vectors(minilm_index):
    rows = stored_rows(minilm_index)
    ids = np.array(sorted(rows), dtype=np.int64)
    vectors = np.array([rows[passage_id]["embedding"] for passage_id in ids], dtype=np.float32)
    single = faiss.IndexIDMap(faiss.IndexFlatIP(384))
    single.add_with_ids(vectors, ids)
    queries = np.concatenate([vectors, vectors[:50] + vectors[50:100]])
    sharded = faiss_shards.ShardedIndex(str(minilm_index / "index"))
    # BLAS rounds a dot product differently with other matrix shapes; FAISS's per-pair kernel does not, so with
    # it the two must agree exactly (the corpus has identical passages: equal scores go to the smaller id)
    threshold = faiss.cvar.distance_compute_blas_threshold
    faiss.cvar.distance_compute_blas_threshold = 10**9
    try:
        one_scores, one_ids = faiss_shards.merge_top_k(*([part] for part in single.search(queries, 40)), 20)
        sharded_scores, sharded_ids = sharded.search(queries, 20)
    finally:
        faiss.cvar.distance_compute_blas_threshold = threshold
    assert sharded_ids.tolist() == one_ids.tolist()
    np.testing.assert_array_equal(sharded_scores, one_scores)
    firsts = [rows[int(passage_id)]["text"] for passage_id in sharded_ids[:751, 0]]
    assert firsts == [rows[int(passage_id)]["text"] for passage_id in ids]  # itself (or an identical passage)
    blas_scores, blas_ids = sharded.search(queries, 20)
    np.testing.assert_allclose(blas_scores, one_scores, atol=1e-5)
    assert np.mean(blas_ids == one_ids) > 0.99


def test_a_second_run_with_the_same_inputs_is_skipped(minilm_index, minilm_path, capsys):
    assert main(["index", "--output", str(minilm_index), "--encoder", str(minilm_path), "--encoder-type", "mean",
                 "--corpus", str(SUBSET), "--shards", "3", *DIRECT]) == 0
    assert "[index] skipped" in capsys.readouterr().err


def write_bad_corpus(path: Path) -> list[Passage]:
    """20 real rows, then broken rows, a later row with the id of row 1 and another text, an exact duplicate of
    row 2, a row of invalid UTF-8 (line 19) and NUL bytes in a good row (line 20)."""
    lines = BUNDLED_PASSAGES.read_text(encoding="utf-8").splitlines()
    good = lines[1:21]
    broken = ['99\t"unclosed quote\tT', "98\tonly two", "x97\ttext\tT", "96\t \tT", "95\ta\tb\tc"]
    first = dpr_passages(count=1)[0]
    duplicates = [f"{first.passage_id}\tAnother text for the same id\tOther", lines[2]]
    with_nul = good[10].replace("\t", "\t\x00", 1).replace(" ", "\x00 ", 1)
    encoded = [line.encode() for line in [lines[0], *good[:10], *broken, *duplicates]]
    rest = [line.encode() for line in [with_nul, *good[11:]]]
    path.write_bytes(b"\n".join([*encoded, b"94\tcaf\xe9 au lait\tCaf\xe9", *rest]) + b"\n")
    return dpr_passages(count=20)


@pytest.fixture(scope="module")
def bad_corpus_runs(tiny_bert, tmp_path_factory) -> dict[str, Path]:
    """The same corpus with bad rows indexed by one worker and by two worker processes beside one model process
    (as on a GPU; the two build the inputs and the shards without importing torch or transformers: the launcher
    saved the tokenizer for them)."""
    directory = tmp_path_factory.mktemp("bad-corpus")
    write_bad_corpus(directory / "bad.tsv")
    outputs = {}
    for name, runner in (("one", DIRECT), ("two", [*MULTI_PROCESS, "--model-workers", "1"])):
        outputs[name] = directory / name
        with torch_free_workers():
            assert main(["index", "--output", str(outputs[name]), "--encoder", str(tiny_bert), "--corpus",
                         str(directory / "bad.tsv"), "--shards", "3", *runner]) == 0
    return outputs


def test_bad_rows_and_duplicates_are_counted_and_dead_lettered(bad_corpus_runs):
    output = bad_corpus_runs["two"]
    good = dpr_passages(count=20)
    counters = manifest.load(str(output))["index"].counters
    assert {name: counters.get(name) for name in (
        "passages_read", "bad_quoting", "wrong_column_count", "bad_ids", "empty_texts", "duplicate_ids",
        "invalid_utf8", "passages_with_nul_bytes", "passages_encoded")} == {
        "passages_read": 22, "bad_quoting": 1, "wrong_column_count": 2, "bad_ids": 1, "empty_texts": 1,
        "duplicate_ids": 2, "invalid_utf8": 1, "passages_with_nul_bytes": 1, "passages_encoded": 20}
    letters = [json.loads(line) for path in (output / "errors" / "index").glob("*.jsonl")
               for line in path.read_text().splitlines()]
    assert Counter(letter["kind"] for letter in letters) == {"bad_quoting": 1, "wrong_column_count": 2,
                                                             "bad_ids": 1, "empty_texts": 1, "duplicate_ids": 2,
                                                             "invalid_utf8": 1}
    corpus = str(output.parent / "bad.tsv")
    assert {(letter["kind"], letter["source"], letter["line_number"]) for letter in letters} == {
        ("bad_quoting", corpus, 12), ("wrong_column_count", corpus, 13), ("bad_ids", corpus, 14),
        ("empty_texts", corpus, 15), ("wrong_column_count", corpus, 16), ("duplicate_ids", corpus, 17),
        ("duplicate_ids", corpus, 18), ("invalid_utf8", corpus, 19)}
    assert {letter["line"] for letter in letters if letter["kind"] == "wrong_column_count"} == {
        "98\tonly two", "95\ta\tb\tc"}
    assert [letter["line"] for letter in letters if letter["kind"] == "invalid_utf8"] == [
        "94\tcaf\ufffd au lait\tCaf\ufffd"]
    assert {letter["reason"] for letter in letters if letter["kind"] == "duplicate_ids"} == {
        f"line 2 of {corpus} has this id (the first row is kept)",
        f"line 3 of {corpus} has this id (the first row is kept)"}
    rows = stored_rows(output)
    expected = {passage.passage_id: (passage.title, passage.text) for passage in good}  # NULs cleaned, firsts kept
    assert {pid: (row["title"], row["text"]) for pid, row in rows.items()} == expected


def test_on_duplicate_id_last_keeps_the_later_row(tiny_bert, tmp_path):
    write_bad_corpus(tmp_path / "bad.tsv")
    output = tmp_path / "out"
    assert main(["index", "--output", str(output), "--encoder", str(tiny_bert), "--corpus", str(tmp_path / "bad.tsv"),
                 "--on-duplicate-id", "last", *DIRECT]) == 0
    first = dpr_passages(count=1)[0]
    assert (stored_rows(output)[first.passage_id]["text"], stored_rows(output)[first.passage_id]["title"]) == (
        "Another text for the same id", "Other")


def test_one_and_two_workers_store_the_same_rows(bad_corpus_runs):
    results = [{pid: (row["shard"], row["title"], row["text"], row["embedding"])
                for pid, row in stored_rows(bad_corpus_runs[name]).items()} for name in ("one", "two")]
    assert results[0].keys() == results[1].keys() and len(results[0]) == 20
    for passage_id, (shard, title, text, vector) in results[0].items():
        other = results[1][passage_id]
        assert (shard, title, text) == other[:3]
        np.testing.assert_allclose(vector, other[3], atol=1e-6)


def test_passages_cut_from_articles(tiny_bert, tmp_path, capfd):
    articles = [article(7, "Seven", "one two three four five six seven", []),
                article(9, "Nine", "alpha beta", []), article(11, "Empty", "   ", [])]
    write_parsed(tmp_path, articles)
    assert main(["index", "--output", str(tmp_path), "--encoder", str(tiny_bert), "--encoder-type", "bge",
                 "--words-per-passage", "3", *DIRECT]) == 0
    log = capfd.readouterr().err  # where the stage's time went: its model process, its two pipelines' ends
    assert re.search(r"\[index\] model process 1 of 1: 4 passages encoded of 4 in [\d.]+s: waiting for inputs "
                     r"[\d.]+s \(\d+%\), model [\d.]+s", log), log
    assert re.search(r"\[index\] inputs' pipeline ended after [\d.]+s, the model's after [\d.]+s", log), log
    passages = sorted(tables.read_table(str(tmp_path), "passages").to_pylist(), key=lambda row: row["passage_id"])
    assert passages == [{"passage_id": 700000, "title": "Seven", "text": "one two three"},
                        {"passage_id": 700001, "title": "Seven", "text": "four five six"},
                        {"passage_id": 700002, "title": "Seven", "text": "seven"},
                        {"passage_id": 900000, "title": "Nine", "text": "alpha beta"}]
    assert set(stored_rows(tmp_path)) == {700000, 700001, 700002, 900000}
    counters = manifest.load(str(tmp_path))["index"].counters
    assert counters["articles_without_text"] == 1 and counters["passages_indexed"] == 4


def test_model_pipeline_options_reach_the_models_pipeline_alone(tiny_bert, tmp_path, monkeypatch):
    """--model-pipeline-options (a cluster's GPU workers for the model, CPU workers for the rest): added to the
    options of the pipeline that encodes, after the command's; the inputs' pipeline and the build keep the
    command's own."""
    write_parsed(tmp_path, [article(7, "Seven", "one two three four five six seven", [])])
    started, start = [], launcher_stage.started

    def recording(ctx, build):
        def recorded(pipeline):
            build(pipeline)
            options = pipeline.options.get_all_options()
            started.append(([part.full_label for part in pipeline.transforms_stack[0].parts],
                             options["resource_hints"], options["experiments"]))
        return start(ctx, recorded)

    monkeypatch.setattr(launcher_stage, "started", recording)
    assert main(["index", "--output", str(tmp_path), "--encoder", str(tiny_bert), "--words-per-passage", "3",
                 "--experiments=command_wide", "--model-pipeline-options=--resource_hints=min_ram=3GB "
                 "--experiments=model_only", *DIRECT]) == 0
    options = {labels[0]: (hints or [], {"command_wide", "model_only"} & set(experiments))
               for labels, hints, experiments in started}
    assert options == {"ReadPassages": ([], {"command_wide"}), "EncodePassages": (["min_ram=3GB"],
                       {"command_wide", "model_only"}), "BuildIndex": ([], {"command_wide"})}
    assert len(stored_rows(tmp_path)) == 3


@pytest.mark.usefixtures("shared_data")
def test_a_trained_ivf_index_probing_every_list_is_exact(tiny_bert, tmp_path):
    assert main(["index", "--output", str(tmp_path), "--encoder", str(tiny_bert), "--encoder-type", "mean",
                 "--corpus", str(SUBSET), "--shards", "2", "--index-factory", "IVF8,Flat", "--max-length", "64",
                 *DIRECT]) == 0
    info = faiss_shards.load_index_info(str(tmp_path / "index"))
    assert (info.factory, info.train_sample, info.count, info.metric) == ("IVF8,Flat", 751, 751, "cosine")
    assert not [path for path in (tmp_path / layout.STAGING).rglob("*") if path.is_file()]  # no staged bucket left
    rows = stored_rows(tmp_path)
    ids = np.array(sorted(rows), dtype=np.int64)
    vectors = np.array([rows[passage_id]["embedding"] for passage_id in ids], dtype=np.float32)
    scores = vectors[:30].astype(np.float64) @ vectors.T.astype(np.float64)
    exact = ids[np.lexsort((np.broadcast_to(ids, scores.shape), -scores), axis=1)[:, :10]]
    found_scores, found = faiss_shards.ShardedIndex(str(tmp_path / "index"), nprobe=8).search(vectors[:30], 10)
    assert found.tolist() == exact.tolist()
    np.testing.assert_allclose(found_scores, -np.sort(-scores, axis=1)[:, :10], rtol=1e-6)
    one_list = faiss_shards.ShardedIndex(str(tmp_path / "index"), nprobe=1).search(vectors[:30], 10)[1]
    assert 0.2 < np.mean([len(set(a) & set(b)) / 10 for a, b in zip(one_list, exact, strict=True)]) < 1.0


def error_of(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_unreadable_inputs_are_one_line_errors(tiny_bert, tmp_path, capsys):
    out = str(tmp_path / "out")
    base = ["index", "--output", out, "--encoder", str(tiny_bert)]
    assert error_of([*base, "--corpus", str(tmp_path / "none.tsv"), *DIRECT], capsys) == (
        f"error: --corpus {tmp_path / 'none.tsv'}: no such file")
    assert error_of([*base, "--corpus", str(tmp_path), *DIRECT], capsys) == (
        f"error: {tmp_path} is a directory: name its files (a path, or a glob such as {tmp_path / '*'})")
    (tmp_path / "headless.tsv").write_text("1\ttext\ttitle\n")
    assert "is not the DPR header" in error_of([*base, "--corpus", str(tmp_path / "headless.tsv"), *DIRECT], capsys)
    assert "has no completed 'parse' stage, which 'index' reads: run `python run_pipeline.py parse" in error_of(
        [*base, *DIRECT], capsys)
    assert error_of(["index", "--output", out, *DIRECT], capsys).startswith("error: index needs --encoder")
    (tmp_path / "tiny.tsv").write_text("id\ttext\ttitle\n1\tsome text\tT\n2\tmore text\tU\n")
    assert "IVF lists need at least 64 training vectors" in error_of(
        [*base, "--corpus", str(tmp_path / "tiny.tsv"), "--index-factory", "IVF64,Flat", *DIRECT], capsys)
    assert "product quantizer learns 256 centroids per sub-vector and needs at least 256 training vectors" in error_of(
        [*base, "--corpus", str(tmp_path / "tiny.tsv"), "--index-factory", "IVF2,PQ8", *DIRECT], capsys)
    assert "no completed" not in error_of(["search", "--output", out, "--query", "x"], capsys)


@pytest.mark.parametrize("factory", ["IDMap,Flat", "IDMap,HNSW8", "IVF2,Flat,RFlat"])
def test_a_factory_that_maps_its_own_ids_or_cannot_is_built_and_searched(factory, tiny_bert, tmp_path):
    """``IDMap,Flat`` already stores passage ids: it is not wrapped in a second IDMap, and search finds the ids. An
    IDMap over HNSW (FAISS gives it no code size: the memory estimate was a traceback) and a refined IVF (which takes
    no ids of its own: add_with_ids was a traceback once every passage was encoded) are built as well."""
    (tmp_path / "c.tsv").write_text("id\ttext\ttitle\n7\tlakes and rivers\tA\n42\tmountains\tB\n9\tdeserts\tC\n")
    assert main(["index", "--output", str(tmp_path / "out"), "--encoder", str(tiny_bert), "--encoder-type", "mean",
                 "--corpus", str(tmp_path / "c.tsv"), "--index-factory", factory, *DIRECT]) == 0
    rows = stored_rows(tmp_path / "out")
    ids = np.array(sorted(rows), dtype=np.int64)
    vectors = np.array([rows[passage_id]["embedding"] for passage_id in ids], dtype=np.float32)
    found = faiss_shards.ShardedIndex(str(tmp_path / "out" / "index")).search(vectors, 1)[1]
    assert ids.tolist() == [7, 9, 42] and found[:, 0].tolist() == ids.tolist()


def test_search_with_an_encoder_of_another_size_is_refused(minilm_index, tiny_bert, capsys):
    message = error_of(["search", "--output", str(minilm_index), "--query", "lakes",
                        "--query-encoder", str(tiny_bert)], capsys)
    assert message.startswith(f"error: the query encoder {tiny_bert} gives 32-dim vectors but the index at")
    assert message.endswith("has 384 dims")


def test_a_query_encoder_stands_in_for_an_indexed_model_that_is_gone(tiny_bert, tmp_path, capsys):
    """A run searched where the model it was indexed with is not (a published copy, a moved model folder): search
    with --query-encoder naming a copy of it loads that alone (it refused the run for the passages' model path)."""
    model = Path(shutil.copytree(tiny_bert, tmp_path / "model"))
    (tmp_path / "c.tsv").write_text("id\ttext\ttitle\n7\tlakes and rivers\tA\n42\tmountains\tB\n9\tdeserts\tC\n")
    assert main(["index", "--output", str(tmp_path / "out"), "--encoder", str(model), "--encoder-type", "mean",
                 "--corpus", str(tmp_path / "c.tsv"), *DIRECT]) == 0
    search = ["search", "--output", str(tmp_path / "out"), "--query", "rivers", "--json", "-k", "3"]
    capsys.readouterr()
    assert main(search) == 0
    before = capsys.readouterr().out
    model.rename(tmp_path / "moved")
    assert error_of(search, capsys) == (
        f"error: model path {model} does not exist: it is the query encoder "
        f"{tmp_path / 'out' / 'index' / 'index.json'} records; where it is elsewhere (a copy of the run on another "
        "machine), name it with --query-encoder")
    assert main([*search, "--query-encoder", str(tmp_path / "moved")]) == 0
    assert capsys.readouterr().out == before and len(json.loads(before.splitlines()[0])["hits"]) == 3


def test_passages_encoded_by_a_run_that_failed_on_its_factory_are_reused_with_another(tiny_bert, tmp_path, capsys):
    """IVF lists are checked against the passage count once the passages are read, after they are encoded: the
    rerun with a factory that fits took none of the kept work (its key held the factory and the shards)."""
    (tmp_path / "c.tsv").write_text("id\ttext\ttitle\n7\tlakes and rivers\tA\n42\tmountains\tB\n9\tdeserts\tC\n")
    index = ["index", "--output", str(tmp_path / "out"), "--encoder", str(tiny_bert), "--encoder-type", "mean",
             "--corpus", str(tmp_path / "c.tsv"), *DIRECT]
    assert "4 IVF lists need at least 4 training vectors" in error_of([*index, "--index-factory", "IVF4,Flat"], capsys)
    assert main([*index, "--index-factory", "Flat", "--shards", "2"]) == 0
    counters = manifest.load(str(tmp_path / "out"))["index"].counters
    assert (counters["passages_encoded"], counters["passages_reused"], counters["passages_indexed"]) == (0, 3, 3)


def test_options_the_encoder_or_the_corpus_does_not_read_change_nothing(tiny_bert, tmp_path, capsys):
    """--max-entities (a KPR encoder's) and --words-per-passage (passages cut from articles) given to a mean encoder of
    a --corpus: the run is the same (it was rerun, every passage encoded again, and a refresh under --require-reuse
    refused), and index.json records neither value."""
    (tmp_path / "c.tsv").write_text("id\ttext\ttitle\n7\tlakes and rivers\tA\n42\tmountains\tB\n")
    index = ["index", "--output", str(tmp_path / "out"), "--encoder", str(tiny_bert), "--encoder-type", "mean",
             "--corpus", str(tmp_path / "c.tsv"), *DIRECT]
    assert main(index) == 0
    recorded = (tmp_path / "out" / "index" / "index.json").read_bytes()
    capsys.readouterr()
    assert main([*index, "--max-entities", "5", "--words-per-passage", "20"]) == 0
    assert "[index] skipped: outputs complete, inputs and options unchanged" in capsys.readouterr().err
    assert (tmp_path / "out" / "index" / "index.json").read_bytes() == recorded


def test_an_index_of_more_shards_than_its_passages_fill_validates(tiny_bert, tmp_path):
    """--shards 8 for 2 passages: index.json lists the shards they hash to (an empty one is not written)."""
    (tmp_path / "c.tsv").write_text("id\ttext\ttitle\n7\tlakes and rivers\tA\n42\tmountains\tB\n")
    out = tmp_path / "out"
    assert main(["index", "--output", str(out), "--encoder", str(tiny_bert), "--encoder-type", "mean",
                 "--corpus", str(tmp_path / "c.tsv"), "--shards", "8", *DIRECT]) == 0
    info = json.loads((out / "index" / "index.json").read_text())
    assert (info["shards"], len(info["shard_files"]), info["count"]) == (8, 2, 2)
    assert validate_run(str(out)) == []


def test_options_of_what_a_run_does_not_do_change_nothing(full_run, tiny_bert, tmp_path, capsys):
    """--on-duplicate-id (a --corpus's ids) and --shard-memory-gb (the shards when --shards is not given) given to an
    index of 2 shards of passages cut from the articles: skipped (the shards were built again)."""
    out = shutil.copytree(full_run, tmp_path / "out")
    assert main(stage_command("index", out, tiny_bert, "--on-duplicate-id", "last", "--shard-memory-gb", "3")) == 0
    assert "[index] skipped: outputs complete, inputs and options unchanged" in capsys.readouterr().err


@pytest.mark.parametrize(("before", "after"), [("Flat", "IDMap,Flat"), ("IVF2,Flat", "IVF2,Flat")])
def test_a_rerun_in_place_encodes_only_the_passages_that_changed(tiny_bert, tmp_path, capsys, before, after):
    """Another --shards (and --index-factory, or the same IVF one: its trained quantizer is taken too), one passage
    edited, one removed, one added: the committed index lends the vectors of the two unchanged passages, and the
    rows are those of a run of the new corpus from scratch."""
    corpus = tmp_path / "c.tsv"
    corpus.write_text("id\ttext\ttitle\n7\tlakes and rivers\tA\n42\tmountains\tB\n9\tdeserts\tC\n"
                      "11\thills and valleys\tD\n")
    index = ["index", "--encoder", str(tiny_bert), "--encoder-type", "mean", "--corpus", str(corpus), *DIRECT]
    assert main([*index, "--output", str(tmp_path / "out"), "--index-factory", before]) == 0
    corpus.write_text("id\ttext\ttitle\n7\tlakes and rivers\tA\n42\tsnowy mountains\tB\n"
                      "11\thills and valleys\tD\n5\tforests\tE\n")
    capsys.readouterr()
    changed = ["--shards", "2", "--index-factory", after]
    assert main([*index, "--output", str(tmp_path / "out"), *changed]) == 0
    err = capsys.readouterr().err
    assert "[index] reusing the vectors of the index this OUT holds where nothing changed" in err
    assert ("[index] reusing the trained quantizer of" in err) == (before == after)
    counters = manifest.load(str(tmp_path / "out"))["index"].counters
    assert (counters["passages_encoded"], counters["passages_reused"], counters["passages_indexed"]) == (2, 2, 4)
    assert main([*index, "--output", str(tmp_path / "scratch"), *changed]) == 0
    rerun, scratch = stored_rows(tmp_path / "out"), stored_rows(tmp_path / "scratch")
    assert sorted(rerun) == sorted(scratch) == [5, 7, 11, 42]
    for passage_id, row in scratch.items():
        assert (rerun[passage_id]["text"], rerun[passage_id]["shard"]) == (row["text"], row["shard"])
        np.testing.assert_allclose(rerun[passage_id]["embedding"], row["embedding"], rtol=1e-5, atol=1e-6)


def test_a_rerun_in_place_after_a_new_parse_encodes_only_the_changed_articles(tiny_bert, tmp_path, capsys):
    """Articles parsed again leave the run's other stages stale (validate says so) until they rerun: the index's
    own files still lend the vectors of the passages that did not change."""
    write_parsed(tmp_path, [article(7, "Seven", "one two three four five six", []), article(9, "Nine", "alpha", [])])
    index = ["index", "--output", str(tmp_path), "--encoder", str(tiny_bert), "--encoder-type", "mean",
             "--words-per-passage", "3", *DIRECT]
    assert main(index) == 0
    records = manifest.load(str(tmp_path))
    parsed = tmp_path / "reparsed"
    write_parsed(parsed, [article(7, "Seven", "one two three four five SIX", []), article(9, "Nine", "alpha", [])])
    (tmp_path / "articles" / "part-0.parquet").write_bytes((parsed / "articles" / "part-0.parquet").read_bytes())
    manifest.save(str(tmp_path), {**records, "parse": manifest.load(str(parsed))["parse"]})
    capsys.readouterr()
    assert main(index) == 0
    assert "reusing the vectors of the index this OUT holds" in capsys.readouterr().err
    counters = manifest.load(str(tmp_path))["index"].counters
    assert (counters["passages_encoded"], counters["passages_reused"]) == (1, 2)

def test_a_query_encoder_of_another_size_is_refused_before_encoding(minilm_path, tiny_bert, tmp_path, capsys):
    """The index was built and committed, and every search of it then failed."""
    (tmp_path / "c.tsv").write_text("id\ttext\ttitle\n7\tlakes and rivers\tA\n")
    assert error_of(["index", "--output", str(tmp_path / "out"), "--encoder", str(tiny_bert), "--query-encoder",
                     str(minilm_path), "--encoder-type", "mean", "--corpus", str(tmp_path / "c.tsv"), *DIRECT],
                    capsys) == (f"error: --query-encoder {minilm_path} gives 384-dim vectors and --encoder {tiny_bert} "
                                "32-dim ones: every search of this index would be refused")
    assert not (tmp_path / "out" / "index").exists()


def test_a_passage_length_beyond_the_position_embeddings_is_refused_on_the_driver(tiny_bert, tmp_path, capsys):
    check_encoder(EncoderOptions("mean", str(tiny_bert), max_length=512))
    with pytest.raises(InputError, match=r"--max-length 513: .* takes at most 512 tokens"):
        check_encoder(EncoderOptions("mean", str(tiny_bert), max_length=513))
    (tmp_path / "any.tsv").write_text("id\ttext\ttitle\n7\tlakes and rivers\tA\n")
    argv = ["index", "--output", str(tmp_path / "out"), "--encoder", str(tiny_bert), "--max-length", "1024",
            "--corpus", str(tmp_path / "any.tsv"), "--runner=DirectRunner"]
    assert main(argv) == 2
    assert "--max-length 1024" in capsys.readouterr().err
