"""``diff_runs``: what changed between an older run (OLD) and a newer one (NEW), as numbers with stable names.

A part is compared when the stage that writes it is recorded in both manifests (else it is None). Reuse
counters (``entities_reused``, ``passages_encoded``, ...) are read from NEW's manifest, where a refresh with
``--previous`` records them; what was reused is None unless that refresh read OLD (a run built without
``--previous``, or refreshed from another run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from artifacts import fs, layout
from artifacts.errors import IncompleteRunError, InputError, RunStateError
from artifacts.run import manifest, publish, verified
from artifacts.run.diff import rows
from artifacts.run.diff.keyed import Change, compare
from artifacts.run.diff.vectors import VECTOR_BUDGET, CosineHistogram, vector_movement
from artifacts.run.validation.files import stale_stages

NOT_RECORDED = "n/a (not refreshed from the old run)"  # a reuse counter that is not NEW's reuse of OLD
# NEW was refreshed from OLD's path when it held another run: what it reused is not known of the run there now
CHANGED_SINCE = ("n/a (refreshed from the old run's path when it held another run: its manifest.json has changed "
                 "since)")
# (label, RunDiff attribute, what "changed" means for it): the rows of the diff table, in order
PARTS = (("articles", "articles", "changed"), ("redirects", "redirects", "retargeted"),
         ("entities", "entities", ""), ("dictionary names", "names", "top candidate changed"),
         ("passages", "passages", "changed"))


class NotARunError(RunStateError):
    """OLD or NEW (``output``) is not a run: no manifest, or one with no stage."""


@dataclass(frozen=True)
class VectorReuse:
    """Entity vectors or passages taken from the previous run vs computed anew (None: not recorded, ``unknown``
    says why)."""

    reused: int | None
    computed: int | None
    unknown: str = NOT_RECORDED

    def shown(self, value: int | None) -> str:
        """A count of this reuse (``reused`` or ``computed``) as the diff and the report write it."""
        return self.unknown if value is None else f"{value:,}"


@dataclass(frozen=True)
class RunDiff:
    old: str
    new: str
    articles: Change | None = None
    redirects: Change | None = None  # changed = retargeted
    entities: Change | None = None
    names: Change | None = None  # changed = the top candidate changed
    entity_vectors: CosineHistogram | None = None
    entity_reuse: VectorReuse | None = None
    passages: Change | None = None
    passage_reuse: VectorReuse | None = None
    passage_sources: tuple[str, str] | None = None  # where OLD's and NEW's indexed passages came from
    stale: tuple[str, ...] = ()  # "RUN: stage X was built from other Y outputs ...": its parts are not current
    options: tuple[str, ...] = ()  # "STAGE: name: old -> new": a stage both ran with other options

    def to_json(self) -> dict[str, Any]:
        """One JSON object with fixed keys (a part not compared is null)."""
        return {
            "old": self.old, "new": self.new,
            "articles": _counts(self.articles, "changed"),
            "redirects": _counts(self.redirects, "retargeted"),
            "entities": _counts(self.entities, None),
            "names": _counts(self.names, "top_candidate_changed"),
            "entity_vectors": _vectors_json(self.entity_vectors, self.entity_reuse),
            "passages": _passages_json(self.passages, self.passage_reuse, self.passage_sources),
            "stale": list(self.stale),
            "options": list(self.options),
        }


def _counts(change: Change | None, changed_key: str | None) -> dict[str, int] | None:
    if change is None:
        return None
    counts = {"old": change.old, "new": change.new, "added": change.added, "removed": change.removed}
    return counts | ({changed_key: change.changed} if changed_key else {})


def _vectors_json(histogram: CosineHistogram | None, reuse: VectorReuse | None) -> dict[str, Any] | None:
    if histogram is None:
        return None
    compared = histogram.comparable
    return {"reused": reuse.reused, "recomputed": reuse.computed, "old_dim": histogram.old_dim,
            "new_dim": histogram.new_dim, "matched": histogram.matched if compared else None,
            "cosine_histogram": histogram.as_dict() if compared else None}


def _passages_json(change: Change | None, reuse: VectorReuse | None,
                   sources: tuple[str, str] | None) -> dict[str, Any] | None:
    counts = _counts(change, "changed")
    if counts is None or reuse is None or sources is None:
        return None
    return counts | {"reused": reuse.reused, "encoded": reuse.computed, "old_source": sources[0],
                     "new_source": sources[1]}


def passage_source(record: manifest.StageRecord) -> str:
    """Where the passages of a recorded index stage came from, as a person reads it."""
    corpus = record.options.get("corpus")
    if corpus:
        return f"the corpus {corpus}"
    return f"passages of {record.options.get('words_per_passage')} words cut from {layout.ARTICLES}/"


def complete_records(output: str) -> dict[str, manifest.StageRecord]:
    """The manifest's stages of a run whose recorded files are all there; else a one-line error."""
    if not fs.exists(manifest.manifest_path(output)):
        raise NotARunError(output, f"{output} is not a run: it has no {manifest.MANIFEST_NAME}")
    records = manifest.load(output)
    if not records:
        raise NotARunError(output, f"{output} is not a run: its {manifest.MANIFEST_NAME} records no stage")
    require_complete(output, records)
    return records


