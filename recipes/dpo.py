"""Direct Preference Optimization (DPO) in one readable file, on accelerate + transformers + torch.

Trains on `prompt`/`chosen`/`rejected` rows with the sigmoid DPO loss
  -log sigmoid(beta * ((log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected))))
where log pi(y) sums the completion tokens' log-probs. Chosen and rejected go through the model in
ONE concatenated forward. The frozen reference is sharded through DeepSpeed under ZeRO-3 and
replicated otherwise, or its log-probs are computed once before training (`--precompute-ref`).
Without flags: a tiny random-init model learns to prefer "3+4=7" over "3+4=3+4" offline.

    python recipes/dpo.py                                     # one process / one GPU, toy task
    accelerate launch --config_file deepspeed_configs/accelerate/zero3.yaml --num_processes 8 \\
        --mixed_precision bf16 recipes/dpo.py \\
        --dataset pairs.jsonl --model runs/sft/final          # all GPUs of one node, ZeRO-3
    accelerate launch --config_file cfg/accelerate.yaml --machine_rank $NODE_RANK \\
        recipes/dpo.py --config my_dpo.yaml                   # on every node of a multi-node job
    python recipes/dpo.py --resume-from latest                # continue the last checkpoint

A step = per_device_batch_size x processes x gradient_accumulation_steps preference pairs.
"""

from __future__ import annotations

import dataclasses
import os
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

PROGRAM = "dpo.py"


# ----------------------------------------------------------------------------- arguments
@dataclasses.dataclass
class Args(arguments.RunArgs):
    output_dir: str = override("output_dir", "runs/dpo")
    per_device_batch_size: int = option(
        8, "preference pairs per micro-batch (2x sequences); a DeepSpeed JSON integer wins"
    )
    learning_rate: float = option(
        1e-3, "AdamW learning rate; high on purpose for the tiny default model, ~5e-7 for real ones"
    )
    beta: float = option(0.1, "strength of the pull towards the reference (DPO's temperature)")
    max_prompt_len: int = option(64, "prompt tokens; longer prompts keep their end")
    max_completion_len: int = option(
        64, "chosen/rejected tokens; longer answers are cut at the end"
    )
    precompute_ref: bool = option(
        False, "reference log-probs once up front; no reference model in memory"
    )


def parse_args(argv=None) -> Args:
    """Dataclass defaults < `--config file.yaml` < command-line flags; then every value checked."""
    args = arguments.parse_args(Args, argv, PROGRAM, __doc__.splitlines()[0])
    arguments.check_run_args(args)
    arguments.check_positive_float(args, "beta")
    arguments.check_at_least(args, 1, "max_prompt_len", "max_completion_len")
    return args


