"""A run's configuration: typed dataclasses, YAML in and out, `--set` overrides, validation.

A run is defined by its global batch B, its micro-batch b and its seed; the number of processes
and the accumulation steps are derived at launch time (bigbatch.geometry).
Every check here runs before any work starts and fails with one line that says what to change.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from bigbatch.errors import ConfigError
from bigbatch.geometry import BatchGeometry
from bigbatch.lars_defaults import LARS_DEFAULTS


@dataclass
class DataConfig:
    name: str = "fashion-mnist"
    path: str | None = None
    image_size: int | None = None  # None: the data set's native size or the model's default
    train_subset: int | None = None  # first N training examples, for quick runs
    val_subset: int | None = None  # N validation examples (folders, shards: spread evenly)
    augment: bool = True  # training crop + flip; false: training images prepared as validation
    on_broken: str = "skip"  # broken image files: skip and report, or stop naming the file
    workers: int | None = None  # loader processes per rank; None: sized to the cores
    fast_decode: bool = True  # JPEG decode at reduced scale where the crop allows
    # Training images travel as uint8 (imagefolder, packed) and are normalised on the training
    # device: 4x fewer bytes to copy, less work for the loader; same numbers as the float path.
    normalize_on_device: bool = True
    # Training JPEGs decoded by the training device (nvJPEG on a GPU), not the loader workers,
    # for a GPU whose workers cannot keep up; on a GPU pixels may differ slightly from theirs.
    decode_on_device: bool = False
    synthetic_examples: int = 10000
    synthetic_classes: int = 1000
    val_path: str | None = None  # webdataset validation shards; None: val-*.tar beside train-*.tar
    num_classes: int | None = None  # webdataset labels 0..N-1; None: largest label of train+val + 1


@dataclass
class ModelConfig:
    name: str = "small_resnet"
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConfig:
    # lr, momentum, nesterov, weight_decay, trust_coefficient, eps, clip, fused_compile: LARS's
    # defaults, from their one home, bigbatch.lars_defaults.
    name: str = "lars"
    lr: float = LARS_DEFAULTS.lr  # base LR at reference_batch, scaled by lr_scaling to the batch
    lr_scaling: str = "none"
    reference_batch: int = 256
    momentum: float = LARS_DEFAULTS.momentum
    nesterov: bool = LARS_DEFAULTS.nesterov
    weight_decay: float = LARS_DEFAULTS.weight_decay
    trust_coefficient: float = LARS_DEFAULTS.trust_coefficient
    eps: float = LARS_DEFAULTS.eps
    clip: bool = LARS_DEFAULTS.clip
    exclude_bn_and_bias: bool = True
    # LARS or LAMB update through torch.compile: faster steps on a GPU, slow first one
    fused_compile: bool = LARS_DEFAULTS.fused_compile


@dataclass
class ScheduleConfig:
    kind: str = "poly"
    warmup_epochs: float = 0.0
    warmup_start_lr: float = 0.0
    end_lr: float = 0.0
    power: float = 2.0
    milestones: list[float] = field(default_factory=list)  # epochs, for kind=step
    gamma: float = 0.1


@dataclass
class CheckpointConfig:
    every_steps: int = 0  # 0: only at epoch ends and at the end
    every_minutes: float = 0.0
    keep: int = 2
    resume: str | None = None  # None, "auto" or a path


@dataclass
class LogConfig:
    tensorboard: bool = False  # scalars in RUN_DIR/tensorboard/ (the 'tensorboard' extra)
    # When stderr is not a terminal (SLURM, nohup): a progress line every N steps and at least
    # every M seconds (0 turns either rule off); a terminal gets a progress bar instead.
    progress_every_steps: int = 50
    progress_every_seconds: float = 60.0
    # Every N global steps the ranks time a 1 MiB ring exchange and their busy time, and a rank
    # far slower than the others is named (bigbatch.stragglers); 0 turns the probe off.
    straggler_probe_every_steps: int = 100


@dataclass
class EvalConfig:
    # Precise BatchNorm (bigbatch.precise_bn): before every evaluation the running statistics
    # are replaced by their exact average over N training micro-batches; 0: the running ones.
    bn_recompute: int = 0
    # Test-time horizontal flip: each validation image is classified from the mean of the
    # logits of it and of its mirror image (twice the evaluation compute).
    hflip: bool = False


@dataclass
class ResizeConfig:
    # Progressive resizing (bigbatch.train.resize): training images scaled by initial_scale at
    # the first step, the scale rising linearly to 1 at (1 - finetune_fraction) of the steps and
    # staying 1 after; sides rounded down to a multiple of multiple_of. initial_scale 1: off.
    initial_scale: float = 1.0
    finetune_fraction: float = 0.5
    multiple_of: int = 4


@dataclass
class RunConfig:
    epochs: float = 10
    global_batch: int = 4096
    micro_batch: int = 256
    seed: int = 0
    label_smoothing: float = 0.0
    eval_every: int = 1  # epochs
    log_every: int = 1  # steps between metric lines
    precision: str = "fp32"
    channels_last: bool = False
    compile: bool = False
    # torch.compile's mode (with compile=true): "reduce-overhead" replays the compiled forward
    # and backward as CUDA graphs, "max-autotune" also times kernel choices (slow first steps)
    compile_mode: str = "default"
    # cuDNN times its convolution algorithms for each new input shape and keeps the fastest
    # (CUDA only). None: on, unless exact_reduction (the algorithm chosen, and with it the bits,
    # can differ between processes and runs).
    cudnn_benchmark: bool | None = None
    threads: int | None = None  # intra-op CPU threads; None: PyTorch's default (all cores)
    # Ranks `bigbatch train` starts on this machine when no launcher did: N, or "auto" (one per
    # core on a CPU-only machine; bigbatch.local_launch)
    local_processes: str = "1"
    sync_bn: bool = False
    # Sums whose order depends on the layout in fixed point: bit-identical runs at any world size
    exact_reduction: bool = False
    backend: str = "auto"
    # Seconds a rank waits in a collective (or while the process group forms) for a peer
    # before the run fails with the peer named: a lost link or a frozen node is noticed in this
    # time, not in torch's own default (30 minutes for gloo, 10 for NCCL).
    collective_timeout: float = 300.0
    on_nonfinite: str = "stop"
    max_skipped_steps: int = 10
    out: str = "runs/default"
    description: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    resize: ResizeConfig = field(default_factory=ResizeConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# --------------------------------------------------------------------------- building


def config_from_dict(raw: dict[str, Any]) -> RunConfig:
    """Build a RunConfig from a nested dict, rejecting unknown keys with their dotted name."""
    return _build(RunConfig, raw, prefix="")


def _build(cls: type, raw: Any, prefix: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"'{prefix.rstrip('.') or 'config'}' must be a mapping, got {raw!r}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        if key not in names:
            raise ConfigError(
                f"unknown config key '{prefix}{key}'; known keys: {', '.join(sorted(names))}"
            )
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, prefix=f"{prefix}{key}.")
        else:
            kwargs[key] = _coerce(value, hint, f"{prefix}{key}")
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, name: str) -> Any:
    """Convert a YAML or command-line value to the field's declared type."""
    text = str(hint)
    optional = "None" in text
    spelled_none = isinstance(value, str) and value.lower() in ("none", "null")
    if value is None or (spelled_none and optional):
        if optional:
            return None
        raise ConfigError(f"'{name}' cannot be empty")
    try:
        if hint is bool or text.startswith("bool"):
            return _to_bool(value, name)
        if hint is int or text.startswith("int"):
            return _to_int(value, name)
        if hint is float or text.startswith("float"):
            return float(value)
        if text.startswith("list"):
            items = value if isinstance(value, list) else yaml.safe_load(f"[{value}]")
            return [float(v) for v in items]
        if text.startswith("dict"):
            if isinstance(value, dict):
                return value
            raise ConfigError(f"'{name}' must be a mapping")
        return str(value)
    except (TypeError, ValueError, yaml.YAMLError):
        raise ConfigError(f"'{name}' must be {_type_word(hint)}, got {value!r}") from None


