"""The manifest and the files: stale upstream fingerprints, missing or changed files, unreadable Parquet files
and files the manifest does not list."""

from __future__ import annotations

import pyarrow as pa

from artifacts import fs, layout
from artifacts.run import manifest
from artifacts.run.validation.contracts import CONTRACTS, contract_problems, missing_parts
from artifacts.run.validation.recorded import RecordedRun, message, parquet_footer


def stale_stages(stages: dict[str, manifest.StageRecord]) -> list[str]:
    """Stages whose recorded upstream fingerprints are not those of the recorded upstream outputs."""
    problems = [f"{manifest.MANIFEST_NAME}: stage {stage!r} is none of this pipeline's "
                f"({', '.join(layout.STAGE_ORDER)})" for stage in sorted(stages) if stage not in layout.STAGE_ORDER]
    for stage, record in sorted(stages.items(), key=lambda item: (layout.stage_rank(item[0]), item[0])):
        name = layout.command_of(stage)
        problems += [f"{manifest.MANIFEST_NAME}: stage {name} read stage {layout.command_of(upstream)}, which is not "
                     "recorded" for upstream in manifest.read_stages(record) if upstream not in stages]
        problems += [f"{manifest.MANIFEST_NAME}: stage {name} was built from other {layout.command_of(upstream)} "
                     f"outputs than the recorded ones: rerun {name}"
                     for upstream in manifest.rebuilt_since(record, stages)]
    return problems


def integrity_problems(run: RecordedRun) -> list[str]:
    """Recorded files that are missing or differ in size or sha256 from the manifest."""
    problems = []
    for record in run.stages.values():
        found = manifest.missing_or_changed(run.output, record, deep=True)
        problems += found
        run.broken.update(item.path for item in record.outputs
                          if any(problem.startswith(f"{item.path}: ") for problem in found))
    return problems


def parquet_problems(run: RecordedRun) -> list[str]:
    """Recorded Parquet files that do not open, have other row counts or break the schema contract."""
    problems = []
    for relative, item in sorted(run.files.items()):
        if not relative.endswith(".parquet") or relative in run.broken:
            continue
        try:
            rows, schema = parquet_footer(run.path(relative))
        except (pa.ArrowException, OSError) as error:
            run.broken.add(relative)
            problems.append(f"{relative}: not a readable Parquet file ({message(error)})")
            continue
        if item.rows is None or rows != item.rows:
            run.broken.add(relative)  # later checks count rows from the manifest
            problems.append(f"{relative}: the manifest records no row count" if item.rows is None
                            else f"{relative}: {rows} rows, manifest says {item.rows}")
        found = contract_problems(relative, schema)
        if found:
            run.broken.add(relative)  # later checks read these columns
            problems += [f"{relative}: {problem}" for problem in found]
    return problems


def part_problems(run: RecordedRun) -> list[str]:
    """Artifacts written in N parts whose recorded files are not the N; a stage that writes one file per bucket
    (embed-entities) with none: readers took the rest of the artifact for all of it (an entity without its vector
    exported as a zero row)."""
    problems = [problem for directory, contract in CONTRACTS.items() if contract.in_parts
                for problem in missing_parts(directory, sorted(path for path in run.files
                                                               if path.startswith(directory)))]
    if layout.EMBED_ENTITIES_STAGE in run.stages and not any(path.startswith(f"{layout.ENTITY_EMBEDDINGS}/")
                                                             for path in run.files):
        problems.append(f"{layout.ENTITY_EMBEDDINGS}/: no file in the manifest (embed-entities writes one per bucket "
                        "of entities)")
    return problems


def stray_files(run: RecordedRun) -> list[str]:
    """Files in an artifact directory (a recorded one, or one a stage writes) that the manifest does not list: a
    stage reading its upstream artifact globs ``*.parquet`` (a stale or partial write would be read as part of
    it; the report, export and search read only recorded files), and a published copy would carry the rest. A
    stage killed while it committed leaves its files with no record at all."""
    writers = {directory: stage for stage, directories in layout.STAGE_OUTPUTS.items() for directory in
               (*directories, layout.errors_of(stage))}
    directories = {manifest.artifact_directory(path) for path in run.files if "/" in path} | set(writers)
    problems = []
    for directory in sorted(directories):
        for path in fs.list_tree(run.path(directory)):
            relative = fs.relative(path, run.output)
            if relative in run.files:
                continue
            if writers.get(directory) not in (None, *run.stages):
                command = layout.command_of(writers[directory])
                why = f"no '{command}' stage is recorded: one cut off before its commit ended"
            else:
                why = "a stale or partial write" if relative.endswith(".parquet") else "no stage recorded it"
            problems.append(f"{relative}: not in the manifest ({why})")
    return problems

