"""The training loop: global steps of accumulated micro-batches, evaluation, checkpoints, record.

One global step of batch B runs A = B / (b * W) micro-batches of b examples on each of W ranks.
Each micro-batch loss is the *sum* of its example losses divided by b * A, and DDP averages over
the W ranks, so the gradient is the mean over the global batch whatever b, A and W are.
DDP's all-reduce runs only on the last micro-batch (``no_sync`` on the others): one all-reduce per
global step, overlapped with that backward pass bucket by bucket.

Everything random is a function of (seed, epoch, index): the data order and augmentation (see
data/sampler.py) and the dropout masks (the RNG is re-seeded per micro-batch from its global
index), so the same B, b and seed give the same run for any W, and a resumed run continues with
exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import resource
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bigbatch import checkpoint
from bigbatch.bn_stats import PerStepRunningStats
from bigbatch.build import (
    autocast_dtype_for,
    datasets_for,
    model_for,
    optimizer_for,
    plan_for,
    schedule_for,
    workers_for,
)
from bigbatch.config import RunConfig
from bigbatch.data.loader import make_loader
from bigbatch.data.sampler import TrainBatches
from bigbatch.data.seeding import mix64
from bigbatch.data.transforms import normalize_images
from bigbatch.distributed import DistContext, all_reduce_sum, average_buffers, barrier
from bigbatch.errors import CheckpointError, ConfigError
from bigbatch.evaluate import evaluate
from bigbatch.faults import (
    clock_skew,
    fault_from_env,
    fire_step_fault,
    kills_checkpoint,
    poisons_loss,
)
from bigbatch.metrics import MetricsLog, quantiles, truncate_after_step
from bigbatch.preemption import StopRequest
from bigbatch.timing import CommClock, StepTimer, timed_allreduce_hook

log = logging.getLogger(__name__)


class NonFiniteLoss(RuntimeError):
    """Training stopped on a NaN/Inf loss or gradient (policy ``stop``)."""


class Preempted(RuntimeError):
    """Training stopped on a preemption signal after writing a checkpoint."""


@dataclass
class Position:
    """How far training has gone, in global steps; all a resume needs besides the tensors."""

    step: int = 0
    skipped_steps: int = 0
    skipped_images: int = 0


def train(cfg: RunConfig, ctx: DistContext) -> dict[str, Any]:
    """Run training as configured; return the summary (also written to summary.json)."""
    with intra_op_threads(cfg.threads):
        return _train(cfg, ctx)


def _train(cfg: RunConfig, ctx: DistContext) -> dict[str, Any]:
    started = time.perf_counter()
    run_dir = Path(cfg.out)
    train_set, val_set = datasets_for(cfg, uint8_train=cfg.data.normalize_on_device)
    plan = plan_for(cfg, len(train_set), ctx.world_size, ctx.rank)
    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = model_for(cfg, train_set.num_classes, train_set.in_channels)
    if cfg.sync_bn and ctx.distributed:
        if ctx.device.type != "cuda":  # PyTorch's SyncBatchNorm runs on GPUs only
            raise ConfigError("sync_bn=true needs CUDA GPUs; on CPU use sync_bn=false")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(ctx.device, memory_format=memory_format)
    optimizer = optimizer_for(cfg, model)
    parameter_names = {id(p): name for name, p in model.named_parameters()}
    schedule = schedule_for(cfg, plan.steps_per_epoch)
    position = restore(cfg, ctx, run_dir, model, optimizer)
    if ctx.is_main:
        write_start_record(cfg, ctx, run_dir, plan, schedule, position)
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=ctx.is_main)

    clock = CommClock()
    network = wrap_ddp(model, ctx, clock, cfg)
    forward = torch.compile(network) if cfg.compile else network
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing, reduction="sum")
    bn_stats = PerStepRunningStats(model, plan.accumulation_steps)
    autocast_dtype = autocast_dtype_for(cfg, ctx.device)
    if cfg.precision == "auto" and ctx.is_main:
        log.info(
            "precision auto: %s",
            "bf16 autocast" if autocast_dtype else "fp32 (no native bf16 here)",
        )
    workers = workers_for(cfg, ctx)
    fault = fault_from_env()
    stop = StopRequest().install()

    total_steps = schedule.total_steps
    epochs_to_run = math.ceil(total_steps / plan.steps_per_epoch)
    start_epoch, start_in_epoch = divmod(position.step, plan.steps_per_epoch)
    batches = TrainBatches(plan, start_epoch, start_in_epoch, epochs_to_run)
    micro_batches = iter(
        make_loader(train_set, batches, workers, pin_memory=ctx.device.type == "cuda")
    )
    progress = progress_bar(ctx, total_steps, position.step)
    last_checkpoint = time.monotonic()
    train_seconds, train_images = 0.0, 0
    last_eval: dict[str, float] = {}
    model.train()

    for step in range(position.step, total_steps):
        step_started = time.perf_counter()
        epoch, step_in_epoch = divmod(step, plan.steps_per_epoch)
        fire_step_fault(fault, step, ctx.rank)
        lr = schedule.lr(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        timer = StepTimer()
        bn_stats.begin_step()
        loss_sum = torch.zeros((), device=ctx.device)
        seen = torch.zeros((), device=ctx.device)
        skipped_images = 0
        for accumulation in range(plan.accumulation_steps):
            timer.start("data")
            batch = next(micro_batches)
            images = batch.images.to(ctx.device, non_blocking=True, memory_format=memory_format)
            images = normalize_images(images)  # uint8 batches: on the device; float: unchanged
            labels = batch.labels.to(ctx.device, non_blocking=True)
            timer.stop("data")
            skipped_images += report_skipped(batch.skipped, ctx)
            last = accumulation == plan.accumulation_steps - 1
            micro_index = accumulation * ctx.world_size + ctx.rank
            torch.manual_seed(mix64(cfg.seed, epoch, step_in_epoch, micro_index))  # dropout
            sync = contextlib.nullcontext() if last or network is model else network.no_sync()
            with sync:
                compute_started = time.perf_counter()
                with torch.autocast(
                    ctx.device.type,
                    dtype=autocast_dtype or torch.bfloat16,
                    enabled=autocast_dtype is not None,
                ):
                    logits = forward(images)
                loss = criterion(logits.float(), labels)
                if poisons_loss(fault, step, ctx.rank):
                    loss = loss * float("nan")
                (loss / (cfg.micro_batch * plan.accumulation_steps)).backward()
                compute_ended = time.perf_counter()
            if last and network is not model:
                timer.split_synced_backward(compute_started, compute_ended, clock)
            else:
                timer.compute += compute_ended - compute_started
            bn_stats.after_micro_batch()
            loss_sum += loss.detach()
            seen += labels.numel()
        bn_stats.end_step()

        # One reduction carries the loss, the example count, the two stop conditions and the
        # time-based checkpoint vote, so every rank takes the same decisions after the same step
        # (ranks' clocks differ; a checkpoint is a collective).
        clock_vote = clock_says_checkpoint(cfg, last_checkpoint - clock_skew(fault, step, ctx.rank))
        flags = torch.stack(
            [
                loss_sum,
                seen,
                nonfinite_gradients(model),
                torch.tensor(float(stop.requested), device=ctx.device),
                torch.tensor(float(clock_vote), device=ctx.device),
            ]
        )
        reduced = all_reduce_sum(flags, ctx).tolist()
        total_loss, total_seen, nonfinite, stop_votes, clock_votes = reduced
        mean_loss = total_loss / max(total_seen, 1.0)
        if nonfinite or not math.isfinite(mean_loss):
            bn_stats.rollback()
            position.skipped_steps += 1
            handle_nonfinite(cfg, ctx, run_dir, model, step, mean_loss, position)
        else:
            timer.start("optimizer")
            optimizer.step()
            timer.stop("optimizer")
        optimizer.zero_grad(set_to_none=True)

        position.step = step + 1
        position.skipped_images += skipped_images
        step_seconds = time.perf_counter() - step_started
        train_seconds += step_seconds
        train_images += int(total_seen)
        images_per_second = total_seen / step_seconds
        if position.step % cfg.log_every == 0 or position.step == total_steps:
            ratios = trust_ratios(optimizer)
            metrics.write(
                {
                    "kind": "train",
                    "step": position.step,
                    "epoch": position.step / plan.steps_per_epoch,
                    "lr": lr,
                    "loss": mean_loss,
                    "images_per_second": images_per_second,
                    **timer.as_record(),
                    **quantiles(ratios),
                    **layer_trust_ratios(optimizer, ratios, parameter_names),
                }
            )
        if progress is not None:
            progress.update(1)
            progress.set_postfix(
                loss=f"{mean_loss:.3f}", lr=f"{lr:.3g}", img_s=f"{images_per_second:.0f}"
            )

        epoch_done = position.step % plan.steps_per_epoch == 0
        finished = position.step == total_steps
        if (epoch_done and (epoch + 1) % cfg.eval_every == 0) or finished:
            last_eval = evaluate_and_log(cfg, ctx, model, val_set, workers, metrics, position, plan)
        if epoch_done or finished or checkpoint_due(cfg, position.step, clock_votes) or stop_votes:
            save_checkpoint(cfg, ctx, run_dir, model, optimizer, position, fault)
            last_checkpoint = time.monotonic()
        if stop_votes:
            barrier(ctx)
            raise Preempted(
                f"stopped by {stop.signal_name or 'a preemption signal'} after step {position.step}"
            )

    stop.uninstall()
    if progress is not None:
        progress.close()
    metrics.close()
    if not last_eval:
        last_eval = evaluate_and_log(cfg, ctx, model, val_set, workers, metrics, position, plan)
    summary = build_summary(
        cfg, ctx, plan, position, last_eval, started, train_seconds, train_images
    )
    if ctx.is_main:
        torch.save(
            {
                "model": model.state_dict(),
                "classes": list(train_set.classes),
                "config": cfg.to_dict(),
            },
            run_dir / "final.pt",
        )
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    barrier(ctx)
    return summary


# ----------------------------------------------------------------------------- pieces


def wrap_ddp(model: nn.Module, ctx: DistContext, clock: CommClock, cfg: RunConfig) -> nn.Module:
    """DDP over the process group, or the model itself on one process.

    ``broadcast_buffers=False``: BatchNorm uses each rank's micro-batch statistics, as in the
    paper, and running statistics are averaged over ranks before evaluation and checkpoints.
    """
    if not ctx.distributed:
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    with warnings.catch_warnings():
        # Newer PyTorch suggests forward_sync_buffers, which still syncs buffers at start-up;
        # rank-local BN buffers are what we want, so broadcast_buffers=False stays.
        warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
        network = DistributedDataParallel(
            model, device_ids=device_ids, broadcast_buffers=False, gradient_as_bucket_view=True
        )
    network.register_comm_hook(clock, timed_allreduce_hook)
    return network


@contextlib.contextmanager
def intra_op_threads(threads: int | None):
    """Run with ``threads`` intra-op CPU threads (None: leave PyTorch's setting), then restore.

    On a CPU shared with other work, fewer threads than cores can be several times faster:
    OpenMP threads spin while waiting for each other, and a descheduled one stalls the rest
    (docs/PERFORMANCE.md).
    """
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def nonfinite_gradients(model: nn.Module) -> torch.Tensor:
    """1.0 if any gradient holds a NaN or Inf, else 0.0, without a host synchronisation."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros((), device=next(model.parameters()).device)
    norms = torch._foreach_norm(grads)
    return (~torch.isfinite(torch.stack(norms).sum())).float()


def trust_ratios(optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
    getter = getattr(optimizer, "trust_ratios", None)
    return getter() if getter is not None else None


def layer_trust_ratios(optimizer: torch.optim.Optimizer, ratios: torch.Tensor | None,
                       names: dict[int, str]) -> dict[str, dict[str, float]]:
    """``{"trust_layers": {parameter name: λ}}`` from ``ratios``, the optimizer's last LARS
    step (nothing for other optimizers or before the first step), for per-layer curves."""
    getter = getattr(optimizer, "trust_ratio_parameters", None)
    if ratios is None or getter is None:
        return {}
    values = ratios.tolist()
    return {"trust_layers": {names.get(id(p), f"parameter {i}"): value
                             for i, (p, value) in enumerate(zip(getter(), values, strict=True))}}


def report_skipped(paths: list[str], ctx: DistContext) -> int:
    for path in paths:
        log.warning("rank %d: skipped unreadable image %s", ctx.rank, path)
    return len(paths)


def progress_bar(ctx: DistContext, total: int, done: int):
    if not ctx.is_main or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=done, unit="step", dynamic_ncols=True)


def clock_says_checkpoint(cfg: RunConfig, last_saved: float) -> bool:
    """This rank's vote for a time-based checkpoint (`checkpoint.every_minutes`)."""
    minutes = cfg.checkpoint.every_minutes
    return bool(minutes) and time.monotonic() - last_saved >= 60.0 * minutes


def checkpoint_due(cfg: RunConfig, step: int, clock_votes: float) -> bool:
    """Due by step count, or because any rank's clock says so (the votes are summed)."""
    every = cfg.checkpoint.every_steps
    return bool(every and step % every == 0) or clock_votes > 0


def evaluate_and_log(
    cfg, ctx, model, val_set, workers, metrics, position, plan
) -> dict[str, float]:
    average_buffers(model, ctx)
    autocast_dtype = autocast_dtype_for(cfg, ctx.device)
    result = evaluate(
        model, val_set, ctx, cfg.micro_batch, workers, cfg.channels_last, autocast_dtype
    )
    metrics.write(
        {
            "kind": "eval",
            "step": position.step,
            "epoch": position.step / plan.steps_per_epoch,
            **result,
        }
    )
    if ctx.is_main:
        log.info(
            "step %d (epoch %.2f): top-1 %.2f%%, top-5 %.2f%%, val loss %.4f",
            position.step,
            position.step / plan.steps_per_epoch,
            result["top1"],
            result["top5"],
            result["loss"],
        )
    return result


# ----------------------------------------------------------------------------- checkpoints


def checkpoint_state(cfg: RunConfig, model: nn.Module, optimizer, position: Position) -> dict:
    """Everything a resume needs; nothing in it depends on the number of processes."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": position.step,
        "skipped_steps": position.skipped_steps,
        "skipped_images": position.skipped_images,
        "seed": cfg.seed,
        "global_batch": cfg.global_batch,
        "micro_batch": cfg.micro_batch,
        "config": cfg.to_dict(),
        "grad_scaler": None,  # bf16 autocast needs no loss scaling
    }


def save_checkpoint(cfg, ctx, run_dir, model, optimizer, position, fault) -> None:
    average_buffers(model, ctx)  # collective: every rank takes part
    if ctx.is_main:
        state = checkpoint_state(cfg, model, optimizer, position)
        if kills_checkpoint(fault, position.step, ctx.rank):
            simulate_kill_while_writing(run_dir / "checkpoints", state)
        checkpoint.save(run_dir / "checkpoints", position.step, state, cfg.checkpoint.keep)


def simulate_kill_while_writing(folder: Path, state: dict) -> None:
    """Fault injection: write half a checkpoint to the temporary file, then die."""
    import os
    import signal

    folder.mkdir(parents=True, exist_ok=True)
    blob = checkpoint.encode(state)
    with open(folder / f".{checkpoint.checkpoint_name(0)}.tmp-{os.getpid()}", "wb") as file:
        file.write(blob[: len(blob) // 2])
        file.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def restore(cfg: RunConfig, ctx: DistContext, run_dir: Path, model, optimizer) -> Position:
    """Load the checkpoint named by ``checkpoint.resume`` (or the latest valid one for 'auto')."""
    resume = cfg.checkpoint.resume
    if resume is None:
        return Position()
    folder = run_dir / "checkpoints"
    if resume == "auto":
        found = checkpoint.load_agreed_latest(folder, ctx)  # rank 0 chooses for every rank
        if found is None:
            log.info("no checkpoint in %s: starting from scratch", folder)
            return Position()
        path, state = found
    else:
        path, state = Path(resume), checkpoint.load(Path(resume))
    check_resumable(cfg, state, path)
    checkpoint.load_model_state(model, state["model"], f"checkpoint {path}")
    checkpoint.load_optimizer_state(optimizer, state["optimizer"], f"checkpoint {path}")
    if ctx.is_main:
        truncate_after_step(run_dir / "metrics.jsonl", state["step"])
        log.info("resumed from %s at global step %d", path, state["step"])
    return Position(state["step"], state.get("skipped_steps", 0), state.get("skipped_images", 0))


def check_resumable(cfg: RunConfig, state: dict, path: Path) -> None:
    """A resume is exact only with the same seed and global batch; say so instead of drifting."""
    for key in ("seed", "global_batch"):
        if state.get(key) != getattr(cfg, key):
            raise CheckpointError(
                f"checkpoint {path} was written with {key}={state.get(key)}, this run has "
                f"{key}={getattr(cfg, key)}; use the same {key} to resume"
            )


# ----------------------------------------------------------------------------- non-finite


def handle_nonfinite(cfg, ctx, run_dir, model, step, loss, position) -> None:
    """Policy ``skip``: drop the step (already done) until too many; ``stop``: diagnose and stop."""
    if cfg.on_nonfinite == "skip" and position.skipped_steps <= cfg.max_skipped_steps:
        log.warning(
            "step %d: non-finite loss or gradient, step skipped (%d so far)",
            step,
            position.skipped_steps,
        )
        return
    diagnostic = run_dir / f"nonfinite-step{step:09d}.json"
    if ctx.is_main:
        diagnostic.write_text(
            json.dumps(
                {
                    "step": step,
                    "loss": str(loss),
                    "skipped_steps": position.skipped_steps,
                    "layers": layer_norms(model),
                },
                indent=2,
            )
            + "\n"
        )
    barrier(ctx)
    raise NonFiniteLoss(
        f"non-finite loss or gradient at step {step} (loss {loss}); per-layer norms written to "
        f"{diagnostic}; the last good checkpoint is in {run_dir / 'checkpoints'}"
    )


def layer_norms(model: nn.Module) -> dict[str, dict[str, str]]:
    norms = {}
    for name, param in model.named_parameters():
        grad = "none" if param.grad is None else str(param.grad.norm().item())
        norms[name] = {"weight_norm": str(param.detach().norm().item()), "grad_norm": grad}
    return norms


# ----------------------------------------------------------------------------- record


def write_start_record(cfg, ctx, run_dir, plan, schedule, position) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(cfg.to_yaml())
    log.info(
        "global batch %d = micro-batch %d x %d processes x %d accumulation steps; %d steps/epoch, "
        "%d steps in all, peak LR %.4g",
        cfg.global_batch,
        cfg.micro_batch,
        ctx.world_size,
        plan.accumulation_steps,
        plan.steps_per_epoch,
        schedule.total_steps,
        schedule.base_lr,
    )
    if position.step:
        log.info("continuing at step %d", position.step)


def build_summary(cfg, ctx, plan, position, result, started, train_seconds, train_images) -> dict:
    return {
        "top1": result.get("top1"),
        "top5": result.get("top5"),
        "val_loss": result.get("loss"),
        "epochs": position.step / plan.steps_per_epoch,
        "steps": position.step,
        "global_batch": cfg.global_batch,
        "micro_batch": cfg.micro_batch,
        "world_size": ctx.world_size,
        "accumulation_steps": plan.accumulation_steps,
        "wall_seconds": time.perf_counter() - started,
        "images_per_second": train_images / train_seconds if train_seconds else None,
        "skipped_steps": position.skipped_steps,
        "skipped_images": position.skipped_images,
        "optimizer": cfg.optim.name,
        "model": cfg.model.name,
        "seed": cfg.seed,
        "peak_memory_mib": peak_memory_mib(),
    }


def peak_memory_mib() -> float:
    """This process's peak resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