def require_complete(output: str, records: dict[str, manifest.StageRecord]) -> None:
    """``IncompleteRunError`` for the first recorded file of ``output`` that is gone or resized since, or, on a
    local disk, whose content is not the manifest's (kept work aside, ``mention_vectors/``: no reader here reads
    it). Files this machine committed or checked before are only stat'ed (``verified``)."""
    read = {name: [item for item in records[name].outputs if not manifest.is_kept_work(item.path)]
            for name in sorted(records, key=layout.stage_rank)}
    for name, items in read.items():
        if problems := manifest.files_missing_or_changed(output, items):
            raise IncompleteRunError(output, name, problems[0])
    for name, items in read.items():
        if (problem := verified.changed_local_content(output, items)) is not None:
            raise IncompleteRunError(output, name, problem)


def _reuse(record: manifest.StageRecord, old: str, reused: str, *computed: str) -> VectorReuse:
    """What a refresh reused and computed (the first of the ``computed`` counters the stage recorded); reused is
    None unless the stage was refreshed from ``old`` (without --previous its reuse counter says what a resumed run
    took from its killed one; from another run, what it took from that one)."""
    unknown = not_refreshed_from(record, old)
    counted = next((record.counters[name] for name in computed if name in record.counters), None)
    return VectorReuse(None if unknown else record.counters.get(reused), counted, unknown or NOT_RECORDED)


def not_refreshed_from(record: manifest.StageRecord, old: str) -> str | None:
    """None when ``record``'s stage reused the run ``old``: the manifest its --previous read is OLD's (wherever OLD
    is now; OLD a published copy of it), or, where that was not recorded, its --previous is OLD's path; else why
    its reuse is not OLD's (``NOT_RECORDED``, or ``CHANGED_SINCE`` when it read OLD's path when another run was
    there)."""
    previous = record.options.get(manifest.PREVIOUS_OPTION)
    digest = record.options.get(manifest.PREVIOUS_SHA_OPTION)
    if not isinstance(previous, str) or not previous or digest == manifest.GONE:  # GONE: it had no run to reuse
        return NOT_RECORDED
    same_path = fs.resolved(previous) == fs.resolved(old)
    if digest:
        path = manifest.manifest_path(old)
        if fs.exists(path) and digest in (fs.sha256(path), publish.source_manifest_sha256(old)):
            return None
        return CHANGED_SINCE if same_path else NOT_RECORDED
    return None if same_path else NOT_RECORDED


