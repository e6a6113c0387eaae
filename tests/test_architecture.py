"""The import rule of docs/ARCHITECTURE.md, checked on the source: imports only go down the
pipeline.

Static (ast over src/zerofit, lazy imports inside functions included), so it costs no imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "zerofit"

# Which of zerofit's folders each folder may import (besides itself and the shared top-level
# modules errors, files, cache, hardware). Anything not listed is a violation.
ALLOWED = {
    "models": set(),
    "memory": set(),
    "launch": set(),
    "doctor": set(),
    "speed": {"memory", "models"},
    "planning": {"memory", "models", "speed"},
    "configs": {"planning", "memory", "models"},
    "wizard": {"planning", "models", "configs"},
    "cli": {"models", "memory", "planning", "configs", "launch", "doctor", "wizard"},
}
SHARED = {
    "errors",
    "files",
    "cache",
    "hardware",
    "addresses",
    "cluster_facts",
    "model_classes",
    "__init__",
}


def zerofit_imports(path: Path) -> set[str]:
    """Every zerofit module or package a source file imports, at any depth of the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("zerofit"):
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("zerofit"))
    return found


def folder_of(dotted: str) -> str | None:
    """`zerofit.memory.estimate` -> `memory`; a top-level module -> its name."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else None


def test_imports_only_go_down_the_pipeline():
    bad = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if len(rel.parts) == 1:
            continue  # top-level modules: checked below
        here = rel.parts[0]
        for dep in zerofit_imports(path):
            there = folder_of(dep)
            if there is None or there == here or there in SHARED:
                continue
            if (SRC / there).is_dir() and there not in ALLOWED[here]:
                bad.append(f"{rel} imports {dep}")
    assert bad == []


def test_shared_top_level_modules_import_only_each_other():
    for name in ("errors.py", "files.py", "cache.py", "hardware.py"):
        deps = {folder_of(d) for d in zerofit_imports(SRC / name)}
        assert deps <= {"errors"}, name


def test_every_folder_says_what_it_owns():
    for folder in ALLOWED:
        doc = ast.get_docstring(ast.parse((SRC / folder / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), folder


def test_every_folder_is_listed():
    folders = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(ALLOWED)
