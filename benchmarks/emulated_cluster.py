"""The planner against measurement: gloo training over an emulated slow network.

    sudo .venv/bin/python benchmarks/emulated_cluster.py --out docs/results/scaling_planner.json

For each network shaping (loopback of a fresh network namespace: unshaped, and throttled by
``tc ... tbf rate 1gbit`` and ``rate 200mbit``; see benchmarks/netns.py) and each process count
p (2 and 4, gloo, OMP_NUM_THREADS=1):

1. fit: ``bigbatch.commands.bench`` inside the namespace at p processes -> alpha, beta;
2. measure: ``torchrun --nproc-per-node p -m bigbatch train`` inside the namespace, for
   (a) the default recipe (fashion-mnist, small_resnet) on a subset with a smaller global batch,
   (b) ResNet-18 on synthetic 64x64 images; per-step times from metrics.jsonl, the first
   ``--skip`` steps dropped as warm-up; the median is the measured step;
3. compute under the same conditions: p concurrent single-process runs of the same per-process
   work (global batch B/p, same micro-batch), outside any process group, so the CPU is shared
   exactly as in step 2 minus the communication; their median step is the compute term;
4. predict: plan.estimate_step with that compute time (as images/s per device), the fitted
   alpha, beta (ring) and the planner's default overlap, for the model's fp32 gradient bytes.

The machine has 2 cores: with p = 4 each process gets half a core. That is why the compute term is
measured at each p rather than scaled from one process. The machine is also shared with other
work, and Linux's autogroup scheduling shares CPU time out per session: torchrun starts each
worker in a session of its own, so the calibration processes are started the same way (without
that they got about 1.6x less CPU than the ranks they stand in for). The namespaces are deleted
at the end (also on error). Without root, or where ``ip netns add`` is refused, the script says
why and exits with status 77 (skipped).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from bigbatch import geometry
from bigbatch.metrics import read_metrics
from bigbatch.tools.plan.network import Network
from bigbatch.tools.plan.workload import DEFAULT_OVERLAP, Workload, estimate_step

sys.path.insert(0, str(Path(__file__).resolve().parent))
from netns import (  # noqa: E402  (a sibling script, not a package)
    create_namespace,
    delete_namespace,
    namespace_unavailable,
    netns_exec,
    shape_loopback,
)

SKIPPED = 77


@dataclass(frozen=True)
class TrainCase:
    """One training workload, with its global batch and the micro-batch per process count."""

    name: str
    args: tuple[str, ...]
    global_batch: int
    micro_batch: dict[int, int]
    examples: int  # training examples used: steps = examples // global_batch
    model: str
    num_classes: int
    in_channels: int



CASES = (
    TrainCase(
        name="fashion-mnist (default recipe, small_resnet)",
        args=("--recipe", "fashion-mnist", "--warmup-epochs", "0.25"),
        global_batch=1024, micro_batch={2: 256, 4: 256}, examples=8192,
        model="small_resnet", num_classes=10, in_channels=1,
    ),
    TrainCase(
        name="resnet18, synthetic 64x64",
        args=("--dataset", "synthetic", "--model", "resnet18", "--set", "data.image_size=64",
              "--set", "data.synthetic_classes=100", "--warmup-epochs", "0.25"),
        global_batch=128, micro_batch={2: 64, 4: 32}, examples=1024,
        model="resnet18", num_classes=100, in_channels=3,
    ),
)


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONUNBUFFERED="1")
    return env


def run_checked(command: list[str], log_path: Path, timeout: float) -> None:
    with log_path.open("w") as log:
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=child_env(),
                                timeout=timeout, check=False)
    if result.returncode != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"`{' '.join(command)}` exited with {result.returncode}:\n{tail}")


def torchrun(processes: int, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
            "--master-addr", "127.0.0.1", "--master-port", str(port)]


def train_args(case: TrainCase, global_batch: int, micro_batch: int, examples: int,
               out: Path) -> list[str]:
    """`bigbatch train` arguments: one epoch over ``examples``, every step logged."""
    subset = (["--train-subset", str(examples)] if "fashion" in case.name
              else ["--set", f"data.synthetic_examples={examples}"])
    return ["train", *case.args, "--batch-size", str(global_batch),
            "--micro-batch", str(micro_batch),
            *subset, "--epochs", "1", "--out", str(out), "--set", "log_every=1",
            "--set", "data.workers=0", "--backend", "gloo"]


def step_seconds(run_dir: Path, skip: int) -> list[float]:
    """Wall time of each logged training step after the first ``skip`` (from images/s)."""
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "train"]
    records.sort(key=lambda r: r["step"])
    batch = json.loads((run_dir / "summary.json").read_text())["global_batch"]
    return [batch / r["images_per_second"] for r in records[skip:]]


def step_parts(run_dir: Path, skip: int) -> dict[str, float]:
    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "train"]
    records.sort(key=lambda r: r["step"])
    keys = ("time_data", "time_compute", "time_comm_exposed", "time_optimizer")
    return {k: statistics.median(r[k] for r in records[skip:]) for k in keys}


def load_average() -> float:
    """The 1-minute load average: the machine is shared, so runs record how busy it was."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def calibrate_compute(case: TrainCase, processes: int, workdir: Path, skip: int) -> dict:
    """Step times of p concurrent single-process runs each doing one process's share of the
    work: the compute per step with the CPU shared as in the p-process run, minus communication."""
    per_process = case.global_batch // processes
    steps = geometry.steps_per_epoch(case.examples, case.global_batch)
    workdir.mkdir(parents=True, exist_ok=True)
    children, dirs = [], []
    load = load_average()
    for index in range(processes):
        out = workdir / f"calib-{case.model}-p{processes}-{index}"
        dirs.append(out)
        command = [sys.executable, "-m", "bigbatch",
                   *train_args(case, per_process, case.micro_batch[processes],
                               per_process * steps, out)]
        log = (workdir / f"calib-{case.model}-p{processes}-{index}.log").open("w")
        # A session of its own, as torchrun gives each worker: with the kernel's autogroup
        # scheduling (sched_autogroup_enabled=1) CPU time is shared out per session, so processes
        # left in one session would split one share while torchrun's workers get one each.
        children.append((subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                          env=child_env(), start_new_session=True), log))
    for child, log in children:
        code = child.wait(timeout=1800)
        log.close()
        if code != 0:
            raise RuntimeError(f"calibration run exited with {code}; see {log.name}")
    per_process_steps = [step_seconds(d, skip) for d in dirs]
    # A global step waits for the slowest process: pair up the processes' steps, keep the max.
    slowest = [max(column) for column in zip(*per_process_steps, strict=True)]
    return {"steps_s": slowest, "per_process_steps_s": per_process_steps,
            "per_process_batch": per_process, "load_before": load, "load_after": load_average()}


