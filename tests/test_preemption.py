"""Preemption signals are caught from the start of `bigbatch train`, not only in its loop."""

import signal
import subprocess
import sys

import pytest

EARLY_SIGNAL = """
import os, signal
from bigbatch.train import preemption
preemption.catch_early()
os.kill(os.getpid(), signal.{name})           # before the training loop
stop = preemption.StopRequest().install()     # the loop's request takes the signal over
print(stop.requested, stop.signal_name)
stop.uninstall()
os.kill(os.getpid(), signal.{name})           # after the loop: the run goes on to finish
print("still running")
"""


@pytest.mark.parametrize("name", ["SIGUSR1", "SIGTERM"])
def test_a_signal_before_the_loop_stops_the_run_after_it_starts(name):
    result = subprocess.run([sys.executable, "-c", EARLY_SIGNAL.format(name=name)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == [f"True {name}", "still running"]


def test_without_the_early_catch_the_signal_ends_the_process():
    # The control: SIGUSR1's default action, which SLURM's warning met before this change.
    code = "import os, signal; os.kill(os.getpid(), signal.SIGUSR1); print('alive')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == -signal.SIGUSR1 and "alive" not in result.stdout

