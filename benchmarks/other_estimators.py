"""The other memory estimators users have, on zerofit's public reports, side by side with zerofit.

The reports are the ones benchmarks/public_reports.py judges zerofit on: the developed-on set
tests/data/public_reports.jsonl and the held-out reports tests/data/public_reports_holdout.jsonl
(every collected batch pooled here). Each tool gets the report's model, GPU, world size, ZeRO
stage, offload and precision, and says whether the run fits one GPU; that verdict is set
against what really happened (OOM or ran). For each set the script prints, per tool, the reports
it judged, the OOMs it caught (predicted not to fit), the runs that worked it predicted to fit,
and the reports it cannot judge; then, per tool, the reports where its verdict and zerofit's
differ, by id.

How each tool's verdict is formed: predicted to fit = the tool's per-GPU number <= the GPU's
memory as torch reports it (zerofit.hardware's GpuSpec.memory_gib, 1 GiB = 1024**3 bytes), and,
only where a report states its node's RAM (``host_ram_gib``), the tool's host number <= that RAM,
public_reports.py's rule for zerofit (DeepSpeed's estimators give a host number per node;
accelerate's gives none):

- zerofit: public_reports.evaluate, unchanged (its rule is printed at the top of the output).
- DeepSpeed's model-states estimators, deepspeed 0.19.8, called as they are:
  deepspeed/runtime/zero/stage_1_and_2.py:estimate_zero2_model_states_mem_needs for ZeRO-2, and
  for ZeRO-1 too (DeepSpeed has no ZeRO-1 estimator; ZeRO-2's is the nearest, it partitions the
  gradients that ZeRO-1 keeps whole); deepspeed/runtime/zero/stage3.py:
  estimate_zero3_model_states_mem_needs for ZeRO-3, with zero_init=True (transformers and
  accelerate load a ZeRO-3 model under deepspeed.zero.Init). Their GPU number is judged, and
  their CPU number where host RAM is stated. cpu_offload = offload_optimizer is not "none",
  cpu_offload_params = offload_param is not "none". total_params is the model's unique parameter
  count (zerofit's ModelSpec.params, tied weights once, as stage3.py:model_to_params counts
  them) and largest_layer_params is what stage3.py:model_to_params takes: the most parameters
  one module holds itself (``parameters(recurse=False)``). These functions count model states
  only (16-bit weights, gradients, fp32 master weights and Adam moments), no activations and no
  second model. A stage 0 report (no ZeRO) is not applicable: DeepSpeed has no estimator for it.
- `accelerate estimate-memory`, accelerate 1.15.0, accelerate/commands/estimate.py: the command
  builds the empty model in fp32 (create_empty_model: ``AutoModel``, the base model without the
  causal-LM head, for a transformers architecture; the auto_map's causal LM for remote code),
  takes its size with accelerate/utils/modeling.py:calculate_maximum_sizes, passes that fp32
  size to estimate_training_usage(bytes, dtype) for each --dtypes row (gather_data), and prints
  the largest of the returned terms as "Training using Adam" (estimate_command). The row read is
  float32 for an fp32 run and float16 for bf16/fp16 (the command offers no bfloat16 row, and
  estimate_training_usage treats the two alike). The command knows nothing of ZeRO, offload,
  world size, activations or a second model: it says "fits" when that number is within one GPU,
  which is what it tells its users.

A DPO report's reference model is in zerofit's estimate only; the other tools are asked about the
trained model, as a user would ask them.

    PYTHONPATH=src python benchmarks/other_estimators.py          # tables
    PYTHONPATH=src python benchmarks/other_estimators.py --json   # machine-readable
    PYTHONPATH=src python benchmarks/other_estimators.py --data tests/data/public_reports.jsonl
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
from pathlib import Path

# public_reports.py lives beside this file; put it on the path also when a test imports this
# module from its file, then import it (it puts the checkout's src on sys.path too).
sys.path.insert(0, str(Path(__file__).resolve().parent))
public_reports = importlib.import_module("public_reports")

GIB = 1024**3
TOOLS = ("zerofit", "deepspeed", "accelerate")
TOOL_NAMES = {
    "zerofit": "zerofit estimate",
    "deepspeed": "DeepSpeed model-states estimator",
    "accelerate": "accelerate estimate-memory",
}
RULES = {
    "zerofit": public_reports.VERDICT_RULE,
    "deepspeed": "fits = the per-GPU bytes of estimate_zero2_model_states_mem_needs (ZeRO-1 "
    "and 2) or estimate_zero3_model_states_mem_needs (ZeRO-3, zero_init) are within the "
    "GPU's memory (and their per-node CPU bytes within the node's RAM where the report states "
    "it); model states only; stage 0 is not applicable",
    "accelerate": "fits = the 'Training using Adam' number of the dtype's row (float32 for fp32, "
    "float16 for bf16/fp16) is within one GPU's memory; no ZeRO, no world size",
}


@functools.lru_cache(maxsize=None)
def model_spec(ref: str):
    """zerofit's ModelSpec of a report's model (a built-in name or a config.json path)."""
    from zerofit.models.resolve import resolve_model

    return resolve_model(ref)


# Families whose attention holds q, k and v in one module (Qwen v1 c_attn, Baichuan W_pack,
# ChatGLM and BLOOM query_key_value); ChatGLM also fuses the MLP's gate and up (dense_h_to_4h).
FUSED_QKV = ("qwen", "baichuan", "chatglm", "bloom")


def widest_projection(spec) -> int:
    """The weights of a decoder layer's widest projection: hidden x the widest of the MLP and
    attention widths, counting the projections a family fuses into one module (biases, a few
    thousand parameters, are left out)."""
    attention = spec.num_heads * spec.head_dim
    mlp = spec.intermediate_size
    if spec.architecture in FUSED_QKV:
        attention += 2 * spec.num_kv_heads * spec.head_dim
    if spec.architecture == "chatglm":
        mlp *= 2
    return spec.hidden_size * max(attention, mlp)


def largest_layer_params(spec) -> int:
    """DeepSpeed's ``largest_layer_params`` (stage3.py:model_to_params: the most parameters one
    module holds itself) from zerofit's model shape.

    The candidates are the token embedding (vocab x hidden; an untied lm_head is the same size),
    a MoE layer's routed experts (transformers 5 keeps them as fused tensors of one ``experts``
    module: gate, up and down of every expert) and a decoder layer's widest projection. On every
    model in the report sets the embedding or the experts module is the largest (a test checks
    it), so the projection's left-out biases never change the number.
    """
    embedding = spec.vocab_size * spec.hidden_size
    experts = spec.num_experts * 3 * spec.hidden_size * spec.moe_intermediate_size
    return max(embedding, experts, widest_projection(spec))


def estimate_deepspeed(answers: dict) -> dict:
    """DeepSpeed's model-states estimate for a report's answers: its cpu/gpu bytes and the
    function and inputs it was called with, or ``not_applicable`` for stage 0."""
    stage = answers["stage"]
    if stage == 0:
        return {"status": "not_applicable", "reason": "stage 0: DeepSpeed has no estimator"}
    spec = model_spec(answers["model"])
    common = dict(
        total_params=spec.params,
        num_gpus_per_node=answers["gpus_per_node"],
        num_nodes=answers["num_nodes"],
        cpu_offload=answers["offload_optimizer"] != "none",
    )
    if stage in (1, 2):
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

        inputs = common
        cpu_bytes, gpu_bytes = estimate_zero2_model_states_mem_needs(**inputs)
        function = "estimate_zero2_model_states_mem_needs"
    else:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

        inputs = dict(
            common,
            largest_layer_params=largest_layer_params(spec),
            cpu_offload_params=answers["offload_param"] != "none",
            zero_init=True,
        )
        cpu_bytes, gpu_bytes, _ = estimate_zero3_model_states_mem_needs(**inputs)
        function = "estimate_zero3_model_states_mem_needs"
    return {
        "status": "ok",
        "function": function,
        "inputs": inputs,
        "gpu_bytes": gpu_bytes,
        "cpu_bytes": cpu_bytes,
    }


# The remote-code families zerofit reads (models/resolve.py); their hub configs' auto_map names
# AutoModelForCausalLM, which accelerate's create_empty_model builds instead of AutoModel.
REMOTE_CODE_CAUSAL_LM = ("qwen", "baichuan", "chatglm")


def accelerate_model_bytes(spec) -> int:
    """The fp32 size ``accelerate estimate-memory`` measures for a model.

    create_empty_model builds ``AutoModel`` for a transformers architecture: the base model,
    without the causal-LM head, so an untied lm_head is not in its size. A remote-code model is
    built from its config's auto_map, whose first ``AutoModelFor*`` entry is taken; the Qwen v1,
    Baichuan and ChatGLM repos (the families zerofit reads without running their code) name
    AutoModelForCausalLM there, the whole model. 4 bytes per parameter of that model is the
    number calculate_maximum_sizes gives, less the model's buffers (rotary inv_freq, a few
    hundred bytes, which zerofit's shape does not carry); a test checks both on built models.
    """
    params = spec.params
    if spec.architecture not in REMOTE_CODE_CAUSAL_LM and not spec.tie_embeddings:
        params -= spec.vocab_size * spec.hidden_size
    return 4 * params


def accelerate_dtype(precision: str) -> str:
    """The ``--dtypes`` row of ``accelerate estimate-memory`` a run in this precision reads."""
    return "float32" if precision == "fp32" else "float16"


def estimate_accelerate(answers: dict) -> dict:
    """What ``accelerate estimate-memory`` prints as "Training using Adam" for the report's
    model and precision, in bytes, with the terms estimate_training_usage returned."""
    from accelerate.commands.estimate import estimate_training_usage

    model_bytes = accelerate_model_bytes(model_spec(answers["model"]))
    dtype = accelerate_dtype(answers["precision"])
    usage = estimate_training_usage(model_bytes, dtype)
    # estimate_command prints the largest term, not their sum
    return {
        "status": "ok",
        "dtype": dtype,
        "model_bytes": model_bytes,
        "usage": usage,
        "gpu_bytes": max(usage.values()),
    }


def judge(estimate: dict, capacity_gib: float, host_ram_gib: float | None = None) -> dict:
    """The estimate with its verdict: fits when its GPU bytes are within the GPU's memory and,
    where the report states its node's RAM and the tool gives a host number (DeepSpeed's is
    per node), that number is within it: public_reports.py's rule for zerofit."""
    if estimate["status"] != "ok":
        return estimate
    gpu_gib = estimate["gpu_bytes"] / GIB
    fits = gpu_gib <= capacity_gib
    verdict = {**estimate, "gpu_gib": round(gpu_gib, 3)}
    if "cpu_bytes" in estimate:
        cpu_gib = estimate["cpu_bytes"] / GIB
        verdict["cpu_gib"] = round(cpu_gib, 3)
        if host_ram_gib is not None:
            fits = fits and cpu_gib <= host_ram_gib
    return {**verdict, "fits": fits}


