"""What a run's workers have: this process's code and files (a local runner, a LOOPBACK environment), or only
what is shipped to them; the project shipped without being asked, or a one-line refusal; local paths warned of."""

from __future__ import annotations

from pathlib import Path

import pytest

from artifacts.errors import InputError, input_error_message
from pipelines.launcher.cli import main, worded
from pipelines.launcher.runners import (
    local_paths_warning,
    prepare_workers,
    project_setup_file,
    shipping_flags,
    workers_share_this_process,
)
from tests.builders import free_port
from tests.conftest import BUNDLED_SAMPLE, DIRECT, MULTI_PROCESS, REPO

PORTABLE = ["--runner=PortableRunner", "--job_endpoint=localhost:8099"]
EXTERNAL = [*PORTABLE, "--environment_type=EXTERNAL", "--environment_config=localhost:50000"]
SAME_PROCESS_TREE = [
    DIRECT,
    MULTI_PROCESS,
    [*PORTABLE, "--environment_type=LOOPBACK"],
    ["--runner=FlinkRunner", "--flink_master=[local]"],  # Beam runs its Python workers LOOPBACK there
    ["--runner=SparkRunner", "--spark_master_url=local[4]"],
    ["--runner=direct"], ["--runner=Direct"], ["--runner=directrunner"],  # Beam's names for the DirectRunner
]
ELSEWHERE = [
    EXTERNAL,
    PORTABLE,  # DOCKER, Beam's default environment
    [*PORTABLE, "--environment_type=PROCESS", '--environment_config={"command": "/opt/apache/beam/boot"}'],
    ["--runner=FlinkRunner", "--flink_master=flink-master:8081"],
    ["--runner=FlinkRunner", "--flink_master=[local]", "--environment_type=EXTERNAL",
     "--environment_config=localhost:50000"],
    ["--runner=SparkRunner", "--spark_master_url=spark://spark-master:7077"],
]


@pytest.mark.parametrize("beam_args", SAME_PROCESS_TREE, ids=" ".join)
def test_workers_of_this_process_tree_need_nothing_shipped(beam_args):
    assert workers_share_this_process(beam_args)
    assert shipping_flags(beam_args, REPO / "setup.py") == []
    assert local_paths_warning([("--output", "/data/out")], beam_args) is None


@pytest.mark.parametrize("beam_args", ELSEWHERE, ids=" ".join)
def test_workers_elsewhere_get_this_projects_setup_file(beam_args):
    assert not workers_share_this_process(beam_args)
    assert shipping_flags(beam_args, project_setup_file()) == [f"--setup_file={REPO / 'setup.py'}"]


def test_a_setup_file_given_is_left_as_it_is():
    assert shipping_flags([*EXTERNAL, "--setup_file=/src/other/setup.py"], REPO / "setup.py") == []


def test_without_a_setup_file_to_ship_the_run_is_refused_in_one_line():
    with pytest.raises(InputError) as refused:
        shipping_flags(EXTERNAL, None)
    assert refused.value.message == (
        "the workers of --runner PortableRunner do not have this project, and this installation has no setup.py to "
        "ship it from: add --setup_file=CHECKOUT/setup.py (a checkout of kpr-pipeline), or "
        "--sdk_container_image=IMAGE with kpr-pipeline installed")
    # A container image is the user's way of giving the workers the project.
    assert shipping_flags([*PORTABLE, "--sdk_container_image=registry/kpr:1"], None) == []


def test_a_model_pipeline_whose_workers_are_elsewhere_gets_the_setup_file(capsys):
    """The run's workers LOOPBACK, its model's pipeline's on a worker pool (--model-pipeline-options): that job got no
    code ("No module named 'transforms'") and no word about the local paths."""
    loopback = [*PORTABLE, "--environment_type=LOOPBACK"]
    elsewhere = ["--environment_type=EXTERNAL", "--environment_config=localhost:50000"]
    paths = [("--output", "/data/out")]
    assert prepare_workers(loopback, paths, elsewhere) == ([], [f"--setup_file={REPO / 'setup.py'}"])
    assert capsys.readouterr().err.startswith("warning: the workers of --runner PortableRunner may not see")
    assert prepare_workers(loopback, paths, ["--environment_type=LOOPBACK"]) == ([], [])
    assert prepare_workers(EXTERNAL, paths, elsewhere) == ([f"--setup_file={REPO / 'setup.py'}"], [])
    assert capsys.readouterr().err.count("warning:") == 1


