#!/usr/bin/env bash
# The GPU path, end to end, on a CUDA machine: install bigbatch, measure ResNet-50 training
# images/s on synthetic 224x224 data (bf16 autocast + channels_last, then optionally with
# torch.compile), the plain PyTorch loop of benchmarks/peer_loop.py beside it, ResNet-50 fed from
# a folder of generated ImageNet-like JPEGs, and a short Fashion-MNIST training; then the JPEG
# decoding on the GPU, the Triton LARS and LAMB steps against the eager ones, and the optimizer
# step's timings; print images/s
# with the GPU's name and append one JSON line (suite "gpu") to
# docs/results/train_throughput.jsonl. A part that fails is recorded with its error and the
# others still run (exit 2 at the end).
#
#   bash benchmarks/gpu.sh                      # one GPU, batch 256, 60 steps
#   BATCH=256 STEPS=60 WARMUP=10 COMPILE=1 NPROC=8 bash benchmarks/gpu.sh
#
# Environment:
#   PYTHON    interpreter to use (default: python3); bigbatch is installed into it with
#             `pip install -e .` (--no-deps when torch is already importable: GPU images ship it)
#   BATCH     ResNet-50 micro-batch per GPU (default 256; the global batch is BATCH x NPROC)
#   STEPS     timed steps (default 60), WARMUP steps dropped from the median (default 10)
#   COMPILE   1: also measure with torch.compile (compile time is in the warm-up steps)
#   COMPILE_MODES  with COMPILE=1, torch.compile modes to measure besides the default, e.g.
#             "reduce-overhead max-autotune" (CUDA graphs; autotuned kernels: minutes to compile)
#   NPROC     GPUs to use through torchrun --standalone (default 1)
#   WORKERS   loader processes per GPU for the synthetic data (default 4)
#   IMAGE_SIZE  ResNet-50 input side (default 224)
#   FMNIST_EPOCHS  epochs of the Fashion-MNIST run (default: the default recipe's own); a
#             shorter run keeps the recipe's share of warm-up, since a warm-up longer than the
#             run is refused. Fashion-MNIST is found the usual way (BIGBATCH_DATA,
#             /usr/share/datasets/fashion-mnist, the cache, a download)
#   FMNIST_SET  extra KEY=VALUE overrides for the Fashion-MNIST run only (e.g. a train subset)
#   FMNIST_SEEDS  its seeds, space-separated (default "0"; "0 1 2" for the median of three)
#   EXTRA_SET extra space-separated KEY=VALUE config overrides for every run (e.g. "threads=1")
#   LARS_STEP 0: skip the optimizer-step benchmark (benchmarks/lars_step.py --device cuda)
#   COMPILED_STEP_S  time limit of its second run, the compiled LARS and LAMB (default 240 s)
#   SMALL_BATCH  ResNet-50 micro-batch of the short-step run (default 32, the paper's scale;
#             0 skips it): each run records the optimizer's share of its step
#   LARGE_BATCH  ResNet-50 micro-batch of the large-batch run (default 512; 0 skips it)
#   PEER      0: skip the plain-loop peer (benchmarks/peer_loop.py, one device)
#   JPEGS     generated 500x375 quality-90 JPEGs for the image-folder run (default 1024; 0 skips
#             it); the run reads them for as many epochs as STEPS + WARMUP steps need, once
#             decoded by the loader workers and once by the GPU (data.decode_on_device)
#   OUT       scratch folder for the runs (default: a new temporary folder)
#   TIME_LIMIT_S  wall-clock budget of the whole script in seconds (default 0: none). A part
#             starts only while more than RESERVE_S (default 30) seconds are left, and runs
#             under a timeout of what is left less RESERVE_S and 10 s to stop in; a part not
#             started, or stopped, is recorded as skipped (the exit stays 0), and the records
#             are written all the same
#   ARCHIVE   a .tar.gz path outside OUT: at the end (also after a failure) the scratch folder's logs,
#             metrics, configs and summaries (no checkpoints, no generated JPEGs) and the lines
#             this run appended to docs/results go into it, to bring back from a remote machine
#   CPU_DRY_RUN  1: skip the GPU checks and the install and run everything on the CPU, with
#             CUDA hidden and gloo between processes (tests/test_gpu_script.py runs it so in CI,
#             with tiny sizes); the record goes to $OUT/dry-run.jsonl, never to docs/results
#
# Published anchors for one GPU (ResNet-50 training, mixed precision): about 2,470 images/s on
# an A100 in PyTorch (NVIDIA Deep Learning Examples) and about 7,900 on an H200 in MLPerf's
# MXNet code. Exit codes: 0 done, 1 no usable GPU, 2 a run failed.
set -euo pipefail
[ -z "${ARCHIVE:-}" ] || ARCHIVE=$(realpath -m "$ARCHIVE")  # a relative path: from here
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
BATCH=${BATCH:-256}
STEPS=${STEPS:-60}
WARMUP=${WARMUP:-10}
COMPILE=${COMPILE:-0}
NPROC=${NPROC:-1}
WORKERS=${WORKERS:-4}
IMAGE_SIZE=${IMAGE_SIZE:-224}
CPU_DRY_RUN=${CPU_DRY_RUN:-0}
OUT=${OUT:-$(mktemp -d -t bigbatch-gpu-XXXXXX)}
mkdir -p "$OUT"
TIME_LIMIT_S=${TIME_LIMIT_S:-0}
RESERVE_S=${RESERVE_S:-30}
for setting in TIME_LIMIT_S RESERVE_S; do
    [[ ${!setting} =~ ^[0-9]+$ ]] || { echo "gpu.sh: $setting must be whole seconds, got '${!setting}'" >&2; exit 1; }
