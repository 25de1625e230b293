"""How the 90-epoch study writes a point and a batch (standard library only: the docs' tables
use it too, and render without PyTorch)."""

from __future__ import annotations

from typing import Any

from study20_verdict import IMAGENET_TRAIN
from study90 import WARMUP

TRAIN_EXAMPLES = 60_000  # Fashion-MNIST
PAPER_BATCHES = {8192: "8K", 16384: "16K", 32768: "32K", 65536: "64K"}
PAPER_MATCH = 0.02  # an ImageNet-equivalent batch within 2% of a paper batch takes its name


def imagenet_batch(batch: int) -> str:
    """The ImageNet batch with the same steps per epoch, named as the paper's where it matches."""
    equivalent = batch * IMAGENET_TRAIN / TRAIN_EXAMPLES
    for paper, name in PAPER_BATCHES.items():
        if abs(equivalent / paper - 1) <= PAPER_MATCH:
            return name
    return str(round(equivalent))


def cell(stats: dict[str, Any] | None, details: bool = True) -> str:
    """A point's value: mean ± std (range) of its seeds, or the one number with its seeds' state."""
    if stats is None:
        return "not finished"
    if stats["diverged"]:
        return "diverged (0)"
    text = f"{stats['value']:.2f}"
    if stats["std"] is not None:
        text += f" ± {stats['std']:.2f} ({stats['range'][0]:.2f}–{stats['range'][1]:.2f})"
    if not stats["seeded"]:
        text += f" (seed{'s' if len(stats['seeds']) > 1 else ''} {', '.join(stats['seeds'])} only)"
    if stats["diverged_seeds"]:
        text += f" (seed {', '.join(stats['diverged_seeds'])} diverged, left out)"
    if details:
        text += f", LR {stats['lr']:.3g}" + (", LR at grid edge" if stats["at_edge"] else "")
        text += f", warmup {stats['warmup']:g}" if stats["warmup"] != WARMUP else ""
    return text
