"""GRPO in one readable file, on accelerate + transformers + torch (no trl). Each step samples `num_generations`
completions per prompt, scores them with reward functions, turns rewards into group-normalised advantages and
optimises the clipped policy-ratio objective (+ KL to a frozen reference with `--beta`). Without flags: a tiny
random-init model learns a built-in toy task ("3+4=" -> "7") offline, on CPU, in a couple of minutes.

    python recipes/grpo.py                                    # one process / one GPU, embedded toy task
    accelerate launch --config_file deepspeed_configs/accelerate/zero2.yaml --mixed_precision bf16 \\
        recipes/grpo.py --config recipes/grpo.yaml            # all GPUs of one node, ZeRO-2
    accelerate launch --config_file accelerate.yaml --machine_rank $NODE_RANK \\
        --main_process_ip $MASTER_IP --num_machines 2 --num_processes 16 recipes/grpo.py --config recipes/grpo.yaml
    python recipes/grpo.py --resume-from latest               # continue the last checkpoint of --output-dir

A step = per_device_batch_size x processes x gradient_accumulation_steps completions (/ num_generations prompts).
"""
from __future__ import annotations

import argparse, dataclasses, importlib.util, json, os, re, shutil, sys, time

import torch

# ----------------------------------------------------------------------------- rewards
def last_number(text: str) -> float | None:
    found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", str(text))
    return float(found[-1].replace(",", "")) if found else None

def accuracy_reward(prompts, completions, answer, **columns) -> list[float]:
    """1.0 when the last number in the completion equals the last number in `answer`.

    >>> accuracy_reward(["3+4="] * 4, ["7", "so 3+4=7", "8", ""], answer=["7"] * 4)
    [1.0, 1.0, 0.0, 0.0]
    >>> accuracy_reward(["q"], ["1,250 apples"], answer=["#### 1250"])
    [1.0]
    """
    return [1.0 if last_number(a) is not None and last_number(c) == last_number(a) else 0.0
            for c, a in zip(completions, answer)]

def format_reward(prompts, completions, finished=None, **columns) -> list[float]:
    """1.0 when the completion is just a number and ended with EOS (`finished`, when given), else 0.0.

    >>> format_reward(["3+4="] * 5, ["7", " 12 ", "7+", "seven", "-3.5"])
    [1.0, 1.0, 0.0, 0.0, 1.0]
    >>> format_reward(["3+4="] * 2, ["7", "77777777"], finished=[True, False])  # cut off at the length limit
    [1.0, 0.0]
    """
    finished = finished if finished is not None else [True] * len(completions)
    return [1.0 if done and re.fullmatch(r"\s*-?\d+(?:\.\d+)?\s*", c) else 0.0 for c, done in zip(completions, finished)]

REWARDS = {"accuracy": accuracy_reward, "format": format_reward}

# ----------------------------------------------------------------------------- arguments
@dataclasses.dataclass
class Args:
    model: str = ""  # local dir or hub id; "" = tiny random-init Qwen2-style model + char tokenizer
    dataset: str = ""  # .json/.jsonl with prompt + answer, or a datasets name; "" = embedded "a+b=" task
    dataset_split: str = "train"
    chat_template: bool = False  # wrap each prompt as a user message with the tokenizer's chat template
    output_dir: str = "runs/grpo"
    max_steps: int = 150
    per_device_batch_size: int = 16  # completions per micro-batch; a DeepSpeed JSON integer wins
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step; a DeepSpeed JSON integer wins
    num_generations: int = 8  # completions per prompt (the group)
    max_prompt_len: int = 64
    max_completion_len: int = 8
    temperature: float = 1.0
    learning_rate: float = 3e-3  # high on purpose for the tiny default model; use ~1e-6 for real models
    max_grad_norm: float = 1.0  # plain/DDP only; under DeepSpeed its JSON `gradient_clipping` applies
    beta: float = 0.0  # KL weight to the frozen reference; 0 = no reference model loaded
    epsilon: float = 0.2  # clip range low: ratio >= 1 - epsilon
    epsilon_high: float = 0.0  # clip range high (DAPO "clip-higher"); 0 = same as epsilon
    loss_type: str = "grpo"  # grpo: mean over each sequence's tokens, then over sequences; dapo: over all tokens
    num_iterations: int = 1  # optimizer updates per rollout; > 1 makes the old-policy ratio matter
    scale_rewards: bool = True  # divide advantages by the group's reward std
    rewards: str = "accuracy,format"
    reward_weights: str = "1,1"
    cache_implementation: str = "auto"  # auto = "static" on CUDA (much faster decode), dynamic on CPU
    gradient_checkpointing: bool = False
    save_every: int = 50  # steps between checkpoints; 0 = only the final model
    resume_from: str = ""  # "latest" or a checkpoint directory
    seed: int = 0

