"""Only our own lines on stderr unless --verbose: progress lines without a level or logger name, and none of the
warnings numpy raises inside Beam's batch-size estimator."""

from __future__ import annotations

import errno
import io
import logging
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from apache_beam.io.filesystem import BeamIOError
from apache_beam.transforms.util import _BatchSizeEstimator

from artifacts import fs
from artifacts.run import kpr_export
from pipelines import report as report_module
from pipelines.launcher.cli import main
from pipelines.launcher.console import (
    BATCH_SIZE_ESTIMATOR_MODULE,
    OUTPUT_CLOSED_EXIT,
    WORKER_NOISE,
    output_closed,
    plain_own_lines,
    warnings_option,
    without_beams_idle_warnings,
)
from pipelines.launcher.worker_output import forward_lines
from tests.builders import CAPITALS, write_parsed
from tests.conftest import BUNDLED_SAMPLE, DIRECT, REPO

NOISE = ("RuntimeWarning", "RankWarning", "Polyfit", "INFO:", "WARNING:", "kpr.progress", "apache_beam/")


def fit() -> None:
    """Beam's batch-size estimator on timings like a run's first ones: nine batches of the minimum size, then one
    larger (numpy warns from apache_beam/transforms/util.py)."""
    _BatchSizeEstimator.linear_regression_numpy([64] * 9 + [512], [0.10 + 0.01 * i for i in range(9)] + [0.5])


