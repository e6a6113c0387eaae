"""CLI flags for every Answers field, shared by estimate/plan/config/wizard so they cannot drift.

Flag names are the field names with dashes (``--gpus-per-node``), except ``--flavor`` (the
``flavour`` field); ``_FLAG_NAMES`` lists those and the aliases (``--nodes``, ``--flavour``,
``--main-addr``, ``--main-port``). ``--answers FILE`` and ``--cluster-facts FILE`` are extra.
Values given on the command line override the cluster facts, which override the answers file.
"""

from __future__ import annotations

import argparse
import types
import typing
from dataclasses import fields
from pathlib import Path

from zerofit.errors import ZerofitError
from zerofit.planning.answers import (
    CHOICES,
    Answers,
    answers_from_dict,
    answers_to_dict,
    load_answers,
)

# Answers' own choices, plus the ZeRO stages (Answers checks those with a range)
_CHOICES = {**CHOICES, "stage": (0, 1, 2, 3)}
_HELP = {
    "model": "built-in name (e.g. qwen2.5-7b), config.json, model directory, or hub id",
    "gpu": "GPU type from the catalog (e.g. H100-SXM, A100-80GB, L40S)",
    "gpus_per_node": "GPUs (processes) on each node",
    "num_nodes": "number of nodes",
    "seq_len": "tokens per sequence (grpo: prompt + completion)",
    "target_len": "encoder-decoder models (T5): tokens per target sequence, the decoder's and "
    "the loss's length, e.g. 128 (default: --seq-len)",
    "global_batch": "sequences per optimizer step across all GPUs",
    "stage": "ZeRO stage (default: the planner picks)",
    "micro_batch": "sequences per GPU per forward (default: the planner picks)",
    "gradient_checkpointing": "recompute activations in backward (default: the planner picks)",
    "flavour": "explicit numbers, or 'auto' values the HF Trainer / TRL fill from their arguments "
    "(default: auto for --stack hf, explicit for accelerate and deepspeed)",
    "main_process_ip": "the main node's IP address or hostname (multi-node; default 127.0.0.1)",
    "optimizer_block": "write an AdamW `optimizer` block into the DeepSpeed JSON (plain DeepSpeed "
    "scripts that call deepspeed.initialize without their own optimizer)",
    "headroom": "fraction of GPU memory a plan may use (default 1.0: the safety margin and the "
    "modelled allocator/NCCL/context terms already keep what the GPU needs free)",
    "safety_margin_gib": "GiB kept free on top of every modelled term (default 1.0)",
    "stack": "what runs the training: hf (Trainer, TRL, LLaMA-Factory, axolotl; default), "
    "accelerate (a plain loop, e.g. our recipes) or deepspeed (optimizer from the JSON)",
    "optimizer": "optimizer implementation (default: what the stack runs; hf: adamw_torch_fused)",
    "loss_kernel": "default: the stack's own (hf stack: trl_logps for grpo, hf otherwise); "
    "hf (full-vocabulary fp32 logits: HF Trainer, LLaMA-Factory), liger (fused linear "
    "cross-entropy), trl_fused (TRL >= 1.16's chunked LM head in its SFT/DPO/GRPO trainers) or "
    "trl_logps (TRL 0.14-1.15 DPO/GRPO: bf16 logits and row-wise log_softmax)",
    "padding": "micro batches padded to their longest sequence (default: yes when a forward "
    "carries more than one sequence, and for dpo and grpo); --no-padding for packed, "
    "padding-free or equal-length batches",
    "precompute_ref": "dpo: reference log-probs precomputed (TRL precompute_ref_log_probs)",
    "vllm_gpu_memory_utilization": "grpo: colocated vLLM's share of each GPU (e.g. 0.3)",
    "steps_per_generation": "grpo: micro batches generated at once (default: grad accumulation)",
    "pin_memory": "offload buffers in page-locked host RAM, DeepSpeed's pin_memory (default: "
    "on, off when only unpinned buffers fit the node's RAM)",
    "host_ram_gib": "host RAM per node in GiB (default: this node's, from /proc/meminfo)",
    "weights_dtype": "stage 0 without DeepSpeed: dtype the weights are loaded in, fp32 (default: "
    "TRL given a model name, our recipes) or bf16 (torch_dtype=bfloat16; Adam states and grads "
    "then are bf16 too)",
    "autocast": "stage 0 without DeepSpeed: the forward runs under torch.autocast (default: the "
    "HF Trainer, TRL, accelerate's mixed precision); --no-autocast for a plain PyTorch loop that "
    "computes in the weights' dtype (bf16 weights: --weights-dtype bf16), where peft's fp32 "
    "adapters then save fp32 copies of their inputs",
    "interconnect": "the GPUs' link inside a node: auto (default: the GPU's usual one, NVLink on "
    "SXM parts, PCIe on PCIe cards), nvlink, or pcie (the card's PCIe generation at x16: "
    "Gen5 64 GB/s per direction on Hopper/Blackwell, Gen4 32 on Ampere/Ada, Gen3 16 on "
    "Volta/Turing)",
    "inter_node_gbps": "network between nodes in Gbit/s per node, as NICs are sold (default: "
    "--cluster-facts, else 100; only matters on more than one node)",
    "intra_node_gbps": "measured link inside a node in GB/s per GPU, one direction (default: what "
    "--interconnect implies)",
    "dataset_tokens": "tokens in one epoch of the data: with it, the run's wall time is reported",
    "dataset_samples": "samples in one epoch (instead of --dataset-tokens): one sequence each, "
    "or packed into --seq-len tokens with --no-padding",
    "avg_seq_len": "average tokens per sample, with --dataset-samples (default: --seq-len)",
    "epochs": "passes over the data (default 1; may be fractional)",
    "finetuning": "full (every weight trains; default), lora (PEFT adapters on a frozen base) or "
    "qlora (adapters on a bitsandbytes 4-bit NF4 base, double quantization)",
    "lora_rank": "lora/qlora: the adapters' rank r (default 16, TRL's lora_r)",
    "lora_targets": "lora/qlora: all-linear (default: every linear layer but the LM head), "
    "attention (q/k/v/o), peft-default (what peft adapts when LoraConfig gets no "
    "target_modules: q_proj,v_proj for Llama, Qwen, Mistral, Gemma), or module names as PEFT "
    "takes them, e.g. q_proj,v_proj",
    "lora_dropout": "lora/qlora: dropout on the adapters' input (default 0.05, TRL's; 0 keeps no "
    "mask or dropped copy)",
}
# Flags named otherwise than their field: the first name is the documented one; the others keep
# older spellings working (--flavour) or match launch/doctor's names for one thing (--main-addr,
# --main-port).
_FLAG_NAMES = {
    "num_nodes": ["--num-nodes", "--nodes"],
    "flavour": ["--flavor", "--flavour"],
    "main_process_ip": ["--main-process-ip", "--main-addr"],
    "main_process_port": ["--main-process-port", "--main-port"],
}