def parse_args(argv=None) -> Args:
    """Dataclass defaults < `--config file.yaml` < command-line flags (dashes or underscores)."""
    (pre := argparse.ArgumentParser(add_help=False)).add_argument("--config")
    known, _ = pre.parse_known_args(argv)
    import yaml
    defaults = (yaml.safe_load(open(known.config)) or {}) if known.config else {}
    if unknown := set(defaults) - {f.name for f in dataclasses.fields(Args)}:
        fail("config", f"unknown keys {sorted(unknown)} in {known.config}", "use the names in `--help`")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], parents=[pre])
    for f in dataclasses.fields(Args):
        flags = sorted({f"--{f.name}", f"--{f.name.replace('_', '-')}"})
        parser.add_argument(*flags, default=defaults.get(f.name, f.default), type={"int": int, "float": float, "bool":
                            lambda v: str(v).lower() in ("1", "true", "yes")}.get(f.type, str))
    return Args(**{k: v for k, v in vars(parser.parse_args(argv)).items() if k != "config"})

def fail(field: str, problem: str, fix: str) -> None:
    """Bad input: one line on stderr, exit 2, no traceback."""
    print(f"grpo.py: {field}: {problem} (fix: {fix})", file=sys.stderr)
    sys.exit(2)

# ----------------------------------------------------------------------------- data + tiny model
def toy_rows() -> list[dict]:
    """The embedded verifiable task: all 100 single-digit sums, e.g. {"prompt": "3+4=", "answer": "7"}."""
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]

def load_rows(args: Args) -> list[dict]:
    if not args.dataset:
        return toy_rows()
    if os.path.exists(args.dataset):  # .jsonl: one row per line; .json: a list of rows
        text = open(args.dataset).read()
        rows = [json.loads(l) for l in text.splitlines() if l.strip()] if args.dataset.endswith("l") else json.loads(text)
    else:
        import datasets  # optional dependency, only for hub datasets
        rows = list(datasets.load_dataset(args.dataset, split=args.dataset_split))
    if not rows or not all("prompt" in r and "answer" in r for r in rows):
        fail("dataset", f"{args.dataset} needs rows with `prompt` and `answer`", "rename your columns")
    return rows

def prompt_indices(step: int, num_rows: int, per_step: int, seed: int) -> list[int]:
    """Rows used at `step`: a fixed function of the step, so a resumed run sees the same order.

    >>> prompt_indices(0, 4, 3, seed=0) + prompt_indices(1, 4, 3, seed=0) == prompt_indices(0, 4, 6, seed=0)
    True
    """
    out, perms = [], {}
    for pos in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(pos, num_rows)  # reshuffle every epoch, seeded by (seed, epoch)
        if epoch not in perms:
            perms[epoch] = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        out.append(int(perms[epoch][i]))
    return out

