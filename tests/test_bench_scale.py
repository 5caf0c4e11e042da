"""The scale benchmark's pieces: enwiki-shaped synthetic dumps, the process-tree sampler, the report, the no-op
model."""

from __future__ import annotations

import bz2
import json
import os
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from bench.memory import ProcessTreeSampler, run_measured
from bench.scale import NO_OP_MODEL
from bench.scale_report import StageRun, amdahl_fit, cpu_per_article, fit_line, projection, speedups
from bench.synthetic import (
    DUMP_NAME,
    INDEX_NAME,
    Shape,
    SyntheticDump,
    sample_material,
    split_dump,
    synthetic_dump,
    write_multistream,
)

REPO = Path(__file__).resolve().parent.parent
HEADER = b'<mediawiki xml:lang="en">\n  <siteinfo>\n    <sitename>Wikipedia</sitename>\n  </siteinfo>\n'
FOOTER = b"</mediawiki>\n"


def page(page_id: int, title: str, text: str, redirect: str | None = None) -> bytes:
    redirect_tag = f'    <redirect title="{redirect}" />\n' if redirect else ""
    return (f"  <page>\n    <title>{title}</title>\n    <ns>0</ns>\n    <id>{page_id}</id>\n{redirect_tag}"
            f"    <revision>\n      <id>7</id>\n      <comment>[[WP:X|x]]</comment>\n"
            f'      <text xml:space="preserve">{text}</text>\n    </revision>\n  </page>\n').encode()


def test_multistream_dump_streams_and_index(tmp_path: Path) -> None:
    pages = [page(index + 1, f"Page {index}", "text") for index in range(150)]
    count, size = write_multistream(HEADER, iter(pages), FOOTER, tmp_path)
    raw = (tmp_path / DUMP_NAME).read_bytes()
    assert (count, size) == (150, len(HEADER) + sum(map(len, pages)) + len(FOOTER))
    lines = bz2.decompress((tmp_path / INDEX_NAME).read_bytes()).decode().splitlines()
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


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> SyntheticDump:
    return synthetic_dump(Shape(600, seed=3), tmp_path_factory.mktemp("generated"))


def test_a_generated_dump_has_english_wikipedias_shape(generated: SyntheticDump) -> None:
    counts, articles = generated.counts, generated.articles
    assert counts.articles == articles and counts.pages_read == articles + counts.redirect_pages + \
        counts.non_article_pages
    assert 2.3 < counts.titles / articles < 2.7  # the article and ~1.5 redirects
    assert 0.02 < counts.chained_redirects / counts.redirect_pages < 0.1
    assert 22 < counts.links / articles < 26
    assert 0.08 < counts.red_links / counts.links < 0.12 and 0.07 < counts.links_via_redirect / counts.links < 0.13
    assert 0.9 < counts.linked_articles / articles <= 1.0  # ~1 linked entity per article
    assert 2.5 < counts.anchor_names / articles < 3.5
    assert 6_000 < counts.xml_bytes / articles < 8_500
    lines = bz2.decompress(generated.index.read_bytes()).decode().splitlines()
    assert len(lines) == counts.pages_read


def test_a_generated_dump_is_determined_by_its_seed_and_written_once(generated: SyntheticDump,
                                                                     tmp_path: Path) -> None:
    material = sample_material()
    again = synthetic_dump(Shape(600, seed=3), tmp_path / "again", material)
    other = synthetic_dump(Shape(600, seed=4), tmp_path / "other", material)
    assert again.dump.read_bytes() == generated.dump.read_bytes() and again.counts == generated.counts
    assert other.dump.read_bytes() != generated.dump.read_bytes()
    written = again.dump.stat().st_mtime_ns
    assert synthetic_dump(Shape(600, seed=3), tmp_path / "again") == again
    assert again.dump.stat().st_mtime_ns == written


