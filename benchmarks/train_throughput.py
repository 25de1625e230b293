"""Training throughput of bigbatch's engine against a plain PyTorch loop and timm's train.py.

    python benchmarks/train_throughput.py [--suites threads,overhead,options,peer]
        [--workloads resnet50,recipe] [--batch 32] [--micro-batch 32] [--image-size 224]
        [--recipe-batch 4096] [--recipe-micro-batch 512] [--warmup 1] [--steps 2] [--rounds 3]
        [--threads N] [--peer-script /tmp/peers/timm/train.py] [--compile] [--no-save]

Suites (each appends one JSON record per workload to docs/results/train_throughput.jsonl):

overhead  bigbatch.train.train(cfg, ctx) against a plain hand-written loop with the same model,
          data set object, global batch, micro-batch (gradient accumulation), optimizer
          (bigbatch LARS with the same parameter groups), precision and memory format.
          What is timed, on both sides, is one global step: fetching the micro-batches, forward,
          backward, optimizer step, zero_grad. The engine's figure is its own per-step
          images_per_second from metrics.jsonl (its step clock runs from the top of the step to
          after zero_grad: it includes its extras (BatchNorm per-step statistics, the non-finite
          check, the loss/count reduction with its host sync, the per-micro-batch dropout
          seeding) and leaves out only the metrics line itself). The plain loop is timed with the
          same clock around the same work. Evaluation, checkpoints and start-up are outside both.
options   the engine alone with CPU options switched: fp32 contiguous (the reference),
          channels_last, bf16 autocast, both, one intra-op thread instead of all cores, and
          (with --compile) torch.compile; plus evaluation under inference_mode against no_grad.
peer      the `bigbatch train` command against timm's train.py (the script a user would pick
          instead), both as subprocesses on the same generated JPEG folder (ImageNet-like
          500x375 quality-90 JPEGs), same model, batch, precision, memory format and loader
          workers; timm is run the way its docs say (`python train.py --data-dir DIR --model
          resnet50 -b 32 ...`) with its extra augmentation (colour jitter, random interpolation)
          switched off so both do RandomResizedCrop+flip. timm's figure is its own logged
          per-update time ("Time: X s", the wall time between optimizer updates, data included);
          bigbatch's is its per-step images_per_second (also data included).

threads   the default recipe's model (forward, backward, LARS step on a batch of 256) in child
          processes that differ only in their OpenMP settings: all cores (PyTorch's default),
          all cores with OMP_WAIT_POLICY=PASSIVE, and one thread. On a machine shared with other
          work this decides which thread setting the other suites should use (--threads).

Workloads: resnet50 = ResNet-50 on 224x224 synthetic data (peer: the JPEG folder);
recipe = the default recipe (Fashion-MNIST, small_resnet, global batch 4096 in micro-batches of
512, LARS) on Fashion-MNIST.

Every comparison is interleaved: each round runs every method once, in rotated order, and the
ratios are medians of per-round ratios. Only ratios measured this way mean anything on a shared
machine; the absolute images/s are printed for completeness. The load average is recorded at the
start and the end of every suite.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    git_commit,
    interleaved_rounds,
    load_average,
    machine_info,
    median,
    paired_ratio,
    report,
)

from bigbatch.build import (  # noqa: E402
    datasets_for,
    geometry_for,
    model_for,
    optimizer_for,
    schedule_for,
)
from bigbatch.config import config_from_dict, load_recipe, validate  # noqa: E402
from bigbatch.distributed import DistContext  # noqa: E402
from bigbatch.evaluate import evaluate  # noqa: E402
from bigbatch.metrics import read_metrics  # noqa: E402
from bigbatch.train import train  # noqa: E402

log = logging.getLogger("train_throughput")
RESULT_NAME = "train_throughput"
CPU = torch.device("cpu")
TIMM_TRAIN_PY = Path("/tmp/peers/timm/train.py")


# ----------------------------------------------------------------------------- configs


def resnet50_config(args: argparse.Namespace, out: Path, **options: Any) -> dict[str, Any]:
    """ResNet-50, synthetic 224x224 images, exactly warmup+steps global steps in one epoch."""
    steps = args.warmup + args.steps
    return {
        "epochs": 1, "global_batch": args.batch, "micro_batch": args.micro_batch,
        "eval_every": 1000, "log_every": 1, "out": str(out),
        "data": {"name": "synthetic", "image_size": args.image_size,
                 "synthetic_examples": args.batch * steps, "synthetic_classes": 1000},
        "model": {"name": "resnet50"},
        "optim": {"name": "lars", "lr": 1.0},
        "checkpoint": {"keep": 1},
        **options,
    }


def recipe_config(args: argparse.Namespace, out: Path, **options: Any) -> dict[str, Any]:
    """The default recipe (fashion-mnist.yaml) cut to warmup+steps global steps (one epoch of a
    training subset), optionally with a smaller global batch for a quicker run."""
    raw = load_recipe("fashion-mnist")
    steps = args.warmup + args.steps
    raw.update(epochs=1, global_batch=args.recipe_batch, micro_batch=args.recipe_micro_batch,
               eval_every=1000, log_every=1, out=str(out))
    raw["data"] = {**raw.get("data", {}), "train_subset": args.recipe_batch * steps}
    raw["schedule"] = {**raw.get("schedule", {}), "warmup_epochs": 0}
    raw["checkpoint"] = {"keep": 1}
    raw.update(options)
    return raw


CONFIGS: dict[str, Callable[..., dict[str, Any]]] = {
    "resnet50": resnet50_config, "recipe": recipe_config,
}


def single_process() -> DistContext:
    return DistContext(rank=0, world_size=1, local_rank=0, backend=None, device=CPU)


# ----------------------------------------------------------------------------- engine side


def engine_images_per_second(raw: dict[str, Any], warmup: int) -> list[float]:
    """Run bigbatch.train.train on ``raw``; its per-step images/s after ``warmup`` steps."""
    cfg = validate(config_from_dict(raw))
    train(cfg, single_process())
    records = [r for r in read_metrics(Path(cfg.out) / "metrics.jsonl") if r["kind"] == "train"]
    return [float(r["images_per_second"]) for r in records if r["step"] > warmup]


# ----------------------------------------------------------------------------- plain side


def identity(batch):
    return batch


def plain_loop_images_per_second(raw: dict[str, Any], warmup: int) -> list[float]:
    """A hand-written loop over the same objects: DataLoader + accumulate + step + zero_grad.

    The model, data set and optimizer are bigbatch's (built the same way the engine builds
    them), so only the loop differs: no per-step BatchNorm bookkeeping, no non-finite check, no
    reduction of the loss, no dropout re-seeding.
    """
    cfg = validate(config_from_dict(raw))
    train_set, _ = datasets_for(cfg)
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = model_for(cfg, train_set.num_classes, train_set.in_channels)
    model = model.to(CPU, memory_format=memory_format).train()
    optimizer = optimizer_for(cfg, model)
    geometry = geometry_for(cfg, len(train_set), 1)
    schedule = schedule_for(cfg, geometry)
    accumulation = geometry.accumulation_steps
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)
    autocast = cfg.precision == "bf16"
    loader = DataLoader(train_set, batch_size=cfg.micro_batch, shuffle=True, drop_last=True,
                        collate_fn=identity, num_workers=0)
    batches = iter(loader)
    rates = []
    for step in range(schedule.total_steps):
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = schedule.lr(step)
        for _ in range(accumulation):
            batch = next(batches)
            images = batch.images.to(CPU, memory_format=memory_format)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(images)
            loss = criterion(logits.float(), batch.labels) / accumulation
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - started
        if step >= warmup:
            rates.append(cfg.global_batch / seconds)
    return rates


# ----------------------------------------------------------------------------- engine extras


def engine_extras_ms(raw: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median milliseconds per global step of each thing the engine does that the plain loop
    does not, timed on their own with the run's real model, gradients and optimizer: the
    whole-run comparison cannot resolve a 1% difference on a machine whose speed swings by 10%,
    these small direct timings can. 'outside_step_clock' is what the engine's per-step figure
    leaves out (trust-ratio quantiles and the metrics line)."""
    from bigbatch.data.seeding import mix64
    from bigbatch.distributed import all_reduce_sum
    from bigbatch.metrics import MetricsLog
    from bigbatch.train.bn_stats import PerStepRunningStats
    from bigbatch.train.nonfinite import nonfinite_gradients
    from bigbatch.train.record import trust_ratio_fields

    cfg = validate(config_from_dict(raw))
    train_set, _ = datasets_for(cfg)
    model = model_for(cfg, train_set.num_classes, train_set.in_channels).train()
    optimizer = optimizer_for(cfg, model)
    batch = train_set.__getitems__([(i, 0) for i in range(cfg.micro_batch)])
    nn.functional.cross_entropy(model(batch.images), batch.labels).backward()
    optimizer.step()
    accumulation = geometry_for(cfg, len(train_set), 1).accumulation_steps
    ctx = single_process()
    stats = PerStepRunningStats(model, accumulation)
    metrics = MetricsLog(Path(raw["out"]) / "extras.jsonl")

    def bn_bookkeeping() -> None:
        stats.begin_step()
        for _ in range(accumulation):
            stats.after_micro_batch()
        stats.end_step()

    def dropout_seeding() -> None:
        for index in range(accumulation):
            torch.manual_seed(mix64(cfg.seed, 0, 0, index))

    def reduction_and_checks() -> None:
        loss_sum, seen = torch.zeros(()), torch.zeros(())
        for _ in range(accumulation):
            loss_sum += torch.tensor(1.0)
            seen += batch.labels.numel()
        flags = torch.stack([loss_sum, seen, nonfinite_gradients(model), torch.tensor(0.0)])
        all_reduce_sum(flags, ctx).tolist()

    def outside_step_clock() -> None:
        metrics.write({"kind": "train", **trust_ratio_fields(optimizer, {})})

    parts = {"bn_bookkeeping": bn_bookkeeping, "dropout_seeding": dropout_seeding,
             "reduction_and_nonfinite_check": reduction_and_checks,
             "outside_step_clock": outside_step_clock}
    times: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(repeats):
        for name, part in parts.items():
            started = time.perf_counter()
            part()
            times[name].append(1000 * (time.perf_counter() - started))
    metrics.close()
    return {name: round(median(values), 3) for name, values in times.items()}


