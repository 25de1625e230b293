"""A one-node SLURM cluster for tests: slurmctld and slurmd on this machine, started as root.

Debian's ``slurm-wlm`` packages (slurmctld, slurmd, slurm-client) and ``munge`` give a real
SLURM: jobs are submitted with sbatch and srun, signalled, timed out and requeued by SLURM
itself. The cluster gets its own configuration, state and spool folders under a temporary folder
and its own ports; clients find it through ``SLURM_CONF``, which sbatch and srun pass on to the
job. ``running()`` installs the packages if they are missing (root and apt-get required) and
raises ``Unavailable`` with the reason when the cluster cannot be had; the tests skip with that
reason, or fail when BIGBATCH_REQUIRE_SLURM=1 (CI sets it, so CI cannot pass them by skipping).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bigbatch.local_launch import free_port

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
PROGRAMS = ["slurmctld", "slurmd", "srun", "sbatch", "scontrol", "munged", "munge"]
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


class Unavailable(Exception):
    """No SLURM cluster here; the message says why."""


def required() -> bool:
    return os.environ.get("BIGBATCH_REQUIRE_SLURM", "") not in ("", "0")


@dataclass
class Cluster:
    folder: Path
    env: dict[str, str]
    daemons: list[subprocess.Popen] = field(default_factory=list)

    def run(self, *command: str, timeout: float = 60, env: dict[str, str] | None = None):
        """Run a client command (sinfo, srun, scancel, ...) against this cluster."""
        return subprocess.run(command, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def version(self) -> str:
        return self.run("sinfo", "--version").stdout.strip()

    def submit(self, script: Path, *options: str, env: dict[str, str] | None = None) -> int:
        """sbatch the script with extra options; the job's environment is ``env`` on top."""
        result = subprocess.run(
            ["sbatch", "--parsable", *options, str(script)],
            env={**self.env, **(env or {})}, capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            raise AssertionError(f"sbatch failed: {result.stderr.strip()}")
        return int(result.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, Restarts, ExitCode, ...)."""
        shown = self.run("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", shown))

    def wait(self, job_id: int, timeout: float, until=FINISHED.__contains__) -> dict[str, str]:
        """Poll the job until ``until(state)`` holds; fail with the logs after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if until(info.get("JobState", "")):
                return info
            time.sleep(1)
        raise AssertionError(f"job {job_id} still {self.job(job_id)} after {timeout} s\n"
                             f"{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        tails = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.folder / name
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            tails.append(f"--- {name}\n" + "\n".join(text[-lines:]))
        return "\n".join(tails)


def install_packages() -> None:
    if all(shutil.which(p) for p in PROGRAMS):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable(f"SLURM is not installed ({', '.join(PACKAGES)}) and cannot be "
                          "installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise Unavailable(f"{' '.join(command)} failed: {result.stderr.strip()[-300:]}")


def ensure_munge() -> None:
    """SLURM authenticates with munge: start munged (as its own user) unless it answers."""
    if subprocess.run(["munge", "-n"], capture_output=True, check=False).returncode == 0:
        return
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
        shutil.chown(key, "munge", "munge")
    run_dir = Path("/run/munge")
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "munged"], check=True)
    for _ in range(50):
        if subprocess.run(["munge", "-n"], capture_output=True, check=False).returncode == 0:
            return
        time.sleep(0.1)
    raise Unavailable("munged started but does not answer")


def slurm_conf(folder: Path, host: str) -> str:
    """One node with 2 CPUs, one default partition; processes tracked through /proc."""
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    return "\n".join([
        "ClusterName=bigbatch-test",
        f"SlurmctldHost={host}(127.0.0.1)",
        "AuthType=auth/munge",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "SchedulerType=sched/backfill",
        "ReturnToService=2",
        "JobRequeue=1",
        "MpiDefault=none",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory={memory_mb // 2} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


@contextlib.contextmanager
def running(folder: Path) -> Iterator[Cluster]:
    """Start slurmctld and slurmd for the duration of the block; stop them after."""
    if os.geteuid() != 0:
        raise Unavailable("starting slurmctld and slurmd needs root (CI runs as root)")
    if (os.cpu_count() or 1) < 2:
        raise Unavailable("the SLURM tests run two tasks and need 2 CPUs")
    install_packages()
    ensure_munge()
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    conf = folder / "slurm.conf"
    conf.write_text(slurm_conf(folder, host))
    venv_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "SLURM_CONF": str(conf),
           "PATH": f"{venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    cluster = Cluster(folder, env)
    try:
        for daemon in ("slurmctld", "slurmd"):
            cluster.daemons.append(subprocess.Popen(
                [daemon, "-D"], env=env, stdout=subprocess.DEVNULL,
                stderr=open(folder / f"{daemon}.stderr", "w"),
            ))
        wait_until_idle(cluster)
        yield cluster
    finally:
        cluster.run("scancel", "--user", "root")
        for daemon in reversed(cluster.daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()


def wait_until_idle(cluster: Cluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(d.poll() is not None for d in cluster.daemons):
            break
        if cluster.run("sinfo", "-h", "-o", "%T").stdout.strip() == "idle":
            return
        time.sleep(0.5)
    raise Unavailable(f"the SLURM node did not come up\n{cluster.log_tail()}")
