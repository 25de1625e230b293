"""Time one optimizer step on ResNet-50's parameters: bigbatch LARS and LAMB, PyTorch's, timm's.

    python benchmarks/lars_step.py [--repeats 30] [--threads 2] [--no-compile] [--only NAME,...]
                                   [--device cpu]

Every optimizer owns its own copy of ResNet-50's 161 parameter tensors (25.6M values) with fixed
random gradients. The steps are interleaved (one step of each per repetition, order rotated) so
that a noisy shared machine slows them alike; the first ``--warmup`` repetitions are dropped.
Reported: the median time per step of each, the ratio of medians, and the median of the
per-repetition ratios (robust when the machine's speed drifts). The JSON record goes to stdout and
is appended, with the machine's description, to docs/results/lars_step.jsonl.

Contenders (weight decay 5e-4 and momentum 0.9 unless named otherwise):
  sgd            torch.optim.SGD(momentum=0.9, foreach=True), no weight decay
  sgd_wd         the same with weight_decay=5e-4
  sgd_fused      the same with fused=True instead of foreach (the fastest PyTorch step)
  adamw_fused    torch.optim.AdamW(fused=True), PyTorch's defaults
  lars           bigbatch.optim.LARS, every tensor adapted (as timm's Lars does): on CPU the
                 compiled kernel where it was built, on CUDA the Triton kernels
  lars_eager     the same on its eager multi-tensor path (the fallback without a kernel)
  lars_compiled  LARS(fused_compile=True) (compile time reported separately)
  lamb_compiled  LAMB(fused_compile=True), the same (the CPU kernel is not used)
  timm_lars      timm.optim.Lars (LR outside the momentum buffer, eps 1e-8)
  lamb           bigbatch.optim.LAMB, weight decay 0.01, every tensor adapted: on CPU the
                 compiled kernel where it was built, on CUDA the Triton kernels
  lamb_eager     the same on its eager multi-tensor path (the fallback without a kernel)
  lamb_one_pass  the kernel with the trust ratio off on every tensor: Adam with weight decay in
                 one pass (reads x, g, m, v; writes x, m, v, as fused AdamW), which shows what
                 the second pass of the trust ratio costs (on a GPU: the first Triton
                 kernel alone)
  timm_lamb      timm.optim.Lamb with the same update (max_grad_norm=None: no global clipping)

Ratios: each row of RATIOS, as the ratio of the medians, the median of the per-repetition ratios
and their range (min-max over the repetitions).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

import torch
import torchvision
from common import RESULTS_DIR
from common import machine_info as common_machine_info

from bigbatch.optim import LAMB, LARS, lamb_kernel, lars_kernel, native

RESULTS = RESULTS_DIR / "lars_step.jsonl"
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 5e-4
RATIOS = [("lars", "sgd_fused"), ("lars_eager", "sgd_fused"), ("lars_compiled", "sgd_fused"),
          ("lars", "sgd_wd"), ("lars", "timm_lars"), ("lars", "lars_eager"),
          ("adamw_fused", "sgd_fused"), ("lamb", "adamw_fused"), ("lamb_eager", "adamw_fused"),
          ("timm_lamb", "adamw_fused"), ("lamb", "lamb_eager"), ("lamb", "lars"),
          ("lamb_one_pass", "adamw_fused"), ("lamb", "lamb_one_pass"),
          ("lamb_compiled", "adamw_fused"), ("lamb_compiled", "lamb")]
TARGETS = {"lars/sgd_fused <=": 1.3, "lamb/adamw_fused <=": 1.3}


def resnet50_params_with_grads(device: torch.device, seed: int) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    params = list(torchvision.models.resnet50().to(device).parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-2
    return params


COMPILED = ("lars_compiled", "lamb_compiled")


def make_optimizers(device: torch.device, with_compile: bool,
                    only: Sequence[str] | None = None) -> dict[str, torch.optim.Optimizer]:
    """Each contender over its own copy of the parameters (``only``: these contenders alone)."""
    from timm.optim import Lamb, Lars

    def params() -> list[torch.nn.Parameter]:
        return resnet50_params_with_grads(device, seed=0)

    sgd = dict(lr=LR, momentum=MOMENTUM)
    lars = dict(lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    lamb = dict(lr=1e-3, weight_decay=0.01)
    factories: dict[str, Callable[[], torch.optim.Optimizer]] = {
        "sgd": lambda: torch.optim.SGD(params(), **sgd, foreach=True),
        "sgd_wd": lambda: torch.optim.SGD(params(), **sgd, weight_decay=WEIGHT_DECAY,
                                          foreach=True),
        "sgd_fused": lambda: torch.optim.SGD(params(), **sgd, weight_decay=WEIGHT_DECAY,
                                             fused=True),
        "adamw_fused": lambda: torch.optim.AdamW(params(), fused=True),
        "lars": lambda: LARS(params(), **lars),
        "lars_eager": lambda: EagerLARS(params(), **lars),
        "timm_lars": lambda: Lars(params(), **lars),
        "lamb": lambda: LAMB(params(), **lamb),
        "lamb_eager": lambda: EagerLAMB(params(), **lamb),
        "lamb_one_pass": lambda: LAMB([{"params": params(), "lars": False}], **lamb),
        "timm_lamb": lambda: Lamb(params(), **lamb, max_grad_norm=None),
        "lars_compiled": lambda: LARS(params(), **lars, fused_compile=True),
        "lamb_compiled": lambda: LAMB(params(), **lamb, fused_compile=True),
    }
    unknown = sorted(set(only or ()) - set(factories))
    if unknown:
        raise SystemExit(f"lars_step.py: unknown contenders {', '.join(unknown)}; choose from "
                         + ", ".join(factories))
    if only:
        chosen = [name for name in factories if name in only]
    else:
        chosen = [name for name in factories if with_compile or name not in COMPILED]
    return {name: factories[name]() for name in chosen}


@contextlib.contextmanager
def eager_only(kernel: ModuleType) -> Iterator[None]:
    """Within the block, the CPU ``kernel`` and the GPU's Triton steps are off."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(kernel.disabled())
        triton_steps = native.triton_steps(torch.device("cuda"))
        if triton_steps is not None:
            stack.enter_context(triton_steps.disabled())
        yield


