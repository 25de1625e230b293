"""Config: recipes load and validate, overrides apply, bad values fail with one clear line."""

import pytest

from bigbatch.config import (
    apply_overrides,
    config_from_dict,
    load_recipe,
    recipe_names,
    resolve_config,
)
from bigbatch.errors import ConfigError

PAPER_RECIPES = {
    "imagenet-alexnet-512": ("alexnet", "sgd", 512, 0.02),
    "imagenet-alexnet-bn-8k": ("alexnet_bn", "lars", 8192, 14.0),
    "imagenet-alexnet-bn-32k": ("alexnet_bn", "lars", 32768, 22.0),
    "imagenet-resnet50-8k": ("resnet50", "lars", 8192, 30.0),
    "imagenet-resnet50-32k": ("resnet50", "lars", 32768, 40.0),
    "imagenet-resnet50-goyal-8k": ("resnet50", "sgd", 8192, 0.1),
}


def test_every_shipped_recipe_validates():
    names = recipe_names()
    assert {"fashion-mnist", "fashion-mnist-baseline", *PAPER_RECIPES} <= set(names)
    for name in names:
        cfg = resolve_config(recipe=name, overrides=["data.path=/somewhere"])
        assert cfg.global_batch % cfg.micro_batch == 0
        assert load_recipe(name)["description"]


@pytest.mark.parametrize("name", sorted(PAPER_RECIPES))
def test_paper_recipes_carry_the_paper_hyper_parameters(name):
    model, optimizer, batch, lr = PAPER_RECIPES[name]
    cfg = resolve_config(recipe=name, overrides=["data.path=/x"])
    assert (cfg.model.name, cfg.optim.name, cfg.global_batch, cfg.optim.lr) == (
        model,
        optimizer,
        batch,
        lr,
    )
    assert cfg.optim.momentum == 0.9
    if optimizer == "lars":
        assert cfg.optim.trust_coefficient == 0.001 and cfg.schedule.power == 2
        # The authors' Intel Caffe adapts every tensor, BN and bias included.
        assert cfg.optim.exclude_bn_and_bias is False


def test_mlperf_recipe_carries_its_source_hyper_parameters():
    cfg = resolve_config(recipe="imagenet-resnet50-mlperf-32k", overrides=["data.path=/x"])
    o, s = cfg.optim, cfg.schedule
    assert (cfg.model.name, cfg.global_batch, cfg.epochs, cfg.label_smoothing) == (
        "resnet50", 32768, 64, 0.1)
    assert (o.name, o.lr, o.momentum, o.weight_decay, o.exclude_bn_and_bias) == (
        "lars", 29.0, 0.929, 1e-4, True)
    assert (s.kind, s.power, s.warmup_epochs, s.end_lr) == ("poly", 2, 18, 1e-4)


def test_default_recipe_is_large_batch_lars():
    cfg = resolve_config()
    assert cfg.optim.name == "lars" and cfg.global_batch >= 4096
    assert cfg.data.name == "fashion-mnist"


def test_overrides_reach_nested_fields_with_types():
    cfg = resolve_config(
        overrides=[
            "optim.trust_coefficient=0.002",
            "epochs=3",
            "model.options.width=16",
            "schedule.milestones=[1, 2]",
        ]
    )
    assert cfg.optim.trust_coefficient == 0.002
    assert cfg.epochs == 3.0
    assert cfg.model.options == {"width": 16}
    assert cfg.schedule.milestones == [1.0, 2.0]


def test_round_trip_through_yaml(tmp_path):
    cfg = resolve_config(overrides=["seed=7"])
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    again = resolve_config(config_file=str(path))
    assert again == cfg


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["nonsense=1"], "unknown config key 'nonsense'"),
        (["optim.bogus=1"], "unknown config key 'optim.bogus'"),
        (["global_batch=1000", "micro_batch=64"], "not a multiple of micro-batch 64"),
        (["optim.lr=-1"], "'optim.lr' must be a positive number"),
        (["optim.name=adam"], "choose one of: lars, lamb, sgd"),
        (["epochs=abc"], "'epochs' must be a number"),
        (["global_batch=12.5"], "'global_batch' must be an integer"),
        (["optim.momentum=1.5"], "'optim.momentum' must be in"),
        (["schedule.warmup_epochs=50", "epochs=10"], "longer than the run"),
        (["data.train_subset=100"], "smaller than the global batch"),
        (["data.val_subset=0"], "'data.val_subset' must be a positive number"),
        (["data.name=imagefolder"], "needs a folder"),
        (["checkpoint.resume=/no/such/file.pt"], "does not exist"),
        (["precision=fp8"], "choose one of: fp32, bf16"),
    ],
)
def test_bad_values_fail_with_one_line(overrides, message):
    with pytest.raises(ConfigError) as caught:
        resolve_config(overrides=overrides)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_unknown_recipe_lists_the_choices():
    with pytest.raises(ConfigError, match="unknown recipe 'nope'; choose one of: .*fashion-mnist"):
        resolve_config(recipe="nope")


def test_set_requires_key_value():
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["epochs"])


def test_section_must_be_mapping():
    with pytest.raises(ConfigError, match="'optim' must be a mapping"):
        config_from_dict({"optim": 3})


def test_model_flag_starts_from_the_new_models_defaults():
    from bigbatch.commands import build_parser
    from bigbatch.commands.train import values_from_flags

    args = build_parser().parse_args(["train", "--model", "resnet18", "--set", "seed=1"])
    cfg = resolve_config(overrides=args.overrides, values=values_from_flags(args))
    assert cfg.model.name == "resnet18" and cfg.model.options == {}
    args = build_parser().parse_args(["train", "--model", "small_cnn", "--set",
                                      "model.options.width=8"])
    cfg = resolve_config(overrides=args.overrides, values=values_from_flags(args))
    assert cfg.model.options == {"width": 8}
    assert resolve_config().model.options == {"width": 24}  # the recipe's own options otherwise


@pytest.mark.parametrize(("overrides", "expected"), [
    ([], True), (["exact_reduction=true"], False), (["cudnn_benchmark=false"], False),
    (["exact_reduction=true", "cudnn_benchmark=true"], True)])
def test_cudnn_autotuning_is_on_unless_exact_reduction_or_set(overrides, expected):
    from bigbatch.build import cudnn_benchmark_for

    assert cudnn_benchmark_for(resolve_config(overrides=overrides)) is expected


@pytest.mark.parametrize(("overrides", "message"), [
    (["compile=true", "compile_mode=fastest"], "'compile_mode' is 'fastest'; choose one of:"),
    (["compile_mode=max-autotune"], "compile_mode=max-autotune takes effect with compile=true"),
])
def test_a_compile_mode_is_one_of_torchs_and_needs_compile(overrides, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(overrides=overrides)
    assert resolve_config(overrides=["compile=true", "compile_mode=reduce-overhead"]
                          ).compile_mode == "reduce-overhead"
