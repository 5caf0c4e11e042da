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

With ``KPR_STAND_IN`` set to ``TOKENS_PER_SECOND:CLOCK_FILE`` the forward also stands in for ONE GPU of that speed
(``StandInCard``): each call books as long as the GPU would take for its padded tokens, and every process of the run
shares the GPU's clock (the file holds when the GPU is next free, read and moved on under a lock), so calls from
several processes queue as they would on one device. As a CUDA device's, a forward returns once queued: the host
goes on (the next batch, the model's own Python) while the card works, up to ``QUEUED`` forwards ahead of it, and
waits for the card when it reads results back (``encoders.batching.to_host``, patched to wait for the process's
forwards first). It waits by sleeping: no CPU. A real card's rate is its ceiling at a path's length in sequences a
second times that length (README "GPUs").

With ``KPR_PACED_REAL`` set as well, the real forward runs after the booking: real vectors at no more than the
stand-in GPU's speed (the tests that kill a stage mid-encoding use it to have a middle to kill it in).
"""

from __future__ import annotations

import collections
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


QUEUED = 2  # forwards a process may have on the stand-in GPU before it waits (a CUDA queue holds more)


def book(tokens: int, setting: str) -> float:
    """Book ``tokens`` on the shared GPU's clock of ``setting`` (``TOKENS_PER_SECOND:CLOCK_FILE``): after what is
    booked already, or from now when the GPU is idle; returns when that work is done (seconds since the epoch)."""
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
    return done


def sleep_until(moment: float) -> float:
    """Sleep until ``moment`` (seconds since the epoch); returns the seconds slept."""
    wait = max(0.0, moment - time.time())
    time.sleep(wait)
    return wait


class StandInCard:
    """One process's forwards on the stand-in GPU of ``setting`` (``TOKENS_PER_SECOND:CLOCK_FILE``; empty: none,
    nothing waits). ``forward`` books a forward's tokens and returns once it is queued, waiting only while
    ``QUEUED`` of this process's forwards are unfinished; ``synchronize`` waits until all are done, as reading a
    result back from a CUDA device does. Both return the seconds slept."""

    def __init__(self, setting: str | None) -> None:
        self._setting = setting or ""
        self._unfinished: collections.deque[float] = collections.deque()  # when each queued forward is done

    def forward(self, tokens: int) -> float:
        if not self._setting:
            return 0.0
        self._unfinished.append(book(tokens, self._setting))
        waited = 0.0
        while len(self._unfinished) > QUEUED:
            waited += sleep_until(self._unfinished.popleft())
        return waited

    def synchronize(self) -> float:
        waited = sleep_until(self._unfinished[-1]) if self._unfinished else 0.0
        self._unfinished.clear()
        return waited


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


def _no_op_mask_forward(card: StandInCard, _forward: Callable) -> Callable:
    """MaskEncoder._forward_host: (padded ids, attention, [MASK] positions) -> one vector per row."""
    def forward(self, host: tuple):
        rows, longest = host[0].shape
        card.forward(rows * longest)
        return _unit_vectors(self._torch, host[0], self.model.config.hidden_size)

    return forward


def _no_op_dense_forward(card: StandInCard, _forward: Callable) -> Callable:
    """DenseEncoder._forward_inputs (and KPR's): device inputs of a batch -> one vector per row."""
    def forward(self, inputs: dict):
        rows, longest = inputs["input_ids"].shape
        card.forward(rows * longest)
        return _unit_vectors(self._torch, inputs["input_ids"].cpu(), self.dim)

    return forward


def _paced(card: StandInCard, forward: Callable) -> Callable:
    """``forward`` (a batch's host tuple or device inputs -> vectors) run once booked on the stand-in GPU."""
    def paced(self, batch):
        rows, longest = (batch[0] if isinstance(batch, tuple) else batch["input_ids"]).shape
        card.forward(rows * longest)
        return forward(self, batch)

    return paced


def _synchronized(card: StandInCard, to_host: Callable) -> Callable:
    """``encoders.batching.to_host``, which reads results back, once the process's forwards are done."""
    @functools.wraps(to_host)
    def synchronized(*args, **kwargs):
        card.synchronize()
        return to_host(*args, **kwargs)

    return synchronized


# module -> (the class whose method is replaced, or "" for a function of the module; its name; what makes the
# replacement of one process from its stand-in GPU and the original; whether it is the model's forward)
PATCHES: dict[str, tuple[str, str, Callable[[StandInCard, Callable], Callable], bool]] = {
    "encoders.mask_encoder": ("MaskEncoder", "_forward_host", _no_op_mask_forward, True),
    "encoders.retrievers": ("DenseEncoder", "_forward_inputs", _no_op_dense_forward, True),
    "encoders.kpr": ("KPREncoder", "_forward_inputs", _no_op_dense_forward, True),
    "encoders.batching": ("", "to_host", _synchronized, False),
}


def patch(module: ModuleType, card: StandInCard) -> None:
    """Replace what PATCHES names for ``module`` (a forward with ``KPR_PACED_REAL``: paced, the real one kept);
    fail loudly if the encoder no longer has it (the benchmark would otherwise measure the real model)."""
    class_name, name, replacement, is_forward = PATCHES[module.__name__]
    owner = getattr(module, class_name, None) if class_name else module
    if owner is None or name not in vars(owner):
        where = ".".join(filter(None, (module.__name__, class_name, name)))
        raise AttributeError(f"no-op model: {where} is gone; update {__file__}")
    if is_forward and os.environ.get(PACED_REAL):
        replacement = _paced
    setattr(owner, name, replacement(card, vars(owner)[name]))
    markers = os.environ.get(MARKERS)
    if markers and is_forward:
        open(os.path.join(markers, f"{os.getpid()}-{module.__name__}"), "w").close()


class _PatchingLoader(importlib.abc.Loader):
    """Runs a module's own loader, then ``patch``."""

    def __init__(self, loader: importlib.abc.Loader, card: StandInCard) -> None:
        self._loader, self._card = loader, card

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        patch(module, self._card)

    def __getattr__(self, name: str):  # get_source, get_filename, … of the real loader
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds the PATCHES modules as the other finders would, with a loader that patches them once loaded; holds
    the process's stand-in GPU (``KPR_STAND_IN``)."""

    def __init__(self) -> None:
        self._card = StandInCard(os.environ.get(STAND_IN))

    def find_spec(self, name: str, path=None, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, self._card)
        return spec


sys.meta_path.insert(0, _PatchOnImport())
