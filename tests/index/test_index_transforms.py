"""The index stage's transforms in memory: the corpus read as unique passages with its dead letters (by byte
ranges: the same as reading each file whole), encoded rows, staged bucket files, and the stage's counters declared
where they are counted."""

from __future__ import annotations

import gzip
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from artifacts import layout, tables
from artifacts.faiss import buckets
from artifacts.faiss.vectors import embedding_schema
from artifacts.passages import Passage, shard_of
from artifacts.run import manifest
from encoders.retrievers import EncoderOptions
from pipelines.index import STAGE, incompatibility
from transforms.index import line_ranges
from transforms.index.corpus import ReadPassages, passage_counts
from transforms.index.forward import encoded_rows
from transforms.index.graph import COUNTERS, IndexConfig, ListBucketFiles, WriteBuckets
from transforms.index.passages import corpus_row

CORPUS = ("id\ttext\ttitle\n"
          "1\tfirst text\tOne\n"
          "2\tsecond text\tTwo\n"
          "x\tnot an id\tBad\n"
          "1\tthe same id again\tOne again\n"
          "3\t\tEmpty\n")


@pytest.mark.parametrize(("keep", "kept", "duplicate_line"),
                         [("first", "first text", 5), ("last", "the same id again", 2)])
def test_the_corpus_is_read_as_unique_passages_with_its_dead_letters(tmp_path, keep, kept, duplicate_line):
    path = tmp_path / "corpus.tsv"
    path.write_text(CORPUS, encoding="utf-8")
    with TestPipeline() as pipeline:
        passages, dead = pipeline | ReadPassages(str(path), (0, 1, 2), str(tmp_path), 100, keep)
        assert_that(passages, equal_to([Passage(1, "One" if keep == "first" else "One again", kept),
                                        Passage(2, "Two", "second text")]), label="Passages")
        kinds = dead | beam.Map(lambda record: (record["kind"], record["line_number"]))
        assert_that(kinds, equal_to([("bad_ids", 4), ("empty_texts", 6), ("duplicate_ids", duplicate_line)]),
                    label="DeadLetters")


def write_corpus_files(directory) -> list[str]:
    """Two TSV files and a gzipped one: ids repeated within and across files, bad rows, NULs, a long line."""
    first = [f"{passage_id}\ttext {passage_id} {'w ' * (passage_id % 7)}\tT{passage_id}" for passage_id in range(60)]
    second = [*first[10:20], "5\tanother text for 5\tFive", "x\tbad id\tB", "77\t" + "long " * 200 + "\tL",
              "78\tcaf\xe9\tC", "79\twith\x00nul\tN", "80\t\tEmpty"]
    third = [*first[55:], "100\tonly in the archive\tA", "5\tand again\tFive"]
    (directory / "a.tsv").write_text("\n".join(["id\ttext\ttitle", *first]) + "\n")
    (directory / "b.tsv").write_bytes("\n".join(["id\ttext\ttitle", *second]).encode("latin-1"))
    with gzip.open(directory / "c.tsv.gz", "wt") as handle:
        handle.write("\n".join(["id\ttext\ttitle", *third]) + "\n")
    return [str(directory / name) for name in ("a.tsv", "b.tsv", "c.tsv.gz")]


def whole_file_reading(paths: list[str], keep: str) -> tuple[list[Passage], list[tuple]]:
    """What reading each file whole from its start gives (the stage before byte ranges), as the oracle."""
    rows = []
    for path in sorted(paths):
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as handle:
            handle.readline()
            rows += [(path, number, corpus_row(raw)[0]) for number, raw in enumerate(handle, start=2)]
    positions: dict[int, list[tuple[str, int]]] = {}
    for path, number, row in rows:
        if isinstance(row, Passage):
            positions.setdefault(row.passage_id, []).append((path, number))
    kept = {passage_id: places[0] if keep == "first" else places[-1] for passage_id, places in positions.items()}
    passages = [row for path, number, row in rows if isinstance(row, Passage) and kept[row.passage_id] == (path,
                                                                                                          number)]
    dead = [(row.reason, path, number, row.detail) for path, number, row in rows if not isinstance(row, Passage)]
    dead += [("duplicate_ids", path, number, f"line {kept[row.passage_id][1]} of {kept[row.passage_id][0]} has this "
              f"id (the {keep} row is kept)") for path, number, row in rows
             if isinstance(row, Passage) and kept[row.passage_id] != (path, number)]
    return passages, dead


