"""The scaling planner: all-reduce cost formulas, the step model, the table, presets, the CLI."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from bigbatch.errors import ConfigError
from bigbatch.plan import (
    BACKWARD_SHARE,
    Network,
    Workload,
    add_plan_command,
    allreduce_seconds,
    devices_for_target,
    efficiency_crossover,
    estimate_step,
    network_from_allreduce_json,
    network_from_preset,
    power_of_two_counts,
    ring_allreduce_seconds,
    scaling_table,
    tree_allreduce_seconds,
)
from bigbatch.plan_presets import PAPER_RUNS, PRESETS


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bigbatch")
    add_plan_command(parser.add_subparsers())
    return parser.parse_args(["plan", *argv])


def run(argv: list[str], capsys) -> str:
    args = parse(argv)
    assert args.handler(args) == 0
    return capsys.readouterr().out


# A model small enough to need no registry: 1000 parameters = 4000 gradient bytes.
TOY = ["--model", "toy", "--params", "1000", "--flops", "1e6"]


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


def test_bf16_gradients_halve_the_bytes():
    fp32 = Workload("toy", 1000, 1e6)
    bf16 = Workload("toy", 1000, 1e6, gradient_bytes_per_parameter=2)
    assert fp32.gradient_bytes == 4000 and bf16.gradient_bytes == 2000


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
        (
            [
                *TOY,
                "--device-images-per-second",
                "10",
                "--alpha",
                "1e-6",
                "--beta",
                "1e-9",
                "--overlap",
                "1.5",
            ],
            "overlap",
        ),
        (
            [*TOY, "--device-images-per-second", "-1", "--alpha", "1e-6", "--beta", "1e-9"],
            "positive",
        ),
        ([*TOY, "--device-images-per-second", "10", "--alpha", "-1", "--beta", "1e-9"], "alpha"),
        (
            [
                *TOY,
                "--device-images-per-second",
                "10",
                "--alpha",
                "1e-6",
                "--beta",
                "1e-9",
                "--devices",
                "0",
            ],
            "at least 1",
        ),
        (
            ["--params", "1000", "--device-images-per-second", "10", "--alpha", "0", "--beta", "0"],
            "--params and --flops",
        ),
        (
            [*TOY, "--device-images-per-second", "10", "--allreduce-json", "/nonexistent.json"],
            "does not exist",
        ),
        (
            [
                *TOY,
                "--device-images-per-second",
                "10",
                "--alpha",
                "1e-6",
                "--beta",
                "1e-9",
                "--target-minutes",
                "0",
            ],
            "target",
        ),
        (
            [
                *TOY,
                "--device-images-per-second",
                "10",
                "--alpha",
                "1e-6",
                "--beta",
                "1e-9",
                "--epochs",
                "0",
            ],
            "epochs",
        ),
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