def _to_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "yes", "1", "on"):
        return True
    if str(value).lower() in ("false", "no", "0", "off"):
        return False
    raise ValueError(name)


def _to_int(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise ValueError(name)
    number = float(value)
    if not number.is_integer():
        raise ValueError(name)
    return int(number)


def _type_word(hint: Any) -> str:
    text = str(hint)
    for word, label in (("bool", "true or false"), ("int", "an integer"), ("float", "a number")):
        if word in text:
            return label
    return "text"


def apply_overrides(raw: dict[str, Any], assignments: list[str], flag: str = "--set"
                    ) -> dict[str, Any]:
    """Apply `key=value` assignments (dotted keys, YAML values) to a nested dict; ``flag`` names
    the command-line option they came from in errors."""
    for assignment in assignments:
        if "=" not in assignment:
            raise ConfigError(f"{flag} expects key=value, got '{assignment}'")
        key, text = assignment.split("=", 1)
        try:
            value = yaml.safe_load(text) if text else None
        except yaml.YAMLError:
            value = text
        set_dotted(raw, key.strip(), value)
    return raw


def set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set '{dotted}': '{part}' is not a section")
    node[parts[-1]] = value


# --------------------------------------------------------------------------- recipes


def recipe_names() -> list[str]:
    folder = resources.files("bigbatch") / "recipes"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_recipe(name: str) -> dict[str, Any]:
    """The raw dict of a shipped recipe."""
    if name not in recipe_names():
        raise ConfigError(
            f"unknown recipe '{name}'; choose one of: {', '.join(recipe_names())} "
            "(or pass --config FILE)"
        )
    text = (resources.files("bigbatch") / "recipes" / f"{name}.yaml").read_text()
    return yaml.safe_load(text) or {}


def load_config_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file '{path}' does not exist")
    try:
        raw = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"config file '{path}' is not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of keys")
    return raw


