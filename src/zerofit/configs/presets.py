"""The shipped presets in deepspeed_configs/: built by the same builders as `zerofit config`.

Presets use the ``auto`` flavour so they run unchanged under HF Trainer / TRL and under
``accelerate launch`` with a script that passes its DataLoader to ``prepare()`` (accelerate then
fills batch sizes, accumulation, clipping and the hidden-size based stage-3 buckets).
The accelerate YAMLs fit one node of any size: they leave ``num_processes`` out, so
``accelerate launch`` takes it from ``--num_processes N`` (see render_preset_yaml).
"""

from __future__ import annotations

import json

from zerofit.configs.accelerate_yaml import build_accelerate_config, render_deepspeed_lines
from zerofit.configs.deepspeed_json import build_zero_config
from zerofit.planning.answers import Answers
from zerofit.planning.plan import Plan

PRESET_GPUS = 8
PRESET_DIR = "deepspeed_configs"

# name -> (stage, offload_optimizer, offload_param, when to use it)
PRESETS = {
    "zero1": (
        1,
        "none",
        "none",
        "model + grads fit on every GPU; shards only optimizer states (least communication)",
    ),
    "zero2": (
        2,
        "none",
        "none",
        "the default for fine-tuning up to ~13B on 80 GB GPUs; shards grads + optimizer",
    ),
    "zero2_offload": (
        2,
        "cpu",
        "none",
        "ZeRO-2 almost fits: optimizer states and step go to CPU RAM (slower step)",
    ),
    "zero3": (
        3,
        "none",
        "none",
        "weights alone crowd a GPU (30B+ or many nodes); shards parameters too",
    ),
    "zero3_offload": (
        3,
        "cpu",
        "cpu",
        "the model does not fit even sharded: parameters and optimizer in CPU RAM",
    ),
}
YAMLS = {
    "multi_gpu": (0, "plain DDP, no DeepSpeed: small models where a full copy per GPU fits"),
    "zero1": (1, "accelerate + deepspeed_configs/zero1.json"),
    "zero2": (2, "accelerate + deepspeed_configs/zero2.json"),
    "zero3": (3, "accelerate + deepspeed_configs/zero3.json (zero3_init_flag on)"),
}


def preset_plan(stage: int, offload_optimizer: str = "none", offload_param: str = "none") -> Plan:
    """A model-independent Plan for a preset: 1 node x 8 GPUs, bf16, auto flavour."""
    from zerofit.hardware import lookup

    answers = Answers(
        gpu="H100-SXM",
        gpus_per_node=PRESET_GPUS,
        precision="bf16",
        flavour="auto",
        stage=stage,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        micro_batch=1,
    )
    # hidden_size does not reach the files: stage-3 buckets are "auto", stage-1/2 ones constants.
    return Plan(
        answers=answers,
        gpu=lookup(answers.gpu),
        model_name="any",
        params=0,
        hidden_size=4096,
        precision="bf16",
        world_size=PRESET_GPUS,
        stage=stage,
        offload_optimizer=offload_optimizer,
        offload_param=offload_param,
        gradient_checkpointing=False,
        micro_batch=1,
        grad_accum=1,
        global_batch=PRESET_GPUS,
        peak_gib=0.0,
        fits=True,
    )


def render_presets() -> dict[str, str]:
    """{relative path under deepspeed_configs/: text} for every preset file and the README."""
    files = {}
    for name, (stage, opt, par, _) in PRESETS.items():
        files[f"{name}.json"] = (
            json.dumps(build_zero_config(preset_plan(stage, opt, par)), indent=2) + "\n"
        )
    for name, (stage, _) in YAMLS.items():
        files[f"accelerate/{name}.yaml"] = render_preset_yaml(stage)
    files["README.md"] = render_readme()
    return files


