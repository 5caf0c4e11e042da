"""all: parse -> dictionary -> mentions -> embed-entities -> index, then validate and report.

Each stage is the same one its own command runs, with the same resume rule: a stage whose recorded outputs
are complete and whose inputs and options are unchanged is skipped, so a rerun after a crash starts at the
stage that did not finish. A stage whose upstream outputs changed sees other input fingerprints and reruns.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from artifacts import layout
from artifacts.counters import Counter
from artifacts.run import lock, manifest
from artifacts.run.report.build import write_report
from artifacts.run.validation import validate_run
from pipelines import dictionary, embed_entities, index, mentions, parse, refresh
from pipelines.launcher import stage as stage_runner

# (command name, stage) in pipeline order.
PIPELINE: tuple[tuple[str, stage_runner.Stage], ...] = tuple(
    (layout.STAGE_COMMANDS[stage.name], stage)
    for stage in (parse.STAGE, dictionary.STAGE, mentions.STAGE, embed_entities.STAGE, index.STAGE)
)
STAGE_COMMANDS = tuple(name for name, _ in PIPELINE)


def declared_counters() -> dict[str, Mapping[str, Counter]]:
    """Every stage's counter declarations, by stage and counter name (what the report shows for each counter: a
    name two stages count, ``non_finite_vectors``, is a mention's in one and a passage's in the other)."""
    return {stage.name: stage.counters for _, stage in PIPELINE}


@dataclass(frozen=True)
class StageTiming:
    command: str
    ran: bool
    seconds: float


def forced_stages(force: list[str] | None) -> set[str]:
    """Stage names to rerun: none without --force, every stage for a bare --force, else the named ones."""
    if force is None:
        return set()
    commands = dict(PIPELINE)
    return {commands[name].name for name in (force or STAGE_COMMANDS)}


def previous_refusal(previous: str, configs: dict[str, Any], completed: Collection[str]) -> str | None:
    """Why a stage that borrows vectors (embed-entities, index) would refuse ``previous`` under --require-reuse
    after hours of the stages before it, as far as its records and this run's options tell: it lacks a manifest or
    a stage that lends, it was built with other options or models, or it kept no mention vectors. None when no
    stage would (a stage OUT holds already is left to its rerun: OLD_OUT may be gone by then; validating OLD_OUT is
    left to the stages)."""
    borrowing = {layout.EMBED_ENTITIES_STAGE, layout.INDEX_STAGE} - set(completed)
    if not borrowing:
        return None
    lacking = refresh.previous_lacks(previous, (*embed_entities.PREVIOUS_STAGES, layout.INDEX_STAGE))
    if lacking is not None:
        return lacking
    old = manifest.load(previous)
    embed, built = configs[layout.EMBED_ENTITIES_STAGE], configs[layout.INDEX_STAGE]
    sampled = manifest.canonical_options(mentions.STAGE.options(configs[layout.MENTIONS_STAGE]))
    problems = [embed_entities.incompatibility(old, sampled, embed, embed_entities.window_salt(embed))
                if layout.EMBED_ENTITIES_STAGE in borrowing else None,
                index.incompatibility(old, built, built.encoder) if layout.INDEX_STAGE in borrowing else None]
    return next(filter(None, problems), None)


def preflight(args: argparse.Namespace, beam_args: list[str]) -> None:
    """Fail before hour one, not at hour nine: every stage's config is built (the flags are checked already), every
    model, the corpus and the index factory are checked (and the device, when the workers run on this machine), and
    with --require-reuse the previous run can lend what the stages that borrow vectors would take from it
    (``previous_refusal``)."""
    from encoders.mask_encoder import check_mask_model

    configs = {stage.name: stage.config(args) for _, stage in PIPELINE}
    if args.previous and args.require_reuse:
        refusal = previous_refusal(str(args.previous), configs, manifest.load(args.output))
        if refusal is not None:
            raise refresh.ReuseRefusedError(f"cannot reuse the previous run: {refusal}")
    device_here = stage_runner.workers_run_here(beam_args)
    embed = configs[layout.EMBED_ENTITIES_STAGE]
    check_mask_model(embed.spec, embed.layer, embed.max_seq_length, device_here)
    index.check_before_encoding(configs[layout.INDEX_STAGE], device_here)


def run_stages(args: argparse.Namespace, beam_args: list[str]) -> list[StageTiming]:
    forced = forced_stages(args.force)
    timings = []
    for command, stage in PIPELINE:
        started = time.monotonic()
        _, ran = stage_runner.execute(stage, args, beam_args, force=stage.name in forced)
        timings.append(StageTiming(command, ran, time.monotonic() - started))
    return timings


def format_timings(timings: list[StageTiming]) -> str:
    lines = ["stage            state     wall time"]
    lines += [f"{timing.command:<16} {'ran' if timing.ran else 'skipped':<9} {timing.seconds:9.1f}s"
              for timing in timings]
    lines.append(f"{'total':<26} {sum(timing.seconds for timing in timings):9.1f}s")
    return "\n".join(lines)


def validate_and_report(args: argparse.Namespace) -> int:
    """Validate the finished run (exit 1 with the problems), then write its report unless --no-report."""
    problems = validate_run(args.output)
    if problems:
        print(f"{args.output} does not validate:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    print(f"[validate] {args.output}: every artifact matches the manifest and its schema", file=sys.stderr)
    if not args.no_report:
        print(f"[report] {write_report(args.output, declared_counters())}", file=sys.stderr)
    return 0


class RunAllCommand:
    """Run every stage (parse -> dictionary -> mentions -> embed-entities -> index), then validate and report."""

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        preflight(args, beam_args)
        with lock.hold(args.output, stage_runner.command_line()):  # held across stages, validate and report
            timings = run_stages(args, beam_args)
            print(format_timings(timings), file=sys.stderr)
            return validate_and_report(args)


COMMAND = RunAllCommand()
