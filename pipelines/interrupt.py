"""Ctrl-C: the one line a command prints and its exit status. No import beyond the standard library: the entry
point prints the line when Ctrl-C comes while Python is still importing the pipeline's libraries."""

from __future__ import annotations

INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a command that Ctrl-C ended


def interrupted_line(command: str | None) -> str:
    """The line for Ctrl-C during ``command`` (a stage's command-line name; None: before any stage ran)."""
    during = f" during {command}" if command else ""
    return f"interrupted{during}; rerun the same command to resume"
