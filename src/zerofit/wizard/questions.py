"""The wizard's questions as data: what to ask, when, with which default and validation.

No prompting happens here (zerofit.wizard.prompts turns these records into questionary prompts), so
every ``when``/``validate``/``default`` is a plain function of the answers so far and can be
unit-tested without a terminal. ``answers`` is always a dict of Answers field -> typed value,
starting from the pre-filled Answers (flags, answers file, detected GPU).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from zerofit.errors import ZerofitError
from zerofit.hardware import CATALOG, lookup
from zerofit.planning.answers import (
    LAUNCHERS,
    MAX_INTER_NODE_GBPS,
    OFFLOAD_DEVICES,
    PRECISIONS,
    STACKS,
    WEIGHTS_DTYPES,
    Answers,
    answers_to_dict,
)

Validator = Callable[[str, dict], "bool | str"]
AUTO = "auto"  # select value meaning "planner decides" (stored as None in Answers)


class _Back:
    """The answer "go back to the previous question" (a select's last choice, or "<" typed)."""

    def __repr__(self) -> str:
        return "BACK"


BACK = _Back()
BACK_TITLE = "← back"
BACK_TEXT = "<"  # typed alone into a text question: back (blank already means "planner decides")


def _always(answers: dict) -> bool:
    return True


def _accept(text: str, answers: dict) -> bool | str:
    return True


def _identity(text: Any) -> Any:
    return text


@dataclass(frozen=True)
class Question:
    """One prompt. ``default`` and ``message`` may be callables of the answers so far."""

    name: str  # the Answers field it fills
    kind: str  # text | select | confirm | autocomplete
    message: str | Callable[[dict], str]
    default: Any = None
    choices: tuple[tuple[Any, str], ...] = ()  # (value, title); autocomplete: (name, meta)
    when: Callable[[dict], bool] = _always
    validate: Validator = _accept  # cheap, runs as the user types (text kinds)
    convert: Callable[[Any], Any] = _identity  # prompt result -> Answers value
    check: Callable[[Any], "bool | str"] | None = None  # slow check after Enter (may do I/O)
    warn: Callable[[Any, dict], "str | None"] | None = None  # accepted, but worth a warning
    label: str = ""  # short name in the plan menu's "change an answer" list ("number of nodes")


def default_for(q: Question, answers: dict) -> Any:
    """The Answers-typed default of ``q`` given the answers so far."""
    return q.default(answers) if callable(q.default) else q.default


def message_for(q: Question, answers: dict) -> str:
    return q.message(answers) if callable(q.message) else q.message


def shown_default(q: Question, value: Any) -> Any:
    """What the prompt of ``q`` starts on to show the Answers value ``value`` again: the choice
    whose conversion gives it (a select), or its text (text kinds)."""
    if q.kind == "select":
        return next((choice for choice, _ in q.choices if q.convert(choice) == value), None)
    return to_text(value)


def still_valid(q: Question, answers: dict) -> bool:
    """Whether the recorded answer to ``q`` passes its validation against the other answers (a
    global batch of 16 stops being a multiple of the GPUs when the nodes go from 2 to 4)."""
    if q.kind == "select":
        return True  # the choices do not depend on other answers
    return q.validate(to_text(answers.get(q.name)), answers) is True


def to_text(value: Any) -> str:
    """How a typed default is shown in a text prompt (None -> empty, i.e. "planner decides";
    1024.0 GiB -> "1024")."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


def apply_defaults(questions: Sequence[Question], answers: dict) -> dict:
    """Answer every asked question with its default (``--defaults``): the prompts' own walk."""
    start, answers = answers, dict(answers)
    for q in questions:
        if q.when(answers):
            value = default_for(q, answers)
            # a select's default may be one of its choices ("padded", "default"): the prompt
            # converts what is picked, so this walk converts the default the same way
            answers[q.name] = q.convert(value) if q.kind == "select" else value
    return settle(answers, start)


def gpu_precision(gpu: str) -> str:
    """What ``precision: null`` resolves to on ``gpu`` (the planner's rule, the default shown)."""
    return "bf16" if lookup(gpu).bf16 else "fp16"


def settle(answers: dict, start: dict) -> dict:
    """Keep ``None`` ("derive it") where the user accepted the derived value.

    A precision that was unset and was answered with the GPU's own default stays unset, so
    answers.yaml keeps following the GPU and matches what `zerofit config` writes for the same
    flags.
    """
    answers = dict(answers)
    if start.get("precision") is None and answers.get("precision") == gpu_precision(answers["gpu"]):
        answers["precision"] = None
    return answers


# --- validators: return True or the message shown under the prompt -------------------------


def int_text(lo: int = 1, hi: int = 1 << 30, blank_ok: bool = False) -> Validator:
    """Validator for a whole number in [lo, hi]; blank allowed when ``blank_ok``."""

    def check(text: str, answers: dict) -> bool | str:
        text = text.strip()
        if not text:
            return True if blank_ok else f"enter a whole number from {lo}"
        if not text.isdigit():
            return "enter a whole number" + (" (or leave blank)" if blank_ok else "")
        if not lo <= int(text) <= hi:
            return f"use {lo}-{hi}"
        return True

    return check


def _optional_int(text: Any) -> int | None:
    text = str(text).strip()
    return int(text) if text else None


def _validate_model(text: str, answers: dict) -> bool | str:
    ref = text.strip()
    if not ref:
        return "enter a built-in name (Tab completes), a config.json, a model directory or a hub id"
    if " " in ref:
        return "no spaces in a model reference"
    looks_local = ref.startswith(("/", "./", "../", "~")) or ref.endswith(".json")
    if looks_local and not os.path.exists(os.path.expanduser(ref)):
        return f"no such file or directory: {ref}"
    return True


def _check_model(ref: str) -> bool | str:
    """Resolve the model once after Enter, so a typo is caught here and not after every question."""
    from zerofit.models.resolve import (
        resolve_model,
    )  # local: resolution may need transformers or the hub

    try:
        resolve_model(ref)
    except ZerofitError as err:
        return err.render()
    return True


def _validate_host(text: str, answers: dict) -> bool | str:
    text = text.strip()
    if not text:
        return "enter the main node's address (IP or hostname every node can reach)"
    # One colon is host:port; IPv6 addresses have several.
    if any(c.isspace() for c in text) or "://" in text or text.count(":") == 1:
        return "address only: no scheme, port or spaces (the port is the next question)"
    return True


def warn_main_address(addr: str, answers: dict) -> str | None:
    """A loopback main address in a multi-node plan: every other node would dial itself."""
    loopback = addr in ("localhost", "::1") or addr.startswith("127.")
    if loopback and answers.get("num_nodes", 1) > 1:
        return (
            f"{addr} is this machine's loopback address: the other nodes cannot reach it; "
            "use the main node's address on the cluster network"
        )
    return None


def warn_main_port(port: int, answers: dict) -> str | None:
    """Ports the rendezvous should not use: ssh's, and privileged ones (root-only to bind)."""
    if port == 22:
        return "port 22 is ssh's: the rendezvous cannot bind it where sshd runs; use e.g. 29500"
    if port < 1024:
        return (
            f"port {port} is privileged (only root may bind it); use a port above 1023, e.g. 29500"
        )
    return None


def _validate_seq_len(text: str, answers: dict) -> bool | str:
    ok = int_text(16, 1 << 20)(text, answers)
    if ok is not True:
        return ok
    if answers.get("workload") == "grpo" and int(text) <= answers.get("completion_len", 0):
        return (
            f"must exceed the completion length {answers['completion_len']} (prompt + completion)"
        )
    return True


def _validate_global_batch(text: str, answers: dict) -> bool | str:
    ok = int_text(blank_ok=True)(text, answers)
    if ok is not True or not text.strip():
        return ok
    value, world = int(text), answers["gpus_per_node"] * answers["num_nodes"]
    # DeepSpeed asserts train_batch_size == micro * accum * world_size at start-up.
    if value % world:
        return f"must be a multiple of the {world} GPUs (micro batch x accumulation x GPUs)"
    if answers.get("workload") == "grpo" and value % answers["num_generations"]:
        return f"must be a multiple of num_generations ({answers['num_generations']})"
    return True


def _default_seq_len(base: Answers) -> Callable[[dict], int]:
    def default(answers: dict) -> int:
        if answers.get("workload") == "grpo" and base.seq_len <= answers["completion_len"]:
            return answers["completion_len"] + 512  # room for a typical prompt
        return base.seq_len

    return default


def _default_global_batch(base: Answers) -> Callable[[dict], int | None]:
    def default(answers: dict) -> int | None:
        if base.global_batch is None:
            return None
        return (
            base.global_batch
            if _validate_global_batch(str(base.global_batch), answers) is True
            else None
        )

    return default


def _default_precision(base: Answers) -> Callable[[dict], str]:
    def default(answers: dict) -> str:
        if base.precision:
            return base.precision
        return gpu_precision(answers["gpu"])

    return default


def _precision_message(answers: dict) -> str:
    spec = lookup(answers["gpu"])
    return f"Precision ({spec.key} {'supports' if spec.bf16 else 'has no'} bf16)"


def _global_batch_message(answers: dict) -> str:
    world = answers["gpus_per_node"] * answers["num_nodes"]
    return f"Global batch, sequences per optimizer step on all {world} GPUs (blank: planner picks)"


def _multi_node(answers: dict) -> bool:
    return answers["num_nodes"] > 1


def is_this_machine(address: str) -> bool:
    """Whether ``address`` names this machine: loopback, its hostname or one of the addresses the
    hostname resolves to (stdlib only: no interface scan before the plan is shown)."""
    address = address.strip().lower()
    if address in ("localhost", "::1", "0.0.0.0") or address.startswith("127."):
        return True
    hostname = socket.gethostname().lower()
    if address in (hostname, hostname.split(".")[0]):  # no getfqdn: reverse DNS can stall
        return True
    try:
        _, aliases, addresses = socket.gethostbyname_ex(hostname)
    except OSError:  # the hostname does not resolve: nothing more to compare with
        return False
    return address in {name.lower() for name in aliases} | set(addresses)


def plan_is_for_other_machines(answers: dict) -> bool:
    """The training runs elsewhere: several nodes, or one node whose address is not this machine.
    Their RAM, not this machine's MemTotal (planner.host_ram_gib's fallback), budgets offload."""
    return _multi_node(answers) or not is_this_machine(str(answers["main_process_ip"]))


def _validate_host_ram(text: str, answers: dict) -> bool | str:
    text = text.strip()
    hint = "the RAM of one training node in GiB, e.g. 1024 (`free -g` on a node shows it)"
    try:
        value = float(text)
    except ValueError:
        return f"enter {hint}"
    if not 1 <= value <= 1 << 20:
        return f"use 1-{1 << 20}: {hint}"
    return True


def _validate_inter_node_gbps(text: str, answers: dict) -> bool | str:
    text = text.strip()
    if not text:
        return True  # the stated default, 100 Gbit/s
    hint = "Gbit/s per node, e.g. 100 for one 100G NIC, 25 for 25GbE (or leave blank for 100)"
    try:
        value = float(text)
    except ValueError:
        return f"enter {hint}"
    if not 0 < value <= MAX_INTER_NODE_GBPS:
        return f"use more than 0, at most {MAX_INTER_NODE_GBPS:g}: {hint}"
    return True


def _optional_float(text: Any) -> float | None:
    text = str(text).strip()
    return float(text) if text else None


def _grpo(answers: dict) -> bool:
    return answers["workload"] == "grpo"


def trains_an_encoder_decoder(answers: dict) -> bool:
    """Ask for the target length only for an encoder-decoder (T5): its decoder and loss run on
    the targets, often far shorter than the inputs (planner.takes_target_len). The model
    question already resolved the model once."""
    from zerofit.models.resolve import model_names, resolve_model  # local: may need transformers
    from zerofit.planning.planner import takes_target_len

    if answers["model"].lower() in model_names():  # the built-in shapes are decoders
        return False
    try:
        return takes_target_len(resolve_model(answers["model"]))
    except ZerofitError:
        return False


_STACK_TITLES = {
    "hf": "hf - transformers Trainer, TRL, LLaMA-Factory, axolotl",
    "accelerate": "accelerate - a plain training loop (our recipes)",
    "deepspeed": "deepspeed - optimizer and scheduler from the DeepSpeed JSON",
}


def _changes_plan(answers: dict, name: str, values: tuple) -> bool:
    """True when planning with each of ``values`` for ``name`` gives different plans."""
    from zerofit.planning.answers import answers_from_dict
    from zerofit.planning.plan import plan

    try:
        outcomes = {plan(answers_from_dict({**answers, name: value})).shape for value in values}
    except ZerofitError:
        return False
    return len(outcomes) > 1


def stack_matters(answers: dict) -> bool:
    """Ask for the training stack only when it changes the plan: each stack implies an optimizer
    and a loss path (memory/optimizers.py, memory/losses.py), so plan once per stack and compare."""
    return _changes_plan(answers, "stack", STACKS)


_WEIGHTS_TITLES = {
    "fp32": "fp32 - loaded without a dtype (TRL given a model name, our recipes)",
    "bf16": "bf16 - loaded with torch_dtype/dtype bfloat16 (grads and Adam states in bf16 too)",
}


def _fp32_is_the_default(value: str) -> str | None:
    """fp32 is what ``weights_dtype=None`` means: keep the answers file the flag path writes."""
    return None if value == "fp32" else value


def weights_dtype_matters(answers: dict) -> bool:
    """Ask for the weights' load dtype only when it changes the plan: it matters only for stage 0
    without DeepSpeed (memory/states.py), where fp32 weights need twice the bytes of bf16 ones."""
    if answers.get("precision") not in (None, "bf16"):
        return False
    return _changes_plan(answers, "weights_dtype", WEIGHTS_DTYPES)


_AUTOCAST_TITLES = {
    "autocast": "under torch.autocast (HF Trainer, TRL, accelerate with mixed precision)",
    "plain": "a plain loop in the weights' dtype (no torch.autocast)",
}


def autocast_matters(answers: dict) -> bool:
    """Ask whether the loop runs under autocast only when it changes the plan: without it a
    plain loop computes in the weights' dtype, and peft's fp32 adapters save fp32 copies of
    their inputs (memory/lora.py ``lora_path_bytes``)."""
    return _changes_plan(answers, "autocast", (True, False))


def _autocast_convert(value: str) -> bool:
    return value == "autocast"


_PADDING_TITLES = {
    "padded": "padded - each micro batch padded to its longest sequence (the usual collators)",
    "packed": "packed - packing, padding_free or equal-length rows (no padding)",
}


def padding_matters(answers: dict) -> bool:
    """Ask whether the batches are packed only when it changes the plan: a padded batch costs
    every sdpa layer a mask copy and K/V repeated to all heads (memory/activations.py)."""
    return _changes_plan(answers, "padding", (None, False))


def _padding_default(base: Answers) -> str:
    return "packed" if base.padding is False else "padded"


def _padding_convert(base: Answers) -> Callable[[str], bool | None]:
    """ "padded" keeps what the flags said (None: the collators' rule); "packed" is False."""

    def convert(value: str) -> bool | None:
        return False if value == "packed" else (base.padding or None)

    return convert


# "default" stands for loss_kernel None: the stack's own path (memory/losses.py:loss_path)
_LOSS_TITLES = {
    "default": "the stack's default (full fp32 logits; TRL 0.14-1.15's log-probs for grpo)",
    "trl_fused": "TRL >= 1.16's SFTTrainer / DPOTrainer / GRPOTrainer (fused LM head, no logits)",
    "liger": "Liger's fused linear cross-entropy (use_liger_kernel; sft and grpo)",
    "hf": "full fp32 logits (the HF Trainer's own loss, LLaMA-Factory, ms-swift)",
}


def loss_kernel_matters(answers: dict) -> bool:
    """Ask which loss the trainer computes only when it changes the plan: the full logits of a
    long sequence and a large vocabulary can decide the micro batch, TRL's fused head and Liger
    never build them (memory/losses.py)."""
    return _changes_plan(answers, "loss_kernel", (None, "trl_fused", "liger", "hf"))


def _loss_default(base: Answers) -> str:
    return base.loss_kernel or "default"


def _loss_convert(value: str) -> str | None:
    return None if value == "default" else value


_LAUNCHER_TITLES = {
    "accelerate": "accelerate launch --machine_rank R (one command per node)",
    "torchrun": "torchrun --nnodes/--node_rank (plain torchrun, c10d rendezvous)",
    "env": "environment variables MASTER_ADDR/RANK/... (your own launcher)",
    "slurm": "Slurm sbatch script (srun, rank from SLURM_NODEID)",
    "deepspeed": "deepspeed launcher with a hostfile (needs pdsh + passwordless ssh)",
}
_WORKLOAD_TITLES = {
    "sft": "sft  - supervised fine-tuning",
    "dpo": "dpo  - preference pairs + reference model",
    "grpo": "grpo - RL: generate completions, score, update",
}


def gpu_choices() -> tuple[tuple[str, str], ...]:
    """(key, title) for every catalog GPU,
    e.g. ('A100-80GB', 'A100-80GB  NVIDIA A100 80GB, 79.15 GiB, bf16')."""
    width = max(len(k) for k in CATALOG)
    return tuple(
        (
            g.key,
            f"{g.key:<{width}}  {g.name}, {g.memory_gib:g} GiB, {'bf16' if g.bf16 else 'no bf16'}",
        )
        for g in CATALOG.values()
    )


def _detected_words(detected: tuple[str | None, int]) -> str:
    """' (detected 4 x A100-80GB)', ' (detected 2 unknown GPUs)' or '' when nothing was found."""
    key, count = detected
    if key:
        return f" (detected {count} x {key})"
    return f" (detected {count} unknown GPUs)" if count else ""


def model_and_gpu_questions(
    base: Answers, detected: tuple[str | None, int], models: Sequence[tuple[str, str]]
) -> tuple[Question, ...]:
    """What to train and on which GPUs: model, GPU type, GPUs per node, number of nodes."""
    count = detected[1]
    return (
        Question(
            "model",
            "autocomplete",
            "Model: built-in name (Tab completes), config.json, model dir or hub id",
            base.model,
            choices=tuple(models),
            validate=_validate_model,
            convert=str.strip,
            check=_check_model,
            label="model",
        ),
        Question(
            "gpu",
            "select",
            "GPU" + _detected_words(detected),
            lookup(base.gpu).key,
            choices=gpu_choices(),
            label="GPU",
        ),
        Question(
            "gpus_per_node",
            "text",
            "GPUs per node" + (f" (detected {count})" if count else ""),
            base.gpus_per_node,
            validate=int_text(1, 64),
            convert=int,
            label="GPUs per node",
        ),
        Question(
            "num_nodes",
            "text",
            "Number of nodes",
            base.num_nodes,
            validate=int_text(1, 4096),
            convert=int,
            label="number of nodes",
        ),
    )


def cluster_questions(base: Answers) -> tuple[Question, ...]:
    """Where the nodes meet and how they start, and the RAM of nodes that are not this one."""
    return (
        Question(
            "main_process_ip",
            "text",
            "Main node address (IP or hostname, same on every node)",
            base.main_process_ip,
            when=_multi_node,
            validate=_validate_host,
            convert=str.strip,
            warn=warn_main_address,
            label="main node address",
        ),
        Question(
            "main_process_port",
            "text",
            "Main node port (free and reachable from every node)",
            base.main_process_port,
            when=_multi_node,
            validate=int_text(1, 65535),
            convert=int,
            warn=warn_main_port,
            label="main node port",
        ),
        Question(
            "launcher",
            "select",
            "Launch with",
            base.launcher,
            when=_multi_node,
            choices=tuple((n, _LAUNCHER_TITLES[n]) for n in LAUNCHERS),
            label="launcher",
        ),
        Question(
            "host_ram_gib",
            "text",
            "Host RAM per training node in GiB (what CPU offload may use; `free -g` on a node)",
            base.host_ram_gib,
            when=plan_is_for_other_machines,
            validate=_validate_host_ram,
            convert=float,
            label="host RAM per node (GiB)",
        ),
        Question(
            "inter_node_gbps",
            "text",
            "Network between nodes in Gbit/s per node (blank: 100; `zerofit doctor` measures it)",
            base.inter_node_gbps,
            when=_multi_node,
            validate=_validate_inter_node_gbps,
            convert=_optional_float,
            label="network between nodes (Gbit/s)",
        ),
    )


def workload_questions(base: Answers) -> tuple[Question, ...]:
    """What a training step does: workload, GRPO's generation, sequence length, batch, precision."""
    return (
        Question(
            "workload",
            "select",
            "Workload",
            base.workload,
            choices=tuple((n, t) for n, t in _WORKLOAD_TITLES.items()),
            label="workload",
        ),
        Question(
            "num_generations",
            "text",
            "GRPO completions per prompt (num_generations)",
            base.num_generations,
            when=_grpo,
            validate=int_text(2, 1024),
            convert=int,
            label="GRPO completions per prompt",
        ),
        Question(
            "completion_len",
            "text",
            "GRPO generated tokens per completion",
            base.completion_len,
            when=_grpo,
            validate=int_text(1, 1 << 20),
            convert=int,
            label="GRPO tokens per completion",
        ),
        Question(
            "seq_len",
            "text",
            lambda a: "Sequence length in tokens" + (" (prompt + completion)" if _grpo(a) else ""),
            _default_seq_len(base),
            validate=_validate_seq_len,
            convert=int,
            label="sequence length (seq_len)",
        ),
        Question(
            "target_len",
            "text",
            "Target length in tokens (the decoder's and the loss's; blank: the sequence length)",
            base.target_len,
            when=trains_an_encoder_decoder,
            validate=int_text(1, 1 << 20, blank_ok=True),
            convert=_optional_int,
            label="target length (target_len)",
        ),
        Question(
            "global_batch",
            "text",
            _global_batch_message,
            _default_global_batch(base),
            validate=_validate_global_batch,
            convert=_optional_int,
            label="global batch",
        ),
        Question(
            "precision",
            "select",
            _precision_message,
            _default_precision(base),
            choices=tuple((p, p) for p in PRECISIONS),
            label="precision",
        ),
    )


def training_stack_questions(base: Answers) -> tuple[Question, ...]:
    """How the trainer runs, each asked only where it changes the plan (each ``when`` plans)."""
    return (
        Question(
            "stack",
            "select",
            "What runs the training (it changes the plan here)",
            base.stack,
            when=stack_matters,
            choices=tuple((n, _STACK_TITLES[n]) for n in STACKS),
            label="training stack",
        ),
        Question(
            "loss_kernel",
            "select",
            "Which loss does the trainer compute (it changes the plan here)",
            _loss_default(base),
            when=loss_kernel_matters,
            choices=tuple((n, _LOSS_TITLES[n]) for n in _LOSS_TITLES),
            convert=_loss_convert,
            label="loss",
        ),
        Question(
            "padding",
            "select",
            "Are the training batches padded or packed (it changes the plan here)",
            _padding_default(base),
            when=padding_matters,
            choices=tuple((n, _PADDING_TITLES[n]) for n in _PADDING_TITLES),
            convert=_padding_convert(base),
            label="padded or packed batches",
        ),
        Question(
            "weights_dtype",
            "select",
            "Dtype the weights are loaded in (DDP without DeepSpeed; it changes the plan here)",
            base.weights_dtype,  # None: the select starts on fp32, what None means
            when=weights_dtype_matters,
            choices=tuple((n, _WEIGHTS_TITLES[n]) for n in WEIGHTS_DTYPES),
            convert=_fp32_is_the_default,
            label="weights dtype",
        ),
        Question(
            "autocast",
            "select",
            "How does the loop run the forward (DDP without DeepSpeed; it changes the plan here)",
            "autocast" if base.autocast else "plain",
            when=autocast_matters,
            choices=tuple((n, _AUTOCAST_TITLES[n]) for n in _AUTOCAST_TITLES),
            convert=_autocast_convert,
            label="autocast",
        ),
    )


def build_questions(
    base: Answers,
    detected: tuple[str | None, int] = (None, 0),
    models: Sequence[tuple[str, str]] = (),
) -> tuple[Question, ...]:
    """The wizard's questions, in order, with defaults taken from ``base``.

    Args:
        base: pre-filled Answers (flags, answers file and detected GPU already applied).
        detected: ``hardware.detect_local_gpus()`` result, only used to say what was found.
        models: (name, description) of built-in models, offered as completions.
    """
    return (
        model_and_gpu_questions(base, detected, models)
        + cluster_questions(base)
        + workload_questions(base)
        + training_stack_questions(base)
    )


def _auto(value: Any) -> Any:
    return None if value == AUTO else value


# Decisions the plan review lets the user override: name -> label shown in the menu.
OVERRIDABLE = {
    "stage": "ZeRO stage",
    "offload_optimizer": "optimizer offload",
    "offload_param": "parameter offload",
    "gradient_checkpointing": "gradient checkpointing",
    "micro_batch": "micro batch per GPU",
}


def override_question(name: str, current: Any, planned: Any) -> Question:
    """The follow-up question after choosing to override ``name``; 'auto' hands it back to the
    planner.

    ``current`` is the Answers value (None when the planner decides), ``planned`` what the plan
    chose.
    """
    label = "New " + OVERRIDABLE[name]
    default = AUTO if current is None else current
    auto_title = f"auto (planner decides; now {planned})"
    if name == "stage":
        choices = ((AUTO, auto_title),) + tuple((s, f"ZeRO-{s}") for s in (0, 1, 2, 3))
    elif name in ("offload_optimizer", "offload_param"):
        choices = ((AUTO, auto_title),) + tuple((d, d) for d in OFFLOAD_DEVICES)
    elif name == "gradient_checkpointing":
        choices = (
            (AUTO, auto_title),
            (True, "on (recompute activations, ~30% slower)"),
            (False, "off"),
        )
    else:
        return Question(
            name,
            "text",
            f"{label} (blank: planner decides; now {planned})",
            current,
            validate=int_text(1, 4096, blank_ok=True),
            convert=_optional_int,
        )
    return Question(name, "select", label, default, choices=choices, convert=_auto)


def nvme_question(current: str | None) -> Question:
    """Asked after an override picks nvme offload and no path is set yet."""
    return Question(
        "nvme_path",
        "text",
        "NVMe directory for offload (fast local disk on every node)",
        current or "/local_nvme",
        validate=lambda t, a: (
            True if t.strip().startswith("/") else "an absolute path, e.g. /local_nvme"
        ),
        convert=str.strip,
    )


def start_answers(base: Answers) -> dict:
    """The answers-so-far dict the questions start from."""
    return answers_to_dict(base)