def test_the_setup_file_is_this_checkouts(tmp_path: Path):
    assert project_setup_file() == REPO / "setup.py"
    assert project_setup_file(tmp_path) is None  # an installed copy: packages without the checkout around them
    (tmp_path / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    assert project_setup_file(tmp_path) is None  # a setup.py alone is not a project's


def test_asking_where_the_workers_run_builds_nothing(tmp_path: Path, monkeypatch, capsys):
    """Beam builds the package of --setup_file as it makes an environment: asked where the workers of a run with a
    user's --setup_file run, and for the local paths' warning, it built the package in the checkout, outside the
    lock its job's submission takes (commands started at once from one checkout failed in Beam's build)."""
    from apache_beam.runners.portability.stager import Stager

    def built(*args: object, **kwargs: object) -> str:
        raise AssertionError("a package was built")

    monkeypatch.setattr(Stager, "_build_setup_package", staticmethod(built))
    setup = tmp_path / "setup.py"
    setup.write_text("from setuptools import setup\nsetup()\n")
    beam_args = [*EXTERNAL, f"--setup_file={setup}", f"--requirements_file={tmp_path / 'requirements.txt'}"]
    assert not workers_share_this_process(beam_args)
    assert prepare_workers(beam_args, [("--output", str(tmp_path / "out"))]) == ([], [])
    assert capsys.readouterr().err.startswith("warning: the workers of --runner PortableRunner may not see")


def test_an_environment_beam_cannot_start_is_one_line():
    with pytest.raises(InputError, match=r"--environment_type EXTERNAL: Beam cannot start workers with these "
                                         r"options \(.*\); see --environment_config$"):
        workers_share_this_process([*PORTABLE, "--environment_type=EXTERNAL"])


def test_local_paths_on_workers_elsewhere_are_named_in_one_line():
    line = local_paths_warning([("--dump", "/data/enwiki.xml.bz2"), ("--output", "/data/out")], EXTERNAL)
    assert line == ("warning: the workers of --runner PortableRunner may not see this machine's files, and these are "
                    "local: --dump /data/enwiki.xml.bz2, --output /data/out (give paths every worker reads: gs://, "
                    "s3://, hdfs://, or a shared mount at the same path)")
    assert local_paths_warning([], EXTERNAL) is None


def test_a_job_server_jar_that_is_not_there_is_one_line(tmp_path: Path, capsys):
    missing = tmp_path / "beam-runners-flink-1.20-job-server-2.77.0.jar"
    assert main(["parse", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp_path / "out"), "--runner=FlinkRunner",
                 f"--flink_job_server_jar={missing}"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: --flink_job_server_jar {missing} does not exist"]


def test_a_job_server_jar_beam_cannot_download_is_one_line(tmp_path: Path, capfd):
    """As on a machine without internet, where Beam would fetch FlinkRunner's jar from Maven Central."""
    url = f"http://localhost:{free_port()}/kpr-tests-flink-job-server.jar"
    assert main(["parse", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp_path / "out"), "--runner=FlinkRunner",
                 "--flink_master=[local]", f"--flink_job_server_jar={url}"]) == 2
    assert capfd.readouterr().err.splitlines() == [
        "[parse] running",
        f"error: Beam's job server jar cannot be downloaded here ({url}): fetch kpr-tests-flink-job-server.jar where "
        "there is internet and give --flink_job_server_jar=PATH"]


def test_a_beam_option_value_beam_refuses_is_one_line(tmp_path: Path, capsys):
    """Beam's parser would print its whole usage; Beam 2.77 knows Flink 1.19 to 2.2."""
    assert main(["parse", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp_path / "out"), "--runner=FlinkRunner",
                 "--flink_version=2.3"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: argument --flink_version: invalid choice: '2.3' (choose from '1.19', '1.20', '2.0', '2.1', '2.2')"]
    assert not (tmp_path / "out").exists()


def test_the_prism_runner_beam_cannot_download_is_one_line():
    """As PrismRunner fails on a machine without internet (Beam fetches its binary from GitHub as the run starts)."""
    url = "https://github.com/apache/beam/releases/download/v2.77.0/apache_beam-v2.77.0-prism-linux-amd64.zip"
    error = RuntimeError(f"Unable to fetch remote prism binary at {url}: <urlopen error [Errno -3] Temporary "
                         "failure in name resolution>")
    assert input_error_message(worded(error)) == (
        f"Beam's Prism runner cannot be downloaded here ({url}): fetch it where there is internet and give "
        "--prism_location=PATH, or leave --runner out (DirectRunner)")


def test_a_runners_refusal_of_the_options_is_one_line(tmp_path: Path, capsys):
    """DataflowRunner checks its options as the pipeline is made: without them Beam's ValueError was a traceback."""
    assert main(["parse", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp_path / "out"),
                 "--runner=DataflowRunner"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: the runner refused the options: Missing GCS path option: temp_location.; Missing GCS path option: "
        "staging_location.; Missing required option: project.; Missing required option: region.")


def test_a_job_service_that_does_not_answer_is_one_line(tmp_path: Path, capsys):
    port = free_port()
    assert main(["parse", "--dump", str(BUNDLED_SAMPLE), "--output", str(tmp_path / "out"), "--runner=PortableRunner",
                 f"--job_endpoint=localhost:{port}", "--job_server_timeout=2", "--environment_type=LOOPBACK"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: no job service answered at --job_endpoint localhost:{port} within 2 s (--job_server_timeout): start "
        "it, or check the address and the network")
