"""The rich console that prints a command's tables and notes."""

from __future__ import annotations

import os

# Width for output that goes to a file or a pipe (``zerofit plan > plan.txt``, a CI log): rich
# would fold every table to 80 columns there, cutting the alternatives table's headers to
# "sta…", "off…". A terminal, or COLUMNS set by the user, keeps its own width.
FILE_OUTPUT_COLUMNS = 160


def output_console():
    """A rich ``Console`` for command output: the terminal's width on a terminal,
    ``FILE_OUTPUT_COLUMNS`` when stdout is a file or a pipe and COLUMNS is not set."""
    from rich.console import Console

    console = Console()
    if console.is_terminal or "COLUMNS" in os.environ:
        return console
    return Console(width=FILE_OUTPUT_COLUMNS)
