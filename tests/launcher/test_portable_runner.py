"""Every stage on Beam's portable runner as Flink, Spark and Kubernetes run Python: Beam's own job service, and SDK
workers started by a worker pool (``--environment_type=EXTERNAL``) in a Python environment that has the third-party
packages but not this project, in a working directory of their own. The launcher must ship the project (the sdist
Beam builds from this project's setup.py; ``sdk_worker_boot.py`` installs it, as the SDK container's boot program
does) and make its relative paths absolute; the artifacts must equal the DirectRunner's (``full_run``)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from artifacts.run import manifest
from pipelines.launcher.cli import main
from tests.builders import artifact_rows, free_port
from tests.conftest import BUNDLED_SAMPLE, REPO, stage_options

pytestmark = pytest.mark.long  # minutes: started first (conftest)
BOOT = REPO / "tests" / "sdk_worker_boot.py"
GPU_STAGES = ("embed-entities", "index")  # the stages with a model's pipeline
START_TIMEOUT_S = 120
# How every Python process on the workers' side starts: isolated (-I), so that no PYTHONPATH, PYTHONHOME or user
# site directory of the caller's environment lends it this project, as none would on a cluster's workers.
ISOLATED = "-I"


@dataclass(frozen=True)
class ExternalWorkers:
    """A job service and a worker pool, both in ``python`` (an environment without this project), working in
    ``workdir``; ``flags`` point a run at them."""

    python: Path
    workdir: Path
    flags: tuple[str, ...]


def environment_without_the_project(directory: Path) -> Path:
    """A virtual environment that sees this one's site-packages as a plain path: every third-party package, but not
    the project (its editable install is a .pth file there, which only a site directory's processing would run)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    python = directory / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "third-party.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def wait_for(ready: Callable[[], bool], what: str, services: dict[Path, subprocess.Popen]) -> None:
    """Until ``ready()``; a failure showing the services' logs (by path) if one exits or START_TIMEOUT_S pass."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if time.monotonic() > deadline or any(process.poll() is not None for process in services.values()):
            logs = "\n".join(f"{log}:\n{log.read_text(errors='replace')[-3000:]}" for log in services)
            pytest.fail(f"{what} did not start\n{logs}")
        time.sleep(0.2)


def accepts_connections(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("localhost", port)) == 0


def start(command: list[str], workdir: Path, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``command`` in a process group of its own (ended with it, the workers it starts included)."""
    with open(log, "wb") as out:
        return subprocess.Popen(command, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=env)


def stop(process: subprocess.Popen, first_signal: int) -> None:
    """``first_signal`` to the process group, then SIGKILL to what is left of it."""
    for sent in (first_signal, signal.SIGKILL):
        try:
            os.killpg(process.pid, sent)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def external_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExternalWorkers]:
    root = tmp_path_factory.mktemp("external-workers")
    workdir = root / "workdir"
    workdir.mkdir()
    python = environment_without_the_project(root / "env")
    boot = root / "boot"
    boot.write_text(f'#!/bin/sh\nexec "{python}" {ISOLATED} "{BOOT}" --semi_persist_dir "{workdir}" "$@"\n')
    boot.chmod(0o755)
    pool_port, job_port_file = free_port(), root / "job.port"
    logs = (root / "job-service.log", root / "worker-pool.log")
    job_service = start([str(python), ISOLATED, "-m", "apache_beam.runners.portability.local_job_service_main",
                         "--port", "0", "--port_file", str(job_port_file)], workdir, logs[0])
    pool = start([str(python), ISOLATED, "-m", "apache_beam.runners.worker.worker_pool_main",
                  f"--service_port={pool_port}", f"--container_executable={boot}"], workdir, logs[1])
    services = dict(zip(logs, (job_service, pool), strict=True))
    try:
        wait_for(job_port_file.exists, "the job service", services)
        wait_for(lambda: accepts_connections(pool_port), "the worker pool", services)
        yield ExternalWorkers(python, workdir, (
            "--runner=PortableRunner", f"--job_endpoint=localhost:{job_port_file.read_text().strip()}",
            "--environment_type=EXTERNAL", f"--environment_config=localhost:{pool_port}"))
    finally:
        stop(pool, signal.SIGINT)  # the pool ends its workers on the way out
        stop(job_service, signal.SIGTERM)


