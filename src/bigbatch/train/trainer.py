"""The training loop: global steps of accumulated micro-batches, and what happens between them.

One global step of batch B runs A = B / (b * W) micro-batches of b examples on each of W ranks
(bigbatch.geometry). Each micro-batch loss is the *sum* of its example losses divided by b * A,
and DDP averages over the W ranks, so the gradient is the mean over the global batch whatever b,
A and W are. DDP's all-reduce runs only on the last micro-batch (``no_sync`` on the others): one
all-reduce per global step, overlapped with that backward pass bucket by bucket.

Everything random is a function of (seed, epoch, index): the data order and augmentation (see
bigbatch.data.sampler) and the dropout masks (the RNG is re-seeded per micro-batch from its
global index), so the same B, b and seed give the same run for any W, and a resumed run
continues with exactly the batches the uninterrupted run would have seen.

Read :meth:`Trainer.train_step` for one global step and :meth:`Trainer.after_step` for what
happens between steps (metrics, evaluation, checkpoints, preemption).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bigbatch.build import (
    autocast_dtype_for,
    cudnn_benchmark_for,
    datasets_for,
    geometry_for,
    model_for,
    optimizer_for,
    schedule_for,
    workers_for,
)
from bigbatch.config import RunConfig
from bigbatch.data.batch import Batch
from bigbatch.data.device_batch import batch_on_device
from bigbatch.data.loader import make_loader
from bigbatch.data.sampler import GlobalBatchPlan, TrainBatches
from bigbatch.data.seeding import mix64
from bigbatch.distributed import DistContext, barrier
from bigbatch.errors import ConfigError
from bigbatch.evaluate import evaluate
from bigbatch.metrics import MetricsLog, RecordSinks
from bigbatch.peers import PeerLost, PeerWatch, lost_peer, peer_watch
from bigbatch.precise_bn import PreciseBN, check_count, load_statistics
from bigbatch.stragglers import straggler_watch
from bigbatch.threads import intra_op_threads
from bigbatch.train.faults import fault_hook
from bigbatch.train.memory_format import memory_format_for
from bigbatch.train.nonfinite import handle_nonfinite
from bigbatch.train.preemption import StopRequest
from bigbatch.train.progress import progress_for
from bigbatch.train.record import (
    build_summary,
    trust_ratio_fields,
    write_final_record,
    write_start_record,
)
from bigbatch.train.reduction import reduction_for
from bigbatch.train.resize import ProgressiveResize
from bigbatch.train.resume import CheckpointClock, restore, save_checkpoint
from bigbatch.train.tensorboard import TensorBoardLog
from bigbatch.train.timing import StepTimer

log = logging.getLogger(__name__)


class Preempted(RuntimeError):
    """Training stopped on a preemption signal after writing a checkpoint."""


@dataclass
class StepResult:
    """What one global step leaves for the between-steps actions (all summed over ranks)."""

    lr: float
    loss: float  # mean over the step's examples
    examples: float
    skipped_images: int  # on this rank
    seconds: float
    timer: StepTimer
    stop_votes: float
    clock_votes: float


def train(cfg: RunConfig, ctx: DistContext) -> dict[str, Any]:
    """Run training as configured; return the summary (also written to summary.json).
    Raises PeerLost, with the peer named, when a collective loses a peer."""
    peers = peer_watch(ctx, cfg.collective_timeout)
    try:
        with intra_op_threads(cfg.threads):
            return Trainer(cfg, ctx, peers).fit()
    except Exception as error:
        if ctx.distributed and lost_peer(error):
            raise PeerLost(peers.failure_line(error, cfg.collective_timeout)) from error
        raise


class Trainer:
    """One training run: built from a config on one rank, run with :meth:`fit`."""

    def __init__(self, cfg: RunConfig, ctx: DistContext, peers: PeerWatch | None = None) -> None:
        self.started = time.perf_counter()
        self.cfg, self.ctx = cfg, ctx
        self.peers = peers or peer_watch(ctx, cfg.collective_timeout)
        self.peers.beat(0, force=True)
        self.stragglers = straggler_watch(ctx, cfg.log.straggler_probe_every_steps,
                                          self.peers.host)
        self.run_dir = Path(cfg.out)
        self.train_set, self.val_set = datasets_for(cfg, uint8_train=cfg.data.normalize_on_device,
                                                    decode_on_device=cfg.data.decode_on_device)
        if getattr(self.train_set, "defer_jpegs", False) and ctx.is_main:
            log.info("training JPEGs are decoded on %s (data.decode_on_device)", ctx.device)
        self.geometry = geometry_for(cfg, len(self.train_set), ctx.world_size)
        check_count(cfg.eval.bn_recompute, self.geometry)  # eval.bn_recompute fits the data
        model = self._build_model()
        self.memory_format = memory_format_for(cfg.channels_last, model, ctx.device,
                                               warn=ctx.is_main)
        self.model = model.to(ctx.device, memory_format=self.memory_format)
        self.optimizer = optimizer_for(cfg, self.model)
        self.parameter_names = {id(p): name for name, p in self.model.named_parameters()}
        self.schedule = schedule_for(cfg, self.geometry)
        self.resize = ProgressiveResize(cfg.resize, self.schedule.total_steps)
        self.image_side = 0  # the training images' height at the last step, for the record
        self.position = restore(cfg, ctx, self.run_dir, self.model, self.optimizer)
        if ctx.is_main:
            write_start_record(cfg, self.run_dir, self.geometry, self.schedule.total_steps,
                               self.schedule.base_lr, self.position.step)
        self.metrics = RecordSinks(  # every record goes to metrics.jsonl and TensorBoard
            MetricsLog(self.run_dir / "metrics.jsonl", enabled=ctx.is_main),
            TensorBoardLog(self.run_dir / "tensorboard", self.position.step,
                           enabled=ctx.is_main and cfg.log.tensorboard))
        self._build_step_parts()

    def _build_model(self) -> nn.Module:
        model = model_for(self.cfg, self.train_set.num_classes, self.train_set.in_channels)
        if self.cfg.sync_bn and self.ctx.distributed:
            if self.ctx.device.type != "cuda":  # PyTorch's SyncBatchNorm runs on GPUs only
                raise ConfigError("sync_bn=true needs CUDA GPUs; on CPU use sync_bn=false")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return model

    def _build_step_parts(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        self.reduction = reduction_for(cfg.exact_reduction, self.model, self.geometry, ctx)
        self.network = wrap_ddp(self.model, ctx, *self.reduction.comm_hook())
        self.forward = (torch.compile(self.network, mode=cfg.compile_mode) if cfg.compile
                        else self.network)
        self.criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing, reduction="sum")
        self.autocast_dtype = autocast_dtype_for(cfg, ctx.device)
        if ctx.device.type == "cuda":
            torch.backends.cudnn.benchmark = cudnn_benchmark_for(cfg)
        if cfg.exact_reduction and cfg.cudnn_benchmark and ctx.is_main:
            log.warning("cudnn_benchmark=true with exact_reduction: cuDNN can choose other "
                        "convolution algorithms on other processes, and the bits then differ")
        if cfg.precision == "auto" and ctx.is_main:
            log.info("precision auto: %s", "bf16 autocast" if self.autocast_dtype
                     else "fp32 (no native bf16 here)")
        self.workers = workers_for(cfg, ctx)
        self.faults = fault_hook(ctx.rank)
        self.checkpoints = CheckpointClock(cfg)
        self.stop = StopRequest()
        self.micro_batches = self._micro_batch_stream()
        self.last_eval: dict[str, float] = {}
        self.precise_bn = (PreciseBN(cfg.eval.bn_recompute, self.train_set, self.geometry,
                                     cfg.seed, ctx, self.workers,
                                     self.memory_format == torch.channels_last,
                                     self.autocast_dtype) if cfg.eval.bn_recompute else None)
        self.recomputed_bn = None  # the last evaluation's recomputed statistics, for final.pt
        self.train_seconds, self.train_images = 0.0, 0

    def _micro_batch_stream(self):
        """This rank's micro-batches from the resume point to the end of training."""
        per_epoch = self.geometry.steps_per_epoch
        epochs = -(-self.schedule.total_steps // per_epoch)
        start_epoch, start_in_epoch = divmod(self.position.step, per_epoch)
        plan = GlobalBatchPlan(self.geometry, self.ctx.rank, self.cfg.seed)
        batches = TrainBatches(plan, start_epoch, start_in_epoch, epochs)
        pin = self.ctx.device.type == "cuda"
        return iter(make_loader(self.train_set, batches, self.workers, pin_memory=pin))

    # ------------------------------------------------------------------------- the loop

    def fit(self) -> dict[str, Any]:
        """Train from the current position to the end; evaluate, write the record."""
        self.stop.install()
        self.progress = progress_for(self.ctx.is_main, self.cfg.log, self.schedule.total_steps,
                                     self.position.step, self.geometry.steps_per_epoch)
        self.model.train()
        try:
            for step in range(self.position.step, self.schedule.total_steps):
                self.after_step(step, self.train_step(step))
        finally:
            self.stop.uninstall()
        return self.finish()

    def train_step(self, step: int) -> StepResult:
        """One global step: A micro-batches forward and backward, one all-reduce, one update."""
        started = time.perf_counter()
        self.peers.beat(step)
        epoch, step_in_epoch = divmod(step, self.geometry.steps_per_epoch)
        self.faults.begin_step(step, self.model, self.checkpoints)
        lr = self.schedule.lr(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        timer = StepTimer()
        self.reduction.begin_step()
        losses: list[torch.Tensor] = []
        examples = skipped_images = 0
        for accumulation in range(self.geometry.accumulation_steps):
            batch = self.next_micro_batch(timer, step)
            skipped_images += report_skipped(batch.skipped, self.ctx)
            micro_index = self.geometry.micro_index(accumulation, self.ctx.rank)
            torch.manual_seed(mix64(self.cfg.seed, epoch, step_in_epoch, micro_index))  # dropout
            last = accumulation == self.geometry.accumulation_steps - 1
            losses.append(self.forward_backward(batch, last, timer))
            self.reduction.bn_stats.after_micro_batch()
            examples += len(batch)
        self.reduction.bn_stats.end_step()
        votes = self.reduction.reduce(losses, examples, self.stop.requested,
                                      self.checkpoints.vote())
        if votes.nonfinite:
            self.skip_step(step, votes.mean_loss)
        else:
            timer.start("optimizer")
            self.optimizer.step()
            timer.stop("optimizer")
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(lr, votes.mean_loss, votes.examples, skipped_images,
                          time.perf_counter() - started, timer, votes.stop_votes,
                          votes.clock_votes)

    def next_micro_batch(self, timer: StepTimer, step: int) -> Batch:
        """The next micro-batch of this rank, on the device, normalised and at the size of
        ``step`` (timed as data)."""
        timer.start("data")
        batch = batch_on_device(next(self.micro_batches), self.ctx.device, self.memory_format,
                                getattr(self.train_set, "report_broken", None))
        images = self.resize(batch.images, step, self.memory_format)
        self.note_image_side(images.shape[-2], step)
        timer.stop("data")
        return Batch(images, batch.labels, batch.skipped)

    def note_image_side(self, side: int, step: int) -> None:
        if side != self.image_side and self.resize.enabled and self.ctx.is_main:
            log.info("step %d: training images %d pixels high (progressive resizing)",
                     step + 1, side)
        self.image_side = side

    def forward_backward(self, batch: Batch, last: bool, timer: StepTimer) -> torch.Tensor:
        """Forward and backward of one micro-batch; the gradient all-reduce runs on the last.
        Returns the micro-batch's summed loss (detached)."""
        synced = self.network is self.model or last
        with contextlib.nullcontext() if synced else self.network.no_sync():
            started = time.perf_counter()
            with torch.autocast(self.ctx.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                                enabled=self.autocast_dtype is not None):
                logits = self.forward(batch.images)
            loss = self.criterion(logits.float(), batch.labels)
            (loss / self.reduction.loss_divisor).backward()
            ended = time.perf_counter()
        distributed = self.network is not self.model
        self.reduction.after_backward(last, synced_by_hook=distributed)
        if last and distributed:
            timer.split_synced_backward(started, ended, self.reduction.comm_clock)
        else:
            timer.compute += ended - started
        return loss.detach()

    def skip_step(self, step: int, mean_loss: float) -> None:
        """A non-finite step: no update, BatchNorm statistics rolled back, then the policy."""
        self.reduction.bn_stats.rollback()
        self.position.skipped_steps += 1
        handle_nonfinite(self.cfg, self.ctx, self.run_dir, self.model, step, mean_loss,
                         self.position.skipped_steps)

    # ------------------------------------------------------------------------- between steps

    def after_step(self, step: int, result: StepResult) -> None:
        """Count the step; log it; evaluate, checkpoint and stop when due."""
        position = self.position
        position.step = step + 1
        position.skipped_images += result.skipped_images
        self.train_seconds += result.seconds
        self.train_images += int(result.examples)
        finished = position.step == self.schedule.total_steps
        if position.step % self.cfg.log_every == 0 or finished:
            self.log_step(result)
        timer = result.timer
        self.stragglers.after_step(position.step, timer.data + timer.compute + timer.optimizer)
        if self.progress is not None:
            self.progress.update(position.step, result, self.stragglers.progress_note())
        epoch_done = position.step % self.geometry.steps_per_epoch == 0
        epochs_done = position.step // self.geometry.steps_per_epoch
        if (epoch_done and epochs_done % self.cfg.eval_every == 0) or finished:
            self.evaluate_and_log()
        if (epoch_done or finished or result.stop_votes
                or self.checkpoints.due(position.step, result.clock_votes)):
            self.reduction.sync_buffers()
            save_checkpoint(self.cfg, self.ctx, self.run_dir, self.model, self.optimizer,
                            position, self.faults)
            self.checkpoints.saved()
        if result.stop_votes:
            barrier(self.ctx)
            raise Preempted(f"stopped by {self.stop.signal_name or 'a preemption signal'} "
                            f"after step {position.step}")

    def log_step(self, result: StepResult) -> None:
        self.metrics.write({
            "kind": "train",
            "step": self.position.step,
            "epoch": self.geometry.epoch_of(self.position.step),
            "lr": result.lr,
            "loss": result.loss,
            "images_per_second": result.examples / result.seconds,
            "image_size": self.image_side,
            **result.timer.as_record(),
            **trust_ratio_fields(self.optimizer, self.parameter_names),
        })

    def evaluate_and_log(self) -> None:
        """Top-1/top-5/loss on the validation set with the ranks' averaged BN statistics; with
        eval.bn_recompute, with recomputed ones (and ``trained_*`` with the running ones), the
        running ones put back for training to continue."""
        self.reduction.sync_buffers()
        result = self.evaluate_model()
        if self.precise_bn is not None:
            result, self.recomputed_bn = self.precise_bn.evaluate(
                self.model, self.position.step, self.evaluate_model, result)
        epoch = self.geometry.epoch_of(self.position.step)
        self.metrics.write({"kind": "eval", "step": self.position.step, "epoch": epoch, **result})
        if self.ctx.is_main:
            log.info("step %d (epoch %.2f): top-1 %.2f%%, top-5 %.2f%%, val loss %.4f",
                     self.position.step, epoch, result["top1"], result["top5"], result["loss"])
        self.last_eval = result

    def evaluate_model(self) -> dict[str, float]:
        return evaluate(self.model, self.val_set, self.ctx, self.geometry.eval_batch,
                        self.workers, self.memory_format == torch.channels_last,
                        self.autocast_dtype, self.cfg.eval.hflip)

    def finish(self) -> dict[str, Any]:
        """Close the logs, evaluate if nothing was evaluated, write summary and final weights."""
        if self.progress is not None:
            self.progress.close()
        self.metrics.close()
        if not self.last_eval:
            self.evaluate_and_log()
        position = self.position
        summary = build_summary(
            self.cfg, self.ctx, self.geometry, position.step,
            (position.skipped_steps, position.skipped_images), self.last_eval, self.started,
            self.train_seconds, self.train_images)
        summary["stragglers"] = self.stragglers.summary()
        if self.recomputed_bn is not None:  # final.pt carries the statistics evaluated last
            load_statistics(self.model, self.recomputed_bn)
        if self.ctx.is_main:
            write_final_record(self.cfg, self.run_dir, self.model, self.train_set.classes, summary)
        barrier(self.ctx)
        return summary


# ----------------------------------------------------------------------------- pieces


def wrap_ddp(model: nn.Module, ctx: DistContext, hook_state: Any, hook: Any) -> nn.Module:
    """DDP over the process group, or the model itself on one process.

    ``broadcast_buffers=False``: BatchNorm uses each rank's micro-batch statistics, as in the
    paper, and running statistics are averaged over ranks before evaluation and checkpoints.
    ``hook`` sums the gradient buckets over ranks (train.reduction).
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
    network.register_comm_hook(hook_state, hook)
    return network


def report_skipped(paths: list[str], ctx: DistContext) -> int:
    for path in paths:
        log.warning("rank %d: skipped unreadable image %s", ctx.rank, path)
    return len(paths)
