"""The fault matrix on network-namespace nodes, recorded: docs/results/cluster_faults.jsonl.

    python benchmarks/cluster_faults.py [--scenarios clean,link_cut,...] [--no-save]

Runs the scenarios of tests/cluster_scenarios.py (the rows tests/test_cluster.py asserts on:
a clean run across the link, a 200 Mbit/s link, a link cut for good and for 10 s, a frozen node,
the rendezvous store's node killed, a node joining, a rank killed while writing a checkpoint, one
node at a tenth of the bandwidth) one after another and appends one line per scenario: nodes,
steps, restarts, seconds to detect and to recover, bit-identical or not (final weights and
BatchNorm statistics and per-step losses against the same run on one process), the stragglers
named, and the machine and commit. Needs root and iproute2, like the tests.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import netns_cluster  # noqa: E402
from cluster_scenarios import SCENARIOS, reference_run, run_scenario  # noqa: E402
from common import report  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="comma-separated scenario names (default: all)")
    parser.add_argument("--no-save", dest="save", action="store_false",
                        help="print the rows without appending them to the record")
    args = parser.parse_args()
    names = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    why_not = netns_cluster.unavailable()
    if why_not:
        print(f"cluster_faults: {why_not}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="cluster-faults-") as folder:
        work = Path(folder)
        reference = reference_run(work / "reference")
        for index, name in enumerate(names):
            row = run_scenario(SCENARIOS[name], work, reference, net=100 + index)
            report("cluster_faults", {"benchmark": "cluster_faults", **row}, args.save)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
