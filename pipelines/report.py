"""report: an HTML page (OUT/report/index.html) with plots of every stage recorded in OUT/manifest.json."""

from __future__ import annotations

import argparse
import shlex
import sys

from artifacts import fs, layout
from artifacts.errors import InputError, RunStateError
from artifacts.run.diff.runs import complete_records
from artifacts.run.report.build import NoManifestError, write_report
from pipelines.diff import note_writers
from pipelines.run_all import declared_counters


class ReportCommand:
    """report: write OUT/report/index.html: per stage wall time, rows read and written, drops and errors,
    entity, dictionary and embedding distributions, and the index's recall against exact search."""

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        if args.previous:
            if fs.resolved(args.previous) == fs.resolved(args.output):
                raise InputError(f"--previous {args.previous} is this run's own --output: name the run to compare it "
                                 "with (or leave --previous out: a refresh is compared with the run it read)")
            complete_records(args.previous)  # a wrong --previous is the user's error, not a report problem
        try:
            path = write_report(args.output, declared_counters(), recall_queries=args.recall_queries,
                                max_exact=args.max_exact, previous=args.previous)
        except NoManifestError as error:
            raise RunStateError(args.output, f"{args.output} has no {layout.MANIFEST}", "run a stage first (e.g. "
                                f"`python run_pipeline.py parse --dump FILE --output {shlex.quote(args.output)}`)"
                                ) from error
        note_writers((args.output, *([args.previous] if args.previous else [])), "the report")
        print(path)
        sys.stdout.flush()
        return 0


COMMAND = ReportCommand()
