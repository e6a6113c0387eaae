"""zerofit's OOM verdict against public reports of real full fine-tunes.

The reports are tests/data/public_reports.jsonl.

Each report is a run someone described in public (GitHub issue, project README, recipe file): its
configuration as zerofit Answers, and what really happened (OOM or ran, sometimes a measured
number).
This script runs `zerofit estimate` on each one and prints:

- the confusion matrix: real outcome (oom / ran) x predicted (does NOT fit / fits);
- every miss by id (a real OOM predicted to fit, or a run that worked predicted not to fit);
- the error on the measured numbers;
- reports that cannot be estimated yet (a GPU or model missing from zerofit), with the reason.

Fields the data holds that Answers does not know yet (the memory model's new inputs: stack,
optimizer, loss kernel, ...) are dropped with a printed note, so the script runs on any version
of zerofit and uses them as soon as they exist. A report's DeepSpeed JSON (`ds_config`) is passed
through a temporary file once the estimate takes one (an Answers field or a build_estimate
parameter whose name contains "ds_config").

    PYTHONPATH=src python benchmarks/public_reports.py          # table
    PYTHONPATH=src python benchmarks/public_reports.py --json   # machine-readable
    PYTHONPATH=src python benchmarks/public_reports.py --gpu-proxies   # A800/A40/H20 stand-ins
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "public_reports.jsonl"
sys.path.insert(0, str(ROOT / "src"))   # the checkout's zerofit, not an older installed copy

# How a measured number compares with the estimate:
# - alloc_lower_bound: "already allocated + tried to allocate" from an OOM traceback, a floor
#   under torch.cuda.max_memory_allocated(): compared with peak_gib;
# - device_used: nvidia-smi style memory in use (CUDA context and allocator cache included):
#   compared with peak_gib + the CUDA context (the estimate has no cache term yet).
MEASURED_KINDS = ("alloc_lower_bound", "device_used")

# --gpu-proxies: GPUs the catalog lacks today, stood in for by the entry with the same usable
# memory, so the verdict can be read on every report before the catalog grows. Not the default:
# a proxy shares memory, not the name (the memory helper adds the real entries).
# A800 80GB: the A100 80GB with slower NVLink, same 80 GB HBM2e.
# A40: 48 GB GDDR6 with ECC, nvidia-smi shows 46068 MiB total, like the L40S.
# H20: 96 GB HBM3; the nearest smaller catalog entry is the H100 NVL (94 GB), a conservative proxy.
GPU_PROXIES = {"A800": "A100-80GB", "A40": "L40S", "H20": "H100-NVL"}


def load_reports(path: Path = DATA) -> list[dict]:
    """Every report of the JSONL file, in file order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def answer_fields() -> set[str]:
    """The field names Answers has in this version of zerofit."""
    from zerofit.planning.answers import Answers
    return {f.name for f in dataclasses.fields(Answers)}


def ds_config_input() -> tuple[str, str] | None:
    """Where the estimate takes a DeepSpeed JSON: ("answers", field) or ("kwarg", parameter)."""
    from zerofit.cli.commands.estimate import build_estimate
    for name in sorted(answer_fields()):
        if "ds_config" in name:
            return "answers", name
    for name in inspect.signature(build_estimate).parameters:
        if "ds_config" in name:
            return "kwarg", name
    return None


def answers_dict(report: dict, known: set[str], proxies: dict[str, str] | None = None
                 ) -> tuple[dict, list[str]]:
    """The report's answers limited to fields Answers knows, and the names it dropped.

    Model paths in the data are relative to the repository root; they are made absolute so the
    script runs from any directory. ``proxies`` maps a GPU name the catalog lacks to a stand-in.
    """
    data = dict(report["answers"])
    if proxies and data.get("gpu") in proxies:
        data["gpu"] = proxies[data["gpu"]]
    model = data.get("model", "")
    if model.endswith(".json") and not Path(model).is_absolute():
        data["model"] = str(ROOT / model)
    dropped = sorted(k for k in data if k not in known)
    return {k: v for k, v in data.items() if k in known}, dropped


def estimate_report(report: dict, known: set[str], ds_input: tuple[str, str] | None,
                    tmpdir: Path, proxies: dict[str, str] | None = None) -> dict:
    """Run zerofit's estimate on one report: status ok with fits/peak, or error with its line."""
    from zerofit.cli.commands.estimate import build_estimate
    from zerofit.errors import ZerofitError
    from zerofit.planning.answers import answers_from_dict

    data, dropped = answers_dict(report, known, proxies)
    kwargs = {}
    if ds_input and "ds_config" in report:
        path = tmpdir / f"{report['id']}.ds_config.json"
        path.write_text(json.dumps(report["ds_config"]))
        if ds_input[0] == "answers":
            data[ds_input[1]] = str(path)
        else:
            kwargs[ds_input[1]] = str(path)
    try:
        result = build_estimate(answers_from_dict(data), **kwargs)
    except ZerofitError as err:
        return {"status": "error", "error": str(err), "dropped": dropped}
    total = result["peak_gib"] + result.get("cuda_context_gib", 0.0)
    return {"status": "ok", "fits": bool(result["fits"]), "peak_gib": result["peak_gib"],
            "gpu_total_gib": round(total, 3), "budget_gib": result.get("budget_gib"),
            "peak_phase": result.get("peak_phase"), "dropped": dropped}


