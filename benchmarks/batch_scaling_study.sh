#!/usr/bin/env bash
# Batch-size scaling study on Fashion-MNIST -> docs/results/batch_scaling/
#
#   benchmarks/batch_scaling_study.sh            # the study (about 55 min on 2 shared CPU cores)
#   benchmarks/batch_scaling_study.sh ablation   # the ablation that explains it (about 100 min)
#
# The study: SGD (linear LR scaling) vs LARS (sqrt LR scaling, eta = 0.001), both with the same
# 1-epoch linear warmup, poly(2) decay, 5-epoch budget, BatchNorm batch (micro-batch) 128, model
# (small_cnn, width 8), seed and recipe (fashion-mnist: label smoothing 0.1, weight decay 5e-4,
# BN and bias excluded from LARS and decay), at global batches 128 ... 16384; best top-1 of 5 LRs
# per point (grid factor 2, extended while the best is at an edge, up to 4 more LRs). The smallest
# batch is the anchor: larger batches are centred on its best LR scaled by each optimizer's rule
# (see src/bigbatch/tools/sweep/). The anchor grids are centred on SGD 0.8 and LARS 5.66 at batch 128,
# the middle of an exploratory pass (SGD 0.05-3.2, LARS 0.71-22.6, all at batch 128).
#
# One training at a time, one torch thread. Resumable: rerun the same command and finished runs
# are kept. Prints the best point of every (batch, optimizer) as JSON lines.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-runs/batch_scaling}
RESULTS=${RESULTS:-docs/results/batch_scaling}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

common=(--recipe fashion-mnist --lr-grid-factor 2 --micro-batch 128 --threads 1
        --set model.name=small_cnn --set model.options.width=8)
anchors=(--sgd-lr 0.8 --sgd-reference-batch 128
         --lars-lr 5.656854249492381 --lars-reference-batch 128)

study() {
  "$PYTHON" -m bigbatch sweep "${common[@]}" "${anchors[@]}" \
    --batch-sizes 128,512,2048,4096,8192,16384 --optimizers sgd,lars \
    --epochs 5 --lrs-per-point 5 --max-extensions 4 --warmup-epochs 1 \
    --out "$OUT"
  mkdir -p "$RESULTS"
  cp "$OUT/sweep.csv" "$OUT/sweep.json" "$OUT/sweep.md" "$RESULTS/"
  "$PYTHON" -m bigbatch plot "$OUT" --out "$RESULTS/sweep.png"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "cores: $(nproc) (shared with other jobs; load average: $(cut -d' ' -f1-3 /proc/loadavg))"
    "$PYTHON" -c "import platform, torch; print('python:', platform.python_version()); print('torch:', torch.__version__, '| threads: 1')"
  } > "$RESULTS/machine.txt"
  "$PYTHON" -c "
import json, sys
for point in json.load(open(sys.argv[1]))['best']:
    print(json.dumps({k: point[k] for k in ('batch', 'optimizer', 'best_lr', 'best_top1', 'extensions')}))
" "$RESULTS/sweep.json"
}

