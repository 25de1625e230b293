"""Data parallel on real gloo processes: the same global batch gives the same run at any scale."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launch import (
    TINY,
    VAL_EXAMPLES,
    final_state,
    free_port,
    max_relative_difference,
    process_env,
    run_bigbatch,
    summary,
    train_losses,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.fashion_mnist,
]


@pytest.fixture(scope="module")
def single_process_run(tmp_path_factory):
    """1 process x 4 accumulation steps: the reference for every other layout."""
    out = tmp_path_factory.mktemp("w1") / "run"
    run_bigbatch(["train", *TINY, "--out", str(out)])
    return out


@pytest.mark.parametrize("nproc", [2, 4])
def test_world_size_invariance(single_process_run, tmp_path, nproc):
    """2 processes x 2 accumulation steps and 4 x 1 match 1 x 4: losses and every tensor."""
    out = tmp_path / "run"
    run_bigbatch(["train", *TINY, "--out", str(out)], nproc=nproc,
                 agent=nproc == 2)  # 4 ranks without torchrun's agent: one process start fewer
    reference = summary(single_process_run)
    assert summary(out)["world_size"] == nproc
    assert summary(out)["accumulation_steps"] == 4 // nproc
    assert reference["accumulation_steps"] == 4
    losses, reference_losses = train_losses(out), train_losses(single_process_run)
    assert len(losses) == len(reference_losses) == 8
    for ours, theirs in zip(losses, reference_losses, strict=True):
        assert ours == pytest.approx(theirs, rel=1e-5)
    # parameters *and* BatchNorm running statistics
    assert max_relative_difference(final_state(out), final_state(single_process_run)) < 1e-5
    assert summary(out)["top1"] == pytest.approx(reference["top1"], abs=0.02)


def test_bf16_runs_agree_across_world_sizes_in_their_losses(tmp_path):
    """bf16 autocast (the default recipe's precision on native-bf16 hardware): the same run in
    its losses (measured 7e-5), not the same bits in its weights (docs/DISTRIBUTED.md)."""
    bf16 = [*TINY[: TINY.index("precision=fp32")], "precision=bf16"]
    runs = {}
    for nproc in (1, 2):
        runs[nproc] = tmp_path / f"w{nproc}"
        run_bigbatch(["train", *bf16, "--out", str(runs[nproc])], nproc=nproc, agent=False)
    for ours, theirs in zip(train_losses(runs[2]), train_losses(runs[1]), strict=True):
        assert ours == pytest.approx(theirs, rel=1e-3)
    assert max_relative_difference(final_state(runs[2]), final_state(runs[1])) < 0.1


def test_sync_bn_on_cpu_is_one_line_and_exit_2(tmp_path):
    """PyTorch's SyncBatchNorm runs on GPUs only: on CPU processes sync_bn=true is refused in
    one line (it was a traceback from every rank). Its GPU behaviour is untested here."""
    result = run_bigbatch(["train", *TINY, "--set", "sync_bn=true", "--out", str(tmp_path)],
                          nproc=2, check=False, agent=False)
    assert result.returncode != 0
    assert result.stderr.count("bigbatch: error: sync_bn=true needs CUDA GPUs") == 2  # each rank
    assert "Traceback" not in result.stderr and "ValueError" not in result.stderr


def test_two_torchrun_agents_match_one_process(single_process_run, tmp_path):
    """--nnodes 2 with c10d rendezvous on 127.0.0.1: two 'nodes' of one process each."""
    out = tmp_path / "run"
    port = free_port()
    agents = []
    for node_rank in (0, 1):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            f"--node-rank={node_rank}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=bigbatch-test",
            "-m",
            "bigbatch",
            "train",
            *TINY,
            "--out",
            str(out),
        ]
        agents.append((command, process_env()))
    run_concurrently(agents)
    assert summary(out)["world_size"] == 2
    assert max_relative_difference(final_state(out), final_state(single_process_run)) < 1e-5


def test_slurm_tasks_match_one_process(single_process_run, tmp_path):
    """What `srun --ntasks 2 bigbatch train` starts: two processes that know their place only
    from SLURM's variables (no torchrun), the master taken from the node list."""
    out = tmp_path / "run"
    port = str(free_port())
    tasks = []
    for task in (0, 1):
        slurm = {
            "SLURM_PROCID": str(task),
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": str(task),
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "127.0.0.1",
            "MASTER_PORT": port,
        }
        command = [sys.executable, "-m", "bigbatch", "train", *TINY, "--out", str(out)]
        tasks.append((command, process_env(slurm)))
    run_concurrently(tasks)
    assert summary(out)["world_size"] == 2
    assert max_relative_difference(final_state(out), final_state(single_process_run)) < 1e-5


def run_concurrently(commands: list[tuple[list[str], dict[str, str]]], timeout: float = 300):
    """Start every (command, environment) at once; each must exit 0."""
    processes = [
        subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for command, env in commands
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=timeout)
        assert process.returncode == 0, stderr[-3000:]


def test_distributed_eval_equals_single_process(single_process_run):
    """3 ranks over the run's 1,000 test images (not divisible by 3): every image counted once."""
    script = Path(__file__).parent / "scripts" / "distributed_eval.py"
    results = {}
    for nproc in (1, 3):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(script),
            str(single_process_run / "final.pt"),
            "500",
        ]
        done = subprocess.run(
            command, env=process_env(), capture_output=True, text=True, timeout=300, check=False
        )
        assert done.returncode == 0, done.stderr[-3000:]
        results[nproc] = json.loads(done.stdout.strip().splitlines()[-1])
    assert results[3]["examples"] == results[1]["examples"] == VAL_EXAMPLES == 1000
    assert results[3]["top1"] == pytest.approx(results[1]["top1"], abs=1e-9)
    assert results[3]["top5"] == pytest.approx(results[1]["top5"], abs=1e-9)
    assert results[3]["loss"] == pytest.approx(results[1]["loss"], rel=1e-5)
    assert results[1]["top1"] == pytest.approx(summary(single_process_run)["top1"], abs=1e-6)


EXIT_PROBE = """
import atexit, sys
import bigbatch.distributed as distributed
atexit.register(lambda: print("finalized", file=sys.stderr))
print("buffered output")  # a pipe: block-buffered until flushed
if sys.argv[1] == "joined":
    distributed._joined_a_group = True
distributed.exit_if_joined(7)
sys.exit(3)
"""


@pytest.mark.parametrize("role", ["joined", "alone"])
def test_a_rank_ends_with_its_code_and_output_but_without_finalization(role):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    result = subprocess.run([sys.executable, "-c", EXIT_PROBE, role], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.stdout == "buffered output\n"
    if role == "joined":  # gloo's leftover threads never meet a finalizing interpreter
        assert (result.returncode, result.stderr) == (7, "")
    else:  # a one-process run exits as any program does
        assert (result.returncode, result.stderr) == (3, "finalized\n")
