"""Turn a validated RunConfig into the objects a run needs: data, geometry, model, optimizer,
schedule. Every caller (training, evaluation, inspection, benchmarks) builds through here."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from bigbatch.config import RunConfig
from bigbatch.data import FashionMNIST, build_datasets
from bigbatch.data.loader import default_workers
from bigbatch.distributed import DistContext
from bigbatch.errors import ConfigError
from bigbatch.geometry import BatchGeometry
from bigbatch.models import create_model, default_image_size
from bigbatch.optim import LRSchedule, build_optimizer, scale_lr


def image_size_for(cfg: RunConfig) -> int | None:
    if cfg.data.image_size is not None:
        return cfg.data.image_size
    if cfg.data.name == "fashion-mnist":
        return None
    return default_image_size(cfg.model.name, cfg.model.options)


def datasets_for(cfg: RunConfig, uint8_train: bool = False, decode_on_device: bool = False):
    """(train, val) datasets of the run.

    ``uint8_train``: the training set returns uint8 images where it can (imagefolder, packed),
    for the loop to normalise on the device (data.transforms.normalize_images); the validation
    set always returns normalised float images. ``decode_on_device``: the training set leaves
    its RGB JPEGs for the device to decode (data/device_decode.py), where it has any.
    """
    train, val = build_datasets(
        cfg.data.name,
        path=cfg.data.path,
        seed=cfg.seed,
        image_size=image_size_for(cfg),
        train_subset=cfg.data.train_subset,
        val_subset=cfg.data.val_subset,
        on_broken=cfg.data.on_broken,
        synthetic_examples=cfg.data.synthetic_examples,
        synthetic_classes=cfg.data.synthetic_classes,
        fast_decode=cfg.data.fast_decode,
        normalize=not uint8_train,
        val_path=cfg.data.val_path,
        augment=cfg.data.augment,
        num_classes=cfg.data.num_classes,
    )
    if uint8_train and hasattr(val, "normalize"):
        val.normalize = True
    if decode_on_device:
        train.defer_jpegs_to_device()
    return train, val


def model_for(cfg: RunConfig, num_classes: int, in_channels: int) -> nn.Module:
    """The model, initialised from the run's seed (identical on every rank), for the data's
    image side (a vision transformer is built for it, or refused in one line)."""
    torch.manual_seed(cfg.seed)
    side = image_size_for(cfg) or FashionMNIST.image_size
    try:
        return create_model(cfg.model.name, num_classes, in_channels, image_size=side,
                            **cfg.model.options)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def geometry_for(cfg: RunConfig, num_examples: int, world_size: int) -> BatchGeometry:
    """The run's batch geometry on ``world_size`` processes over ``num_examples``."""
    return BatchGeometry(cfg.global_batch, cfg.micro_batch, world_size, num_examples)


def peak_lr(cfg: RunConfig) -> float:
    """The base LR scaled from the reference batch to the global batch by the chosen rule."""
    return scale_lr(cfg.optim.lr, cfg.global_batch, cfg.optim.reference_batch, cfg.optim.lr_scaling)


def schedule_for(cfg: RunConfig, geometry: BatchGeometry) -> LRSchedule:
    """The LR schedule of the run in global steps (epochs converted with the geometry)."""
    per_epoch = geometry.steps_per_epoch
    s = cfg.schedule
    try:
        return LRSchedule(
            base_lr=peak_lr(cfg),
            total_steps=geometry.total_steps(cfg.epochs),
            warmup_steps=round(s.warmup_epochs * per_epoch),
            warmup_start_lr=s.warmup_start_lr,
            kind=s.kind,
            end_lr=s.end_lr,
            power=s.power,
            milestones=tuple(round(e * per_epoch) for e in s.milestones),
            gamma=s.gamma,
        )
    except ValueError as error:
        raise ConfigError(str(error)) from None


def optimizer_for(cfg: RunConfig, model: nn.Module) -> torch.optim.Optimizer:
    o = cfg.optim
    return build_optimizer(
        model,
        o.name,
        peak_lr(cfg),
        momentum=o.momentum,
        weight_decay=o.weight_decay,
        trust_coefficient=o.trust_coefficient,
        eps=o.eps,
        clip=o.clip,
        nesterov=o.nesterov,
        exclude_bn_and_bias=o.exclude_bn_and_bias,
        fused_compile=o.fused_compile,
    )


# CPU flags of hardware bf16 dot products (AVX512-BF16, AMX); without them bf16 is emulated.
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def has_native_bf16(device: torch.device, cpuinfo: str | None = None) -> bool:
    """Whether ``device`` computes bf16 matrix products in hardware: CUDA compute capability 8.0+
    (Ampere on), or a CPU whose /proc/cpuinfo flags list AVX512-BF16 or AMX-BF16 (Linux; other
    systems report False)."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 8
    if device.type != "cpu":
        return False
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith("flags")), [])
    return any(flag in flags for flag in NATIVE_BF16_CPU_FLAGS)


def autocast_dtype_for(cfg: RunConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of the run (None: fp32 throughout). ``precision: auto`` is bf16 where
    the device has native bf16 (ResNet-50 on an AVX512-BF16 CPU: 2.5x fp32, docs/PERFORMANCE.md)
    and fp32 elsewhere, where emulated bf16 would be slower."""
    if cfg.precision == "bf16" or (cfg.precision == "auto" and has_native_bf16(device)):
        return torch.bfloat16
    return None


def cudnn_benchmark_for(cfg: RunConfig) -> bool:
    """Whether cuDNN autotunes its convolutions: as set, else on unless exact_reduction."""
    return not cfg.exact_reduction if cfg.cudnn_benchmark is None else cfg.cudnn_benchmark


def workers_for(cfg: RunConfig, ctx: DistContext) -> int:
    """Loader processes per rank: none for in-memory data, else the cores over local ranks."""
    if cfg.data.workers is not None:
        return cfg.data.workers
    if cfg.data.name in ("fashion-mnist", "synthetic"):
        return 0
    return default_workers(ctx.local_world_size)
