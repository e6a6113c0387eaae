"""What was measured about a cluster's network, as a small versioned JSON file.

``zerofit doctor`` measures the links of an allocation and writes them with
``write_cluster_facts``; ``plan``, ``estimate`` and ``config`` read them back with
``load_cluster_facts`` (``--cluster-facts FILE``) so the speed model runs on the network the job
really has. Flags given on the command line win over the file.

The file::

    {
      "format": "zerofit-cluster-facts",
      "version": 1,
      "inter_node_gbps": 94.2,      # Gbit/s per node between nodes, as NICs are sold
      "intra_node_gbps": null,      # GB/s (bytes) per GPU, one direction, inside a node;
                                    # null: the GPU catalog's usual link
      "nodes": ["node-a", "node-b"],  # the nodes measured (names, or one object per node)
      "measured": {...}             # free-form details of how and what was measured
    }

The units follow ``speed.step_time.estimate_step_time``'s two arguments of the same names.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerofit.errors import ZerofitError
from zerofit.files import refuse_existing, write_files

FORMAT = "zerofit-cluster-facts"
VERSION = 1


@dataclass(frozen=True)
class ClusterFacts:
    """The measured network of a cluster.

    ``inter_node_gbps``: Gbit/s per node between nodes. ``intra_node_gbps``: GB/s per GPU, one
    direction, inside a node (None: the catalog GPU's usual link). ``nodes``: the nodes the
    measurement covered (host names, or one JSON object per node). ``measured``: free-form
    details (method, pairs, per-pair results, date), kept as read.
    """

    inter_node_gbps: float
    intra_node_gbps: float | None = None
    nodes: tuple[Any, ...] = ()
    measured: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object, format and version first."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "inter_node_gbps": self.inter_node_gbps,
            "intra_node_gbps": self.intra_node_gbps,
            "nodes": list(self.nodes),
            "measured": dict(self.measured),
        }


FACTS_ELSEWHERE = "choose another --facts-out file"


def refuse_existing_facts(path, force: bool) -> None:
    """Refuse a facts target that is a directory, or an existing file without ``force``
    (files.refuse_existing). ``doctor`` calls it before the nodes measure, so a refusal costs no
    measurement."""
    refuse_existing([Path(path)], force, "facts-out", FACTS_ELSEWHERE)


def write_cluster_facts(path, facts: ClusterFacts, force: bool = False) -> Path:
    """Write ``facts`` to ``path`` atomically and return the path; an existing file is replaced
    only with ``force`` (``refuse_existing_facts``). The facts are validated as ``load`` would."""
    _check_facts(facts.to_json(), str(path))
    target = Path(path)
    text = json.dumps(facts.to_json(), indent=2) + "\n"
    # without force, write_files places the file only if no other writer created it meanwhile
    files = {target.name: text}
    return write_files(target.parent, files, force, "facts-out", FACTS_ELSEWHERE)[0]


def load_cluster_facts(path) -> ClusterFacts:
    """Read a cluster-facts file; a bad file raises a one-line ZerofitError naming the field."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ZerofitError(
            "--cluster-facts",
            f"{where} does not exist",
            "give the file `zerofit doctor` wrote, or leave --cluster-facts out",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ZerofitError(
            "--cluster-facts", f"cannot read {where} ({exc})", "give a readable UTF-8 JSON file"
        ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ZerofitError(
            "--cluster-facts",
            f"{where} is not JSON ({exc.msg} at line {exc.lineno})",
            "give the file `zerofit doctor` wrote",
        ) from None
    _check_facts(data, where)
    nodes = data.get("nodes", [])
    return ClusterFacts(
        inter_node_gbps=float(data["inter_node_gbps"]),
        intra_node_gbps=(
            None if data.get("intra_node_gbps") is None else float(data["intra_node_gbps"])
        ),
        nodes=tuple(nodes),
        measured=dict(data.get("measured", {})),
    )


def _check_facts(data: Any, where: str) -> None:
    """Refuse a facts object that is not version 1 of the format, naming the bad field."""
    if not isinstance(data, dict):
        raise ZerofitError(
            "--cluster-facts",
            f"{where} holds no JSON object",
            "give the file `zerofit doctor` wrote",
        )
    if data.get("format") != FORMAT:
        raise ZerofitError(
            "cluster-facts format",
            f"{where} has format {data.get('format')!r}, not {FORMAT!r}",
            "give the file `zerofit doctor` wrote",
        )
    if data.get("version") != VERSION:
        raise ZerofitError(
            "cluster-facts version",
            f"{where} is version {data.get('version')!r}; this zerofit reads version {VERSION}",
            "measure again with this zerofit's `zerofit doctor`",
        )
    _check_bandwidth(data.get("inter_node_gbps"), "inter_node_gbps", where, required=True)
    _check_bandwidth(data.get("intra_node_gbps"), "intra_node_gbps", where, required=False)
    if not isinstance(data.get("nodes", []), list):
        raise ZerofitError(
            "cluster-facts nodes", f"{where}: nodes must be a list", 'write e.g. ["node-a"]'
        )
    if not isinstance(data.get("measured", {}), dict):
        raise ZerofitError(
            "cluster-facts measured",
            f"{where}: measured must be a JSON object",
            "write the measurement's details as {...}",
        )


def _check_bandwidth(value: Any, name: str, where: str, required: bool) -> None:
    if value is None and not required:
        return
    unit = "Gbit/s per node" if name == "inter_node_gbps" else "GB/s per GPU, or null"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ZerofitError(
            f"cluster-facts {name}",
            f"{where}: {name} is {value!r}, not a number",
            f"write the bandwidth in {unit}",
        )
    if not math.isfinite(value) or value <= 0:
        raise ZerofitError(
            f"cluster-facts {name}",
            f"{where}: {name} is {value}, not a positive number",
            f"write the measured bandwidth in {unit}",
        )
