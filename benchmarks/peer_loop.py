"""The plain PyTorch loop an expert would write to train ResNet-50 on one device: the peer that
bigbatch's engine is measured beside in benchmarks/gpu.sh.

No loader: one batch of random images and labels is made on the device once and reused, the
upper bound any input pipeline can only approach. torchvision's resnet50, bf16 autocast,
channels_last, ``torch.backends.cudnn.benchmark``, ``zero_grad(set_to_none=True)``, optionally
``torch.compile``; the optimizer is bigbatch's LARS with BatchNorm and bias tensors excluded (the
engine's setting in gpu.sh) or torch's SGD with momentum (fused on CUDA). Each step is timed to
the device's completion; one JSON line goes to stdout (and to --output): the median images/s
after the warm-up steps, with the machine.

    python benchmarks/peer_loop.py --batch 256 --steps 60 --warmup 10 [--compile]
        [--optimizer lars|sgd] [--precision bf16|fp32] [--image-size 224] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torchvision
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_info  # noqa: E402

from bigbatch.optim import LARS  # noqa: E402
from bigbatch.optim.groups import parameter_groups  # noqa: E402


def optimizer_for(model: nn.Module, name: str, device: torch.device) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5,
                               fused=device.type == "cuda")
    groups = parameter_groups(model, weight_decay=5e-5, exclude_bn_and_bias=True)
    return LARS(groups, lr=0.1, momentum=0.9, weight_decay=5e-5)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_seconds(args: argparse.Namespace, device: torch.device) -> list[float]:
    """Each step's wall time, warm-up steps included."""
    torch.backends.cudnn.benchmark = True
    memory_format = torch.channels_last if args.channels_last else torch.contiguous_format
    model = torchvision.models.resnet50(num_classes=1000).to(device, memory_format=memory_format)
    optimizer = optimizer_for(model, args.optimizer, device)
    forward = torch.compile(model) if args.compile else model
    criterion = nn.CrossEntropyLoss()
    generator = torch.Generator(device=device).manual_seed(0)
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=device,
                         generator=generator).contiguous(memory_format=memory_format)
    labels = torch.randint(0, 1000, (args.batch,), device=device, generator=generator)
    seconds = []
    for _ in range(args.warmup + args.steps):
        started = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = criterion(forward(images).float(), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    return seconds


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60, help="timed steps")
    parser.add_argument("--warmup", type=int, default=10, help="steps dropped before timing")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--optimizer", choices=("lars", "sgd"), default="lars")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--name", default="peer plain loop", help="the run's name in the record")
    parser.add_argument("--output", type=Path, help="also write the JSON line here")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    timed = step_seconds(args, device)[args.warmup:]
    rate = statistics.median(args.batch / s for s in timed)
    record = {"run": args.name, "images_per_second": round(rate, 1), "steps": len(timed),
              "top1": None, "settings": {k: v for k, v in vars(args).items() if k != "output"},
              "machine": machine_info(device)}
    line = json.dumps(record, default=str)
    print(line)
    if args.output:
        args.output.write_text(line + "\n")
    return record


if __name__ == "__main__":
    main()
