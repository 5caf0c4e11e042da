"""Entry point: `python run_pipeline.py STAGE [options] [Beam pipeline options]` (see README.md)."""

import logging
import os
import sys

from pipelines.interrupt import INTERRUPTED_EXIT, interrupted_line


def _not_optional_gcp_noise(record: logging.LogRecord) -> bool:
    # Beam warns on import when the optional GCP client libraries are absent; they are an extra here.
    return "apitools not found" not in record.getMessage()


# Arrow's default allocator (mimalloc) keeps what it freed in each thread's heap: the dictionary stage held 86 MB
# more with it than with the system allocator, at the same CPU. Set before pyarrow is imported; local worker
# processes inherit it.
ARROW_MEMORY_POOL = ("ARROW_DEFAULT_MEMORY_POOL", "system")

if __name__ == "__main__":
    os.environ.setdefault(*ARROW_MEMORY_POOL)
    logging.getLogger().addFilter(_not_optional_gcp_noise)
    try:
        from pipelines.cli import main

        code = main(exit_at_ctrl_c=True)
    except KeyboardInterrupt:  # before main() took Ctrl-C over: while the libraries and commands are imported
        print(interrupted_line(None), file=sys.stderr)
        code = INTERRUPTED_EXIT
    sys.exit(code)