def estimate_other_tools(report: dict, known: set[str]) -> dict:
    """The DeepSpeed and accelerate verdicts on one report, keyed by tool."""
    from zerofit.errors import ZerofitError
    from zerofit.hardware import lookup

    answers, _ = public_reports.answers_dict(report, known)
    out = {}
    for tool, estimate in (("deepspeed", estimate_deepspeed), ("accelerate", estimate_accelerate)):
        try:
            capacity = lookup(answers["gpu"]).memory_gib
            out[tool] = judge(estimate(answers), capacity, report["answers"].get("host_ram_gib"))
        except ZerofitError as err:  # a GPU or model zerofit cannot resolve
            out[tool] = {"status": "not_applicable", "reason": str(err)}
    return out


def zerofit_verdict(row: dict) -> dict:
    """A public_reports.evaluate row as a verdict like the other tools'."""
    if row["status"] != "ok":
        return {"status": "not_applicable", "reason": row["error"]}
    return {
        "status": "ok",
        "fits": row["fits"],
        "gpu_gib": row["gpu_need_gib"],
        "cpu_gib": row["cpu_gib"],
    }


def evaluate_tools(reports: list[dict]) -> dict:
    """Every tool's verdict on every report, the per-tool counts, and where each tool's verdict
    differs from zerofit's."""
    from zerofit.errors import ZerofitError
    from zerofit.hardware import lookup

    known = public_reports.answer_fields()
    zerofit_rows = public_reports.evaluate(reports)["rows"]
    rows = []
    for report, zrow in zip(reports, zerofit_rows, strict=True):
        gpu = report["answers"]["gpu"]
        try:
            capacity = lookup(gpu).memory_gib
        except ZerofitError:
            capacity = None
        rows.append(
            {
                "id": report["id"],
                "outcome": report["outcome"],
                "gpu": gpu,
                "gpu_memory_gib": capacity,
                "host_ram_gib": report["answers"].get("host_ram_gib"),
                "zerofit": zerofit_verdict(zrow),
                **estimate_other_tools(report, known),
            }
        )
    return {
        "reports": len(reports),
        "tools": {tool: count_verdicts(rows, tool) for tool in TOOLS},
        # a tool that judges fewer reports has smaller denominators: zerofit on its reports
        "zerofit_on_same_reports": {
            tool: count_verdicts([r for r in rows if r[tool]["status"] == "ok"], "zerofit")
            for tool in TOOLS[1:]
        },
        "differences": {tool: differences(rows, tool) for tool in TOOLS[1:]},
        "rows": rows,
    }


