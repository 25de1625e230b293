"""Progress when stderr is not a terminal: a line every N steps and at least every M seconds."""

import io
import re
from dataclasses import dataclass

import pytest
from launch import TINY, run_bigbatch

from bigbatch.config import LogConfig
from bigbatch.metrics import read_metrics
from bigbatch.train.progress import ProgressBar, ProgressLines, progress_for

LINE = re.compile(r"step (\d+)/(\d+) \(epoch ([\d.]+)\): loss ([\d.]+), lr ([\d.e+-]+), "
                  r"(\d+) images/s, ETA (\d+:\d\d:\d\d)")


@dataclass
class Step:
    lr: float = 0.1
    loss: float = 2.5
    examples: float = 256
    seconds: float = 0.5


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def steps_with_lines(total, done, every_steps, every_seconds, times):
    """Feed steps done+1.. at the clock readings ``times``; the steps that got a line."""
    clock, lines = FakeClock(), []
    progress = ProgressLines(total, done, 4, every_steps, every_seconds, clock=clock,
                             emit=lines.append)
    logged = []
    for step, now in enumerate(times, start=done + 1):
        clock.now = now
        before = len(lines)
        progress.update(step, Step())
        if len(lines) > before:
            logged.append(step)
    return logged, lines


def test_a_line_every_n_steps_at_their_multiples_and_at_the_last_step():
    logged, _ = steps_with_lines(8, 0, 3, 0, [float(s) for s in range(1, 9)])
    assert logged == [3, 6, 8]


def test_a_resumed_run_keeps_the_multiples_of_n():
    logged, _ = steps_with_lines(8, 4, 3, 0, [float(s) for s in range(1, 5)])
    assert logged == [6, 8]


def test_at_least_a_line_every_m_seconds():
    # steps end at these seconds; a line when 60 s have passed since the previous one
    logged, _ = steps_with_lines(10, 0, 0, 60, [10, 20, 59, 61, 100, 120, 121, 150, 180, 182])
    assert logged == [4, 7, 10]  # 61 s; 121 - 61 = 60 s; the last step


def test_fast_steps_follow_the_step_rule_slow_steps_the_clock():
    fast, _ = steps_with_lines(200, 0, 50, 60, [float(s) for s in range(1, 201)])
    assert fast == [50, 100, 150, 200]
    slow, _ = steps_with_lines(12, 0, 50, 60, [25.0 * s for s in range(1, 13)])
    assert slow == [3, 6, 9, 12]


def test_the_line_says_step_epoch_loss_lr_throughput_and_eta():
    clock, lines = FakeClock(), []
    progress = ProgressLines(100, 0, 40, 10, 0, clock=clock, emit=lines.append)
    for step in range(1, 21):
        clock.now = 2.0 * step  # 2 s a step: 90 steps left are 3 minutes, 80 are 2:40
        seconds = 0.5 if step <= 10 else 1.0  # images/s since the previous line
        progress.update(step, Step(lr=0.25, loss=1.23456, examples=512, seconds=seconds))
    assert lines == [
        "step 10/100 (epoch 0.25): loss 1.2346, lr 0.25, 1024 images/s, ETA 0:03:00",
        "step 20/100 (epoch 0.50): loss 1.2346, lr 0.25, 512 images/s, ETA 0:02:40",
    ]


def test_a_terminal_gets_the_bar_a_file_gets_lines_other_ranks_nothing():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    settings = LogConfig()
    bar = progress_for(True, settings, 10, 0, 5, stream=Terminal())
    assert isinstance(bar, ProgressBar)
    bar.close()
    assert isinstance(progress_for(True, settings, 10, 0, 5, stream=io.StringIO()), ProgressLines)
    assert progress_for(False, settings, 10, 0, 5, stream=io.StringIO()) is None


@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_a_run_with_stderr_in_a_file_prints_the_lines(tmp_path):
    out = tmp_path / "run"
    result = run_bigbatch(["train", *TINY, "--set", "log.progress_every_steps=3",
                           "--set", "log.progress_every_seconds=0", "--out", str(out)])
    found = [LINE.search(line) for line in result.stderr.splitlines()]
    found = [match for match in found if match]
    assert [int(match[1]) for match in found] == [3, 6, 8]
    assert {int(match[2]) for match in found} == {8}
    losses = {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl")
              if r["kind"] == "train"}
    for match in found:
        step = int(match[1])
        assert float(match[3]) == pytest.approx(step / 4)  # 4 steps an epoch
        assert float(match[4]) == pytest.approx(losses[step], abs=1e-4)
