"""Evaluation: exact counts, and test-time horizontal flip against a hand computation."""

import torch
from torch import nn

from bigbatch.data.synthetic import SyntheticImages
from bigbatch.distributed import DistContext
from bigbatch.evaluate import evaluate
from bigbatch.metrics import topk_correct

CPU = DistContext(0, 1, 0, None, torch.device("cpu"))


def _mirror_sensitive_model() -> nn.Module:
    """A linear classifier on raw pixels: a mirrored image gets different logits."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))


def _by_hand(model: nn.Module, dataset: SyntheticImages, hflip: bool) -> tuple[float, float]:
    batch = dataset.__getitems__([(i, 0) for i in range(len(dataset))])
    with torch.no_grad():
        logits = model(batch.images)
        if hflip:
            logits = (logits + model(torch.flip(batch.images, dims=[3]))) / 2
    top1, _ = topk_correct(logits, batch.labels)
    loss = nn.functional.cross_entropy(logits, batch.labels)
    return 100.0 * float(top1) / len(dataset), float(loss)


def test_hflip_averages_the_logits_of_image_and_mirror():
    dataset = SyntheticImages(97, 10, 8, seed=3)
    model = _mirror_sensitive_model()
    for hflip in (False, True):
        result = evaluate(model, dataset, CPU, batch_size=32, hflip=hflip)
        top1, loss = _by_hand(model, dataset, hflip)
        assert result["examples"] == 97
        assert abs(result["top1"] - top1) < 1e-9
        assert abs(result["loss"] - loss) < 1e-5
    plain = evaluate(model, dataset, CPU, batch_size=32)
    flipped = evaluate(model, dataset, CPU, batch_size=32, hflip=True)
    assert plain["loss"] != flipped["loss"]  # the option changes what is measured


def test_hflip_of_a_mirror_symmetric_model_changes_nothing():
    dataset = SyntheticImages(40, 10, 8, seed=1)
    model = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 10))
    plain = evaluate(model, dataset, CPU, batch_size=16)
    flipped = evaluate(model, dataset, CPU, batch_size=16, hflip=True)
    assert plain["top1"] == flipped["top1"]
    assert abs(plain["loss"] - flipped["loss"]) < 1e-6
