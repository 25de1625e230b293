"""Check the Triton LARS and LAMB steps on a GPU against the eager steps beside them.

    python benchmarks/triton_step_check.py [--device cuda] [--out docs/results/triton_step.jsonl]

For LARS (plain; Nesterov with clipping; an excluded group) and LAMB (plain; an excluded group),
in float32, bfloat16 and float16, over tensors shaped like ResNet-50's (a 2.4M-value convolution,
the 2M-value classifier, small and empty ones): three steps through the kernels against three
through the multi-tensor eager step, from the same values. Recorded per case: the largest
difference from the eager weights (relative to the eager update in float32, to the weights in the
16-bit types, whose updates are below their rounding), whether a second run repeats the first
bit for bit, and whether the same values as views into one buffer at odd offsets (as DDP places
gradients) step to the same bits. A kernel that gives up fails the check. One JSON line is
appended to --out; the exit status is 1 if any case fails.

``--device cpu`` runs the kernels in Triton's interpreter on small tensors (gpu.sh's dry run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path

if "cpu" in sys.argv:  # Triton reads this when torch first imports it
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from common import RESULTS_DIR, machine_info  # noqa: E402

from bigbatch.optim import LAMB, LARS, lamb_kernel, lars_kernel  # noqa: E402
from bigbatch.optim import triton_step as kernels  # noqa: E402

SHAPES = {"cuda": [(64, 3, 7, 7), (256,), (512, 512, 3, 3), (1000, 2048), (1000,), (5,), (0,),
                   (70001,)],
          "cpu": [(8, 3, 3, 3), (17,), (3000,), (5,), (0,)]}
OPTIMIZERS = {
    "lars": lambda ps: LARS(ps, lr=0.5, trust_coefficient=0.01, weight_decay=1e-3),
    "lars nesterov clip": lambda ps: LARS(ps, lr=0.5, trust_coefficient=0.01, nesterov=True,
                                          clip=True),
    "lars excluded": lambda ps: LARS([{"params": ps, "lars": False}], lr=0.05),
    "lamb": lambda ps: LAMB(ps, lr=0.01),
    "lamb excluded": lambda ps: LAMB([{"params": ps, "lars": False}], lr=0.01),
}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 3e-3}


def weights(shapes: list[tuple], dtype: torch.dtype, device: str, views: bool) -> list:
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    if not views:
        return [torch.nn.Parameter(v.to(device)) for v in values]
    flat = torch.empty(sum(v.numel() + 3 for v in values), dtype=dtype, device=device)
    params, offset = [], 1
    for v in values:
        params.append(torch.nn.Parameter(flat[offset:offset + v.numel()].view(v.shape)
                                         .copy_(v)))
        offset += v.numel() + 3
    return params


def stepped(name: str, shapes: list[tuple], dtype: torch.dtype, device: str, *,
            through_kernels: bool, views: bool = False) -> list[torch.Tensor]:
    """The weights after three steps (gradients at least 0.01 from 0: float16's second moment
    of a smaller one underflows, see LAMB's docstring)."""
    params = weights(shapes, dtype, device, views)
    opt = OPTIMIZERS[name](params)
    for step in range(3):
        gen = torch.Generator().manual_seed(100 + step)
        for p in params:
            z = torch.randn(p.shape, generator=gen)
            p.grad = (z.sign() * (z.abs() + 0.01)).to(dtype).to(device)
        if through_kernels:
            opt.step()
            if not (kernels.enabled() and opt._triton_plans):
                raise SystemExit(f"{name}: the Triton kernels did not take the step")
        else:
            with kernels.disabled():
                opt.step()
    return [p.detach().float().cpu() for p in params]


def largest_difference(got: list, want: list, start: list, dtype: torch.dtype) -> float:
    pairs = [(g, w, s) for g, w, s in zip(got, want, start, strict=True) if g.numel()]
    if dtype == torch.float32:  # against the size of the update itself
        return max((((g - s) - (w - s)).abs().max() / ((w - s).abs().max() + 1e-12)).item()
                   for g, w, s in pairs)
    return max(((g - w).abs().max() / (w.abs().max() + 1e-12)).item() for g, w, s in pairs)


def check(name: str, dtype: torch.dtype, device: str) -> dict:
    shapes = SHAPES[device]
    start = [p.detach().float().cpu() for p in weights(shapes, dtype, device, views=False)]
    first = stepped(name, shapes, dtype, device, through_kernels=True)
    eager = stepped(name, shapes, dtype, device, through_kernels=False)
    again = stepped(name, shapes, dtype, device, through_kernels=True)
    viewed = stepped(name, shapes, dtype, device, through_kernels=True, views=True)
    difference = largest_difference(first, eager, start, dtype)
    case = {"optimizer": name, "dtype": str(dtype).removeprefix("torch."),
            "difference_from_eager": float(f"{difference:.3g}"),
            "deterministic": all(torch.equal(a, b) for a, b in zip(first, again, strict=True)),
            "views_as_fresh": all(torch.equal(a, b) for a, b in zip(first, viewed, strict=True))}
    case["ok"] = difference < TOLERANCE[dtype] and case["deterministic"] and case["views_as_fresh"]
    return case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "triton_step.jsonl")
    args = parser.parse_args(argv)
    warnings.filterwarnings("error", message="the Triton LARS/LAMB step failed")
    lars_kernel._KERNELS = lamb_kernel._KERNELS = None  # on the CPU: reach the Triton path
    cases = [check(name, dtype, args.device) for name in OPTIMIZERS for dtype in TOLERANCE]
    for case in cases:
        print(json.dumps(case))
    record = {"benchmark": "triton_step_check", "cases": cases,
              "failed": sum(not case["ok"] for case in cases),
              "machine": machine_info(torch.device(args.device))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as file:
        file.write(json.dumps(record) + "\n")
    print(f"{len(cases) - record['failed']} of {len(cases)} cases ok")
    return 1 if record["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
