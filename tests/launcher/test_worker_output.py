"""Beam's worker processes print start-up lines to the stderr they share with us: dropped unless --verbose. After
Ctrl-C nothing they or this process print shows, but the command's last line."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from artifacts import layout
from artifacts.run import manifest
from pipelines.launcher.interrupt import SigintWatch, watching_sigint
from pipelines.launcher.worker_output import (
    WORKER_START_UP_LINES,
    forward_lines,
    forwarded_stderr,
    leave_out_optional_gcp_warning,
)
from tests.conftest import BUNDLED_SAMPLE, MULTI_PROCESS, REPO, copy_stages, stage_options


def test_only_the_worker_start_up_lines_are_dropped():
    read_end, write_end = os.pipe()
    out_read, out_write = os.pipe()
    forwarder = threading.Thread(target=forward_lines, args=(read_end, out_write, WORKER_START_UP_LINES))
    forwarder.start()
    lines = [b"[parse] running\n",
             b"WARNING:root:apitools not found, and bigquery client libraries are not available despite ...\n",
             b"INFO:__main__:Logging handler created.\n",
             b"Traceback (most recent call last):\n",
             b"INFO:__main__:Logging handler created. and more\n",
             b"[parse] done in 1.0s"]
    os.write(write_end, b"".join(lines))
    os.close(write_end)
    forwarder.join(10)
    with os.fdopen(out_read, "rb") as forwarded:
        assert forwarded.read() == lines[0] + lines[3] + lines[5]


def forwarded(lines: list[bytes], hide_one_line_errors: bool) -> bytes:
    read_end, write_end = os.pipe()
    out_read, out_write = os.pipe()
    forwarder = threading.Thread(target=forward_lines, args=(read_end, out_write, (), None, hide_one_line_errors))
    forwarder.start()
    os.write(write_end, b"".join(lines))
    os.close(write_end)
    forwarder.join(10)
    with os.fdopen(out_read, "rb") as out:
        return out.read()


def test_an_input_errors_tracebacks_are_left_out_and_any_other_passes_whole():
    """Beam's SDK worker prints a failed bundle's traceback (and logs it again) whatever the log level: a worker
    process's InputError was 150-220 lines before the command's one line (--direct_running_mode=multi_processing)."""
    input_error = [b"ERROR:apache_beam.runners.worker.sdk_worker:Error processing instruction bundle_9. Original "
                   b"traceback is\n",
                   b"Traceback (most recent call last):\n", b'  File "multistream.py", line 188, in decompress\n',
                   b"OSError: Invalid data stream\n", b"\n",
                   b"The above exception was the direct cause of the following exception:\n", b"\n",
                   b"Traceback (most recent call last):\n", b"[parse] 12 pages in 0s\n",
                   b'    raise InputError(f"{where}: corrupt")\n',
                   b"artifacts.errors.InputError: KPR-INPUT-ERROR: dump at byte 5: corrupt [while running 'Read']\n",
                   b"\n"]
    other_error = [b"Traceback (most recent call last):\n", b'  File "x.py", line 1, in f\n',
                   b"ZeroDivisionError: division by zero\n", b"\n"]
    ours = [b"[parse] running\n", b"warning: a line of ours\n"]
    stream = [ours[0], *input_error, ours[1], *other_error, b"[parse] done in 1.0s"]
    assert forwarded(stream, hide_one_line_errors=True) == b"".join([*ours, *other_error, b"[parse] done in 1.0s"])
    assert forwarded(stream, hide_one_line_errors=False) == b"".join(stream)  # --verbose
    cut_short = [ours[0], *input_error[1:4]]  # the stream ends inside a traceback: it is written if no InputError's
    assert forwarded(cut_short, hide_one_line_errors=True) == b"".join(cut_short).rstrip(b"\n")


@pytest.mark.parametrize("error", [b"OSError: [Errno 28] No space left on device [while running 'WriteArticles']",
                                   b"OSError: [Errno 122] Disk quota exceeded",
                                   b"PermissionError: [Errno 13] Permission denied: '/out/.staging/parse/a.parquet'"])
def test_the_tracebacks_of_a_full_disk_or_a_write_refused_are_left_out(error):
    """The command says them in one line (a worker process's full disk was ~370 lines and 10 tracebacks before it,
    with two worker processes)."""
    traceback = [b"ERROR:apache_beam.runners.common:" + error + b"\n", b"Traceback (most recent call last):\n",
                 b'  File "parquetio.py", line 1, in write\n', error + b"\n", b"\n"]
    ours = [b"[parse] running\n", b"[parse] 12 pages in 0s\n"]
    assert forwarded([ours[0], *traceback, ours[1]], hide_one_line_errors=True) == b"".join(ours)
    # the command's own line quoting the error passes, also right after a traceback (it was left out: exit 2 and
    # nothing said)
    said = b"error: no space left on the device written to (" + error + b"): free some space\n"
    assert forwarded([*traceback[:-1], said], hide_one_line_errors=True) == said
    ours_quoting = b"[index] shard 3: " + error + b": it runs again\n"  # a line of ours is no worker's log record
    assert forwarded([ours_quoting], hide_one_line_errors=True) == ours_quoting


def test_an_input_error_in_a_worker_process_is_one_line(tmp_path):
    cut = tmp_path / "cut.xml.bz2"
    data = BUNDLED_SAMPLE.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    command = [sys.executable, "run_pipeline.py", "parse", "--dump", str(cut), "--output", str(tmp_path / "out"),
               "--progress-interval", "0", *MULTI_PROCESS]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if not line.startswith("[parse]")]
    assert len(lines) == 2 and lines[0].startswith("warning: ") and lines[1].startswith(f"error: {cut}: truncated")


def test_a_multi_process_run_prints_only_our_lines(tmp_path):
    command = [sys.executable, "run_pipeline.py", "parse", "--dump", str(BUNDLED_SAMPLE),
               "--output", str(tmp_path / "out"), *MULTI_PROCESS]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "[parse] running" and lines[1].startswith("[parse] done in ")
    assert "  articles: 106 rows" in lines
    assert all(line.startswith("  ") for line in lines[2:]), result.stderr


def test_a_stderr_nothing_reads_is_read_on_and_dropped():
    """The real stderr's reader gone (``| head``, a ``tee`` that ended): the forwarder reads on to EOF, so that
    the processes writing to it never get EPIPE, nor block on a full pipe."""
    source_read, source_write = os.pipe()
    out_read, out_write = os.pipe()
    os.close(out_read)
    forwarder = threading.Thread(target=forward_lines, args=(source_read, out_write, ()))
    forwarder.start()
    for count in range(4096):  # ~180 KB: more than a pipe holds
        os.write(source_write, f"[embed-entities] {count:,} mentions encoded\n".encode())
    os.close(source_write)
    forwarder.join(10)
    assert not forwarder.is_alive()


def test_a_multi_process_gpu_stage_whose_stderr_nothing_reads_runs_to_its_end(full_run, tiny_bert, tmp_path):
    """A model process that printed to a stderr without a reader failed its bundle, and Beam's worker, which
    prints a failed bundle's traceback to stderr before it answers, never answered: the stage hung."""
    output = tmp_path / "out"
    copy_stages(full_run, output, (layout.PARSE_STAGE, layout.DICTIONARY_STAGE, layout.MENTIONS_STAGE))
    # windows of 16 tokens, not full_run's 64: every mention, in half the time
    arguments = ["embed-entities", "--output", str(output), *stage_options(tiny_bert)["embed-entities"],
                 "--max-seq-length", "16", *MULTI_PROCESS]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "run_pipeline.py", *arguments], cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=write_end, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(write_end)
    assert result.returncode == 0
    counters = manifest.load(str(output))[layout.EMBED_ENTITIES_STAGE].counters
    assert counters["mentions_embedded"] == manifest.load(str(full_run))[layout.EMBED_ENTITIES_STAGE].counters[
        "mentions_embedded"] > 0


