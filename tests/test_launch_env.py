"""Rank, world size and master address come from torchrun's or SLURM's environment."""

from datetime import timedelta

import pytest
import torch.distributed as dist
from launch import free_port

from bigbatch.data import loader
from bigbatch.distributed import (
    elastic_attempt_store,
    first_slurm_host,
    launch_env,
    processes_on_this_node,
    slurm_tasks_per_node,
)
from bigbatch.errors import ConfigError
from bigbatch.train.faults import Fault, fault_from_env


def test_torchrun_variables():
    env = launch_env(
        {
            "RANK": "3",
            "WORLD_SIZE": "8",
            "LOCAL_RANK": "1",
            "MASTER_ADDR": "node7",
            "MASTER_PORT": "1234",
        }
    )
    assert (
        env.rank,
        env.world_size,
        env.local_rank,
        env.master_addr,
        env.master_port,
        env.launcher,
    ) == (3, 8, 1, "node7", 1234, "torchrun")


def test_slurm_variables_when_torchrun_is_absent():
    env = launch_env(
        {
            "SLURM_PROCID": "5",
            "SLURM_NTASKS": "16",
            "SLURM_LOCALID": "1",
            "SLURM_JOB_NODELIST": "gpu[003-010,012]",
            "SLURM_JOB_ID": "4242",
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.launcher) == (5, 16, 1, "slurm")
    assert env.master_addr == "gpu003" and env.master_port == 29500 + 242


def test_torchrun_wins_over_slurm():
    env = launch_env({"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "1", "SLURM_NTASKS": "4"})
    assert env.launcher == "torchrun" and env.world_size == 2


def test_single_process_default():
    assert launch_env({}).world_size == 1
    assert launch_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).launcher == "none"


@pytest.mark.parametrize(
    "nodelist, first",
    [
        ("node01", "node01"),
        ("a[1-4]", "a1"),
        ("gpu[007,009-011],cpu1", "gpu007"),
        ("x1,x2", "x1"),
    ],
)
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


def test_fault_spec_parsing():
    assert fault_from_env({"BIGBATCH_FAULT": "crash:step=7:rank=1"}) == Fault("crash", 7, 1)
    assert fault_from_env({"BIGBATCH_FAULT": "nan:step=3"}) == Fault("nan", 3, None)
    assert fault_from_env({}) is None
    restarted = {"BIGBATCH_FAULT": "crash:step=7", "TORCHELASTIC_RESTART_COUNT": "1"}
    assert fault_from_env(restarted) is None
    with pytest.raises(ConfigError, match="KIND:step=N"):
        fault_from_env({"BIGBATCH_FAULT": "explode:step=1"})


def test_each_elastic_restart_gets_its_own_keys(monkeypatch):
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=True)
    env = launch_env(
        {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    )
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    stores = []
    for attempt in ("0", "1"):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", attempt)
        stores.append(elastic_attempt_store(env, timedelta(seconds=10)))
    stores[0].set("rank_1", "address of a process that has died")
    stores[1].set("rank_1", "address of its replacement")
    assert stores[0].get("rank_1") == b"address of a process that has died"
    assert stores[1].get("rank_1") == b"address of its replacement"
    assert server.num_keys() >= 2


def test_without_the_agent_store_the_process_group_uses_env(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    env = launch_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert elastic_attempt_store(env, timedelta(seconds=1)) is None


@pytest.mark.parametrize(
    "env, processes",
    [
        ({"LOCAL_WORLD_SIZE": "8", "SLURM_TASKS_PER_NODE": "2"}, 8),  # torchrun wins
        ({"SLURM_TASKS_PER_NODE": "4(x2),2", "SLURM_NODEID": "1"}, 4),
        ({"SLURM_TASKS_PER_NODE": "4(x2),2", "SLURM_NODEID": "2"}, 2),
        ({"SLURM_TASKS_PER_NODE": "3"}, 3),
        ({}, 1),
    ],
)
def test_processes_on_this_node(env, processes):
    assert processes_on_this_node(env) == processes


def test_slurm_task_counts_expand_and_reject_garbage():
    assert slurm_tasks_per_node("4(x2),2,1(x3)") == [4, 4, 2, 1, 1, 1]
    with pytest.raises(ConfigError, match="SLURM_TASKS_PER_NODE"):
        slurm_tasks_per_node("four")


def test_launch_env_carries_the_process_count_of_this_node():
    torchrun = launch_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                           "LOCAL_WORLD_SIZE": "4"})
    slurm = launch_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "1",
                        "SLURM_TASKS_PER_NODE": "4,2", "SLURM_NODEID": "1",
                        "SLURM_JOB_NODELIST": "n[1-2]"})
    assert (torchrun.local_world_size, slurm.local_world_size, launch_env({}).local_world_size) \
        == (4, 2, 1)


def test_loader_workers_share_the_node_cores_between_its_processes(monkeypatch):
    """Image-folder data: each rank gets its share of the node's cores minus one for itself."""
    import torch

    from bigbatch import build
    from bigbatch.config import RunConfig
    from bigbatch.distributed import DistContext

    monkeypatch.setattr(loader, "available_cores", lambda: 16)
    cfg = RunConfig()
    cfg.data.name = "imagefolder"
    alone = DistContext(0, 1, 0, None, torch.device("cpu"))
    four = DistContext(0, 4, 0, "gloo", torch.device("cpu"), local_world_size=4)
    assert (build.workers_for(cfg, alone), build.workers_for(cfg, four)) == (15, 3)
    cfg.data.workers = 2
    assert build.workers_for(cfg, four) == 2