def build_tiny_tokenizer():
    """Character-level tokenizer for the toy task, built locally (no download)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>", *"0123456789+-="])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))  # no merges = one token per char
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")

def build_tiny_model(tokenizer, seed: int = 0, hidden: int = 64, layers: int = 2):
    """Random-init Qwen2-architecture causal LM sized for CPU tests."""
    from transformers import AutoModelForCausalLM, Qwen2Config
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=True,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg)

# ----------------------------------------------------------------------------- loss
def group_advantages(rewards: torch.Tensor, num_generations: int, scale: bool = True, eps: float = 1e-4):
    """(r - mean of its group) / (std of its group + eps); groups are consecutive runs of `num_generations`.

    >>> group_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), 2, scale=False).tolist()
    [0.5, -0.5, 0.0, 0.0]
    """
    grouped = rewards.view(-1, num_generations)
    adv = grouped - grouped.mean(dim=1, keepdim=True)
    return (adv / (grouped.std(dim=1, keepdim=True) + eps) if scale else adv).reshape(-1)

def grpo_loss(logp, old_logp, advantages, mask, ref_logp=None, beta=0.0, eps_low=0.2, eps_high=0.2,
              loss_type="grpo", num_tokens=None):
    """Clipped policy-ratio loss (+ beta x k3 KL to a reference) over [B, T] token tensors; (loss, stats).

    `grpo` averages each sequence over its tokens, then over sequences; `dapo` divides the token sum by
    `num_tokens` (default: this batch's tokens; pass the rollout's share per micro-batch to span a rollout).
    """
    ratio, adv = torch.exp(logp - old_logp), advantages.unsqueeze(1)
    clipped_ratio = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1 if beta else torch.zeros_like(logp)  # k3: >= 0, unbiased
    per_token, mask = -torch.min(ratio * adv, clipped_ratio * adv) + beta * kl, mask.to(logp.dtype)
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    elif loss_type == "dapo":
        loss = (per_token * mask).sum() / (num_tokens if num_tokens else mask.sum().clamp(min=1))
    else:
        raise ValueError(f"loss_type must be grpo or dapo, not {loss_type!r}")
    n, was_clipped = mask.sum().clamp(min=1), (clipped_ratio * adv < ratio * adv).to(mask.dtype)
    stats = {"kl": float((kl.detach() * mask).sum() / n), "clip_frac": float((was_clipped * mask).sum() / n)}
    return loss, stats

def token_logprobs(model, ids, attn, completion_len: int, temperature: float):
    """Log-probabilities of the last `completion_len` tokens of `ids` under `model`."""
    positions = (attn.long().cumsum(-1) - 1).clamp(min=0)  # left padding: count real tokens only
    logits = model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=False).logits
    logits = logits[:, -completion_len - 1:-1].float() / temperature
    return torch.gather(logits, 2, ids[:, -completion_len:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)

# ----------------------------------------------------------------------------- rollout helpers
@torch.no_grad()
def sample(accelerator, model, zero_stage: int, ids, attn, args: Args, tok):
    """Sample with the unwrapped module (an engine's forward is for training). Under ZeRO-3 the shards are
    gathered ONCE per rollout with DeepSpeed's per-module fetch hooks detached (else every token re-gathers)."""
    import contextlib
    ctx = contextlib.nullcontext()
    if zero_stage == 3:
        from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation  # DeepSpeed >= 0.16
        ctx = unwrap_model_for_generation(model)
    cache = ("static" if ids.is_cuda else None) if args.cache_implementation == "auto" else args.cache_implementation
    with ctx:
        module = accelerator.unwrap_model(model).eval()
        with accelerator.autocast():
            out = module.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=args.temperature,
                                  top_k=0, top_p=1.0, max_new_tokens=args.max_completion_len, use_cache=True,
                                  pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, cache_implementation=cache)
        module.train()
    return out[:, ids.shape[1]:]

def completion_mask(completions, eos_id: int):
    """1 for tokens up to and including the first EOS (so the policy learns to stop), 0 after."""
    first = torch.where((is_eos := completions == eos_id).any(1), is_eos.int().argmax(1), completions.shape[1])
    return (torch.arange(completions.shape[1], device=completions.device)[None] <= first[:, None]).long()

