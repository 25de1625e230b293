"""Training: the loop (trainer), resume policy, non-finite handling, the run's record, and the
per-step pieces the loop calls (BatchNorm statistics, timing, preemption)."""

from bigbatch.train.nonfinite import NonFiniteLoss
from bigbatch.train.trainer import Preempted, Trainer, train

__all__ = ["NonFiniteLoss", "Preempted", "Trainer", "train"]
