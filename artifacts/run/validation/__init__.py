"""Validation of a run under OUT, for every stage its manifest records (a stage not run is not an error).

Checked: every recorded file is there with its recorded size and sha256; Parquet files open, have the recorded
rows and the contract schema; no unrecorded file sits in an artifact directory (a published copy would carry
it; a stage killed while it committed leaves its files unrecorded);
no stage was built from other upstream outputs than the recorded ones; entity ids agree across ``entities/``,
``dictionary/names/``, the linker's ``kb_id.trie`` and ``entity_embeddings/``; entity vectors are finite and
have the file's ``target_norm``; FAISS shards load and agree with their id maps and ``index.json``.

Big artifacts are streamed batch by batch and per-entity state is numpy bitmaps (7M entities: a few MB).
A file that already failed a check is not opened again by later ones (a corrupt FAISS file may not be safe to
load), so each corruption is reported once, naming its file.

``check``: the whole run; ``files``: the manifest and the files; ``contracts``: schemas; ``entities``: ids and
vectors; ``index``: the FAISS shards; ``recorded``: what they share.
"""

from artifacts.run.validation.check import Validation, check_run, require_valid, validate_run
from artifacts.run.validation.recorded import parquet_footer

__all__ = ["Validation", "check_run", "parquet_footer", "require_valid", "validate_run"]