def fit_network(namespace: str, processes: int, workdir: Path, port: int, max_bytes: str,
                repeats: int) -> dict:
    out = workdir / f"allreduce-{namespace}-p{processes}.json"
    command = [*netns_exec(namespace), *torchrun(processes, port), "-m",
               "bigbatch.commands.bench", "--min-bytes", "4K", "--max-bytes", max_bytes,
               "--factor", "4", "--repeats", str(repeats), "--warmup", "1", "--backend", "gloo",
               "--out", str(out)]
    run_checked(command, workdir / f"allreduce-{namespace}-p{processes}.log", timeout=1800)
    return json.loads(out.read_text())


def gradient_bytes(case: TrainCase) -> int:
    from bigbatch.models import create_model
    from bigbatch.models.flops import count_parameters

    model = create_model(case.model, case.num_classes, in_channels=case.in_channels)
    return 4 * count_parameters(model, trainable_only=True)


def predict_step(case: TrainCase, processes: int, compute_s: float, fit: dict,
                 overlap: float) -> dict:
    nbytes = gradient_bytes(case)
    workload = Workload(case.model, nbytes // 4, 1.0, dataset_size=case.examples,
                        epochs=1, global_batch=case.global_batch)
    network = Network(alpha=fit["alpha_s"], beta=fit["beta_s_per_byte"], topology="ring")
    rate = (case.global_batch / processes) / compute_s
    estimate = estimate_step(workload, rate, network, processes, overlap)
    return {"gradient_bytes": nbytes, **asdict(estimate)}


def measure_training(case: TrainCase, namespace: str, processes: int, workdir: Path, port: int,
                     skip: int) -> dict:
    out = workdir / f"train-{case.model}-p{processes}"
    command = [*netns_exec(namespace), *torchrun(processes, port), "-m", "bigbatch",
               *train_args(case, case.global_batch, case.micro_batch[processes], case.examples,
                           out)]
    load = load_average()
    run_checked(command, workdir / f"train-{case.model}-p{processes}.log", timeout=3600)
    return {"steps_s": step_seconds(out, skip), "parts": step_parts(out, skip),
            "load_before": load, "load_after": load_average()}