def estimator_warnings() -> list[str]:
    """The warnings ``fit`` raises under the filters in force (anything they leave alone is recorded every time)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", append=True)
        fit()
    return [f"{item.category.__name__}: {item.message}" for item in caught]


def worker_stderr() -> str:
    """What a new Python process (as Beam starts its local workers) prints while it runs ``fit``."""
    worker = subprocess.run([sys.executable, "-c", "from tests.launcher.test_console import fit; fit()"], cwd=REPO,
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert worker.returncode == 0, worker.stderr
    return worker.stderr


def test_the_estimator_warnings_and_only_they_are_ignored():
    found = estimator_warnings()
    assert any(item.startswith("RuntimeWarning: divide by zero encountered") for item in found), found
    assert any(item.startswith("RankWarning: Polyfit may be poorly conditioned") for item in found), found
    with without_beams_idle_warnings():
        assert estimator_warnings() == []
        with warnings.catch_warnings(record=True) as ours:  # the same warning from any other module still shows
            warnings.simplefilter("always", append=True)
            np.divide(np.ones(1), np.zeros(1))
        assert [str(item.message) for item in ours] == ["divide by zero encountered in divide"]
    assert estimator_warnings() == found  # the filters are undone


def test_worker_processes_print_none_of_them_and_the_environment_is_restored(monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "ignore::ImportWarning")
    assert warnings_option((("Polyfit may be", np.exceptions.RankWarning, BATCH_SIZE_ESTIMATOR_MODULE),
                            ("divide by", RuntimeWarning, BATCH_SIZE_ESTIMATOR_MODULE))) == (
        "ignore:divide by:RuntimeWarning:apache_beam.transforms.util")
    shown = worker_stderr()
    assert "RuntimeWarning: divide by zero encountered" in shown and "RankWarning: Polyfit" in shown, shown
    with without_beams_idle_warnings():
        assert os.environ["PYTHONWARNINGS"].startswith("ignore::ImportWarning,ignore:divide by zero encountered:")
        shown = worker_stderr()
    assert "RuntimeWarning" not in shown and "RankWarning: Polyfit" in shown, shown  # numpy re-enables RankWarning
    assert forwarded(shown, WORKER_NOISE) == ""  # so it is dropped from the workers' stderr with the start-up lines
    assert os.environ["PYTHONWARNINGS"] == "ignore::ImportWarning"


def test_a_path_with_a_bracket_matched_through_its_escaped_glob_warns_nothing(tmp_path):
    """Beam makes a regex of a glob: "a[[]1]" (the escaped "a[1]") is one Python warns may read otherwise one day,
    a FutureWarning the command printed above its first line."""
    (tmp_path / "a[1]").mkdir()
    (tmp_path / "a[1]" / "x.xml").write_text("x")

    def matched(name: str) -> tuple[list[str], list[str]]:  # a pattern of its own each time (re caches them)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", append=True)
            found = [item.path for item in fs.metadata_of(str(tmp_path / "a[[]1]" / name))]
        return found, [f"{item.category.__name__}: {item.message}" for item in caught]

    found, said = matched("x.xml")
    assert found == [str(tmp_path / "a[1]" / "x.xml")] and [line[:35] for line in said] == [
        "FutureWarning: Possible nested set "]
    with without_beams_idle_warnings():
        assert matched("*.xml") == ([str(tmp_path / "a[1]" / "x.xml")], [])


def forwarded(text: str, dropped: tuple[bytes, ...]) -> str:
    """``text`` as ``forward_lines`` passes it on (the workers' stderr during a run without --verbose)."""
    read_end, write_end = os.pipe()
    out_read, out_write = os.pipe()
    os.write(write_end, text.encode())
    os.close(write_end)
    forward_lines(read_end, out_write, dropped)
    with os.fdopen(out_read, "rb") as out:
        return out.read().decode()


def test_our_records_print_as_plain_lines_and_the_logger_is_restored(capsys, caplog):
    caplog.set_level(logging.INFO, logger="kpr.progress")  # as the command line sets it
    logger = logging.getLogger("kpr")
    handlers = list(logger.handlers)
    with plain_own_lines():
        logging.getLogger("kpr.progress").info("[embed-entities] 64 mentions in 1s (64.0/s)")
        logging.getLogger("kpr.report").warning("report: plots: no rows")
    assert capsys.readouterr().err == "[embed-entities] 64 mentions in 1s (64.0/s)\nwarning: report: plots: no rows\n"
    assert logger.handlers == handlers and logger.propagate


def small_out(output: Path) -> Path:
    """An OUT with parse, dictionary and mentions done on three hand-made articles (a few mentions to embed)."""
    write_parsed(output, CAPITALS)
    assert main(["dictionary", "--output", str(output), *DIRECT]) == 0
    assert main(["mentions", "--output", str(output), "--max-mentions", "2", *DIRECT]) == 0
    return output


def embed_command(output: Path, model: Path, *extra: str) -> list[str]:
    return ["embed-entities", "--output", str(output), "--model", str(model), "--max-seq-length", "64", *extra,
            *DIRECT]


def test_an_embed_run_prints_plain_progress_lines_and_nothing_else(tiny_bert, tmp_path):
    command = [sys.executable, "run_pipeline.py", *embed_command(small_out(tmp_path / "out"), tiny_bert,
                                                                 "--progress-interval", "0")]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "[embed-entities] running" and lines[-1].startswith("  mentions_reused: ")
    for unit in ("mentions prepared", "mentions encoded"):  # by the inputs' part, then by the model's
        progress = [line for line in lines if f" {unit} in " in line]
        assert progress and all(line.startswith("[embed-entities] ") for line in progress), result.stderr
    assert [line for line in lines if any(noise in line for noise in NOISE)] == []


def test_the_estimator_warnings_of_a_run_show_only_with_verbose(tiny_bert, tmp_path, monkeypatch):
    """Every batch size Beam's estimator picks during the run first goes through ``fit`` (which warns)."""
    next_batch_size = _BatchSizeEstimator.next_batch_size
    monkeypatch.setattr(_BatchSizeEstimator, "next_batch_size", lambda self: (fit(), next_batch_size(self))[1])
    output = small_out(tmp_path / "out")
    shown = {}
    for verbose in ([], ["--verbose"]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", append=True)
            assert main([*verbose, *embed_command(output, tiny_bert, "--force")]) == 0
        shown[bool(verbose)] = {str(item.message) for item in caught if item.filename.endswith("transforms/util.py")}
    assert shown == {False: set(), True: {"divide by zero encountered in divide", "Polyfit may be poorly conditioned"}}


def test_a_command_whose_stdout_nothing_reads_stops_there_without_a_traceback(full_run):
    """``search ... | head``: the reader gone, the command stops with the status of a process SIGPIPE ended; nothing
    on stderr (Python's own way: a traceback, or "Exception ignored" as it flushes stdout at exit)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "run_pipeline.py", "search", "--output", str(full_run), "--query",
                                 "lakes", "-k", "3"], cwd=REPO, stdout=write_end, stderr=subprocess.PIPE, text=True,
                                timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(write_end)
    assert (result.returncode, result.stderr) == (OUTPUT_CLOSED_EXIT, "")
    assert OUTPUT_CLOSED_EXIT == 141


class FullDisk(io.StringIO):
    """A standard output redirected to a file on a full disk: every write fails as it would."""

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_command_whose_stdout_is_a_full_disk_says_so_in_one_line(full_run, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", FullDisk())
    assert main(["search", "--output", str(full_run), "--query", "lakes", "-k", "3"]) == 2
    monkeypatch.undo()
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: no space left on the device written to ([Errno 28] No space left on device): the "
                           "output (or the file the standard output was redirected to) is incomplete")


def test_a_command_whose_stdout_is_a_full_device_says_so_past_the_forwarder(full_run):
    """``validate > /dev/full`` as a user runs it (the forwarder of stderr on): its line quotes the OSError's errno,
    which the forwarder took for a worker's traceback line and left out (exit 2 and nothing said)."""
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "run_pipeline.py", "validate", "--output", str(full_run)], cwd=REPO,
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=300,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2
    assert result.stderr.startswith("error: no space left on the device written to ([Errno 28] No space left on "
                                    "device): "), result.stderr


def test_an_export_that_fills_its_disk_says_so_in_one_line(full_run, tmp_path, monkeypatch, capsys):
    """The linker's copy fails as on a full filesystem (Beam's BeamIOError carrying the OSError): one line, exit 2,
    nothing left in DIR but its record; it was a traceback and exit 1."""
    def full(source: str, target: str) -> None:
        raise BeamIOError("Copy operation failed", {(source, target): OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))})

    monkeypatch.setattr(kpr_export, "copy_file", full)
    assert main(["export-kpr", "--output", str(full_run), "--to", str(tmp_path / "kpr")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: no space left on the device written to (Copy operation failed") and "run the " \
        "command again" in line
    assert not (tmp_path / "kpr" / kpr_export.VOCAB_FILE).exists()


def beam_delete_refused(path: str) -> Exception:
    """A delete refused as Beam's filesystems report it: the path's PermissionError."""
    return BeamIOError("Delete operation failed", {path: PermissionError(errno.EPERM, os.strerror(errno.EPERM), path)})


def beam_delete_refused_wrapped(path: str) -> Exception:
    """... as its local filesystem's delete and rename do: each path's error wrapped in an IOError of it (errno
    None): was a traceback and exit 1 at a stage's commit and at a re-export."""
    return BeamIOError("Delete operation failed", {
        path: OSError(PermissionError(errno.EPERM, os.strerror(errno.EPERM), path))})


def worker_refused(path: str) -> Exception:
    """... as Beam re-raises it from a worker process: its text alone."""
    return RuntimeError(f"PermissionError: [Errno {errno.EPERM}] {os.strerror(errno.EPERM)}: '{path}' [while running "
                        "'WriteReport']")


@pytest.mark.parametrize("refusal", [beam_delete_refused, beam_delete_refused_wrapped, worker_refused])
def test_a_file_this_user_may_not_change_is_named_in_one_line(full_run, monkeypatch, capsys, refusal):
    """A report into a directory marked immutable (chattr +i): the file named."""
    report = os.path.join(str(full_run), "report", "index.html")

    def denied(*_args, **_kwargs) -> None:
        raise refusal(report)

    monkeypatch.setattr(report_module, "write_report", denied)
    assert main(["report", "--output", str(full_run)]) == 2
    assert capsys.readouterr().err == (f"error: {report}: Operation not permitted: this user may not change (or read) "
                                       "it (its permissions, a read-only filesystem, a file marked immutable with "
                                       "chattr +i): fix that and run the command again\n")


def test_a_query_of_bytes_that_are_not_utf8_is_refused_in_one_line(full_run, capsys):
    """Python keeps an argument's undecodable byte as a lone surrogate: the tokenizer raised a TypeError on it."""
    assert main(["search", "--output", str(full_run), "--query", "caf\udce9", "-k", "1"]) == 2
    assert capsys.readouterr() == ("", "error: --query holds bytes that are not UTF-8 (a terminal or script of "
                                       "another encoding?): give the query as UTF-8 text\n")


def test_search_says_when_a_stage_the_index_read_ran_again(full_run, tmp_path, capsys):
    """parse run again (other options, other articles) after the index: search answers from the old passages."""
    output = tmp_path / "out"
    shutil.copytree(full_run, output)
    assert main(["search", "--output", str(output), "--query", "lakes", "-k", "1"]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["parse", "--dump", str(BUNDLED_SAMPLE), "--output", str(output), "--keep-section-links",
                 *DIRECT]) == 0
    capsys.readouterr()
    assert main(["search", "--output", str(output), "--query", "lakes", "-k", "1"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "warning: parse ran again after the index was built: the index answers from what it wrote before (rerun "
        f"`python run_pipeline.py index --output {output} ...` to index the new outputs)"]


def test_a_broken_pipe_while_stdout_is_read_is_raised_on():
    with pytest.raises(BrokenPipeError):
        output_closed(BrokenPipeError(32, "Broken pipe"))


@pytest.mark.parametrize("verbose", [False, True])
def test_beams_notice_of_a_jar_fetched_from_maven_central_shows_only_with_verbose(verbose):
    """FlinkRunner's jar, where it cannot be fetched: Beam's six-line notice for each mirror came before our line."""
    script = ("import logging; from pipelines.launcher.cli import configure_logging; "
              f"configure_logging({verbose}, []); logging.getLogger('apache_beam.utils.subprocess_server').warning("
              "'   WARNING: Apache Beam is downloading dependencies from a public repository at runtime.\\n"
              "   URL: x'); "
              "logging.getLogger('apache_beam').warning('another warning')")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert ("downloading dependencies" in result.stderr) == verbose and "another warning" in result.stderr