def count_verdicts(rows: list[dict], tool: str) -> dict:
    """Reports judged, OOMs caught, runs predicted to fit, and the reports not judged (with
    how many per reason)."""
    judged = [r for r in rows if r[tool]["status"] == "ok"]
    ooms = [r for r in judged if r["outcome"] == "oom"]
    runs = [r for r in judged if r["outcome"] == "ran"]
    reasons: dict[str, int] = {}
    for row in rows:
        if row[tool]["status"] != "ok":
            reasons[row[tool]["reason"]] = reasons.get(row[tool]["reason"], 0) + 1
    return {
        "judged": len(judged),
        "ooms_caught": sum(not r[tool]["fits"] for r in ooms),
        "ooms": len(ooms),
        "runs_predicted_to_fit": sum(r[tool]["fits"] for r in runs),
        "runs": len(runs),
        "not_judged": len(rows) - len(judged),
        "not_judged_reasons": reasons,
    }


def differences(rows: list[dict], tool: str) -> dict:
    """The reports both the tool and zerofit judged where their verdicts differ, by id."""
    both = [r for r in rows if r[tool]["status"] == "ok" and r["zerofit"]["status"] == "ok"]

    def ids(outcome: str, tool_fits: bool) -> list[str]:
        return [
            r["id"]
            for r in both
            if r["outcome"] == outcome
            and r[tool]["fits"] == tool_fits
            and r["zerofit"]["fits"] != tool_fits
        ]

    return {
        "ooms_missed_zerofit_caught": ids("oom", True),
        "ooms_caught_zerofit_missed": ids("oom", False),
        "runs_rejected_zerofit_passed": ids("ran", False),
        "runs_passed_zerofit_rejected": ids("ran", True),
    }


