"""The console that prints tables: wide when the output goes to a file or a pipe."""

from __future__ import annotations

from zerofit.cli.console import FILE_OUTPUT_COLUMNS, output_console
from zerofit.cli.main import main


def test_output_to_a_pipe_is_wide_unless_columns_is_set(monkeypatch):
    """pytest's captured stdout is no terminal, as a pipe or a file is."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert output_console().width == FILE_OUTPUT_COLUMNS
    monkeypatch.setenv("COLUMNS", "100")
    assert output_console().width == 100


def test_plan_to_a_file_keeps_the_alternatives_headers_whole(monkeypatch, capsys):
    """At rich's default 80 columns the alternatives table cut its headers to "sta…"."""
    monkeypatch.delenv("COLUMNS", raising=False)
    main(["plan", "--model", "qwen2.5-0.5b", "--gpu", "H100-SXM", "--seq-len", "512"])
    out = capsys.readouterr().out
    for header in ("stage", "offload opt/param", "checkpointing", "tokens/s/GPU"):
        assert header in out
    assert "…" not in out
