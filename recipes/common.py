"""What the recipes (sft.py, dpo.py, grpo.py) share besides arguments (arguments.py) and the run
directory (run_dir.py): data files and the data order, the tiny offline model, loading `--model`,
and the accelerate/DeepSpeed setup of a process.

Each recipe imports this file from its own folder; it needs only torch, accelerate, transformers
and pyyaml (the zerofit package is not required to run a recipe). What a recipe *does* (its data
format, loss and loop) stays in the recipe file. torch, transformers and accelerate are imported
inside the functions that use them, so a recipe refuses bad input before loading them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import lora
from arguments import RunArgs, fail, looks_like_path, note


# ----------------------------------------------------------------------------- the launcher
def exit_with_launcher() -> None:
    """Under torch elastic (`accelerate launch` with several processes, torchrun), die with the
    launcher: a SIGKILL to `accelerate launch`'s process group otherwise leaves the ranks
    running, since the elastic agent starts each rank in a session of its own
    (torch/distributed/elastic/multiprocessing/subprocess_handler: start_new_session=True),
    and orphaned ranks kept writing into a directory that a resumed run was using.

    prctl(PR_SET_PDEATHSIG, SIGKILL) asks the kernel to kill this process the moment its parent
    (the elastic agent, inside the launcher process) exits. Chosen over a thread polling
    os.getppid(): no polling delay, no extra thread in every rank, and it works while the rank
    sits in a collective or in C code. The kernel ties the signal to the parent *thread* that
    forked; the agent starts workers from its main thread, so that is the launcher's lifetime.
    Checkpoints are written to a temp dir and renamed, so the kill cannot leave a torn one.
    Plain `python recipes/x.py` is left alone: a run under nohup must outlive its shell."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
        note(f"cannot tie this rank to its launcher (prctl: {os.strerror(ctypes.get_errno())})")


# ----------------------------------------------------------------------------- data files
def read_rows(dataset: str, split: str) -> list[dict]:
    """Rows of a .jsonl (one JSON object per line) or .json (a list) file, or of a datasets name."""
    if os.path.isfile(dataset):
        return read_json_rows(dataset)
    if looks_like_path(dataset):
        fail(
            "dataset",
            f"no such file {dataset}",
            "check the path (a relative one in a --config YAML is read from the YAML's directory)",
        )
    try:
        import datasets  # optional: only for hub datasets
    except ImportError:
        fail(
            "dataset",
            f"{dataset!r} is not a local file and `datasets` is not installed",
            "pass a .jsonl/.json file or `pip install datasets`",
        )
    try:
        return list(datasets.load_dataset(dataset, split=split))
    except Exception as e:  # network, unknown name, bad split: one line in the library's words
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        fail(
            "dataset",
            f"cannot load {dataset!r} split {split!r}: {first}",
            "check the name and split",
        )


def read_json_rows(path: str) -> list[dict]:
    with open(path) as f:
        text = f.read()
    if path.endswith(".json"):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            fail("dataset", f"{path} is not JSON (line {e.lineno}: {e.msg})", "fix the file")
        if not isinstance(rows, list):
            fail(
                "dataset",
                f"{path} holds a {type(rows).__name__}, not a list of rows",
                "write a JSON list of objects, or one object per line in a .jsonl file",
            )
        return rows
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            fail(
                "dataset", f"{path} line {number} is not JSON ({e.msg})", "one JSON object per line"
            )
    return rows


def check_rows(rows: list, fields: tuple[str, ...], where: str) -> None:
    """Every row an object with each field a string; the first bad row gets a one-line error."""
    wanted = " and ".join(f"`{f}`" for f in fields)
    if not rows:
        fail("dataset", f"{where} has no rows", f"give rows with {wanted}")
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            fail(
                "dataset",
                f"{where} row {number} is a {type(row).__name__}, not an object",
                f"give rows with {wanted}",
            )
        for field in fields:
            if field not in row:
                fail(
                    field,
                    f"{where} row {number} has no `{field}`: needs rows with {wanted}",
                    "rename your columns",
                )
            if not isinstance(row[field], str):
                fail(
                    field,
                    f"{where} row {number}: `{field}` is a {type(row[field]).__name__}, "
                    "not a string",
                    f"make `{field}` a string",
                )


