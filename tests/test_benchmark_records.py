"""benchmarks/common.py's record writer: every line carries machine, commit, load and torch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import common  # noqa: E402


def test_the_writer_adds_what_a_record_lacks_and_keeps_what_it_has(tmp_path):
    path = common.append_result("x", {"value": 1, "machine": {"cpu": "given"}}, tmp_path)
    common.append_result("x", {"value": 2}, tmp_path)
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert first["value"] == 1 and first["machine"]["cpu"] == "given"
    for record in (first, second):
        machine = record["machine"]
        assert {"cpu_avx512", "cpu_native_bf16", "commit", "load_average"} <= set(machine)
        assert machine["versions"]["torch"]
        assert machine["commit"] is None or machine["commit"].rstrip("+dirty").isalnum()
