"""Hardware presets for the scaling planner (plan.py): published figures, kept as data.

Every number carries its source. A figure read straight off a publication has
``estimate=False``; a figure derived from published ones (scaled by peak FLOP/s, by clock, or a
vendor's order-of-magnitude latency) has ``estimate=True`` and its note says how it was derived,
and the planner's output flags it.

Device throughput is training images per second per device (forward + backward + update) for a
named model. A model without a figure is scaled from the device's ResNet-50 figure by the ratio of
forward FLOPs (plan.py does that and flags the result as an estimate).

Network figures are per node: ``bandwidth_gbit`` is the node's injection bandwidth into the
inter-node network (all its NICs together); ``intra_bandwidth_gbit`` is one device's link
bandwidth inside a node, per direction. The planner uses nominal link rates, so its all-reduce
times are lower bounds (NCCL/MPI reach 70-90 % of them on large messages).

Peak FP32 FLOP/s used below (AVX-512: 2 FMA units x 16 lanes x 2 = 64 FLOP/cycle/core):
- Xeon Phi 7250 (KNL): 68 cores x 1.4 GHz x 64 = 6.09 TFLOP/s (Intel quotes 3.05 TFLOP/s FP64).
- 2 x Xeon Platinum 8180: 56 cores x 2.5 GHz x 64 = 8.96 TFLOP/s.
- 2 x Xeon Platinum 8160 (a Stampede2 SKX node): 48 cores x 2.1 GHz x 64 = 6.45 TFLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class DevicePreset:
    name: str
    description: str
    images_per_second: dict[str, Figure] = field(default_factory=dict)
    reference_model: str = "resnet50"  # the figure other models are FLOP-scaled from


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

KNL_7250 = DevicePreset(
    name="xeon-phi-7250",
    description="Intel Xeon Phi 7250 (Knights Landing, 68 cores, 1.4 GHz), one per node",
    images_per_second={
        "resnet50": Figure(
            91.8,
            "estimate: the 2 x Xeon 8180 figure (135 images/s, " + INTEL_CAFFE_8180 + ") scaled "
            "by peak FP32 FLOP/s, KNL 6.09 / 2 x 8180 8.96 TFLOP/s",
            estimate=True,
        ),
    },
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
        ),
    },
)

P100 = DevicePreset(
    name="tesla-p100",
    description="NVIDIA Tesla P100 SXM2 (FP32), as in Goyal et al.'s Big Basin servers",
    images_per_second={
        "resnet50": Figure(
            195.0,
            TF_BENCHMARKS_P100 + ": ResNet-50, batch 32 per GPU "
            "(the per-GPU batch of Goyal et al.), 195 images/s",
        ),
        "alexnet": Figure(2987.0, TF_BENCHMARKS_P100 + ": AlexNet, batch 512, 2987 images/s"),
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