@pytest.mark.parametrize("keep", ["first", "last"])
@pytest.mark.parametrize("range_bytes", [16, 1 << 20])
def test_byte_ranges_read_what_whole_files_give(tmp_path, monkeypatch, keep, range_bytes):
    paths = write_corpus_files(tmp_path)
    monkeypatch.setattr(line_ranges, "MIN_RANGE_BYTES", range_bytes)
    monkeypatch.setattr(line_ranges, "MAX_RANGE_BYTES", range_bytes)
    passages, dead_letters = whole_file_reading(paths, keep)
    with TestPipeline() as pipeline:
        read, dead = pipeline | ReadPassages(str(tmp_path / "*.tsv*"), (0, 1, 2), str(tmp_path), 100, keep)
        assert_that(read, equal_to(passages), label="Passages")
        assert_that(dead | beam.Map(lambda letter: (letter["kind"], letter["source"], letter["line_number"],
                                                    letter["reason"])), equal_to(dead_letters), label="DeadLetters")
    assert len(passages) == 63 and len(dead_letters) == 20


def test_encoded_rows_keep_their_passage_and_non_finite_vectors_are_dead_lettered():
    passages = pa.table({"passage_id": [7, 8, 9, 10], "title": ["T", "U", "V", "W"],
                         "text": ["text", "more", "last", "end"]})
    vectors = np.array([[1.0, 2.0], [np.nan, 1.0], [3.0, np.inf], [5.0, 6.0]], np.float32)
    rows, finite, dead = encoded_rows(passages, vectors)
    assert rows.schema == embedding_schema(2)
    assert rows.to_pylist() == [{"passage_id": 7, "title": "T", "text": "text", "embedding": [1.0, 2.0]},
                                {"passage_id": 10, "title": "W", "text": "end", "embedding": [5.0, 6.0]}]
    assert finite.tolist() == [True, False, False, True]
    assert [(letter.tag, letter.value["kind"], letter.value["passage_id"]) for letter in dead] == [
        ("dead_letter", "non_finite_vectors", 8), ("dead_letter", "non_finite_vectors", 9)]


def test_staged_rows_are_in_the_bucket_files_their_records_list(tmp_path):
    rows = [(passage_id, f"T{passage_id}", f"text {passage_id}", np.full(4, passage_id, np.float32))
            for passage_id in range(100)]
    with TestPipeline() as pipeline:
        _ = (pipeline | beam.Create(rows) | WriteBuckets(str(tmp_path / "staged"), 8, 4)
             | ListBucketFiles(str(tmp_path / "list")))
    records = buckets.read_bucket_files([str(path) for path in tmp_path.glob("list*")])
    staged = {str(path): pq.read_table(path).column("passage_id").to_pylist()
              for path in (tmp_path / "staged").rglob("*.parquet")}
    assert {(record.path, record.rows) for record in records} == {(path, len(ids)) for path, ids in staged.items()}
    assert sorted(passage_id for ids in staged.values() for passage_id in ids) == list(range(100))
    assert all(record.bucket == shard_of(passage_id, 8) for record in records for passage_id in staged[record.path])