def test_parse_counts_what_the_generator_generated(generated: SyntheticDump, tmp_path: Path) -> None:
    from artifacts.run import manifest
    from bench.common import run_cli

    run_cli("parse", "--dump", str(generated.dump), "--output", str(tmp_path / "out"))
    counters = manifest.load(str(tmp_path / "out"))["parse"].counters
    counts = generated.counts
    expected = {"pages_read": counts.pages_read, "articles": counts.articles, "redirect_pages": counts.redirect_pages,
                "redirects_resolved": counts.redirect_pages, "non_article_pages": counts.non_article_pages,
                "links": counts.links, "links_via_redirect": counts.links_via_redirect, "red_links": counts.red_links}
    assert {name: counters.get(name) for name in expected} == expected


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


def test_a_peak_between_two_samples_still_counts(tmp_path: Path) -> None:
    """200 MB held for a moment, between two samples a second apart: the sum misses it, the process's VmHWM not."""
    spike = "import time; block = b'x' * (200 << 20); del block; time.sleep(1.5)"
    measured = run_measured([sys.executable, "-c", spike], tmp_path / "log", every=1.0)
    assert measured.peak_rss_bytes >= measured.max_process_rss_bytes > 200e6


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


def measured_run(stage: str, articles: int, rss_mb: float, **outputs: float) -> StageRun:
    return StageRun(stage, articles, articles * 7_000, 1, True, 10.0, 10.0, int(rss_mb * 1e6), 1, int(rss_mb * 1e6),
                    outputs={"articles": float(articles), **outputs})


def test_memory_is_projected_per_output_unit_and_the_index_by_one_dpr_shard() -> None:
    from artifacts.faiss import choice

    runs = [measured_run("parse", 2_500, 400.0, titles=6_000.0),  # buffers still filling: not in the fit
            measured_run("parse", 10_000, 560.0, titles=25_000.0), measured_run("parse", 40_000, 550.0, titles=1e5),
            measured_run("mentions", 10_000, 500.0, mentions=1e5),
            measured_run("mentions", 40_000, 530.0, mentions=4e5),
            measured_run("index", 10_000, 700.0, **{"vector MB": 100.0, "passages": 1e5}),
            measured_run("index", 40_000, 1_000.0, **{"vector MB": 400.0, "passages": 4e5})]
    rows = {row["stage"]: row for row in projection(runs)}
    assert rows["parse"]["peak_memory_gb"] == pytest.approx(0.56)  # the fit falls below the largest measured
    assert rows["mentions"]["peak_memory_gb"] == pytest.approx((490.0 + 100e-6 * 112e6) / 1e3)  # 100 B a mention
    assert rows["mentions"]["hours"] == pytest.approx(6.7e6 / (40_000 / 10.0 * 16) / 3600)
    shard_mb = choice.vector_bytes(21_000_000, 768) / 16 / 1e6  # DPR within the default 8 GB: 16 shards
    assert rows["index"]["peak_memory_gb"] == pytest.approx((600.0 + 1.0 * shard_mb) / 1e3)


def test_a_saved_stand_in_run_reads_back_as_the_no_op_model_paced_as_one_gpu(tmp_path: Path, capsys) -> None:
    """`bench.scale --stand-in N` (the no-op model, paced) saved `no_op_model: false` and printed its GPU stages'
    hours with no word that their workers shared one stand-in GPU."""
    from bench.scale import main, parse_args, save

    args = parse_args(["--stand-in", "2193960", "--json", str(tmp_path / "runs.json")])
    save(args, [measured_run("embed-entities", 10_000, 500.0, mentions=1e5)])
    assert json.loads((tmp_path / "runs.json").read_text())["settings"]["no_op_model"] is True
    main(["--report", str(tmp_path / "runs.json")])
    assert ("  embed-entities and index: each run's forward paced as ONE GPU of 2,193,960 tokens a second shared by "
            "its workers (--stand-in): their hours assume a share of such a GPU per worker as measured, 16 shares; "
            "README 'GPUs' projects one card") in capsys.readouterr().out.splitlines()


def test_cpu_per_article_has_a_marginal_cost_only_between_sizes() -> None:
    """Repeated runs of one size (alternated rounds, read back with --report) give each its own figure and no
    marginal cost between them; the next size's marginal is taken from the last run before it."""
    runs = [measured_run("index", articles, 500.0) for articles in (10_000, 10_000, 40_000)]
    for run, cpu_s in zip(runs, (10.0, 12.0, 42.0), strict=True):
        run.cpu_s = cpu_s
    rows = cpu_per_article(runs)
    assert [row["cpu_ms_per_article"] for row in rows] == pytest.approx([1.0, 1.2, 1.05])
    assert "marginal_cpu_ms_per_article" not in rows[1]
    assert rows[2]["marginal_cpu_ms_per_article"] == pytest.approx(1e3 * 30.0 / 30_000)


