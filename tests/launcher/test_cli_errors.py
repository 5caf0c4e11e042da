"""Mistakes a new user makes on the command line: one line each, exit 2, nothing under OUT touched."""

from __future__ import annotations

import errno
import http.server
import importlib
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.io.filesystem import BeamIOError

from artifacts import layout
from artifacts.run import lock, manifest
from pipelines.launcher.cli import build_parser, check_unknown_flags, main, worded
from pipelines.launcher.runners import available_runners, check_runner
from pipelines.launcher.stage import interrupted_in_a_step
from pipelines.parse import STAGED_ARTICLES
from tests.builders import all_command, signal_when, stage_command
from tests.conftest import BUNDLED_SAMPLE, DIRECT, MULTI_PROCESS, REPO, copy_stages

SAMPLE = str(BUNDLED_SAMPLE)


def files_under(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*")) if directory.exists() else []


MAX_SEQ_LENGTH_3 = ("error: --max-seq-length must be at least 5, got 3: [CLS], [MASK], [SEP] and a token of context "
                    "on each side of the mention (without context every entity gets the same vector)")
# (argv with {tmp} and {file} placeholders, the exact line on stderr)
BAD_INPUTS = [
    (["all", "--dump", SAMPLE, "--output", "{tmp}/out", "--model", "m", "--encoder", "m", "--max-mention", "1"],
     "error: unknown option --max-mention (did you mean --max-mentions?)"),
    (["index", "--output", "{tmp}/out", "--encoder", "m", "--shard=2"],
     "error: unknown option --shard (did you mean --shards?)"),
    (["search", "--output", "{tmp}/out", "--query", "q", "--nprob", "3"],
     "error: unknown option --nprob (did you mean --nprobe?)"),
    (["mentions", "--output", "{tmp}/out", "--direct_num_worker=2"],
     "error: unknown option --direct_num_worker (did you mean --direct_num_workers?)"),
    (["parse", "--dump", SAMPLE, "--output", "{tmp}/out", "--qqqqqqqq"], "error: unknown option --qqqqqqqq"),
    # another command's flag: said so (was "did you mean --profile_postprocess_interval_sec?", a Beam flag)
    (["report", "--output", "{tmp}/out", "--progress-interval", "0"], "error: report takes no --progress-interval (an "
     "option of parse, dictionary, mentions, embed-entities, index, all)"),
    (["validate", "--output", "{tmp}/out", "stray"], "error: unexpected argument stray for validate"),
    # argparse kept the last --corpus: the passages of the others were never indexed, without a word
    (["index", "--output", "{tmp}/out", "--encoder", "m", "--corpus", "{tmp}/a.tsv", "--corpus", "{tmp}/b.tsv"],
     "error: --corpus takes one value, given {tmp}/a.tsv and {tmp}/b.tsv: give one path or glob (a glob reads every "
     "file it matches)"),
    (["all", "--dump", SAMPLE, "--output", "{tmp}/out", "--model", "m", "--encoder", "m", "--corpus", "{tmp}/a.tsv",
      "--corpus", "{tmp}/b.tsv"], "error: --corpus takes one value, given {tmp}/a.tsv and {tmp}/b.tsv: give one "
     "path or glob (a glob reads every file it matches)"),
    # --model-pipeline-options: Beam's options for the model's pipeline alone (its GPU workers on a cluster)
    (["index", "--output", "{tmp}/out", "--encoder", "m", "--model-pipeline-options=--machine_typ=g2-standard-8"],
     "error: --model-pipeline-options: unknown option --machine_typ (did you mean --machine_type?)"),
    (["embed-entities", "--output", "{tmp}/out", "--model", "m", "--model-pipeline-options=--num_workers 4 gpu"],
     "error: --model-pipeline-options: unexpected argument gpu"),
    (["index", "--output", "{tmp}/out", "--encoder", "m", "--model-pipeline-options=--runner=DataflowRunner"],
     "error: --model-pipeline-options cannot set --runner: both pipelines of a stage run on the command's runner"),
    (["all", "--dump", SAMPLE, "--output", "{tmp}/out", "--model", "m", "--encoder", "m",
      "--model-pipeline-options=--direct_num_workers=2"], "error: --model-pipeline-options cannot set "
     "--direct_num_workers: --model-workers sets the processes that hold the model"),
    # values Beam reads only as it builds a job (the model's job: after the inputs' job had run), in a traceback
    (["embed-entities", "--output", "{tmp}/out", "--model", "m", "--model-pipeline-options=--resource_hints="
      "min_ram=lots"], "error: --resource_hints: Resource hint min_ram has invalid value lots."),
    (["parse", "--dump", SAMPLE, "--output", "{tmp}/out", "--resource_hints=bogus=1"],
     "error: --resource_hints: Unknown resource hint: bogus."),
    (["index", "--output", "{tmp}/out", "--encoder", "m", "--runner=PortableRunner",
      "--model-pipeline-options=--environment_type=NOPE"],
     "error: --environment_type=NOPE: Beam knows DOCKER, PROCESS, EXTERNAL, LOOPBACK and beam:env: URNs"),
    (["parse", "--dump", SAMPLE, "--output", "{tmp}/out", "--runner=PortableRunner", "--environment_type=EXTERNAL",
      "--environment_config=localhost:1", "--setup_file={tmp}/setup.py"],
     "error: --setup_file={tmp}/setup.py: no such file"),
    (["parse", "--dump", SAMPLE, "--output", "{tmp}/out", "--runner=PortableRunner", "--environment_type=EXTERNAL",
      "--environment_config=localhost:1", "--setup_file=setup.py"],  # Beam changed into "": a traceback
     "error: --setup_file=setup.py: name its folder too (./setup.py)"),
    (["embed-entities", "--output", "{tmp}/out", "--model", "m", "--model-pipeline-options=--setup_file={file}"],
     "error: --setup_file={file}: Beam builds the workers' package from a setup.py or a pyproject.toml"),
    (["parse", "--dump", SAMPLE, "--output", "{file}/out"], "error: --output {file}/out is not a directory ({file} "
                                                            "is a file)"),
    (["dictionary", "--output", "{file}"], "error: --output {file} is not a directory"),
    (["all", "--dump", SAMPLE, "--output", "{file}", "--model", "m", "--encoder", "m"],
     "error: --output {file} is not a directory"),
    (["export-kpr", "--output", "{tmp}/out", "--to", "{file}/kpr"], "error: --to {file}/kpr is not a directory "
                                                                   "({file} is a file)"),
    (["publish", "--output", "{tmp}/out", "--to", "{file}"], "error: --to {file} is not a directory"),
    # a mistyped run: "manifest.json: missing or empty, no stage has completed", "has no manifest.json"
    (["validate", "--output", "{tmp}/out"], "error: --output {tmp}/out: no such directory"),
    (["search", "--output", "{file}", "--query", "Greek philosopher"],
     "error: --output {file} is a file, not a run's directory"),
    (["diff", "--old", "{file}", "--new", "{tmp}/out"], "error: --old {file} is a file, not a run's directory"),
    (["parse", "--output", "{tmp}/out"], "error: parse needs --dump FILE [FILE ...]"),
    # each page would be its copy's duplicate: both dropped, and articles/ committed empty
    (["parse", "--dump", SAMPLE, SAMPLE, "--output", "{tmp}/out"], f"error: --dump names {SAMPLE} more than once"),
    # an input file that is not there: said before OUT is made (it was made, empty, and "[parse] running" printed)
    (["parse", "--dump", "{tmp}/enwiki.xml.bz2", "--output", "{tmp}/out"],
     "error: --dump {tmp}/enwiki.xml.bz2: no such file"),
    (["index", "--corpus", "{tmp}/psgs.tsv", "--encoder", "bert-base-uncased", "--output", "{tmp}/out"],
     "error: --corpus {tmp}/psgs.tsv: no such file"),
    (["index", "--corpus", "{tmp}/psgs_*.tsv", "--encoder", "bert-base-uncased", "--output", "{tmp}/out2"],
     "error: no file matches {tmp}/psgs_*.tsv"),
    (["parse", "--dump", "{tmp}", "--output", "{tmp}/out3"],
     "error: {tmp} is a directory: name its files (a path, or a glob such as {tmp}/*)"),
    (["all", "--dump", SAMPLE, "--redirects-sql", "{tmp}/r.sql.gz", "--model", "m", "--encoder", "e", "--output",
      "{tmp}/out"], "error: --redirects-sql {tmp}/r.sql.gz: no such file"),
    # a question file was searched and scored twice, its row twice in the table
    (["evaluate", "--output", "{tmp}", "--questions", "{file}", "{file}"],
     "error: --questions names {file} more than once"),
    *((argv, "error: no filesystem here reads foo://bucket/run: a URL needs Beam's filesystem for its scheme (gs:// "
             "with pip install -e \".[gcp]\", s3:// with \".[aws]\"); a local path has no scheme")
      for argv in (["validate", "--output", "foo://bucket/run"], ["dictionary", "--output", "foo://bucket/run"],
                   ["search", "--output", "foo://bucket/run", "--query", "Greek philosopher"])),
    # values out of range: refused by the stage's config before OUT is touched (issue 21)
    (["dictionary", "--output", "{tmp}/out", "--min-commonness", "5"],
     "error: --min-commonness is a probability, from 0 to 1: got 5.0"),
    (["dictionary", "--output", "{tmp}/out", "--min-link-prob", "-0.1"],
     "error: --min-link-prob is a probability, from 0 to 1: got -0.1"),
    (["dictionary", "--output", "{tmp}/out", "--max-mention-length", "0"],
     "error: --max-mention-length must be at least 1, got 0"),
    (["mentions", "--output", "{tmp}/out", "--max-seq-length", "3"], MAX_SEQ_LENGTH_3),
    (["embed-entities", "--output", "{tmp}/out", "--model", "m", "--max-seq-length", "4"],
     MAX_SEQ_LENGTH_3.replace("got 3", "got 4")),
    (["embed-entities", "--output", "{tmp}/out", "--model", "m", "--device", "tpu"],
     "error: --device tpu is not a device: use cpu, cuda or cuda:N"),
    (["index", "--output", "{tmp}/out", "--encoder", "m", "--device", "cuda0"],
     "error: --device cuda0 is not a device: use cpu, cuda or cuda:N"),
    (["index", "--output", "{tmp}/out", "--encoder", "m", "--shard-memory-gb", "0.5"],
     "error: --shard-memory-gb must be more than 1 and at most 1e+06 (a worker's own memory before any vector, in "
     "GB), got 0.5"),
    (["index", "--output", "{tmp}/out", "--encoder", "m", "--shard-memory-gb", "inf"],  # was a traceback
     "error: --shard-memory-gb must be more than 1 and at most 1e+06 (a worker's own memory before any vector, in "
     "GB), got inf"),
    *((["parse", "--dump", SAMPLE, "--output", "{tmp}/out", "--progress-interval", value],  # inf: a traceback
       f"error: --progress-interval is seconds between lines, from 0 to 86400: got {value}")
      for value in ("-1.0", "nan", "inf")),
    # `all` builds every stage's config before its first stage (parse would run first otherwise)
    (["all", "--dump", SAMPLE, "--output", "{tmp}/out", "--model", "m", "--encoder", "m", "--max-mentions", "-3"],
     "error: --max-mentions must be at least 1, got -3"),
    (["all", "--dump", SAMPLE, "--output", "{tmp}/out", "--model", "m", "--encoder", "m", "--min-commonness", "5"],
     "error: --min-commonness is a probability, from 0 to 1: got 5.0"),
    (["all", "--dump", SAMPLE, "--output", "{tmp}/out", "--model", "m", "--encoder", "m", "--device", "tpu"],
     "error: --device tpu is not a device: use cpu, cuda or cuda:N"),
    *((["all", "--dump", SAMPLE, "--output", "{tmp}/out", "--model", "m", "--encoder", "m", "--shards", value],
       "error: --shards is a count of FAISS shards (each a union of hash buckets, of which a worker writes at most "
       f"512 at once), from 1 to 512: got {value}") for value in ("0", "513")),
    # was refused once the stage had started ("[index] running" first, OUT and its lock made)
    (["index", "--output", "{tmp}/out", "--encoder", "m", "--max-length", "1"],
     "error: --max-length must be at least 8, got 1"),
    (["index", "--output", "{tmp}/out", "--encoder", "m", "--encoder-type", "kpr", "--max-entities", "-1"],
     "error: --max-entities must be at least 0, got -1"),  # a slice's end: it would drop each text's last entity
    # Beam takes it, and its fn_api_runner fails with an IndexError
    (["parse", "--dump", SAMPLE, "--output", "{tmp}/out", "--direct_num_workers=-1",
      "--direct_running_mode=multi_processing"],
     "error: --direct_num_workers=-1: give the worker count, or 0 for one per core"),
]


@pytest.mark.parametrize(("argv", "expected"), BAD_INPUTS,
                         ids=[" ".join(argv[:1] + argv[-2:]) for argv, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(argv, expected, tmp_path, capsys):
    regular_file = tmp_path / "file"
    regular_file.write_text("not a directory")

    def fill(text: str) -> str:
        return text.replace("{tmp}", str(tmp_path)).replace("{file}", str(regular_file))

    assert main([fill(arg) for arg in argv] + DIRECT) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [fill(expected)]
    assert captured.out == ""
    assert files_under(tmp_path) == ["file"], "nothing is created before the command refuses"


class RefusingStorage(http.server.BaseHTTPRequestHandler):
    """A storage service that refuses every request as GCS refuses a caller without access to the bucket."""

    def refuse(self) -> None:
        body = json.dumps({"error": {"code": 403, "message": "caller does not have storage.objects.get access"}})
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    do_GET = do_POST = do_PUT = do_DELETE = refuse

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("argv", [["dictionary", "--output", "gs://bucket/run"], ["validate", "--output", "gs://bucket/run"],
                                  ["search", "--output", "gs://bucket/run", "--query", "Greek philosopher"],
                                  ["parse", "--dump", "gs://bucket/run", "--output", "{tmp}/out"]],  # a BeamIOError
                         ids=lambda argv: argv[0])
def test_a_bucket_the_storage_service_refuses_is_one_line(argv, tmp_path, monkeypatch, capsys):
    """Beam's gs:// filesystem against a service that answers 403 (google's client as it is, pointed at a local
    server by its emulator setting): one line naming the refusal, exit 2, not the client library's traceback."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials

    server = http.server.HTTPServer(("127.0.0.1", 0), RefusingStorage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(google.auth, "default", lambda *args, **kwargs: (AnonymousCredentials(), "project"))
    try:
        assert main([arg.replace("{tmp}", str(tmp_path)) for arg in argv] + DIRECT) == 2
    finally:
        server.shutdown()
    lines = capsys.readouterr().err.splitlines()
    assert "Traceback (most recent call last):" not in lines
    # Beam asks without credentials where its gcp extra is not installed (this project's dev install): said so
    anonymous = "" if importlib.util.find_spec("google_auth_httplib2") else re.escape(
        "; Beam asked it without credentials: its gcp extra is not installed here (pip install -e \".[gcp]\")")
    assert re.fullmatch(r"error: the storage service refused or did not answer \(403 GET http://127\.0\.0\.1:\d+/"
                        r"storage/v1/b/bucket/o/run\S*: caller does not have storage\.objects\.get access\): check the "
                        r"URL, the credentials this machine uses for it and its network" + anonymous, lines[-1]), lines


@pytest.mark.parametrize("module", ["hdfs.util", "azure.core.exceptions"])
def test_an_hdfs_or_azure_client_error_is_the_storage_service_s(module, capsys):
    """Beam's hdfs:// and azfs:// filesystems raise their clients' errors (HdfsError, HttpResponseError), inside a
    BeamIOError's path-by-path details too: one line, as google's and boto's."""
    client_error = type("ClientError", (Exception,), {"__module__": module})("Connection refused: namenode:50070")
    for raised in (client_error, BeamIOError("Delete operation failed", {"hdfs://nn/run/x": client_error})):
        assert worded(raised).message == (
            "the storage service refused or did not answer (Connection refused: namenode:50070): check the URL, the "
            "credentials this machine uses for it and its network")


def test_an_s3_output_without_boto3_is_one_line(tmp_path, capsys):
    """Beam's s3:// filesystem is installed with Beam, its client (boto3) only with the aws extra: it failed the
    lock's first look at OUT with an AssertionError inside a BeamIOError, as a traceback."""
    try:
        import boto3  # noqa: F401
        pytest.skip("boto3 is installed here")
    except ImportError:
        pass
    assert main(["dictionary", "--output", "s3://bucket/run", *DIRECT]) == 2
    assert capsys.readouterr().err.splitlines() == [  # its first look: parse's record of --first-bold-as-link
        "error: s3://bucket/run/manifest.json: Beam's filesystem for it lacks its client library (Missing boto3 "
        "requirement): pip install -e \".[aws]\" for s3://, \".[gcp]\" for gs://, pip install hdfs for hdfs://, "
        "azure-storage-blob and azure-identity for azfs://"]
    # A dump's fingerprint and a glob's listing ask Beam's match, which wraps the exists() error once more: a
    # traceback; and a glob was listed before the filesystems had the run's options (in a process of its own: a
    # traceback of "Must provide one of client or options").
    for dump in ("s3://bucket/enwiki-1.xml.bz2", "s3://bucket/enwiki-*.xml.bz2"):
        result = subprocess.run([sys.executable, str(REPO / "run_pipeline.py"), "parse", "--dump", dump, "--output",
                                 str(tmp_path / "out"), *DIRECT], capture_output=True, text=True, cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.splitlines()[-1] == (
            f"error: {dump}: Beam's filesystem for it lacks its client library (Missing boto3 requirement): pip "
            "install -e \".[aws]\" for s3://, \".[gcp]\" for gs://, pip install hdfs for hdfs://, azure-storage-blob "
            "and azure-identity for azfs://")


@pytest.mark.parametrize(("url", "library"), [("hdfs://namenode/run", "hdfs"), ("azfs://account/container/run",
                                                                               "azure.storage.blob")])
@pytest.mark.parametrize("command", ["search", "report", "validate"])
def test_an_hdfs_or_azure_run_without_its_client_library_is_one_line(command, url, library, capsys):
    """Beam's hdfs:// and azfs:// filesystems without their clients raised an ImportError or a NameError inside a
    BeamIOError: a traceback for every reader of such a run."""
    try:
        importlib.import_module(library)
        pytest.skip(f"{library} is installed here")
    except ImportError:
        pass
    argv = {"search": ["search", "--output", url, "--query", "x"]}.get(command, [command, "--output", url])
    assert main(argv) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert re.match(rf"error: {re.escape(url)}(/[^ ]+)?: Beam's filesystem for it lacks its client library \(", line)
    assert line.endswith(
        "pip install hdfs for hdfs://, azure-storage-blob and azure-identity for azfs://")


def test_several_direct_workers_without_a_running_mode_are_said_in_our_words(tmp_path, capsys):
    """Beam runs one worker in this process then, and says so in a WARNING of its own: one line of ours instead."""
    assert main(["parse", "--dump", SAMPLE, "--output", str(tmp_path / "out"), "--direct_num_workers=2",
                 "--progress-interval", "0", *DIRECT]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines.count("warning: --direct_num_workers=2 runs one worker, in this process, unless "
                       "--direct_running_mode=multi_processing (or multi_threading) is given too") == 1
    assert not [line for line in lines if "direct_running_mode should be" in line]


def test_a_runner_that_does_not_load_is_one_line_naming_the_runners_installed(tmp_path, capsys):
    installed = available_runners()
    assert "DirectRunner" in installed and "FnApiRunner" in installed
    known = ", ".join(installed)
    cases = {"--runner=NoSuchRunner": "NoSuchRunner is not a Beam runner",
             "--runner=nosuch.module.Runner": "nosuch.module.Runner cannot be loaded: ModuleNotFoundError: No module "
                                              "named 'nosuch'"}
    for flag, problem in cases.items():
        assert main(["parse", "--dump", SAMPLE, "--output", str(tmp_path / "out"), flag]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"error: --runner {problem}; this installation has {known} (or name a module.Class of your own)"]
    assert files_under(tmp_path) == []
    for name in ("direct", "DirectRunner", "apache_beam.runners.direct.direct_runner.DirectRunner"):
        check_runner([f"--runner={name}"])  # Beam's own spellings of a runner it has


def test_a_read_only_output_is_refused_before_anything_is_created(tmp_path, capsys, monkeypatch):
    # The test machine runs as root on writable mounts, so the read-only filesystem is simulated.
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_flag=os.ST_RDONLY))
    assert main(["dictionary", "--output", str(tmp_path / "a" / "out"), *DIRECT]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: --output {tmp_path}/a/out is not writable ({tmp_path}: a read-only filesystem)"]
    assert files_under(tmp_path) == []


def test_a_run_named_with_a_wildcard_is_refused_before_anything_is_created(tmp_path, capsys):
    """Beam's filesystems match and delete such a path as a pattern: ``run?`` failed every stage with a traceback,
    and matched the files of a run beside it (``runA``)."""
    (tmp_path / "runA").mkdir()
    (tmp_path / "runA" / "kept.txt").write_text("another run's file")
    for flag, name in (("--output", "run?"), ("--output", "run*"), ("--output", "br[a]x")):
        assert main(["parse", "--dump", str(BUNDLED_SAMPLE), flag, str(tmp_path / name), *DIRECT]) == 2
        assert capsys.readouterr().err == (f"error: {flag} {tmp_path / name}: a path with * ? or [ is read as a "
                                           "pattern by Beam's filesystems (it could match other directories): name "
                                           "it without them\n")
    assert main(["diff", "--old", str(tmp_path / "runA"), "--new", str(tmp_path / "run?")]) == 2
    assert "--new" in capsys.readouterr().err
    assert files_under(tmp_path) == ["runA", "runA/kept.txt"]


def test_an_input_read_more_than_once_must_be_a_regular_file(tmp_path, capsys):
    """A FIFO (or a pipe: ``--dump /dev/stdin``) is read once: parse waited forever for a second writer, or found no
    article in a pipe it had read already."""
    fifo = tmp_path / "dump.xml.bz2"
    os.mkfifo(fifo)
    for argv in (["parse", "--dump", str(fifo)], ["index", "--encoder", "m", "--corpus", str(fifo)]):
        flag = argv[-2]
        assert main([*argv, "--output", str(tmp_path / "out"), *DIRECT]) == 2
        assert capsys.readouterr().err == (f"error: {flag} {fifo} is not a regular file (a pipe, a FIFO or a device): "
                                           "it is read more than once; save it to a file and name that\n")
    assert not (tmp_path / "out").exists()


ARGPARSE_ERRORS = [
    # an unset variable ("--to $DEST") named the working directory
    (["export-kpr", "--output", "out", "--to", ""], "error: argument --to: an empty path (an unset shell variable?): "
     "name the path (see run_pipeline.py export-kpr --help)"),
    (["validate", "--output", " "], "error: argument --output: an empty path (an unset shell variable?): name the "
     "path (see run_pipeline.py validate --help)"),
    (["mentions", "--output", ""], "error: argument --output: an empty path (an unset shell variable?): name the "
     "path (see run_pipeline.py mentions --help)"),
    (["dictionary"], "error: the following arguments are required: --output (see run_pipeline.py dictionary --help)"),
    # a value that starts with "-" is read as a flag unless it follows "=" (or has a space)
    (["index", "--output", "out", "--encoder", "m", "--model-pipeline-options", "--num_workers=4"],
     "error: argument --model-pipeline-options: expected one argument (a value that starts with '-' goes after "
     "'=': --model-pipeline-options='...') (see run_pipeline.py index --help)"),
    (["index", "--output", "out", "--encoder", "m", "--model-pipeline-options='--num_workers=4"],
     "error: argument --model-pipeline-options: \"'--num_workers=4\": No closing quotation "
     "(see run_pipeline.py index --help)"),
]


@pytest.mark.parametrize(("argv", "expected"), ARGPARSE_ERRORS, ids=[argv[-1] for argv, _ in ARGPARSE_ERRORS])
def test_argparse_errors_are_one_line_with_exit_2(argv, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [expected]


# Run as the command line runs them, one after the other in one process; after each, the heavy libraries imported.
IMPORTS_AFTER = """
import runpy, sys
for argv in ARGVS:
    sys.argv = ["run_pipeline.py", *argv]
    try:
        runpy.run_path("run_pipeline.py", run_name="__main__")
    except SystemExit as exit:
        code = exit.code
    heavy = sorted(name for name in ("apache_beam", "torch", "transformers", "pyarrow", "faiss") if name in sys.modules)
    print("imported after", code, heavy, flush=True)
"""


def test_help_and_argument_errors_come_before_anything_heavy_is_imported(tmp_path):
    """--help, COMMAND --help and the errors about arguments (values, missing flags) import no Beam, torch,
    transformers, pyarrow or FAISS: they answer in a fraction of a second."""
    out = str(tmp_path / "out")
    argvs = [["--help"], *[[command, "--help"] for command in ("all", "index", "search", "report", "diff")],
             ["dictionary", "--output", out, "--min-commonness", "5"], ["mentions", "--output", out,
                                                                        "--max-seq-length", "3"],
             ["parse", "--output", out], ["all", "--dump", SAMPLE, "--output", out, "--model", "m"],
             ["index", "--output", out, "--encoder", "m", "--device", "tpu"],
             ["search", "--output", out, "--query", "q", "-k", "0"], ["report", "--output", out, "--max-exact", "0"],
             ["dictionary", "--output", out, "--min-link-count", "many"], ["validate"], ["nosuch"],
             ["evaluate", "--output", out, "--questions", "q.tsv", "-k", "1", "0"],
             ["parse", "--output", out, "--dump", "a.xml", "b.xml", "--dump-index", "a.txt"]]
    result = subprocess.run([sys.executable, "-c", f"ARGVS = {argvs!r}\n{IMPORTS_AFTER}"], cwd=REPO,
                            capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    imported = [line for line in result.stdout.splitlines() if line.startswith("imported after ")]
    assert imported == ["imported after 0 []"] * 6 + ["imported after 2 []"] * 12, result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error: ")] == [
        "error: --min-commonness is a probability, from 0 to 1: got 5.0", MAX_SEQ_LENGTH_3,
        "error: parse needs --dump FILE [FILE ...]",
        "error: index needs --encoder NAME_OR_PATH (a dense retriever or a KPR checkpoint)",
        "error: --device tpu is not a device: use cpu, cuda or cuda:N", "error: -k must be at least 1, got 0",
        "error: --max-exact must be at least 1, got 0",
        "error: argument --min-link-count: invalid int value: 'many' (see run_pipeline.py dictionary --help)",
        "error: the following arguments are required: --output (see run_pipeline.py validate --help)",
        "error: argument COMMAND: invalid choice: 'nosuch' (choose from 'parse', 'dictionary', 'mentions', "
        "'embed-entities', 'index', 'search', 'evaluate', 'all', 'validate', 'export-kpr', 'publish', 'report', "
        "'diff') (see run_pipeline.py --help)",
        "error: -k must be at least 1, got 0", "error: --dump-index names 1 files for 2 dumps"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags", [
    ["--runner=DirectRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
    ["--runner", "DirectRunner", "--temp_location", "/tmp/x", "--project", "p", "--region=europe-west4"],
    ["--s3_access_key_id=k", "--s3_secret_access_key", "s", "--experiments=a", "--experiments", "b"],
])
def test_beam_pipeline_options_pass(flags):
    check_unknown_flags(build_parser(), "all", flags)  # raises on any flag Beam does not know


def test_help_shows_defaults_required_flags_and_an_example():
    parser = build_parser()
    subparsers = next(action for action in parser._actions if action.dest == "command")
    help_all = " ".join(subparsers.choices["all"].format_help().split())
    for flag in ("--dump DUMP [DUMP ...]", "--model MODEL", "--encoder ENCODER"):
        start = help_all.index(flag + " ")
        assert "(required)" in help_all[start:help_all.index("--", start + len(flag))], flag
    assert "model tokens per mention input ([CLS], context with [MASK], [SEP]) (default: 512)" in help_all
    assert "example: python run_pipeline.py all --dump samples/" in help_all
    assert "(default: None)" not in help_all and "(default: False)" not in help_all
    assert "(default: True)" not in help_all  # --no-mention-vectors is off unless given
    for name, sub in subparsers.choices.items():
        assert "example: python run_pipeline.py " + name in " ".join(sub.format_help().split()), name
    top = " ".join(parser.format_help().split())
    assert ("report write OUT/report/index.html: per stage wall time, rows read and written, drops and errors, "
            "entity, dictionary and embedding distributions, and the index's recall against exact search.") in top


def test_help_gives_a_default_of_0_and_the_encoder_types_own_defaults():
    """A default of 0 is a default (``--seed``); the options whose default comes from --encoder-type say each type's,
    as the encoders resolve them."""
    from encoders.retrievers import _DEFAULTS

    subparsers = next(action for action in build_parser()._actions if action.dest == "command")
    mentions = " ".join(subparsers.choices["mentions"].format_help().split())
    assert "--seed SEED seed of the sampling hash (default: 0)" in mentions
    index = " ".join(subparsers.choices["index"].format_help().split())
    assert "text put before every passage (default: empty)" in index
    for field, flag in (("similarity", "--similarity"), ("title", "--title-mode")):
        said = index[index.rindex(f"{flag} {{"):].split("(default: ", 1)[1].split(")", 1)[0]  # its help
        for kind, defaults in _DEFAULTS.items():
            value = getattr(defaults, field) or "the checkpoint's"  # kpr: its checkpoint's similarity
            clause = next(part for part in said.split(", ") if part.startswith(value))
            assert kind in clause, (flag, kind, said)
    assert "(default: bge's instruction for bge, none for the others)" in index


def test_verbose_is_taken_after_the_command_as_well_as_before_it():
    parser = build_parser()
    for argv, verbose in ((["validate", "--output", "x"], False), (["-v", "validate", "--output", "x"], True),
                          (["validate", "--output", "x", "--verbose"], True),
                          (["validate", "-v", "--output", "x"], True),
                          (["--verbose", "validate", "--output", "x", "-v"], True)):
        args, unknown = parser.parse_known_args(argv)
        assert (args.verbose, unknown) == (verbose, []), argv


# --- the lock on OUT -------------------------------------------------------------------------------------------


def write_lock(output: Path, pid: object, started: str = "2026-01-02T03:04:05Z") -> None:
    output.mkdir(parents=True, exist_ok=True)
    (output / lock.LOCK_NAME).write_text(json.dumps(
        {"host": socket.gethostname(), "pid": pid, "command": "python run_pipeline.py all ...", "started": started}))


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_second_run_on_a_locked_output_is_refused_and_nothing_touched(tmp_path, capsys):
    output = tmp_path / "out"
    started = lock.current("").started  # a live process that is not this one, holding the lock since it started
    write_lock(output, os.getppid(), started)
    before = {path: path.read_bytes() for path in output.rglob("*")}
    assert main(["parse", "--dump", SAMPLE, "--output", str(output), *DIRECT]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {output} is in use by pid {os.getppid()} on {socket.gethostname()} since {started} "
        f"(command python run_pipeline.py all ...); remove {output / lock.LOCK_NAME} if that command no longer "
        f"writes {output}"]
    assert {path: path.read_bytes() for path in output.rglob("*")} == before


def test_a_lock_whose_pid_a_later_process_has_now_is_taken_over(tmp_path, capsys):
    """After a reboot or a container's restart the lock's pid may name another process (pid 1 often): it was
    refused for ever."""
    output = tmp_path / "out"
    with subprocess.Popen(["sleep", "60"]) as later:
        try:
            write_lock(output, later.pid, "2026-01-02T03:04:05Z")  # long before `later` started
            with lock.hold(str(output), "python run_pipeline.py parse"):
                assert lock.read(str(output)).pid == os.getpid()
        finally:
            later.kill()
    assert capsys.readouterr().err.splitlines() == [
        f"taking over the stale lock of pid {later.pid} (the pid is another process's now, started after the lock "
        f"was taken) on {output}"]


def test_a_lock_of_this_processs_pid_taken_before_it_started_is_taken_over(tmp_path, capsys):
    """A container restarted gives its entrypoint the pid of the run killed before: that lock was taken for this
    process's own (nested use), never released, and judged stale by every other run, which went ahead beside it."""
    output = tmp_path / "out"
    write_lock(output, os.getpid(), "2026-01-02T03:04:05Z")  # long before this process started
    with lock.hold(str(output), "python run_pipeline.py parse"):
        holder = lock.read(str(output))
        assert (holder.pid, holder.command, holder.mine()) == (os.getpid(), "python run_pipeline.py parse", True)
        assert lock.live_writer(str(output)) is None  # this process: no other writer
    assert not (output / lock.LOCK_NAME).exists()
    assert capsys.readouterr().err.splitlines() == [
        f"taking over the stale lock of pid {os.getpid()} (the pid is another process's now, started after the lock "
        f"was taken) on {output}"]


def test_a_directory_where_the_lock_goes_is_one_line(tmp_path, capsys):
    (tmp_path / "out" / lock.LOCK_NAME).mkdir(parents=True)
    assert main(["parse", "--dump", SAMPLE, "--output", str(tmp_path / "out"), *DIRECT]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {tmp_path / 'out' / lock.LOCK_NAME} is a directory, not a file: it is left as it is"]
    assert (tmp_path / "out" / lock.LOCK_NAME).is_dir()


@pytest.mark.parametrize("pid", ["abc", 12.5, 10**20, -1, 0, True])
def test_a_lock_whose_pid_is_not_one_is_refused_as_unreadable(tmp_path, capsys, pid):
    output = tmp_path / "out"
    write_lock(output, pid)
    assert main(["parse", "--dump", SAMPLE, "--output", str(output), *DIRECT]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {output} is in use: {output / lock.LOCK_NAME} exists but cannot be read; remove it if no "
        f"command writes {output}"]


class FullDiskFile(io.FileIO):
    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_lock_that_cannot_be_written_is_one_line_naming_it_and_leaves_no_file(tmp_path, capsys, monkeypatch):
    """A full disk as the lock is taken: was an empty lock left behind, which refused the rerun for 10 s, and an
    error that named no file and blamed the standard output."""
    output = tmp_path / "out"
    fdopen = os.fdopen

    def lock_on_a_full_disk(descriptor: int, *args, **kwargs):
        if os.readlink(f"/proc/self/fd/{descriptor}").endswith(lock.LOCK_NAME):
            return FullDiskFile(descriptor, "wb")
        return fdopen(descriptor, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "fdopen", lock_on_a_full_disk)
        assert main(["parse", "--dump", SAMPLE, "--output", str(output), *DIRECT]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {output / lock.LOCK_NAME}: the run's lock could not be written (No space left on device): free some "
        "space (or fix what refused the write) and run the command again"]
    assert not (output / lock.LOCK_NAME).exists()
    assert main(["parse", "--dump", SAMPLE, "--output", str(output), "--progress-interval", "0", *DIRECT]) == 0


def test_an_artifact_this_user_may_not_change_is_refused_before_the_stage_runs(tmp_path, capsys, monkeypatch):
    """A forced parse over a run whose articles/ holds a directory this user may not change (another user's, a
    read-only mount): was the whole stage run, then a traceback at its commit, exit 1, and the run's parse record
    gone (every later stage invalid)."""
    output = tmp_path / "out"
    command = ["parse", "--dump", SAMPLE, "--output", str(output), "--progress-interval", "0", *DIRECT]
    assert main(command) == 0
    capsys.readouterr()
    locked = output / layout.ARTICLES / "locked"
    locked.mkdir()
    access = os.access
    with monkeypatch.context() as patch:
        patch.setattr(os, "access", lambda path, mode: access(path, mode) and os.fspath(path) != str(locked))
        assert main([*command, "--force"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: {locked}: this user may not change what it holds (its permissions, or a read-only filesystem), and "
        f"parse replaces {layout.ARTICLES}/ as it commits: fix that and run the command again"]
    assert "parse" in manifest.load(str(output))
    assert main(["validate", "--output", str(output)]) == 0
    # a directory this user cannot list is no more changeable (os.walk passed over it: the stage ran, and its commit
    # deleted the articles before it failed), and another stage's leftovers under .staging are not parse's (they
    # refused it)
    scandir, others = os.scandir, output / ".staging" / "embed-entities.kept" / "pending"
    others.mkdir(parents=True)

    def unlistable(path):
        if isinstance(path, (str, os.PathLike)) and os.fspath(path) == str(locked):  # not a descriptor
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return scandir(path)

    with monkeypatch.context() as patch:
        patch.setattr(os, "scandir", unlistable)
        patch.setattr(os, "access", lambda path, mode: access(path, mode) and os.fspath(path) != str(others))
        assert main([*command, "--force"]) == 2
        assert capsys.readouterr().err.splitlines()[-1].startswith(f"error: {locked}: this user may not change")
        shutil.rmtree(locked)
        assert main([*command, "--force"]) == 0


def test_an_empty_lock_is_taken_for_one_being_written_then_for_a_killed_runs(tmp_path, capsys):
    """A run killed between creating its lock file and writing it left an empty file that refused every rerun."""
    lock_file = tmp_path / "out" / lock.LOCK_NAME
    lock_file.parent.mkdir()
    lock_file.write_bytes(b"")
    command = ["parse", "--dump", SAMPLE, "--output", str(tmp_path / "out"), "--progress-interval", "0", *DIRECT]
    assert main(command) == 2
    assert capsys.readouterr().err.splitlines() == [  # just created: maybe being written
        f"error: {tmp_path / 'out'} is in use: {lock_file} is empty: a run is writing it, or was killed as it took "
        "it (an empty lock is taken over once it is 10 s old: rerun then)"]
    old = time.time() - lock.UNWRITTEN_SECONDS - 5
    os.utime(lock_file, (old, old))
    assert main(command) == 0
    assert capsys.readouterr().err.splitlines()[0] == (
        f"taking over the empty lock on {tmp_path / 'out'} (its run was killed as it took it)")
    assert not lock_file.exists()


def test_a_stale_lock_is_taken_over_with_a_notice_and_released(tmp_path, capsys):
    output = tmp_path / "out"
    pid = dead_pid()
    write_lock(output, pid)
    with lock.hold(str(output), "python run_pipeline.py parse"):
        holder = lock.read(str(output))
        assert (holder.pid, holder.command) == (os.getpid(), "python run_pipeline.py parse")
        with lock.hold(str(output), "nested"):  # `all` holds it across its stages, which take it again
            assert lock.read(str(output)) == holder
        assert lock.read(str(output)) == holder, "the nested holder does not release the outer one's lock"
    assert not (output / lock.LOCK_NAME).exists()
    assert capsys.readouterr().err.splitlines() == [
        f"taking over the stale lock of pid {pid} (no longer running) on {output}"]



def test_of_two_runs_taking_over_one_stale_lock_only_the_first_holds_it(tmp_path, monkeypatch):
    """Another run takes the stale lock over between this run's reading it and its own takeover: this run must
    not remove the other's live lock (both would write OUT), and is refused."""
    output = tmp_path / "out"
    write_lock(output, dead_pid())
    holds_it = "from artifacts.run import lock; import sys, time; lock.acquire(sys.argv[1], 'other'); " \
               "print('held', flush=True); time.sleep(120)"
    read = lock.read
    others: list[subprocess.Popen] = []

    def read_then_lose_the_race(path: str):
        holder = read(path)
        if not others:
            others.append(subprocess.Popen([sys.executable, "-c", holds_it, str(output)], cwd=REPO,
                                           env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                                           stderr=subprocess.DEVNULL, text=True))
            assert others[0].stdout.readline() == "held\n"
        return holder

    monkeypatch.setattr(lock, "read", read_then_lose_the_race)
    try:
        with pytest.raises(lock.OutputLocked) as refused:
            lock.acquire(str(output), "python run_pipeline.py parse")
        assert f"in use by pid {others[0].pid} " in str(refused.value)
        assert read(str(output)).pid == others[0].pid
    finally:
        for other in others:
            other.kill()
            other.wait()

# --- readers read only what the manifest records ---------------------------------------------------------------


@pytest.mark.usefixtures("shared_data")
def test_search_ignores_unrecorded_index_files(minilm_index, tmp_path, capsys):
    from pipelines.search import Retriever

    output = tmp_path / "out"
    shutil.copytree(minilm_index, output)
    recorded = next((output / "index" / "embeddings").rglob("*.parquet"))
    table = pq.read_table(recorded)
    stray = table.set_column(table.schema.get_field_index("title"), "title",
                             pa.array(["STRAY"] * table.num_rows))
    pq.write_table(stray, recorded.parent / "zz-half-written.parquet")
    (output / "index" / "shard-99.faiss").write_bytes(b"half written")
    retriever = Retriever(str(output))
    found = retriever.passages.get(table.column("passage_id").to_pylist())
    assert len(found) == table.num_rows
    assert "STRAY" not in {title for title, _ in found.values()}

    info = json.loads((output / "index" / "index.json").read_text())
    info["shard_files"].append({**info["shard_files"][0], "index": "shard-99.faiss"})
    (output / "index" / "index.json").write_text(json.dumps(info))
    assert main(["search", "--output", str(output), "--query", "q"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        f"error: the index under {output} changed after it was recorded (index/index.json: ")

    completed = manifest.load(str(output))
    del completed["index"]
    manifest.save(str(output), completed)
    assert main(["search", "--output", str(output), "--query", "q"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {output} has no index recorded in its manifest (the index stage has not finished): run "
        f"`python run_pipeline.py index --output {output} ...` first")


# --- the runtime linker ----------------------------------------------------------------------------------------


def test_the_runtime_linker_imports_without_beam():
    code = "import artifacts.linker, sys; assert 'apache_beam' not in sys.modules, 'Beam was imported'"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


# --- Ctrl-C ----------------------------------------------------------------------------------------------------


def interrupt(_: object) -> None:
    raise KeyboardInterrupt


def test_ctrl_c_inside_a_step_is_an_interruption_not_an_error():
    """Beam re-raises Ctrl-C inside a step (the in-process runner runs steps in the main thread) as a RuntimeError
    naming the step; the stage runner tells it from a failure."""
    import apache_beam as beam

    pipeline = beam.Pipeline(argv=DIRECT)
    _ = pipeline | beam.Create([1]) | "Step" >> beam.Map(interrupt)
    with pytest.raises(Exception) as raised:
        pipeline.run().wait_until_finish()
    assert not isinstance(raised.value, KeyboardInterrupt) and interrupted_in_a_step(raised.value)
    assert not interrupted_in_a_step(RuntimeError("ValueError [while running 'Step']"))


@dataclass(frozen=True)
class Computing:
    """``command`` on an OUT with ``copied``, stages of ``full_run``: it computes ``stage`` at once, whose progress
    lines count ``unit``."""

    command: str
    copied: tuple[str, ...]
    stage: str
    unit: str


UP_TO_MENTIONS = ("parse", "dictionary", "mentions")
COMPUTING = [
    Computing("parse", (), "parse", "pages"),
    # The GPU stages alone, stopped by Ctrl-C while they encode: tests/test_resume.py.
    Computing("all", (*UP_TO_MENTIONS, "embed_entities"), "index", "passages prepared"),
]


@pytest.mark.parametrize("case", COMPUTING, ids=[case.command for case in COMPUTING])
def test_ctrl_c_while_a_stage_computes_prints_one_line_exits_130_and_the_rerun_resumes(
        case, full_run, tiny_bert, tmp_path, capsys):
    """SIGINT to the process group at the stage's first progress line (one per item: --progress-interval 0), in
    the in-process runner, where Beam runs the steps in the main thread."""
    output = tmp_path / "out"
    output.mkdir()
    copy_stages(full_run, output, case.copied)
    extra = ("--progress-interval", "0")
    arguments = (all_command(output, tiny_bert, "--no-report", *extra) if case.command == "all"
                 else stage_command(case.command, output, tiny_bert, *extra))
    progress = re.compile(rf"\[{case.stage}\] [\d,]+ {case.unit} in \d")
    run = signal_when(arguments, lambda lines: any(progress.match(line) for line in lines), signal.SIGINT)

    assert run.returncode == 130, run.stderr
    skipped = [f"[{layout.command_of(name)}] skipped: outputs complete, inputs and options unchanged"
               for name in case.copied]
    started = [*(skipped if case.command == "all" else []), f"[{case.stage}] running"]
    last = f"interrupted during {case.stage}; rerun the same command to resume"
    lines = [*run.before, *run.after]
    assert lines[:len(started)] == started and lines[-1] == last, run.stderr
    computed = lines[len(started):-1]  # progress lines only, written before the signal
    assert computed and all(progress.match(line) for line in computed), run.stderr
    assert run.left_running == []
    assert set(manifest.load(str(output))) == set(case.copied)
    assert not (output / lock.LOCK_NAME).exists(), "the lock is released on Ctrl-C"

    assert main(arguments) == 0
    assert f"[{case.stage}] running" in capsys.readouterr().err
    assert case.stage in map(layout.command_of, manifest.load(str(output)))


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_while_worker_processes_compute_prints_only_the_one_line(signal_number, tmp_path, capsys):
    """With worker processes (multi_processing) Ctrl-C stops them too: each prints a traceback as it stops, and so do
    Beam's threads here that served them (100 to 300 lines in all); none of that shows. SIGINT once the workers run
    parse's first pipeline (a sink of theirs has made its temporary directory in the staging area). SIGTERM, what a
    batch scheduler sends, is taken as Ctrl-C (it ended the command with no word, its lock and temporary directory
    left behind)."""
    output = tmp_path / "out"
    arguments = ["parse", "--dump", SAMPLE, "--output", str(output), *MULTI_PROCESS]
    sink = output / layout.STAGING / "parse" / STAGED_ARTICLES
    run = signal_when(arguments, lambda _: any(sink.glob("beam-temp-*")), signal_number)

    assert run.returncode == 130, run.stderr
    assert run.before == ["[parse] running"], run.stderr
    assert run.after == ["interrupted during parse; rerun the same command to resume"], run.stderr
    assert run.left_running == []
    assert not (output / lock.LOCK_NAME).exists()

    assert main(arguments) == 0
    assert set(manifest.load(str(output))) == {"parse"}


# --- models: offline hub, tokenizer noise -----------------------------------------------------------------------


def test_a_hub_model_name_offline_fails_fast_in_one_line(tmp_path, capsys, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["all", "--dump", SAMPLE, "--output", str(tmp_path / "out"), "--model", "kpr-tests/no-such-model",
            "--encoder", "x", *DIRECT]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: model 'kpr-tests/no-such-model' is not a local path and the hub is offline (HF_HUB_OFFLINE=1): "
        "download it first or pass a local directory"]
    assert files_under(tmp_path) == []


def test_whole_windows_are_tokenized_without_the_length_warning(tiny_bert, caplog):
    from transformers import AutoTokenizer

    from encoders.models import load_tokenizer

    text = "aristotle taught alexander " * 300
    tokenizer = load_tokenizer(str(tiny_bert))
    with caplog.at_level("WARNING"):
        ids = tokenizer(text)["input_ids"]
    assert len(ids) == 902 and "Token indices sequence length" not in caplog.text
    plain = AutoTokenizer.from_pretrained(str(tiny_bert))
    with caplog.at_level("WARNING"):
        assert plain(text)["input_ids"] == ids, "the same ids as without the silencing"
    assert "Token indices sequence length" in caplog.text, "the warning this test guards against"
    assert tokenizer.model_max_length == plain.model_max_length


def test_a_stage_summary_prints_each_row_count_once(capsys):
    from pipelines.launcher.stage import print_summary

    record = manifest.StageRecord(
        stage="parse", options={}, inputs={}, counters={"articles": 106, "links": 22408, "redirects": 98},
        outputs=[manifest.OutputFile("articles/part-0.parquet", 1, "0", 100),
                 manifest.OutputFile("articles/part-1.parquet", 1, "0", 6),
                 manifest.OutputFile("redirects/part-0.parquet", 1, "0", 99)], wall_time_s=1.25)
    print_summary(record)
    assert capsys.readouterr().err.splitlines() == [
        "[parse] done in 1.2s", "  articles: 106 rows", "  redirects: 99 rows", "  links: 22,408",
        "  redirects: 98"]


def test_a_setting_is_named_by_its_field_in_the_library_and_by_its_flag_on_the_command_line():
    import pickle

    from artifacts.errors import BelowMinimumError, SettingError
    from pipelines.launcher.flags import worded

    error = SettingError("max_length", 600, "{name} 600: /models/{odd} takes at most 512 tokens")
    assert error.message == "max_length 600: /models/{odd} takes at most 512 tokens"  # other braces stay as they are
    assert worded(error).message == "--max-length 600: /models/{odd} takes at most 512 tokens"
    assert worded(error, {"max_length": "--length"}).message == "--length 600: /models/{odd} takes at most 512 tokens"
    below = BelowMinimumError("batch_tokens", 0, 1)
    assert worded(below, {"kind": "--encoder-type"}).message == "--batch-tokens must be at least 1, got 0"
    for raised in (error, below):  # a worker's error reaches the driver pickled
        again = pickle.loads(pickle.dumps(raised))
        assert (type(again), again.message, again.setting, again.value) == (
            type(raised), raised.message, raised.setting, raised.value)
    plain = ValueError("not a setting")
    assert worded(plain) is plain


def test_the_command_a_message_asks_for_runs_as_shown(tmp_path, capsys):
    """The OUT of a command to run is quoted: pasted as shown it runs (a space in OUT split it in two)."""
    out = tmp_path / "my run"
    assert main(["mentions", "--output", str(out), *DIRECT]) == 2
    assert capsys.readouterr().err == (f"error: {out} has no completed 'parse' stage, which 'mentions' reads: run "
                                       f"`python run_pipeline.py parse --output '{out}' ...` first\n")


def test_one_dump_under_two_names_is_refused(tmp_path, capsys):
    """A link to the dump beside the dump: every page would be its copy's duplicate (it was read twice)."""
    link = tmp_path / "link.xml.bz2"
    link.symlink_to(os.path.abspath(SAMPLE))
    assert main(["parse", "--dump", SAMPLE, str(link), "--output", str(tmp_path / "out"), *DIRECT]) == 2
    assert capsys.readouterr().err == (f"error: --dump names one file twice: {os.path.abspath(SAMPLE)} and "
                                       f"{link}\n")
    assert not (tmp_path / "out").exists()
    copy, hard_link = tmp_path / "copy.xml.bz2", tmp_path / "hard.xml.bz2"  # a hard link too (was read twice)
    shutil.copyfile(SAMPLE, copy)
    os.link(copy, hard_link)
    assert main(["parse", "--dump", str(copy), str(hard_link), "--output", str(tmp_path / "out"), *DIRECT]) == 2
    assert capsys.readouterr().err == f"error: --dump names one file twice: {copy} and {hard_link}\n"
    assert not (tmp_path / "out").exists()