def flag_type(name: str) -> type:
    """bool, int, float or str: what the field holds besides None (a Literal: its values' type).

    Read from the field's annotation (typing.get_type_hints resolves them and drops the Annotated
    bounds), so a new field gets the right flag without a table here.
    """
    hint = typing.get_type_hints(Answers)[name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    if typing.get_origin(hint) is typing.Literal:
        return type(typing.get_args(hint)[0])
    return hint


def add_answer_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--answers FILE``, ``--cluster-facts FILE`` and one flag per Answers field (default
    None = not given)."""
    parser.add_argument(
        "--answers", metavar="FILE", help="answers.yaml to start from (flags override it)"
    )
    parser.add_argument(
        "--cluster-facts",
        metavar="FILE",
        help="the network `zerofit doctor` measured (inter- and intra-node bandwidth); flags "
        "override it",
    )
    for f in fields(Answers):
        names = _FLAG_NAMES.get(f.name, ["--" + f.name.replace("_", "-")])
        kwargs: dict = {"dest": f.name, "default": None, "help": _HELP.get(f.name)}
        kind = flag_type(f.name)
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
            if f.name in _CHOICES:
                kwargs["choices"] = _CHOICES[f.name]
            kwargs["metavar"] = names[0].lstrip("-").replace("-", "_").upper()
        parser.add_argument(*names, **kwargs)


def answers_from_args(args: argparse.Namespace) -> Answers:
    """Answers from ``--answers FILE`` (if any) overlaid with the flags the user gave."""
    base: dict = {}
    if getattr(args, "answers", None):
        path = Path(args.answers)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ZerofitError(
                "--answers", f"cannot read {path} ({exc.strerror})", "give an existing answers.yaml"
            ) from None
        base = answers_to_dict(load_answers(text))
    given = given_flags(args)
    base.update(cluster_facts_answers(getattr(args, "cluster_facts", None), given))
    base.update(given)
    return answers_from_dict(base)


def given_flags(args: argparse.Namespace) -> dict:
    """The Answers fields the user gave on the command line."""
    return {
        f.name: getattr(args, f.name)
        for f in fields(Answers)
        if getattr(args, f.name, None) is not None
    }


def cluster_facts_answers(path: str | None, given: dict) -> dict:
    """The network fields a ``--cluster-facts`` file fills (zerofit.cluster_facts), leaving out
    those a flag gives: flags win over the measurement (``--interconnect`` over the measured
    link inside a node, too)."""
    if not path:
        return {}
    from zerofit.cluster_facts import load_cluster_facts

    facts = load_cluster_facts(path)
    filled = {}
    if "inter_node_gbps" not in given:
        filled["inter_node_gbps"] = facts.inter_node_gbps
    if facts.intra_node_gbps is not None and not {"intra_node_gbps", "interconnect"} & set(given):
        filled["intra_node_gbps"] = facts.intra_node_gbps
    return filled