done

# The records this script appends to, and how many lines each had before it (for ARCHIVE).
RECORDS=(docs/results/train_throughput.jsonl docs/results/lars_step.jsonl
         docs/results/device_decode.jsonl docs/results/triton_step.jsonl)
declare -A RECORD_LINES
for record in "${RECORDS[@]}"; do
    RECORD_LINES[$record]=$(if [ -f "$record" ]; then wc -l < "$record"; else echo 0; fi)
done
archive() {  # the run's small files and the new record lines into $ARCHIVE
    [ -n "${ARCHIVE:-}" ] || return 0
    mkdir -p "$OUT/records"
    for record in "${RECORDS[@]}"; do
        [ -f "$record" ] && tail -n +$((RECORD_LINES[$record] + 1)) "$record" \
            > "$OUT/records/$(basename "$record")"
    done
    mkdir -p "$(dirname "$ARCHIVE")"
    tar -czf "$ARCHIVE.partial" -C "$OUT" --exclude='*.pt' --exclude='.checkpoint-*' \
        --exclude='./jpegs' --exclude="./$(basename "$ARCHIVE").partial" . \
        && mv "$ARCHIVE.partial" "$ARCHIVE" && echo "gpu.sh: logs and records in $ARCHIVE"
}
# The archive whatever the exit, which keeps its status.
trap 'status=$?; archive || echo "gpu.sh: writing $ARCHIVE failed" >&2; exit $status' EXIT

fail() { echo "gpu.sh: $*" >&2; exit "${2:-1}"; }
FAILED=()
failed_part() {  # failed_part <name> <log>: recorded in the JSON line, and the script goes on
    FAILED+=("$1")
    "$PYTHON" - "$1" "$2" "$OUT/failed-${#FAILED[@]}.json" <<'EOF'
import json, sys
name, log, out = sys.argv[1:]
text = open(log, errors="replace").read()
said = [line for line in text.splitlines() if line.startswith("bigbatch: ")]  # its one line
json.dump({"run": name, "error": said[-1] if said else text[-2000:]}, open(out, "w"))
EOF
    echo "gpu.sh: $1 failed (log: $2); going on" >&2
}
SKIPPED=()
skipped_part() {  # skipped_part <name> <why>: recorded in the JSON line as skipped
    SKIPPED+=("$1")
    "$PYTHON" -c "import json, sys; json.dump({'run': sys.argv[1], 'skipped': sys.argv[2]},
open(sys.argv[3], 'w'))" "$1" "$2" "$OUT/skipped-${#SKIPPED[@]}.json"
    echo "gpu.sh: $1 skipped: $2" >&2
}