def sample_indices(step: int, num_rows: int, per_step: int, seed: int) -> list[int]:
    """Rows used at `step`: a fixed function of the step, so a resumed run sees the same order.

    >>> sample_indices(0, 4, 3, 0) + sample_indices(1, 4, 3, 0) == sample_indices(0, 4, 6, 0)
    True
    """
    import torch

    out, perms = [], {}
    for pos in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(pos, num_rows)  # reshuffle every epoch, seeded by (seed, epoch)
        if epoch not in perms:
            generator = torch.Generator().manual_seed(seed * 1000 + epoch)
            perms[epoch] = torch.randperm(num_rows, generator=generator)
        out.append(int(perms[epoch][i]))
    return out


def rank_indices(step: int, num_rows: int, per_rank: int, world: int, rank: int, seed: int):
    """This rank's rows for `step` (1-based): its slice of the step's global batch."""
    everyone = sample_indices(step - 1, num_rows, per_rank * world, seed)
    return everyone[rank * per_rank : (rank + 1) * per_rank]


def micro_batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def pad_right(rows: list[list[int]], value: int):
    """A [len(rows), longest] tensor, each row filled with `value` after its end."""
    import torch

    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows])


# ----------------------------------------------------------------------------- tiny model
TINY_CHARS = "0123456789+-*=()., "
# role-free template: the prompt text, then the answer and EOS for assistant turns
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] }}<eos>"
    "{% else %}{{ m['content'] }}{% endif %}{% endfor %}"
)


def build_tiny_tokenizer():
    """Character-level tokenizer for the toy tasks, built locally (no download)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *TINY_CHARS])}
    # no merges: one token per character
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def build_tiny_model(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2):
    """Random-init Qwen2-architecture causal LM sized for CPU tests."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg)


def load_tokenizer(args: RunArgs):
    """`--model`'s tokenizer (the tiny one without --model), padding left, with a pad token."""
    if not args.model:
        tok = build_tiny_tokenizer()
    else:
        check_model_path(args.model)
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(args.model)
        except Exception as e:  # OSError (not found / offline), ValueError (not a tokenizer), ...
            fail(
                "model",
                f"cannot load a tokenizer from {args.model!r}: {first_line(e)}",
                "pass a local model directory or a hub id reachable from here",
            )
    tok.pad_token = tok.pad_token or tok.eos_token
    return tok


def load_model(args: RunArgs, tokenizer, dtype=None):
    """`--model` as a causal LM (the tiny random-init one without --model), in `dtype`.

    fp32 by default: a full fine-tune's master weights (DeepSpeed or autocast compute in the
    config's bf16/fp16). A LoRA run passes its compute dtype for the frozen base
    (lora.frozen_base_dtype), what zerofit's memory model counts for it."""
    import torch

    dtype = dtype or torch.float32
    if not args.model:
        return build_tiny_model(tokenizer, args.seed).to(dtype)
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    except Exception as e:
        fail(
            "model",
            f"cannot load a causal LM from {args.model!r}: {first_line(e)}",
            "pass a local model directory (config.json + weights) or a hub id",
        )


def load_policy(args: RunArgs, tokenizer, accelerator):
    """The model to train, before accelerator.prepare: `--model` (or the tiny one) for a full
    fine-tune, with LoRA adapters for `--finetuning lora`, in 4-bit NF4 with adapters for
    qlora; with gradient checkpointing when asked (lora.py says how PEFT needs it)."""
    if args.finetuning == "full":
        model = load_model(args, tokenizer)
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        return model
    if args.finetuning == "qlora":
        model = lora.load_quantized_model(args, tokenizer, accelerator, build_tiny_model)
    else:
        model = load_model(args, tokenizer, dtype=lora.frozen_base_dtype(accelerator))
    return lora.add_adapters(args, model, accelerator)


