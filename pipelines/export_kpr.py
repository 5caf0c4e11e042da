"""export-kpr: a validated run's entity vocabulary, embeddings and linker in KPR's layout (logic:
artifacts.run.kpr_export)."""

from __future__ import annotations

import argparse
import sys

from artifacts import layout
from artifacts.errors import InputError, NoRoomError, RunStateError
from artifacts.names import DEFAULT_LANGUAGE
from artifacts.run.kpr_export import (
    EMBEDDINGS_FILE,
    LINKER_DIR,
    RECORD_FILE,
    TENSOR_FILE,
    VOCAB_FILE,
    MissingStagesError,
    OverlappingExportError,
    export_kpr,
)
from artifacts.run.owned import ForeignFileError
from pipelines.launcher import disk_space


class ExportKprCommand:
    """export-kpr: write entity_vocab.tsv, entity_embeddings.npy, embeddings.pt and entity_linker/ for KPR into
    DIR."""

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        space = disk_space.space_of(args.to)
        try:
            summary = export_kpr(args.output, args.to, free_bytes=space.free)
        except NoRoomError as error:
            raise disk_space.no_room_error("export-kpr", args.to, "--to", error.need, "to write the export", space
                                           ) from error
        except MissingStagesError as error:
            stages = " or ".join(map(layout.command_of, error.missing))
            raise RunStateError(error.output, f"{error.output} has no completed {stages} stage", "export-kpr needs the "
                                "entity linker and the entity embeddings (run the stages that make them first: "
                                "`python run_pipeline.py dictionary`, `mentions` and `embed-entities`)") from error
        except OverlappingExportError as error:
            raise InputError(f"--to {error.directory} overlaps --output {error.output}: export to a place outside "
                             "the run") from error
        except ForeignFileError as error:
            raise InputError(f"--to {args.to} already holds {error.path}, which no earlier export-kpr wrote: "
                             "nothing was written (move it away or export to another directory)") from error
        print(f"exported {args.output} to {summary.directory}: {VOCAB_FILE}, {EMBEDDINGS_FILE}, {TENSOR_FILE}, "
              f"{LINKER_DIR}/ (listed in {RECORD_FILE})")
        print(f"  entities: {summary.entities:,}")
        print(f"  dim: {summary.dim}")
        print(f"  entities without embeddings (zero rows): {summary.without_embeddings:,}")
        for row in summary.zero_scale_rows:
            print(zero_scale_row_warning(row, summary.entities), file=sys.stderr)
        if summary.language != DEFAULT_LANGUAGE:
            print(f"warning: the linker was built with --language {summary.language}: the reference's "
                  "DictionaryEntityLinker finds names on English token boundaries (spacy.blank(\"en\")): KPR finds a "
                  "name only where English tokens part it (not after an elision such as l'Argento, nor inside "
                  "unspaced text)", file=sys.stderr)
        return 0


def zero_scale_row_warning(row: int, entities: int) -> str:
    """The warning for an entity without an embedding whose row the reference's build_hf_model.py scales by: the
    last row of the entity table a train.py model holds (this export's), or row 1 of the entity_embeddings.npy of
    the model a knowledge update updates (one built from this export has a zero row 1)."""
    harms = [*(["a model train.py trains with it (its entity table) and build_hf_model.py then builds has every "
                "entity vector zero: it scales them to that table's last row"] if row == entities else []),
             *(["a model build_hf_model.py builds with it has a zero row 1, and every later knowledge update of that "
                "model makes every entity vector zero: it scales them to the updated model's row 1"]
               if row == 1 else [])]
    return (f"warning: entity {row:,} of {entities:,} has no embedding, a zero row in this export: "
            f"{'; and '.join(harms)}")


COMMAND = ExportKprCommand()
