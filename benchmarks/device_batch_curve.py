"""One device's training throughput as a function of its batch: ResNet-50 on this CPU.

    python benchmarks/device_batch_curve.py [--batches 1,2,4,8,16,32] [--rounds 8] [--threads 2]

Times one training step (forward, backward, SGD with momentum) of bigbatch's ResNet-50 on random
224 x 224 images for each per-device batch. The batches are interleaved (one step of each per
round, the order rotated every round) so that a slow spell of the shared machine hits every batch
alike; round 0 is a warm-up and dropped. Reported per batch: the median step time with its range
and the images/s of the median; and the planner's curve fitted to the medians,
t(b) = t0 + b / r_max (bigbatch.tools.plan.curve), with its half-throughput batch h = t0 r_max.
The record (with the machine and the load average before and after) is appended to
docs/results/device_batch_curve.jsonl.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from common import interleaved_rounds, load_average, machine_info, report, spread

from bigbatch.models import create_model
from bigbatch.tools.plan.curve import fit_step_time

NOTE = (
    "shared 2-core machine: a niced background study and other engineers' jobs ran during the "
    "measurement; see load_average_before/after"
)


def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(part) for part in text.split(",")]
    except ValueError:
        raise SystemExit(f"--batches must be integers separated by commas, got '{text}'") from None
    if not batches or min(batches) < 1:
        raise SystemExit(f"--batches must be positive, got '{text}'")
    return batches


def training_step(batch: int, image_size: int) -> Callable[[], float]:
    """A function timing one step of ResNet-50 at ``batch`` images (seconds)."""
    model = create_model("resnet50", 1000)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    generator = torch.Generator().manual_seed(batch)
    images = torch.randn(batch, 3, image_size, image_size, generator=generator)
    labels = torch.randint(0, 1000, (batch,), generator=generator)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> float:
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(images), labels).backward()
        optimizer.step()
        return time.perf_counter() - started

    return step


def measure(batches: list[int], rounds: int, image_size: int) -> dict:
    steps = {str(b): training_step(b, image_size) for b in batches}
    before = load_average()
    started = time.perf_counter()
    times = interleaved_rounds(steps, rounds + 1)
    wall = time.perf_counter() - started
    rows = []
    for batch in batches:
        kept = times[str(batch)][1:]  # round 0 is the warm-up
        summary = spread(kept)
        rows.append({"batch": batch, "step_s": summary,
                     "images_per_second": round(batch / summary["median"], 3)})
    fit = fit_step_time([(row["batch"], row["step_s"]["median"]) for row in rows])
    return {"rows": rows, "fit": fit.as_dict(), "load_average_before": before,
            "load_average_after": load_average(), "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,2,4,8,16,32")
    parser.add_argument("--rounds", type=int, default=8, help="timed rounds (after one warm-up)")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be at least 1, got {args.rounds}")
    torch.set_num_threads(args.threads)
    batches = parse_batches(args.batches)
    record = {"benchmark": "device_batch_curve", "model": "resnet50",
              "image_size": args.image_size, "rounds": args.rounds, "note": NOTE,
              "machine": machine_info("cpu"), **measure(batches, args.rounds, args.image_size)}
    report("device_batch_curve", record, save=not args.no_save, indent=None)


if __name__ == "__main__":
    main()