def compare(case: TrainCase, processes: int, fit: dict, trials: list[tuple[dict, dict]],
            overlap: float) -> dict:
    """Pool the trials' step times; predict from the pooled compute, compare with the measured."""
    compute_s = statistics.median(t for calib, _ in trials for t in calib["steps_s"])
    measured_s = statistics.median(t for _, run in trials for t in run["steps_s"])
    prediction = predict_step(case, processes, compute_s, fit, overlap)
    per_trial = [predict_step(case, processes, statistics.median(calib["steps_s"]), fit,
                              overlap)["step"] / statistics.median(run["steps_s"])
                 for calib, run in trials]
    return {"compute_s": compute_s, "measured_s": measured_s, "prediction": prediction,
            "ratio": prediction["step"] / measured_s, "trial_ratios": per_trial,
            "trials": [{"calibration": c, "measured": m} for c, m in trials]}


def machine() -> dict:
    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "python": platform.python_version(), "torch": torch.__version__,
            "threads_per_process": 1, "backend": "gloo"}


def markdown_table(rows: list[dict]) -> str:
    lines = ["| network | workload | p | alpha (us) | 1/beta (Gbit/s) | compute (s) | "
             "all-reduce (s) | predicted step (s) | measured step (s) | "
             "predicted/measured (per trial) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['rate']} | {row['case']} | {row['processes']} | "
            f"{row['fit']['alpha_s'] * 1e6:.0f} | {row['fit']['bandwidth_gbit_s']:.3g} | "
            f"{row['compute_s']:.3f} | {row['prediction']['allreduce']:.3f} | "
            f"{row['prediction']['step']:.3f} | {row['measured_s']:.3f} | "
            f"{row['ratio']:.2f} ({', '.join(f'{r:.2f}' for r in row['trial_ratios'])}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="unshaped,1gbit,200mbit",
                        help="comma-separated tbf rates; 'unshaped' leaves loopback as it is")
    parser.add_argument("--processes", default="2,4", help="process counts")
    parser.add_argument("--cases", default="all", help="'all' or comma-separated model names")
    parser.add_argument("--skip", type=int, default=2, help="warm-up steps to drop")
    parser.add_argument("--overlap", type=float, default=DEFAULT_OVERLAP)
    parser.add_argument("--repeats", type=int, default=3, help="all-reduce bench repeats")
    parser.add_argument("--trials", type=int, default=2,
                        help="calibration + measurement pairs per configuration")
    parser.add_argument("--max-bytes", default="64M", help="largest all-reduce message")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)

    reason = namespace_unavailable()
    if reason is not None:
        print(f"skipped: {reason}", file=sys.stderr)
        return SKIPPED
    rates = args.rates.split(",")
    counts = [int(p) for p in args.processes.split(",")]
    cases = [c for c in CASES if args.cases == "all" or c.model in args.cases.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="bb-emulated-"))
    port = 29700 + os.getpid() % 200
    rows: list[dict] = []
    for index, rate in enumerate(rates):
        namespace = f"bb{os.getpid() % 10000}x{index}"
        create_namespace(namespace)
        try:
            qdisc = "none" if rate == "unshaped" else shape_loopback(namespace, rate)
            for p in counts:
                bench = fit_network(namespace, p, workdir, port, args.max_bytes, args.repeats)
                for case in cases:
                    # Calibration and measurement alternate, trial after trial: the machine is
                    # shared and its load drifts, so each measurement has a calibration beside it.
                    trials = []
                    for trial in range(args.trials):
                        where = workdir / f"{rate}-p{p}-t{trial}"
                        calib = calibrate_compute(case, p, where, args.skip)
                        run = measure_training(case, namespace, p, where, port, args.skip)
                        trials.append((calib, run))
                    result = compare(case, p, bench["fit"], trials, args.overlap)
                    row = {"rate": rate, "qdisc": qdisc, "case": case.name, "model": case.model,
                           "processes": p, "global_batch": case.global_batch,
                           "micro_batch": case.micro_batch[p], "fit": bench["fit"],
                           "bench": bench, **result}
                    rows.append(row)
                    print(f"{rate:>9} {case.model:>13} p={p}: compute {row['compute_s']:.3f} s, "
                          f"all-reduce {row['prediction']['allreduce']:.3f} s, predicted "
                          f"{row['prediction']['step']:.3f} s, measured {row['measured_s']:.3f} s"
                          f" (ratio {row['ratio']:.2f}; trials "
                          f"{', '.join(f'{r:.2f}' for r in row['trial_ratios'])})", flush=True)
        finally:
            delete_namespace(namespace)
    result = {"machine": machine(), "overlap": args.overlap, "skip": args.skip,
              "command": " ".join([sys.executable, *sys.argv]), "rows": rows,
              "table": markdown_table(rows)}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