def check_model(model: str) -> None:
    """`--model` before the heavy imports: a local directory with a config.json, or a hub id
    that is cached or answers (one line within seconds, not after the hub client's retries)."""
    if model:
        check_model_path(model)
        if not os.path.isdir(model):
            check_hub_model(model)


HUB_PROBE_TIMEOUT_S = 2.0  # a reachable hub answers in ~0.2 s; zerofit's own probe allows 1 s


def check_hub_model(model: str) -> None:
    """A hub id missing from the local cache: one HEAD request for its config.json with a hard
    deadline, the probe zerofit runs (src/zerofit/models/resolve.py, `_hub_head`).

    transformers' from_pretrained retries an unreachable hub with back-off for ~54 s before its
    error (huggingface_hub/file_download.py, the `_DEFAULT_RETRY_ON_EXCEPTIONS` branch);
    `get_hf_file_metadata` does not retry. It runs in a daemon thread because the HTTP
    client's timeout applies per phase (connect, read) and a silent server outlasts it.
    Offline mode (HF_HUB_OFFLINE) and a cached config.json skip the probe."""
    import threading

    from huggingface_hub import (
        constants,
        errors,
        get_hf_file_metadata,
        hf_hub_url,
        try_to_load_from_cache,
    )

    if constants.HF_HUB_OFFLINE:
        return
    try:
        if isinstance(try_to_load_from_cache(model, "config.json"), str):
            return
    except errors.HFValidationError:
        return  # not a hub id at all: from_pretrained names the problem
    outcome: list = []

    def head() -> None:
        try:
            get_hf_file_metadata(hf_hub_url(model, "config.json"), timeout=HUB_PROBE_TIMEOUT_S)
            outcome.append(None)
        except Exception as err:  # handed to the main thread below
            outcome.append(err)

    # telemetry off for the probe: the user-agent header would first fetch an agent registry from
    # the hub, with its own 3 s timeout (huggingface_hub/utils/_headers.py, _http_user_agent)
    telemetry = constants.HF_HUB_DISABLE_TELEMETRY
    constants.HF_HUB_DISABLE_TELEMETRY = True
    worker = threading.Thread(target=head, daemon=True)
    worker.start()
    worker.join(HUB_PROBE_TIMEOUT_S)
    constants.HF_HUB_DISABLE_TELEMETRY = telemetry
    if not outcome:
        fail(
            "model",
            f"no answer from the Hugging Face Hub ({constants.ENDPOINT}) about {model!r} "
            f"in {HUB_PROBE_TIMEOUT_S:g} s",
            "check the network (or HF_ENDPOINT), or download the model and pass its directory",
        )
    if outcome[0] is not None:
        fail("model", hub_problem(model, outcome[0], errors), hub_fix(outcome[0], errors))


def hub_problem(model: str, err: Exception, errors) -> str:
    """What the hub's answer (or the lack of one) means for `--model`, in one phrase."""
    if isinstance(err, errors.GatedRepoError):
        return f"{model} is gated on the Hugging Face Hub"
    if isinstance(err, errors.RepositoryNotFoundError):
        return f"{model!r} is not a local directory or a model on the Hugging Face Hub"
    if isinstance(err, (errors.RemoteEntryNotFoundError, errors.EntryNotFoundError)):
        return f"hub repo {model} has no config.json"
    return f"cannot reach the Hugging Face Hub for {model} ({first_line(err)})"


def hub_fix(err: Exception, errors) -> str:
    if isinstance(err, errors.GatedRepoError):
        return "accept its licence on the model page and run `hf auth login`"
    if isinstance(err, errors.RepositoryNotFoundError):
        return "check the id (private repos need `hf auth login`), or pass a local directory"
    if isinstance(err, (errors.RemoteEntryNotFoundError, errors.EntryNotFoundError)):
        return "pass a transformers model repo"
    return "check the network (or HF_ENDPOINT), or download the model and pass its directory"


