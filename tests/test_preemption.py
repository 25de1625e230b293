"""Preemption signals are caught from the start of `bigbatch train`, not only in its loop."""

import signal
import subprocess
import sys
import time

import pytest
from launch import TINY

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



# A finished `bigbatch train`, then the C library's exit handlers, which run after the
# interpreter's shutdown has put Python's signal handlers back to the default: pause() there holds
# the process at that point of its exit (where torch's teardown takes its time) until a signal.
EXITING = """
import ctypes, sys
from bigbatch.commands import main
code = main({argv!r})
libc = ctypes.CDLL(None)
libc.__cxa_atexit(ctypes.cast(libc.pause, ctypes.c_void_p), None, None)
print("exiting", code, flush=True)
sys.exit(code)
"""


def held_in_exit(argv: list[str]) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", EXITING.format(argv=argv)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in child.stdout:  # the command's own output (its summary), then "exiting"
        if line.startswith("exiting"):
            break
    else:
        raise AssertionError(child.communicate(timeout=60)[1][-3000:])
    # Past the print, the interpreter shuts down and then pauses: until its state reads "S"
    # (sleeping in pause) no signal is sent.
    for _ in range(600):
        if child.poll() is not None or _sleeping(child.pid):
            break
        time.sleep(0.05)
    return child


def _sleeping(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "S"


@pytest.mark.fashion_mnist
@pytest.mark.parametrize("name", ["SIGUSR1", "SIGTERM"])
def test_a_signal_while_a_finished_run_exits_does_not_end_it(tmp_path, name):
    # SLURM warned a requeued job that had just finished; the signal came while torch was tearing
    # down and ended the process by the signal ("died by signal: 10", the job FAILED).
    child = held_in_exit(["train", *TINY, "--local-processes", "1", "--out", str(tmp_path)])
    try:
        child.send_signal(getattr(signal, name))
        with pytest.raises(subprocess.TimeoutExpired):  # the signal is ignored: still in pause()
            child.wait(timeout=2)
    finally:
        child.kill()
        child.communicate(timeout=60)
    assert (tmp_path / "summary.json").is_file()
