"""Supervised fine-tuning (SFT) in one readable file, on accelerate + transformers + torch (no trl).

Trains a causal LM on `prompt`/`completion` rows (or `messages` rows rendered with the
tokenizer's chat template); the loss is the mean cross-entropy over completion tokens only
(prompt tokens are masked out). `--packing` concatenates examples into full-length blocks.
Without flags: a tiny random-init model learns the built-in toy task ("3+4=" -> "7") offline.

    python recipes/sft.py                                     # one process / one GPU, toy task
    accelerate launch --config_file deepspeed_configs/accelerate/zero2.yaml --num_processes 8 \\
        --mixed_precision bf16 recipes/sft.py \\
        --dataset data.jsonl --model Qwen/Qwen2.5-0.5B        # all GPUs of one node, ZeRO-2
    accelerate launch --config_file cfg/accelerate.yaml --machine_rank $NODE_RANK \\
        recipes/sft.py --config my_sft.yaml                   # on every node of a multi-node job
    python recipes/sft.py --resume-from latest                # continue the last checkpoint

A step = per_device_batch_size x processes x gradient_accumulation_steps examples (or blocks).
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

PROGRAM = "sft.py"
IGNORE = -100  # label of a token that takes no loss (prompt, padding)


# ----------------------------------------------------------------------------- arguments
@dataclasses.dataclass
class Args(arguments.RunArgs):
    output_dir: str = override("output_dir", "runs/sft")
    per_device_batch_size: int = override("per_device_batch_size", 16)
    learning_rate: float = option(
        3e-3, "AdamW learning rate; high on purpose for the tiny default model, ~2e-5 for real ones"
    )
    max_seq_len: int = option(128, "prompt + completion tokens; longer examples are cut at the end")
    packing: bool = option(False, "concatenate examples into blocks of max_seq_len (no padding)")


def parse_args(argv=None) -> Args:
    """Dataclass defaults < `--config file.yaml` < command-line flags; then every value checked."""
    args = arguments.parse_args(Args, argv, PROGRAM, __doc__.splitlines()[0])
    arguments.check_run_args(args)
    arguments.check_at_least(args, 2, "max_seq_len")
    return args


# ----------------------------------------------------------------------------- data
def toy_rows() -> list[dict]:
    """The embedded task: all 100 single-digit sums, {"prompt": "3+4=", "completion": "7"}."""
    return [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a in range(10) for b in range(10)]


def load_rows(args: Args) -> list[dict]:
    if not args.dataset:
        return toy_rows()
    rows = common.read_rows(args.dataset, args.dataset_split)
    check_sft_rows(rows, args.dataset)
    return rows


def check_sft_rows(rows: list, where: str) -> None:
    """Each row: `prompt` + `completion` strings, or `messages` ending with an assistant turn."""
    if rows and isinstance(rows[0], dict) and "messages" in rows[0]:
        for number, row in enumerate(rows, start=1):
            check_messages(row, number, where)
    else:
        common.check_rows(rows, ("prompt", "completion"), where)


def check_messages(row, number: int, where: str) -> None:
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list) or not messages:
        fail(
            "messages",
            f"{where} row {number}: `messages` is missing or not a list",
            'give [{"role": "user", "content": ...}, {"role": "assistant", ...}]',
        )
    for turn in messages:
        if (
            not isinstance(turn, dict)
            or not isinstance(turn.get("content"), str)
            or not isinstance(turn.get("role"), str)
        ):
            fail(
                "messages",
                f"{where} row {number}: a turn lacks a string `role` or `content`",
                "give each turn `role` and `content` strings",
            )
    if messages[-1]["role"] != "assistant":
        fail(
            "messages",
            f"{where} row {number}: the last turn is {messages[-1]['role']!r}",
            "end each conversation with the assistant turn to learn",
        )


def split_prompt_completion(tok, row: dict) -> tuple[str, str, bool]:
    """(prompt text, completion text, whether EOS must be appended) of one row.

    `messages` rows: the prompt is the conversation before the last (assistant) turn rendered
    with add_generation_prompt; the completion is what the full rendering adds to it."""
    if "messages" not in row:
        return row["prompt"], row["completion"], True
    if not tok.chat_template:
        fail(
            "messages",
            "rows use `messages` but the tokenizer has no chat template",
            "use prompt/completion rows or a model whose tokenizer has a chat template",
        )
    prompt = tok.apply_chat_template(
        row["messages"][:-1], tokenize=False, add_generation_prompt=True
    )
    full = tok.apply_chat_template(row["messages"], tokenize=False)
    if not full.startswith(prompt):
        fail(
            "messages",
            "the chat template renders the prompt differently inside the full conversation",
            "use prompt/completion rows for this tokenizer",
        )
    return prompt, full[len(prompt) :], False


def tokenize_row(tok, row: dict, max_seq_len: int) -> tuple[list[int], list[int]]:
    """(input ids, labels): labels are IGNORE on prompt tokens: only the completion is learned."""
    prompt, completion, add_eos = split_prompt_completion(tok, row)
    prompt_ids = tok(prompt, add_special_tokens=True).input_ids
    completion_ids = tok(completion, add_special_tokens=False).input_ids
    if add_eos:
        completion_ids = completion_ids + [tok.eos_token_id]  # so the model learns to stop
    ids = (prompt_ids + completion_ids)[:max_seq_len]
    labels = ([IGNORE] * len(prompt_ids) + completion_ids)[:max_seq_len]
    return ids, labels


def pack(examples: list[tuple], block: int) -> list[tuple[list[int], list[int]]]:
    """Concatenate examples and cut the stream into blocks of `block` tokens (the tail is dropped).

    Examples in a block attend to each other (no per-example mask); the loss stays on
    completion tokens only.

    >>> pack([([1, 2], [-100, 2]), ([3, 4, 5], [-100, 4, 5])], 2)
    [([1, 2], [-100, 2]), ([3, 4], [-100, 4])]
    """
    ids, labels = [], []
    for example_ids, example_labels in examples:
        ids.extend(example_ids)
        labels.extend(example_labels)
    count = len(ids) // block
    blocks = []
    for i in range(count):
        window = slice(i * block, (i + 1) * block)
        blocks.append((ids[window], labels[window]))
    return blocks


def build_examples(args: Args, tok, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    examples = [tokenize_row(tok, row, args.max_seq_len) for row in rows]
    if args.packing:
        examples = pack(examples, args.max_seq_len)
    trainable = [e for e in examples if any(label != IGNORE for label in e[1])]
    if not trainable:
        fail(
            "max_seq_len",
            f"{args.max_seq_len} tokens leave no completion token to learn",
            "raise --max-seq-len or shorten the prompts",
        )
    return trainable


def collate(examples: list, pad_id: int, device) -> dict:
    """A right-padded micro-batch: input_ids, attention_mask, labels."""
    ids = [e[0] for e in examples]
    return {
        "input_ids": common.pad_right(ids, pad_id).to(device),
        "attention_mask": common.pad_right([[1] * len(i) for i in ids], 0).to(device),
        "labels": common.pad_right([e[1] for e in examples], IGNORE).to(device),
    }


# ----------------------------------------------------------------------------- loss
def sft_loss(logits, labels, num_tokens=None):
    """Cross-entropy of each next token whose label is not IGNORE, summed, / num_tokens.

    Logits at position t predict token t + 1. `num_tokens` defaults to this batch's labelled
    tokens; the loop passes this rank's step total / accumulation, so micro-batches of
    different lengths weigh each token the same."""
    import torch

    logits = logits[:, :-1].float()
    targets = labels[:, 1:]
    total = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE,
        reduction="sum",
    )
    if num_tokens is None:
        num_tokens = (targets != IGNORE).sum().clamp(min=1)
    return total / num_tokens


# ----------------------------------------------------------------------------- setup
def build_model(args: Args, run: common.Run, tok):
    """The model (with LoRA adapters under --finetuning lora/qlora) and its optimizer, prepared
    (wrapped by DDP or a DeepSpeed engine)."""
    from accelerate.utils import set_seed

    set_seed(args.seed)
    model = common.load_policy(args, tok, run.accelerator)
    return common.prepare_training(args, run, model)


# ----------------------------------------------------------------------------- update
def train_step(args: Args, run: common.Run, model, optimizer, batch: list, pad_id: int) -> dict:
    """One optimizer step over this rank's examples; returns summed loss, tokens, seconds."""
    accelerator = run.accelerator
    chunks = common.micro_batches(batch, args.per_device_batch_size)
    labelled = sum(sum(label != IGNORE for label in e[1][1:]) for e in batch)
    num_tokens = max(labelled, 1) / len(chunks)  # a micro-batch's share of this rank's tokens
    clip_here = accelerator.state.deepspeed_plugin is None and args.max_grad_norm
    loss_sum = 0.0
    seen = 0
    for chunk in chunks:
        inputs = collate(chunk, pad_id, accelerator.device)
        with accelerator.accumulate(model):
            with accelerator.autocast():
                logits = model(
                    input_ids=inputs["input_ids"],
                    attention_mask=inputs["attention_mask"],
                    use_cache=False,
                ).logits
            loss = sft_loss(logits, inputs["labels"], num_tokens)
            accelerator.backward(loss)
            if accelerator.sync_gradients and clip_here:  # DeepSpeed clips by its JSON
                accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
        loss_sum += loss.item() * num_tokens  # back to a token sum
        seen += int(inputs["attention_mask"].sum())
    return {"loss_sum": loss_sum, "labelled": labelled, "seen": seen}


