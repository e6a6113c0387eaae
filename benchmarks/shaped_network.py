"""Real two-node DeepSpeed steps over a shaped network, against the speed model's prediction.

Two "nodes" are network namespaces joined by a veth pair (tests/launch/real_cluster.py
``namespace_pair``); ``tc qdisc ... tbf`` limits the pair to a link speed. One rank per node
trains a Llama-shaped model built from a config (fp32, random weights, random tokens) with
``deepspeed.initialize`` over gloo, under each configuration of the grid, and times the steps
after a warm-up, and each phase apart: the engine's forward, ``engine.backward`` (ZeRO-1/2's
reduction at the boundary included) and ``engine.step``. Right before each configuration,
inside the same two processes (so with the same contention between them), the ranks measure the
CPU "device" (speed/device.py ``measure_cpu_device``): the model's own forward and backward rate
(composed from the model built with none and two decoder layers), memory bandwidth,
DeepSpeedCPUAdam's and torch AdamW's rates, and the link by timed gloo collectives, the gradient
reductions as DeepSpeed issues them (their bucket copies and fresh flat buffers included).
``cpu_profile`` turns those into a ``DeviceProfile`` and ``estimate_step_time`` predicts each
configuration's step with it; the speed model's terms, regrouped by the phase that pays them
(``predict_phases``), print beside the measured phases.

One rank per node: the machine has 2 cores, so two ranks each run one thread on a core of their
own; two ranks per node would put four ranks on two cores and measure the scheduler.

Run as root (namespaces, tc):  .venv/bin/python benchmarks/shaped_network.py   (~11 min)
A slice: ``--configs zero2,zero2+offload --links 2gbit`` (~2 min). It prints, per link speed and
configuration, predicted and measured seconds per step, the error, whether the measured order
(pairs apart by more than 10 %) is predicted, and the phases measured against predicted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

# configuration name -> (ZeRO stage, optimizer offload)
CONFIGS = {
    "zero1": (1, False),
    "zero2": (2, False),
    "zero3": (3, False),
    "zero1+offload": (1, True),
    "zero2+offload": (2, True),
    "zero3+offload": (3, True),
}
# Llama shapes built from a config (no download): ~50M parameters for the benchmark, ~1.5M for the
# test slice, so that its slow link still runs a step in about a second.
SHAPES = {
    "bench": dict(hidden=512, layers=8, intermediate=2048, heads=8, vocab=16000),
    "tiny": dict(hidden=128, layers=2, intermediate=512, heads=4, vocab=4000),
}
MICRO_BATCH = 2
SEQ_LEN = 128
GRAD_ACCUM = 2  # two micro steps: ZeRO-1 reduces once per step, ZeRO-2 and -3 every micro step
WARMUP_STEPS = 1  # the first step allocates the optimizer states
LINK_RATES = ("500mbit", "2gbit")  # tbf rates; "none": the veth unshaped
RUN_LIMIT_S = 1500.0  # a whole grid at the slow link, generous for a busy machine
IFACE = "zfeth0"  # real_cluster.IFACE: the same interface name in both namespaces
# the collectives' buffer in the device measurement (at most half the model's gradients): past
# glibc's 32 MiB mmap threshold, as the 50M model's 200 MB bucket is, so that DeepSpeed's fresh
# bucket buffers cost their page faults in the measurement as in the run
LINK_MEGABYTES = 40.0
ORDER_GAP = 0.10  # measured times further apart than this must be predicted in that order
# one optimizer step's seconds in the rank, summed over its micro steps: the engine's forward,
# ``engine.backward`` (ZeRO-1/2's reduction at the boundary included) and ``engine.step``
PHASES = ("forward", "backward", "step")


def llama_config(shape: dict):
    """The transformers config of ``shape``: Llama, untied embeddings, fp32."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["heads"],
        vocab_size=shape["vocab"],
        max_position_embeddings=SEQ_LEN,
        tie_word_embeddings=False,
    )


# --- inside each rank ---------------------------------------------------------------------
def ds_config(stage: int, offload: bool) -> dict:
    """The DeepSpeed JSON of one configuration: fp32, DeepSpeed's own defaults otherwise
    (overlap_comm, buckets). AdamW: DeepSpeedCPUAdam under offload; without offload torch's
    AdamW (``torch_adam``), the optimizer an HF Trainer run of zerofit's JSON (no optimizer
    block) steps with, rather than DeepSpeed's FusedAdam, whose CPU build would be one more
    ~40 s JIT compile (deepspeed/runtime/engine.py, get_optimizer_configuration)."""
    zero: dict = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
    return {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": GRAD_ACCUM,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": not offload}},
        "steps_per_print": 10**9,
    }


