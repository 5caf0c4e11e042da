"""The benchmarks' no-op model: the model forward of the GPU stages replaced by an output of the right shape.

Python imports ``sitecustomize`` at start-up from its path, so putting this directory first on PYTHONPATH
reaches every interpreter of a run: the stage's process and Beam's worker subprocesses (multi_processing starts
fresh interpreters, which inherit the environment). Nothing is imported here until the pipeline imports the
encoder modules itself: an import hook patches them as they load. What stays real: reading, tokenizing,
batching, Beam, writing, and the model's loading. The forward returns unit vectors that depend on the input's
token ids only (rows of a table of random ones, which the ids' sum picks; a zero vector would be dead-lettered):
equal for equal inputs, as incompressible as a real model's, and a run's entity embeddings tell entities apart as
`validate` requires.

With ``KPR_NO_OP_MODEL_MARKERS`` set to a directory, each process that patches an encoder writes a file there
named ``PID-MODULE``, so a benchmark can count the processes the no-op forward reached.

With ``KPR_STAND_IN`` set to ``TOKENS_PER_SECOND:CLOCK_FILE`` the forward also stands in for ONE GPU of that speed:
each call waits as long as the GPU would take for its padded tokens, and every process of the run shares the
GPU's clock (the file holds when the GPU is next free, read and moved on under a lock), so calls from several
processes queue as they would on one device. It waits by sleeping: no CPU. A real card's rate is its ceiling at
a path's length in sequences a second times that length (README "GPUs").

With ``KPR_PACED_REAL`` set as well, the real forward runs after the wait: real vectors at no more than the stand-in
GPU's speed (the tests that kill a stage mid-encoding use it to have a middle to kill it in).
"""

from __future__ import annotations

import fcntl
import functools
import importlib.abc
import importlib.machinery
import os
import struct
import sys
import time
from collections.abc import Callable
from types import ModuleType

MARKERS = "KPR_NO_OP_MODEL_MARKERS"
STAND_IN = "KPR_STAND_IN"
PACED_REAL = "KPR_PACED_REAL"
_FREE_AT = struct.Struct("<d")  # the clock file: when the stand-in GPU is next free (seconds since the epoch)


def stand_in_wait(tokens: int, setting: str | None = None) -> float:
    """With ``KPR_STAND_IN`` (or ``setting``) as ``TOKENS_PER_SECOND:CLOCK_FILE``: book ``tokens`` on the shared
    GPU's clock and sleep until that work would be done; returns the seconds slept (0 without a stand-in)."""
    setting = os.environ.get(STAND_IN) if setting is None else setting
    if not setting:
        return 0.0
    rate, clock = setting.split(":", 1)
    descriptor = os.open(clock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        stored = os.pread(descriptor, _FREE_AT.size, 0)
        free_at = _FREE_AT.unpack(stored)[0] if len(stored) == _FREE_AT.size else 0.0
        done = max(time.time(), free_at) + tokens / float(rate)
        os.pwrite(descriptor, _FREE_AT.pack(done), 0)
    finally:
        os.close(descriptor)  # the lock goes with it
    wait = max(0.0, done - time.time())
    time.sleep(wait)
    return wait


VECTOR_TABLE_ROWS = 8192  # distinct vectors the no-op forward returns (12 MB at 384 dims: beyond zstd's window)


@functools.lru_cache(maxsize=4)
def _vector_table(dim: int):
    """VECTOR_TABLE_ROWS random unit vectors of ``dim`` values, the same in every process: as incompressible as a
    real model's, so that writing and reading them costs what it costs with real vectors (the vectors returned
    before, equal entries but one, compressed ~150-fold and made every Parquet write of them look free)."""
    import numpy

    vectors = numpy.random.default_rng(dim).standard_normal((VECTOR_TABLE_ROWS, dim), dtype=numpy.float32)
    return vectors / numpy.linalg.norm(vectors, axis=1, keepdims=True)


def _unit_vectors(torch, ids, dim: int):
    """A unit-length vector per row of the padded ``ids`` (a CPU tensor): the table's row that the row's id sum
    picks (never a zero vector, equal for equal inputs). Made by numpy: torch's ops run on its OpenMP threads, which
    spin waiting for cores the tokenizer's threads hold (5% of embed-entities' host side with one worker on 2
    cores; the same with OMP_NUM_THREADS=1)."""
    picked = ids.numpy().astype("int64").sum(axis=1) % VECTOR_TABLE_ROWS
    return torch.from_numpy(_vector_table(dim)[picked])


def _no_op_mask_forward(self, host: tuple):
    """MaskEncoder._forward_host: (padded ids, attention, [MASK] positions) -> one vector per row."""
    rows, longest = host[0].shape
    stand_in_wait(rows * longest)
    return _unit_vectors(self._torch, host[0], self.model.config.hidden_size)


def _no_op_dense_forward(self, inputs: dict):
    """DenseEncoder._forward_inputs (and KPR's): device inputs of a batch -> one vector per row."""
    rows, longest = inputs["input_ids"].shape
    stand_in_wait(rows * longest)
    return _unit_vectors(self._torch, inputs["input_ids"].cpu(), self.dim)


def _paced(forward: Callable) -> Callable:
    """``forward`` (a batch's host tuple or device inputs -> vectors) run after the stand-in GPU's wait."""
    def paced(self, batch):
        rows, longest = (batch[0] if isinstance(batch, tuple) else batch["input_ids"]).shape
        stand_in_wait(rows * longest)
        return forward(self, batch)

    return paced


# module -> (class, method, replacement)
PATCHES: dict[str, tuple[str, str, Callable]] = {
    "encoders.mask_encoder": ("MaskEncoder", "_forward_host", _no_op_mask_forward),
    "encoders.retrievers": ("DenseEncoder", "_forward_inputs", _no_op_dense_forward),
    "encoders.kpr": ("KPREncoder", "_forward_inputs", _no_op_dense_forward),
}


def patch(module: ModuleType) -> None:
    """Replace the forward method PATCHES names for ``module`` (with ``KPR_PACED_REAL``: pace it); fail loudly if
    the encoder no longer has it (the benchmark would otherwise measure the real model)."""
    class_name, method, replacement = PATCHES[module.__name__]
    owner = getattr(module, class_name, None)
    if owner is None or method not in vars(owner):
        raise AttributeError(f"no-op model: {module.__name__}.{class_name}.{method} is gone; update {__file__}")
    setattr(owner, method, _paced(vars(owner)[method]) if os.environ.get(PACED_REAL) else replacement)
    markers = os.environ.get(MARKERS)
    if markers:
        open(os.path.join(markers, f"{os.getpid()}-{module.__name__}"), "w").close()


class _PatchingLoader(importlib.abc.Loader):
    """Runs a module's own loader, then ``patch``."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        patch(module)

    def __getattr__(self, name: str):  # get_source, get_filename, … of the real loader
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the PATCHES modules as the other finders would, with a loader that patches them once loaded."""

    def find_spec(self, name: str, path=None, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader)
        return spec


sys.meta_path.insert(0, _PatchOnImport())