def relative_paths(options: list[str]) -> list[str]:
    """``options`` with each existing absolute path written relative to the working directory."""
    return [os.path.relpath(value) if os.path.isabs(value) and os.path.exists(value) else value for value in options]


def recorded_files(output: Path) -> dict[str, str]:
    """sha256 of every output file the stages of ``output`` recorded, by path under OUT."""
    return {item.path: item.sha256 for record in manifest.load(str(output)).values() for item in record.outputs}


def rows(output: Path, artifact: str) -> list[str]:
    return sorted(map(repr, artifact_rows(output, artifact)))


def test_the_workers_environment_has_no_project_code(external_workers, monkeypatch):
    # Started as the workers are, it imports the third-party packages but not the project, even where the caller's
    # environment points PYTHONPATH at the checkout.
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    probe = subprocess.run([str(external_workers.python), ISOLATED, "-c",
                            "import apache_beam, torch, faiss; import pipelines"],
                           cwd=external_workers.workdir, capture_output=True, text=True)
    assert "No module named 'pipelines'" in probe.stderr


def test_every_stage_gives_the_same_artifacts_on_workers_with_only_the_shipped_code(
        external_workers, full_run, tiny_bert, tmp_path, monkeypatch, capfd):
    launcher = tmp_path / "launcher"  # not the workers' working directory: relative paths would mean other files
    launcher.mkdir()
    monkeypatch.chdir(launcher)
    for command, options in stage_options(tiny_bert).items():
        # the model's pipeline of a GPU stage with a resource hint of its own, as a cluster's GPU job has one
        own = ["--model-pipeline-options=--resource_hints=min_ram=1GB"] if command in GPU_STAGES else []
        assert main([command, "--output", "out", *relative_paths(options), *own, *external_workers.flags]) == 0, command
    err = capfd.readouterr().err.splitlines()
    # Our own lines only (stage lines, their summaries, warnings): no worker traceback, nothing of the sdist's build.
    assert [line for line in err if not line.startswith(("[", "  ", "warning: "))] == []
    warnings = [line for line in err if line.startswith("warning:")]
    assert len(warnings) == len(stage_options(tiny_bert))  # one line per command
    assert all(f"--output {launcher / 'out'}" in line for line in warnings)
    assert any(f"--model {tiny_bert}" in line for line in warnings)
    # The workers imported the project from the sdist they installed: their environment has none.
    assert list(external_workers.workdir.glob("installed/*/pipelines/parse.py"))

    local, external = recorded_files(full_run), recorded_files(launcher / "out")
    assert sorted(local) == sorted(external)
    # The linker, the FAISS shards, their id maps and index.json byte for byte; tables row for row.
    assert {path: digest for path, digest in external.items() if not path.endswith(".parquet")} == {
        path: digest for path, digest in local.items() if not path.endswith(".parquet")}
    assert any(path.endswith(".faiss") for path in external)
    for artifact in sorted({path.rsplit("/", 1)[0] for path in external if path.endswith(".parquet")}):
        assert rows(full_run, artifact) == rows(launcher / "out", artifact), artifact


def test_workers_without_the_project_fail_the_job_in_one_line(external_workers, tmp_path, capfd):
    """A worker pool that installs nothing it is sent (no boot program; its workers are the `python` on its PATH,
    the environment without the project): the job fails on every worker, and the launcher says so in one line with
    the workers' last error, not their tracebacks (hundreds of lines)."""
    port, log = free_port(), tmp_path / "bare-pool.log"
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    env["PATH"] = f"{external_workers.python.parent}{os.pathsep}{env.get('PATH', '')}"
    pool = start([str(external_workers.python), ISOLATED, "-m", "apache_beam.runners.worker.worker_pool_main",
                  f"--service_port={port}"], external_workers.workdir, log, env)
    try:
        wait_for(lambda: accepts_connections(port), "the worker pool without a boot program", {log: pool})
        flags = [flag for flag in external_workers.flags if not flag.startswith("--environment_config=")]
        assert main(["parse", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp_path / "out"), *flags,
                     f"--environment_config=localhost:{port}"]) == 2
    finally:
        stop(pool, signal.SIGINT)
    err = capfd.readouterr().err.splitlines()
    assert err[-1].startswith("error: the runner's job failed: ") and "No module named" in err[-1], err[-5:]
    assert [line for line in err if not line.startswith(("[", "  ", "warning: ", "error: "))] == []
