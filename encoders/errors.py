"""Typed errors of the encoders (a bad option is an ``artifacts.errors.SettingError``), worded for the command
line by pipelines/."""

from __future__ import annotations

from artifacts.errors import InputError


class MissingRunArtifactError(InputError):
    """An artifact of the run that the encoder reads (a KPR encoder's linker or entity embeddings) is missing;
    ``stage`` is the stage that writes it."""

    def __init__(self, message: str, stage: str) -> None:
        super().__init__(message)
        self.stage = stage