def timed_run(stage: str, articles: int, workers: int, wall_s: float) -> StageRun:
    return StageRun(stage, articles, articles * 7_000, workers, True, wall_s, wall_s * workers, int(1e8), workers,
                    int(1e8))


def test_the_speed_up_says_what_of_each_run_is_not_parallel() -> None:
    """Runs of 10 s that do not spread and 90 s that do take 10 + 90 / N with N workers: 10 s come back at every count,
    as that share of each run; a stage that scales perfectly has none; one with no gain at all is all serial."""
    runs = [timed_run("parse", 40_000, workers, 10 + 90 / workers) for workers in (1, 4, 8, 16)]
    runs += [timed_run("dictionary", 40_000, workers, 100 / workers) for workers in (1, 4)]
    runs += [timed_run("dictionary", 10_000, 4, 30.0), timed_run("dictionary", 10_000, 16, 30.0)]
    found = {(item["stage"], item["articles"], item["workers"]): item for item in speedups(runs)}
    assert [found[("parse", 40_000, workers)]["serial_s"] for workers in (4, 8, 16)] == pytest.approx([10.0] * 3)
    assert [found[("parse", 40_000, workers)]["serial_share"] for workers in (4, 8, 16)] == pytest.approx(
        [10 / 32.5, 10 / 21.25, 10 / 15.625])
    assert found[("parse", 40_000, 16)]["speedup"] == pytest.approx(100 / 15.625)
    assert found[("dictionary", 40_000, 4)]["serial_s"] == pytest.approx(0.0, abs=1e-9)
    assert found[("dictionary", 10_000, 16)]["serial_share"] == pytest.approx(1.0)  # fitted on 4 and 16 workers
    # measured times around the fit: each share is the fit's (s / (s + p / N)), never more than the whole run
    noisy = [timed_run("mentions", 40_000, workers, wall_s) for workers, wall_s in ((1, 23.4), (4, 17.0), (8, 19.5))]
    shares = [item["serial_share"] for item in speedups(noisy)]
    serial, parallel = amdahl_fit(noisy)
    assert shares == pytest.approx([serial / (serial + parallel / workers) for workers in (4, 8)])
    assert max(shares) < 1 < serial / 17.0
    assert ("parse", 40_000, 1) not in found
    rounds = [timed_run("index", 40_000, workers, wall_s) for workers, wall_s in ((1, 80), (2, 50), (1, 76), (2, 40))]
    [alternated] = speedups(rounds)  # two rounds of 1 and 2 workers: the means, 78 s and 45 s
    assert (alternated["workers"], alternated["speedup"]) == (2, pytest.approx(78 / 45))


WORKER_PIPELINE = """
import json, os, sys
import apache_beam as beam

class Encode(beam.DoFn):
    def __init__(self, model, results):
        self.model, self.results = model, results

    def process(self, element):
        from encoders.mask_encoder import MaskEncoder
        from encoders.mask_inputs import mask_inputs
        from encoders.models import ModelSpec
        encoder = MaskEncoder(ModelSpec(self.model), -1, 256)
        rows = [{"entity_id": 1, "text": "Plato taught Aristotle in Athens.", "start": 13, "end": 22},
                {"entity_id": 2, "text": "Socrates was a philosopher.", "start": 0, "end": 8}]
        vectors = encoder.encode(mask_inputs(rows, encoder.tokenizer, 16))
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
    vectors = np.array([vector for output in outputs for vector in output["vectors"]])
    assert vectors.shape == (8, 32)  # the tiny BERT's hidden size: unit vectors, as incompressible as real ones
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    assert all(len(np.unique(vector)) == 32 for vector in vectors)
    distinct = np.unique(vectors.astype(np.float32), axis=0)  # the two inputs, each encoded in four workers' calls
    assert len(distinct) == 2 and len(zlib.compress(distinct.tobytes())) > 0.8 * distinct.nbytes
    patched = {int(marker.name.split("-")[0]) for marker in markers.iterdir() if marker.name.endswith("mask_encoder")}
    assert workers <= patched


STAND_IN_CALLER = """
import importlib.util, json, sys, time
spec = importlib.util.spec_from_file_location("no_op_model", sys.argv[1])
model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(model)
card = model.StandInCard(sys.argv[2])
start, cpu = time.time(), time.process_time()
returned = []  # when each forward returned to the host
for _ in range(int(sys.argv[4])):
    card.forward(int(sys.argv[3]))
    returned.append(time.time() - start)
