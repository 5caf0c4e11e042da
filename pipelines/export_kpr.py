"""export-kpr: a validated run's entity vocabulary, embeddings and linker in KPR's layout (logic:
artifacts.run.kpr_export)."""

from __future__ import annotations

import argparse

from artifacts.run.kpr_export import EMBEDDINGS_FILE, LINKER_DIR, VOCAB_FILE, export_kpr


class ExportKprCommand:
    """export-kpr: write entity_vocab.tsv, entity_embeddings.npy and entity_linker/ for KPR into DIR."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--output", required=True, help="OUT: the run to export (local path or Beam URL)")
        parser.add_argument("--to", required=True, metavar="DIR", help="export directory (local path or Beam URL)")

    def main(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        summary = export_kpr(args.output, args.to)
        print(f"exported {args.output} to {summary.directory}: {VOCAB_FILE}, {EMBEDDINGS_FILE}, {LINKER_DIR}/")
        print(f"  entities: {summary.entities:,}")
        print(f"  dim: {summary.dim}")
        print(f"  entities without embeddings (zero rows): {summary.without_embeddings:,}")
        return 0


COMMAND = ExportKprCommand()
