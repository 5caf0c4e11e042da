"""The command line: `python run_pipeline.py COMMAND [options] [Beam pipeline options]`."""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from apache_beam.io.filesystems import FileSystems

from artifacts import fs, layout
from artifacts.errors import (
    DamagedManifestError,
    IncompleteRunError,
    InputError,
    InvalidRunError,
    input_error_message,
    mentions_input_error,
)
from pipelines import disk_space, flags
from pipelines import stage as stage_runner
from pipelines.console import own_lines_only
from pipelines.interrupt import (
    INTERRUPTED_EXIT,
    ending_processes_after,
    exit_with_descendants,
    interrupted_line,
    watching_sigint,
)
from pipelines.runners import check_runner
from pipelines.worker_output import ForwardedStderr

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


# One example per command, shown at the end of its --help.
EXAMPLES: dict[str, str] = {
    "parse": "run_pipeline.py parse --dump samples/enwiki-sample-pages-articles-multistream.xml.bz2 --output out/s",
    "dictionary": "run_pipeline.py dictionary --output out/s",
    "mentions": "run_pipeline.py mentions --output out/s --max-mentions 32",
    "embed-entities": "run_pipeline.py embed-entities --output out/s --model bert-base-uncased",
    "index": "run_pipeline.py index --output out/s --encoder facebook/dpr-ctx_encoder-single-nq-base",
    "search": "run_pipeline.py search --output out/s --query 'who taught Alexander the Great' -k 5",
    "evaluate": "run_pipeline.py evaluate --output out/s --questions nq-test.qa.csv",
    "all": "run_pipeline.py all --dump samples/enwiki-sample-pages-articles-multistream.xml.bz2 --output out/s "
           "--model bert-base-uncased --encoder sentence-transformers/all-MiniLM-L6-v2 --encoder-type mean",
    "validate": "run_pipeline.py validate --output out/s",
    "export-kpr": "run_pipeline.py export-kpr --output out/s --to kpr-resources/",
    "publish": "run_pipeline.py publish --output out/s --to gs://bucket/runs/s --latest",
    "report": "run_pipeline.py report --output out/s",
    "diff": "run_pipeline.py diff --old runs/enwiki-20261001 --new runs/enwiki-20261101",
}
# Options a command cannot run without; checked by the commands themselves (one-line errors), marked in --help.
REQUIRED: dict[str, tuple[str, ...]] = {
    "parse": ("--dump",),
    "embed-entities": ("--model",),
    "index": ("--encoder",),
    "all": ("--dump", "--model", "--encoder"),
}
# Commands that write OUT: it must be a writable directory before they start.
WRITERS = (*layout.STAGE_COMMANDS.values(), "all")


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit 2."""

    def error(self, message: str) -> Any:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help with every default that says something (not None or False); examples kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class Command(Protocol):
    """A command that is not a Beam stage (search, evaluate, validate, ...)."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int: ...


def load_command(name: str) -> Any:
    module_name, attribute = COMMANDS[name].split(":")
    return getattr(importlib.import_module(module_name), attribute)


def summary(command: Any, name: str) -> str:
    """The first paragraph of the command's docstring as one sentence, without a leading ``name:``."""
    paragraph = " ".join((command.__doc__ or name).strip().split("\n\n")[0].split())
    return paragraph.removeprefix(f"{name}: ")


def mark_required(parser: argparse.ArgumentParser, flags: tuple[str, ...]) -> None:
    for action in parser._actions:
        if set(action.option_strings) & set(flags):
            action.help = f"{action.help} (required)"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="run_pipeline.py",
        description="Wikipedia dump -> entity resources and indexes for KPR. "
        "Unknown --flags are Beam pipeline options (--runner, --direct_num_workers, ...).",
        allow_abbrev=False,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log Beam's progress messages")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        command = load_command(name)
        text = summary(command, name)
        sub = commands.add_parser(name, help=text, description=text, allow_abbrev=False,
                                  formatter_class=HelpFormatter, epilog=f"example:\n  python {EXAMPLES[name]}")
        if hasattr(command, "run"):
            flags.add_groups(sub, (flags.OUTPUT, flags.PROGRESS, *command.flag_groups))
            sub.add_argument("--force", action="store_true", help="rerun even if the outputs are up to date")
        command.add_arguments(sub)
        mark_required(sub, REQUIRED.get(name, ()))
    return parser