def check_model_path(model: str) -> None:
    if os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            fail("model", f"{model} has no config.json", "pass a saved model directory")
    elif os.path.exists(model):
        fail("model", f"{model} is a file, not a model directory", "pass the directory holding it")
    elif looks_like_path(model):
        fail(
            "model", f"no such directory {model}", "check the path, or give a hub id like org/name"
        )


def first_line(error: Exception) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(error).__name__


# ----------------------------------------------------------------------------- accelerate setup
def build_accelerator(args: RunArgs):
    """Accelerator with gloo on CPU (accelerate/state.py, ``PartialState._prepare_backend``, picks
    no backend without CUDA, and each rank then silently trains alone), and the
    DeepSpeed JSON reconciled with the flags: its integers win (stated), its "auto" values are
    filled from the flags. Returns (accelerator, zero_stage); zero_stage is -1 without DeepSpeed."""
    import importlib.util

    import torch
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    multi = int(os.environ.get("WORLD_SIZE", "1")) > 1
    on_cpu = multi and not torch.cuda.is_available()
    handlers = [InitProcessGroupKwargs(backend="gloo")] if on_cpu else []
    # A DDP (MULTI_GPU) config on a machine without GPUs: accelerate only picks MULTI_CPU (real
    # DDP over gloo) when asked for the CPU, else every rank trains alone (state.py,
    # AcceleratorState._prepare_backend). DeepSpeed configs bring their own distributed setup.
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    tracker = "tensorboard" if importlib.util.find_spec("tensorboard") else None
    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        kwargs_handlers=handlers,
        log_with=tracker,
        project_dir=args.output_dir,
        cpu=on_cpu and not deepspeed,
    )
    if multi and accelerator.distributed_type.value == "NO":
        fail(
            "accelerate config",
            f"{os.environ['WORLD_SIZE']} processes started but accelerate "
            "set up no distributed training (each rank would train alone)",
            "check the accelerate config's distributed_type",
        )
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return accelerator, -1
    cfg = plugin.deepspeed_config
    for block in ("optimizer", "scheduler"):
        if block in cfg:
            fail(
                "deepspeed_config",
                f"the DeepSpeed JSON has an `{block}` block, but the recipe "
                "builds its own AdamW and constant learning rate",
                f"delete the `{block}` block",
            )
    reconcile_with_deepspeed(args, cfg, accelerator)
    zero_stage = int(cfg.get("zero_optimization", {}).get("stage", 0))
    # the final save needs the 16-bit weights gathered: without this, accelerate's get_state_dict
    # under ZeRO-3 (accelerator.py, Accelerator.get_state_dict) has no full weights to return
    if zero_stage == 3:
        cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    accelerator.gradient_accumulation_steps = args.gradient_accumulation_steps
    return accelerator, zero_stage


# (DeepSpeed JSON key, recipe field)
DEEPSPEED_OWNED = (
    ("train_micro_batch_size_per_gpu", "per_device_batch_size"),
    ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    ("gradient_clipping", "max_grad_norm"),
)


@dataclasses.dataclass
class Run:
    """One process's place in the job: its accelerator and the batch arithmetic of a step."""

    project: str  # "sft", "dpo" or "grpo": the prefix of its lines, its tracker and progress bar
    accelerator: object
    zero_stage: int  # -1 without DeepSpeed
    per_rank: int  # items (examples, pairs, completions) this rank trains on per step
    per_step: int  # data rows (sft, dpo) or prompts (grpo) one step takes on all ranks
    unit: str  # what per_step counts, as the checkpoint names it: "rows" or "prompts"
    noun: str  # the same in messages: "examples", "pairs", "prompts"
    # extra arguments of accelerator.save_state / load_state (LoRA: keep the frozen base out)
    save_kwargs: dict = dataclasses.field(default_factory=dict)
    load_kwargs: dict = dataclasses.field(default_factory=dict)

    @property
    def world(self) -> int:
        return self.accelerator.num_processes

    @property
    def rank(self) -> int:
        return self.accelerator.process_index


