"""``write_report``: gather the data of every recorded stage, draw the plots, write OUT/report/index.html."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import pyarrow as pa

from artifacts import faiss as faiss_shards
from artifacts import fs, layout, tables
from artifacts.counters import Counter
from artifacts.errors import DamagedManifestError, InputError
from artifacts.run import manifest
from artifacts.run.diff.runs import diff_runs, require_complete
from artifacts.run.report import changes, dictionary, gather, page, plots, stages
from artifacts.run.report.data import ReportData
from artifacts.run.report.markup import esc
from artifacts.run.report.recall import MAX_EXACT, QUERIES, index_recall
from artifacts.run.validation.files import stale_stages

LOG = logging.getLogger("kpr.report")
REPORT_DIR = layout.REPORT
HTML_NAME = "index.html"
TIMINGS_PLOT, ENTITY_LINKS_PLOT, DICTIONARY_PLOT, EMBEDDINGS_PLOT = (
    "timings.png", "entity-links.png", "dictionary.png", "entity-embeddings.png")
# every plot a report may draw: a new report removes those it does not draw (stale), and nothing else in report/
PLOTS = (TIMINGS_PLOT, ENTITY_LINKS_PLOT, DICTIONARY_PLOT, EMBEDDINGS_PLOT)
# How old a temporary file of report/ is before a report takes it for a killed report's: a report holds no lock
# (another may be writing one now), and writes each file in well under a second.
LEFT_BEHIND_S = 600.0
T = TypeVar("T")

# what a section can hit when an artifact the manifest lists has been moved or damaged since (RuntimeError: FAISS's)
_READ_ERRORS = (tables.MissingArtifactError, InputError, OSError, ValueError, KeyError, RuntimeError,
                pa.ArrowException)


def _attempt(data: ReportData, section: str, compute: Callable[[], T]) -> T | None:
    try:
        return compute()
    except DamagedManifestError:
        raise  # not a section's problem: the command says it in one line
    except _READ_ERRORS as error:
        message = getattr(error, "message", None) or str(error) or type(error).__name__
        data.problems[section] = message.splitlines()[0]
        LOG.warning("report: %s: %s", section, data.problems[section])
        return None


class NoManifestError(InputError):
    """OUT has no manifest: no stage has completed there."""

    def __init__(self, output: str) -> None:
        super().__init__(f"{output} has no {manifest.MANIFEST_NAME}: no stage has completed there")
        self.output = output


def load_records(output: str) -> dict[str, manifest.StageRecord]:
    """The manifest's stage records; a one-line error when OUT has no (readable) manifest or a file it records is
    gone or resized (``IncompleteRunError``)."""
    path = manifest.manifest_path(output)
    if not fs.exists(path):
        raise NoManifestError(output)
    records = manifest.load(output)
    require_complete(output, records)
    return records


def collect(output: str, declared: Mapping[str, Counter], recall_queries: int = QUERIES,
            max_exact: int = MAX_EXACT, previous: str | None = None) -> ReportData:
    records = load_records(output)
    data = ReportData(output, manifest.now_iso(), stages.stage_views(records), declared,
                      stale=stale_stages(records))
    recorded = changes.recorded_previous(records)
    if previous:
        data.previous = previous
        data.changes = _attempt(data, "changes", lambda: diff_runs(previous, output))
    elif recorded:
        data.previous = recorded.path
        data.changes = _attempt(data, "changes", lambda: changes.diff_with_recorded(recorded, output))
    if layout.DICTIONARY_STAGE in records:
        data.entities = _attempt(data, "entities", lambda: gather.entity_stats(output))
        data.dictionary = _attempt(data, "dictionary", lambda: dictionary.dictionary_stats(output))
    if layout.EMBED_ENTITIES_STAGE in records:
        data.embeddings = _attempt(data, "embeddings", lambda: gather.embedding_stats(output))
    if layout.INDEX_STAGE in records:
        _collect_index(data, records, recall_queries, max_exact)
    return data


def _collect_index(data: ReportData, records: dict[str, manifest.StageRecord], recall_queries: int,
                   max_exact: int) -> None:
    """The index's files and recall, from the stored vectors the manifest records."""
    index_dir = fs.join(data.output, layout.INDEX)
    data.index_info = _attempt(data, "index", lambda: faiss_shards.load_index_info(index_dir))
    data.index_files = stages.index_files(records[layout.INDEX_STAGE])
    if data.index_info is None:
        return
    vectors = f"{layout.INDEX}/{faiss_shards.EMBEDDINGS_DIR}"
    data.recall = _attempt(data, "recall", lambda: index_recall(
        index_dir, recall_queries, max_exact=max_exact,
        files=frozenset(manifest.recorded_files(data.output, vectors, stages=records))))