def render_table(result: dict) -> list[str]:
    """The per-tool counts of one set, one row per tool."""
    lines = [
        f"{'tool':<34}{'judged':>7}{'OOMs caught':>13}{'runs predicted to fit':>23}"
        f"{'not judged':>12}"
    ]
    for tool in TOOLS:
        c = result["tools"][tool]
        lines.append(
            f"{TOOL_NAMES[tool]:<34}{c['judged']:>7}{c['ooms_caught']:>9}/{c['ooms']:<3}"
            f"{c['runs_predicted_to_fit']:>19}/{c['runs']:<3}{c['not_judged']:>12}"
        )
    for tool in TOOLS:
        for reason, n in result["tools"][tool]["not_judged_reasons"].items():
            lines.append(f"  not judged by {TOOL_NAMES[tool]}: {n} x {reason}")
        if tool != "zerofit" and result["tools"][tool]["not_judged"]:
            z = result["zerofit_on_same_reports"][tool]
            lines.append(
                f"  zerofit on the {z['judged']} reports {TOOL_NAMES[tool]} judges: "
                f"OOMs caught {z['ooms_caught']}/{z['ooms']}, runs predicted to fit "
                f"{z['runs_predicted_to_fit']}/{z['runs']}"
            )
    return lines


def render_differences(result: dict) -> list[str]:
    """Per tool, the ids where its verdict and zerofit's differ, with both numbers."""
    by_id = {row["id"]: row for row in result["rows"]}
    titles = {
        "ooms_missed_zerofit_caught": "OOMs it predicted to fit, zerofit caught",
        "ooms_caught_zerofit_missed": "OOMs it caught, zerofit predicted to fit",
        "runs_rejected_zerofit_passed": "runs that worked it predicted not to fit, zerofit to fit",
        "runs_passed_zerofit_rejected": "runs that worked it predicted to fit, zerofit not to fit",
    }
    lines = []
    for tool, diff in result["differences"].items():
        lines.append(f"{TOOL_NAMES[tool]} vs zerofit (GPU GiB: {tool} / zerofit / GPU memory):")
        for key, title in titles.items():
            lines.append(f"  {title}: {len(diff[key])}")
            for report_id in diff[key]:
                row = by_id[report_id]
                line = (
                    f"    {report_id}: {row[tool]['gpu_gib']:.1f} / "
                    f"{row['zerofit']['gpu_gib']:.1f} / {row['gpu_memory_gib']} ({row['gpu']})"
                )
                if row["host_ram_gib"] is not None:  # host RAM is judged too: show it
                    host = row[tool].get("cpu_gib")
                    line += (
                        f"; host GiB: {'-' if host is None else f'{host:.1f}'} / "
                        f"{row['zerofit']['cpu_gib']:.1f} / {row['host_ram_gib']}"
                    )
                lines.append(line)
    return lines