# --------------------------------------------------------------------------- validation


# Named choices whose lists belong with the config (the components that implement them import
# these): the precision (auto: bf16 where the hardware has native bf16) and what to do on a
# non-finite loss or gradient.
PRECISIONS = ("fp32", "bf16", "auto")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
NONFINITE_POLICIES = ("stop", "skip")


# Fields that may be 0 but not negative.
NON_NEGATIVE = (
    "optim.weight_decay",
    "optim.trust_coefficient",
    "optim.eps",
    "schedule.end_lr",
    "schedule.warmup_epochs",
    "schedule.warmup_start_lr",
    "checkpoint.every_steps",
    "checkpoint.every_minutes",
    "max_skipped_steps",
    "seed",
    "log.progress_every_steps",
    "log.progress_every_seconds",
    "log.straggler_probe_every_steps",
    "eval.bn_recompute",
)


def validate(cfg: RunConfig) -> RunConfig:
    """Check every value that can be checked without data; raise ConfigError on the first.
    The named choices come last: most of their lists live in modules that import torch
    (seconds), so a wrong number fails before that."""
    _check_positive("epochs", cfg.epochs)
    _check_positive("global_batch", cfg.global_batch)
    _check_positive("micro_batch", cfg.micro_batch)
    _check_positive("optim.lr", cfg.optim.lr)
    _check_positive("optim.reference_batch", cfg.optim.reference_batch)
    _check_positive("eval_every", cfg.eval_every)
    _check_positive("log_every", cfg.log_every)
    _check_positive("collective_timeout", cfg.collective_timeout)
    _check_positive("checkpoint.keep", cfg.checkpoint.keep)
    _check_range("optim.momentum", cfg.optim.momentum, 0.0, 1.0, upper_open=True)
    _check_range("label_smoothing", cfg.label_smoothing, 0.0, 1.0, upper_open=True)
    _check_positive("resize.initial_scale", cfg.resize.initial_scale)
    _check_range("resize.initial_scale", cfg.resize.initial_scale, 0.0, 1.0, upper_open=False)
    _check_range("resize.finetune_fraction", cfg.resize.finetune_fraction, 0.0, 1.0,
                 upper_open=False)
    _check_positive("resize.multiple_of", cfg.resize.multiple_of)
    for name in NON_NEGATIVE:
        _check_non_negative(name, _get_dotted(cfg, name))
    if cfg.threads is not None:
        _check_positive("threads", cfg.threads)
    _check_geometry(cfg)
    if cfg.eval.bn_recompute and cfg.sync_bn:
        raise ConfigError("eval.bn_recompute runs micro-batches on each process alone; it "
                          "cannot be combined with sync_bn=true")
    if cfg.schedule.warmup_epochs > cfg.epochs:
        raise ConfigError(
            f"schedule.warmup_epochs ({cfg.schedule.warmup_epochs}) is longer than the run "
            f"({cfg.epochs} epochs); lower --warmup-epochs"
        )
    _check_choice("compile_mode", cfg.compile_mode, COMPILE_MODES)
    if cfg.compile_mode != "default" and not cfg.compile:
        raise ConfigError(f"compile_mode={cfg.compile_mode} takes effect with compile=true only; "
                          "set both")
    _check_data(cfg)
    if cfg.checkpoint.resume not in (None, "auto") and not Path(cfg.checkpoint.resume).exists():
        raise ConfigError(f"--resume: checkpoint '{cfg.checkpoint.resume}' does not exist")
    _check_choices(cfg)
    return cfg


