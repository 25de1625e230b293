"""Hardware presets for the scaling planner (bigbatch.tools.plan): published figures, kept as data.

Every number carries its source. A figure read straight off a publication has
``estimate=False``; a figure derived from published ones (scaled by peak FLOP/s, by clock, or a
vendor's order-of-magnitude latency) has ``estimate=True`` and its note says how it was derived,
and the planner's output flags it.

Device throughput is training images per second per device (forward + backward + update) for a
named model. A model without a figure is scaled from the device's ResNet-50 figure by the ratio of
forward FLOPs (stats.py does that and flags the result as an estimate).

Network figures are per node: ``bandwidth_gbit`` is the node's injection bandwidth into the
inter-node network (all its NICs together); ``intra_bandwidth_gbit`` is one device's link
bandwidth inside a node, per direction. The planner uses nominal link rates, so its all-reduce
times are lower bounds (NCCL/MPI reach 70-90 % of them on large messages).

Device losses in a multi-node run (stats.DeviceLosses), for the Intel Caffe presets only:

- Per-device batch. A throughput figure is measured at one batch (``Figure.batch``); a device
  given b images per step runs at b / (b + h) of its large-batch rate, relative to the same
  curve at the figure's batch: a fixed per-step cost (synchronisation, the solver update,
  per-layer start-up) shared by fewer images. The half-efficiency batch h comes from Dell EMC's
  Intel Caffe + MLSL measurements on the Zenith cluster (ResNet-50, ImageNet in /dev/shm, Xeon
  Gold 6148 nodes on a non-blocking 100 Gbit/s Omni-Path fabric, global batch held at 8K):
  speedup at least 90 % of perfect at 128 nodes (64 images per node), 83 % at 256 (32 per node),
  76 % at 314 (8192/314 = 26.1 per node). Each point gives h = b (1/e - 1): 7.1, 6.6 and 8.2
  images; h is their mean, 7.3. The derivation was fixed before any paper run was recomputed.
  Those efficiencies include MLSL's communication, which the planner models on its own; for
  ResNet-50 on Omni-Path the planner hides it entirely, so nothing is counted twice there.
- Cores given to communication. Intel Caffe 1.0.7 (the authors' release) runs multi-node jobs
  with cores - MLSL endpoint servers - 2 data-reader threads as compute threads
  (scripts/set_env.sh: 2 servers on SKX/BDW, 4 on KNL), while single-node figures use every
  core: 44/48 of a Stampede2 SKX node and 62/68 of a KNL compute.

Peak FP32 FLOP/s used below (AVX-512: 2 FMA units x 16 lanes x 2 = 64 FLOP/cycle/core):
- Xeon Phi 7250 (KNL): 68 cores x 1.4 GHz x 64 = 6.09 TFLOP/s (Intel quotes 3.05 TFLOP/s FP64).
- 2 x Xeon Platinum 8180: 56 cores x 2.5 GHz x 64 = 8.96 TFLOP/s.
- 2 x Xeon Platinum 8160 (a Stampede2 SKX node): 48 cores x 2.1 GHz x 64 = 6.45 TFLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DELL_ZENITH = (
    "Dell EMC HPC Innovation Lab (A. Filby, N. Dandapanthula), 'Deep Learning Performance with "
    "Intel Caffe - Training, CPU model choice and Scalability', March 2018: Intel Caffe 1.0.4 + "
    "MLSL, ResNet-50, Zenith cluster (Xeon Gold 6148, Omni-Path 100 Gbit/s non-blocking), "
    "global batch <= 8K; speedup >= 90 % of perfect at 128 nodes, 83 % at 256, 76 % at 314"
)
INTEL_CAFFE_SET_ENV = (
    "Intel Caffe 1.0.7 (github.com/intel/caffe, tag 1.0.7, scripts/set_env.sh): multi-node "
    "OpenMP threads = cores - MLSL_NUM_SERVERS (2 on SKX, 4 on KNL) - 2 pinned data-reader "
    "threads"
)
INTEL_CAFFE_8180 = (
    "Intel, 'Intel Optimized Caffe Performance and Convergence', March 2018 (github.com/intel/"
    "caffe, results/, slide 3): ResNet-50 training 135 images/s on 2 x Xeon Platinum 8180, "
    "batch 512, dummy data"
)
TF_BENCHMARKS_P100 = (
    "TensorFlow benchmarks page (tensorflow/docs_src/performance/benchmarks.md, May 2017), "
    "NVIDIA DGX-1, 1 x Tesla P100, synthetic data"
)
NVIDIA_DLE_A100 = (
    "NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5 README, DGX A100 80GB, 1 GPU, "
    "pytorch-21.03 container"
)


@dataclass(frozen=True)
class Figure:
    """One number with where it comes from."""

    value: float
    source: str
    estimate: bool = False
    batch: int | None = None  # per-device batch of a throughput figure, when it matters


@dataclass(frozen=True)
class DevicePreset:
    name: str
    description: str
    images_per_second: dict[str, Figure] = field(default_factory=dict)
    reference_model: str = "resnet50"  # the figure other models are FLOP-scaled from
    # Losses in a multi-node run (see the module docstring); None: the figure holds as it is.
    half_efficiency_batch: Figure | None = None  # images per device at 50 % of the batch curve
    multinode_compute_share: Figure | None = None  # share of cores left for compute


@dataclass(frozen=True)
class NetworkPreset:
    name: str
    description: str
    alpha_s: Figure  # inter-node latency per message (per ring step)
    bandwidth_gbit: Figure  # per node, into the inter-node network
    topology: str = "ring"
    devices_per_node: int = 1
    intra_alpha_s: Figure | None = None
    intra_bandwidth_gbit: Figure | None = None  # per device, per direction


@dataclass(frozen=True)
class HardwarePreset:
    name: str
    description: str
    device: DevicePreset
    network: NetworkPreset


@dataclass(frozen=True)
class PaperRun:
    """A reported end-to-end training time to set the planner against."""

    label: str
    model: str
    epochs: float
    global_batch: int
    devices: int
    preset: str
    reported_minutes: float
    source: str


# ----------------------------------------------------------------------------- devices

# (images per node, speedup / perfect) read off DELL_ZENITH; 8192 / 314 nodes = 26.1 per node.
ZENITH_BATCH_EFFICIENCY = ((64.0, 0.90), (32.0, 0.83), (8192 / 314, 0.76))


def half_efficiency_batch(points: tuple[tuple[float, float], ...]) -> float:
    """h in e(b) = b / (b + h): the mean over the points of h = b (1/e - 1)."""
    return sum(batch * (1.0 / efficiency - 1.0) for batch, efficiency in points) / len(points)


INTEL_CAFFE_HALF_BATCH = Figure(
    half_efficiency_batch(ZENITH_BATCH_EFFICIENCY),
    "derived: mean of b (1/e - 1) over (64, 0.90), (32, 0.83), (26.1, 0.76) from "
    + DELL_ZENITH
    + "; measured on Xeon Gold 6148 nodes, applied unchanged to SKX 8160 and KNL nodes",
)

KNL_7250 = DevicePreset(
    name="xeon-phi-7250",
    description="Intel Xeon Phi 7250 (Knights Landing, 68 cores, 1.4 GHz), one per node",
    images_per_second={
        "resnet50": Figure(
            91.8,
            "estimate: the 2 x Xeon 8180 figure (135 images/s, " + INTEL_CAFFE_8180 + ") scaled "
            "by peak FP32 FLOP/s, KNL 6.09 / 2 x 8180 8.96 TFLOP/s",
            estimate=True,
            batch=512,
        ),
    },
    half_efficiency_batch=INTEL_CAFFE_HALF_BATCH,
    multinode_compute_share=Figure(62 / 68, "62 of 68 KNL cores compute: " + INTEL_CAFFE_SET_ENV),
)

SKX_8160_NODE = DevicePreset(
    name="xeon-8160-node",
    description="Stampede2 SKX node: 2 x Intel Xeon Platinum 8160 (48 cores, 2.1 GHz)",
    images_per_second={
        "resnet50": Figure(
            97.2,
            "estimate: 135 images/s (" + INTEL_CAFFE_8180 + ") scaled by cores x clock, "
            "(48 x 2.1 GHz) / (56 x 2.5 GHz)",
            estimate=True,
            batch=512,
        ),
    },
    half_efficiency_batch=INTEL_CAFFE_HALF_BATCH,
    multinode_compute_share=Figure(44 / 48, "44 of 48 SKX cores compute: " + INTEL_CAFFE_SET_ENV),
)

P100 = DevicePreset(
    name="tesla-p100",
    description="NVIDIA Tesla P100 SXM2 (FP32), as in Goyal et al.'s Big Basin servers",
    images_per_second={
        "resnet50": Figure(
            195.0,
            TF_BENCHMARKS_P100 + ": ResNet-50, batch 32 per GPU "
            "(the per-GPU batch of Goyal et al.), 195 images/s",
            batch=32,
        ),
        "alexnet": Figure(
            2987.0, TF_BENCHMARKS_P100 + ": AlexNet, batch 512, 2987 images/s", batch=512
        ),
    },
)

A100 = DevicePreset(
    name="a100-80gb",
    description="NVIDIA A100 SXM4 80GB, mixed precision",
    images_per_second={
        "resnet50": Figure(2470.0, NVIDIA_DLE_A100 + ": mixed precision 2470 images/s (TF32: 938)"),
    },
)

H100 = DevicePreset(
    name="h100-sxm",
    description="NVIDIA H100 SXM5 80GB, mixed precision",
    images_per_second={
        "resnet50": Figure(
            4940.0,
            "estimate: 2 x the A100 mixed-precision figure (2470 images/s, "
            + NVIDIA_DLE_A100
            + "); 2x lies between the HBM bandwidth ratio (3.35/2.04 TB/s = 1.6x) and the dense "
            "BF16 peak ratio (989/312 TFLOP/s = 3.2x)",
            estimate=True,
        ),
    },
)

# ----------------------------------------------------------------------------- networks

OMNI_PATH = NetworkPreset(
    name="omni-path-100",
    description="Intel Omni-Path, 100 Gbit/s per node, fat tree (Stampede2)",
    alpha_s=Figure(
        1.0e-6,
        "estimate: Omni-Path MPI latency is of the order of 1 us (vendor figure)",
        estimate=True,
    ),
    bandwidth_gbit=Figure(100.0, "Omni-Path link rate, 100 Gbit/s (Stampede2 user guide)"),
)

BIG_BASIN_ETHERNET = NetworkPreset(
    name="big-basin-50gbe",
    description="Goyal et al.: 8 P100 per server on NVLink; servers on one 50 Gbit/s Ethernet NIC",
    alpha_s=Figure(10.0e-6, "estimate: ~10 us per message over TCP/Ethernet", estimate=True),
    bandwidth_gbit=Figure(
        50.0,
        "Goyal et al. 2017, sec. 5: one Mellanox ConnectX-4 50 Gbit "
        "Ethernet card per Big Basin server",
    ),
    devices_per_node=8,
    intra_alpha_s=Figure(1.0e-6, "estimate: ~1 us per NVLink step", estimate=True),
    intra_bandwidth_gbit=Figure(
        160.0,
        "estimate: one P100 NVLink link, 20 GB/s per direction "
        "(a ring on the hybrid cube mesh uses one link per hop)",
        estimate=True,
    ),
)

DGX_A100_HDR = NetworkPreset(
    name="dgx-a100-hdr",
    description="DGX A100: 8 GPUs on NVLink3/NVSwitch; 8 x 200 Gbit/s HDR InfiniBand per node",
    alpha_s=Figure(2.0e-6, "estimate: ~2 us per InfiniBand message with NCCL", estimate=True),
    bandwidth_gbit=Figure(
        1600.0,
        "DGX A100 datasheet: 8 x 200 Gbit/s HDR InfiniBand (one per GPU) = 1600 Gbit/s per node",
    ),
    devices_per_node=8,
    intra_alpha_s=Figure(1.0e-6, "estimate: ~1 us per NVLink step", estimate=True),
    intra_bandwidth_gbit=Figure(
        2400.0, "A100 NVLink3: 600 GB/s bidirectional = 300 GB/s per direction per GPU"
    ),
)

DGX_H100_NDR = NetworkPreset(
    name="dgx-h100-ndr",
    description="DGX H100: 8 GPUs on NVLink4/NVSwitch; 8 x 400 Gbit/s NDR InfiniBand per node",
    alpha_s=Figure(2.0e-6, "estimate: ~2 us per InfiniBand message with NCCL", estimate=True),
    bandwidth_gbit=Figure(
        3200.0,
        "DGX H100 datasheet: 8 x 400 Gbit/s NDR InfiniBand "
        "(ConnectX-7, one per GPU) = 3200 Gbit/s per node",
    ),
    devices_per_node=8,
    intra_alpha_s=Figure(1.0e-6, "estimate: ~1 us per NVLink step", estimate=True),
    intra_bandwidth_gbit=Figure(
        3600.0, "H100 NVLink4: 900 GB/s bidirectional = 450 GB/s per direction per GPU"
    ),
)

# ----------------------------------------------------------------------------- presets

PRESETS: dict[str, HardwarePreset] = {
    preset.name: preset
    for preset in (
        HardwarePreset(
            "knl-opa", "Stampede2 KNL nodes (the paper's ResNet-50 runs)", KNL_7250, OMNI_PATH
        ),
        HardwarePreset(
            "skx-opa", "Stampede2 SKX nodes (the paper's AlexNet runs)", SKX_8160_NODE, OMNI_PATH
        ),
        HardwarePreset(
            "p100-goyal", "Goyal et al.'s Big Basin P100 servers", P100, BIG_BASIN_ETHERNET
        ),
        HardwarePreset("a100-dgx", "DGX A100 nodes on HDR InfiniBand", A100, DGX_A100_HDR),
        HardwarePreset("h100-dgx", "DGX H100 nodes on NDR InfiniBand", H100, DGX_H100_NDR),
    )
}

PAPER_RUNS: tuple[PaperRun, ...] = (
    PaperRun(
        "AlexNet, 100 epochs, batch 32K, 1024 SKX nodes",
        "alexnet",
        100,
        32768,
        1024,
        "skx-opa",
        11.0,
        "You et al. ICPP 2018: 11 minutes on 1024 CPUs (2048 Xeon Platinum 8160 sockets)",
    ),
    PaperRun(
        "ResNet-50, 90 epochs, batch 32K, 2048 KNL",
        "resnet50",
        90,
        32768,
        2048,
        "knl-opa",
        20.0,
        "You et al. ICPP 2018: 20 minutes on 2048 Xeon Phi 7250",
    ),
    PaperRun(
        "ResNet-50, 90 epochs, batch 8K, 256 P100 (Goyal et al.)",
        "resnet50",
        90,
        8192,
        256,
        "p100-goyal",
        60.0,
        "Goyal et al. 2017: 1 hour on 256 P100",
    ),
)
