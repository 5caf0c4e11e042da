"""The scale benchmark's pieces: synthetic multistream dumps, the process-tree sampler, the no-op model."""

from __future__ import annotations

import bz2
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench.memory import ProcessTreeSampler, run_measured
from bench.scale import NO_OP_MODEL
from bench.scale_report import StageRun, fit_line, projection
from bench.synthetic import copied_pages, links_to_copy, split_dump, synthetic_dump, write_multistream

REPO = Path(__file__).resolve().parent.parent
HEADER = b'<mediawiki xml:lang="en">\n  <siteinfo>\n    <sitename>Wikipedia</sitename>\n  </siteinfo>\n'
FOOTER = b"</mediawiki>\n"


def page(page_id: int, title: str, text: str, redirect: str | None = None) -> bytes:
    redirect_tag = f'    <redirect title="{redirect}" />\n' if redirect else ""
    return (f"  <page>\n    <title>{title}</title>\n    <ns>0</ns>\n    <id>{page_id}</id>\n{redirect_tag}"
            f"    <revision>\n      <id>7</id>\n      <comment>[[WP:X|x]]</comment>\n"
            f'      <text xml:space="preserve">{text}</text>\n    </revision>\n  </page>\n').encode()


def test_links_to_copy_renames_targets_and_keeps_the_shown_text() -> None:
    text = ("[[Aristotle|the philosopher]] met [[Plato]]s and [[Plato#Works|his works]]; "
            "[[#Notes]], [[:Category:Greeks]], [[Athens (city)|]], [[File:Bust.jpg|thumb|A [[Plato]] bust]]")
    copied = links_to_copy(page(12, "Socrates", text), 3)
    assert (b"[[Aristotle (copy 3)|the philosopher]] met [[Plato (copy 3)|Plato]]s and "
            b"[[Plato (copy 3)#Works|his works]]; [[#Notes]], [[:Category:Greeks]], [[Athens (city)|]], "
            b"[[File:Bust.jpg|thumb|A [[Plato (copy 3)|Plato]] bust]]") in copied
    assert b"<comment>[[WP:X|x]]</comment>" in copied  # only the text's links
    assert links_to_copy(page(12, "Socrates", text), 0) == page(12, "Socrates", text)


def test_copies_get_new_ids_titles_and_in_grow_mode_their_own_link_targets() -> None:
    pages = [page(10, "Plato", "[[Socrates]]"), page(11, "Socrate", "#REDIRECT [[Socrates]]", redirect="Socrates")]
    kept = copied_pages(pages, 2, "keep")
    grown = copied_pages(pages, 2, "grow")
    assert kept[:2] == grown[:2] == pages
    assert b"<title>Plato (copy 1)</title>" in kept[2] and b"<id>10000010</id>" in kept[2]
    assert b"[[Socrates]]" in kept[2] and b"[[Socrates (copy 1)|Socrates]]" in grown[2]
    assert b'<redirect title="Socrates (copy 1)" />' in grown[3]
    assert b"#REDIRECT [[Socrates (copy 1)|Socrates]]" in grown[3]
    with pytest.raises(ValueError, match="entities"):
        copied_pages(pages, 2, "double")


def test_multistream_dump_streams_and_index(tmp_path: Path) -> None:
    pages = [page(index + 1, f"Page {index}", "text") for index in range(150)]
    dump, index, size = write_multistream(HEADER, pages, FOOTER, tmp_path)
    raw = dump.read_bytes()
    assert size == len(HEADER) + sum(map(len, pages)) + len(FOOTER)
    lines = bz2.decompress(index.read_bytes()).decode().splitlines()
    assert len(lines) == 150 and lines[0].split(":")[1:] == ["1", "Page 0"]
    offsets = sorted({int(line.split(":")[0]) for line in lines})
    assert len(offsets) == 2  # streams of 100 pages
    assert bz2.BZ2Decompressor().decompress(raw[:offsets[0]]) == HEADER  # stream 0: the header
    second = bz2.BZ2Decompressor()
    assert second.decompress(raw[offsets[0]:]) == b"".join(pages[:100])
    last = bz2.BZ2Decompressor()
    assert last.decompress(second.unused_data) == b"".join(pages[100:]) and last.unused_data  # the footer follows
    assert bz2.decompress(raw) == HEADER + b"".join(pages) + FOOTER
    assert split_dump(bz2.decompress(raw)) == (HEADER, pages, FOOTER)


