"""The one exception type users see: a field, what is wrong, and how to fix it."""

from __future__ import annotations


class ZerofitError(Exception):
    """A user-facing error rendered as one line: ``FIELD: PROBLEM (fix: FIX)``.

    The CLI catches it and exits non-zero without a traceback, so raise it for every
    bad input instead of ``assert`` or a bare ``ValueError``.
    """

    def __init__(self, field: str, problem: str, fix: str = "", exit_code: int = 2):
        self.field, self.problem, self.fix, self.exit_code = field, problem, fix, exit_code
        super().__init__(self.render())

    def render(self) -> str:
        line = f"{self.field}: {self.problem}" if self.field else self.problem
        return f"{line} (fix: {self.fix})" if self.fix else line
