"""The vocabulary of a run, declared once: artifact directory names under OUT, stage names, their commands and
their order. Every module names an artifact or a stage through these constants, never a string of its own."""

from __future__ import annotations

# Artifacts: directories (and files) under OUT, "/"-separated names relative to OUT.
ARTICLES = "articles"
REDIRECTS = "redirects"
ENTITIES = "entities"
DICTIONARY = "dictionary"
NAMES = f"{DICTIONARY}/names"
LINKER = f"{DICTIONARY}/linker"
MENTIONS = "mentions"
ENTITY_EMBEDDINGS = "entity_embeddings"
ENTITY_ID_MAP = "entity_id_map"
MENTION_VECTORS = "mention_vectors"
INDEX = "index"
PASSAGES = "passages"
ERRORS = "errors"  # OUT/errors/STAGE/: one artifact directory per stage
REPORT = "report"
REPORT_STAMP = "manifest.sha256"  # in report/: the sha256 of the manifest.json the report was built from
MANIFEST = "manifest.json"
STAGING = ".staging"  # OUT/.staging/STAGE/: a running stage's outputs before they are committed
KEPT = ".kept"  # OUT/.staging/STAGE.kept/: what a killed run of a stage leaves for its rerun (removed at its commit)
LOCK = ".lock"

# Stages: the name recorded in the manifest (and used in OUT/errors/STAGE/) ...
PARSE_STAGE = "parse"
DICTIONARY_STAGE = "dictionary"
MENTIONS_STAGE = "mentions"
EMBED_ENTITIES_STAGE = "embed_entities"
INDEX_STAGE = "index"
# ... in the order `all` runs them ...
STAGE_ORDER = (PARSE_STAGE, DICTIONARY_STAGE, MENTIONS_STAGE, EMBED_ENTITIES_STAGE, INDEX_STAGE)
# ... and the command that runs each.
STAGE_COMMANDS = {PARSE_STAGE: "parse", DICTIONARY_STAGE: "dictionary", MENTIONS_STAGE: "mentions",
                  EMBED_ENTITIES_STAGE: "embed-entities", INDEX_STAGE: "index"}
# The artifact directories each stage writes (besides its dead letters, errors/STAGE).
STAGE_OUTPUTS = {PARSE_STAGE: (ARTICLES, REDIRECTS), DICTIONARY_STAGE: (ENTITIES, DICTIONARY),
                 MENTIONS_STAGE: (MENTIONS,), EMBED_ENTITIES_STAGE: (ENTITY_EMBEDDINGS, ENTITY_ID_MAP, MENTION_VECTORS),
                 INDEX_STAGE: (INDEX, PASSAGES)}
# The artifacts of an upstream stage a stage reads, where not all of them (a KPR index reads the dictionary's linker
# too: all of it); their digest is the input it records.
READS = {MENTIONS_STAGE: {DICTIONARY_STAGE: (ENTITIES,)}, EMBED_ENTITIES_STAGE: {DICTIONARY_STAGE: (ENTITIES,)}}


def command_of(stage: str) -> str:
    """The command that runs ``stage``: the one name a person reads for it (``embed-entities``, recorded as
    ``embed_entities``); a name it does not know spelled as commands are (``-`` for ``_``)."""
    return STAGE_COMMANDS.get(stage, stage.replace("_", "-"))


def stage_rank(stage: str) -> int:
    """Where ``stage`` comes in the pipeline (a name it does not know: after every stage), to sort stage names."""
    return STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER)


def errors_of(stage: str) -> str:
    """The dead-letter artifact of ``stage`` (``errors/STAGE``)."""
    return f"{ERRORS}/{stage}"
