"""The planner against published runs it was not fitted to (``bigbatch plan --published``).

The runs, and every input of their predictions with its label ('measured' with its record,
'specification' with its source, or 'assumption' with its reason), are in ``published.json``
next to this module; ``prediction`` turns a run into minutes. Each run's ratio (predicted /
published) is held to its group's band; a run outside its band carries its cause in the data file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bigbatch.errors import ConfigError
from bigbatch.tools.plan.prediction import RunPrediction, calibrate, make_context, predict_run
from bigbatch.tools.plan.presets import PRESETS

DATA_FILE = Path(__file__).with_name("published.json")
LABELS = ("measured", "specification", "assumption")


def load_published(path: str | Path = DATA_FILE) -> dict[str, Any]:
    """The data file, checked: every run names a known device and network, every input a label."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"published runs file {path} does not exist") from None
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not JSON: {error}") from None
    for key in ("runs", "devices", "networks", "inputs", "bands", "calibration"):
        if key not in data:
            raise ConfigError(f"{path} has no '{key}'")
    for where, item in labelled_inputs(data):
        if item.get("label") not in LABELS:
            raise ConfigError(
                f"{path}: {where} is labelled {item.get('label')!r}, not one of {', '.join(LABELS)}"
            )
        if not item.get("source") or (item["label"] == "measured" and not item.get("record")):
            raise ConfigError(
                f"{path}: {where} has no source"
                + (" or record" if item["label"] == "measured" else "")
            )
    for run in data["runs"]:
        for key, table in (("device", "devices"), ("network", "networks")):
            if run.get(key) not in data[table]:
                raise ConfigError(
                    f"{path}: run {run.get('id')} names unknown {key} {run.get(key)!r}"
                )
    return data


def labelled_inputs(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every input of the model in the data file, with where it is: (path, {value, label, ...})."""
    for key in ("dataset_images", "eval_images"):
        yield key, data.get(key, {})
    for key, item in data["inputs"].items():
        yield f"inputs.{key}", item
    for name, device in data["devices"].items():
        for key in ("peak_flops", "memory_bandwidth", "throughput"):
            yield f"devices.{name}.{key}", device.get(key, {})
    keys = ("intra_bandwidth_gbit", "intra_alpha_s", "bandwidth_gbit", "alpha_s")
    for name, network in data["networks"].items():
        if "preset" in network:
            yield from preset_network_inputs(name, network["preset"])
            continue
        for key in keys:
            yield f"networks.{name}.{key}", network.get(key, {})


def preset_network_inputs(name: str, preset: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A preset's network figures (presets.py), labelled: a derived figure is an assumption."""
    if preset not in PRESETS:
        raise ConfigError(f"network {name} names unknown preset {preset!r}")
    spec = PRESETS[preset].network
    figures = {
        "intra_bandwidth_gbit": spec.intra_bandwidth_gbit,
        "intra_alpha_s": spec.intra_alpha_s,
        "bandwidth_gbit": spec.bandwidth_gbit,
        "alpha_s": spec.alpha_s,
    }
    for key, figure in figures.items():
        if figure is not None:
            label = "assumption" if figure.estimate else "specification"
            yield (
                f"networks.{name}.{key}",
                {"value": figure.value, "label": label, "source": figure.source},
            )


def with_inputs(data: dict[str, Any], changes: dict[str, float]) -> dict[str, Any]:
    """The data file with some ``inputs`` values replaced (a what-if; labels say so)."""
    inputs = dict(data["inputs"])
    for key, value in changes.items():
        if key not in inputs:
            raise ConfigError(f"unknown published-run input {key!r}; known: {', '.join(inputs)}")
        inputs[key] = {
            **inputs[key],
            "value": value,
            "label": "assumption",
            "source": f"set on the command line (was {inputs[key]['value']})",
        }
    return {**data, "inputs": inputs}


def run_row(
    item: RunPrediction, calibration: str, known: dict[str, str], bands: dict[str, Any]
) -> dict[str, Any]:
    run, phases = item.run, item.phases
    band = bands[run["group"]]
    return {
        "id": run["id"],
        "group": run["group"],
        "label": run["label"],
        "hardware": run["device"],
        "devices": run["devices"],
        "global_batch": [phase.global_batch for phase in phases],
        "per_device_batch": [phase.local_batch for phase in phases],
        "epochs": sum(phase.epochs for phase in phases),
        "published_minutes": run["published_minutes"],
        "predicted_minutes": item.predicted_minutes,
        "ratio": item.ratio,
        "band": [band["low"], band["high"]],
        "in_band": band["low"] <= item.ratio <= band["high"],
        "calibration": run["id"] == calibration,
        "known_miss": known.get(run["id"]),
        "step_ms": [phase.step * 1e3 for phase in phases],
        "compute_ms": [phase.compute * 1e3 for phase in phases],
        "allreduce_ms": [phase.allreduce * 1e3 for phase in phases],
        "exposed_ms": [phase.exposed * 1e3 for phase in phases],
        "evaluation_s": item.evaluation_s,
        "overlap": item.overlap,
        "fixed_ms": item.curve.training.fixed_s * 1e3,
        "per_image_ms": item.curve.training.per_image_s * 1e3,
        "source": run["source"],
        "assumptions": run["assumptions"],
    }


def paper_rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The paper's own runs, as ``bigbatch plan --paper`` predicts them (tools/plan/paper.py)."""
    from bigbatch.tools.plan.paper import paper_predictions

    wanted = {row["label"] for row in data["paper_rows"]}
    band, known = data["bands"]["paper"], data["known_misses"]
    rows = []
    for item in paper_predictions():
        if item.run.label not in wanted:
            continue
        rows.append(
            {
                "id": item.run.label,
                "group": "paper",
                "label": item.run.label,
                "hardware": item.run.preset,
                "devices": item.run.devices,
                "global_batch": [item.run.global_batch],
                "per_device_batch": [item.estimate.local_batch],
                "epochs": item.run.epochs,
                "published_minutes": item.run.reported_minutes,
                "predicted_minutes": item.predicted_minutes,
                "ratio": item.ratio,
                "band": [band["low"], band["high"]],
                "in_band": band["low"] <= item.ratio <= band["high"],
                "calibration": False,
                "known_miss": known.get(item.run.label),
                "source": item.run.source,
            }
        )
    return rows


def published_predictions(
    changes: dict[str, float] | None = None, path: str | Path = DATA_FILE
) -> dict[str, Any]:
    """Every published run predicted, the fitted constant, the speed-up check and the inputs."""
    data = with_inputs(load_published(path), changes or {})
    ctx = make_context(data)
    speedup = calibrate(ctx)
    items = {run["id"]: predict_run(run, speedup, ctx) for run in data["runs"]}
    calibration = data["calibration"]["run"]
    rows = [
        run_row(item, calibration, data["known_misses"], data["bands"]) for item in items.values()
    ]
    check = data["speedup"]
    first, last = items[check["from"]], items[check["to"]]
    published = first.run["published_minutes"] / last.run["published_minutes"]
    predicted = first.total_s / last.total_s
    return {
        "calibration": {**data["calibration"], "value": speedup},
        "rows": rows + paper_rows(data),
        "speedup": {
            **check,
            "published": published,
            "predicted": predicted,
            "ratio": predicted / published,
            "in_band": check["low"] <= predicted / published <= check["high"],
        },
        "inputs": dict(labelled_inputs(data)),
        "devices": {name: device["description"] for name, device in data["devices"].items()},
        "layers": ctx.counts.__dict__,
        "parameters": ctx.parameters,
    }
