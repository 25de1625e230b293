"""The suite's data switch: without Fashion-MNIST a marked test skips, or fails where required."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import data_required

TESTS = Path(__file__).parent

# Runs pytest on one marked test with the conftest's data folder pointed somewhere empty.
RUNNER = """
import sys, pathlib, pytest
sys.path.insert(0, {tests!r})
import conftest
conftest.SYSTEM_DIR = pathlib.Path({missing!r})
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", {test!r}], plugins=[conftest]))
"""


@pytest.mark.parametrize("env, required", [
    ({}, False),
    ({"CI": "true"}, True),
    ({"CI": "false"}, False),
    ({"BIGBATCH_REQUIRE_DATA": "1"}, True),
    ({"BIGBATCH_REQUIRE_DATA": "0", "CI": "true"}, False),  # an explicit 0 wins
])
def test_data_is_required_under_ci_or_when_asked(env, required):
    assert data_required(env) is required


@pytest.mark.parametrize("require, exit_code, word", [("0", 0, "skipped"), ("1", 1, "error")])
def test_missing_data_skips_or_fails(tmp_path, require, exit_code, word):
    test = tmp_path / "test_needs_data.py"
    test.write_text("import pytest\n\n@pytest.mark.fashion_mnist\ndef test_x():\n    pass\n")
    code = RUNNER.format(tests=str(TESTS), missing=str(tmp_path / "absent"), test=str(test))
    env = {"BIGBATCH_REQUIRE_DATA": require, "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == exit_code, run.stdout[-2000:]
    assert f"1 {word}" in run.stdout
    if word == "error":  # a setup failure: the test never ran
        assert "dataset-fashion-mnist" in run.stdout and "BIGBATCH_REQUIRE_DATA" in run.stdout



def test_the_longest_modules_are_collected_first():
    """Every module named in LONGEST_FIRST exists (a rename would silently drop it from the
    front); the hook moves their tests to the front in that order and keeps every other order."""
    from types import SimpleNamespace

    from conftest import LONGEST_FIRST, pytest_collection_modifyitems

    assert all((TESTS / name).is_file() for name in LONGEST_FIRST)
    names = ["test_a.py", LONGEST_FIRST[1], "test_b.py", LONGEST_FIRST[0], "test_a.py",
             LONGEST_FIRST[1]]
    items = [SimpleNamespace(path=TESTS / name, index=i) for i, name in enumerate(names)]
    pytest_collection_modifyitems(items)
    assert [item.index for item in items] == [3, 1, 5, 0, 2, 4]
