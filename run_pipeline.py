"""Entry point: `python run_pipeline.py STAGE [options] [Beam pipeline options]` (see README.md)."""

import gc
import os
import sys

from artifacts import allocator
from pipelines.launcher.interrupt import INTERRUPTED_EXIT, interrupted_line
from pipelines.launcher.worker_output import leave_out_optional_gcp_warning

# Arrow's default allocator (mimalloc) keeps what it freed in each thread's heap: the dictionary stage held 86 MB
# more with it than with the system allocator, at the same CPU. Set before pyarrow is imported; local worker
# processes inherit it.
ARROW_MEMORY_POOL = ("ARROW_DEFAULT_MEMORY_POOL", "system")
# glibc's allocator, for this process (mallopt, where the C library has it) and the worker processes it starts
# (which read the variables when they start): (variable, mallopt parameter, value).
# - A fixed 1 MB mmap threshold: glibc serves blocks below the threshold from the heap and maps larger ones; left
#   to itself it raises the threshold (up to 32 MB) as large blocks are freed, so freed Arrow buffers stayed in the
#   process (-24 MB in the dictionary stage at 40,000 articles with a fixed one). Fixed at 128 KB, every Parquet
#   page buffer (~1 MB) was mapped, faulted in and unmapped anew. 40,000 articles, one core, 2026-11-28,
#   128 KB -> 1 MB: the index stage (writing its staged, kept and shard files) 89 -> 80-82 s and 1,001-1,010 ->
#   1,018-1,021 MB; the dictionary 279 -> 286 MB and mentions 197 -> 207 MB at the same CPU. At 4 MB the index
#   took 76-77 s, but mentions held 214 MB.
# - An arena a core (at least 2): glibc gives threads arenas of their own (up to 8 a core), and a Beam worker's gRPC
#   and bundle threads kept what each had freed: embed-entities' largest worker process held 758 MB with 2 workers
#   at 40,000 articles on 2 cores against 722 MB with 2 arenas (the single process of 1 worker: 736 MB against
#   729 MB), at less CPU. A core's worth keeps the fast tokenizer's threads (one a core) from sharing arenas.
MALLOC_SETTINGS = ((allocator.FIXED_THRESHOLD, allocator.M_MMAP_THRESHOLD, 1 << 20),
                   (allocator.ARENA_MAX, allocator.M_ARENA_MAX, max(2, os.cpu_count() or 1)))


def return_freed_memory() -> None:
    """glibc's MALLOC_SETTINGS, for this process and the worker processes it starts, unless the user set them."""
    library = allocator.glibc()  # None: not glibc, its allocator has no such setting
    for variable, parameter, value in MALLOC_SETTINGS:
        if variable in os.environ:
            continue
        os.environ[variable] = str(value)
        if library is not None:
            library.mallopt(parameter, value)


def exit_without_last_collections(code: int) -> None:
    """Exit with ``code``, the objects alive now left out of the interpreter's last garbage collections
    (``gc.freeze``): they walked every object torch and transformers made, ~0.9 s at the end of each command that
    had loaded a model (2026-11-29, this machine: importing torch and transformers alone, 3.5 -> 2.6 s). The atexit
    handlers run as before (Beam's stop its worker pools); what a command opened it has closed."""
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    os.environ.setdefault(*ARROW_MEMORY_POOL)
    return_freed_memory()
    leave_out_optional_gcp_warning()
    try:
        from pipelines.launcher.cli import main

        code = main(exit_at_ctrl_c=True)
    except KeyboardInterrupt:  # before main() took Ctrl-C over: while the libraries and commands are imported
        print(interrupted_line(None), file=sys.stderr)
        code = INTERRUPTED_EXIT
    exit_without_last_collections(code)
