"""The command line: `python run_pipeline.py COMMAND [options] [Beam pipeline options]`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from apache_beam.io.filesystems import FileSystems

from artifacts.errors import input_error_message, mentions_input_error
from pipelines import stage as stage_runner
from transforms.progress import DEFAULT_INTERVAL_S
from transforms.progress import LOGGER_NAME as PROGRESS_LOGGER

# command name -> "module:attribute"; a stage object has name/outputs/upstream()/run, a command has main().
COMMANDS: dict[str, str] = {
    "parse": "pipelines.parse:STAGE",
    "dictionary": "pipelines.dictionary:STAGE",
    "mentions": "pipelines.mentions:STAGE",
    "embed-entities": "pipelines.embed_entities:STAGE",
    "index": "pipelines.index:STAGE",
    "search": "pipelines.search:COMMAND",
    "evaluate": "pipelines.evaluate:COMMAND",
    "all": "pipelines.run_all:COMMAND",
    "validate": "pipelines.validate:COMMAND",
    "export-kpr": "pipelines.export_kpr:COMMAND",
    "publish": "pipelines.publish:COMMAND",
    "report": "pipelines.report:COMMAND",
    "diff": "pipelines.diff:COMMAND",
}


class Command(Protocol):
    """A command that is not a Beam stage (search, evaluate, validate, ...)."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int: ...


def load_command(name: str) -> Any:
    module_name, attribute = COMMANDS[name].split(":")
    return getattr(importlib.import_module(module_name), attribute)


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--progress-interval", type=float, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                        help="seconds between progress lines of a worker (default %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run_pipeline.py",
        description="Wikipedia dump -> entity resources and indexes for KPR. "
        "Unknown --flags are Beam pipeline options (--runner, --direct_num_workers, ...).",
        allow_abbrev=False,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log Beam's progress messages")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        command = load_command(name)
        doc = (command.__doc__ or "").strip().splitlines()
        sub = commands.add_parser(name, help=doc[0] if doc else name, allow_abbrev=False)
        if hasattr(command, "run"):
            sub.add_argument("--output", required=True, help="OUT: local path or Beam filesystem URL")
            sub.add_argument("--force", action="store_true", help="rerun even if the outputs are up to date")
            add_progress_argument(sub)
        command.add_arguments(sub)
    return parser


def dispatch(args: argparse.Namespace, beam_args: list[str]) -> int:
    command = load_command(args.command)
    # Filesystem flags (e.g. --s3_access_key_id) also reach what the driver itself reads and writes under OUT.
    FileSystems.set_options(stage_runner.beam_pipeline_options(beam_args))
    if hasattr(command, "run"):
        stage_runner.execute(command, args, beam_args, force=args.force)
        return 0
    return command.main(args, beam_args)


def _is_flag_value(args: list[str], index: int) -> bool:
    """Whether ``args[index]`` is the value of a preceding ``--flag value`` pair."""
    return index > 0 and args[index - 1].startswith("--") and "=" not in args[index - 1]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Progress lines of long stages are shown without --verbose (Beam's own INFO chatter is not).
    logging.getLogger(PROGRESS_LOGGER).setLevel(logging.INFO)
    if not args.verbose:
        # Beam logs a failed worker's traceback before re-raising; an InputError is shown once, as one line.
        for handler in logging.getLogger().handlers:
            handler.addFilter(lambda record: not mentions_input_error(record.getMessage()))
    unexpected = [arg for index, arg in enumerate(beam_args)
                  if not arg.startswith("-") and not _is_flag_value(beam_args, index)]
    if unexpected:
        parser.error(f"unexpected arguments: {' '.join(unexpected)}")
    try:
        return dispatch(args, beam_args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # the one place errors become the user interface
        message = input_error_message(error)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
