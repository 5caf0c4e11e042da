"""Entry point: `python run_pipeline.py STAGE [options] [Beam pipeline options]` (see README.md)."""

import logging
import sys


def _not_optional_gcp_noise(record: logging.LogRecord) -> bool:
    # Beam warns on import when the optional GCP client libraries are absent; they are an extra here.
    return "apitools not found" not in record.getMessage()


if __name__ == "__main__":
    logging.getLogger().addFilter(_not_optional_gcp_noise)
    from pipelines.cli import main

    sys.exit(main())
