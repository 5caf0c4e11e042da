"""The command line: `python run_pipeline.py COMMAND [options] [Beam pipeline options]`."""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import importlib.util
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from artifacts import fs, layout
from artifacts.errors import (
    DENIED,
    DamagedManifestError,
    IncompleteRunError,
    InputError,
    InvalidRunError,
    RunStateError,
    denied_in_text,
    error_chain,
    first_line,
    input_error_message,
)
from artifacts.run import lock
from encoders.errors import mentions_gpu_out_of_memory
from pipelines.launcher import disk_space, flags
from pipelines.launcher.commands import COMMANDS
from pipelines.launcher.console import output_closed, own_lines_only
from pipelines.launcher.interrupt import (
    INTERRUPTED_EXIT,
    INTERRUPTED_STEP,
    ending_processes_after,
    exit_with_descendants,
    interrupted_line,
    watching_sigint,
)
from pipelines.launcher.worker_output import OWN_ERROR, ForwardedStderr, said_in_one_line

# Commands that write OUT: it must be a writable directory before they start.
WRITERS = (*layout.STAGE_COMMANDS.values(), "all")
# Commands that keep no work to resume from when they are stopped: they read runs (report writes a page anew).
READERS = ("diff", "evaluate", "report", "search", "validate")
# Beam options that the model's pipeline takes from the command, not from --model-pipeline-options.
WHOLE_RUN_FLAGS = {"--runner": "both pipelines of a stage run on the command's runner",
                   "--direct_num_workers": "--model-workers sets the processes that hold the model",
                   "--direct_running_mode": "--model-workers sets the processes that hold the model"}


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and exit 2."""

    def error(self, message: str) -> Any:
        if message.endswith("expected one argument"):  # also a value that starts with "-", read as a flag
            flag = message.removeprefix("argument ").split(":", 1)[0].split("/", 1)[0]
            message += f" (a value that starts with '-' goes after '=': {flag}='...')"
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help with every default that says something (not None or False, nor a switch's: ``--no-x`` stores False and
    defaults to True; a default of 0 is shown); examples kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        switch = action.nargs == 0  # store_true / store_false: the flag's name says what it does
        unsaid = switch or action.default is None or action.default is False or action.default is argparse.SUPPRESS
        if "%(default)" in text or "(default: " in text or unsaid or not action.option_strings:
            return text
        return f"{text} (default: {'empty' if action.default == '' else '%(default)s'})"


def load_command(name: str) -> Any:
    """The stage or command object that runs ``name`` (its module imported now: Beam, torch, ...)."""
    module_name, attribute = COMMANDS[name].implementation.split(":")
    return getattr(importlib.import_module(module_name), attribute)


def mark_required(parser: argparse.ArgumentParser, flags: tuple[str, ...]) -> None:
    for action in parser._actions:
        if set(action.option_strings) & set(flags):
            action.help = f"{action.help} (required)"


VERBOSE_HELP = "log Beam's progress messages and its worker processes' output"
BEAM_DOWNLOAD_NOTICE = "Apache Beam is downloading dependencies from a public repository"
# Beam's warning of a --direct_num_workers without a running mode that starts workers (runners.check_option_values
# says it in our words).
IN_MEMORY_NOTICE = "If direct_num_workers is not equal to 1, direct_running_mode should be"


def build_parser() -> argparse.ArgumentParser:
    """Every command's flags (``pipelines.launcher.commands``): built without importing the code that runs them."""
    parser = OneLineParser(
        prog="run_pipeline.py",
        description="Wikipedia dump -> entity resources and indexes for KPR. "
        "Unknown --flags are Beam pipeline options (--runner, --direct_num_workers, ...).",
        allow_abbrev=False,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub = commands.add_parser(name, help=command.summary, description=command.summary, allow_abbrev=False,
                                  formatter_class=HelpFormatter, epilog=f"example:\n  python {command.example}")
        # after the command too; unset when not given there, so that one given before it stays
        sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
        flags.add_groups(sub, command.groups)
        mark_required(sub, tuple(flags.flag_of(dest) for dest, _ in command.required))
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
    """Raise an InputError for the first unknown argument that is not a Beam pipeline option (Beam's flags are
    read only when there is an unknown flag)."""
    stray = stray_word(unknown)
    if stray is not None:
        raise InputError(f"unexpected argument {stray} for {command}")
    flag = first_unknown_flag(unknown)
    if flag is None:
        return
    others = [name for name in COMMANDS if flag in command_flags(parser, name)]
    if others:
        raise InputError(f"{command} takes no {flag} (an option of {', '.join(others)})")
    raise InputError(unknown_option(flag, command_flags(parser, command)))


def command_flags(parser: argparse.ArgumentParser, command: str) -> list[str]:
    """Every flag of ``command``."""
    return [flag for action in command_parser(parser, command)._actions for flag in action.option_strings]


def stray_word(words: Sequence[str]) -> str | None:
    """The first of ``words`` that is neither a flag nor the value of the flag before it (None: there is none)."""
    return next((word for index, word in enumerate(words)
                 if not word.startswith("-") and not _is_flag_value(words, index)), None)


def first_unknown_flag(words: Sequence[str]) -> str | None:
    """The first flag of ``words`` that Beam does not have (None: every flag is Beam's)."""
    beam = beam_flags() if any(word.startswith("-") for word in words) else set()
    return next((flag for flag in (word.split("=", 1)[0] for word in words if word.startswith("-"))
                 if flag not in beam), None)


def unknown_option(flag: str, suggested: Sequence[str]) -> str:
    """``unknown option --flag``, with the closest of ``suggested`` and Beam's flags when one is close."""
    close = difflib.get_close_matches(flag, [*suggested, *sorted(beam_flags())], n=1, cutoff=0.6)
    return f"unknown option {flag}" + (f" (did you mean {close[0]}?)" if close else "")


def check_model_pipeline_options(args: argparse.Namespace) -> None:
    """--model-pipeline-options: Beam options only, none that the two pipelines must share (``WHOLE_RUN_FLAGS``)."""
    words = flags.model_pipeline_options(args)
    stray, flag = stray_word(words), first_unknown_flag(words)
    problem = (f"unexpected argument {stray}" if stray is not None
               else unknown_option(flag, ()) if flag is not None else None)
    if problem:
        raise InputError(f"--model-pipeline-options: {problem}")
    for word in words:
        flag = word.split("=", 1)[0]
        if flag in WHOLE_RUN_FLAGS:
            raise InputError(f"--model-pipeline-options cannot set {flag}: {WHOLE_RUN_FLAGS[flag]}")


def command_parser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    subparsers = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return subparsers.choices[command]


# The flags that name a run or a place written to, and the characters Beam's filesystems read as a pattern there.
RUN_PATH_FLAGS = ("output", "to", "previous", "old", "new")
WILDCARDS = "*?["
READ_RUN_FLAGS = ("output", "old", "new")  # the runs that validate, search, report, diff, ... read


def check_run_paths(args: argparse.Namespace) -> None:
    """No run or destination named with a wildcard: Beam's filesystems match and delete such a path as a pattern
    (``run?`` also matches ``runA``: every stage failed, and could have read or deleted another run's files)."""
    for dest in RUN_PATH_FLAGS:
        value = getattr(args, dest, None)
        if isinstance(value, str) and any(char in value for char in WILDCARDS):
            raise InputError(f"--{dest} {value}: a path with * ? or [ is read as a pattern by Beam's filesystems "
                             "(it could match other directories): name it without them")


def check_destinations(args: argparse.Namespace) -> None:
    """Local OUT (for the commands that write it) and --to must be writable directories before anything runs; the
    runs the other commands read, directories."""
    if args.command in WRITERS:
        fs.require_writable_directory(args.output, "--output")
    if getattr(args, "to", None):
        fs.require_writable_directory(args.to, "--to")
    for dest in () if args.command in WRITERS else READ_RUN_FLAGS:
        if isinstance(value := getattr(args, dest, None), str):
            fs.require_run_directory(value, f"--{dest}")


def dispatch(args: argparse.Namespace, beam_args: list[str]) -> int:
    """Import the command's code (Beam, torch, ...: the arguments are checked) and run it."""
    from apache_beam.io.filesystems import FileSystems

    from pipelines.launcher import stage as stage_runner

    command = load_command(args.command)
    # Filesystem flags (e.g. --s3_access_key_id) also reach what the driver itself reads and writes under OUT.
    FileSystems.set_options(stage_runner.beam_pipeline_options(beam_args))
    COMMANDS[args.command].check_inputs(args)
    if hasattr(command, "run"):
        stage_runner.execute(command, args, beam_args, force=args.force)
        return 0
    return command.main(args, beam_args)


def _is_flag_value(args: Sequence[str], index: int) -> bool:
    """Whether ``args[index]`` is the value of a preceding ``--flag value`` pair."""
    return index > 0 and args[index - 1].startswith("--") and "=" not in args[index - 1]


def configure_logging(verbose: bool, beam_args: list[str]) -> None:
    """Our own lines only, unless --verbose: Beam's INFO chatter and its worker processes' logs are hidden."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if verbose:
        return
    # Beam logs a failed worker's traceback before re-raising; an InputError, a full disk or a refused write is
    # shown once, as one line, and Ctrl-C inside a step as the one line of an interrupted stage, a GPU out of memory
    # as the one line of its stage.
    for handler in logging.getLogger().handlers:
        handler.addFilter(lambda record: not said_in_one_line(record.getMessage()))
        handler.addFilter(lambda record: not record.getMessage().startswith(INTERRUPTED_STEP))
        handler.addFilter(lambda record: not mentions_gpu_out_of_memory(record.getMessage()))
        # Beam's notice before it fetches a job server jar from Maven Central (FlinkRunner, SparkRunner): six lines
        # for each mirror tried; a jar it cannot fetch is our one line (runners.worded)
        handler.addFilter(lambda record: BEAM_DOWNLOAD_NOTICE not in record.getMessage())
        handler.addFilter(lambda record: IN_MEMORY_NOTICE not in record.getMessage())
        # the error messages of a job that runs elsewhere (its workers' tracebacks, hundreds of lines): its
        # failure is one line (jobs.waited)
        handler.addFilter(lambda record: not (record.module == "portable_runner" and record.levelno >= logging.ERROR))
    if not any(arg.startswith("--default_sdk_harness_log_level") for arg in beam_args):
        beam_args.append("--default_sdk_harness_log_level=ERROR")
    # No weight-loading progress bars: read by huggingface_hub/transformers on import, here and in Beam's
    # worker processes (which inherit the environment).
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


# What Beam's FileSystems says of a URL whose scheme no installed filesystem reads, and where it names the URL.
NO_FILESYSTEM, NO_FILESYSTEM_PATH = "Unable to get filesystem from specified path", "Path specified: "


# The packages of the clients Beam's gs://, s3://, hdfs:// and azfs:// filesystems call: their errors (a bucket
# refused or missing, no credentials, a network that retried past its deadline) come from the storage service, not
# from this project.
STORAGE_CLIENTS = ("google.api_core.", "google.auth.", "botocore.", "boto3.", "hdfs.", "azure.core.", "azure.storage.")


def path_errors(error: BaseException) -> dict[object, BaseException]:
    """The errors Beam's filesystems collected path by path in ``error`` (a BeamIOError's details, by path or
    (source, destination), those of a BeamIOError among them in its place: a match wraps each path's exists());
    none for another error."""
    details = getattr(error, "exception_details", None)
    if not isinstance(details, dict):
        return {}
    return {path: detail for key, error_of_path in details.items()
            for path, detail in (path_errors(error_of_path) or {key: error_of_path}).items()}


def storage_client_error(error: BaseException) -> BaseException | None:
    """``error`` when a storage client library raised it, or the first such error among those Beam's filesystems
    collected path by path (``path_errors``); None otherwise. Checked by module: they may not be installed."""
    for candidate in (error, *path_errors(error).values()):
        if any(kind.__module__.startswith(STORAGE_CLIENTS) for kind in type(candidate).__mro__):
            return candidate
    return None


def anonymous_gcs(refusal: BaseException) -> str:
    """What to add to a refusal of Google's storage service when Beam asked it without credentials because its gcp
    extra (google-auth-httplib2) is not installed: a private bucket refuses such a caller whatever credentials the
    machine has."""
    google = type(refusal).__module__.startswith("google.")
    if not google or importlib.util.find_spec("google_auth_httplib2") is not None:
        return ""
    return "; Beam asked it without credentials: its gcp extra is not installed here (pip install -e \".[gcp]\")"


def denied_write(error: BaseException) -> OSError | None:
    """The permission error (EACCES, EPERM, EROFS) in ``error``'s chain or among what Beam's filesystems collected
    path by path (``path_errors``; each wrapped as an ``IOError`` of it), with its file name, or one its text names
    (a worker process's, re-raised by Beam as text); None otherwise."""
    for current in error_chain(error):
        for collected in (current, *path_errors(current).values()):
            for candidate in (collected, *collected.args):
                if isinstance(candidate, OSError) and candidate.errno in DENIED:
                    return candidate
    return denied_in_text(str(error))


def missing_client_library(error: BaseException) -> tuple[str, str] | None:
    """(path, Beam's words) when Beam's filesystem for a path's scheme is installed but not its client library,
    among ``path_errors``: s3:// without boto3 (an AssertionError), hdfs:// without hdfs (an ImportError), azfs://
    without azure-storage-blob (a NameError of Beam's module); None otherwise."""
    for path, detail in path_errors(error).items():
        if isinstance(detail, AssertionError) and str(detail).startswith("Missing ") and "requirement" in str(detail):
            return str(path), str(detail)
        if isinstance(detail, (ImportError, NameError)):
            return str(path), f"{type(detail).__name__}: {detail}"
    return None


def worded(error: BaseException) -> BaseException:
    """A typed library error as the command line says it: a setting by its flag, a damaged run with what to do
    about it, a job server jar Beam cannot download with the flag that gives it, a storage service's refusal; any other
    error as it is."""
    if isinstance(error, RunStateError) and (writer := lock.live_writer(error.output)):
        return InputError(f"{error.what}: {writer.writing(error.output)}: run this again once it ends")
    if isinstance(error, DamagedManifestError):
        return InputError(f"{error.message}; it is left as it is: restore it from a copy of the run (one that "
                          "`publish` wrote), or delete it and run the stages again (they recompute everything)")
    if isinstance(error, IncompleteRunError):
        return InputError(f"{error.message}: restore the file, or rerun `python run_pipeline.py "
                          f"{layout.command_of(error.stage)} --output {shlex.quote(error.output)} --force ...`")
    if isinstance(error, InvalidRunError):
        return InputError(f"{error.message}: `python run_pipeline.py validate --output {shlex.quote(error.output)}` "
                          "lists every problem")
    if isinstance(error, ValueError) and str(error).startswith(NO_FILESYSTEM):
        path = str(error).rsplit(NO_FILESYSTEM_PATH, 1)[-1]
        return InputError(f"no filesystem here reads {path}: a URL needs Beam's filesystem for its scheme (gs:// with "
                          "pip install -e \".[gcp]\", s3:// with \".[aws]\"); a local path has no scheme")
    if (missing := missing_client_library(error)) is not None:
        return InputError(f"{missing[0]}: Beam's filesystem for it lacks its client library ({missing[1]}): "
                          "pip install -e \".[aws]\" for s3://, \".[gcp]\" for gs://, pip install hdfs for hdfs://, "
                          "azure-storage-blob and azure-identity for azfs://")
    if (refusal := storage_client_error(error)) is not None:
        summary = str(refusal).splitlines()[0] if str(refusal) else type(refusal).__name__
        return InputError(f"the storage service refused or did not answer ({summary}): check the URL, the credentials "
                          f"this machine uses for it and its network{anonymous_gcs(refusal)}")
    if input_error_message(error) is not None:  # ours already (a stage's full disk): as it is
        return flags.worded(error)
    if (code := disk_space.out_of_space(error)) is not None:  # a command's output, an export's copy
        what = "no space left on the device written to" if code == errno.ENOSPC else \
            f"a write refused ({os.strerror(code)})"
        return InputError(f"{what} ({first_line(error)}): the output (or the file the standard output was redirected "
                          "to) is incomplete; free some space (or raise the limit) and run the command again")
    if (denied := denied_write(error)) is not None:
        return InputError(f"{denied.filename or 'a file'}: {denied.strerror}: this user may not change (or read) it "
                          "(its permissions, a read-only filesystem, a file marked immutable with chattr +i): fix that "
                          "and run the command again")
    if isinstance(error, (RuntimeError, ValueError)):  # Beam's, from a run: a jar it cannot download, a runner's
        from pipelines.launcher import runners  # refusal of the options

        error = runners.worded(error)
    return flags.worded(error)


def interrupted(error: KeyboardInterrupt, stderr: ForwardedStderr, command: str) -> int:
    """One line for Ctrl-C of ``command``, naming the stage that ran, past the forwarder that drops what Beam's
    threads and worker processes print as they stop; later log records (Beam's threads) are dropped."""
    logging.disable(logging.CRITICAL)
    stderr.write_past(interrupted_line(getattr(error, "command", None), command not in READERS))
    return INTERRUPTED_EXIT


def main(argv: Sequence[str] | None = None, exit_at_ctrl_c: bool = False) -> int:
    """Run one command; its exit status. Ctrl-C before the arguments are parsed raises KeyboardInterrupt; after,
    it is one line and INTERRUPTED_EXIT, and with ``exit_at_ctrl_c`` (the command line) the process and the ones it
    started end right there, while what Beam's threads print as they stop still goes nowhere."""
    parser = build_parser()
    try:
        args, beam_args = parser.parse_known_args(argv)
    except InputError as error:  # a value a flag's type refused
        return refused(error)
    with (watching_sigint() as sigint, ending_processes_after(sigint),
          own_lines_only(args.verbose, beam_args, sigint) as stderr):
        try:
            COMMANDS[args.command].check(args)
            check_run_paths(args)
            check_unknown_flags(parser, args.command, beam_args)
            check_model_pipeline_options(args)
            if beam_args or args.command in WRITERS:
                from pipelines.launcher import runners  # Beam: imported once the arguments are checked

                runners.check_runner(beam_args, flags.model_pipeline_options(args))  # the values of both
                if args.command in WRITERS:  # the commands that run Beam pipelines
                    paths = flags.local_paths(command_parser(parser, args.command), args)
                    model_args = flags.model_pipeline_options(args)
                    added, model_added = runners.prepare_workers(beam_args, paths, model_args)
                    beam_args += added
                    if model_added:
                        args.model_pipeline_options = [*model_args, *model_added]
            configure_logging(args.verbose, beam_args)
            check_destinations(args)
            code = dispatch(args, beam_args)
            sys.stdout.flush()  # the rest of its output: a reader gone is seen here, not as the interpreter exits
            return code
        except KeyboardInterrupt as error:
            code = interrupted(error, stderr, args.command)
            if exit_at_ctrl_c:
                exit_with_descendants(code)
            return code
        except BrokenPipeError as error:
            return output_closed(error)
        except Exception as error:
            return refused(error)


def refused(error: Exception) -> int:
    """The one place errors become the user interface: an InputError (a typed one worded) as one line and exit
    status 2; anything else is raised on (a bug, shown as a traceback)."""
    message = input_error_message(worded(error))
    if message is None:
        raise error
    print(f"{OWN_ERROR}{message}", file=sys.stderr)
    return 2
