"""The report: an HTML page with exact manifest figures, valid PNG plots, the most ambiguous names as pyarrow
computes them, the index's recall against brute force, "not run" sections, and one-line errors."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from artifacts import faiss as faiss_shards
from artifacts import tables
from artifacts.counters import declare, dropped
from artifacts.errors import InputError
from artifacts.run import manifest
from artifacts.run.report import counters as counter_info
from artifacts.run.report import gather, plots, stages
from artifacts.run.report.build import write_report as write_report_declared
from artifacts.run.report.dictionary import dictionary_stats
from artifacts.run.report.markup import duration
from artifacts.run.report.recall import index_recall
from artifacts.run.report.stats import TopK, ValueCounts, integer_log_edges
from pipelines.launcher.cli import main
from pipelines.run_all import declared_counters
from tests.builders import brute_force, clustered, files_below, fill_with_files, write_index_dir
from tests.conftest import BUNDLED_SAMPLE

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DECLARED = declared_counters()  # what the stages declare, as `report` passes it


def write_report(output: str, **options) -> str:
    return write_report_declared(output, DECLARED, **options)


@pytest.fixture()
def run_copy(full_run: Path, tmp_path: Path) -> Path:
    output = tmp_path / "out"
    shutil.copytree(full_run, output)
    return output


def sections(page: str) -> dict[str, str]:
    """The HTML of each stage section, by stage name."""
    return dict(re.findall(r'<section id="stage-(\w+)">(.*?)</section>', page, flags=re.DOTALL))


def expected_ambiguous(output: Path, top: int = 20) -> list[tuple[str, int]]:
    """The most ambiguous names computed independently: group dictionary/names by name with pyarrow."""
    names = tables.read_table(str(output), "dictionary/names")
    grouped = names.group_by("name").aggregate([("entity_id", "count"), ("total_link_count", "max")]).to_pylist()
    ambiguous = [row for row in grouped if row["entity_id_count"] >= 2]
    ambiguous.sort(key=lambda row: (-row["entity_id_count"], -row["total_link_count_max"], row["name"]))
    return [(row["name"], row["entity_id_count"]) for row in ambiguous[:top]]


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def test_report_shows_each_stage_with_its_exact_wall_time_outputs_and_counters(run_copy):
    path = Path(write_report(str(run_copy)))
    assert path == run_copy / "report" / "index.html"
    page = path.read_text(encoding="utf-8")
    records = manifest.load(str(run_copy))
    assert set(records) == {"parse", "dictionary", "mentions", "embed_entities", "index"}
    by_stage = sections(page)
    for name, record in records.items():
        section = by_stage[name]
        assert f"<h2>{name.replace('_', '-')} " in section and "not run" not in section
        assert (f'wall time <b><span title="{record.wall_time_s:,.3f} s">{duration(record.wall_time_s)}</span>'
                in section)
        assert record.counters, name
        for counter, value in record.counters.items():
            row = re.search(rf"<code>{counter}</code></td><td>.*?</td><td class=\"num\">([\d,]+)</td>", section)
            assert row is not None and row.group(1) == f"{value:,}", (name, counter)
        rows = {}
        for item in record.outputs:
            if item.rows is not None:
                artifact = stages.artifact_of(item.path)
                rows[artifact] = rows.get(artifact, 0) + item.rows
        for artifact, count in rows.items():
            kept = " <span class=\"muted\">\\(kept work: a publish copies it only with <code>--with-mention-vectors"
            note = kept if manifest.is_kept_work(artifact) else ""
            assert re.search(rf"<code>{artifact}/</code>{note}.*?</td><td class=\"num\">[\d,]+</td>"
                             rf"<td class=\"num\">{count:,}</td>", section), (name, artifact)
    # dropped counters are highlighted, dead-letter folders linked relative to the page
    assert re.search(r'<tr class="dropped"><td>[^<]*</td><td><code>names_below_min_link_prob</code>',
                     by_stage["dictionary"])
    assert 'href="../errors/parse/"' in by_stage["parse"]
    model_inputs = {key: value for key, value in records["embed_entities"].inputs.items()
                    if key.startswith(("file:", manifest.CONTENT))}
    assert len(model_inputs) == 2
    model_files = records["embed_entities"].sources["model"]  # where they were: the model's directory, its files
    assert model_files.startswith(records["embed_entities"].options["model"])
    for key, value in model_inputs.items():  # the model files' fingerprint, and their content
        what = "the files' content" if key.startswith(manifest.CONTENT) else "fingerprint"
        assert (f"input <code>{key.partition(':')[2]}</code> <code>{html.escape(model_files)}</code> "
                f"<span class=\"muted\">{what} {value[:12]}…") in by_stage["embed_entities"], key
    # which dump the run was built from (the fingerprint alone did not say)
    assert records["parse"].sources == {"dump0": str(BUNDLED_SAMPLE)}
    assert f"input <code>dump0</code> <code>{BUNDLED_SAMPLE}</code> <span" in by_stage["parse"]
    # what each stage read of another: all of it, or the artifacts it records (mentions: the dictionary's entities)
    entities = sum(item.rows for item in records["dictionary"].outputs if item.path.startswith("entities/"))
    assert (f'outputs of <a href="#stage-dictionary">dictionary</a>: entities ({entities:,} rows)</li>'
            in by_stage["mentions"])
    assert re.search(r'outputs of <a href="#stage-parse">parse</a>: articles \([\d,]+ rows\), redirects',
                     by_stage["mentions"])
    assert "<script" not in page and "http://" not in page and "https://" not in page


def test_every_plot_the_page_shows_is_a_valid_png_beside_it(run_copy):
    path = Path(write_report(str(run_copy)))
    sources = re.findall(r'<img class="plot" src="([^"]+)"', path.read_text(encoding="utf-8"))
    assert sorted(sources) == ["dictionary.png", "entity-embeddings.png", "entity-links.png", "timings.png"]
    for source in sources:
        assert "/" not in source  # relative, beside index.html
        plot = path.parent / source
        assert plot.stat().st_size > 1000
        width, height = png_size(plot)
        assert 300 <= width <= 1200 and 100 <= height <= 800, (source, width, height)


def test_most_ambiguous_names_are_the_names_with_the_most_candidates(run_copy):
    page = Path(write_report(str(run_copy))).read_text(encoding="utf-8")
    table = re.search(r'<table id="ambiguous-names">(.*?)</table>', page, flags=re.DOTALL).group(1)
    shown = [(html.unescape(name), int(count.replace(",", ""))) for name, count in
             re.findall(r'<td class="amb-name">(.*?)</td><td class="num">([\d,]+)</td>', table)]
    expected = expected_ambiguous(run_copy)
    assert len(expected) == 20 and shown == expected
    # the first name's candidates, each with its commonness
    names = tables.read_table(str(run_copy), "dictionary/names").to_pylist()
    entities = {row["entity_id"]: row["title"] for row in tables.read_table(str(run_copy), "entities").to_pylist()}
    first_row = table.split("</tr>")[1]
    for row in (row for row in names if row["name"] == expected[0][0]):
        assert f"{html.escape(entities[row['entity_id']])} <span class=\"bar\">" in first_row
        assert f"{100 * row['commonness']:.1f}%" in first_row


def test_ambiguous_names_are_found_when_a_names_rows_are_spread_over_files_and_batches(run_copy, tmp_path):
    names = tables.read_table(str(run_copy), "dictionary/names")
    shuffled = names.take(pa.array(np.random.default_rng(0).permutation(names.num_rows)))
    output = tmp_path / "spread"
    folder = output / "dictionary" / "names"
    folder.mkdir(parents=True)
    for part, rows in enumerate(np.array_split(np.arange(names.num_rows), 3)):
        pq.write_table(shuffled.slice(int(rows[0]), len(rows)), folder / f"part-{part}.parquet")
    shutil.copytree(run_copy / "entities", output / "entities")
    written = manifest.describe_outputs(str(output), ["dictionary/names", "entities"])
    manifest.save(str(output), {"dictionary": manifest.StageRecord("dictionary", {}, {}, written)})
    stats = dictionary_stats(str(output), top=20, batch_size=97)
    assert [(item.name, len(item.candidates)) for item in stats.ambiguous] == expected_ambiguous(run_copy)
    distinct = len(set(names.column("name").to_pylist()))
    assert stats.pairs == names.num_rows and stats.names == distinct
    assert stats.commonness.counts.sum() == names.num_rows
    assert stats.link_prob.counts.sum() == pytest.approx(distinct)  # once per name
    assert int((np.arange(len(stats.candidates_per_name)) * stats.candidates_per_name).sum()) == names.num_rows


def test_entity_statistics_match_the_entities_table(run_copy):
    entities = tables.read_table(str(run_copy), "entities").to_pylist()
    stats = gather.entity_stats(str(run_copy), top=5, batch_size=1000)
    assert stats.count == len(entities)
    assert stats.total_links == sum(row["link_count"] for row in entities)
    best = sorted(entities, key=lambda row: (-row["link_count"], row["entity_id"]))[:5]
    assert [(item.entity_id, item.title, item.link_count) for item in stats.top] == [
        (row["entity_id"], row["title"], row["link_count"]) for row in best]


def test_embedding_norms_match_the_target_norm(run_copy):
    stats = gather.embedding_stats(str(run_copy))
    vectors = faiss_shards.table_vectors(tables.read_table(str(run_copy), "entity_embeddings"))
    assert stats.count == len(vectors) and stats.dim == vectors.shape[1]
    # in float64: float32's norms were all exactly the target, the page's spread "std 0"
    np.testing.assert_array_equal(np.sort(stats.norms), np.sort(np.linalg.norm(vectors.astype(np.float64), axis=1)))
    np.testing.assert_allclose(stats.norms, stats.target_norm, rtol=1e-5)
    assert stats.norms.std() > 0
    assert stats.mentions_per_entity.sum() == stats.count


def test_an_embeddings_table_without_rows_has_its_schemas_dimension(run_copy):
    """A dump whose articles link nothing embeds no entity: the report said "dimension 0"."""
    dim = pq.read_schema(next((run_copy / "entity_embeddings").glob("*.parquet"))).field("embedding").type.list_size
    for path in (run_copy / "entity_embeddings").glob("*.parquet"):
        pq.write_table(pq.read_table(path).slice(0, 0), path)
    stats = gather.embedding_stats(str(run_copy))
    assert (stats.count, stats.dim, stats.value_type) == (0, dim, "float") and dim > 0


def test_flat_index_recall_is_one_on_all_vectors_and_on_a_subset(run_copy):
    page = Path(write_report(str(run_copy))).read_text(encoding="utf-8")
    assert '<span class="big">1.000</span> recall@10' in page
    index_dir = str(run_copy / "index")
    full = index_recall(index_dir)
    assert full.recall == 1.0 and not full.subset and full.queries == 200 and full.k == 10
    assert full.exact_vectors == full.total_vectors == faiss_shards.load_index_info(index_dir).count
    subset = index_recall(index_dir, queries=50, max_exact=1000)
    assert subset.subset and subset.exact_vectors == 1000 and subset.recall == 1.0


@pytest.mark.parametrize(("factory", "settings"), [("IVF128,Flat", "nprobe 32 of 128 lists"),
                                                   ("IVF128_HNSW4,Flat", "nprobe 32 of 128 lists, efSearch 128")])
def test_ivf_recall_equals_the_overlap_with_brute_force(tmp_path, factory, settings):
    """The recall of what ``search`` finds by default: its nprobe, and its efSearch in an HNSW coarse quantizer."""
    vectors = np.random.default_rng(0).normal(size=(600, 16))  # no clusters: IVF probing misses neighbours
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    ids = np.arange(600, dtype=np.int64) * 5 + 3
    index_dir = write_index_dir(tmp_path / "ivf", vectors, ids, 3, factory=factory)
    found = faiss_shards.ShardedIndex(index_dir).search(vectors, 10)[1]
    exact = brute_force(vectors, ids, vectors, 10)[1]
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found.tolist(), exact.tolist(), strict=True)])
    assert overlap < 1.0  # nprobe 32 of 128 lists misses some neighbours
    result = index_recall(index_dir, queries=600, k=10)
    assert result.queries == 600 and result.search_settings == settings
    assert result.recall == pytest.approx(overlap)


def test_subset_recall_restricts_faiss_to_the_exactly_searched_vectors(tmp_path):
    vectors, ids = clustered(600), np.arange(600, dtype=np.int64)
    index_dir = write_index_dir(tmp_path / "ivf", vectors, ids, 3, factory="IVF4,Flat")  # nprobe 32: every list
    result = index_recall(index_dir, queries=60, k=10, max_exact=250)
    assert result.subset and result.exact_vectors == 250 and result.total_vectors == 600
    assert result.recall == 1.0
    assert result.search_settings == "nprobe 4 of 4 lists"  # said nprobe 32: of 4 lists, every one is searched


def test_subset_recall_of_an_index_whose_search_takes_no_selector(tmp_path):
    """A product quantizer's search refuses FAISS's ID selector ("invalid search params": `report` was a traceback
    and no page above --max-exact passages): the other passages are removed from each shard read instead. FAISS
    then finds among the subset what an exact search over the subset's PQ-decoded vectors finds; the recall is
    that, scored against the true vectors."""
    import faiss

    from artifacts.run.report import recall

    vectors = np.random.default_rng(1).normal(size=(600, 16))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    ids = np.arange(600, dtype=np.int64) * 3 + 1
    index_dir = write_index_dir(tmp_path / "pq", vectors, ids, 2, factory="PQ4x4")
    info = faiss_shards.load_index_info(index_dir)
    queries, seen, ids_by_shard = recall._pick_queries(recall.stored_files(index_dir, info), info, 250, 60)
    decoded = {}
    for shard in info.shard_files:
        index = faiss_shards.read_index(f"{index_dir}/{shard['index']}")
        codes = faiss.downcast_index(index.index)  # IDMap -> its IndexPQ
        for row, passage_id in enumerate(np.load(f"{index_dir}/{shard['ids']}")):
            if passage_id in ids_by_shard.get(shard["name"], ()):
                decoded[int(passage_id)] = codes.reconstruct(row)
    subset = np.array(sorted(decoded))
    found = brute_force(np.stack([decoded[int(i)] for i in subset]), subset, queries, 10)[1]
    true = {int(i): vectors[np.searchsorted(ids, i)] for i in subset}
    exact = np.stack([true[int(i)] for i in subset]) @ queries.T  # (subset, queries)
    kth = -np.sort(-exact, axis=0)[9]
    hits = sum(float(true[int(i)] @ queries[query]) >= kth[query] - 1e-5 for query, row in enumerate(found)
               for i in row)
    result = index_recall(index_dir, queries=60, k=10, max_exact=250)
    assert result.subset and seen == result.exact_vectors == 250 and len(subset) == 250
    assert result.recall == pytest.approx(hits / (60 * 10)) and result.recall < 1.0


def test_a_refined_index_measured_on_part_of_its_passages_says_why_not(tmp_path):
    """A refined index's search takes no selector and FAISS removes nothing from it: the recall section says so
    with the --max-exact that measures it (the rest of the report is written); on all its passages it is
    measured."""
    vectors, ids = clustered(300), np.arange(300, dtype=np.int64)
    index_dir = write_index_dir(tmp_path / "refined", vectors, ids, 2, factory="PQ4x4,RFlat")
    with pytest.raises(InputError) as raised:
        index_recall(index_dir, queries=30, k=10, max_exact=100)
    assert raised.value.message.startswith("FAISS searches no part of a PQ4x4,RFlat index (")
    assert raised.value.message.endswith("report --max-exact 300 measures its recall on all its passages")
    measured = index_recall(index_dir, queries=30, k=10)
    assert not measured.subset and measured.exact_vectors == 300 and measured.recall > 0.9


def test_a_run_with_only_parse_says_not_run_for_the_other_stages(run_copy):
    records = manifest.load(str(run_copy))
    manifest.save(str(run_copy), {"parse": records["parse"]})
    for artifact in ("entities", "dictionary", "mentions", "entity_embeddings", "index", "passages"):
        shutil.rmtree(run_copy / artifact)
    page = Path(write_report(str(run_copy))).read_text(encoding="utf-8")
    by_stage = sections(page)
    assert f'wall time <b><span title="{records["parse"].wall_time_s:,.3f} s">' in by_stage["parse"]
    for stage in ("dictionary", "mentions", "embed_entities", "index"):
        assert "not run" in by_stage[stage] and "<table" not in by_stage[stage]
    assert re.findall(r'<img class="plot" src="([^"]+)"', page) == ["timings.png"]
    assert sorted(path.name for path in (run_copy / "report").iterdir()) == ["index.html", "manifest.sha256",
                                                                            "timings.png"]


def test_a_report_cut_short_keeps_no_stamp(run_copy, monkeypatch):
    """A report whose page cannot be written (a full disk) over an earlier one: the earlier stamp went with it, so
    publish does not take the mix of old and new files for a finished report of this run."""
    write_report(str(run_copy))
    assert (run_copy / "report" / "manifest.sha256").exists()

    def full(*_args, **_kwargs) -> str:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("artifacts.run.report.page.render", full)
    with pytest.raises(OSError):
        write_report(str(run_copy))
    assert (run_copy / "report" / "index.html").exists() and not (run_copy / "report" / "manifest.sha256").exists()


def test_a_new_report_removes_its_stale_plots_and_nothing_else(run_copy):
    users = fill_with_files(run_copy / "report", ("notes.txt", "mine/plot.png", "old.png"))
    write_report(str(run_copy))
    assert (run_copy / "report" / "dictionary.png").exists()
    records = manifest.load(str(run_copy))
    manifest.save(str(run_copy), {"parse": records["parse"]})
    for artifact in ("entities", "dictionary", "mentions", "entity_embeddings", "index", "passages"):
        shutil.rmtree(run_copy / artifact)
    write_report(str(run_copy))
    after = files_below(run_copy / "report")
    assert sorted(after) == sorted([*users, "index.html", "manifest.sha256", "timings.png"])  # no dictionary plot
    assert {name: after[name] for name in users} == users


def test_a_killed_reports_temporary_files_are_removed_and_another_reports_kept(run_copy):
    """A report killed while writing a file left its temporary file in report/ for ever (and publish copied it)."""
    killed, writing = run_copy / "report" / ".dictionary.png.0a1b.tmp", run_copy / "report" / ".index.html.2c3d.tmp"
    killed.parent.mkdir(exist_ok=True)
    killed.write_bytes(b"half a plot")
    writing.write_bytes(b"another report's page, being written")
    long_ago = time.time() - 3600
    os.utime(killed, (long_ago, long_ago))
    write_report(str(run_copy))
    assert not killed.exists()
    assert writing.exists()


def test_a_directory_where_the_page_goes_is_refused(run_copy, capsys):
    users = fill_with_files(run_copy / "report" / "index.html")
    assert main(["report", "--output", str(run_copy)]) == 2
    assert capsys.readouterr().err == (f"error: {run_copy / 'report' / 'index.html'} is a directory, not a file: "
                                       "it is left as it is\n")
    assert files_below(run_copy / "report" / "index.html") == users


def test_dead_letters_and_bad_input_counters_are_linked_and_text_is_escaped(run_copy):
    record = manifest.load(str(run_copy))
    dead = run_copy / "errors" / "parse" / "pages-00000-of-00001.jsonl"
    dead.write_text(json.dumps({"kind": "parser_errors", "reason": "boom"}) + "\n")
    parse = record["parse"]
    parse.counters = {**parse.counters, "parser_errors": 1234, "weird<script>alert(1)</script>": 2}
    parse.options = {**parse.options, "note": "<img src=x onerror=alert(1)>"}
    parse.outputs = [manifest.describe_file(str(run_copy), str(dead)) if item.path.startswith("errors/parse/")
                     else item for item in parse.outputs]
    manifest.save(str(run_copy), record)
    page = Path(write_report(str(run_copy))).read_text(encoding="utf-8")
    section = sections(page)["parse"]
    assert '<a href="../errors/parse/pages-00000-of-00001.jsonl">' in section
    assert re.search(r'<tr class="error"><td>[^<]*</td><td><code>parser_errors</code>.*?>1,234</td>', section)
    assert '<p class="alert">' in section
    assert "<script>" not in page and "<img src=x" not in page
    assert "weird&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_report_command_prints_the_page_and_a_missing_manifest_is_one_line(run_copy, tmp_path, capsys):
    assert main(["report", "--output", str(run_copy)]) == 0
    assert capsys.readouterr().out.strip() == str(run_copy / "report" / "index.html")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", "--output", str(empty)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "manifest.json" in error and "\n" not in error
    assert not (empty / "report").exists()


def test_value_counts_top_k_and_integer_bins():
    counts = ValueCounts()
    rng = np.random.default_rng(1)
    parts = [rng.integers(0, 50, size) for size in (10, 1000, 7, 300)]
    for part in parts:
        counts.add(part)
    values, found = counts.result()
    expected_values, expected_counts = np.unique(np.concatenate(parts), return_counts=True)
    assert values.tolist() == expected_values.tolist() and found.tolist() == expected_counts.tolist()
    best: TopK[tuple[int, str]] = TopK(3)
    for key in [(5, "e"), (1, "a"), (4, "d"), (2, "b"), (3, "c"), (1, "0")]:
        best.offer(key, key[1])
    assert best.items() == ["0", "a", "b"] and best.worst() == (2, "b")
    edges = integer_log_edges(1000)
    assert edges[0] == 1 and edges[-1] > 1000 and np.all(np.diff(edges) >= 1)
    assert edges[:5].tolist() == [1, 2, 3, 4, 5]


def test_skipped_streams_show_their_pages_on_the_bad_input_card(run_copy):
    record = manifest.load(str(run_copy))
    record["parse"].counters = {**record["parse"].counters, "bad_streams": 2, "pages_in_bad_streams": 106}
    manifest.save(str(run_copy), record)
    page = Path(write_report(str(run_copy))).read_text(encoding="utf-8")
    assert ('<div class="card"><div class="v">2 streams (106 pages)</div><div class="l">bad input records</div>'
            in page)
    assert "bad input (counted and dead-lettered): <b>2 streams (106 pages)</b>" in sections(page)["parse"]


@pytest.mark.parametrize(("counters", "expected"), [
    ({}, "0"),
    ({"pages_read": 9, "malformed_pages": 3}, "3"),
    ({"bad_streams": 1, "pages_in_bad_streams": 100}, "1 stream (100 pages)"),
    ({"bad_streams": 2, "pages_in_bad_streams": 106, "malformed_pages": 1234}, "1,234 + 2 streams (106 pages)"),
])
def test_bad_input_summary_counts_streams_with_their_pages(counters, expected):
    assert counter_info.bad_input_summary(*counter_info.bad_input(counters, DECLARED["parse"])) == expected


def test_each_stage_shows_its_own_counters_and_a_bad_window_counts_once(run_copy):
    """non_finite_vectors is a mention's (embed-entities) and a passage's (index): each section says its own; a
    NaN window counts its mentions as bad input (dead-lettered), not itself too (it was added twice); KPR entities
    cut off are dropped by design, not processed."""
    card = re.compile(r'<div class="card"><div class="v">([0-9,]+)</div><div class="l">bad input records</div>')
    before = int(card.search(Path(write_report(str(run_copy))).read_text(encoding="utf-8")).group(1).replace(",", ""))
    record = manifest.load(str(run_copy))
    assert not {"non_finite_windows", "non_finite_vectors"} & {*record["embed_entities"].counters,
                                                              *record["index"].counters}
    record["embed_entities"].counters = {**record["embed_entities"].counters, "non_finite_windows": 2,
                                         "non_finite_vectors": 3}
    record["index"].counters = {**record["index"].counters, "non_finite_vectors": 1, "kpr_entities_truncated": 4}
    manifest.save(str(run_copy), record)
    page = Path(write_report(str(run_copy))).read_text(encoding="utf-8")
    found = sections(page)
    assert "bad input (counted and dead-lettered): <b>3</b>" in found["embed_entities"]
    assert counter_row(found["index"], "non_finite_vectors").startswith(
        '<tr class="error"><td>vectors with NaN or inf (or a zero mean)</td>')
    assert counter_row(found["index"], "kpr_entities_truncated").startswith('<tr class="dropped">')
    assert int(card.search(page).group(1).replace(",", "")) == before + 3 + 1


@pytest.mark.parametrize(("values", "expected"), [([1], ["1"]), ([1, 2], ["1", "2"]),
                                                  ([3, 40, 120], ["0", "25", "50", "75", "100", "125"])])
def test_integer_axes_label_each_integer_once(values, expected):
    figure, (axis,) = plots._figure(1)
    axis.bar(values, [5] * len(values))
    plots._thousands(axis.xaxis)
    figure.canvas.draw()
    low, high = axis.get_xlim()
    assert [tick.get_text() for tick in axis.get_xticklabels() if low <= tick.get_position()[0] <= high] == expected


def counter_row(section: str, name: str) -> str:
    """The table row of counter ``name`` in a stage section."""
    row = re.search(rf'<tr class="[^"]*"><td>[^<]*</td><td><code>{name}</code></td>.*?</tr>', section)
    assert row is not None, name
    return row.group(0)


def test_a_counter_shows_its_declared_label_and_kind_and_an_undeclared_one_its_name(run_copy):
    record = manifest.load(str(run_copy))
    record["parse"].counters = {**record["parse"].counters, "widgets_discarded": 7, "mystery_errors": 3}
    manifest.save(str(run_copy), record)
    declared = {"parse": declare(dropped("widgets_discarded", "widgets thrown away on purpose"))}
    section = sections(Path(write_report_declared(str(run_copy), declared)).read_text(encoding="utf-8"))["parse"]
    assert counter_row(section, "widgets_discarded") == (
        '<tr class="dropped"><td>widgets thrown away on purpose</td><td><code>widgets_discarded</code></td>'
        '<td><span class="badge dropped-b">dropped</span></td><td class="num">7</td></tr>')
    # no guessing from the words in a name: undeclared is shown under its name, as processed
    assert counter_row(section, "mystery_errors") == (
        '<tr class=""><td>mystery_errors</td><td><code>mystery_errors</code></td>'
        '<td><span class="badge processed-b">processed</span></td><td class="num">3</td></tr>')
    assert ("Dropped by design: <b>1</b> of 1 counter above zero (each in its own unit, below) · bad input "
            "(counted and dead-lettered): <b>0</b>") in section


def test_the_report_command_shows_the_labels_the_stages_declare(run_copy):
    from transforms.mentions.graph import COUNTERS

    assert main(["report", "--output", str(run_copy)]) == 0
    section = sections((run_copy / "report" / "index.html").read_text(encoding="utf-8"))["mentions"]
    counters = manifest.load(str(run_copy))["mentions"].counters
    assert counters and set(counters) <= set(COUNTERS)
    for name in counters:
        label, kind = html.escape(COUNTERS[name].label), COUNTERS[name].kind
        assert (f'<td>{label}</td><td><code>{name}</code></td><td><span class="badge {kind}-b">{kind}</span>'
                in counter_row(section, name)), name


def test_a_stray_unrecorded_parquet_file_is_not_read(run_copy):
    entities = tables.read_table(str(run_copy), "entities")
    before = gather.entity_stats(str(run_copy))
    pq.write_table(pa.concat_tables([entities, entities]), run_copy / "entities" / "part-stray.parquet")
    assert tables.read_table(str(run_copy), "entities").num_rows == 3 * entities.num_rows  # a glob would see it
    after = gather.entity_stats(str(run_copy))
    assert (after.count, after.total_links, after.top) == (before.count, before.total_links, before.top)
    assert after.count == entities.num_rows
    page = Path(write_report(str(run_copy))).read_text(encoding="utf-8")
    assert f"<tr><td>entities</td><td>{entities.num_rows:,}</td></tr>" in page
    assert "Could not read" not in page


def test_durations_read_as_people_write_them():
    assert [duration(seconds) for seconds in (0.483, 59.94, 59.96, 1638.483, 3600, 11_100)] == [
        "0.5 s", "59.9 s", "1 min 00 s", "27 min 18 s", "1 h 00 min", "3 h 05 min"]


def test_an_option_left_to_its_default_says_so(run_copy):
    """The index's encoder records "" for a setting the encoder type decides (similarity, title): shown as such,
    beside the metric the index was built with."""
    page = Path(write_report(str(run_copy))).read_text(encoding="utf-8")
    index = sections(page)["index"]
    assert '<span>similarity</span> <span class="muted">default</span>' in index
    assert '<code>""</code>' not in page
    assert re.search(r"<td>metric</td><td>cosine</td>", index)
