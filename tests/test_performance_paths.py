"""Performance paths of the training loop give the same numbers and do what they say.

uint8 batches normalised on the device equal the float batches; channels_last, bf16 autocast,
the thread setting and torch.compile each run a training step on CPU and change what they should.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from bigbatch.build import autocast_dtype_for, has_native_bf16
from bigbatch.config import config_from_dict, validate
from bigbatch.data import build_datasets
from bigbatch.data.pack import pack_imagefolder
from bigbatch.data.transforms import normalize_images
from bigbatch.distributed import DistContext
from bigbatch.train import trainer

sys.path.insert(0, str(Path(__file__).parent))
from imagegen import make_jpeg_folder  # noqa: E402

CPU_CONTEXT = DistContext(rank=0, world_size=1, local_rank=0, backend=None,
                          device=torch.device("cpu"))


@pytest.fixture(scope="module")
def jpeg_root(tmp_path_factory) -> Path:
    """8 JPEGs in 4 classes under train/, the same files under val/."""
    root = tmp_path_factory.mktemp("jpegs")
    make_jpeg_folder(root, 8, size=(120, 90), classes=4)
    shutil.copytree(root / "train", root / "val")
    return root


@pytest.fixture(scope="module")
def packed_root(jpeg_root: Path, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("packed") / "shards"
    pack_imagefolder(jpeg_root, target, short_side=48, workers=0)
    return target


def tiny_config(tmp_path: Path, **overrides) -> dict:
    """Two global steps of 8 in micro-batches of 4 (so accumulation runs) on a small CNN."""
    raw = {
        "epochs": 1, "global_batch": 8, "micro_batch": 4, "out": str(tmp_path / "run"),
        "data": {"name": "synthetic", "image_size": 16, "synthetic_examples": 16,
                 "synthetic_classes": 4, "workers": 0},
        "model": {"name": "small_cnn"},
        "checkpoint": {"keep": 1},
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            raw[key] = {**raw.get(key, {}), **value}
        else:
            raw[key] = value
    return raw


def run(raw: dict) -> dict:
    return trainer.train(validate(config_from_dict(raw)), CPU_CONTEXT)


def final_weights(raw: dict) -> dict[str, torch.Tensor]:
    return torch.load(Path(raw["out"]) / "final.pt", weights_only=True)["model"]


class ForwardProbe:
    """Captures the model the engine builds and what its first conv sees during training."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.model: nn.Module | None = None
        self.input_channels_last: list[bool] = []
        self.output_dtypes: list[torch.dtype] = []
        self.threads: list[int] = []
        build = trainer.model_for

        def model_for(cfg, num_classes, in_channels):
            model = build(cfg, num_classes, in_channels)
            conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
            conv.register_forward_hook(self.record)
            self.model = model
            return model

        monkeypatch.setattr(trainer, "model_for", model_for)

    def record(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if module.training:
            self.input_channels_last.append(
                inputs[0].is_contiguous(memory_format=torch.channels_last))
            self.output_dtypes.append(output.dtype)
            self.threads.append(torch.get_num_threads())

    def conv_weights(self) -> list[torch.Tensor]:
        return [m.weight for m in self.model.modules() if isinstance(m, nn.Conv2d)]


# ----------------------------------------------------------------------------- uint8 path


@pytest.mark.parametrize("kind", ["imagefolder", "packed"])
def test_uint8_batches_normalised_on_device_equal_float_batches(kind, jpeg_root, packed_root):
    path = jpeg_root if kind == "imagefolder" else packed_root
    float_train, _ = build_datasets(kind, path=str(path), seed=3, image_size=32)
    uint8_train, _ = build_datasets(kind, path=str(path), seed=3, image_size=32, normalize=False)
    keys = [(index, epoch) for epoch in (0, 2) for index in range(len(float_train))]
    expected = float_train.__getitems__(keys)
    raw = uint8_train.__getitems__(keys)
    assert raw.images.dtype == torch.uint8
    assert torch.equal(raw.labels, expected.labels)
    torch.testing.assert_close(normalize_images(raw.images), expected.images, rtol=0, atol=1e-6)
    assert expected.images.abs().max() > 1.0  # normalised values, not a trivially empty batch


def test_engine_trains_the_same_with_uint8_and_float_batches(jpeg_root, tmp_path):
    data = {"name": "imagefolder", "path": str(jpeg_root), "image_size": 16, "workers": 0}
    on_device = tiny_config(tmp_path / "uint8", data={**data, "normalize_on_device": True})
    on_loader = tiny_config(tmp_path / "float", data={**data, "normalize_on_device": False})
    summaries = [run(on_device), run(on_loader)]
    assert summaries[0]["val_loss"] == pytest.approx(summaries[1]["val_loss"], rel=1e-6)
    got, want = final_weights(on_device), final_weights(on_loader)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)