class EagerLARS(LARS):
    """LARS kept on its eager multi-tensor path (the fallback where no kernel can run)."""

    def step(self, closure: Callable[[], object] | None = None) -> object:
        with eager_only(lars_kernel):
            return super().step(closure)


class EagerLAMB(LAMB):
    """LAMB kept on its eager multi-tensor path (the fallback where no kernel can run)."""

    def step(self, closure: Callable[[], object] | None = None) -> object:
        with eager_only(lamb_kernel):
            return super().step(closure)


def triton_step_enabled(device: torch.device) -> bool | None:
    """Whether LARS and LAMB stepped through the Triton kernels to the end (a kernel that failed
    switches them off, and the timings of lars and lamb are then the eager path's); None off
    CUDA."""
    kernels = native.triton_steps(device) if device.type == "cuda" else None
    return None if kernels is None else kernels.enabled()


def timed(step: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def interleaved_times(optimizers: dict[str, torch.optim.Optimizer], repeats: int, warmup: int,
                      device: torch.device) -> dict[str, list[float]]:
    names = list(optimizers)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(warmup + repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            seconds = timed(optimizers[name].step, device)
            if rep >= warmup:
                times[name].append(seconds)
    return times


def ratio_summary(times: dict[str, list[float]], num: str, den: str) -> dict[str, float]:
    paired = [a / b for a, b in zip(times[num], times[den], strict=True)]
    return {"of_medians": round(statistics.median(times[num]) / statistics.median(times[den]), 3),
            "median_paired": round(statistics.median(paired), 3),
            "min_paired": round(min(paired), 3), "max_paired": round(max(paired), 3)}


def machine_info(device: torch.device) -> dict[str, object]:
    """common.machine_info, with the device and the 1-minute load average at the end of the run
    under the names lars_step_summary reads (other processes' load skews the timings)."""
    info = common_machine_info(device)
    return {**info, "device": str(device), "loadavg_1min": info["load_average"]["1min"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed repetitions (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed repetitions (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="skip LARS and LAMB with fused_compile=True (each compile takes "
                             "a minute or more on 2 cores)")
    parser.add_argument("--only", type=lambda text: text.split(","), default=None,
                        metavar="NAME,...", help="time these contenders alone (names above)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="JSONL file to append to")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    optimizers = make_optimizers(device, args.compile, args.only)
    # The first compiled step compiles: timed apart from the steady state.
    compile_s = {name: round(timed(optimizers[name].step, device), 1)
                 for name in COMPILED if name in optimizers}
    times = interleaved_times(optimizers, args.repeats, args.warmup, device)

    ratios = {f"{num}/{den}": ratio_summary(times, num, den)
              for num, den in RATIOS if num in times and den in times}
    first = next(iter(optimizers.values()))
    record = {
        "benchmark": "lars_step", "model": "resnet50",
        "tensors": len(first.param_groups[0]["params"]),
        "values": sum(p.numel() for p in first.param_groups[0]["params"]),
        "repeats": args.repeats, "warmup": args.warmup,
        "median_ms": {k: round(statistics.median(v) * 1e3, 2) for k, v in times.items()},
        "min_ms": {k: round(min(v) * 1e3, 2) for k, v in times.items()},
        "max_ms": {k: round(max(v) * 1e3, 2) for k, v in times.items()},
        "ratios": ratios, "compile_s": compile_s, "targets": TARGETS,
        "lars_kernel": lars_kernel.available(), "lamb_kernel": lamb_kernel.available(),
        "triton_step": triton_step_enabled(device),
        "machine": machine_info(device),
    }
    json.dump(record, sys.stdout, indent=2)
    sys.stdout.write("\n")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.output.open("a") as f:
        f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