def step_metrics(run: common.Run, step: int, sums: dict, seconds: float) -> dict:
    """Token-mean loss over every rank's completion tokens, and tokens/s of all tokens seen."""
    import torch

    accelerator = run.accelerator
    totals = torch.tensor(
        [sums["loss_sum"], sums["labelled"], sums["seen"]],
        device=accelerator.device,
        dtype=torch.float64,
    )
    loss_sum, labelled, seen = accelerator.reduce(totals, "sum").tolist()
    return {
        "step": step,
        "loss": loss_sum / max(labelled, 1),
        "completion_tokens": int(labelled),
        "tokens": int(seen),
        "tok_s": seen / seconds,
        "step_s": seconds,
    }


# ----------------------------------------------------------------------------- main
def main(argv=None) -> None:
    common.exit_with_launcher()
    args = parse_args(argv)
    rows = load_rows(args)  # bad input is refused before torch loads: seconds, not minutes
    common.check_model(args.model)
    resume_path = run_dir.claim_output_dir(args)

    run = common.start_run(args, "sft", unit="rows", noun="examples")
    run_dir.prepare_output_dir(run.accelerator, args.output_dir, resume_path)
    tok = common.load_tokenizer(args)
    examples = build_examples(args, tok, rows)
    model, optimizer = build_model(args, run, tok)
    start_step, metrics_log = run_dir.resume_or_start(args, run, resume_path)
    accelerator = run.accelerator
    accelerator.print(
        f"sft: {common.describe_setup(run)}, {lora.describe(args)}, "
        f"{len(examples)} {'blocks' if args.packing else 'examples'}, "
        f"{run.per_step} per step, micro-batch {args.per_device_batch_size}, "
        f"accumulation {args.gradient_accumulation_steps}"
    )
    bar = common.start_progress(run, args, start_step)

    for step in range(start_step + 1, args.max_steps + 1):
        started = time.time()
        picked = common.rank_indices(
            step, len(examples), run.per_rank, run.world, run.rank, args.seed
        )
        sums = train_step(
            args, run, model, optimizer, [examples[i] for i in picked], tok.pad_token_id
        )
        metrics = step_metrics(run, step, sums, time.time() - started)
        metrics_log.write(metrics)
        accelerator.log(metrics, step=step)
        bar.set_postfix(loss=f"{metrics['loss']:.4f}", refresh=False)
        bar.update(1)
        run_dir.checkpoint_on_schedule(run, args, step)
    bar.close()

    run_dir.save_final_model(accelerator, model, tok, args.output_dir, "sft", args.merge_adapter)
    common.finish_run(accelerator)


if __name__ == "__main__":
    main()
