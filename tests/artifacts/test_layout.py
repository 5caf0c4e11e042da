"""artifacts/layout.py is the one place that names stages, their commands, their order and their artifacts."""

from __future__ import annotations

from artifacts import layout
from artifacts.run.report.stages import StageView
from pipelines import run_all
from pipelines.launcher import cli


def test_all_runs_the_stages_in_the_declared_order_under_their_commands() -> None:
    assert [stage.name for _, stage in run_all.PIPELINE] == list(layout.STAGE_ORDER)
    assert run_all.STAGE_COMMANDS == ("parse", "dictionary", "mentions", "embed-entities", "index")
    assert [layout.STAGE_COMMANDS[name] for name in layout.STAGE_ORDER] == list(run_all.STAGE_COMMANDS)


def test_every_stage_command_is_a_cli_command_that_writes_out() -> None:
    assert set(layout.STAGE_COMMANDS.values()) <= set(cli.COMMANDS)
    assert cli.WRITERS == ("parse", "dictionary", "mentions", "embed-entities", "index", "all")


def test_stages_write_the_declared_artifacts() -> None:
    outputs = {stage.name: stage.outputs for _, stage in run_all.PIPELINE}
    assert outputs == {
        "parse": (layout.ARTICLES, layout.REDIRECTS),
        "dictionary": (layout.ENTITIES, layout.DICTIONARY),
        "mentions": (layout.MENTIONS,),
        "embed_entities": (layout.ENTITY_EMBEDDINGS, layout.ENTITY_ID_MAP, layout.MENTION_VECTORS),
        "index": (layout.INDEX, layout.PASSAGES),
    }
    assert (layout.NAMES, layout.LINKER) == ("dictionary/names", "dictionary/linker")
    assert layout.errors_of(layout.INDEX_STAGE) == "errors/index"


def test_the_report_names_a_stage_by_its_command() -> None:
    assert StageView(layout.EMBED_ENTITIES_STAGE, None).command == "embed-entities"
    assert StageView("some_new_stage", None).command == "some-new-stage"
