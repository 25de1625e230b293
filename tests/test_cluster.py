"""The fault matrix on a real small cluster: torchrun agents on network-namespace nodes joined by
a bridge (tests/netns_cluster.py, tests/cluster_scenarios.py), gloo across the links.

`make test-cluster` runs it (root and iproute2; skipped with the reason elsewhere, failed instead
with BIGBATCH_REQUIRE_CLUSTER=1). Each test is one row of docs/RELIABILITY.md's table, which
benchmarks/cluster_faults.py records.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import netns_cluster
import pytest
from cluster_scenarios import SCENARIOS, TIMEOUT, reference_run, run_scenario

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
WHY_NOT = netns_cluster.unavailable()
if WHY_NOT and os.environ.get("BIGBATCH_REQUIRE_CLUSTER") == "1":
    raise RuntimeError(f"BIGBATCH_REQUIRE_CLUSTER=1 but {WHY_NOT}")
if WHY_NOT:
    pytest.skip(WHY_NOT, allow_module_level=True)

DETECT_WITHIN = 30.0  # seconds: the matrix's bound; the runs' collective_timeout is TIMEOUT
ROWS: dict[str, dict] = {}


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cluster")


@pytest.fixture(scope="module")
def reference(work) -> Path:
    return reference_run(work / "reference")


def net_of(name: str) -> int:
    return 90 + list(SCENARIOS).index(name)


def address(name: str, node: int) -> str:
    return f"10.{net_of(name)}.0.{node}"


def row_of(name: str, work: Path, reference: Path) -> dict:
    if name not in ROWS:
        ROWS[name] = run_scenario(SCENARIOS[name], work, reference, net=net_of(name))
    return ROWS[name]


def survivor_log(work: Path, name: str, node: int = 1) -> str:
    return (work / name / "logs" / f"node{node}.log").read_text(errors="replace")


def assert_same_answer(row: dict) -> None:
    assert row["finished"], row
    assert row["weights_and_bn"] and row["losses"] and row["continuous_steps"], row
    assert row["leftover_namespaces"] == [], row


def test_clean_run_across_the_link_is_the_one_process_run(work, reference):
    row = row_of("clean", work, reference)
    assert_same_answer(row)
    assert row["restarts"] == 0 and row["exit_codes"] == {1: 0, 2: 0}


def test_a_200_mbit_link_is_seen_in_the_communication_time(work, reference):
    """A step's communication cannot take less than the link needs for the bytes the step sends
    (node 1's interface counter over the run, per step): at least 0.7 of that floor is seen. An
    unshaped link carries the same bytes in a fraction of it."""
    row = row_of("shaped_200mbit", work, reference)
    assert_same_answer(row)
    floor = row["sent_bytes_per_step"] * 8 / 200e6
    assert row["comm_exposed_median"] >= 0.7 * floor, (row, floor)


def test_a_link_cut_for_good_is_named_and_the_survivor_finishes_alone(work, reference):
    row = row_of("link_cut", work, reference)
    assert row["detect_seconds"] is not None and row["detect_seconds"] <= DETECT_WITHIN, row
    assert row["restarts"] >= 1 and row["exit_codes"][1] == 0, row
    assert_same_answer(row)
    line = re.search(r"ERROR (.*stopped answering.*)", survivor_log(work, "link_cut")).group(1)
    # The lost peer is named by its address, whole ("10.92.0.2", not a prefix of "10.92.0.21").
    lost = re.escape(address("link_cut", 2))
    assert re.search(rf"(?<![\d.]){lost}(?!\d)", line.split("answering")[1]), line
    assert f"timed out (collective_timeout {TIMEOUT} s)" in line


def test_a_link_cut_for_ten_seconds_still_gives_the_same_answer(work, reference):
    assert_same_answer(row_of("link_cut_10s", work, reference))


def test_a_frozen_node_is_detected_and_the_run_goes_on_without_it(work, reference):
    row = row_of("node_frozen", work, reference)
    assert row["detect_seconds"] is not None and row["detect_seconds"] <= DETECT_WITHIN, row
    assert row["restarts"] >= 1
    assert_same_answer(row)


def test_the_store_host_killed_stops_the_job_with_one_line_and_a_relaunch_resumes(work,
                                                                                  reference):
    row = row_of("store_host_killed", work, reference)
    assert row["exit_codes"][2] not in (0, None), row  # the survivor stopped
    line = row["stop_line"] or ""
    assert re.search(r"store \(.*\) cannot be reached either|stopped answering", line), row
    assert row["exit_codes_again"] == {1: 0, 2: 0}, row
    assert_same_answer(row)


def test_a_node_that_joins_mid_run_is_taken_in(work, reference):
    row = row_of("node_joins", work, reference)
    assert row["restarts"] >= 1, row
    assert_same_answer(row)
    assert '"world_size": 2' in survivor_log(work, "node_joins")


def test_a_rank_killed_while_writing_a_checkpoint_resumes_from_a_valid_one(work, reference):
    row = row_of("killed_in_checkpoint", work, reference)
    assert row["restarts"] >= 1, row
    assert_same_answer(row)


def test_the_node_on_a_tenth_of_the_bandwidth_is_named_the_straggler(work, reference):
    row = row_of("straggler_link", work, reference)
    assert_same_answer(row)
    slow = address("straggler_link", 3)
    named = [s for s in row["stragglers"] if s["kind"] == "link"]
    assert named and slow in named[0]["host"], row["stragglers"]
    assert all(slow in s["host"] for s in named), row["stragglers"]
    assert "straggler rank" in survivor_log(work, "straggler_link")
