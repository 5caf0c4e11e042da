"""The Beam runner a command names (``--runner``), checked against this installation before anything runs: Beam
itself resolves it only when the first pipeline starts, and says so in a traceback."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from apache_beam.options.pipeline_options import StandardOptions

from artifacts.errors import InputError
from pipelines.stage import beam_pipeline_options


def runner_path(name: str) -> str:
    """The ``module.Class`` path Beam resolves a runner name to: a known runner's class name (any case, "Runner"
    optional, e.g. ``direct``), else the name itself (a path of the user's own runner class)."""
    known = {path.rsplit(".", 1)[-1].lower(): path for path in StandardOptions.ALL_KNOWN_RUNNERS}
    return known.get(name.lower(), known.get(name.lower() + "runner", name))


def load_problem(path: str) -> str | None:
    """Why the runner class at ``path`` cannot be loaded (None: it can)."""
    module_name, _, class_name = path.rpartition(".")
    if not module_name:
        return "is not a Beam runner"
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:  # e.g. DataflowRunner without apache-beam[gcp]
        return f"cannot be loaded: {type(error).__name__}: {str(error).strip().splitlines()[0]}"
    return None if hasattr(module, class_name) else f"cannot be loaded: {module_name} has no {class_name}"


def available_runners() -> list[str]:
    """The class names of Beam's known runners that load in this installation."""
    return [path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS if load_problem(path) is None]


def check_runner(beam_args: Sequence[str]) -> None:
    """An ``InputError`` naming the runners this installation has, for a ``--runner`` that does not load."""
    runner = beam_pipeline_options(beam_args).view_as(StandardOptions).runner
    if not isinstance(runner, str):  # a runner object (tests): nothing to resolve
        return
    problem = load_problem(runner_path(runner))
    if problem:
        raise InputError(f"--runner {runner} {problem}; this installation has "
                         f"{', '.join(available_runners())} (or name a module.Class of your own)")