# The time limit: LIMIT is the timeout prefix of the next part's command (empty without a limit),
# LIMIT_S its seconds, PART_START when the part started. A stopped part has KILL_AFTER_S more
# seconds to end before it is killed: they come out of its share.
LIMIT=()
LIMIT_S=0
PART_START=0
KILL_AFTER_S=10
time_for() {  # time_for <name> [<seconds>]: true, with LIMIT set, when the part may start
    LIMIT=()
    LIMIT_S=${2:-0}
    PART_START=$SECONDS
    if [ "$TIME_LIMIT_S" -gt 0 ]; then
        local left=$((TIME_LIMIT_S - SECONDS - RESERVE_S - KILL_AFTER_S))
        if [ "$left" -le 0 ]; then
            skipped_part "$1" "not started: TIME_LIMIT_S=$TIME_LIMIT_S reached"
            return 1
        fi
        [ "$LIMIT_S" -gt 0 ] && [ "$LIMIT_S" -le "$left" ] || LIMIT_S=$left
    fi
    [ "$LIMIT_S" -eq 0 ] || LIMIT=(timeout --kill-after="$KILL_AFTER_S" "$LIMIT_S")
}
# after <name> <log> <exit status>: true for success; a part stopped by its timeout is skipped
# (124, or killed once its time was up), another failure failed.
after() {
    [ "$3" -ne 0 ] || return 0
    if [ "$LIMIT_S" -gt 0 ] && { [ "$3" -eq 124 ] || { [ "$3" -eq 137 ] \
            && [ $((SECONDS - PART_START)) -ge "$LIMIT_S" ]; }; }; then
        skipped_part "$1" "stopped by its time limit ($LIMIT_S s)"
    else
        failed_part "$1" "$2"
    fi
    return 1
}

# --- a GPU, or a clear no ---------------------------------------------------------------------
if [ "$CPU_DRY_RUN" = 1 ]; then
    export CUDA_VISIBLE_DEVICES=""
else
command -v nvidia-smi >/dev/null 2>&1 || fail "no nvidia-smi on PATH: this is not a CUDA machine"
nvidia-smi -L >/dev/null 2>&1 || fail "nvidia-smi finds no GPU (driver not loaded?)"
if ! "$PYTHON" -c "import torch" >/dev/null 2>&1; then
    "$PYTHON" -m pip install -q -e . || fail "pip install -e . failed (no network? install torch first)" 2
elif ! "$PYTHON" -m pip install -q --no-deps -e . >/dev/null 2>&1 \
     && ! "$PYTHON" -m pip install -q --no-deps --no-build-isolation -e .; then
    # Offline, with no setuptools to build with: run from the source tree instead.
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
    "$PYTHON" -c "import bigbatch" || fail "cannot install bigbatch nor import it from src/" 2
    echo "gpu.sh: pip install failed; running bigbatch from src/"
fi
"$PYTHON" - <<'EOF' || fail "PyTorch cannot use the GPU (CPU-only build or driver mismatch)"
import sys, torch
if not torch.cuda.is_available():
    sys.exit("torch.cuda.is_available() is False")
print(f"GPU: {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, bf16 supported: {torch.cuda.is_bf16_supported()}")
EOF
GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")
[ "$NPROC" -le "$GPUS" ] || fail "NPROC=$NPROC but only $GPUS GPU(s) visible"
fi