def finish_run(accelerator) -> None:
    """End the run on every rank together, and on CPU leave without C++ static destructors.

    Both ranks reach the barrier before either tears its process group down. On CPU the gloo /
    DeepSpeed shm-comm worker threads can still be joinable when the interpreter's static
    destructors run, and std::terminate then aborts a run that has finished and saved its model
    ("terminate called without an active exception", SIGABRT, seen under load): there a rank of a
    multi-process launch flushes and exits directly. A single process, or CUDA (NCCL), exits
    normally.
    """
    import torch

    accelerator.wait_for_everyone()
    accelerator.end_training()
    if accelerator.num_processes > 1 and not torch.cuda.is_available():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def start_run(args: RunArgs, project: str, unit: str, noun: str, group: int = 1) -> Run:
    """The accelerator and a step's batch arithmetic: each rank trains on micro-batch x
    accumulation items; a step takes that x processes / `group` data rows (GRPO: its items are
    completions, `group` = num_generations of them per prompt)."""
    accelerator, zero_stage = build_accelerator(args)
    per_rank = args.per_device_batch_size * args.gradient_accumulation_steps
    per_step = per_rank * accelerator.num_processes // group
    return Run(project, accelerator, zero_stage, per_rank, per_step, unit, noun)


def prepare_training(args: RunArgs, run: Run, model):
    """AdamW over what trains (every weight, or the LoRA adapters), both prepared (wrapped by
    DDP or a DeepSpeed engine); a LoRA run's checkpoints then hold only the adapters and their
    optimizer state. Returns (model, optimizer)."""
    import torch

    optimizer = torch.optim.AdamW(
        lora.trainable_parameters(model), lr=args.learning_rate, weight_decay=0.0
    )
    model, optimizer = run.accelerator.prepare(model, optimizer)
    if args.finetuning != "full":
        run.save_kwargs, run.load_kwargs = lora.adapter_only_checkpoints(run.accelerator, model)
    return model, optimizer


def start_progress(run: Run, args, start_step: int):
    """Trackers (tensorboard if installed) and the progress bar of the main loop."""
    from tqdm.auto import tqdm

    run.accelerator.init_trackers(run.project, config=dataclasses.asdict(args))
    return tqdm(
        total=args.max_steps,
        initial=start_step,
        desc=run.project,
        disable=not run.accelerator.is_main_process,
    )


def reconcile_with_deepspeed(args: RunArgs, cfg: dict, accelerator) -> None:
    """A number in the JSON wins over the flag (said when they differ); "auto" takes the flag."""
    for key, field in DEEPSPEED_OWNED:
        flag = getattr(args, field)
        value = cfg.get(key, "auto")
        if value == "auto":
            cfg[key] = flag
        elif value != flag:
            note(
                f"{field} {flag} -> {value}: the DeepSpeed config's `{key}` wins "
                "(set it to \"auto\" to use the flag)",
                accelerator,
            )
            setattr(args, field, type(flag)(value))


def prepare_reference(ref, accelerator, zero_stage: int, dtype):
    """Frozen reference model: sharded through its own DeepSpeed engine under ZeRO-3 (its
    parameters would not fit replicated), else a replica on each device in the policy's dtype."""
    ref.requires_grad_(False).eval()
    if zero_stage != 3:
        return ref.to(accelerator.device, dtype=dtype)
    import deepspeed

    ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
    cfg = {k: v for k, v in ds_config.items() if k not in ("optimizer", "scheduler")}
    engine = deepspeed.initialize(model=ref, config=cfg)[0]
    engine.eval()  # DeepSpeedEngine.eval() returns None, so not chained
    return engine


def describe_setup(run: Run) -> str:
    stage = run.zero_stage if run.zero_stage >= 0 else "off"
    return f"{run.world} process(es), ZeRO stage {stage}"
