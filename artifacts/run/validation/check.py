"""``check_run``: every check, in the order that lets a file that failed once be skipped by later ones."""

from __future__ import annotations

from dataclasses import dataclass

from artifacts import layout
from artifacts.errors import InvalidRunError
from artifacts.run import manifest
from artifacts.run.validation.entities import check_embeddings, check_entities, check_names
from artifacts.run.validation.files import (
    integrity_problems,
    parquet_problems,
    part_problems,
    stale_stages,
    stray_files,
)
from artifacts.run.validation.index import check_index, check_passages
from artifacts.run.validation.mentions import check_articles, check_mentions
from artifacts.run.validation.recorded import RecordedRun


@dataclass(frozen=True)
class Validation:
    """The stages checked and the problems found (none: the run is valid)."""

    output: str
    stages: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def valid(self) -> bool:
        return not self.problems


def validate_run(output: str) -> list[str]:
    """Human-readable problems of the run under ``output``, each naming its file (empty: valid)."""
    return list(check_run(output).problems)


def check_run(output: str) -> Validation:
    """Validate every stage recorded in ``output``'s manifest."""
    stages = manifest.load(output)  # a damaged manifest is not a run to validate: DamagedManifestError
    if not stages:
        return Validation(output, (), (f"{manifest.MANIFEST_NAME}: missing or empty, no stage has completed "
                                       f"under {output}",))
    run = RecordedRun.of(output, stages)
    problems = stale_stages(stages)
    problems += integrity_problems(run)  # marks the files deeper checks must skip, so it goes first
    problems += parquet_problems(run)
    problems += part_problems(run)
    problems += stray_files(run)
    problems += semantic_problems(run)
    return Validation(output, tuple(sorted(stages)), tuple(problems))


def require_valid(output: str, with_kept_work: bool = True) -> None:
    """``InvalidRunError`` unless the run under ``output`` validates; without ``with_kept_work``, problems of the
    stages' kept work (``mention_vectors/``, which no stage reads) do not count: what publishes or exports the run
    without it is not refused for it (a deleted kept work cost a stage's rerun: hours of GPU)."""
    problems = [problem for problem in validate_run(output)
                if with_kept_work or not manifest.is_kept_work(problem.split(":", 1)[0])]
    if problems:
        raise InvalidRunError(output, problems)


def semantic_problems(run: RecordedRun) -> list[str]:
    problems: list[str] = []
    entities = articles = None
    if layout.PARSE_STAGE in run.stages:
        articles, found = check_articles(run)
        problems += found
    if layout.MENTIONS_STAGE in run.stages:
        problems += check_mentions(run, articles)
    if layout.DICTIONARY_STAGE in run.stages:
        entities, found = check_entities(run)
        problems += found + check_names(run)
    if layout.EMBED_ENTITIES_STAGE in run.stages and entities is not None:
        problems += check_embeddings(run, entities)
    if layout.INDEX_STAGE in run.stages:
        problems += check_index(run) + check_passages(run)
    return problems