EXTRA=()
for assignment in ${EXTRA_SET:-}; do EXTRA+=(--set "$assignment"); done
FMNIST_EXTRA=()
for assignment in ${FMNIST_SET:-}; do FMNIST_EXTRA+=(--set "$assignment"); done
# The default recipe's epochs (unless FMNIST_EPOCHS says) and its share of warm-up.
read -r FMNIST_EPOCHS FMNIST_WARMUP < <("$PYTHON" -c "
import sys
from bigbatch.config import load_recipe
recipe = load_recipe('fashion-mnist')
epochs, warmup = recipe['epochs'], recipe['schedule']['warmup_epochs']
run = float(sys.argv[1]) if sys.argv[1] else epochs
print(sys.argv[1] or epochs, round(min(warmup, warmup / epochs * run), 4))" "${FMNIST_EPOCHS:-}")

launch() {  # launch <run dir> <bigbatch train arguments...>: under LIMIT; its exit status
    local dir=$1 status=0; shift
    set -- "$@" "${EXTRA[@]}"
    if [ "$NPROC" -gt 1 ]; then
        "${LIMIT[@]}" "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" \
            -m bigbatch train "$@" --set out="$dir" > "$dir.log" 2>&1 || status=$?
    else
        "${LIMIT[@]}" "$PYTHON" -m bigbatch train "$@" --set out="$dir" > "$dir.log" 2>&1 \
            || status=$?
    fi
    if [ "$status" -ne 0 ]; then
        tail -n 30 "$dir.log" >&2
        # torchrun's workers run in sessions of their own: a stopped run's may outlive it
        pkill -KILL -f -- "--set out=$dir\$" 2>/dev/null || true
    fi
    return "$status"
}

part() {  # part <name> <run dir> <bigbatch train arguments...>: train, then report or record
    local name=$1 dir=$2 status=0; shift 2
    time_for "$name" || return 0
    launch "$dir" "$@" || status=$?
    if after "$name" "$dir.log" "$status"; then report "$name" "$dir"; fi
}

report() {  # report <name> <run dir>: median images/s after the warm-up, data-wait share
    "$PYTHON" - "$1" "$2" "$WARMUP" <<'EOF'
import json, statistics, sys, yaml
name, folder, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3])
records = [json.loads(line) for line in open(f"{folder}/metrics.jsonl")]
train = [r for r in records if r["kind"] == "train"]
resets = [i for i in range(1, len(train)) if train[i]["step"] <= train[i - 1]["step"]]
train = train[resets[-1]:] if resets else train  # the last try only, when a failed one left lines
steps = [r for r in train if r["step"] > warmup] or train  # a run shorter than the warm-up
rate = statistics.median(r["images_per_second"] for r in steps)
evals = [r for r in records if r["kind"] == "eval"]
top1 = f", test top-1 {evals[-1]['top1']:.2f}%" if evals else ""
print(f"{name}: {rate:,.0f} images/s (median of {len(steps)} steps; data wait "
      f"{statistics.median(r['time_data'] for r in steps) * 1000:.1f} ms/step){top1}")
# The optimizer's share of a step: its time over the step's (global batch / images/s).
batch = yaml.safe_load(open(f"{folder}/config.yaml"))["global_batch"]
share = statistics.median(r["time_optimizer"] * r["images_per_second"] / batch for r in steps)
print(json.dumps({"run": name, "images_per_second": round(rate, 1), "steps": len(steps),
                  "top1": evals[-1]["top1"] if evals else None,
                  "optimizer_ms": round(statistics.median(r["time_optimizer"] for r in steps)
                                        * 1000, 3),
                  "optimizer_share": round(share, 4),
                  # host time waiting for and moving (or decoding) the batch: unsynchronised
                  "data_ms": round(statistics.median(r["time_data"] for r in steps) * 1000, 3)}),
      file=open(f"{folder}.json", "w"))
EOF
}

