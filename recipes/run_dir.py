"""A recipe's run directory (`--output-dir`): one run at a time, where a run starts, checkpoints
that survive a SIGKILL at any moment, metrics.jsonl, and the final model.

    out/.lock                  held (flock) by the run using the directory; never deleted
    out/checkpoint-STEP/       accelerator.save_state + trainer_state.json (step, data position,
                               size of every file), written to .tmp-checkpoint-STEP, then renamed
    out/latest                 the newest complete checkpoint's name, replaced atomically
    out/metrics.jsonl          one JSON line per step, every step exactly once across resumes
    out/final/                 the model in HF format + tokenizer

Nothing here imports torch: the lock and the fresh-or-resume decision come before the heavy
imports, so a refused directory costs seconds, not a distributed start-up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import time

import lora
from arguments import RunArgs, fail, note

LOCK_NAME = ".lock"
LOCK_WAIT_S = 3.0  # a run SIGKILLed a moment ago may still be exiting (and holding the lock)
HELD_LOCKS = []  # this process's open lock files: closing one would release its lock
ARTIFACTS = re.compile(
    r"^(checkpoint-\d+|\.tmp-.*|\..+\.tmp|latest|latest\.tmp|metrics\.jsonl|final"
    r"|ref_logps\.pt|sft|dpo|grpo)$"
)  # the last three: tensorboard logs


# ----------------------------------------------------------------------------- one run at a time
def lock_output_dir(output_dir: str) -> None:
    """Hold an exclusive flock on `output_dir/.lock` for the rest of this process's life.

    Two runs started together on one directory both saw it empty and then overwrote each
    other's files; the second now stops here. The kernel releases the lock when the process
    dies, however it dies, so a crashed run never leaves a stale lock."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_NAME)
    handle = open(path, "a+")
    deadline = time.monotonic() + LOCK_WAIT_S
    while not try_lock(handle, path):
        handle.seek(0)
        holder = handle.read().split()
        # Waiting is only for a holder that is exiting. Waiting on a live one let a short run
        # finish inside the wait, and the second run then called the directory "an earlier run".
        if time.monotonic() > deadline or holder_is_running_here(holder):
            handle.close()
            fail(
                "output_dir",
                f"another run, {describe_holder(holder)}, is using {output_dir}",
                "wait for it to finish, or pick another --output-dir",
            )
        time.sleep(0.1)
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()} {socket.gethostname()}\n")
    handle.flush()
    HELD_LOCKS.append(handle)


def try_lock(handle, path: str) -> bool:
    """True when this process now holds the lock, or when the filesystem cannot lock at all
    (some Lustre and NFS mounts): then the run goes on after saying so."""
    import fcntl

    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        note(f"cannot lock {path} ({e.strerror}); make sure no other run uses its directory")
    return True


def holder_is_running_here(holder: list[str]) -> bool:
    """True when the lock file names a process on this host that is running and not exiting.

    Linux's /proc/PID/stat gives the state (Z: zombie, X: dead) and the task flags, where
    PF_EXITING (0x4, include/linux/sched.h) marks a process that is tearing down (a SIGKILLed
    run releasing its files). Anything unreadable counts as not running, so the caller waits."""
    if len(holder) < 2 or holder[1] != socket.gethostname() or not holder[0].isdigit():
        return False
    try:
        with open(f"/proc/{holder[0]}/stat") as stat_file:
            stat = stat_file.read()
    except OSError:
        return False
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 7 or fields[0] in ("Z", "X", "x"):
        return False
    pf_exiting = 0x4
    return not int(fields[6]) & pf_exiting


def describe_holder(holder: list[str]) -> str:
    """ "pid N" (with the host when it is another machine) from the lock file's `pid host`."""
    if not holder:
        return "pid unknown"
    if len(holder) > 1 and holder[1] != socket.gethostname():
        return f"pid {holder[0]} on {holder[1]}"
    return f"pid {holder[0]}"


# ----------------------------------------------------------------------------- where a run starts
def decide_start(args: RunArgs) -> str:
    """Where this run starts: a checkpoint directory to resume from, or "" for a fresh start.

    A fresh start in a non-empty directory needs --overwrite, so a crash can never resume an
    older run's `latest`."""
    out = args.output_dir
    if args.resume_from in ("latest", "auto"):
        found = find_resumable_checkpoint(out)
        if found:
            return found
        if args.resume_from == "latest":
            fail(
                "resume_from",
                f"no complete checkpoint in {out}",
                "start without --resume-from, or use --resume-from auto",
            )
    elif args.resume_from:
        problem = checkpoint_problem(args.resume_from)
        if problem:
            fail(
                "resume_from",
                f"{args.resume_from}: {problem}",
                "pass `latest` or a complete checkpoint-STEP directory",
            )
        return args.resume_from
    left = [name for name in os.listdir(out) if name != LOCK_NAME] if os.path.isdir(out) else []
    if left and not args.overwrite and args.resume_from != "auto":
        fail(
            "output_dir",
            f"{out} is not empty (an earlier run?)",
            "add --resume-from latest to continue it, --overwrite to start over, "
            "or pick another --output-dir",
        )
    return ""


