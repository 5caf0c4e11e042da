"""Entry point: `python run_pipeline.py STAGE [options] [Beam pipeline options]` (see README.md)."""

import contextlib
import ctypes
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
# glibc serves blocks below its mmap threshold from the heap, and raises that threshold (up to 32 MB) as large
# blocks are freed, so freed Arrow buffers stay in the process: a fixed 128 KB threshold gives them back (-24 MB
# in the dictionary stage at 40,000 articles, same CPU). Worker processes read the variable when they start; this
# process is told with mallopt (M_MMAP_THRESHOLD = -3), where the C library has it.
MALLOC_MMAP_THRESHOLD = 128 << 10


def return_freed_memory() -> None:
    """The fixed mmap threshold, for this process and the worker processes it starts."""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(MALLOC_MMAP_THRESHOLD))
    with contextlib.suppress(OSError, AttributeError):  # not glibc: its allocator has no such threshold
        ctypes.CDLL(None).mallopt(-3, MALLOC_MMAP_THRESHOLD)


if __name__ == "__main__":
    os.environ.setdefault(*ARROW_MEMORY_POOL)
    return_freed_memory()
    logging.getLogger().addFilter(_not_optional_gcp_noise)
    try:
        from pipelines.cli import main

        code = main(exit_at_ctrl_c=True)
    except KeyboardInterrupt:  # before main() took Ctrl-C over: while the libraries and commands are imported
        print(interrupted_line(None), file=sys.stderr)
        code = INTERRUPTED_EXIT
    sys.exit(code)
