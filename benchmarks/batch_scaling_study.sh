#!/usr/bin/env bash
# Batch-size scaling study on Fashion-MNIST -> docs/results/batch_scaling/
#
# SGD (linear LR scaling) vs LARS (sqrt LR scaling, eta = 0.001), both with the same 1-epoch
# linear warmup, poly(2) decay, 5-epoch budget, BatchNorm batch (micro-batch) 128, model
# (small_cnn, width 8) and seed, at global batches 128 ... 16384; best top-1 of 5 LRs per point
# (grid factor 2, extended while the best is at an edge, up to 4 more LRs).
# The smallest batch is the anchor: larger batches are centred on its best LR scaled by each
# optimizer's rule (see src/bigbatch/sweep.py). The anchor grids are centred on SGD 0.8 and
# LARS 5.66 at batch 128, the middle of an exploratory pass (SGD 0.05-3.2, LARS 0.71-22.6).
#
# Cost: about an hour on 2 shared CPU cores (one training at a time, one torch thread).
# Resumable: rerun the same command and finished runs are kept.
# Prints the best point of every (batch, optimizer) as JSON lines.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
OUT=${OUT:-runs/batch_scaling}
RESULTS=${RESULTS:-docs/results/batch_scaling}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

"$PYTHON" -m bigbatch sweep --recipe fashion-mnist \
  --batch-sizes 128,512,2048,4096,8192,16384 --optimizers sgd,lars \
  --epochs 5 --lrs-per-point 5 --lr-grid-factor 2 --max-extensions 4 \
  --warmup-epochs 1 --micro-batch 128 --threads 1 \
  --sgd-lr 0.8 --sgd-reference-batch 128 --lars-lr 5.656854249492381 --lars-reference-batch 128 \
  --set model.name=small_cnn --set model.options.width=8 \
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
