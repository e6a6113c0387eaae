"""check's shared vocabulary: the ``Problem`` it reports, the one typo suggester, value types."""

from __future__ import annotations

import difflib
from dataclasses import asdict, dataclass
from typing import Any, Iterable


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


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def suggest_key(key: Any, known: Iterable[str]) -> str:
    """The fix for an unknown key: the closest known spelling, else remove it."""
    near = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    if near:
        return f"did you mean {near[0]!r}?"
    return "remove it (see the DeepSpeed / accelerate config docs)"


_WANT = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "a string",
    dict: "a mapping",
    list: "a list",
}


def want(kind: type) -> str:
    """What a value of ``kind`` is called in a fix ("a whole number", "true or false")."""
    return _WANT.get(kind, "a value")


def has_type(value: Any, kind: type) -> bool:
    """Whether ``value`` passes as ``kind`` the way the libraries read it: a whole-number float
    (5e8 in JSON) is an int for DeepSpeed's pydantic fields, any number is a float, bool is
    neither."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return is_int(value) or isinstance(value, float) and value.is_integer()
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def type_problem(where: str, key: str, value: Any, kind: type) -> Problem | None:
    """``value`` under ``key`` is not a ``kind``: the problem with its fix, else None."""
    if has_type(value, kind):
        return None
    return Problem(where, f"{value!r} is not {want(kind)}", f"set {key} to {want(kind)}")
