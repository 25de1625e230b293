"""The scaling planner: all-reduce cost formulas, the step model, the table, presets, the CLI."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from bigbatch.commands.plan import add_commands
from bigbatch.errors import ConfigError
from bigbatch.tools.plan.network import (
    Network,
    allreduce_seconds,
    network_from_allreduce_json,
    network_from_preset,
    ring_allreduce_seconds,
    tree_allreduce_seconds,
)
from bigbatch.tools.plan.paper import paper_predictions
from bigbatch.tools.plan.presets import (
    INTEL_CAFFE_HALF_BATCH,
    PAPER_RUNS,
    PRESETS,
    ZENITH_BATCH_EFFICIENCY,
    half_efficiency_batch,
)
from bigbatch.tools.plan.stats import NO_LOSSES, DeviceLosses, batch_efficiency
from bigbatch.tools.plan.workload import (
    BACKWARD_SHARE,
    Workload,
    devices_for_target,
    efficiency_crossover,
    estimate_step,
    power_of_two_counts,
    scaling_table,
)

EMULATED_CLUSTER = Path(__file__).resolve().parents[1] / "docs/results/scaling_planner.json"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bigbatch")
    add_commands(parser.add_subparsers())
    return parser.parse_args(["plan", *argv])


def run(argv: list[str], capsys) -> str:
    args = parse(argv)
    assert args.handler(args) == 0
    return capsys.readouterr().out


# A model small enough to need no registry: 1000 parameters = 4000 gradient bytes.
TOY = ["--model", "toy", "--params", "1000", "--flops", "1e6"]
# TOY with a device throughput and a network: enough for a prediction.
TOY_RUN = [*TOY, "--device-images-per-second", "10", "--alpha", "1e-6", "--beta", "1e-9"]


# ----------------------------------------------------------------------------- formulas


def test_ring_allreduce_by_hand():
    alpha, beta, n = 1e-3, 1e-6, 1000.0
    assert ring_allreduce_seconds(n, 1, alpha, beta) == 0.0
    # p=2: 2 steps of alpha; each link carries 2*1/2 = 1 message.
    assert ring_allreduce_seconds(n, 2, alpha, beta) == pytest.approx(2e-3 + 1e-3)
    # p=4: 6 steps; each link carries 2*3/4 = 1.5 messages.
    assert ring_allreduce_seconds(n, 4, alpha, beta) == pytest.approx(6e-3 + 1.5e-3)
    # p=3: 4 steps; 4/3 messages.
    assert ring_allreduce_seconds(n, 3, alpha, beta) == pytest.approx(4e-3 + 4 / 3 * 1e-3)


def test_tree_allreduce_by_hand():
    alpha, beta, n = 1e-3, 1e-6, 1000.0
    assert tree_allreduce_seconds(n, 1, alpha, beta) == 0.0
    assert tree_allreduce_seconds(n, 2, alpha, beta) == pytest.approx(2 * 1 * 2e-3)
    assert tree_allreduce_seconds(n, 8, alpha, beta) == pytest.approx(2 * 3 * 2e-3)


def test_flat_network_uses_the_plain_formulas():
    ring = Network(alpha=1e-4, beta=1e-8)
    tree = Network(alpha=1e-4, beta=1e-8, topology="tree")
    for p in (2, 3, 16):
        assert allreduce_seconds(5e6, p, ring) == ring_allreduce_seconds(5e6, p, 1e-4, 1e-8)
        assert allreduce_seconds(5e6, p, tree) == tree_allreduce_seconds(5e6, p, 1e-4, 1e-8)


def test_hierarchical_allreduce_is_intra_ring_plus_ring_over_nodes():
    network = Network(alpha=1e-5, beta=1e-9, devices_per_node=4, intra_alpha=1e-6, intra_beta=1e-10)
    n = 1e8
    # 8 devices = 2 nodes of 4: ring of 4 on the node links + ring of 2 over the nodes.
    expected = (6 * 1e-6 + 1.5 * n * 1e-10) + (2 * 1e-5 + 1.0 * n * 1e-9)
    assert allreduce_seconds(n, 8, network) == pytest.approx(expected)
    # Fewer devices than a node holds: only the intra-node ring.
    assert allreduce_seconds(n, 2, network) == pytest.approx(2 * 1e-6 + n * 1e-10)


def test_step_estimate_by_hand():
    # B=64 on 2 devices at 32 images/s: compute 1 s; 4000-byte gradient; alpha 0.1, beta 1e-4.
    workload = Workload(
        "toy", parameters=1000, forward_flops=1e6, dataset_size=640, epochs=3, global_batch=64
    )
    row = estimate_step(workload, 32.0, Network(alpha=0.1, beta=1e-4), 2, overlap=0.5)
    assert row.compute == pytest.approx(1.0)
    assert row.allreduce == pytest.approx(0.2 + 0.4)
    assert row.overlappable == pytest.approx(0.5 * BACKWARD_SHARE)
    assert row.exposed == pytest.approx(0.6 - 1 / 3)
    assert row.step == pytest.approx(1.0 + 0.6 - 1 / 3)
    assert row.steps_per_epoch == 10
    assert row.total == pytest.approx(3 * 10 * row.step)
    assert row.comm_compute_ratio == pytest.approx(0.6)
    assert row.efficiency == pytest.approx(1.0 / row.step)
    # Full overlap hides all of it; none hides nothing.
    assert estimate_step(workload, 32.0, Network(0.1, 1e-4), 2, overlap=1.0).exposed == 0.0
    assert estimate_step(
        workload, 32.0, Network(0.1, 1e-4), 2, overlap=0.0
    ).exposed == pytest.approx(0.6)


# ----------------------------------------------------------------------------- device losses


def test_batch_efficiency_by_hand():
    assert batch_efficiency(32, 8) == pytest.approx(0.8)
    assert batch_efficiency(8, 8) == pytest.approx(0.5)
    assert batch_efficiency(100, 0) == 1.0


def test_device_losses_by_hand():
    losses = DeviceLosses(half_batch=8, figure_batch=512, multinode_share=0.9)
    at_figure = 512 / 520
    assert losses.batch_factor(32) == pytest.approx(0.8 / at_figure)
    assert losses.factor(32, nodes=1) == pytest.approx(0.8 / at_figure)  # one node: all cores
    assert losses.factor(32, nodes=2) == pytest.approx(0.9 * 0.8 / at_figure)
    assert losses.batch_factor(4096) == 1.0  # never better than the published figure
    assert NO_LOSSES.factor(1, nodes=1000) == 1.0
    assert DeviceLosses(multinode_share=0.5).factor(1, nodes=2) == 0.5  # no curve without h


def test_step_estimate_with_device_losses_by_hand():
    # 2 single-device nodes, 32 images each at 32 images/s; the figure was taken at batch 512:
    # batch curve 0.8 / (512/520), times a compute share of 0.5 on more than one node.
    workload = Workload(
        "toy", parameters=1000, forward_flops=1e6, dataset_size=640, global_batch=64
    )
    losses = DeviceLosses(half_batch=8, figure_batch=512, multinode_share=0.5)
    kept = 0.8 / (512 / 520) * 0.5
    row = estimate_step(workload, 32.0, Network(alpha=0.0, beta=0.0), 2, 0.5, losses)
    assert row.device_factor == pytest.approx(kept)
    assert row.compute == pytest.approx(1.0 / kept)
    assert row.efficiency == pytest.approx(kept)  # the devices run at this share of their figure
    # Two devices of one node: the core share does not apply, the batch curve does.
    shared = Network(alpha=0.0, beta=0.0, devices_per_node=2)
    assert estimate_step(workload, 32.0, shared, 2, 0.5, losses).device_factor == pytest.approx(
        0.8 / (512 / 520)
    )


def test_bad_device_losses_are_config_errors():
    with pytest.raises(ConfigError, match="compute share"):
        DeviceLosses(multinode_share=0.0)
    with pytest.raises(ConfigError, match="half-efficiency"):
        DeviceLosses(half_batch=-1.0)
    with pytest.raises(ConfigError, match="figure batch"):
        DeviceLosses(half_batch=8.0, figure_batch=math.inf)


def test_half_efficiency_batch_from_the_zenith_points():
    # h = b (1/e - 1) at each point: 64 x 1/9, 32 x 17/83, (8192/314) x 24/76; their mean.
    by_hand = (64 / 9 + 32 * 17 / 83 + 8192 / 314 * 24 / 76) / 3
    assert half_efficiency_batch(ZENITH_BATCH_EFFICIENCY) == pytest.approx(by_hand)
    assert INTEL_CAFFE_HALF_BATCH.value == pytest.approx(7.30, abs=0.01)
    # The curve reproduces each anchor within 0.03.
    for batch, efficiency in ZENITH_BATCH_EFFICIENCY:
        assert batch_efficiency(batch, INTEL_CAFFE_HALF_BATCH.value) == pytest.approx(
            efficiency, abs=0.03
        )


def test_emulated_cluster_predictions_are_unchanged_and_within_25_percent():
    """Recompute every recorded prediction from its recorded inputs (no device losses)."""
    record = json.loads(EMULATED_CLUSTER.read_text())
    assert len(record["rows"]) == 12
    for row in record["rows"]:
        recorded = row["prediction"]
        workload = Workload(
            row["model"],
            recorded["gradient_bytes"] // 4,
            1.0,
            dataset_size=recorded["steps_per_epoch"] * row["global_batch"],
            epochs=1,
            global_batch=row["global_batch"],
        )
        network = Network(alpha=row["fit"]["alpha_s"], beta=row["fit"]["beta_s_per_byte"])
        rate = (row["global_batch"] / row["processes"]) / row["compute_s"]
        step = estimate_step(workload, rate, network, row["processes"], record["overlap"]).step
        assert step == pytest.approx(recorded["step"], rel=1e-9)
        assert 0.75 <= step / row["measured_s"] <= 1.25


def test_bf16_gradients_halve_the_bytes():
    fp32 = Workload("toy", 1000, 1e6)
    bf16 = Workload("toy", 1000, 1e6, gradient_bytes_per_parameter=2)
    assert fp32.gradient_bytes == 4000 and bf16.gradient_bytes == 2000


def test_exact_reduction_doubles_the_bytes_on_the_wire(capsys):
    """--precision exact: exact_reduction all-reduces int64 gradients, 8 bytes a parameter."""
    common = ["--model", "resnet50", "--preset", "knl-opa", "--devices", "2048", "--json"]
    fp32 = json.loads(run(common, capsys))
    exact = json.loads(run([*common, "--precision", "exact"], capsys))
    assert exact["workload"]["gradient_bytes_per_parameter"] == 8
    assert fp32["workload"]["gradient_bytes_per_parameter"] == 4
    assert exact["detail"]["allreduce"] > 1.5 * fp32["detail"]["allreduce"]  # latency is fixed
    assert exact["detail"]["compute"] == fp32["detail"]["compute"]


def test_steps_per_epoch_drops_the_partial_batch():
    assert Workload("r", 1, 1.0, global_batch=32768).steps_per_epoch == 39  # 1,281,167 / 32K
    assert Workload("r", 1, 1.0, global_batch=8192).steps_per_epoch == 156
    assert Workload("r", 1, 1.0, dataset_size=10, global_batch=64).steps_per_epoch == 1


# ----------------------------------------------------------------------------- the table


def test_efficiency_falls_with_devices_and_the_crossover_is_reported():
    workload = Workload("toy", parameters=25_000_000, forward_flops=8e9, global_batch=8192)
    network = Network(alpha=5e-6, beta=8.0 / 10e9)  # 10 Gbit/s
    rows = scaling_table(workload, 200.0, network, power_of_two_counts(4096))
    assert [r.devices for r in rows] == power_of_two_counts(4096)
    efficiencies = [r.efficiency for r in rows]
    assert all(a >= b for a, b in zip(efficiencies, efficiencies[1:], strict=False))
    assert efficiencies[0] == 1.0 and efficiencies[-1] < 0.5
    crossover = efficiency_crossover(rows)
    below = [r.devices for r in rows if r.efficiency < 0.5]
    assert crossover == below[0]
    assert all(r.efficiency >= 0.5 for r in rows if r.devices < crossover)
    assert efficiency_crossover(rows[:2]) is None


def test_table_stops_where_a_device_would_get_less_than_one_image():
    workload = Workload("toy", 1000, 1e6, global_batch=100)
    rows = scaling_table(workload, 10.0, Network(0.0, 0.0), power_of_two_counts(4096))
    assert rows[-1].devices == 64


def test_target_gives_the_fewest_devices_that_meet_it():
    workload = Workload(
        "toy", parameters=25_000_000, forward_flops=8e9, epochs=90, global_batch=32768
    )
    network = Network(alpha=1e-6, beta=8.0 / 100e9)
    answer = devices_for_target(workload, 100.0, network, target_seconds=3600.0)
    assert answer.met and answer.estimate.total <= 3600.0
    fewer = estimate_step(workload, 100.0, network, answer.estimate.devices - 1)
    assert fewer.total > 3600.0
    power = answer.smallest_power_of_two
    assert power is not None and power.devices >= answer.estimate.devices
    assert math.log2(power.devices).is_integer()
    impossible = devices_for_target(workload, 100.0, network, target_seconds=1.0, max_devices=256)
    assert not impossible.met and impossible.estimate.devices <= 256


# ----------------------------------------------------------------------------- presets


def test_presets_load_with_sourced_figures():
    assert {"knl-opa", "skx-opa", "p100-goyal", "a100-dgx", "h100-dgx"} <= set(PRESETS)
    for preset in PRESETS.values():
        network = network_from_preset(preset)
        assert network.beta > 0 and network.alpha > 0
        assert preset.device.reference_model in preset.device.images_per_second
        for figure in preset.device.images_per_second.values():
            assert figure.value > 0 and figure.source
            assert figure.estimate == figure.source.startswith("estimate")
    assert network_from_preset(PRESETS["knl-opa"]).beta == pytest.approx(8e-11)  # 100 Gbit/s
    assert network_from_preset(PRESETS["a100-dgx"]).devices_per_node == 8


def test_only_the_intel_caffe_presets_carry_device_losses():
    skx, knl = PRESETS["skx-opa"].device, PRESETS["knl-opa"].device
    assert skx.multinode_compute_share.value == pytest.approx(44 / 48)
    assert knl.multinode_compute_share.value == pytest.approx(62 / 68)
    for device in (skx, knl):
        assert device.half_efficiency_batch is INTEL_CAFFE_HALF_BATCH
        assert device.images_per_second["resnet50"].batch == 512
    for name in ("p100-goyal", "a100-dgx", "h100-dgx"):
        device = PRESETS[name].device
        assert device.half_efficiency_batch is None and device.multinode_compute_share is None


# Predicted / reported, fixed when the device losses were added (see scaling_planner.md).
# Without them (--ideal-device) AlexNet is outside the factor of 2; with them all three are
# inside, AlexNet only just.
PAPER_RATIOS = {"alexnet": 0.55, "resnet50-2048": 0.80, "resnet50-256": 0.64}
PAPER_RATIOS_IDEAL_DEVICE = {"alexnet": 0.47, "resnet50-2048": 0.51, "resnet50-256": 0.64}


def paper_key(run) -> str:
    return run.model if run.model == "alexnet" else f"{run.model}-{run.devices}"


@pytest.mark.parametrize(
    "ideal, expected", [(False, PAPER_RATIOS), (True, PAPER_RATIOS_IDEAL_DEVICE)]
)
def test_paper_predictions_against_reported_times(ideal, expected):
    ratios = {paper_key(p.run): p.ratio for p in paper_predictions(ideal_device=ideal)}
    assert ratios == pytest.approx(expected, abs=0.005)


def test_paper_per_step_breakdown_by_hand():
    items = {paper_key(p.run): p for p in paper_predictions()}
    alexnet = items["alexnet"].estimate
    # 32 images per SKX node: (32/39.3)/(512/519.3) of the batch curve, x 44/48 cores.
    h = INTEL_CAFFE_HALF_BATCH.value
    factor = (32 / (32 + h)) / (512 / (512 + h)) * 44 / 48
    assert alexnet.device_factor == pytest.approx(factor)
    assert alexnet.compute == pytest.approx(
        32 / (items["alexnet"].throughput.images_per_second * factor)
    )
    # 244 MB ring all-reduce over 1024 nodes at 100 Gbit/s, 1 us per step.
    nbytes = 60_965_224 * 4
    assert alexnet.allreduce == pytest.approx(2 * 1023 * 1e-6 + 2 * 1023 / 1024 * nbytes * 8e-11)
    knl = items["resnet50-2048"].estimate
    assert knl.device_factor == pytest.approx((16 / (16 + h)) / (512 / (512 + h)) * 62 / 68)
    assert knl.exposed == 0.0  # ResNet-50's all-reduce hides under backward
    # All three within a factor of 2 of the reported times (all still too fast).
    for item in items.values():
        assert 0.5 <= item.ratio < 1.0


def test_ideal_device_flag_drops_the_losses(capsys):
    ideal = json.loads(
        run(
            [
                "--model",
                "resnet50",
                "--preset",
                "knl-opa",
                "--devices",
                "2048",
                "--ideal-device",
                "--json",
            ],
            capsys,
        )
    )
    real = json.loads(
        run(["--model", "resnet50", "--preset", "knl-opa", "--devices", "2048", "--json"], capsys)
    )
    assert ideal["detail"]["device_factor"] == 1.0
    assert real["detail"]["device_factor"] < 0.7
    assert real["detail"]["compute"] == pytest.approx(
        ideal["detail"]["compute"] / real["detail"]["device_factor"]
    )


def test_paper_runs_carry_the_reported_times():
    reported = {(r.model, r.devices, r.global_batch): r.reported_minutes for r in PAPER_RUNS}
    assert reported == {
        ("alexnet", 1024, 32768): 11.0,
        ("resnet50", 2048, 32768): 20.0,
        ("resnet50", 256, 8192): 60.0,
    }
    assert all(r.preset in PRESETS for r in PAPER_RUNS)


def test_paper_command_prints_prediction_next_to_reported(capsys):
    rows = json.loads(run(["--paper", "--json"], capsys))
    assert [r["reported_minutes"] for r in rows] == [11.0, 20.0, 60.0]
    for row in rows:
        assert row["predicted_minutes"] > 0
        assert row["ratio"] == pytest.approx(row["predicted_minutes"] / row["reported_minutes"])
        assert row["throughput"]["source"]
    text = run(["--paper"], capsys)
    assert "11.0 m" in text and "20.0 m" in text and "60.0 m" in text
    assert "[ESTIMATE]" in text  # the KNL and SKX figures are derived, and say so


# ----------------------------------------------------------------------------- command line


def test_plan_command_breakdown_table_and_target(capsys):
    out = run(
        [
            *TOY,
            "--device-images-per-second",
            "1000",
            "--alpha",
            "1e-5",
            "--bandwidth-gbit",
            "1",
            "--batch-size",
            "4096",
            "--devices",
            "8",
            "--target-minutes",
            "60",
            "--json",
        ],
        capsys,
    )
    plan = json.loads(out)
    assert plan["detail"]["devices"] == 8
    assert plan["detail"]["compute"] == pytest.approx(4096 / 8 / 1000)
    assert plan["network"]["beta"] == pytest.approx(8e-9)
    assert [row["devices"] for row in plan["table"]] == power_of_two_counts(4096)
    assert plan["target"]["met"]
    text = run(
        [
            *TOY,
            "--device-images-per-second",
            "1000",
            "--alpha",
            "1e-5",
            "--beta",
            "8e-9",
            "--batch-size",
            "4096",
            "--devices",
            "8",
        ],
        capsys,
    )
    assert "scaling efficiency" in text and "time to train" in text


def test_plan_reads_alpha_beta_from_the_allreduce_bench(tmp_path, capsys):
    path = tmp_path / "ar.json"
    path.write_text(
        json.dumps({"world_size": 2, "fit": {"alpha_s": 2e-4, "beta_s_per_byte": 1e-9}})
    )
    network = network_from_allreduce_json(path)
    assert (network.alpha, network.beta, network.topology) == (2e-4, 1e-9, "ring")
    plan = json.loads(
        run(
            [*TOY, "--device-images-per-second", "50", "--allreduce-json", str(path), "--json"],
            capsys,
        )
    )
    assert plan["network"]["alpha"] == 2e-4


def test_plan_with_a_registered_model_and_a_preset(capsys):
    plan = json.loads(
        run(
            [
                "--model",
                "resnet50",
                "--preset",
                "a100-dgx",
                "--epochs",
                "90",
                "--target-minutes",
                "30",
                "--json",
            ],
            capsys,
        )
    )
    assert 25_000_000 < plan["workload"]["parameters"] < 26_000_000
    assert plan["throughput"]["images_per_second"] == 2470.0
    assert plan["target"]["met"] and plan["target"]["estimate"]["total"] <= 1800.0


def test_models_without_a_figure_are_flop_scaled_and_flagged(capsys):
    plan = json.loads(run(["--model", "resnet18", "--preset", "a100-dgx", "--json"], capsys))
    throughput = plan["throughput"]
    assert throughput["estimate"] and "FLOPs" in throughput["source"]
    assert throughput["images_per_second"] > 2470.0  # ResNet-18 is cheaper than ResNet-50


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--preset", "nope", *TOY], "unknown preset"),
        ([*TOY, "--device-images-per-second", "10"], "no network"),
        ([*TOY, "--alpha", "1e-6", "--beta", "1e-9"], "no device throughput"),
        ([*TOY_RUN, "--overlap", "1.5"], "overlap"),
        (
            [*TOY, "--device-images-per-second", "-1", "--alpha", "1e-6", "--beta", "1e-9"],
            "positive",
        ),
        ([*TOY, "--device-images-per-second", "10", "--alpha", "-1", "--beta", "1e-9"], "alpha"),
        ([*TOY_RUN, "--devices", "0"], "at least 1"),
        (
            ["--params", "1000", "--device-images-per-second", "10", "--alpha", "0", "--beta", "0"],
            "--params and --flops",
        ),
        (
            [*TOY, "--device-images-per-second", "10", "--allreduce-json", "/nonexistent.json"],
            "does not exist",
        ),
        ([*TOY_RUN, "--target-minutes", "0"], "target"),
        ([*TOY_RUN, "--epochs", "0"], "epochs"),
    ],
)
def test_bad_input_is_a_config_error(argv, message, capsys):
    args = parse(argv)
    with pytest.raises(ConfigError, match=message):
        args.handler(args)


def test_bad_allreduce_json_is_a_config_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"fit": {"alpha_s": 1e-4}}))
    with pytest.raises(ConfigError, match="not a `bigbatch bench allreduce` result"):
        network_from_allreduce_json(path)


def test_unknown_topology_is_a_config_error():
    with pytest.raises(ConfigError, match="topology"):
        Network(alpha=0.0, beta=0.0, topology="butterfly")