# ----------------------------------------------------------------------------- suites


@contextlib.contextmanager
def run_folder(root: Path, name: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    try:
        yield folder
    finally:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)


def measured(runner: Callable[[dict[str, Any], int], list[float]], make_raw: Callable[[Path], dict],
             root: Path, name: str, warmup: int,
             threads: int | None = None) -> Callable[[], float]:
    """A zero-argument method for interleaved_rounds: one run, its median images/s."""
    def run() -> float:
        previous = torch.get_num_threads()
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            with run_folder(root, name) as out:
                rates = runner(make_raw(out), warmup)
        finally:
            torch.set_num_threads(previous)
        rate = median(rates)
        log.info("  %-22s %8.2f images/s (steps: %s)", name, rate,
                 ", ".join(f"{r:.1f}" for r in rates))
        return rate
    return run


def summarise(per_round: dict[str, list[float]], reference: str) -> dict[str, Any]:
    return {
        "images_per_second": {name: {"median": round(median(v), 3),
                                     "per_round": [round(x, 3) for x in v]}
                              for name, v in per_round.items()},
        "ratio_to_" + reference: {name: paired_ratio(v, per_round[reference])
                                  for name, v in per_round.items() if name != reference},
    }


def overhead_suite(args: argparse.Namespace, workload: str, root: Path) -> dict[str, Any]:
    make = CONFIGS[workload]
    options = {"channels_last": args.channels_last, "precision": args.precision}
    methods = {
        "engine": measured(engine_images_per_second, lambda out: make(args, out, **options),
                           root, "engine", args.warmup),
        "plain_loop": measured(plain_loop_images_per_second,
                               lambda out: make(args, out, **options), root, "plain", args.warmup),
    }
    per_round = interleaved_rounds(methods, args.rounds)
    result = summarise(per_round, "plain_loop")
    ratio = result["ratio_to_plain_loop"]["engine"]["median_paired"]
    result["target"] = {"engine_over_plain_at_least": 0.97, "met": ratio >= 0.97}
    result["options"] = options
    with run_folder(root, "extras") as out:
        extras = engine_extras_ms(make(args, out, **options), args.extras_repeats)
    step_ms = 1000 * workload_batch(args, workload) / median(per_round["plain_loop"])
    in_step = sum(v for k, v in extras.items() if k != "outside_step_clock")
    result["engine_extras"] = {
        "ms_per_step": extras, "plain_step_ms": round(step_ms, 1),
        "in_step_fraction": round(in_step / step_ms, 5),
        "all_fraction": round(sum(extras.values()) / step_ms, 5),
        "implied_engine_over_plain": round(step_ms / (step_ms + sum(extras.values())), 4),
    }
    return result