def flat_options(options: dict[str, Any]) -> dict[str, Any]:
    """A stage's recorded options with those of a nested object named ``outer.inner`` (the index's ``encoder``)."""
    flat: dict[str, Any] = {}
    for name, value in options.items():
        flat.update({f"{name}.{inner}": item for inner, item in value.items()} if isinstance(value, dict)
                    else {name: value})
    return flat


# A stage's options that name a model (as ``flat_options`` names them), by the role under which the stage records
# its files' content digest (``content:ROLE``: embed-entities' model, the index's passage and query encoders).
MODEL_OPTIONS = {"model": "model", "encoder.model": "encoder", "encoder.query_model": "query_encoder"}


def recorded_changes(old: manifest.StageRecord, new: manifest.StageRecord) -> list[str]:
    """The options that differ between two records of a stage, a local model by its files' content where both
    record it (as the stages reuse vectors): the same files at another path are no change, other files at the same
    path are (``ROLE: model files changed``)."""
    old_options, new_options = flat_options(old.options), flat_options(new.options)
    changed = []
    for option, role in MODEL_OPTIONS.items():
        digests = (old.inputs.get(f"{manifest.CONTENT}{role}"), new.inputs.get(f"{manifest.CONTENT}{role}"))
        if None in digests or option not in old_options or option not in new_options:
            continue
        if digests[0] == digests[1]:
            old_options[option] = new_options[option]
        elif old_options[option] == new_options[option]:
            changed.append(f"{role}: model files changed")
    return manifest.option_changes(old_options, new_options) + changed


def diff_runs(old: str, new: str, vector_budget: int = VECTOR_BUDGET) -> RunDiff:
    """Compare the parts of ``old`` and ``new`` that both runs have (``vector_budget``: bytes of old vectors
    held at once)."""
    if fs.resolved(old) == fs.resolved(new):
        raise InputError(f"{old} and {new} are the same run: nothing to compare (name two runs)")
    old_records, new_records = complete_records(old), complete_records(new)
    stale = tuple(f"{run}: {problem}" for run, records in ((old, old_records), (new, new_records))
                  for problem in stale_stages(records))
    parts: dict[str, Any] = {"stale": stale}
    both = set(old_records) & set(new_records)
    if not both:
        raise InputError(f"{old} and {new} have no stage in common: nothing to compare")
    parts["options"] = tuple(f"{layout.command_of(stage)}: {'; '.join(changes)}"
                             for stage in sorted(both, key=layout.stage_rank)
                             if (changes := recorded_changes(old_records[stage], new_records[stage])))
    if layout.PARSE_STAGE in both:
        parts["articles"] = compare(rows.articles(old), rows.articles(new))
        parts["redirects"] = compare(rows.redirects(old), rows.redirects(new))
    if both & {layout.DICTIONARY_STAGE, layout.EMBED_ENTITIES_STAGE}:
        old_entities, new_entities = rows.matched_entities(old, new)
        if layout.DICTIONARY_STAGE in both:
            parts["entities"] = compare(old_entities.keyed, new_entities.keyed)
            parts["names"] = compare(rows.names(old, old_entities), rows.names(new, new_entities))
        if layout.EMBED_ENTITIES_STAGE in both:
            parts["entity_vectors"] = vector_movement(old, old_entities, new, new_entities, vector_budget)
            # a run built without --previous records no entities_recomputed: it computed every vector it has
            parts["entity_reuse"] = _reuse(new_records[layout.EMBED_ENTITIES_STAGE], old, "entities_reused",
                                           "entities_recomputed", "entities_embedded")
    if layout.INDEX_STAGE in both:
        parts["passages"] = compare(rows.passages(old), rows.passages(new))
        parts["passage_reuse"] = _reuse(new_records[layout.INDEX_STAGE], old, "passages_reused",
                                       "passages_encoded")
        parts["passage_sources"] = (passage_source(old_records[layout.INDEX_STAGE]),
                                    passage_source(new_records[layout.INDEX_STAGE]))
    return RunDiff(old, new, **parts)