def read_until(descriptor: int, expected: bytes, timeout_s: float = 10.0) -> bytes:
    """What a forwarder wrote to ``descriptor`` (non-blocking) until it ends with ``expected``."""
    seen, deadline = b"", time.monotonic() + timeout_s
    while not seen.endswith(expected) and time.monotonic() < deadline:
        try:
            seen += os.read(descriptor, 1 << 16)
        except BlockingIOError:
            time.sleep(0.01)
    return seen


def started_forwarder() -> tuple[threading.Thread, int, int, int]:
    """A running forwarder from a pipe to another (non-blocking to read), watching a wakeup pipe for SIGINT; returns
    it and the descriptors to write its input, read its output and write the wakeup pipe."""
    source_read, source_write = os.pipe()
    out_read, out_write = os.pipe()
    os.set_blocking(out_read, False)
    wakeup_read, wakeup_write = os.pipe()
    forwarder = threading.Thread(target=forward_lines, args=(source_read, out_write, (), SigintWatch(wakeup_read)))
    forwarder.start()
    return forwarder, source_write, out_read, wakeup_write


def test_once_sigint_has_come_through_the_wakeup_pipe_nothing_more_is_forwarded():
    forwarder, source_write, out_read, wakeup_write = started_forwarder()
    os.write(wakeup_write, bytes([signal.SIGCHLD]))  # another signal with a Python handler: no effect
    os.write(source_write, b"[parse] running\n")
    assert read_until(out_read, b"[parse] running\n") == b"[parse] running\n"
    os.write(wakeup_write, bytes([signal.SIGINT]))
    os.write(source_write, b"Traceback (most recent call last):\nKeyboardInterrupt\n")
    os.close(source_write)
    forwarder.join(10)
    assert not forwarder.is_alive()
    assert read_until(out_read, b"\n", timeout_s=0.2) == b""
    for descriptor in (out_read, wakeup_write):
        os.close(descriptor)