def test_synthetic_dump_is_written_once_and_reused(tmp_path: Path) -> None:
    source = tmp_path / "source.xml.bz2"
    source.write_bytes(bz2.compress(HEADER + page(10, "Plato", "[[Socrates]]") + FOOTER))
    first = synthetic_dump(source, 3, "grow", tmp_path / "x3")
    written = first.dump.stat().st_mtime_ns
    again = synthetic_dump(source, 3, "grow", tmp_path / "x3")
    assert again == first and again.dump.stat().st_mtime_ns == written
    assert (first.pages, first.copies, first.xml_bytes) == (3, 3, len(bz2.decompress(first.dump.read_bytes())))


def test_grown_dump_parses_to_copies_linking_to_their_own_pages(tmp_path: Path) -> None:
    from artifacts import tables
    from bench.common import run_cli

    source = tmp_path / "source.xml.bz2"
    pages = [page(10, "Plato", "[[Socrates|His teacher]] taught [[Aristotle]]s."),
             page(11, "Socrates", "A philosopher.")]
    source.write_bytes(bz2.compress(HEADER + b"".join(pages) + FOOTER))
    dump = synthetic_dump(source, 2, "grow", tmp_path / "dump")
    run_cli("parse", "--dump", str(dump.dump), "--output", str(tmp_path / "out"))
    rows = {row["title"]: row for row in tables.read_table(str(tmp_path / "out"), "articles").to_pylist()}
    assert rows["Plato"]["text"] == rows["Plato (copy 1)"]["text"] == "His teacher taught Aristotles."
    assert [link["target"] for link in rows["Plato (copy 1)"]["links"]] == ["Socrates (copy 1)", "Aristotle (copy 1)"]
    assert [link["target"] for link in rows["Plato"]["links"]] == ["Socrates", "Aristotle"]


ALLOCATE = "import sys, time; block = b'x' * ({mb} << 20); time.sleep({seconds})"


def test_sampler_sums_the_rss_of_a_process_and_its_descendants(tmp_path: Path) -> None:
    child = ALLOCATE.format(mb=150, seconds=1.5)
    parent = (f"import subprocess, sys; block = b'x' * (100 << 20); "
              f"subprocess.run([sys.executable, '-c', {child!r}], check=True)")
    launcher = b"x" * (300 << 20)  # this process is large: a child's ru_maxrss would count it, VmHWM does not
    measured = run_measured([sys.executable, "-c", parent], tmp_path / "log")
    assert measured.returncode == 0 and measured.processes == 2 and len(launcher) == 300 << 20
    assert 250e6 < measured.peak_rss_bytes < 400e6
    assert 150e6 < measured.max_process_rss_bytes < 250e6  # the grandchild, the largest process
    assert measured.wall_s >= 1.5 and measured.cpu_s > 0


def test_sampler_keeps_the_peak_after_the_tree_shrinks() -> None:
    process = subprocess.Popen([sys.executable, "-c", ALLOCATE.format(mb=120, seconds=0.5) + "; del block; "
                                "time.sleep(1.0)"])
    with ProcessTreeSampler(process.pid, every=0.05) as sampler:
        process.wait()
        now = sampler.sample()
    assert sampler.peak_rss_bytes > 120e6 > now


def test_run_measured_kills_the_whole_tree_on_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild"
    parent = (f"import subprocess, sys, time; process = subprocess.Popen([sys.executable, '-c', "
              f"'import time; time.sleep(60)']); open({str(pid_file)!r}, 'w').write(str(process.pid)); "
              f"time.sleep(60)")
    started = time.perf_counter()
    measured = run_measured([sys.executable, "-c", parent], tmp_path / "log", timeout_s=3)
    assert measured.returncode == -9 and time.perf_counter() - started < 30
    grandchild = int(pid_file.read_text())
    time.sleep(0.2)
    state = Path(f"/proc/{grandchild}/stat")
    assert not state.exists() or state.read_text().split(") ")[1].startswith("Z")


