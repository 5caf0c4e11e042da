"""The Beam runner a command names (``--runner``), checked against this installation before anything runs: Beam
itself resolves it only when the first pipeline starts, and says so in a traceback. And what a runner whose workers
are not processes of this one needs: this project shipped to them, paths that mean the same there."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    PortableOptions,
    SetupOptions,
    StandardOptions,
    WorkerOptions,
)
from apache_beam.portability import common_urns
from apache_beam.runners.runner import create_runner
from apache_beam.transforms import environments, resources

from artifacts.errors import InputError, first_line
from pipelines.launcher.stage import beam_pipeline_options, runner_path, workers_run_here

# Beam's worker environments that run in this process (as threads of it): they have its code and files.
IN_THIS_PROCESS = (environments.PythonLoopbackEnvironment, environments.EmbeddedPythonEnvironment,
                   environments.EmbeddedPythonGrpcEnvironment)
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # a checkout (or editable install) has setup.py here
# The flags naming the job server jar that FlinkRunner and SparkRunner start (else Beam downloads it from Maven).
JAR_FLAGS = ("flink_job_server_jar", "spark_job_server_jar")
_UNFETCHED_JAR = re.compile(r"Unable to fetch remote job server jar at (\S+): ")
_UNFETCHED_PRISM = re.compile(r"Unable to fetch remote prism binary at (\S+): ")
IN_MEMORY = "in_memory"  # the DirectRunner's default running mode: one worker, whatever --direct_num_workers says
# How Beam says that a runner's own checks of the options failed (DataflowRunner without --temp_location...).
OPTION_ERRORS = "Pipeline has validations errors:"


def load_problem(path: str) -> str | None:
    """Why the runner class at ``path`` cannot be loaded (None: it can)."""
    module_name, _, class_name = path.rpartition(".")
    if not module_name:
        return "is not a Beam runner"
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:  # e.g. DataflowRunner without apache-beam[gcp]
        return f"cannot be loaded: {type(error).__name__}: {first_line(error)}"
    return None if hasattr(module, class_name) else f"cannot be loaded: {module_name} has no {class_name}"


def available_runners() -> list[str]:
    """The class names of Beam's known runners that load in this installation."""
    return [path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS if load_problem(path) is None]


def check_option_values(beam_args: Sequence[str], model_args: Sequence[str] = ()) -> None:
    """An ``InputError`` with Beam's own words for a Beam option value it refuses, of the run's options and of
    its model's pipeline (those and ``model_args``): one its parser refuses (``--flink_version=2.3``: not one of
    its choices; the parser would print its whole usage, hundreds of lines, and exit), or one that Beam reads
    only as it builds or submits a job (``worker_option_problem``): after a stage's inputs' job, for the model's."""
    for args in ([beam_args, [*beam_args, *model_args]] if model_args else [beam_args]):
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                options = beam_pipeline_options(args)
                options.get_all_options()
        except SystemExit:
            raise InputError(said.getvalue().strip().splitlines()[-1].split(": error: ", 1)[-1]) from None
        problem = worker_option_problem(options)
        if problem:
            raise InputError(problem)
    direct = beam_pipeline_options(beam_args).view_as(DirectOptions)
    if direct.direct_num_workers is not None and direct.direct_num_workers < 0:
        raise InputError(f"--direct_num_workers={direct.direct_num_workers}: give the worker count, or 0 for one per "
                         "core")
    if direct.direct_num_workers != 1 and direct.direct_running_mode == IN_MEMORY:
        print(f"warning: --direct_num_workers={direct.direct_num_workers} runs one worker, in this process, unless "
              "--direct_running_mode=multi_processing (or multi_threading) is given too", file=sys.stderr)


def worker_option_problem(options: PipelineOptions) -> str | None:
    """What is wrong with the values that Beam reads only as it builds a pipeline or stages its workers' files: a
    ``--setup_file`` it cannot build from, an ``--environment_type`` it does not know, a resource hint it refuses
    (None: nothing)."""
    setup_file = options.view_as(SetupOptions).setup_file
    if setup_file and not Path(setup_file).is_file():
        return f"--setup_file={setup_file}: no such file"
    if setup_file and Path(setup_file).name not in ("setup.py", "pyproject.toml"):
        return f"--setup_file={setup_file}: Beam builds the workers' package from a setup.py or a pyproject.toml"
    if setup_file and not os.path.dirname(setup_file):  # Beam changes into the file's folder: "" is none
        return f"--setup_file={setup_file}: name its folder too (./{setup_file})"
    kind = options.view_as(PortableOptions).environment_type
    if kind and not (kind == "LOOPBACK" or kind.startswith("beam:env:") or hasattr(common_urns.environments, kind)):
        return f"--environment_type={kind}: Beam knows DOCKER, PROCESS, EXTERNAL, LOOPBACK and beam:env: URNs"
    try:
        resources.resource_hints_from_options(options)
    except ValueError as error:
        return f"--resource_hints: {error}"
    return None


def check_runner(beam_args: Sequence[str], model_args: Sequence[str] = ()) -> None:
    """An ``InputError`` naming the runners this installation has, for a ``--runner`` that does not load (the Beam
    option values of the run and of its model's pipeline, which adds ``model_args``, checked first)."""
    check_option_values(beam_args, model_args)
    runner = beam_pipeline_options(beam_args).view_as(StandardOptions).runner
    if not isinstance(runner, str):  # a runner object (tests): nothing to resolve
        return
    problem = load_problem(runner_path(runner))
    if problem:
        raise InputError(f"--runner {runner} {problem}; this installation has "
                         f"{', '.join(available_runners())} (or name a module.Class of your own)")