# ----------------------------------------------------------------------------- CPU options


def test_channels_last_converts_conv_weights_and_inputs(monkeypatch, tmp_path):
    probe = ForwardProbe(monkeypatch)
    summary = run(tiny_config(tmp_path, channels_last=True))
    assert all(w.is_contiguous(memory_format=torch.channels_last)
               and not w.is_contiguous() for w in probe.conv_weights())
    assert probe.input_channels_last and all(probe.input_channels_last)
    assert summary["steps"] == 2


def test_default_memory_format_is_contiguous(monkeypatch, tmp_path):
    probe = ForwardProbe(monkeypatch)
    run(tiny_config(tmp_path))
    assert all(w.is_contiguous() for w in probe.conv_weights())
    assert not any(probe.input_channels_last)


@pytest.mark.parametrize(("precision", "dtype"), [("bf16", torch.bfloat16),
                                                  ("fp32", torch.float32)])
def test_precision_sets_the_autocast_dtype(precision, dtype, monkeypatch, tmp_path):
    probe = ForwardProbe(monkeypatch)
    summary = run(tiny_config(tmp_path, precision=precision))
    assert probe.output_dtypes and set(probe.output_dtypes) == {dtype}
    # Parameters (the master copy LARS updates) stay fp32 under autocast.
    assert all(p.dtype == torch.float32 for p in probe.model.parameters())
    assert torch.isfinite(torch.tensor(summary["val_loss"]))


ZEN4_FLAGS = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni\n"
SKYLAKE_FLAGS = "flags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"


def test_native_bf16_is_read_from_the_cpu_flags():
    cpu = torch.device("cpu")
    assert has_native_bf16(cpu, ZEN4_FLAGS)
    assert has_native_bf16(cpu, "flags : avx2 amx_bf16 amx_tile\n")
    assert not has_native_bf16(cpu, SKYLAKE_FLAGS)  # AVX-512 without BF16: emulated
    assert not has_native_bf16(cpu, "processor : 0\n")


@pytest.mark.parametrize(("precision", "native", "expected"), [
    ("auto", True, torch.bfloat16), ("auto", False, None),
    ("bf16", False, torch.bfloat16), ("fp32", True, None),
])
def test_auto_precision_is_bf16_only_on_native_hardware(precision, native, expected, monkeypatch):
    import bigbatch.build as build

    monkeypatch.setattr(build, "has_native_bf16", lambda device: native)
    cfg = validate(config_from_dict({"precision": precision}))
    assert autocast_dtype_for(cfg, torch.device("cpu")) is expected


def test_threads_option_applies_during_training_and_is_restored(monkeypatch, tmp_path):
    probe = ForwardProbe(monkeypatch)
    before = torch.get_num_threads()
    run(tiny_config(tmp_path, threads=1))
    assert probe.threads and set(probe.threads) == {1}
    assert torch.get_num_threads() == before


def compile_unavailable() -> str | None:
    if shutil.which("c++") is None and shutil.which("g++") is None:
        return "torch.compile's CPU backend (inductor) needs a C++ compiler; none on PATH"
    if sys.platform == "win32":
        return "torch.compile is not supported on Windows CPUs here"
    return None


def test_the_compile_mode_reaches_torch_compile(tmp_path, monkeypatch):
    """compile_mode is what the trainer hands torch.compile (CUDA graphs and autotuning act on a
    GPU only, so the call is what the CPU can check); the network runs as compiled."""
    modes = []

    def spy(module, mode=None, **options):
        modes.append(mode)
        return module

    monkeypatch.setattr(torch, "compile", spy)
    summary = run(tiny_config(tmp_path, compile=True, compile_mode="reduce-overhead"))
    assert modes == ["reduce-overhead"] and summary["steps"] == 2


@pytest.mark.slow  # a cold inductor compile takes ~25 s on 2 cores (~4 s with its cache warm)
@pytest.mark.skipif(compile_unavailable() is not None, reason=str(compile_unavailable()))
def test_compile_option_trains_like_eager(tmp_path):
    eager = tiny_config(tmp_path / "eager")
    compiled = tiny_config(tmp_path / "compiled", compile=True)
    summaries = [run(eager), run(compiled)]
    assert summaries[1]["steps"] == 2
    assert summaries[1]["val_loss"] == pytest.approx(summaries[0]["val_loss"], rel=1e-4)
    got, want = final_weights(compiled), final_weights(eager)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-5, msg=name)
