"""Typed errors of the encoders (a bad option is an ``artifacts.errors.SettingError``), worded for the command
line by pipelines/."""

from __future__ import annotations

from artifacts.errors import InputError, error_chain


class MissingRunArtifactError(InputError):
    """An artifact of the run that the encoder reads (a KPR encoder's linker or entity embeddings) is missing;
    ``stage`` is the stage that writes it."""

    def __init__(self, message: str, stage: str) -> None:
        super().__init__(message)
        self.stage = stage


# torch.OutOfMemoryError's own text (in the error itself, from a step in this process, or in the text of the error
# that carries a worker process's traceback).
GPU_OUT_OF_MEMORY = ("CUDA out of memory",)


def mentions_gpu_out_of_memory(text: str) -> bool:
    return any(words in text for words in GPU_OUT_OF_MEMORY)


def gpu_out_of_memory(error: BaseException) -> bool:
    """Whether ``error``, or an error that led to it, is torch running out of GPU memory."""
    return any(mentions_gpu_out_of_memory(str(current)) for current in error_chain(error))


class GpuMemoryError(InputError):
    """A stage's model ran out of GPU memory: what to change, in one line (raised in the launcher only)."""

    def __init__(self, command: str) -> None:
        super().__init__(f"{command}: the GPU ran out of memory: lower --batch-tokens, or start fewer worker "
                         "processes on each GPU (each loads its own model and holds its own batches)")