def prepare_reference(ref, accelerator, zero_stage: int, dtype):
    """Frozen reference: sharded through its own DeepSpeed engine under ZeRO-3, else a replica per device."""
    if zero_stage != 3:
        return ref.to(accelerator.device, dtype=dtype)  # same dtype as the policy, so KL starts at 0
    import deepspeed
    cfg = {k: v for k, v in accelerator.state.deepspeed_plugin.deepspeed_config.items() if k not in ("optimizer", "scheduler")}
    (engine := deepspeed.initialize(model=ref, config=cfg)[0]).eval()  # DeepSpeedEngine.eval() returns None
    return engine

# ----------------------------------------------------------------------------- checkpoint helpers
def write_atomic(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text), f.flush(), os.fsync(f.fileno())
    os.replace(path + ".tmp", path)

def save_checkpoint(accelerator, output_dir: str, step: int, state: dict) -> None:
    """checkpoint-STEP via temp dir + rename, then `latest` via rename: a crash never leaves a broken latest."""
    final, tmp = os.path.join(output_dir, f"checkpoint-{step}"), os.path.join(output_dir, f".tmp-checkpoint-{step}")
    accelerator.save_state(tmp)  # every rank writes its own shards + RNG state
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        write_atomic(os.path.join(tmp, "trainer_state.json"), json.dumps(state))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        write_atomic(os.path.join(output_dir, "latest"), os.path.basename(final))
    accelerator.wait_for_everyone()

def resolve_resume(args: Args) -> str:
    pointer, path = os.path.join(args.output_dir, "latest"), args.resume_from
    if path == "latest":
        path = os.path.join(args.output_dir, open(pointer).read().strip()) if os.path.exists(pointer) else pointer
    if not os.path.exists(os.path.join(path, "trainer_state.json")):
        fail("resume_from", f"no complete checkpoint at {path}", "pass `latest` or a checkpoint-STEP directory")
    return path

