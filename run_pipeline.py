"""Entry point: `python run_pipeline.py STAGE [options] [Beam pipeline options]` (see README.md)."""

import logging
import os
import sys


def _not_optional_gcp_noise(record: logging.LogRecord) -> bool:
    # Beam warns on import when the optional GCP client libraries are absent; they are an extra here.
    return "apitools not found" not in record.getMessage()


if __name__ == "__main__":
    logging.getLogger().addFilter(_not_optional_gcp_noise)
    from pipelines.cli import main

    code = main()
    if code == 130:  # interrupted: Beam's worker threads would print tracebacks or hold up the exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