# Throughput only: the recipe's LR 30 without its 5-epoch warm-up diverges within a few steps
# (non-finite loss, exit 3) before anything is timed; the LR does not change the speed. Nor does
# which tensors LARS adapts (the same kernel runs over all of them): BN and bias tensors are
# left out here, because with them adapted the CPU dry run (micro-batch 2, 32x32, bf16, no
# warm-up) ends its first timed step with infinite gradients.
GLOBAL=$((BATCH * NPROC))
EXAMPLES=$((GLOBAL * (STEPS + WARMUP)))
RESNET=(--recipe imagenet-resnet50-8k --set data.name=synthetic --set data.image_size="$IMAGE_SIZE"
        --set data.synthetic_examples="$EXAMPLES" --set data.workers="$WORKERS"
        --set global_batch="$GLOBAL" --set micro_batch="$BATCH" --set epochs=1
        --set schedule.warmup_epochs=0 --set optim.lr=0.1 --set optim.exclude_bn_and_bias=true
        --set precision=bf16
        --set channels_last=true
        --set log_every=1 --set checkpoint.keep=1)

echo "ResNet-50, synthetic ${IMAGE_SIZE}x${IMAGE_SIZE}, batch $BATCH per GPU x $NPROC GPU(s), bf16 + channels_last"
part "resnet50 bf16 channels_last" "$OUT/resnet50" "${RESNET[@]}"
if [ "$COMPILE" = 1 ]; then
    part "resnet50 bf16 channels_last compile" "$OUT/resnet50-compile" "${RESNET[@]}" \
        --set compile=true
    for mode in ${COMPILE_MODES:-}; do
        part "resnet50 bf16 channels_last compile $mode" "$OUT/resnet50-compile-$mode" \
            "${RESNET[@]}" --set compile=true --set compile_mode="$mode"
    done
fi

# The synthetic run at another micro-batch per GPU (0 skips it), in its own run folder.
batch_part() {  # batch_part <micro-batch per GPU> <run dir>
    [ "$1" -gt 0 ] || return 0
    local global=$(($1 * NPROC))
    part "resnet50 bf16 channels_last batch $1" "$2" "${RESNET[@]}" \
        --set global_batch="$global" --set micro_batch="$1" \
        --set data.synthetic_examples=$((global * (STEPS + WARMUP)))
}
# At the paper's scale (32K over 1,000+ GPUs) a GPU holds 16-32 images: the optimizer's share of
# such a short step, in the record's optimizer_share (every run has it).
batch_part "${SMALL_BATCH:-32}" "$OUT/resnet50-small"
# A larger batch per GPU keeps it busier per kernel launch (MLPerf Training v4.0's H200 entries
# ran 400 images per GPU).
batch_part "${LARGE_BATCH:-512}" "$OUT/resnet50-large"