def claim_output_dir(args: RunArgs) -> str:
    """Before any heavy import: the main process (RANK 0, or the only process) locks the
    directory, then every rank decides where the run starts (nobody writes yet; the directory
    is cleared by prepare_output_dir once the ranks are connected). Returns the checkpoint to
    resume from, or ""."""
    if os.environ.get("RANK", "0") == "0":
        lock_output_dir(args.output_dir)
    return decide_start(args)


def prepare_output_dir(accelerator, output_dir: str, resume_path: str) -> None:
    """Every rank has decided; on a fresh start the main process clears the old artifacts."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process and not resume_path:
        start_fresh_directory(output_dir)
    accelerator.wait_for_everyone()


def start_fresh_directory(output_dir: str) -> None:
    """Main process, fresh start: remove what an earlier run of a recipe left (nothing else)."""
    os.makedirs(output_dir, exist_ok=True)
    for name in os.listdir(output_dir):
        path = os.path.join(output_dir, name)
        if not ARTIFACTS.match(name):
            continue
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def resume_or_start(args: RunArgs, run, resume_path: str):
    """Load the checkpoint (weights, optimizer, every rank's RNG) when resuming; the data
    position is a function of the step. Returns (start step, metrics log)."""
    start_step = 0
    if resume_path:
        state = read_checkpoint_state(resume_path)
        used = state.get(f"{run.unit}_per_step")
        if used != run.per_step:  # the data order is a function of (step, data per step)
            fail(
                "resume_from",
                f"the checkpoint used {used} {run.noun} per step, this run {run.per_step}",
                "resume with the same global batch (micro-batch x processes x accumulation)",
            )
        run.accelerator.load_state(resume_path, **run.load_kwargs)
        start_step = state["step"]
        run.accelerator.print(f"{run.project}: resumed from {resume_path} at step {start_step}")
    return start_step, MetricsLog(run.accelerator, args.output_dir, start_step)


# ----------------------------------------------------------------------------- checkpoints
def fsync_path(path: str) -> None:
    """Flush a file's or a directory's entry to disk (a directory fsync makes renames durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, text: str) -> None:
    """Write via a temp file + fsync + rename, then fsync the directory: old or new, never torn.

    The temp file's name is unique (mkstemp), so two writers of one path never share it."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_path(folder)


def list_files(root: str) -> dict[str, int]:
    """{relative path: size} of every file under root."""
    sizes = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            sizes[os.path.relpath(path, root)] = os.path.getsize(path)
    return sizes


def checkpoint_step(name: str) -> int:
    match = re.fullmatch(r"checkpoint-(\d+)", os.path.basename(os.path.normpath(name)))
    return int(match.group(1)) if match else -1


def checkpoint_on_schedule(run, args: RunArgs, step: int) -> None:
    """Every `--save-every` steps and at the last one; the state records the data position
    (`rows_seen` / `prompts_seen`) and how much data a step takes, which a resume checks."""
    if not args.save_every or (step % args.save_every and step != args.max_steps):
        return
    state = {
        "step": step,
        f"{run.unit}_per_step": run.per_step,
        f"{run.unit}_seen": step * run.per_step,
    }
    save_checkpoint(
        run.accelerator, args.output_dir, step, state, args.save_total_limit, run.save_kwargs
    )


def save_checkpoint(
    accelerator, output_dir: str, step: int, state: dict, keep: int = 0, save_kwargs=None
) -> None:
    """checkpoint-STEP via a temp dir, fsynced, renamed; then `latest` moves; then old ones rotate.

    A SIGKILL at any moment leaves `latest` naming a complete checkpoint. `trainer_state.json`
    is written last and lists every file with its size, so a truncated file is detected."""
    final = os.path.join(output_dir, f"checkpoint-{step}")
    tmp = os.path.join(output_dir, f".tmp-checkpoint-{step}")
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a save that a crash cut short
    accelerator.wait_for_everyone()
    accelerator.save_state(tmp, **(save_kwargs or {}))  # every rank: its shards + RNG state
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        files = list_files(tmp)
        for name in files:
            fsync_path(os.path.join(tmp, name))
        write_atomic(os.path.join(tmp, "trainer_state.json"), json.dumps({**state, "files": files}))
        shutil.rmtree(final, ignore_errors=True)  # a broken one from before a resume
        os.replace(tmp, final)
        fsync_path(output_dir)
        write_atomic(os.path.join(output_dir, "latest"), os.path.basename(final))
        if keep:
            rotate_checkpoints(output_dir, keep)
    accelerator.wait_for_everyone()


def rotate_checkpoints(output_dir: str, keep: int) -> None:
    """Delete all but the newest `keep` checkpoint-STEP directories (--save-total-limit)."""
    steps = sorted(checkpoint_step(n) for n in os.listdir(output_dir) if checkpoint_step(n) >= 0)
    for step in steps[:-keep]:
        shutil.rmtree(os.path.join(output_dir, f"checkpoint-{step}"), ignore_errors=True)


def checkpoint_problem(path: str) -> str:
    """ "" when `path` is a complete checkpoint, else what is wrong with it."""
    state_path = os.path.join(path, "trainer_state.json")
    if not os.path.isfile(state_path):
        return "no trainer_state.json (not a checkpoint, or its save was cut off)"
    try:
        with open(state_path) as f:
            state = json.load(f)
    except (OSError, json.JSONDecodeError):
        return "trainer_state.json is unreadable"
    for name, size in state.get("files", {}).items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return f"{name} is missing"
        if os.path.getsize(file) != size:
            return f"{name} has {os.path.getsize(file)} of {size} bytes"
    return ""


def find_resumable_checkpoint(output_dir: str) -> str:
    """The newest complete checkpoint in output_dir ("" if none); damaged newer ones are named."""
    if not os.path.isdir(output_dir):
        return ""
    names = [n for n in os.listdir(output_dir) if checkpoint_step(n) >= 0]
    for name in sorted(names, key=checkpoint_step, reverse=True):
        path = os.path.join(output_dir, name)
        problem = checkpoint_problem(path)
        if not problem:
            return path
        note(f"skipping {path}: {problem}; trying the one before")
    return ""


def read_checkpoint_state(path: str) -> dict:
    with open(os.path.join(path, "trainer_state.json")) as f:
        return json.load(f)


# ----------------------------------------------------------------------------- metrics
class MetricsLog:
    """metrics.jsonl: one JSON line per step, written by the main process only.

    On resume, lines of steps after the checkpoint (lost in the crash) and a torn last line are
    dropped, so every step appears exactly once."""

    def __init__(self, accelerator, output_dir: str, start_step: int):
        self.accelerator = accelerator
        self.path = os.path.join(output_dir, "metrics.jsonl")
        if accelerator.is_main_process:
            kept = [row for row in read_metrics(self.path) if row["step"] <= start_step]
            write_atomic(self.path, "".join(json.dumps(row) + "\n" for row in kept))

    def write(self, metrics: dict) -> None:
        if self.accelerator.is_main_process:
            with open(self.path, "a") as f:
                f.write(json.dumps(metrics) + "\n")


def read_metrics(path: str) -> list[dict]:
    """Rows of a metrics.jsonl; a torn (half-written) line is skipped."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "step" in row:
                rows.append(row)
    return rows


# ----------------------------------------------------------------------------- final model
def save_final_model(
    accelerator, model, tokenizer, output_dir: str, program: str, merge_adapter: bool = False
) -> None:
    """The model in HF format in output_dir/final (16-bit weights gathered under ZeRO-3); a LoRA
    model as its adapter, or merged into a full model with `merge_adapter` (lora.py).

    Written to a temp dir and renamed, so `final` is never half-written. Reload it in a separate
    process: under ZeRO-3 loading on rank 0 alone inside the run starts parameter gathers the
    other ranks never join, and they hang."""
    if lora.is_peft_model(accelerator.unwrap_model(model)):
        final = lora.save_final_adapter(accelerator, model, tokenizer, output_dir, merge_adapter)
        saved = "model, adapter merged," if merge_adapter else "adapter"
        accelerator.print(f"{program}: final {saved} in {final}")
        return
    state_dict = accelerator.get_state_dict(model)  # collective: every rank must call it
    if accelerator.is_main_process:
        final = os.path.join(output_dir, "final")
        tmp = os.path.join(output_dir, ".tmp-final")
        shutil.rmtree(tmp, ignore_errors=True)
        accelerator.unwrap_model(model).save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        accelerator.print(f"{program}: final model in {final}")
    accelerator.wait_for_everyone()