def workload_batch(args: argparse.Namespace, workload: str) -> int:
    return args.batch if workload == "resnet50" else args.recipe_batch


# Every variant names both settings: a recipe's own values must not leak into the reference.
REFERENCE_OPTIONS = {"precision": "fp32", "channels_last": False, "compile": False}
OPTION_VARIANTS: dict[str, dict[str, Any]] = {
    "fp32": REFERENCE_OPTIONS,
    "channels_last": {**REFERENCE_OPTIONS, "channels_last": True},
    "bf16": {**REFERENCE_OPTIONS, "precision": "bf16"},
    "bf16_channels_last": {**REFERENCE_OPTIONS, "precision": "bf16", "channels_last": True},
}


def options_suite(args: argparse.Namespace, workload: str, root: Path) -> dict[str, Any]:
    make = CONFIGS[workload]
    methods: dict[str, Callable[[], float]] = {}
    for name, options in OPTION_VARIANTS.items():
        methods[name] = measured(engine_images_per_second,
                                 lambda out, o=options: make(args, out, **o), root, name,
                                 args.warmup)
    if torch.get_num_threads() > 1:
        methods["one_thread"] = measured(engine_images_per_second,
                                         lambda out: make(args, out, **REFERENCE_OPTIONS),
                                         root, "one_thread", args.warmup, threads=1)
    if args.compile:
        methods["compile"] = measured(
            engine_images_per_second,
            lambda out: make(args, out, **{**REFERENCE_OPTIONS, "compile": True}), root,
            "compile", args.warmup)
    per_round = interleaved_rounds(methods, args.rounds)
    result = summarise(per_round, "fp32")
    if workload == "recipe":
        result["eval"] = eval_mode_comparison(args, root)
    return result


