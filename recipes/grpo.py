"""GRPO in one readable file, on accelerate + transformers + torch (no trl).

Each step samples `num_generations` completions per prompt, scores them with reward functions,
turns rewards into group-normalised advantages and optimises the clipped policy-ratio objective
(+ KL to a frozen reference with `--beta`). Without flags: a tiny random-init model learns a
built-in toy task ("3+4=" -> "7") offline, on CPU, in a couple of minutes.

    python recipes/grpo.py                                    # one process / one GPU, toy task
    accelerate launch --config_file deepspeed_configs/accelerate/zero2.yaml --num_processes 8 \\
        --mixed_precision bf16 recipes/grpo.py \\
        --config recipes/grpo.yaml                            # all GPUs of one node, ZeRO-2
    accelerate launch --config_file cfg/accelerate.yaml --machine_rank $NODE_RANK \\
        recipes/grpo.py --config recipes/grpo.yaml            # on every node of a multi-node job
    python recipes/grpo.py --resume-from latest               # continue the last checkpoint

A step = per_device_batch_size x processes x gradient_accumulation_steps completions
(/ num_generations prompts).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import time

# arguments.py, run_dir.py and common.py sit beside this file; torch, transformers and
# accelerate are imported where they are used, after the input has been checked
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import arguments
import common
import lora
import run_dir
from arguments import fail, option, override
from common import sample_indices as prompt_indices  # the prompts of a step

PROGRAM = "grpo.py"


# ----------------------------------------------------------------------------- rewards
def last_number(text: str) -> float | None:
    """The last number in `text` (thousands separators allowed), or None.

    >>> last_number("1,250 apples and 3.5 pears"), last_number("none")
    (3.5, None)
    """
    found = re.findall(r"-?\d[\d,]*(?:\.\d+)?", str(text))
    if not found:
        return None
    return float(found[-1].replace(",", ""))


def accuracy_reward(prompts, completions, answer, **columns) -> list[float]:
    """1.0 when the last number in the completion equals the last number in `answer`.

    >>> accuracy_reward(["3+4="] * 4, ["7", "so 3+4=7", "8", ""], answer=["7"] * 4)
    [1.0, 1.0, 0.0, 0.0]
    >>> accuracy_reward(["q"], ["1,250 apples"], answer=["#### 1250"])
    [1.0]
    """
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        target = last_number(expected)
        rewards.append(1.0 if target is not None and last_number(completion) == target else 0.0)
    return rewards


def format_reward(prompts, completions, finished=None, **columns) -> list[float]:
    """1.0 when the completion is just a number and ended with EOS (`finished`, when given).

    >>> format_reward(["3+4="] * 5, ["7", " 12 ", "7+", "seven", "-3.5"])
    [1.0, 1.0, 0.0, 0.0, 1.0]
    >>> format_reward(["3+4="] * 2, ["7", "77777777"], finished=[True, False])  # cut off
    [1.0, 0.0]
    """
    if finished is None:
        finished = [True] * len(completions)
    rewards = []
    for completion, done in zip(completions, finished, strict=True):
        is_number = re.fullmatch(r"\s*-?\d+(?:\.\d+)?\s*", completion) is not None
        rewards.append(1.0 if done and is_number else 0.0)
    return rewards


REWARDS = {"accuracy": accuracy_reward, "format": format_reward}


# ----------------------------------------------------------------------------- arguments
@dataclasses.dataclass
class Args(arguments.RunArgs):
    output_dir: str = override("output_dir", "runs/grpo")
    max_steps: int = override("max_steps", 150)
    per_device_batch_size: int = option(
        16, "completions per micro-batch on each process; a DeepSpeed JSON integer wins"
    )
    learning_rate: float = option(
        3e-3, "AdamW learning rate; high on purpose for the tiny default model, ~1e-6 for real ones"
    )
    chat_template: bool = option(False, "wrap each prompt as a user message (chat template)")
    num_generations: int = option(8, "completions per prompt (the group)")
    max_prompt_len: int = option(64, "prompt tokens; longer prompts keep their end")
    max_completion_len: int = option(8, "tokens sampled per completion at most")
    temperature: float = option(1.0, "sampling temperature")
    beta: float = option(0.0, "KL weight to the frozen reference; 0: no reference model loaded")
    epsilon: float = option(0.2, "clip range low: ratio >= 1 - epsilon")
    epsilon_high: float = option(
        0.0, 'clip range high (DAPO "clip-higher"): ratio <= 1 + epsilon_high; 0: epsilon'
    )
    loss_type: str = option(
        "grpo", "grpo: per-sequence token mean, then the mean; dapo: over all tokens"
    )
    num_iterations: int = option(
        1, "optimizer updates per rollout; more than 1 makes the old-policy ratio matter"
    )
    scale_rewards: bool = option(True, "divide advantages by the group's reward std")
    rewards: str = option("accuracy,format", "reward functions, comma-separated (see REWARDS)")
    reward_weights: str = option("1,1", "one weight per reward, comma-separated")
    cache_implementation: str = option(
        "auto", 'KV cache of generate(); auto: "static" on CUDA (much faster decode), else dynamic'
    )


def parse_args(argv=None) -> Args:
    """Dataclass defaults < `--config file.yaml` < command-line flags; then every value checked."""
    args = arguments.parse_args(Args, argv, PROGRAM, __doc__.splitlines()[0])
    check_args(args)
    return args


def check_args(args: Args) -> None:
    arguments.check_run_args(args)
    if args.num_generations < 2:
        fail(
            "num_generations",
            f"{args.num_generations} leaves a group nothing to compare "
            "(advantages would be 0 or NaN)",
            "use at least 2, e.g. 8",
        )
    arguments.check_at_least(args, 1, "max_prompt_len", "max_completion_len", "num_iterations")
    if args.temperature <= 0:
        fail(
            "temperature",
            f"{args.temperature} cannot sample (log-probs divide by it)",
            "use a positive temperature, e.g. 1.0",
        )
    arguments.check_positive_float(args, "epsilon")
    for name in ("beta", "epsilon_high"):
        if getattr(args, name) < 0:
            fail(name, f"{getattr(args, name)} is negative", f"use 0 or more for {name}")
    arguments.check_choice(args, "loss_type", ("grpo", "dapo"))
    parse_rewards(args)


def parse_rewards(args: Args) -> tuple[list[str], list[float]]:
    """(reward function names, weights) from `--rewards a,b --reward-weights 1,0.2`."""
    names = [n.strip() for n in args.rewards.split(",")]
    unknown = [n for n in names if n not in REWARDS]
    if unknown:
        fail("rewards", f"unknown reward {unknown[0]!r}", f"name rewards from {', '.join(REWARDS)}")
    try:
        weights = [float(w) for w in str(args.reward_weights).split(",")]
    except ValueError:
        fail(
            "reward_weights",
            f"{args.reward_weights!r} is not a list of numbers",
            'give one number per reward, comma-separated, e.g. "1,0.2"',
        )
    if len(weights) != len(names) or not all(abs(w) < float("inf") for w in weights):
        fail(
            "reward_weights",
            f"{len(weights)} weight(s) {args.reward_weights!r} for "
            f"{len(names)} reward(s) {args.rewards!r}",
            "give one finite weight per reward",
        )
    return names, weights


# ----------------------------------------------------------------------------- data
def toy_rows() -> list[dict]:
    """The embedded task: all 100 single-digit sums, e.g. {"prompt": "3+4=", "answer": "7"}."""
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]


def load_rows(args: Args) -> list[dict]:
    """Rows with `prompt` and `answer` (other fields reach the reward functions as keywords)."""
    if not args.dataset:
        return toy_rows()
    rows = common.read_rows(args.dataset, args.dataset_split)
    common.check_rows(rows, ("prompt", "answer"), args.dataset)
    return rows


# ----------------------------------------------------------------------------- loss
def group_advantages(rewards, num_generations: int, scale: bool = True, eps: float = 1e-4):
    """(r - mean of its group) / (std of its group + eps); a group = `num_generations` in a row.

    >>> import torch
    >>> group_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0]), 2, scale=False).tolist()
    [0.5, -0.5, 0.0, 0.0]
    """
    grouped = rewards.view(-1, num_generations)
    advantages = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        advantages = advantages / (grouped.std(dim=1, keepdim=True) + eps)
    return advantages.reshape(-1)


@dataclasses.dataclass(frozen=True)
class Objective:
    """The settings of grpo_loss, each by name (two float clip bounds side by side are easy to
    swap unnoticed)."""

    eps_low: float = 0.2  # the ratio is clipped to [1 - eps_low, 1 + eps_high]
    eps_high: float = 0.2
    beta: float = 0.0  # weight of the k3 KL to the reference
    loss_type: str = "grpo"  # grpo: per-sequence token mean, then mean; dapo: over all tokens

    @classmethod
    def from_args(cls, args: Args) -> Objective:
        return cls(
            eps_low=args.epsilon,
            eps_high=args.epsilon_high or args.epsilon,
            beta=args.beta,
            loss_type=args.loss_type,
        )


def grpo_loss(logp, old_logp, advantages, mask, *, objective=None, ref_logp=None, num_tokens=None):
    """Clipped policy-ratio loss (+ beta x k3 KL to a reference) over [B, T] token tensors.

    `grpo` averages each sequence over its tokens, then over sequences; `dapo` divides the token
    sum by `num_tokens` (default: this batch's tokens; pass the rollout's share per micro-batch
    to span a rollout). `objective` defaults to Objective(). Returns (loss, {"kl", "clip_frac"}).
    """
    import torch

    objective = objective or Objective()
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(1)
    clipped_ratio = torch.clamp(ratio, 1 - objective.eps_low, 1 + objective.eps_high)
    if objective.beta:
        kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1  # k3 estimator: >= 0, unbiased
    else:
        kl = torch.zeros_like(logp)
    per_token = -torch.min(ratio * adv, clipped_ratio * adv) + objective.beta * kl
    mask = mask.to(logp.dtype)
    if objective.loss_type == "grpo":
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    elif objective.loss_type == "dapo":
        loss = (per_token * mask).sum() / (num_tokens if num_tokens else mask.sum().clamp(min=1))
    else:
        raise ValueError(f"loss_type must be grpo or dapo, not {objective.loss_type!r}")
    n = mask.sum().clamp(min=1)
    was_clipped = (clipped_ratio * adv < ratio * adv).to(mask.dtype)
    stats = {
        "kl": float((kl.detach() * mask).sum() / n),
        "clip_frac": float((was_clipped * mask).sum() / n),
    }
    return loss, stats


def token_logprobs(model, ids, attn, completion_len: int, temperature: float):
    """Log-probabilities of the last `completion_len` tokens of `ids` under `model`.

    The LM head runs over the last `completion_len + 1` positions only (transformers'
    `logits_to_keep`, which its causal LMs' forward takes and slices the hidden states by before
    `lm_head`, as TRL's GRPOTrainer asks): the prompt's logits, vocabulary-wide, are never built.
    A model that ignores the argument returns every position; the slice below serves both."""
    import torch

    positions = (attn.long().cumsum(-1) - 1).clamp(min=0)  # left padding: count real tokens only
    out = model(
        input_ids=ids,
        attention_mask=attn,
        position_ids=positions,
        use_cache=False,
        logits_to_keep=completion_len + 1,
    )
    logits = out.logits[:, -completion_len - 1 : -1].float() / temperature
    picked = torch.gather(logits, 2, ids[:, -completion_len:, None]).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def completion_mask(completions, eos_id: int):
    """1 for tokens up to and including the first EOS (so the policy learns to stop), 0 after.

    >>> import torch
    >>> completion_mask(torch.tensor([[5, 1, 7], [5, 6, 7]]), eos_id=1).tolist()
    [[1, 1, 0], [1, 1, 1]]
    """
    import torch

    is_eos = completions == eos_id
    length = completions.shape[1]
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), length)
    positions = torch.arange(length, device=completions.device)[None]
    return (positions <= first[:, None]).long()


# ----------------------------------------------------------------------------- setup
def setup(args: Args) -> common.Run:
    """The accelerator and a step's arithmetic: each rank samples micro-batch x accumulation
    completions, num_generations per prompt, so all ranks' completions must fill whole groups."""
    run = common.start_run(args, "grpo", unit="prompts", noun="prompts", group=args.num_generations)
    completions = run.per_rank * run.world
    if completions % args.num_generations:
        fail(
            "num_generations",
            f"per_device_batch_size {args.per_device_batch_size} x processes {run.world} x "
            f"gradient_accumulation_steps {args.gradient_accumulation_steps} = {completions} "
            f"completions per step is not divisible by num_generations {args.num_generations}",
            "change one of them so the product is a multiple of num_generations",
        )
    return run


def micro_slices(args: Args) -> list[slice]:
    """This rank's completions of a step, cut into micro-batches."""
    size = args.per_device_batch_size
    return [slice(i * size, (i + 1) * size) for i in range(args.gradient_accumulation_steps)]


def build_models(args: Args, run: common.Run):
    """Tokenizer, policy, optional frozen reference (beta > 0) and optimizer, prepared.

    Under --finetuning lora/qlora the reference is the policy itself with its adapters disabled
    (update_policy enters lora.as_reference): no second copy of the weights."""
    from accelerate.utils import set_seed

    accelerator = run.accelerator
    set_seed(args.seed)  # same init on every rank; sampling RNG differs per rank (below)
    tok = common.load_tokenizer(args)
    tok.padding_side = "left"
    tok.truncation_side = "left"
    model = common.load_policy(args, tok, accelerator)
    separate_ref = args.beta and args.finetuning == "full"
    ref = common.load_model(args, tok) if separate_ref else None
    model, optimizer = common.prepare_training(args, run, model)
    if ref is not None:
        dtype = next(model.parameters()).dtype  # same dtype as the policy, so KL starts at 0
        ref = common.prepare_reference(ref, accelerator, run.zero_stage, dtype)
    elif args.beta:
        ref = model
    set_seed(args.seed, device_specific=True)  # ranks sharing a prompt's group must sample apart
    return tok, model, ref, optimizer


# ----------------------------------------------------------------------------- rollout
def sample(accelerator, model, zero_stage: int, ids, attn, args: Args, tok):
    """Sample with the unwrapped module (an engine's forward is for training). Under ZeRO-3 the
    shards are gathered ONCE per rollout with DeepSpeed's per-module fetch hooks detached (else
    every generated token re-gathers every layer)."""
    import torch

    gathered = contextlib.nullcontext()
    if zero_stage == 3:
        from deepspeed.runtime.zero.stage3 import unwrap_model_for_generation  # DeepSpeed >= 0.16

        gathered = unwrap_model_for_generation(model)
    cache = args.cache_implementation
    if cache == "auto":
        cache = "static" if ids.is_cuda else None
    with gathered, torch.no_grad():
        module = accelerator.unwrap_model(model).eval()
        with accelerator.autocast():
            out = module.generate(
                input_ids=ids,
                attention_mask=attn,
                do_sample=True,
                temperature=args.temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.max_completion_len,
                use_cache=True,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                cache_implementation=cache,
            )
        module.train()
    return out[:, ids.shape[1] :]


def format_prompt(tok, prompt: str, chat_template: bool) -> str:
    if not chat_template:
        return prompt
    message = [{"role": "user", "content": prompt}]
    return tok.apply_chat_template(message, tokenize=False, add_generation_prompt=True)


def generate_rollout(args: Args, run: common.Run, model, tok, rows: list[dict], step: int) -> dict:
    """This rank's completions for step `step`, with rewards and group-normalised advantages.

    Every rank builds the same global list (each prompt repeated num_generations times) and
    takes its own slice, so a group may span ranks; advantages use the gathered rewards."""
    import torch

    reward_names, weights = parse_rewards(args)
    accelerator, device = run.accelerator, run.accelerator.device
    group = args.num_generations
    picked = [rows[i] for i in prompt_indices(step - 1, len(rows), run.per_step, args.seed)]
    repeated = [row for row in picked for _ in range(group)]
    mine = repeated[run.rank * run.per_rank : (run.rank + 1) * run.per_rank]
    prompts = [format_prompt(tok, row["prompt"], args.chat_template) for row in mine]
    enc = tok(
        prompts, padding=True, truncation=True, max_length=args.max_prompt_len, return_tensors="pt"
    ).to(device)
    completions = sample(
        accelerator, model, run.zero_stage, enc.input_ids, enc.attention_mask, args, tok
    )
    mask = completion_mask(completions, tok.eos_token_id)
    shown = completions * mask + tok.pad_token_id * (1 - mask)  # nothing after the first EOS
    texts = tok.batch_decode(shown, skip_special_tokens=True)

    columns = {key: [row[key] for row in mine] for key in mine[0] if key != "prompt"}
    columns["finished"] = (completions == tok.eos_token_id).any(1).tolist()  # False: cut off
    scores = [REWARDS[name](prompts, texts, **columns) for name in reward_names]
    per_fn = torch.tensor(scores, device=device).T  # [completions, reward functions]
    rewards = (per_fn * torch.tensor(weights, device=device)).sum(1)
    all_rewards = accelerator.gather(rewards)  # rank order == global order, so groups line up
    advantages = group_advantages(all_rewards, group, args.scale_rewards)
    advantages = advantages[run.rank * run.per_rank : (run.rank + 1) * run.per_rank]
    return {
        "sequences": torch.cat([enc.input_ids, completions], 1),
        "attention": torch.cat([enc.attention_mask, mask], 1),
        "completion_len": completions.shape[1],
        "mask": mask,
        "per_fn": per_fn,
        "all_rewards": all_rewards,
        "advantages": advantages,
    }


# ----------------------------------------------------------------------------- update
def rollout_logprobs(args: Args, run: common.Run, model, rollout: dict, chunk: slice):
    """Completion-token log-probs of one micro-batch of the rollout under `model`."""
    with run.accelerator.autocast():
        return token_logprobs(
            model,
            rollout["sequences"][chunk],
            rollout["attention"][chunk],
            rollout["completion_len"],
            args.temperature,
        )


def update_policy(args: Args, run: common.Run, model, ref, optimizer, rollout: dict) -> list[float]:
    """num_iterations passes over the rollout's micro-batches; returns mean [loss, kl, clip_frac].

    Old-policy log-probs only matter when a rollout is reused (num_iterations > 1); otherwise
    the ratio is exactly 1 and logp.detach() stands in for them."""
    import torch

    accelerator = run.accelerator
    chunks = micro_slices(args)
    objective = Objective.from_args(args)
    with torch.no_grad():
        old = None
        ref_lp = None
        if args.num_iterations > 1:
            old = torch.cat([rollout_logprobs(args, run, model, rollout, c) for c in chunks])
        if ref is not None:
            with lora.as_reference(accelerator, ref):
                ref_lp = torch.cat([rollout_logprobs(args, run, ref, rollout, c) for c in chunks])
    mask, advantages = rollout["mask"], rollout["advantages"]
    ga = args.gradient_accumulation_steps
    num_tokens = mask.sum().clamp(min=1) / ga  # dapo: a micro-batch's share of this rank's tokens
    clip_here = accelerator.state.deepspeed_plugin is None and args.max_grad_norm
    sums = torch.zeros(3, device=accelerator.device)
    for _ in range(args.num_iterations):
        for chunk in chunks:
            # accumulate() decides when gradients sync and the optimizer really steps
            with accelerator.accumulate(model):
                logp = rollout_logprobs(args, run, model, rollout, chunk)
                old_logp = old[chunk] if old is not None else logp.detach()
                chunk_ref = ref_lp[chunk] if ref_lp is not None else None
                loss, stats = grpo_loss(
                    logp,
                    old_logp,
                    advantages[chunk],
                    mask[chunk],
                    objective=objective,
                    ref_logp=chunk_ref,
                    num_tokens=num_tokens,
                )
                accelerator.backward(loss)
                if accelerator.sync_gradients and clip_here:  # DeepSpeed clips by its JSON
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
            step_stats = [loss.item(), stats["kl"], stats["clip_frac"]]
            sums += torch.tensor(step_stats, device=accelerator.device)
    return (sums / (args.num_iterations * ga)).tolist()


# ----------------------------------------------------------------------------- log
def step_metrics(
    run: common.Run, step: int, rollout: dict, losses: list[float], names: list[str], seconds: float
) -> dict:
    """One metrics row; one reduction for the losses, one gather for rewards and token counts."""
    import torch

    accelerator = run.accelerator
    loss, kl, clip_frac = accelerator.reduce(
        torch.tensor(losses, device=accelerator.device), "mean"
    ).tolist()
    fn_means = accelerator.gather(rollout["per_fn"]).mean(0).tolist()
    n_tokens = int(accelerator.gather(rollout["mask"].sum()[None]).sum())
    all_rewards = rollout["all_rewards"]
    metrics = {
        "step": step,
        "reward": float(all_rewards.mean()),
        "reward_std": float(all_rewards.std()),
    }
    for name, value in zip(names, fn_means, strict=True):
        metrics[f"reward/{name}"] = value
    metrics.update(
        {
            "loss": loss,
            "kl": kl,
            "clip_frac": clip_frac,
            "completion_len": n_tokens / (run.per_rank * run.world),
            "tokens": n_tokens,
            "tok_s": n_tokens / seconds,
            "step_s": seconds,
        }
    )
    return metrics


def progress_postfix(metrics: dict, args: Args) -> dict:
    """What the progress bar shows after each step, reward first.

    The loss is left out when the policy ratio is 1 (one update per rollout, no KL term): it is
    then -mean(advantages) = 0 by construction and read as broken (`loss=-0.0000`)."""
    shown = {
        "reward": f"{metrics['reward']:.3f}",
        "len": f"{metrics['completion_len']:.1f}",
    }
    if args.beta:
        shown["kl"] = f"{metrics['kl']:.4f}"
    if args.num_iterations > 1 or args.beta:
        shown["loss"] = f"{metrics['loss']:.4f}"
    return shown


# ----------------------------------------------------------------------------- main
def main(argv=None) -> None:
    common.exit_with_launcher()
    args = parse_args(argv)
    reward_names = parse_rewards(args)[0]
    rows = load_rows(args)  # bad input is refused before torch loads: seconds, not minutes
    common.check_model(args.model)
    resume_path = run_dir.claim_output_dir(args)

    run = setup(args)
    run_dir.prepare_output_dir(run.accelerator, args.output_dir, resume_path)
    tok, model, ref, optimizer = build_models(args, run)
    start_step, metrics_log = run_dir.resume_or_start(args, run, resume_path)
    accelerator = run.accelerator
    accelerator.print(
        f"grpo: {common.describe_setup(run)}, "
        f"{run.per_step} prompts x {args.num_generations} generations per "
        f"step, micro-batch {args.per_device_batch_size}, "
        f"accumulation {args.gradient_accumulation_steps}, {lora.describe(args)}"
    )
    bar = common.start_progress(run, args, start_step)

    for step in range(start_step + 1, args.max_steps + 1):
        started = time.time()
        rollout = generate_rollout(args, run, model, tok, rows, step)
        losses = update_policy(args, run, model, ref, optimizer, rollout)
        metrics = step_metrics(run, step, rollout, losses, reward_names, time.time() - started)
        metrics_log.write(metrics)
        accelerator.log(metrics, step=step)  # no-op without trackers
        bar.set_postfix(progress_postfix(metrics, args), refresh=False)
        bar.update(1)
        run_dir.checkpoint_on_schedule(run, args, step)
    bar.close()

    run_dir.save_final_model(accelerator, model, tok, args.output_dir, "grpo", args.merge_adapter)
    common.finish_run(accelerator)


if __name__ == "__main__":
    main()