def render_preset_yaml(stage: int) -> str:
    """An accelerate YAML for one node with any number of GPUs: no ``num_processes`` in it.

    accelerate commands/launch.py ``_validate_launch_command``: with a config file, accelerate
    never counts the GPUs itself; a ``num_processes`` absent from the file stays ClusterConfig's
    -1 and the launch stops with "You need to manually pass in `--num_processes` using this
    config yaml", while ``--num_processes N`` on the command line wins over the file. So a
    missing count fails loudly instead of starting 8 processes on a 4-GPU node.
    """
    import yaml

    plan = preset_plan(stage)
    ds_file = f"{PRESET_DIR}/zero{stage}.json"
    cfg = build_accelerate_config(plan, ds_config_file=ds_file)
    del cfg["num_processes"]
    header = [
        "# accelerate config written by zerofit for one node of any size: pass --num_processes N,",
        '# the node\'s GPU count (e.g. --num_processes "$(nvidia-smi -L | wc -l)").',
        *render_deepspeed_lines(plan, ds_file),
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump(cfg, sort_keys=False)


def render_readme() -> str:
    """deepspeed_configs/README.md: when to use which preset, and how they are made."""
    rows = "\n".join(
        f"| `{n}.json` | {s} | {o} | {p} | {why} |" for n, (s, o, p, why) in PRESETS.items()
    )
    yrows = "\n".join(f"| `accelerate/{n}.yaml` | {why} |" for n, (_, why) in YAMLS.items())
    return f"""# DeepSpeed presets

Generated by `zerofit presets --write --force` from the same builder as `zerofit config`; do not
edit by hand (a test keeps these files equal to the builder). For a config fitted to your model,
GPUs and batch size, run `zerofit config` instead.

| file | ZeRO stage | optimizer offload | parameter offload | use when |
|---|---|---|---|---|
{rows}

| accelerate config | what |
|---|---|
{yrows}

```bash
# --num_processes: this node's GPU count (the YAMLs leave it out, so they fit any node)
accelerate launch --config_file deepspeed_configs/accelerate/zero2.yaml --num_processes 8 \\
    train.py --bf16  # HF Trainer / TRL
accelerate launch --config_file deepspeed_configs/accelerate/zero2.yaml \\
    --num_processes "$(nvidia-smi -L | wc -l)" --mixed_precision bf16 my_accelerate_loop.py
```

Number of processes: the YAMLs set no `num_processes`, so one file serves a node with any number
of GPUs. Pass `--num_processes N` (the node's GPU count) to `accelerate launch`; without it,
accelerate stops with "You need to manually pass in `--num_processes` using this config yaml"
instead of guessing (given a config file, it never counts the GPUs itself: accelerate's
`commands/launch.py`, `_validate_launch_command`). To fix a count, add `num_processes: 4` to a
copy of the YAML. For several nodes, run `zerofit config --num-nodes ...`: it writes the total
count (every GPU of every node) and the main node's address, and `zerofit launch` writes each
node's command.

What every preset does, and why:

- **Precision is "auto"** (`"fp16": {{"enabled": "auto", ...loss scaling}}`,
  `"bf16": {{"enabled": "auto"}}`, as in the HF docs' templates): HF Trainer / TRL take it from
  `--bf16` / `--fp16`, `accelerate launch` from `--mixed_precision bf16`. Pass one: without it the
  run is fp32 (twice the activation memory).
  GPUs without bf16 (V100, T4): pass `--fp16`.
- **"auto" batch sizes, accumulation, clipping, stage-3 buckets**: HF Trainer / TRL fill them from
  their arguments; `accelerate launch` fills them when the script passes its DataLoader to
  `accelerator.prepare()` (clipping becomes 1.0, accumulation the Accelerator's). The plain
  `deepspeed` launcher and `deepspeed.initialize` reject "auto" (`zerofit check` says so): use
  `zerofit config --flavour explicit` for those.
- **overlap_comm + contiguous_gradients on**, stage-1/2 buckets 5e8 elements (DeepSpeed's defaults).
- **No `optimizer` / `scheduler` block**: your script's optimizer is used. With CPU optimizer
  offload, accelerate swaps a torch AdamW for DeepSpeed's DeepSpeedCPUAdam (vectorised CPU Adam;
  compiled once, ~80 s, then cached). It keeps lr and weight decay; other AdamW arguments (betas,
  eps) take DeepSpeed's defaults.
- **ZeRO-3 saves real weights**: `stage3_gather_16bit_weights_on_model_save: true`.
- **`_comment`**: a one-line description; DeepSpeed ignores unknown top-level keys.

Paths: `deepspeed_config_file` in the accelerate YAMLs is `deepspeed_configs/zeroN.json`, opened
relative to the directory you launch from (the repository root). If you copy a YAML elsewhere, copy
its JSON too and fix the path, or override it: `accelerate launch --config_file zero2.yaml
--deepspeed_config_file /path/zero2.json train.py`. The YAMLs set no `mixed_precision`, because
accelerate refuses it next to a `deepspeed_config_file` (precision lives in the JSON);
`multi_gpu.yaml` sets `mixed_precision: bf16`.
"""


def describe_presets() -> list[tuple[str, str]]:
    """(file, when to use it) for `zerofit presets`."""
    return [(f"{n}.json", why) for n, (_, _, _, why) in PRESETS.items()] + [
        (f"accelerate/{n}.yaml", why) for n, (_, why) in YAMLS.items()
    ]
