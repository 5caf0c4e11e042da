"""On PYTHONPATH for a test (``torch_free_workers``): in a Beam SDK worker process, importing torch or transformers
fails. The GPU stages' inputs are built by such workers from the tokenizer the launcher saved; only the process
that holds the model needs either (a local run's model process is the launcher's, not a worker).

Python imports ``sitecustomize`` at start-up from its path; the worker processes of a multi-processing run inherit
the environment, so each of them has this guard and the launcher (not started as ``sdk_worker_main``) does not.
"""

from __future__ import annotations

import importlib.abc
import sys

FORBIDDEN = ("torch", "transformers")


class ForbidImports(importlib.abc.MetaPathFinder):
    """Refuse the forbidden top-level packages with an ImportError naming them."""

    def find_spec(self, name, path, target=None):
        if name.split(".", 1)[0] in FORBIDDEN:
            raise ImportError(f"a Beam worker process imported {name} (torch_free_workers)")
        return None


if "apache_beam.runners.worker.sdk_worker_main" in getattr(sys, "orig_argv", ()):
    sys.meta_path.insert(0, ForbidImports())
