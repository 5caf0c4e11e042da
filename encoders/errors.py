"""Typed errors of the encoders: what is wrong with which option, worded for the command line by pipelines/."""

from __future__ import annotations

from artifacts.errors import InputError


class EncoderOptionError(InputError):
    """An encoder option (an ``EncoderOptions`` field) that cannot work. ``template`` is the message with
    ``{name}`` where the option is named: the library names the field, the command line its flag."""

    def __init__(self, option: str, template: str) -> None:
        super().__init__(template.format(name=f"encoder option {option}"))
        self.option, self.template = option, template

    def worded(self, name: str) -> str:
        """The message naming the option ``name`` (e.g. its flag)."""
        return self.template.format(name=name)


class MissingRunArtifactError(InputError):
    """An artifact of the run that the encoder reads (a KPR encoder's linker or entity embeddings) is missing;
    ``stage`` is the stage that writes it."""

    def __init__(self, message: str, stage: str) -> None:
        super().__init__(message)
        self.stage = stage