def eval_mode_comparison(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Evaluation images/s of bigbatch.evaluate (inference_mode, data loading included) and of
    bare forward passes over pre-loaded batches under inference_mode, no_grad and autograd on,
    on the default recipe's model and the whole Fashion-MNIST test set."""
    with run_folder(root, "eval") as out:
        cfg = validate(config_from_dict(recipe_config(args, out)))
    _, val_set = datasets_for(cfg)
    model = model_for(cfg, val_set.num_classes, val_set.in_channels).eval()
    count = len(val_set)
    batches = [list(range(s, min(s + cfg.micro_batch, count)))
               for s in range(0, count, cfg.micro_batch)]
    loaded = [val_set.__getitems__(keys) for keys in batches]

    def forward_all(context: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            with context():
                for batch in loaded:
                    model(batch.images).argmax(1)
            return count / (time.perf_counter() - started)
        return run

    def bigbatch_evaluate() -> float:
        started = time.perf_counter()
        evaluate(model, val_set, single_process(), cfg.micro_batch)
        return count / (time.perf_counter() - started)

    methods = {"inference_mode": forward_all(torch.inference_mode),
               "no_grad": forward_all(torch.no_grad),
               "autograd_on": forward_all(contextlib.nullcontext),
               "bigbatch_evaluate": bigbatch_evaluate}
    per_round = interleaved_rounds(methods, args.rounds + 2)
    return {"examples": count, **summarise(per_round, "no_grad")}


# ----------------------------------------------------------------------------- peer


TIMM_LINE = re.compile(r"Train: \d+ \[\s*(\d+)/\d+.*?Time: ([0-9.]+)s")


def peer_folder(root: Path, images: int) -> Path:
    from input_pipeline import make_folder  # the ImageNet-like JPEG generator

    folder = root / "jpegs"
    if not (folder / "train").exists():
        make_folder(folder, images, (500, 375), classes=8, seed=0)
    return folder


def bigbatch_command(args: argparse.Namespace, data: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "bigbatch", "train", "--recipe", "imagenet-resnet50-8k",
            "--set", "schedule.warmup_epochs=0",
            "--set", f"data.path={data}", "--set", f"data.workers={args.workers}",
            "--set", f"data.image_size={args.image_size}",
            "--set", f"global_batch={args.batch}", "--set", f"micro_batch={args.micro_batch}",
            "--set", "epochs=1", "--set", "log_every=1", "--set", "checkpoint.keep=1",
            "--set", f"precision={args.precision}", "--set", f"channels_last={args.channels_last}",
            "--set", f"out={out}"]


def timm_command(args: argparse.Namespace, data: Path, out: Path) -> list[str]:
    command = [sys.executable, str(args.peer_script), "--data-dir", str(data),
               "--val-split", "val", "--model", "resnet50", "-b", str(args.batch),
               "--epochs", "1", "--device", "cpu", "-j", str(args.workers),
               "--log-interval", "1", "--img-size", str(args.image_size),
               "--color-jitter", "0", "--train-interpolation", "bilinear",
               "--checkpoint-hist", "1", "--output", str(out), "--num-classes", "8"]
    if args.channels_last:
        command.append("--channels-last")
    if args.precision == "bf16":
        command += ["--amp", "--amp-dtype", "bfloat16"]
    return command


def run_logged(command: list[str], log_path: Path) -> str:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("w") as file:
        done = subprocess.run(command, stdout=file, stderr=subprocess.STDOUT, env=env,
                              cwd=log_path.parent, check=False)
    text = log_path.read_text()
    if done.returncode:
        raise RuntimeError(f"{command[1]} exited with {done.returncode}:\n{text[-3000:]}")
    return text


def peer_suite(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    if not Path(args.peer_script).is_file():
        return {"skipped": f"timm's train.py not found at {args.peer_script}; fetch it from "
                           "github.com/huggingface/pytorch-image-models (train.py)"}
    steps = args.warmup + args.steps
    data = peer_folder(root, args.batch * steps)

    def bigbatch_run() -> float:
        with run_folder(root, "bigbatch") as out:
            run_logged(bigbatch_command(args, data, out / "run"), out / "log.txt")
            records = read_metrics(out / "run" / "metrics.jsonl")
        rates = [r["images_per_second"] for r in records
                 if r["kind"] == "train" and r["step"] > args.warmup]
        log.info("  %-22s %8.2f images/s (steps: %s)", "bigbatch train", median(rates),
                 ", ".join(f"{r:.2f}" for r in rates))
        return median(rates)

    def timm_run() -> float:
        with run_folder(root, "timm") as out:
            text = run_logged(timm_command(args, data, out), out / "log.txt")
        seconds = [float(t) for index, t in TIMM_LINE.findall(text) if int(index) >= args.warmup]
        if not seconds:
            raise RuntimeError(f"no per-update timings in timm's log:\n{text[-3000:]}")
        rates = [args.batch / s for s in seconds]
        log.info("  %-22s %8.2f images/s (steps: %s)", "timm train.py", median(rates),
                 ", ".join(f"{r:.2f}" for r in rates))
        return median(rates)

    per_round = interleaved_rounds({"bigbatch": bigbatch_run, "timm_train_py": timm_run},
                                   args.rounds)
    result = summarise(per_round, "timm_train_py")
    ratio = result["ratio_to_timm_train_py"]["bigbatch"]["median_paired"]
    result["target"] = {"bigbatch_over_peer_at_least": 1.0, "met": ratio >= 1.0}
    result["commands"] = {"bigbatch": " ".join(bigbatch_command(args, Path("DATA"), Path("OUT"))),
                          "timm": " ".join(timm_command(args, Path("DATA"), Path("OUT")))}
    result["peer_commit"] = args.peer_commit
    return result


# ----------------------------------------------------------------------------- threads


THREADS_BATCH = 256
THREAD_VARIANTS: dict[str, dict[str, str]] = {
    "all_cores": {},  # PyTorch's default: one OpenMP thread per core, spinning while idle
    "all_cores_passive_wait": {"OMP_WAIT_POLICY": "PASSIVE"},
    "one_thread": {"OMP_NUM_THREADS": "1"},
}


def threads_probe(steps: int) -> float:
    """Median images/s of forward+backward+LARS steps of the default recipe's model on a batch
    of random 28x28 images, in this process with its thread settings (the child side)."""
    from bigbatch.models import create_model
    from bigbatch.optim import LARS

    torch.manual_seed(0)
    spec = load_recipe("fashion-mnist")["model"]
    model = create_model(spec["name"], 10, 1, **spec.get("options", {}))
    optimizer = LARS(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    images, labels = torch.randn(THREADS_BATCH, 1, 28, 28), torch.randint(0, 10, (THREADS_BATCH,))
    rates = []
    for step in range(steps + 1):
        started = time.perf_counter()
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step:
            rates.append(THREADS_BATCH / (time.perf_counter() - started))
    return median(rates)


def threads_suite(args: argparse.Namespace) -> dict[str, Any]:
    """The same probe in child processes that differ only in their OpenMP environment (which
    must be set before the OpenMP runtime starts, hence a process each)."""
    def child(env: dict[str, str]) -> Callable[[], float]:
        def run() -> float:
            clean = {k: v for k, v in os.environ.items()
                     if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
            done = subprocess.run([sys.executable, __file__, "--threads-probe",
                                   str(args.probe_steps)], env={**clean, **env},
                                  capture_output=True, text=True, check=True)
            return float(done.stdout.strip().splitlines()[-1])
        return run

    per_round = interleaved_rounds({name: child(env) for name, env in THREAD_VARIANTS.items()},
                                   args.rounds + 2)
    return {"probe_steps": args.probe_steps, "environments": THREAD_VARIANTS,
            **summarise(per_round, "all_cores")}


# ----------------------------------------------------------------------------- main


def workload_description(args: argparse.Namespace, suite: str, workload: str) -> dict[str, Any]:
    if suite == "peer":
        return {"model": "resnet50", "data": f"generated JPEG folder (500x375, quality 90), "
                f"RandomResizedCrop({args.image_size})+flip, {args.workers} loader worker(s)",
                "global_batch": args.batch, "micro_batch": args.micro_batch}
    if suite == "threads":
        model = load_recipe("fashion-mnist")["model"]
        return {"model": f"{model['name']} {model.get('options', {})} (default recipe)",
                "data": "random 1x28x28 tensors",
                "global_batch": THREADS_BATCH, "micro_batch": THREADS_BATCH}
    if workload == "resnet50":
        return {"model": "resnet50", "data": f"synthetic {args.image_size}x{args.image_size}",
                "global_batch": args.batch, "micro_batch": args.micro_batch}
    model = load_recipe("fashion-mnist")["model"]
    return {"model": f"{model['name']} {model.get('options', {})} (default recipe)",
            "data": "Fashion-MNIST 28x28",
            "global_batch": args.recipe_batch, "micro_batch": args.recipe_micro_batch}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suites", default="threads,overhead,options,peer")
    parser.add_argument("--workloads", default="resnet50,recipe")
    parser.add_argument("--batch", type=int, default=32, help="ResNet-50 global batch")
    parser.add_argument("--micro-batch", type=int, default=32, help="ResNet-50 micro-batch")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--recipe-batch", type=int, default=4096)
    parser.add_argument("--recipe-micro-batch", type=int, default=512)
    parser.add_argument("--warmup", type=int, default=1, help="steps dropped from each run")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                        help="precision of the overhead and peer suites")
    parser.add_argument("--channels-last", action="store_true",
                        help="channels_last in the overhead and peer suites")
    parser.add_argument("--compile", action="store_true", help="add torch.compile to options")
    parser.add_argument("--workers", type=int, default=1, help="loader workers (peer suite)")
    parser.add_argument("--threads", type=int, default=None,
                        help="intra-op threads for every method (in-process: "
                             "torch.set_num_threads; subprocesses: OMP_NUM_THREADS); "
                             "default: PyTorch's (all cores)")
    parser.add_argument("--peer-script", type=Path, default=TIMM_TRAIN_PY)
    parser.add_argument("--peer-commit", default=None, help="the peer's commit, for the record")
    parser.add_argument("--extras-repeats", type=int, default=20,
                        help="overhead suite: repetitions of the engine-extras timings")
    parser.add_argument("--probe-steps", type=int, default=5, help="threads suite: steps a run")
    parser.add_argument("--threads-probe", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-save", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.threads_probe is not None:
        print(threads_probe(args.threads_probe))
        return []
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("bigbatch").setLevel(logging.WARNING)
    records = []
    # In-process suites run the code imported now; later commits by others would mislabel them.
    commit_at_start = git_commit()
    with tempfile.TemporaryDirectory(prefix="train-throughput-") as tmp:
        root = Path(tmp)
        for suite in args.suites.split(","):
            workloads = {"peer": ["resnet50"], "threads": ["recipe"]}.get(
                suite, args.workloads.split(","))
            for workload in workloads:
                log.info("suite %s, workload %s", suite, workload)
                load_before = load_average()
                if suite == "overhead":
                    result = overhead_suite(args, workload, root)
                elif suite == "options":
                    result = options_suite(args, workload, root)
                elif suite == "peer":
                    result = peer_suite(args, root)
                elif suite == "threads":
                    result = threads_suite(args)
                else:
                    raise SystemExit(f"unknown suite {suite!r}")
                record = {"benchmark": RESULT_NAME, "suite": suite, "workload": workload,
                          **workload_description(args, suite, workload),
                          "warmup_steps": args.warmup, "timed_steps": args.steps,
                          "rounds": args.rounds, **result, "load_before": load_before,
                          "load_after": load_average(), "commit_at_start": commit_at_start,
                          "machine": machine_info()}
                report(RESULT_NAME, record, save=not args.no_save)
                records.append(record)
    return records


if __name__ == "__main__":
    main()
