"""check: validate DeepSpeed JSON and accelerate YAML, alone and together; every problem at once.

Texts in, ``list[Problem]`` out. Keys and values are judged by the installed libraries' own
classes, so every current key, alias and deprecated or removed form is judged as the run will
judge it: DeepSpeed's config classes (``deepspeed_file``), accelerate's loader, enums and launch
flags (``accelerate_file``). zerofit's own rules sit on top: batch arithmetic against the YAML's
process count, "auto" values against the client that runs the file (``auto_values``), precision
against the GPU, process and machine counts, the multi-node launcher and its hostfile. What no
library states in a readable form is data in ``facts``; ``files`` parses and pairs the files;
``problems`` holds ``Problem`` and the typo suggester. DeepSpeed and accelerate are imported at
run time only, and a broken install of either is one ZerofitError.
"""

from __future__ import annotations

from zerofit.configs.check.accelerate_file import accelerate_version, check_accelerate
from zerofit.configs.check.deepspeed_file import check_deepspeed, deepspeed_version
from zerofit.configs.check.files import answers_files, check_files, referenced_files
from zerofit.configs.check.problems import Problem

__all__ = [
    "CLIENTS",
    "Problem",
    "answers_files",
    "check_accelerate",
    "check_deepspeed",
    "check_files",
    "engine",
    "referenced_files",
]

# Who runs the file decides which "auto" values get filled (None: unknown, "auto" is a warning).
CLIENTS = ("trainer", "accelerate", "deepspeed")


def engine() -> str:
    """What judges keys and values: "DeepSpeed X + accelerate Y"."""
    return f"DeepSpeed {deepspeed_version()} + accelerate {accelerate_version()}"