def render(groups: dict[str, dict]) -> str:
    """The human-readable output: the verdict rules, then each set's table and differences."""
    lines = ["verdict rules:"]
    lines += [f"  {TOOL_NAMES[tool]}: {RULES[tool]}" for tool in TOOLS]
    for name, result in groups.items():
        lines += ["", f"=== {name}: {result['reports']} reports", *render_table(result), ""]
        lines += render_differences(result)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Evaluate every tool on the developed-on set and the pooled held-out batches (or on each
    ``--data`` file) and print the tables, or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--data",
        type=Path,
        action="append",
        help="a reports file (JSONL), judged as its own set; repeat for several (default: the "
        "developed-on set, and the held-out set with its batches pooled)",
    )
    args = parser.parse_args(argv)
    if args.data:
        sets = {path.name: public_reports.load_reports(path) for path in args.data}
    else:
        held_out = public_reports.load_reports(public_reports.HOLDOUT)
        batches = len({report["collected"] for report in held_out})
        sets = {
            f"developed-on set ({public_reports.DATA.name})": public_reports.load_reports(),
            f"held-out set ({public_reports.HOLDOUT.name}, {batches} batches pooled)": held_out,
        }
    groups = {name: evaluate_tools(reports) for name, reports in sets.items()}
    if args.json:
        print(json.dumps(groups, indent=2))
        return 0
    print(render(groups))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