def test_fit_line() -> None:
    assert fit_line([10, 20, 40], [3 + 2 * 10, 3 + 2 * 20, 3 + 2 * 40]) == pytest.approx((2.0, 3.0))


def measured_run(stage: str, copies: int, rss_mb: float, **facts: float) -> StageRun:
    return StageRun(stage, copies, copies * 6_000_000, 1, True, 10.0, 10.0, int(rss_mb * 1e6), 1,
                    items={"XML MB" if stage == "parse" else "passages": 1_000.0}, facts=dict(facts))


def test_projection_of_a_flat_stage_is_what_was_measured_and_the_index_grows_by_one_dpr_shard() -> None:
    from artifacts.faiss import choice

    runs = [measured_run("parse", 10, 560.0), measured_run("parse", 40, 550.0),
            measured_run("index", 10, 700.0, vector_mb=100.0), measured_run("index", 40, 1_000.0, vector_mb=400.0)]
    rows = {row["stage"]: row for row in projection(runs, max_mentions=16)}
    assert rows["parse"]["peak_memory_gb"] == pytest.approx(0.56)  # the fit falls below the largest measured
    shard_mb = choice.vector_bytes(21_000_000, 768) / 16 / 1e6  # DPR within the default 8 GB: 16 shards
    assert rows["index"]["peak_memory_gb"] == pytest.approx((600.0 + 1.0 * shard_mb) / 1e3)


WORKER_PIPELINE = """
import json, os, sys
import apache_beam as beam

class Encode(beam.DoFn):
    def __init__(self, model, results):
        self.model, self.results = model, results

    def process(self, element):
        from encoders.mask_encoder import MaskEncoder
        from encoders.models import ModelSpec
        encoder = MaskEncoder(ModelSpec(self.model), -1, 256)
        rows = [{"entity_id": 1, "text": "Plato taught Aristotle in Athens.", "start": 13, "end": 22},
                {"entity_id": 2, "text": "Socrates was a philosopher.", "start": 0, "end": 8}]
        vectors = encoder.encode_rows(rows, 16)
        with open(os.path.join(self.results, f"{element}.json"), "w") as handle:
            json.dump({"pid": os.getpid(), "vectors": vectors.tolist()}, handle)
        yield element

options = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
with beam.Pipeline(argv=options) as pipeline:
    _ = pipeline | beam.Create(list(range(4))) | beam.Reshuffle() | beam.ParDo(Encode(sys.argv[1], sys.argv[2]))
"""


def test_no_op_model_replaces_the_forward_in_beam_worker_processes(tmp_path: Path, tiny_bert: Path) -> None:
    results, markers = tmp_path / "results", tmp_path / "markers"
    results.mkdir()
    markers.mkdir()
    env = {**os.environ, "PYTHONPATH": str(NO_OP_MODEL), "KPR_NO_OP_MODEL_MARKERS": str(markers)}
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(WORKER_PIPELINE), str(tiny_bert), str(results)],
                             cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    _, errors = child.communicate(timeout=300)
    assert child.returncode == 0, errors[-2000:]
    outputs = [json.loads(path.read_text()) for path in results.iterdir()]
    workers = {output["pid"] for output in outputs}
    assert len(outputs) == 4 and child.pid not in workers  # encoded in Beam's worker subprocesses
    vectors = [value for output in outputs for vector in output["vectors"] for value in vector]
    assert vectors == pytest.approx([32 ** -0.5] * 32 * 8)  # the tiny BERT's hidden size, equal unit vectors
    patched = {int(marker.name.split("-")[0]) for marker in markers.iterdir() if marker.name.endswith("mask_encoder")}
    assert workers <= patched