waited = card.synchronize()
print(json.dumps({"start": start, "end": time.time(), "cpu": time.process_time() - cpu, "returned": returned,
                  "waited": waited, "queued": model.QUEUED}))
"""


def run_stand_in(sitecustomize: Path, setting: str, tokens: int, calls: int, processes: int) -> list[dict]:
    children = [subprocess.Popen([sys.executable, "-c", STAND_IN_CALLER, str(sitecustomize), setting, str(tokens),
                                  str(calls)], stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    return [json.loads(child.communicate(timeout=60)[0]) for child in children]


def test_the_stand_in_gpu_paces_the_forwards_of_every_process_on_one_clock(tmp_path: Path) -> None:
    """Two processes' forwards queue on one stand-in GPU: together they take their tokens over its rate, not half
    of it, and they wait without using the CPU."""
    rate, tokens, calls = 200_000, 10_000, 10  # 0.05 s a call, 1.0 s for both processes' 20 calls
    results = run_stand_in(NO_OP_MODEL / "sitecustomize.py", f"{rate}:{tmp_path / 'gpu-clock'}", tokens, calls, 2)
    busy = max(result["end"] for result in results) - min(result["start"] for result in results)
    assert busy == pytest.approx(2 * calls * tokens / rate, rel=0.1)
    assert all(result["cpu"] < 0.1 * (result["end"] - result["start"]) for result in results)
    # Without a stand-in the forward does not wait.
    alone = run_stand_in(NO_OP_MODEL / "sitecustomize.py", "", tokens, calls, 1)[0]
    assert alone["waited"] == 0.0 and alone["end"] - alone["start"] < 0.05


def test_a_stand_in_forward_returns_once_queued_and_reading_back_waits_for_the_card(tmp_path: Path) -> None:
    """As on a CUDA device, the host runs ahead of the stand-in GPU by QUEUED forwards (their calls return at
    once) and then at its pace; reading the results back waits for the last forward."""
    rate, tokens, calls = 100_000, 10_000, 6  # 0.1 s a forward
    result = run_stand_in(NO_OP_MODEL / "sitecustomize.py", f"{rate}:{tmp_path / 'gpu-clock'}", tokens, calls, 1)[0]
    forward, queued = tokens / rate, result["queued"]
    ahead, paced = result["returned"][:queued], result["returned"][queued:]
    assert max(ahead) < 0.2 * forward
    assert paced == pytest.approx([(index + 1) * forward for index in range(len(paced))], abs=0.3 * forward)
    assert result["end"] - result["start"] == pytest.approx(calls * forward, abs=0.3 * forward)
    assert result["waited"] == pytest.approx(queued * forward, abs=0.3 * forward)  # the last ones, when read back


def test_a_measured_run_starts_from_scratch_without_what_earlier_runs_kept(tmp_path: Path) -> None:
    from bench.common import forget_kept_work

    for folder in ("mention_vectors", "entity_embeddings", "mentions", ".staging/embed_entities.kept",
                   ".staging/index.kept"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "part.parquet").write_bytes(b"x")
    forget_kept_work(tmp_path, "mentions")  # keeps nothing for reuse: nothing removed
    forget_kept_work(tmp_path, "embed-entities")
    left = {str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*.parquet")}
    assert left == {"entity_embeddings/part.parquet", "mentions/part.parquet", ".staging/index.kept/part.parquet"}
    forget_kept_work(tmp_path, "index")
    assert not (tmp_path / ".staging" / "index.kept").exists()