# Re-evaluate every run of a sweep with its BatchNorm statistics recomputed from the final
# weights (plain average over 50 training micro-batches of 128; no training, no LR), written to
# sweep_bn_recalibrated.csv. The engine's running statistics are an exponential average (momentum
# 0.1) updated once per global step, which after 15 or 35 steps still reflects old weights.
recalibrate() {
  "$PYTHON" - "$1" <<'PY'
import csv, json, sys
from pathlib import Path

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from bigbatch.build import datasets_for, model_for
from bigbatch.config import config_from_dict
from bigbatch.distributed import DistContext
from bigbatch.evaluate import evaluate

torch.set_num_threads(1)
sweep = Path(sys.argv[1])
ctx = DistContext(rank=0, world_size=1, local_rank=0, backend=None, device=torch.device("cpu"))
data, rows = {}, []
for run in json.loads((sweep / "sweep.json").read_text())["runs"]:
    row = {k: run[k] for k in ("batch", "optimizer", "lr", "top1")}
    weights = sweep / run["run_dir"] / "final.pt"
    if not weights.is_file():  # diverged: no final weights
        rows.append({**row, "top1_recalibrated": None})
        continue
    state = torch.load(weights, map_location="cpu", weights_only=False)
    cfg = config_from_dict(state["config"])
    key = (cfg.data.name, cfg.data.train_subset)
    if key not in data:
        data[key] = datasets_for(cfg)
    train, val = data[key]
    model = model_for(cfg, train.num_classes, train.in_channels)
    model.load_state_dict(state["model"])
    for module in model.modules():
        if isinstance(module, _BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # cumulative average over the calibration batches
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0)).tolist()
    model.train()
    with torch.no_grad():
        for i in range(min(50, len(train) // 128)):
            model(train.__getitems__([(j, 0) for j in order[i * 128:(i + 1) * 128]]).images)
    rows.append({**row, "top1_recalibrated": round(evaluate(model, val, ctx, 512)["top1"], 2)})
with (sweep / "sweep_bn_recalibrated.csv").open("w", newline="") as file:
    writer = csv.DictWriter(file, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
print(f"wrote {sweep / 'sweep_bn_recalibrated.csv'}")
PY
}

# Each ablation changes one thing at the 5-epoch budget, or the budget itself, for both optimizers
# alike; its grid (3 LRs, x2 apart, extended as in the study) is centred on the study's best LR of
# that (batch, optimizer) point.
ablation() {
  local A=$OUT-ablation
  at8192=(--batch-sizes 8192 --no-anchor --sgd-lr 3.2 --sgd-reference-batch 8192
          --lars-lr 22.627416997969522 --lars-reference-batch 8192)
  at2048=(--batch-sizes 2048 --no-anchor --sgd-lr 3.2 --sgd-reference-batch 2048
          --lars-lr 11.313708498984761 --lars-reference-batch 2048)
  run() {
    local name=$1; shift
    "$PYTHON" -m bigbatch sweep "${common[@]}" --optimizers sgd,lars --lrs-per-point 3 \
      --max-extensions 2 "$@" --out "$A/$name"
  }
  run b8192-warmup2  "${at8192[@]}" --epochs 5 --warmup-epochs 2
  run b8192-lars-all "${at8192[@]}" --epochs 5 --warmup-epochs 1 --set optim.exclude_bn_and_bias=false
  run b8192-wd0      "${at8192[@]}" --epochs 5 --warmup-epochs 1 --set optim.weight_decay=0
  run b8192-bn512    "${at8192[@]}" --epochs 5 --warmup-epochs 1 --micro-batch 512
  run b8192-epochs20 "${at8192[@]}" --epochs 20 --warmup-epochs 1
  run b2048-epochs20 "${at2048[@]}" --epochs 20 --warmup-epochs 1
  run b128-epochs20  --batch-sizes 128 --no-anchor --optimizers sgd --sgd-lr 1.6 \
    --sgd-reference-batch 128 --epochs 20 --warmup-epochs 1
  # the study again with LARS on every tensor, as in the authors' Intel Caffe release
  "$PYTHON" -m bigbatch sweep "${common[@]}" "${anchors[@]}" \
    --batch-sizes 128,2048,8192,16384 --optimizers sgd,lars \
    --epochs 5 --lrs-per-point 5 --max-extensions 4 --warmup-epochs 1 \
    --set optim.exclude_bn_and_bias=false --out "$A/paper-semantics"
  # there a 15% run at LR 102 counted as "learned" and stopped SGD's grid at 16384 above the LRs
  # where SGD learns; the same lower grid the study found for SGD at 16384, run afterwards:
  run paper-semantics-sgd16384-lower --batch-sizes 16384 --no-anchor --optimizers sgd \
    --sgd-lr 6.4 --sgd-reference-batch 16384 --epochs 5 --warmup-epochs 1 \
    --set optim.exclude_bn_and_bias=false
  recalibrate "$OUT"
  for sweep in "$A"/*/; do recalibrate "$sweep"; done
  mkdir -p "$RESULTS/ablation"
  cp "$OUT/sweep_bn_recalibrated.csv" "$RESULTS/"
  for sweep in "$A"/*/; do
    name=$(basename "$sweep")
    cp "$sweep/sweep.csv" "$RESULTS/ablation/$name.csv"
    cp "$sweep/sweep_bn_recalibrated.csv" "$RESULTS/ablation/$name-bn-recalibrated.csv"
  done
  cp "$A/paper-semantics/sweep.json" "$RESULTS/ablation/paper-semantics.json"
  cp "$A/paper-semantics/sweep.md" "$RESULTS/ablation/paper-semantics.md"
  "$PYTHON" -m bigbatch plot "$A/paper-semantics" --out "$RESULTS/ablation/paper-semantics.png"
}

case "${1:-study}" in
  study) study ;;
  ablation) ablation ;;
  *) echo "usage: $0 [study|ablation]" >&2; exit 2 ;;
esac