def _draw(data: ReportData) -> dict[str, bytes]:
    drawings: dict[str, Callable[[], bytes]] = {}
    if any(view.record is not None for view in data.views):
        drawings[TIMINGS_PLOT] = lambda: plots.timings(data.views)
    if data.entities is not None:
        drawings[ENTITY_LINKS_PLOT] = lambda: plots.entity_links(data.entities)
    if data.dictionary is not None:
        drawings[DICTIONARY_PLOT] = lambda: plots.dictionary(data.dictionary)
    if data.embeddings is not None:
        drawings[EMBEDDINGS_PLOT] = lambda: plots.embeddings(data.embeddings)
    drawn = {name: _attempt(data, name.removesuffix(".png"), draw) for name, draw in drawings.items()}
    return {name: png for name, png in drawn.items() if png is not None}


def _sections_before(data: ReportData) -> list[str]:
    """Sections shown right after the header: stages to rerun, then the changes since the previous run."""
    warnings = "".join(f'<p class="warn">{esc(problem)}</p>' for problem in data.stale)
    sections = [f'<section id="stale">{warnings}</section>'] if warnings else []
    if data.previous:
        sections.append(changes.changes_section(data.previous, data.changes, data.problems.get("changes")))
    return sections


def write_report(output: str, declared: Mapping[str, Counter], *, recall_queries: int = QUERIES,
                 max_exact: int = MAX_EXACT, previous: str | None = None) -> str:
    """Write OUT/report/index.html and its PNG plots for whatever stages OUT/manifest.json records.

    Returns the path of the HTML file. Each counter is shown as ``declared`` (the stages' declarations, by
    name) says, an undeclared one plainly under its name. Stages that have not run are shown as "not run".
    ``recall_queries`` stored passage vectors query the index; exact search covers at most ``max_exact`` stored
    vectors. The run is compared with ``previous``, else with the previous run its manifest records, if any.
    """
    started = time.time()
    fs.require_directory_target(fs.join(output, REPORT_DIR))
    manifest_sha256 = manifest.manifest_sha256(output)  # none: collect raises NoManifestError
    data = collect(output, declared, recall_queries, max_exact, previous)
    report_dir = fs.join(output, REPORT_DIR)
    fs.delete_file(fs.join(report_dir, layout.REPORT_STAMP))  # written last: a report cut short has none
    drawn = _draw(data)
    for name in PLOTS:
        if name not in drawn:
            fs.delete_file(fs.join(report_dir, name))  # a stale plot of an earlier report
    fs.mkdirs(report_dir)
    for name in (*PLOTS, HTML_NAME, layout.REPORT_STAMP):  # a killed report's (another report may be writing now)
        fs.remove_temporaries(fs.join(report_dir, name), min_age_s=LEFT_BEHIND_S)
    for name, png in drawn.items():
        fs.write_bytes_atomic(fs.join(report_dir, name), png)
        data.plots[name.removesuffix(".png")] = name
    path = fs.join(report_dir, HTML_NAME)
    fs.write_bytes_atomic(path, page.render(data, time.time() - started, _sections_before(data)).encode("utf-8"))
    fs.write_bytes_atomic(fs.join(report_dir, layout.REPORT_STAMP), f"{manifest_sha256}\n".encode())
    return path