def measured_error(report: dict, pred: dict) -> dict | None:
    """Predicted vs measured for a report with a number; relative error of the prediction."""
    if "measured_gib" not in report or pred["status"] != "ok":
        return None
    kind = report["measured_kind"]
    predicted = pred["peak_gib"] if kind == "alloc_lower_bound" else pred["gpu_total_gib"]
    measured = report["measured_gib"]
    return {"id": report["id"], "kind": kind, "measured_gib": measured, "predicted_gib": predicted,
            "error": round((predicted - measured) / measured, 4),
            # a lower bound is only violated when the prediction is below it
            "consistent": predicted >= measured if kind == "alloc_lower_bound" else None}


def evaluate(reports: list[dict], proxies: dict[str, str] | None = None) -> dict:
    """Predictions, confusion matrix, misses and measured errors for all reports.

    ``proxies``: GPUs the catalog lacks, mapped to a stand-in with the same memory (only those
    the catalog does not know yet are replaced).
    """
    known = answer_fields()
    proxies = {k: v for k, v in (proxies or {}).items() if not _in_catalog(k)}
    ds_input = ds_config_input()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for report in reports:
            pred = estimate_report(report, known, ds_input, Path(tmp), proxies)
            rows.append({"id": report["id"], "outcome": report["outcome"],
                         "workload": report["answers"].get("workload"), **pred})
    matrix = {"oom": {"predicted_oom": 0, "predicted_fits": 0},
              "ran": {"predicted_oom": 0, "predicted_fits": 0}}
    misses, errors = [], []
    for row in rows:
        if row["status"] != "ok":
            errors.append({"id": row["id"], "error": row["error"]})
            continue
        predicted = "predicted_fits" if row["fits"] else "predicted_oom"
        matrix[row["outcome"]][predicted] += 1
        if row["outcome"] == "oom" and row["fits"]:
            misses.append({"id": row["id"], "miss": "real OOM predicted to fit",
                           "peak_gib": row["peak_gib"], "budget_gib": row["budget_gib"]})
        elif row["outcome"] == "ran" and not row["fits"]:
            misses.append({"id": row["id"], "miss": "ran, predicted not to fit",
                           "peak_gib": row["peak_gib"], "budget_gib": row["budget_gib"]})
    measured = [m for r, p in zip(reports, rows) if (m := measured_error(r, p))]
    dropped = sorted({name for row in rows for name in row["dropped"]})
    return {"reports": len(reports), "evaluated": len(rows) - len(errors), "matrix": matrix,
            "gpu_proxies": proxies,
            "misses": misses, "measured": measured, "not_evaluable": errors,
            "dropped_fields": dropped, "ds_config_input": ds_input, "rows": rows}


def _in_catalog(name: str) -> bool:
    from zerofit.errors import ZerofitError
    from zerofit.hardware import lookup
    try:
        lookup(name)
    except ZerofitError:
        return False
    return True


def render(result: dict) -> str:
    """The human-readable report."""
    m = result["matrix"]
    lines = [f"public reports: {result['reports']}, evaluated: {result['evaluated']}, "
             f"not evaluable yet: {len(result['not_evaluable'])}"]
    if result["gpu_proxies"]:
        lines.append("note: GPUs missing from the catalog stood in for by the same memory: "
                     + ", ".join(f"{k} -> {v}" for k, v in result["gpu_proxies"].items()))
    if result["dropped_fields"]:
        lines.append("note: Answers does not know these report fields yet, dropped: "
                     + ", ".join(result["dropped_fields"]))
    if result["ds_config_input"] is None:
        lines.append("note: the estimate takes no ds_config yet; reports' DeepSpeed JSONs unused")
    lines += ["", f"{'real / predicted':<18}{'does NOT fit':>14}{'fits':>8}",
              f"{'oom':<18}{m['oom']['predicted_oom']:>14}{m['oom']['predicted_fits']:>8}",
              f"{'ran':<18}{m['ran']['predicted_oom']:>14}{m['ran']['predicted_fits']:>8}"]
    oom_total = m["oom"]["predicted_oom"] + m["oom"]["predicted_fits"]
    ran_total = m["ran"]["predicted_oom"] + m["ran"]["predicted_fits"]
    lines.append(f"OOMs caught: {m['oom']['predicted_oom']}/{oom_total}; "
                 f"runs that worked predicted to fit: {m['ran']['predicted_fits']}/{ran_total}")
    lines += ["", "misses:"] + [f"  {x['id']}: {x['miss']} (peak {x['peak_gib']:.2f} GiB, "
                                 f"budget {x['budget_gib']} GiB)" for x in result["misses"]]
    lines += ["", "measured numbers (predicted vs measured, GiB):"]
    for x in result["measured"]:
        note = "" if x["consistent"] is None else ("  ok: above the floor" if x["consistent"]
                                                    else "  BELOW the measured floor")
        lines.append(f"  {x['id']}: {x['kind']} measured {x['measured_gib']:.2f}, predicted "
                     f"{x['predicted_gib']:.2f}, error {100 * x['error']:+.1f}%{note}")
    lines += ["", "not evaluable yet:"]
    lines += [f"  {x['id']}: {x['error']}" for x in result["not_evaluable"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument("--data", type=Path, default=DATA, help="the reports file (JSONL)")
    parser.add_argument("--gpu-proxies", action="store_true",
                        help="estimate GPUs the catalog lacks (A800, A40, H20) on a "
                             "same-memory entry")
    args = parser.parse_args(argv)
    result = evaluate(load_reports(args.data), GPU_PROXIES if args.gpu_proxies else None)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
