"""Environment variables set for a block, in this process and the processes it starts (Beam's local workers)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def environment_variable(name: str, value: str) -> Iterator[None]:
    """Set ``name`` in this process's environment (and its children's) while the block runs, then restore it."""
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


@contextlib.contextmanager
def environment_variables(values: Mapping[str, str]) -> Iterator[None]:
    """``environment_variable`` for each of ``values`` while the block runs."""
    with contextlib.ExitStack() as stack:
        for name, value in values.items():
            stack.enter_context(environment_variable(name, value))
        yield