def workers_share_this_process(beam_args: Sequence[str]) -> bool:
    """Whether the workers of the run are this process or processes it starts from this environment (a local runner,
    or a LOOPBACK environment: what Beam makes of FlinkRunner with ``--flink_master=[local]`` and SparkRunner with a
    ``local[N]`` master unless told otherwise). Other workers (DOCKER, PROCESS, EXTERNAL: Dataflow, a Flink or
    Spark cluster, a worker pool) have only what is shipped to them, and their own working directory and files."""
    if workers_run_here(beam_args):
        return True
    options = beam_pipeline_options(beam_args)
    # Only the environment's kind is asked: Beam would build (or fetch) what it ships with it, here, outside the
    # lock that the job's submission takes (jobs.setup_file_held), and again as the job is submitted.
    shipped = options.view_as(SetupOptions)
    shipped.setup_file = shipped.requirements_file = shipped.extra_packages = None
    try:
        environment = create_runner(options.view_as(StandardOptions).runner).default_environment(options)
    except (TypeError, ValueError) as error:  # e.g. EXTERNAL without --environment_config, an unknown type
        raise InputError(f"--environment_type {options.view_as(PortableOptions).environment_type}: Beam cannot "
                         f"start workers with these options ({error}); see --environment_config") from None
    return isinstance(environment, IN_THIS_PROCESS)


def project_setup_file(root: Path = PROJECT_ROOT) -> Path | None:
    """This project's ``setup.py``, from which Beam builds the sdist it stages for the workers (``--setup_file``);
    None when this installation has none (installed from a wheel or an sdist, not run from a checkout)."""
    setup = root / "setup.py"
    return setup if setup.is_file() and (root / "pyproject.toml").is_file() else None


def shipping_flags(beam_args: Sequence[str], setup_file: Path | None) -> list[str]:
    """The Beam flags that ship this project to workers that do not share this process: ``--setup_file`` naming
    ``setup_file`` (this project's), unless one is given. Without a setup file to name, an ``InputError`` saying
    what to add (a container image with the project installed is the other way: ``--sdk_container_image``)."""
    options = beam_pipeline_options(beam_args)
    if options.view_as(SetupOptions).setup_file or workers_share_this_process(beam_args):
        return []
    if setup_file is not None:
        return [f"--setup_file={setup_file}"]
    if options.view_as(WorkerOptions).sdk_container_image:
        return []
    raise InputError(f"the workers of --runner {options.view_as(StandardOptions).runner} do not have this project, "
                     "and this installation has no setup.py to ship it from: add --setup_file=CHECKOUT/setup.py "
                     "(a checkout of kpr-pipeline), or --sdk_container_image=IMAGE with kpr-pipeline installed")


def local_paths_warning(paths: Sequence[tuple[str, str]], beam_args: Sequence[str]) -> str | None:
    """One line naming the local paths (``(flag, path)``) of a run whose workers may not see this machine's files
    (None: they do, or there are none)."""
    if not paths or workers_share_this_process(beam_args):
        return None
    runner = beam_pipeline_options(beam_args).view_as(StandardOptions).runner
    named = ", ".join(f"{flag} {path}" for flag, path in paths)
    return (f"warning: the workers of --runner {runner} may not see this machine's files, and these are local: "
            f"{named} (give paths every worker reads: gs://, s3://, hdfs://, or a shared mount at the same path)")


def check_job_server_jar(beam_args: Sequence[str]) -> None:
    """An ``InputError`` for a job server jar named by a local path that does not exist."""
    options = beam_pipeline_options(beam_args).get_all_options()
    for flag in JAR_FLAGS:
        jar = options.get(flag)
        if jar and "://" not in jar and not os.path.exists(jar):
            raise InputError(f"--{flag} {jar} does not exist")


def worded(error: BaseException) -> BaseException:
    """Beam's failure to download the job server jar of FlinkRunner or SparkRunner, or PrismRunner's binary (a
    machine without internet), as one line naming the flag that gives it; a runner's refusal of the options as one
    line; any other error as it is."""
    if isinstance(error, ValueError) and str(error).startswith(OPTION_ERRORS):
        problems = [line.strip() for line in str(error).removeprefix(OPTION_ERRORS).splitlines() if line.strip()]
        return InputError(f"the runner refused the options: {'; '.join(problems)}")
    prism = _UNFETCHED_PRISM.search(str(error)) if isinstance(error, RuntimeError) else None
    if prism is not None:
        return InputError(f"Beam's Prism runner cannot be downloaded here ({prism.group(1)}): fetch it where there "
                          "is internet and give --prism_location=PATH, or leave --runner out (DirectRunner)")
    found = _UNFETCHED_JAR.search(str(error)) if isinstance(error, RuntimeError) else None
    if found is None:
        return error
    url = found.group(1)
    jar = url.rsplit("/", 1)[-1]
    flag = JAR_FLAGS[1] if "-spark-" in jar else JAR_FLAGS[0]
    return InputError(f"Beam's job server jar cannot be downloaded here ({url}): fetch {jar} where there is "
                      f"internet and give --{flag}=PATH")


def prepare_workers(beam_args: Sequence[str], paths: Sequence[tuple[str, str]],
                    model_args: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """The flags to add for the run's workers and for those of its model's pipeline, which runs with the run's
    options and ``model_args`` (--model-pipeline-options: its workers may be elsewhere where the run's are not);
    the warning about ``paths`` printed once."""
    check_job_server_jar([*beam_args, *model_args])
    setup_file = project_setup_file()
    added = shipping_flags(beam_args, setup_file)
    model_job = [*beam_args, *added, *model_args]
    model_added = shipping_flags(model_job, setup_file) if model_args else []
    warning = local_paths_warning(paths, beam_args) or local_paths_warning(paths, model_job)
    if warning:
        print(warning, file=sys.stderr)
    return added, model_added