def beam_flags() -> set[str]:
    """Every flag of every registered Beam PipelineOptions class (the gcp/aws/azure ones included)."""
    import apache_beam  # noqa: F401  (registers the option classes of the runners and filesystems)
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    flags: set[str] = set()
    pending = list(PipelineOptions.__subclasses__())
    while pending:
        options_class = pending.pop()
        pending += options_class.__subclasses__()
        # Beam's own parser class: some option classes add value-provider arguments through it.
        parser = _BeamArgumentParser(add_help=False, conflict_handler="resolve")
        options_class._add_argparse_args(parser)
        flags.update(flag for action in parser._actions for flag in action.option_strings)
    return flags


def check_unknown_flags(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> None:
    """Raise an InputError for the first unknown argument that is not a Beam pipeline option."""
    beam = beam_flags()
    ours = [flag for action in command_parser(parser, command)._actions for flag in action.option_strings]
    for index, arg in enumerate(unknown):
        if not arg.startswith("-"):
            if not _is_flag_value(unknown, index):
                raise InputError(f"unexpected argument {arg} for {command}")
            continue
        flag = arg.split("=", 1)[0]
        if flag not in beam:
            close = difflib.get_close_matches(flag, [*ours, *sorted(beam)], n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise InputError(f"unknown option {flag}{hint}")


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    subparsers = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return subparsers.choices[command]


def check_destinations(args: argparse.Namespace) -> None:
    """Local OUT (for the commands that write it) and --to must be writable directories before anything runs."""
    if args.command in WRITERS:
        fs.require_writable_directory(args.output, "--output")
    if getattr(args, "to", None):
        fs.require_writable_directory(args.to, "--to")


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


def configure_logging(verbose: bool, beam_args: list[str]) -> None:
    """Our own lines only, unless --verbose: Beam's INFO chatter and its worker processes' logs are hidden."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if verbose:
        return
    # Beam logs a failed worker's traceback before re-raising; an InputError is shown once, as one line, and
    # Ctrl-C inside a step as the one line of an interrupted stage, a full disk as the one line of its stage.
    for handler in logging.getLogger().handlers:
        handler.addFilter(lambda record: not mentions_input_error(record.getMessage()))
        handler.addFilter(lambda record: not record.getMessage().startswith(stage_runner.INTERRUPTED_STEP))
        handler.addFilter(lambda record: not disk_space.mentions_out_of_space(record.getMessage()))
    if not any(arg.startswith("--default_sdk_harness_log_level") for arg in beam_args):
        beam_args.append("--default_sdk_harness_log_level=ERROR")
    # No weight-loading progress bars: read by huggingface_hub/transformers on import, here and in Beam's
    # worker processes (which inherit the environment).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def worded(error: BaseException) -> BaseException:
    """A typed library error as the command line says it: a setting by its flag, a damaged run with what to do
    about it; any other error as it is."""
    if isinstance(error, DamagedManifestError):
        return InputError(f"{error.message}; it is left as it is: restore it from a copy of the run (one that "
                          "`publish` wrote), or delete it and run the stages again (they recompute everything)")
    if isinstance(error, IncompleteRunError):
        return InputError(f"{error.message}: restore the file, or rerun `python run_pipeline.py "
                          f"{layout.command_of(error.stage)} --output {error.output} --force ...`")
    if isinstance(error, InvalidRunError):
        return InputError(f"{error.message}: `python run_pipeline.py validate --output {error.output}` lists every "
                          "problem")
    return flags.worded(error)


def interrupted(error: KeyboardInterrupt, stderr: ForwardedStderr) -> int:
    """One line for Ctrl-C, naming the stage that ran, past the forwarder that drops what Beam's threads and worker
    processes print as they stop; later log records (Beam's threads) are dropped."""
    logging.disable(logging.CRITICAL)
    stderr.write_past(interrupted_line(getattr(error, "command", None)))
    return INTERRUPTED_EXIT


def main(argv: Sequence[str] | None = None, exit_at_ctrl_c: bool = False) -> int:
    """Run one command; its exit status. Ctrl-C before the arguments are parsed raises KeyboardInterrupt; after,
    it is one line and INTERRUPTED_EXIT, and with ``exit_at_ctrl_c`` (the command line) the process and the ones it
    started end right there, while what Beam's threads print as they stop still goes nowhere."""
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    with (watching_sigint() as sigint, ending_processes_after(sigint),
          own_lines_only(args.verbose, beam_args, sigint) as stderr):
        try:
            check_unknown_flags(parser, args.command, beam_args)
            check_runner(beam_args)
            configure_logging(args.verbose, beam_args)
            check_destinations(args)
            return dispatch(args, beam_args)
        except KeyboardInterrupt as error:
            code = interrupted(error, stderr)
            if exit_at_ctrl_c:
                exit_with_descendants(code)
            return code
        except Exception as error:  # the one place errors become the user interface
            message = input_error_message(worded(error))
            if message is None:
                raise
            print(f"error: {message}", file=sys.stderr)
            return 2
