"""validate: check a run under OUT against its manifest and the artifact contracts (logic: artifacts.run.validation)."""

from __future__ import annotations

import argparse
import sys

from artifacts import layout
from artifacts.run import lock
from artifacts.run.validation import check_run


class ValidateCommand:
    """validate: check every artifact under OUT against the manifest, its schema and the other artifacts."""

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        result = check_run(args.output)
        stages = ", ".join(map(layout.command_of, result.stages)) or "none"
        if result.valid:
            print(f"valid: {args.output} (stages: {stages})")
            return 0
        for problem in result.problems:
            print(problem, file=sys.stderr)
        if writer := lock.live_writer(args.output):  # a stage committing into OUT: its files are moving in now
            print(f"{writer.writing(args.output)}: run validate again once it ends", file=sys.stderr)
        print(f"invalid: {args.output} (stages: {stages}): {len(result.problems)} problem(s)", file=sys.stderr)
        return 1


COMMAND = ValidateCommand()