# The peer: the plain loop an expert would write, same model, batch, precision and layout, its
# data already on the device; on one device whatever NPROC is (compare per GPU).
peer() {  # peer <run dir> <name> <peer_loop.py arguments...>
    local dir=$1 name=$2 status=0; shift 2
    time_for "$name" || return 0
    "${LIMIT[@]}" "$PYTHON" benchmarks/peer_loop.py --batch "$BATCH" --steps "$STEPS" \
        --warmup "$WARMUP" --image-size "$IMAGE_SIZE" --name "$name" --output "$dir.json" "$@" \
        > "$dir.log" 2>&1 || status=$?
    if after "$name" "$dir.log" "$status"; then
        "$PYTHON" -c "import json, sys; r = json.load(open(sys.argv[1]))
print(f\"{r['run']}: {r['images_per_second']:,.0f} images/s (median of {r['steps']} steps)\")" \
            "$dir.json"
    fi
}
if [ "${PEER:-1}" = 1 ]; then
    echo "Plain PyTorch loop beside it (benchmarks/peer_loop.py), one device"
    peer "$OUT/peer" "peer plain loop bf16 channels_last"
    if [ "$COMPILE" = 1 ]; then
        peer "$OUT/peer-compile" "peer plain loop bf16 channels_last compile" --compile
    fi
fi

# From JPEGs: a generated folder of ImageNet-like files, decoded by the loader workers, then by
# the device.
JPEGS=${JPEGS:-1024}
if [ "$JPEGS" -gt 0 ]; then
    echo "ResNet-50 from a folder of $JPEGS generated JPEGs (500x375, quality 90), $WORKERS workers"
    if time_for "jpeg folder"; then
        status=0
        "${LIMIT[@]}" "$PYTHON" -c "import sys; sys.path.insert(0, 'benchmarks')
import input_pipeline as p
from pathlib import Path; p.make_folder(Path(sys.argv[1]), int(sys.argv[2]))" \
            "$OUT/jpegs" "$JPEGS" > "$OUT/jpegs.log" 2>&1 || status=$?
        after "jpeg folder" "$OUT/jpegs.log" "$status" || rm -rf "$OUT/jpegs"
    fi
    JPEG_EPOCHS=$(( (GLOBAL * (STEPS + WARMUP) + JPEGS - 1) / JPEGS ))
    if [ -d "$OUT/jpegs/train" ]; then
        part "resnet50 bf16 channels_last jpeg folder" "$OUT/resnet50-jpeg" "${RESNET[@]}" \
            --set data.name=imagefolder --set data.path="$OUT/jpegs" \
            --set epochs="$JPEG_EPOCHS" --set eval_every="$JPEG_EPOCHS"
        # The same folder with the JPEGs decoded by the device (nvJPEG), the workers only reading.
        part "resnet50 bf16 channels_last jpeg folder device decode" "$OUT/resnet50-jpeg-device" \
            "${RESNET[@]}" --set data.name=imagefolder --set data.path="$OUT/jpegs" \
            --set epochs="$JPEG_EPOCHS" --set eval_every="$JPEG_EPOCHS" \
            --set data.decode_on_device=true
    fi
fi

for seed in ${FMNIST_SEEDS:-0}; do  # seed 0 keeps the plain name; others are named by seed
    suffix=$([ "$seed" = 0 ] || echo " seed $seed")
    echo "Fashion-MNIST, default recipe$suffix, $FMNIST_EPOCHS epochs ($FMNIST_WARMUP warm-up), bf16 + channels_last"
    part "fashion-mnist default recipe$suffix" "$OUT/fashion-mnist${suffix// /-}" \
        --set epochs="$FMNIST_EPOCHS" --set schedule.warmup_epochs="$FMNIST_WARMUP" \
        --set seed="$seed" --set precision=bf16 --set channels_last=true --set log_every=1 \
        "${FMNIST_EXTRA[@]}"
done

"$PYTHON" - "$OUT" "$NPROC" "$BATCH" "$CPU_DRY_RUN" <<'EOF'
import datetime, glob, json, subprocess, sys, torch
out, nproc, batch, dry_run = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                        text=True).stdout.strip() or None
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU dry run)"
record = {"benchmark": "train_throughput", "suite": "gpu", "gpu": gpu, "gpus": nproc,
          "batch_per_gpu": batch, "torch": torch.__version__, "cuda": torch.version.cuda,
          "commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
          "runs": [json.load(open(path)) for path in sorted(glob.glob(f"{out}/*.json"))],
          "anchors_images_per_second_one_gpu": {"A100 PyTorch mixed precision": 2470,
                                                "H200 MLPerf MXNet": 7900}}
with open(f"{out}/dry-run.jsonl" if dry_run or not torch.cuda.is_available()
          else "docs/results/train_throughput.jsonl", "a") as file:
    file.write(json.dumps(record) + "\n")