def test_the_config_refuses_impossible_values_and_records_the_same_options():
    encoder = EncoderOptions("kpr", "model", linker=layout.LINKER, entity_embeddings=layout.ENTITY_EMBEDDINGS)
    for value in (0, 513):
        with pytest.raises(ValueError, match=rf"shards must be from 1 to 512 \(.*\), got {value}$"):
            IndexConfig(encoder, shards=value)
    for value in (0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=rf"shard_memory_gb must be more than 1 and at most 1e\+06 .*{value:g}"):
            IndexConfig(encoder, shard_memory_gb=value)
    with pytest.raises(ValueError, match="words_per_passage must be at least 1, got 0"):
        IndexConfig(encoder, words_per_passage=0)
    config = IndexConfig(encoder, corpus="psgs.tsv", shards=4)
    assert STAGE.options(config) == {
        "encoder": {"kind": "kpr", "model": "model", "query_model": None, "similarity": "", "title": "",
                    "query_prefix": None, "passage_prefix": "", "max_length": 256, "dtype": "float32",
                    "max_entities": 128, "token_types": "zeros"},
        "corpus": "psgs.tsv", "words_per_passage": 100, "on_duplicate_id": "first", "shards": 4,
        "shard_memory_gb": 8.0, "index_factory": None}
    assert STAGE.upstream(config) == (layout.DICTIONARY_STAGE, layout.EMBED_ENTITIES_STAGE)
    assert STAGE.upstream(IndexConfig(EncoderOptions("mean", "model"))) == (layout.PARSE_STAGE,)


def test_a_refresh_reuses_a_previous_run_of_another_corpus_but_not_of_another_encoder(tmp_path):
    corpus = tmp_path / "new.tsv"
    corpus.write_text("id\ttext\ttitle\n")
    config = IndexConfig(EncoderOptions("mean", "model"), corpus=str(corpus))
    old = manifest.StageRecord("index", STAGE.options(config), {"file:corpus": "the old corpus's fingerprint"}, [])
    assert incompatibility({layout.INDEX_STAGE: old}, config, config.encoder) is None
    other = IndexConfig(EncoderOptions("mean", "other-model"), corpus=str(corpus))
    assert "model: 'model' -> 'other-model'" in incompatibility({layout.INDEX_STAGE: old}, other, other.encoder)


def test_a_run_recorded_before_token_types_is_reused_only_where_they_did_not_change(tmp_path):
    """A record without ``token_types`` fed the tokenizer's: what mean still feeds, not what DPR feeds now."""
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("id\ttext\ttitle\n")
    for kind, reused in (("mean", True), ("dpr", False)):
        config = IndexConfig(EncoderOptions(kind, "model"), corpus=str(corpus))
        options = STAGE.options(config)
        del options["encoder"]["token_types"]
        old = manifest.StageRecord("index", options, {}, [])
        found = incompatibility({layout.INDEX_STAGE: old}, config, config.encoder)
        assert (found is None) if reused else ("token_types: 'tokenizer' -> 'zeros'" in found)


def test_every_counter_of_a_recorded_index_run_is_declared(full_run):
    counted = manifest.load(str(full_run))[layout.INDEX_STAGE].counters
    assert {"passages_read", "passages_encoded", "passages_indexed", "shards_built"} <= set(counted)
    assert set(counted) <= set(COUNTERS)
    assert STAGE.counters is COUNTERS


def test_the_passages_a_progress_line_expects_are_about_the_passages_read(full_run):
    """The progress lines' total is the count within 10%, from the articles' footers or the corpus's size; the
    estimate that sizes the buckets stays above the count."""
    passages = tables.total_rows(str(full_run), layout.PASSAGES)
    articles = tables.artifact_dir(str(full_run), layout.ARTICLES)
    counts = passage_counts(None, articles, IndexConfig.words_per_passage)
    assert counts.expected == pytest.approx(passages, rel=0.1)
    assert counts.high > passages
    corpus = str(Path(__file__).resolve().parents[2] / "samples" / "psgs_w100_sample.tsv")
    lines = len(Path(corpus).read_text(encoding="utf-8").splitlines()) - 1  # the header
    counts = passage_counts(corpus, "", IndexConfig.words_per_passage)
    assert counts.expected == pytest.approx(lines, rel=0.1)
    assert counts.high > lines