def _check_data(cfg: RunConfig) -> None:
    if cfg.data.train_subset is not None and cfg.data.train_subset < cfg.global_batch:
        raise ConfigError(
            f"--train-subset {cfg.data.train_subset} is smaller than the global batch "
            f"{cfg.global_batch}; use at least {cfg.global_batch} examples or a smaller batch"
        )
    if cfg.data.num_classes is not None:
        _check_positive("data.num_classes", cfg.data.num_classes)
    if cfg.data.val_subset is not None:
        _check_positive("data.val_subset", cfg.data.val_subset)
    if cfg.data.name in ("imagefolder", "packed", "webdataset") and not cfg.data.path:
        raise ConfigError(f"data '{cfg.data.name}' needs a folder: pass --data PATH")
    if cfg.data.decode_on_device:
        if cfg.data.name not in ("imagefolder", "packed", "webdataset"):
            raise ConfigError(f"data.decode_on_device decodes JPEG files; data "
                              f"'{cfg.data.name}' has none (use imagefolder, packed or webdataset)")
        if not cfg.data.normalize_on_device:
            raise ConfigError("data.decode_on_device needs data.normalize_on_device=true (the "
                              "device fills uint8 batches)")


def _check_geometry(cfg: RunConfig) -> None:
    """The batch geometry, built once: B a multiple of b, times the local processes where
    ``local_processes`` is a number ('auto' picks a count that divides)."""
    value = cfg.local_processes
    if value != "auto" and (not value.isdigit() or int(value) < 1):
        raise ConfigError(f"'local_processes' must be 'auto' or a positive number, got {value!r}")
    BatchGeometry(cfg.global_batch, cfg.micro_batch, 1 if value == "auto" else int(value))


def _check_choices(cfg: RunConfig) -> None:
    """Each named choice against the list its component defines. Imported here, not at the top:
    the components import torch, which the command line needs only once a run starts."""
    from bigbatch.data import DATASETS, ON_BROKEN
    from bigbatch.distributed import BACKENDS
    from bigbatch.optim import OPTIMIZERS
    from bigbatch.optim.schedule import SCALING_RULES, SCHEDULE_KINDS

    _check_choice("data.name", cfg.data.name, DATASETS)
    _check_model(cfg.model.name)
    _check_choice("data.on_broken", cfg.data.on_broken, ON_BROKEN)
    _check_choice("optim.name", cfg.optim.name, OPTIMIZERS)
    _check_choice("optim.lr_scaling", cfg.optim.lr_scaling, SCALING_RULES)
    _check_choice("schedule.kind", cfg.schedule.kind, SCHEDULE_KINDS)
    _check_choice("precision", cfg.precision, PRECISIONS)
    _check_choice("on_nonfinite", cfg.on_nonfinite, NONFINITE_POLICIES)
    _check_choice("backend", cfg.backend, BACKENDS)


def _get_dotted(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _check_model(name: str) -> None:
    from bigbatch.models import model_spec  # torch, and timm for timm: names

    try:
        model_spec(name)
    except ValueError as error:
        raise ConfigError(f"'model.name': {error}") from None


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"'{name}' is '{value}'; choose one of: {', '.join(choices)}")


def _check_positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"'{name}' must be a positive number, got {value}")


def _check_non_negative(name: str, value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise ConfigError(f"'{name}' must be zero or positive, got {value}")


def _check_range(name: str, value: float, low: float, high: float, upper_open: bool) -> None:
    ok = low <= value < high if upper_open else low <= value <= high
    if not ok:
        bracket = ")" if upper_open else "]"
        raise ConfigError(f"'{name}' must be in [{low}, {high}{bracket}, got {value}")


def resolve_config(
    recipe: str | None = None,
    config_file: str | None = None,
    overrides: list[str] | None = None,
    values: dict[str, Any] | None = None,
) -> RunConfig:
    """Recipe or file, then ``values`` ({dotted key: value}, from command-line flags), then the
    ``key=value`` overrides of --set, then validation: the config a run will use."""
    if recipe and config_file:
        raise ConfigError("pass either --recipe or --config, not both")
    if config_file:
        raw = load_config_file(config_file)
    else:
        raw = load_recipe(recipe or "fashion-mnist")
    for key, value in (values or {}).items():
        set_dotted(raw, key, value)
    raw = apply_overrides(raw, overrides or [])
    cfg = validate(config_from_dict(raw))
    if cfg.log.tensorboard:  # a run's need, not the config's: `bigbatch eval` writes no events
        from bigbatch.train.tensorboard import check_available

        check_available()
    return cfg