def time_config(name: str, shape: dict, steps: int) -> dict:
    """Median seconds per optimizer step of configuration ``name`` after the warm-up."""
    import deepspeed
    import torch
    import torch.distributed as dist
    from transformers import LlamaForCausalLM

    stage, offload = CONFIGS[name]
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(shape))
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config(stage, offload)
    )
    generator = torch.Generator().manual_seed(1000 + dist.get_rank())
    ids = torch.randint(0, shape["vocab"], (MICRO_BATCH, SEQ_LEN), generator=generator)
    times = []
    phases: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for _ in range(WARMUP_STEPS + steps):
        dist.barrier()
        start = time.perf_counter()
        step_phases = dict.fromkeys(PHASES, 0.0)
        for _ in range(GRAD_ACCUM):
            began = time.perf_counter()
            loss = engine(input_ids=ids, labels=ids).loss
            forward_end = time.perf_counter()
            engine.backward(loss)
            backward_end = time.perf_counter()
            engine.step()
            step_phases["forward"] += forward_end - began
            step_phases["backward"] += backward_end - forward_end
            step_phases["step"] += time.perf_counter() - backward_end
        times.append(time.perf_counter() - start)
        for phase, seconds in step_phases.items():
            phases[phase].append(seconds)
    engine.destroy()
    return {
        "config": name,
        "step_s": statistics.median(times[WARMUP_STEPS:]),
        "times": times,
        "phases": {phase: statistics.median(s[WARMUP_STEPS:]) for phase, s in phases.items()},
    }


def worker(args: argparse.Namespace) -> int:
    """One rank: measure the device, then time every configuration; rank 0 prints JSON lines."""
    import dataclasses

    import deepspeed
    import torch
    import torch.distributed as dist

    from zerofit.speed.device import measure_cpu_device

    torch.set_num_threads(1)  # one core per rank (see the module docstring)
    deepspeed.init_distributed(dist_backend="gloo")
    started = time.monotonic()

    def progress(what: str) -> None:
        if dist.get_rank() == 0:
            print(f"PROGRESS {time.monotonic() - started:6.1f} s {what}", flush=True)

    progress("initialized")
    shape = SHAPES[args.shape]
    params = llama_params(shape)
    measured = None
    for name in args.configs.split(","):
        # measured again before each configuration: the machine's load drifts over a grid (a
        # short slice measures once: the link, which decides it, does not drift)
        if measured is None or not args.measure_once:
            measured = measure_cpu_device(
                model_config=llama_config(shape).to_dict(),
                micro_batch=MICRO_BATCH,
                seq_len=SEQ_LEN,
                partition_params=params // dist.get_world_size(),
                link_megabytes=min(LINK_MEGABYTES, params * 4 / 2**20 / 2),
            )
            progress(f"device measured before {name}")
        result = time_config(name, shape, args.steps)
        progress(f"{name} timed")
        if dist.get_rank() == 0:
            result["device"] = dataclasses.asdict(measured)
            print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    return 0


def llama_params(shape: dict) -> int:
    """The model's exact parameter count (zerofit's analytic count, checked against
    transformers' meta-device count in tests/models)."""
    return model_spec(shape).params


def model_spec(shape: dict):
    """zerofit's ModelSpec of ``shape``, from the same transformers config the ranks build."""
    from zerofit.models.resolve import spec_from_config

    return spec_from_config(llama_config(shape).to_dict(), f"llama-{shape['hidden']}")


# --- the driver (root) --------------------------------------------------------------------
@dataclass
class Measured:
    """One link speed's run: the device the ranks measured and each configuration's step."""

    link: str
    device: dict[str, dict]  # configuration -> CpuMeasurements' fields, taken right before it
    step_s: dict[str, float]  # configuration -> median seconds per optimizer step
    times: dict[str, list[float]]  # every step, warm-up first
    phases: dict[str, dict[str, float]]  # configuration -> PHASES' median seconds per step

    def link_gbits(self) -> float:
        """The link's mean measured bandwidth over the configurations."""
        return statistics.mean(device["link_gbits"] for device in self.device.values())


