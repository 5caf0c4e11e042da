"""report: an HTML page (OUT/report/index.html) with plots of every stage recorded in OUT/manifest.json."""

from __future__ import annotations

import argparse
import sys

from artifacts import layout
from artifacts.errors import InputError
from artifacts.run.diff.runs import complete_records
from artifacts.run.report import write_report
from artifacts.run.report.build import NoManifestError
from artifacts.run.report.recall import MAX_EXACT, QUERIES
from pipelines.run_all import declared_counters


class ReportCommand:
    """report: write OUT/report/index.html: per stage wall time, rows read and written, drops and errors,
    entity, dictionary and embedding distributions, and the index's recall against exact search."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--output", required=True, help="OUT: the directory the stages wrote")
        parser.add_argument("--recall-queries", type=int, default=QUERIES,
                            help="stored passage vectors used as queries to measure the index's recall")
        parser.add_argument("--max-exact", type=int, default=MAX_EXACT,
                            help="at most this many stored vectors are searched exactly for the recall")
        parser.add_argument("--previous", metavar="OLD_OUT",
                            help="compare with this earlier run (default: the previous run OUT's manifest "
                                 "records, if it was built with --previous)")

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        if args.recall_queries < 1 or args.max_exact < 1:
            raise InputError("--recall-queries and --max-exact must be at least 1")
        if args.previous:
            complete_records(args.previous)  # a wrong --previous is the user's error, not a report problem
        try:
            path = write_report(args.output, declared_counters(), recall_queries=args.recall_queries,
                                max_exact=args.max_exact, previous=args.previous)
        except NoManifestError as error:
            raise InputError(f"{args.output} has no {layout.MANIFEST}: run a stage first (e.g. `python "
                             f"run_pipeline.py parse --dump FILE --output {args.output}`)") from error
        print(path)
        sys.stdout.flush()
        return 0


COMMAND = ReportCommand()