def test_a_sigint_not_yet_delivered_already_quiets_the_forwarder():
    """The forwarder's thread blocks SIGINT: a SIGINT sent while the thread that will take it has not run yet shows
    as pending there (here a SIGINT sent to that very thread, which stays pending)."""
    forwarder, source_write, out_read, wakeup_write = started_forwarder()
    os.write(source_write, b"[index] running\n")
    assert read_until(out_read, b"[index] running\n") == b"[index] running\n"
    signal.pthread_kill(forwarder.ident, signal.SIGINT)  # blocked there: pending, never delivered
    os.write(source_write, b"Exception in thread run_worker:\n")
    os.close(source_write)
    forwarder.join(10)
    assert read_until(out_read, b"\n", timeout_s=0.2) == b""
    for descriptor in (out_read, wakeup_write):
        os.close(descriptor)


def test_after_ctrl_c_only_the_line_written_past_shows_and_stderr_is_restored(capfd):
    """Ctrl-C in this process (its main thread) while descriptor 2 is forwarded: what this process and a child of it
    write afterwards is dropped, the line written past the forwarder shows, and descriptor 2 is ours again after."""
    previous_handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        with watching_sigint() as sigint, forwarded_stderr((), sigint) as stderr:
            os.write(2, b"[parse] running\n")
            deadline = time.monotonic() + 10
            shown = ""
            while "[parse] running" not in shown and time.monotonic() < deadline:
                shown += capfd.readouterr().err
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
            os.write(2, b"Traceback (most recent call last):\n")
            subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('CRITICAL: sdk harness failed\\n')"],
                           check=True)
            stderr.write_past("interrupted during parse; rerun the same command to resume")
        os.write(2, b"after the block\n")
    finally:
        signal.signal(signal.SIGINT, previous_handler)
    assert shown == "[parse] running\n"
    assert capfd.readouterr().err == "interrupted during parse; rerun the same command to resume\nafter the block\n"


def test_beams_warning_that_it_asks_google_storage_without_credentials_is_left_out(caplog):
    """Logged by Beam's own auth logger, which the root logger's filter does not see (it printed without
    --verbose) when its gcp extra is not installed; the error line of a refusal says why instead
    (``anonymous_gcs``). With the extra, its warning that it found no credentials stays: nothing else says it."""
    leave_out_optional_gcp_warning()
    auth = logging.getLogger("apache_beam.internal.gcp.auth")
    no_credentials = ("Unable to find default credentials to use: File not found. Connecting anonymously. This is "
                      "expected if no credentials are needed to access GCP resources.")
    with caplog.at_level(logging.WARNING):
        auth.warning("Unable to find default credentials because the google-auth library is not available. "
                     "Connecting anonymously.")
        auth.warning(no_credentials)
    assert [record.getMessage() for record in caplog.records] == [no_credentials]