print(json.dumps(record))
EOF
# JPEGs decoded on the GPU against the loader workers' decoding: the same files skipped (two
# cut short), how far the crops differ, the GPU's own decode rate (benchmarks/device_decode_check.py,
# appended to docs/results/device_decode.jsonl). After the throughput record, as below.
if [ "$JPEGS" -gt 0 ]; then
    echo "JPEG decoding on the device against the loader workers'"
    if [ "$CPU_DRY_RUN" = 1 ]; then
        decode_check=(--device cpu --images 16 --batch 8 --rounds 1 --out "$OUT/device_decode.jsonl")
    else
        decode_check=(--device cuda)
    fi
    if time_for "device decode check"; then
        status=0
        "${LIMIT[@]}" "$PYTHON" benchmarks/device_decode_check.py "${decode_check[@]}" \
            > "$OUT/device_decode.log" 2>&1 || status=$?
        if after "device decode check" "$OUT/device_decode.log" "$status"; then
            tail -n 30 "$OUT/device_decode.log"
        fi
    fi
fi

# The Triton LARS and LAMB steps against the eager ones (benchmarks/triton_step_check.py,
# appended to docs/results/triton_step.jsonl): the same weights to rounding, run to run, and
# from views at odd offsets; on the CPU dry run in Triton's interpreter.
if time_for "triton step check"; then
    echo "The Triton LARS and LAMB steps against the eager ones"
    if [ "$CPU_DRY_RUN" = 1 ]; then
        triton_check=(--device cpu --out "$OUT/triton_step.jsonl")
    else
        triton_check=(--device cuda)
    fi
    status=0
    "${LIMIT[@]}" "$PYTHON" benchmarks/triton_step_check.py "${triton_check[@]}" \
        > "$OUT/triton_step.log" 2>&1 || status=$?
    if after "triton step check" "$OUT/triton_step.log" "$status"; then
        tail -n 1 "$OUT/triton_step.log"
    fi
fi

# The optimizer step against torch's fused SGD and AdamW on the GPU (LARS and LAMB through the
# Triton kernels, and on their multi-tensor paths), appended to docs/results/lars_step.jsonl; under a minute. After the
# throughput record, so that a failure here loses nothing. It needs
# timm (the dev extra) for timm's Lars and Lamb: skipped, and said so, without it.
optimizer_step() {  # optimizer_step <name> <seconds, 0 for no limit> <lars_step.py arguments...>
    local name=$1 seconds=$2 status=0; shift 2
    time_for "$name" "$seconds" || return 0  # its own bound, or what is left if less
    "${LIMIT[@]}" "$PYTHON" benchmarks/lars_step.py --device cuda --repeats 30 "$@" \
        > "$OUT/$name.out" 2> "$OUT/$name.log" || status=$?
    if after "$name" "$OUT/$name.log" "$status"; then
        "$PYTHON" -c "import json, sys; print(json.dumps(json.load(open(sys.argv[1]))['ratios'], indent=1))" "$OUT/$name.out" || true
    fi
}
if [ "$CPU_DRY_RUN" != 1 ] && [ "${LARS_STEP:-1}" = 1 ]; then
    if "$PYTHON" -c "import timm" >/dev/null 2>&1; then
        echo "Optimizer step on ResNet-50's parameters, GPU"
        optimizer_step lars_step 0 --no-compile
        # The compiled LARS and LAMB steps (one traced update per parameter group) beside the
        # same baselines, as a separate record: compiling may take minutes, so it is bounded.
        echo "Optimizer step, compiled LARS and LAMB (at most ${COMPILED_STEP_S:-240} s)"
        optimizer_step lars_step_compiled "${COMPILED_STEP_S:-240}" \
            --only sgd_fused,adamw_fused,lars,lamb,lars_compiled,lamb_compiled
    else
        echo "Optimizer step: skipped (timm is not installed: pip install -e '.[dev]')"
    fi
fi

echo "runs and logs in $OUT"
[ "${#SKIPPED[@]}" -eq 0 ] || echo "gpu.sh: ${#SKIPPED[@]} part(s) skipped at their time limit: ${SKIPPED[*]}" >&2
[ "${#FAILED[@]}" -eq 0 ] || fail "${#FAILED[@]} part(s) failed: ${FAILED[*]}" 2
