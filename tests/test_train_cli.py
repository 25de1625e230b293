"""`bigbatch` end to end as a user runs it: train, eval, recipes, and one-line errors."""

import json
import subprocess
import sys

import pytest
from imagegen import make_image_folder
from launch import TINY, VAL_EXAMPLES, process_env, run_bigbatch, summary

pytestmark = pytest.mark.slow


def bigbatch(*args, check=False):
    return subprocess.run(
        [sys.executable, "-m", "bigbatch", *args],
        env=process_env(),  # one intra-op thread, as run_bigbatch's processes have
        capture_output=True,
        text=True,
        timeout=300,
        check=check,
    )


@pytest.mark.parametrize("decode_on_device", [False, True])
def test_image_folder_with_broken_files_trains_to_the_end(tmp_path, decode_on_device):
    info = make_image_folder(tmp_path / "images", per_class=8, val_per_class=2)
    out = tmp_path / "run"
    run = run_bigbatch(
        [
            "train",
            "--dataset",
            "imagefolder",
            "--data",
            str(info.root),
            "--model",
            "small_cnn",
            "--batch-size",
            "8",
            "--micro-batch",
            "4",
            "--epochs",
            "2",
            "--lr",
            "1.0",
            "--warmup-epochs",
            "0",
            "--set",
            "data.image_size=32",
            "--set",
            "data.workers=1",
            "--set",
            f"data.decode_on_device={str(decode_on_device).lower()}",
            "--out",
            str(out),
        ]
    )
    result = summary(out)
    assert result["steps"] == 2 * ((3 * 8 + 3) // 8)  # 27 files, 3 of them broken
    assert result["skipped_images"] >= 1
    for broken in info.train_broken:
        if broken.name in run.stderr:
            break
    else:
        pytest.fail("no broken file was named in the log")
    if decode_on_device:  # its header is whole, so only the device finds it broken
        assert "training JPEGs are decoded on cpu" in run.stderr
        assert "truncated.JPEG" in run.stderr
    assert "README.txt" not in run.stderr or "ignored" in run.stderr
    assert result["top5"] == 100.0  # 3 classes: top-5 is all
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "eval"]
    assert evals[-1]["examples"] == 6  # 3 classes x 2 validation images, each counted once
    correct = result["top1"] * 6 / 100
    assert correct == pytest.approx(round(correct), abs=1e-6)
    assert evals[-1]["top1"] == pytest.approx(result["top1"], abs=1e-6)  # the log keeps 8 decimals
    final = json.loads(run.stdout.strip().splitlines()[-1])
    assert final["steps"] == result["steps"]


def test_image_folder_error_mode_names_the_file(tmp_path):
    info = make_image_folder(tmp_path / "images", per_class=8, val_per_class=2)
    run = run_bigbatch(
        [
            "train",
            "--dataset",
            "imagefolder",
            "--data",
            str(info.root),
            "--model",
            "small_cnn",
            "--batch-size",
            "27",
            "--micro-batch",
            "27",
            "--epochs",
            "1",
            "--warmup-epochs",
            "0",
            "--set",
            "data.image_size=32",
            "--set",
            "data.workers=0",
            "--set",
            "data.on_broken=error",
            "--out",
            str(tmp_path / "run"),
        ],
        check=False,
    )
    assert run.returncode == 2
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("bigbatch: error: cannot read image")
    assert any(str(p) in last for p in info.train_broken)


@pytest.mark.fashion_mnist
def test_train_then_eval_gives_the_same_accuracy(tmp_path):
    out = tmp_path / "run"
    run_bigbatch(["train", *TINY, "--out", str(out)])
    with open(out / "metrics.jsonl") as lines:
        records = [json.loads(line) for line in lines]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, 9))
    assert {
        "lr",
        "loss",
        "images_per_second",
        "trust_min",
        "trust_median",
        "trust_max",
        "time_data",
        "time_compute",
        "time_comm_exposed",
        "time_optimizer",
    } <= train[0].keys()
    assert train[0]["trust_min"] <= train[0]["trust_median"] <= train[0]["trust_max"]
    # one ratio per LARS-adapted tensor, by parameter name: the conv and linear weights
    layers = train[0]["trust_layers"]
    assert "stem.0.weight" in layers and "head.fc.weight" in layers
    assert all(name.endswith(".weight") for name in layers)
    assert "stem.1.weight" not in layers and "stage1.0.bn1.weight" not in layers  # BN: excluded
    assert min(layers.values()) == pytest.approx(train[0]["trust_min"], rel=1e-6)
    assert max(layers.values()) == pytest.approx(train[0]["trust_max"], rel=1e-6)
    assert (out / "config.yaml").exists()
    evaluated = json.loads(bigbatch("eval", "--weights", str(out / "final.pt"), check=True).stdout)
    assert evaluated["top1"] == pytest.approx(summary(out)["top1"], abs=1e-9)
    assert evaluated["examples"] == VAL_EXAMPLES  # the run's own validation subset
    fewer = json.loads(bigbatch("eval", "--weights", str(out / "final.pt"), "--set",
                                "data.val_subset=300", check=True).stdout)
    assert fewer["examples"] == 300


