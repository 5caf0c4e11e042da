"""Entry point: `python run_pipeline.py STAGE [options] [Beam pipeline options]` (see README.md)."""

import sys

from pipelines.cli import main

if __name__ == "__main__":
    sys.exit(main())
