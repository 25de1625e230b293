"""Where the default recipe's training time goes, by operator: one micro-batch's forward and
backward pass of its model (the fashion-mnist recipe's model, micro-batch and label smoothing on
1x28x28 inputs unless --size, fp32 unless --precision bf16) under torch.profiler, grouped into
convolution, BatchNorm, ReLU, residual add and the rest, forward and backward apart.

    python benchmarks/default_model_ops.py  # JSON; appends docs/results/default_model_ops.jsonl
    python benchmarks/default_model_ops.py --threads 1 --contiguous --no-save
    python benchmarks/default_model_ops.py --size 20  # a smaller input (progressive resizing)
    python benchmarks/default_model_ops.py --set model.options.width=20  # any recipe key

The shares are of the operators' own CPU time summed over the profiled passes; the wall time per
micro-batch is measured apart, without the profiler, as the median of --repeats passes.
"""

from __future__ import annotations

import argparse
import time

from common import machine_info, median, report

# Operator name -> group; anything else is "other".
GROUPS = {
    "aten::mkldnn_convolution": "conv forward",
    "aten::convolution_backward": "conv backward",
    "aten::native_batch_norm": "batchnorm forward",
    "aten::native_batch_norm_backward": "batchnorm backward",
    "aten::relu_": "relu forward",
    "aten::clamp_min_": "relu forward",
    "aten::threshold_backward": "relu backward",
    "aten::add": "residual add",
}


def build(threads: int, channels_last: bool, precision: str, size: int = 28,
          overrides: list[str] | None = None):
    """One training pass (zeroed gradients, forward, loss, backward) of the default recipe's
    model on a micro-batch of its size, with random 1 x size x size images and labels."""
    import torch

    from bigbatch.build import model_for
    from bigbatch.config import resolve_config

    cfg = resolve_config(overrides=overrides)  # the default recipe's model, micro-batch, smoothing
    torch.set_num_threads(threads)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model_for(cfg, num_classes=10, in_channels=1).to(memory_format=fmt)
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(cfg.micro_batch, 1, size, size, generator=generator).to(memory_format=fmt)
    labels = torch.randint(0, 10, (cfg.micro_batch,), generator=generator)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)

    def one_pass() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_fn(model(images).float(), labels)
        loss.backward()

    settings = {"recipe": "fashion-mnist", "model": cfg.model.name, **cfg.model.options,
                "micro_batch": cfg.micro_batch, "threads": threads,
                "channels_last": channels_last, "precision": precision, "size": size}
    return one_pass, settings


def operator_shares(one_pass, passes: int) -> dict[str, float]:
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(passes):
            one_pass()
    totals: dict[str, float] = {}
    for event in profile.key_averages():
        group = GROUPS.get(event.key, "other")
        totals[group] = totals.get(group, 0.0) + event.self_cpu_time_total
    whole = sum(totals.values())
    return {group: round(value / whole, 4) for group, value in
            sorted(totals.items(), key=lambda item: -item[1])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contiguous", action="store_true", help="NCHW instead of channels_last")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--size", type=int, default=28, help="input height and width")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override, e.g. model.options.width=20")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-save", action="store_true")
    options = parser.parse_args()
    one_pass, settings = build(options.threads, not options.contiguous, options.precision,
                              options.size, options.set)
    for _ in range(3):
        one_pass()  # warm-up: oneDNN primitives and the allocator's pools
    seconds = []
    for _ in range(options.repeats):
        start = time.perf_counter()
        one_pass()
        seconds.append(time.perf_counter() - start)
    record = {
        "benchmark": "default_model_ops",
        "settings": settings,
        "seconds_per_micro_batch": {"median": round(median(seconds), 4),
                                    "min": round(min(seconds), 4),
                                    "max": round(max(seconds), 4)},
        "operator_share": operator_shares(one_pass, passes=5),
        "machine": machine_info(),
    }
    report("default_model_ops", record, save=not options.no_save, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