# A short real run: 4096 images, 64 steps of 256, the default optimizer (LARS) at LR 2, scored
# on 2000 test images (a standard error of about 1 point at 50%).
LEARNS = ["--dataset", "fashion-mnist", "--train-subset", "4096", "--val-subset", "2000",
          "--batch-size", "256",
          "--micro-batch", "128", "--epochs", "4", "--lr", "2", "--warmup-epochs", "0.5",
          "--model", "small_resnet", "--set", "model.options.width=8", "--set", "eval_every=100",
          "--set", "channels_last=false"]


@pytest.mark.fashion_mnist
def test_training_learns_in_fp32_and_in_bf16(tmp_path):
    """Well above chance (10%) after 64 steps, and bf16 autocast (the recipes' precision where
    bf16 is native; emulated, slower, on other CPUs) learns as well as fp32."""
    top1 = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        run_bigbatch(["train", *LEARNS, "--set", f"precision={precision}", "--out", str(out)])
        top1[precision] = summary(out)["top1"]
    assert top1["fp32"] > 45.0, top1
    assert top1["bf16"] == pytest.approx(top1["fp32"], abs=5.0), top1


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--recipe", "nope"], "unknown recipe 'nope'"),
        (["train", "--model", "vgg99", "--train-subset", "4096"], "unknown model 'vgg99'"),
        (
            ["train", "--batch-size", "1000", "--micro-batch", "64"],
            "not a multiple of micro-batch 64",
        ),
        (["train", "--set", "optim.lr=-3"], "'optim.lr' must be a positive number"),
        (["train", "--set", "bogus=1"], "unknown config key 'bogus'"),
        (["train", "--dataset", "imagefolder", "--data", "/no/such/folder"], "/no/such/folder"),
        (["train", "--data", "/no/such/fmnist"], "/no/such/fmnist"),
        (["eval", "--weights", "/no/such/final.pt"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = bigbatch(*args)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("bigbatch: error: ") and message in lines[-1]
    assert "Traceback" not in result.stderr


def test_recipes_lists_every_recipe_with_its_description():
    lines = bigbatch("recipes", check=True).stdout.strip().splitlines()
    names = [line.split()[0] for line in lines]
    assert "fashion-mnist" in names and "imagenet-resnet50-32k" in names
    assert all(len(line.split()) > 3 for line in lines)


def test_output_cut_short_by_its_reader_ends_quietly():
    # `bigbatch recipes | head -1`: the reader closes the pipe after one line. Buffered output,
    # as a user's shell gives it (any value of PYTHONUNBUFFERED, "0" too, unbuffers it).
    env = process_env()
    del env["PYTHONUNBUFFERED"]
    reader = subprocess.Popen([sys.executable, "-m", "bigbatch", "recipes"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    reader.stdout.close()
    stderr = reader.stderr.read().decode()
    assert reader.wait(timeout=60) == 141 and stderr == ""


def test_data_pack_then_train_on_the_shards(tmp_path):
    info = make_image_folder(tmp_path / "images", per_class=4, val_per_class=2, broken=True)
    packed = json.loads(
        bigbatch(
            "data",
            "pack",
            str(info.root),
            str(tmp_path / "packed"),
            "--short-side",
            "64",
            "--workers",
            "1",
            check=True,
        ).stdout
    )
    assert packed["images"] == {"train": 12, "val": 6}
    assert len(packed["skipped"]["train"]) == len(info.train_broken)
    out = tmp_path / "run"
    run_bigbatch(
        [
            "train",
            "--dataset",
            "packed",
            "--data",
            str(tmp_path / "packed"),
            "--model",
            "small_cnn",
            "--batch-size",
            "4",
            "--micro-batch",
            "2",
            "--epochs",
            "1",
            "--warmup-epochs",
            "0",
            "--set",
            "data.image_size=32",
            "--set",
            "data.workers=0",
            "--out",
            str(out),
        ]
    )
    assert summary(out)["steps"] == 3 and summary(out)["skipped_images"] == 0
