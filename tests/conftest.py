"""Test-suite switches shared by every test file.

Tests that read Fashion-MNIST carry the ``fashion_mnist`` marker. Without the data they are
skipped on a developer's machine, and they *fail* where the data is required: with
BIGBATCH_REQUIRE_DATA=1 (``make test`` sets it, after installing the data) or under CI (the CI
variable that GitHub Actions, GitLab CI and most others set), so a suite cannot pass with every
world-size and fault test skipped. No test downloads the data.
"""

from __future__ import annotations

import os

import pytest

from bigbatch.data.fashion_mnist import SYSTEM_DIR


def data_required(environ=None) -> bool:
    """True when a missing Fashion-MNIST must fail the suite rather than skip tests."""
    env = os.environ if environ is None else environ
    if env.get("BIGBATCH_REQUIRE_DATA") is not None:
        return env["BIGBATCH_REQUIRE_DATA"] not in ("", "0")
    return env.get("CI", "").lower() not in ("", "0", "false")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fashion_mnist: reads Fashion-MNIST from " + str(SYSTEM_DIR)
        + " (skipped without it, failed without it when BIGBATCH_REQUIRE_DATA=1 or CI is set)")


# The test modules that hold most of make test's time (pytest --durations), run first: with
# pytest-xdist's --dist loadscope --no-loadscope-reorder each module goes whole to the next free
# worker in collection order, and the workers finish together only if no long module comes last.
LONGEST_FIRST = ("test_reliability.py", "test_train_cli.py", "test_distributed.py",
                 "test_exact_reduction.py", "test_safe_loading.py", "test_allreduce_bench.py",
                 "test_external_models.py", "test_gpu_script.py", "test_tensorboard.py")


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: every other module, and the tests within one, keep their order


def pytest_runtest_setup(item):
    if item.get_closest_marker("fashion_mnist") is None or SYSTEM_DIR.is_dir():
        return
    why = f"{SYSTEM_DIR} is absent (install the Debian package dataset-fashion-mnist)"
    if data_required():
        pytest.fail(f"{why}; this run requires the data (BIGBATCH_REQUIRE_DATA=1 or CI)",
                    pytrace=False)
    pytest.skip(why)