# ----------------------------------------------------------------------------- data
def toy_rows() -> list[dict]:
    """The embedded task: single-digit sums, the answer preferred over echoing the question."""
    rows = []
    for a in range(10):
        for b in range(10):
            rows.append({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": f"{a}+{b}"})
    return rows


def load_rows(args: Args) -> list[dict]:
    if not args.dataset:
        return toy_rows()
    rows = common.read_rows(args.dataset, args.dataset_split)
    common.check_rows(rows, ("prompt", "chosen", "rejected"), args.dataset)
    return rows


def tokenize_pair(tok, row: dict, args: Args) -> dict:
    """Token ids of the prompt (its end kept) and of each answer + EOS (its start kept)."""
    prompt = tok(row["prompt"], add_special_tokens=True).input_ids[-args.max_prompt_len :]
    answers = {}
    for side in ("chosen", "rejected"):
        ids = tok(row[side], add_special_tokens=False).input_ids + [tok.eos_token_id]
        answers[side] = ids[: args.max_completion_len]
    return {"prompt": prompt, **answers}


def collate_pairs(pairs: list[dict], pad_id: int, device) -> dict:
    """[chosen 1..B, rejected 1..B] as one right-padded batch; `mask` marks answer tokens."""
    sequences, masks = [], []
    for side in ("chosen", "rejected"):
        for pair in pairs:
            sequences.append(pair["prompt"] + pair[side])
            masks.append([0] * len(pair["prompt"]) + [1] * len(pair[side]))
    return {
        "input_ids": common.pad_right(sequences, pad_id).to(device),
        "attention_mask": common.pad_right([[1] * len(s) for s in sequences], 0).to(device),
        "answer_mask": common.pad_right(masks, 0).to(device),
    }


# ----------------------------------------------------------------------------- loss
def sequence_logprobs(model, batch: dict):
    """Sum of the answer tokens' log-probs per sequence, [2B]."""
    import torch

    logits = (
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        .logits[:, :-1]
        .float()
    )
    targets = batch["input_ids"][:, 1:]
    per_token = torch.gather(logits.log_softmax(-1), 2, targets[..., None]).squeeze(-1)
    return (per_token * batch["answer_mask"][:, 1:]).sum(1)


def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta: float):
    """Sigmoid DPO loss (mean over pairs) and the implicit rewards beta * (log pi - log ref).

    Returns (loss, chosen_rewards, rejected_rewards); reward margin = chosen - rejected."""
    import torch

    chosen_rewards = beta * (policy_chosen - ref_chosen)
    rejected_rewards = beta * (policy_rejected - ref_rejected)
    loss = -torch.nn.functional.logsigmoid(chosen_rewards - rejected_rewards).mean()
    return loss, chosen_rewards.detach(), rejected_rewards.detach()


# ----------------------------------------------------------------------------- setup
def build_models(args: Args, run: common.Run, tok):
    """Policy + optimizer (prepared) and the frozen reference (None with --precompute-ref).

    Under --finetuning lora/qlora the reference is the policy itself with its adapters disabled
    (reference_logprobs enters lora.as_reference): no second copy of the weights."""
    from accelerate.utils import set_seed

    set_seed(args.seed)
    model = common.load_policy(args, tok, run.accelerator)
    separate_ref = not args.precompute_ref and args.finetuning == "full"
    ref = common.load_model(args, tok) if separate_ref else None
    model, optimizer = common.prepare_training(args, run, model)
    if ref is not None:
        dtype = next(model.parameters()).dtype  # the policy's dtype, so rewards start at 0
        ref = common.prepare_reference(ref, run.accelerator, run.zero_stage, dtype)
    elif not args.precompute_ref:
        ref = model
    return model, optimizer, ref


def precompute_reference(args: Args, run: common.Run, model, pairs: list[dict], pad_id: int):
    """[rows, 2] reference log-probs (chosen, rejected) from the policy before any update.

    Each rank scores every world-th row, all ranks the same number of micro-batches (ZeRO-3
    forwards are collective), then one gather puts the table together on every rank."""
    import torch

    accelerator = run.accelerator
    mine = list(range(run.rank, len(pairs), run.world))
    per_rank = -(-len(pairs) // run.world)  # ceil: the last ranks repeat a row to keep step
    filler = mine[-1] if mine else 0
    mine = mine + [filler] * (per_rank - len(mine))
    scores = []
    model.eval()
    for chunk in common.micro_batches(mine, args.per_device_batch_size):
        batch = collate_pairs([pairs[i] for i in chunk], pad_id, accelerator.device)
        with torch.no_grad(), accelerator.autocast():
            logps = sequence_logprobs(model, batch)
        scores.append(torch.stack(logps.chunk(2), dim=1))
    model.train()
    all_scores = accelerator.gather(torch.cat(scores))
    all_rows = accelerator.gather(torch.tensor(mine, device=accelerator.device))
    table = torch.zeros(len(pairs), 2, device=accelerator.device)
    table[all_rows] = all_scores.float()
    return table


def reference_table(args: Args, run: common.Run, model, pairs, pad_id: int, start_step: int):
    """--precompute-ref: computed at step 0 and kept in the run directory, so a resumed run
    (whose policy has moved) reuses the original reference."""
    import torch

    path = os.path.join(args.output_dir, "ref_logps.pt")
    if start_step:
        if not os.path.isfile(path):
            fail(
                "resume_from",
                f"{path} is missing (the reference log-probs of this run)",
                "resume in the run directory that holds it, or start over",
            )
        return torch.load(path).to(run.accelerator.device)
    table = precompute_reference(args, run, model, pairs, pad_id)
    if run.accelerator.is_main_process:
        torch.save(table.cpu(), path + ".tmp")
        os.replace(path + ".tmp", path)
    run.accelerator.wait_for_everyone()
    return table


# ----------------------------------------------------------------------------- update
def step_batches(args: Args, run: common.Run, pairs: list[dict], picked: list[int], pad_id: int):
    """This rank's micro-batches of a step: (row indices, collated batch) each."""
    return [
        (chunk, collate_pairs([pairs[i] for i in chunk], pad_id, run.accelerator.device))
        for chunk in common.micro_batches(picked, args.per_device_batch_size)
    ]


def reference_logprobs(run: common.Run, ref, ref_table, indices: list[int], batch: dict):
    """(chosen, rejected) reference log-probs of a micro-batch: from the table or the model."""
    import torch

    if ref_table is not None:
        scores = ref_table[torch.tensor(indices, device=run.accelerator.device)]
        return scores[:, 0], scores[:, 1]
    with torch.no_grad(), run.accelerator.autocast(), lora.as_reference(run.accelerator, ref):
        return sequence_logprobs(ref, batch).chunk(2)


def train_step(args: Args, run: common.Run, model, optimizer, ref, ref_table, batches: list):
    """One optimizer step over this rank's micro-batches; returns per-pair sums for the metrics."""
    import torch

    accelerator = run.accelerator
    clip_here = accelerator.state.deepspeed_plugin is None and args.max_grad_norm
    sums = torch.zeros(7, device=accelerator.device, dtype=torch.float64)
    seen = 0
    for chunk, batch in batches:
        ref_chosen, ref_rejected = reference_logprobs(run, ref, ref_table, chunk, batch)
        with accelerator.accumulate(model):
            with accelerator.autocast():
                policy_chosen, policy_rejected = sequence_logprobs(model, batch).chunk(2)
            loss, chosen, rejected = dpo_loss(
                policy_chosen, policy_rejected, ref_chosen.float(), ref_rejected.float(), args.beta
            )
            accelerator.backward(loss)
            if accelerator.sync_gradients and clip_here:  # DeepSpeed clips by its JSON
                accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
        n = len(chunk)
        sums += torch.tensor(
            [
                loss.item() * n,
                float(chosen.sum()),
                float(rejected.sum()),
                float((chosen > rejected).sum()),
                n,
                float(ref_chosen.sum()),
                float(ref_rejected.sum()),
            ],
            device=accelerator.device,
            dtype=torch.float64,
        )
        seen += int(batch["attention_mask"].sum())
    return sums, seen


def step_metrics(run: common.Run, step: int, sums, seen: int, seconds: float) -> dict:
    """Means over every rank's pairs: loss, rewards, margin, accuracy (chosen reward higher)."""
    import torch

    accelerator = run.accelerator
    seen_all = int(accelerator.reduce(torch.tensor([seen], device=accelerator.device), "sum"))
    loss, chosen, rejected, correct, pairs, ref_chosen, ref_rejected = accelerator.reduce(
        sums, "sum"
    ).tolist()
    return {
        "step": step,
        "loss": loss / pairs,
        "reward_chosen": chosen / pairs,
        "reward_rejected": rejected / pairs,
        "reward_margin": (chosen - rejected) / pairs,
        "reward_accuracy": correct / pairs,
        "ref_logp_chosen": ref_chosen / pairs,
        "ref_logp_rejected": ref_rejected / pairs,
        "tokens": seen_all,
        "tok_s": seen_all / seconds,
        "step_s": seconds,
    }


# ----------------------------------------------------------------------------- main
def main(argv=None) -> None:
    common.exit_with_launcher()
    args = parse_args(argv)
    rows = load_rows(args)  # bad input is refused before torch loads: seconds, not minutes
    common.check_model(args.model)
    resume_path = run_dir.claim_output_dir(args)

    run = common.start_run(args, "dpo", unit="rows", noun="pairs")
    run_dir.prepare_output_dir(run.accelerator, args.output_dir, resume_path)
    tok = common.load_tokenizer(args)
    pairs = [tokenize_pair(tok, row, args) for row in rows]
    model, optimizer, ref = build_models(args, run, tok)
    start_step, metrics_log = run_dir.resume_or_start(args, run, resume_path)
    ref_table = None
    if args.precompute_ref:
        ref_table = reference_table(args, run, model, pairs, tok.pad_token_id, start_step)
    accelerator = run.accelerator
    reference = "precomputed" if args.precompute_ref else "a frozen model"
    if args.finetuning != "full" and not args.precompute_ref:
        reference = "the base model (adapters disabled)"
    accelerator.print(
        f"dpo: {common.describe_setup(run)}, "
        f"{len(pairs)} pairs, {run.per_step} per step, reference {reference}, "
        f"micro-batch {args.per_device_batch_size}, "
        f"accumulation {args.gradient_accumulation_steps}, {lora.describe(args)}"
    )
    bar = common.start_progress(run, args, start_step)

    for step in range(start_step + 1, args.max_steps + 1):
        started = time.time()
        picked = common.rank_indices(step, len(pairs), run.per_rank, run.world, run.rank, args.seed)
        batches = step_batches(args, run, pairs, picked, tok.pad_token_id)
        sums, seen = train_step(args, run, model, optimizer, ref, ref_table, batches)
        metrics = step_metrics(run, step, sums, seen, time.time() - started)
        metrics_log.write(metrics)
        accelerator.log(metrics, step=step)
        bar.set_postfix(
            loss=f"{metrics['loss']:.4f}", margin=f"{metrics['reward_margin']:.3f}", refresh=False
        )
        bar.update(1)
        run_dir.checkpoint_on_schedule(run, args, step)
    bar.close()

    run_dir.save_final_model(accelerator, model, tok, args.output_dir, "dpo", args.merge_adapter)
    common.finish_run(accelerator)


if __name__ == "__main__":
    main()