# ----------------------------------------------------------------------------- main
def main(argv=None) -> None:
    args = parse_args(argv)
    names, weights = args.rewards.split(","), [float(w) for w in str(args.reward_weights).split(",")]
    if any(n not in REWARDS for n in names) or len(weights) != len(names):
        fail("rewards", f"{args.rewards!r} with weights {args.reward_weights!r}",
             f"name rewards from {', '.join(REWARDS)}, one weight each")
    if args.loss_type not in ("grpo", "dapo"):
        fail("loss_type", f"{args.loss_type!r} is not a loss type", "use grpo or dapo")
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs, set_seed
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # --- setup: without CUDA, gloo (else each rank silently trains alone); DeepSpeed JSON integers win
    multi = int(os.environ.get("WORLD_SIZE", "1")) > 1
    handlers = [InitProcessGroupKwargs(backend="gloo")] if multi and not torch.cuda.is_available() else []
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, kwargs_handlers=handlers,
                              log_with="tensorboard" if importlib.util.find_spec("tensorboard") else None,
                              project_dir=args.output_dir)
    plugin, zero_stage = accelerator.state.deepspeed_plugin, -1
    if plugin is not None:
        cfg = plugin.deepspeed_config
        zero_stage = int(cfg.get("zero_optimization", {}).get("stage", 0))
        for key, name in (("train_micro_batch_size_per_gpu", "per_device_batch_size"), ("gradient_accumulation_steps",) * 2):
            setattr(args, name, cfg[key]) if isinstance(cfg.get(key), int) else cfg.update({key: getattr(args, name)})
        if zero_stage == 3:  # the final save needs the 16-bit weights gathered
            cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
        accelerator.gradient_accumulation_steps = args.gradient_accumulation_steps
    world, rank, G = accelerator.num_processes, accelerator.process_index, args.num_generations
    mb, ga = args.per_device_batch_size, args.gradient_accumulation_steps
    local_n = mb * ga  # completions this rank generates per step
    if (local_n * world) % G:
        fail("num_generations", f"per_device_batch_size {mb} x processes {world} x gradient_accumulation_steps {ga} "
             f"= {local_n * world} completions per step is not divisible by num_generations {G}",
             "change one of them so the product is a multiple of num_generations")
    prompts_per_step = local_n * world // G

    # --- data + model (same init on every rank; sampling RNG differs per rank below)
    rows = load_rows(args)
    set_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model) if args.model else build_tiny_tokenizer()
    load = lambda: AutoModelForCausalLM.from_pretrained(args.model) if args.model else build_tiny_model(tok, args.seed)  # noqa: E731
    model, ref = load(), (load().requires_grad_(False).eval() if args.beta else None)
    tok.padding_side = tok.truncation_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    ref = prepare_reference(ref, accelerator, zero_stage, next(model.parameters()).dtype) if ref is not None else None
    set_seed(args.seed, device_specific=True)  # ranks sharing a prompt's group must sample differently

    # --- resume: data position is a function of the step (prompt_indices), the rest is in the checkpoint
    start_step, metrics_path = 0, os.path.join(args.output_dir, "metrics.jsonl")
    if args.resume_from:
        path = resolve_resume(args)
        state = json.load(open(os.path.join(path, "trainer_state.json")))
        if state["prompts_per_step"] != prompts_per_step:  # else the data order would shift
            fail("resume_from", f"checkpoint used {state['prompts_per_step']} prompts per step, this run "
                 f"{prompts_per_step}", "resume with the same global batch and num_generations")
        accelerator.load_state(path)  # weights, optimizer, RNG of every rank
        start_step = state["step"]
    if accelerator.is_main_process:
        os.makedirs(args.output_dir, exist_ok=True)
        kept = list(open(metrics_path)) if os.path.exists(metrics_path) and start_step else []
        write_atomic(metrics_path, "".join(l for l in kept if json.loads(l)["step"] <= start_step))  # drop lost steps
        accelerator.print(f"grpo: {world} process(es), ZeRO stage {zero_stage if plugin else 'off'}, "
                          f"{prompts_per_step} prompts x {G} generations per step, micro-batch {mb}, accumulation {ga}")
    accelerator.init_trackers("grpo", config=dataclasses.asdict(args))  # tensorboard when installed
    bar = tqdm(total=args.max_steps, initial=start_step, disable=not accelerator.is_main_process, desc="grpo")
    chunks = [slice(i * mb, (i + 1) * mb) for i in range(ga)]

    for step in range(start_step + 1, args.max_steps + 1):
        t0 = time.time()
        # --- rollout: every rank builds the same global list (prompt repeated G times) and takes its slice
        picked = [rows[i] for i in prompt_indices(step - 1, len(rows), prompts_per_step, args.seed)]
        mine = [r for r in picked for _ in range(G)][rank * local_n:(rank + 1) * local_n]
        chat = lambda p: tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)  # noqa: E731
        prompts = [chat(r["prompt"]) if args.chat_template else r["prompt"] for r in mine]
        enc = tok(prompts, padding=True, truncation=True, max_length=args.max_prompt_len, return_tensors="pt").to(accelerator.device)
        completions = sample(accelerator, model, zero_stage, enc.input_ids, enc.attention_mask, args, tok)
        mask = completion_mask(completions, tok.eos_token_id)
        texts = tok.batch_decode(completions * mask + tok.pad_token_id * (1 - mask), skip_special_tokens=True)
        columns = {k: [r[k] for r in mine] for k in mine[0] if k != "prompt"}
        columns["finished"] = (completions == tok.eos_token_id).any(1).tolist()  # False: cut at the length limit
        per_fn = torch.tensor([REWARDS[n](prompts, texts, **columns) for n in names], device=accelerator.device).T
        rewards = (per_fn * torch.tensor(weights, device=accelerator.device)).sum(1)
        all_rewards = accelerator.gather(rewards)  # rank order == global order, so groups line up
        advantages = group_advantages(all_rewards, G, args.scale_rewards)[rank * local_n:(rank + 1) * local_n]
        seq, attn = torch.cat([enc.input_ids, completions], 1), torch.cat([enc.attention_mask, mask], 1)
        def logps(m, s):  # noqa: E306
            with accelerator.autocast():
                return token_logprobs(m, seq[s], attn[s], completions.shape[1], args.temperature)
        # --- loss: old-policy logprobs only matter when a rollout is reused (num_iterations > 1)
        with torch.no_grad():
            old = torch.cat([logps(model, s) for s in chunks]) if args.num_iterations > 1 else None
            ref_lp = torch.cat([logps(ref, s) for s in chunks]) if ref is not None else None
        num_tokens = mask.sum().clamp(min=1) / ga  # dapo: per micro-batch share of this rank's rollout tokens
        sums = torch.zeros(3, device=accelerator.device)
        for _ in range(args.num_iterations):
            for s in chunks:
                # --- step: accumulate() decides when gradients sync and the optimizer really steps
                with accelerator.accumulate(model):
                    lp = logps(model, s)
                    loss, st = grpo_loss(lp, old[s] if old is not None else lp.detach(), advantages[s], mask[s],
                                         ref_lp[s] if ref_lp is not None else None, args.beta, args.epsilon,
                                         args.epsilon_high or args.epsilon, args.loss_type, num_tokens)
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and plugin is None and args.max_grad_norm:
                        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    optimizer.step()
                    optimizer.zero_grad()
                sums += torch.tensor([loss.item(), st["kl"], st["clip_frac"]], device=accelerator.device)

        # --- log: one reduction for all metrics, then bar + metrics.jsonl + trackers on the main process
        loss_v, kl_v, clip_v = accelerator.reduce(sums / (args.num_iterations * ga), "mean").tolist()
        fn_means, n_tokens = accelerator.gather(per_fn).mean(0).tolist(), int(accelerator.gather(mask.sum()[None]).sum())
        dt = time.time() - t0
        metrics = {"step": step, "reward": float(all_rewards.mean()), "reward_std": float(all_rewards.std()),
                   **{f"reward/{n}": v for n, v in zip(names, fn_means)}, "loss": loss_v, "kl": kl_v, "clip_frac": clip_v,
                   "completion_len": n_tokens / (local_n * world), "tokens": n_tokens, "tok_s": n_tokens / dt, "step_s": dt}
        if accelerator.is_main_process:
            with open(metrics_path, "a") as f:
                f.write(json.dumps(metrics) + "\n")
            bar.set_postfix(reward=f"{metrics['reward']:.3f}", loss=f"{loss_v:.4f}", tok_s=f"{n_tokens / dt:.0f}", refresh=False)
            bar.update(1)
        accelerator.log(metrics, step=step)  # no-op without trackers

        # --- checkpoint: step + data position + RNG + model/optimizer, atomically
        if args.save_every and (step % args.save_every == 0 or step == args.max_steps):
            save_checkpoint(accelerator, args.output_dir, step,  # step + data position; RNG is in save_state
                            {"step": step, "prompts_seen": step * prompts_per_step, "prompts_per_step": prompts_per_step})
    bar.close()

    # --- final model in HF format (16-bit weights gathered from the shards under ZeRO-3)
    state_dict = accelerator.get_state_dict(model)  # collective: every rank must call it
    if accelerator.is_main_process:
        final, tmp = os.path.join(args.output_dir, "final"), os.path.join(args.output_dir, ".tmp-final")
        accelerator.unwrap_model(model).save_pretrained(tmp, state_dict=state_dict)
        tok.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)  # never a half-written `final`
        accelerator.print(f"grpo: final model in {final}")
    accelerator.wait_for_everyone()
    accelerator.end_training()

if __name__ == "__main__":
    main()