def shape_link(namespaces, rate: str) -> None:
    """A tbf qdisc on each end of the veth pair: both directions limited to ``rate``."""
    if rate == "none":
        return
    for ns in namespaces:
        cmd = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", IFACE, "root", "tbf"]
        cmd += ["rate", rate, "burst", "64kb", "latency", "50ms"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def run_ranks(
    hosts, shape: str, configs: list[str], steps: int, limit: float, measure_once: bool = False
) -> list[str]:
    """Both ranks, each in its namespace; rank 0's output lines. Bounded by ``limit`` seconds.
    ``measure_once``: the device is measured before the first configuration only."""
    env = dict(
        os.environ,
        DS_ACCELERATOR="cpu",
        PYTHONWARNINGS="ignore",
        PYTHONPATH=str(REPO / "src"),
        MASTER_ADDR=hosts.addrs[0],
        MASTER_PORT="29561",
        WORLD_SIZE="2",
        GLOO_SOCKET_IFNAME=IFACE,
        OMP_NUM_THREADS="1",
    )
    argv = [sys.executable, __file__, "--worker", "--shape", shape, "--steps", str(steps)]
    argv += ["--configs", ",".join(configs)] + (["--measure-once"] if measure_once else [])
    procs = []
    for rank, ns in enumerate(hosts.names):
        rank_env = dict(env, RANK=str(rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        procs.append(
            subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{ns}", *argv],
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    outputs = []
    try:
        deadline = time.monotonic() + limit
        for proc in procs:
            outputs.append(proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    finally:
        for proc in procs:  # a rank left behind by a failure or the time limit
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    for proc, output in zip(procs, outputs, strict=True):
        if proc.returncode != 0:
            raise RuntimeError(f"a rank exited {proc.returncode}:\n{output[-4000:]}")
    return outputs[0].splitlines()


def measure(
    link: str,
    shape: str,
    configs: list[str],
    steps: int,
    limit: float = RUN_LIMIT_S,
    tag: str = "zfsn",
    measure_once: bool = False,
) -> Measured:
    """Namespaces ``tag``a/b joined by a veth pair shaped to ``link``, both ranks run; the
    namespaces and whatever runs in them are removed (tests/launch/real_cluster.py
    ``namespace_pair``). ``measure_once``: one device measurement serves every configuration."""
    sys.path.insert(0, str(REPO / "tests" / "launch"))
    from real_cluster import namespace_pair

    with namespace_pair(tag, "10.231.7") as hosts:
        shape_link(hosts.names, link)
        lines = run_ranks(hosts, shape, configs, steps, limit, measure_once)
    results = [json.loads(line[7:]) for line in lines if line.startswith("RESULT ")]
    return Measured(
        link,
        {r["config"]: r["device"] for r in results},
        {r["config"]: r["step_s"] for r in results},
        {r["config"]: r["times"] for r in results},
        {r["config"]: r["phases"] for r in results},
    )


def train_setup(name: str):
    """zerofit's TrainSetup of configuration ``name`` as the ranks run it."""
    from zerofit.memory.estimate import TrainSetup

    stage, offload = CONFIGS[name]
    return TrainSetup(
        stage=stage,
        world_size=2,
        gpus_per_node=1,
        offload_optimizer="cpu" if offload else "none",
        precision="fp32",
        micro_batch=MICRO_BATCH,
        seq_len=SEQ_LEN,
        grad_accum=GRAD_ACCUM,
        stack="deepspeed",
    )


def predict(measured: Measured, shape: str) -> dict[str, float]:
    """The speed model's seconds per step of each configuration on the measured CPU device."""
    from zerofit.speed.device import CpuMeasurements, cpu_profile
    from zerofit.speed.step_time import estimate_step_time

    model = model_spec(SHAPES[shape])
    predicted = {}
    for name in measured.step_s:
        measurements = CpuMeasurements(**measured.device[name])
        step = estimate_step_time(
            train_setup(name),
            model,
            cpu_profile(measurements),
            inter_node_gbps=measurements.link_gbits,
        )
        predicted[name] = step.total_s
    return predicted


def predict_phases(measured: Measured, shape: str) -> dict[str, dict[str, float]]:
    """The speed model's terms of each configuration regrouped by the phase that pays them
    (``PHASES``): forward: the forward's compute and ZeRO-3's gathers; backward: the backward's
    compute, the collectives issued in it and the gradients' copies to the "host"; step: the
    optimizer, the step's all-gather and the updated partition's copy back. On the CPU profile
    nothing overlaps (``overlaps_comm`` False), so each term is paid where it is issued."""
    from zerofit.speed.device import CpuMeasurements, cpu_profile
    from zerofit.speed.step_time import (
        Links,
        communication_seconds,
        estimate_step_time,
        gpu_optimizer_seconds,
        matmul_seconds,
        micro_step_flops,
        offload_seconds,
        wire_element_bytes,
    )

    model = model_spec(SHAPES[shape])
    phases = {}
    for name in measured.step_s:
        measurements = CpuMeasurements(**measured.device[name])
        device = cpu_profile(measurements)
        setup = train_setup(name)
        flops, reference = micro_step_flops(setup, model, model.params, None)
        forward_s, backward_s, _ = matmul_seconds(setup, model, device, flops, reference, None)
        links = Links(
            device.link_gbps,
            measurements.link_gbits / 8,
            efficiency=device.link_efficiency,
            element_bytes=wire_element_bytes(setup, device),
            reduce_scatter_cost=device.reduce_scatter_cost,
            all_gather_cost=device.all_gather_cost,
        )
        comm = communication_seconds(setup, model, links, model.params)
        transfer_s, cpu_adam_s = offload_seconds(setup, model, model.params, device)
        copy_back_s = transfer_s / (setup.grad_accum + 1)  # one partition of grad_accum + 1
        total = estimate_step_time(
            setup, model, device, inter_node_gbps=measurements.link_gbits
        )
        optimizer_s = cpu_adam_s + gpu_optimizer_seconds(setup, device, model.params)
        phases[name] = {
            "forward": forward_s + comm.during_forward,
            "backward": backward_s + comm.during_backward + transfer_s - copy_back_s,
            "step": optimizer_s + comm.after_step + copy_back_s,
            "other": total.overhead_s,
        }
    return phases


def render_phases(runs: list[tuple[Measured, dict[str, dict[str, float]]]]) -> str:
    """Measured against predicted seconds per optimizer step, phase by phase."""
    header = f"{'link':9s} {'config':15s}"
    for phase in PHASES:
        header += f" {phase + ' meas/pred':>20s}"
    lines = [header]
    for measured, predicted in runs:
        for name, phases in measured.phases.items():
            line = f"{measured.link:9s} {name:15s}"
            for phase in PHASES:
                line += f" {phases[phase]:9.2f}/{predicted[name][phase]:<10.2f}"
            lines.append(line)
    return "\n".join(lines)


def order_misses(predicted: dict[str, float], measured: dict[str, float]) -> list[str]:
    """Pairs whose measured times differ by more than ORDER_GAP but are predicted the other
    way round, as 'slower > faster' in measured order."""
    misses = []
    names = sorted(measured)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            slow, fast = sorted((first, second), key=lambda n: measured[n], reverse=True)
            if measured[slow] > (1 + ORDER_GAP) * measured[fast]:
                if predicted[slow] <= predicted[fast]:
                    misses.append(f"{slow} > {fast}")
    return misses


def error_percent(predicted: float, measured: float) -> float:
    return 100 * (predicted - measured) / measured


def render_table(runs: list[tuple[Measured, dict[str, float]]]) -> str:
    """Predicted against measured seconds per step, per link speed and configuration."""
    lines = [f"{'link':9s} {'config':15s} {'predicted s':>11s} {'measured s':>10s} {'error':>7s}"]
    for measured, predicted in runs:
        for name, step_s in measured.step_s.items():
            error = error_percent(predicted[name], step_s)
            lines.append(
                f"{measured.link:9s} {name:15s} {predicted[name]:11.2f} {step_s:10.2f} "
                f"{error:+6.0f}%"
            )
        misses = order_misses(predicted, measured.step_s)
        verdict = "order right" if not misses else "order wrong: " + ", ".join(misses)
        lines.append(
            f"{measured.link:9s} link {measured.link_gbits():.3f} Gbit/s measured; "
            f"{verdict}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", default="bench", choices=sorted(SHAPES))
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--links", default=",".join(LINK_RATES))
    parser.add_argument(
        "--measure-once", action="store_true", help="measure the device once, not per config"
    )
    parser.add_argument("--json", help="also write every measurement and prediction here")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if os.geteuid() != 0:
        print("shaped_network: needs root (network namespaces, tc)", file=sys.stderr)
        return 2
    runs = []
    for link in args.links.split(","):
        configs = args.configs.split(",")
        measured = measure(link, args.shape, configs, args.steps, measure_once=args.measure_once)
        runs.append((measured, predict(measured, args.shape)))
        print(render_table(runs[-1:]), flush=True)
        print(render_phases([(measured, predict_phases(measured, args.shape))]), flush=True)
    print()
    print(render_table(runs))
    errors = [
        abs(error_percent(predicted[name], step_s))
        for measured, predicted in runs
        for name, step_s in measured.step_s.items()
    ]
    misses = sum(len(order_misses(p, m.step_s)) for m, p in runs)
    print(f"max |error| {max(errors):.0f}%, median {statistics.median(errors):.0f}%; "
          f"order misses {misses}")
    if args.json:
        dump = [
            {"link": m.link, "device": m.device, "measured": m.step_s, "times": m.times,
             "phases": m.phases, "predicted": p,
             "predicted_phases": predict_phases(m, args.shape)}
            for m, p in runs
        ]
        Path(args.json).write_text(json.dumps(dump, indent=1))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
