"""publish: copy a validated run to DEST, manifest.json last (logic: artifacts.run.publish)."""

from __future__ import annotations

import argparse
import sys

from artifacts.errors import InputError, NoRoomError
from artifacts.run import manifest
from artifacts.run.manifest import MANIFEST_NAME
from artifacts.run.owned import ForeignFileError
from artifacts.run.publish import (
    ForeignLatestError,
    LatestLocationError,
    OverlappingDestinationError,
    publish_run,
)
from pipelines.launcher import disk_space


class PublishCommand:
    """publish: copy a validated run (every manifest file and report/) to DEST, manifest.json written last."""

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        space = disk_space.space_of(args.to)
        try:
            summary = publish_run(args.output, args.to, latest=args.latest, free_bytes=space.free,
                                  kept=args.with_mention_vectors)
        except NoRoomError as error:
            raise disk_space.no_room_error("publish", args.to, "--to", error.need, "to copy the run", space) from error
        except LatestLocationError as error:
            raise InputError(f"--to {error.destination}: with --latest publish to ROOT/NAME (LATEST goes in ROOT)"
                             ) from error
        except OverlappingDestinationError as error:
            raise InputError(f"--to {error.destination} overlaps --output {error.output}: publish to a place "
                             "outside the run") from error
        except ForeignFileError as error:
            raise InputError(f"--to {args.to} already holds {error.path}, which no earlier publish wrote: nothing "
                             "was copied (move it away or publish to another place)") from error
        except ForeignLatestError as error:
            raise InputError(f"--latest: {error.path} is not a LATEST pointer that publish wrote: nothing was "
                             "copied (move it away or publish under another ROOT)") from error
        if args.with_mention_vectors and not keeps_work(args.output):
            print(f"note: --with-mention-vectors: {args.output} keeps no mention vectors (its embed-entities ran with "
                  "--no-mention-vectors, did not run, or it is a copy published without them): the copy has none, and "
                  "a refresh from it encodes every window", file=sys.stderr)
        if summary.unchanged:
            files, copied = len(summary.report), "nothing to copy"
            if files:
                copied = f"its report copied again ({files} file{'' if files == 1 else 's'})"
            print(f"{summary.destination} holds this run already and {summary.latest} names it: {copied}")
            return 0
        if summary.removed:
            print(f"replaced earlier files in {summary.destination}: {', '.join(summary.removed)}")
        for item in summary.files:
            print(f"  {item.path} ({item.bytes:,} bytes)")
        print(f"  {MANIFEST_NAME} (written last)")
        print(f"published {args.output} to {summary.destination}: {len(summary.files) + 1} files, "
              f"{summary.total_bytes:,} bytes")
        if summary.latest is not None:
            print(f"{summary.latest} now names {summary.destination}")
        return 0


def keeps_work(output: str) -> bool:
    """Whether the run's manifest records kept work (what --with-mention-vectors adds to a copy)."""
    return any(manifest.is_kept_work(item.path) for record in manifest.load(output).values() for item in record.outputs)


COMMAND = PublishCommand()
