"""Decision: one planner choice (field, value) and the sentence that explains it.

Its own module so that the plan and the reasons that fill it both import it without importing
each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Decision:
    """One resolved setting of the plan and why it was chosen."""

    field: str  # e.g. "stage"
    value: Any
    reason: str  # one sentence
