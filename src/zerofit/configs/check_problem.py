"""check's shared vocabulary: the Problem it reports and the value/type helpers its rules use."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    """One finding: ``path`` is ``FILE:dotted.key``; ``severity`` error | warning | unreadable."""

    path: str
    message: str
    fix: str
    severity: str = "error"

    def render(self) -> str:
        return f"{self.path}: {self.message} (fix: {self.fix})"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def not_a_mapping(name: str) -> Problem:
    """A file whose top level is not a mapping (a list, a number, an empty document)."""
    return Problem(
        name, "must hold a mapping of keys to values", "start from `zerofit config`", "unreadable"
    )


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def unknown_key(where: str, key: str, table: dict) -> Problem:
    near = difflib.get_close_matches(key, list(table), n=1, cutoff=0.6)
    fix = (
        f"did you mean {near[0]!r}?"
        if near
        else "remove it (see the DeepSpeed / accelerate config docs)"
    )
    return Problem(where, "is not a known key", fix)


_WANT = {
    "dict_or_bool": "a mapping",
    "int": "a whole number",
    "int_or_minus1": "a whole number",
    "float": "a number",
    "bool": "true or false",
    "str": "a string",
    "path": "a path string",
    "dict": "a mapping",
    "list": "a list",
    "stage": "0, 1, 2 or 3",
    "device": '"none", "cpu" or "nvme"',
    "any": "a value",
}


def want(kind: str) -> str:
    return _WANT.get(kind, kind)


def type_problem(kind: str, value: Any) -> str | None:
    ok = {
        # 5e8 is a JSON float; DeepSpeed's pydantic int fields accept whole-number floats.
        "int": (is_int(value) or isinstance(value, float) and value.is_integer()) and value >= 0,
        "int_or_minus1": is_int(value),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "path": isinstance(value, str) or value is None,
        "dict": isinstance(value, dict),
        "dict_or_bool": isinstance(
            value, (dict, bool)
        ),  # "zero_optimization": true, the legacy form
        "list": isinstance(value, list),
        "stage": is_int(value) and value in (0, 1, 2, 3),
        "device": value in ("none", "cpu", "nvme"),
        "any": True,
    }.get(kind, True)
    return None if ok else f"is not {want(kind)}"
