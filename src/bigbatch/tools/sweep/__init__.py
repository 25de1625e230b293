"""The batch-size scaling study: accuracy against global batch, SGD (linear scaling) against
LARS (either semantics) and LAMB.

    bigbatch sweep --recipe fashion-mnist --batch-sizes 128,512,2048,8192,16384 \
        --optimizers sgd,lars --epochs 4 --lrs-per-point 3 --out runs/sweep

For every (batch B, optimizer) point the sweep trains a small grid of peak learning rates at a
fixed epoch budget and reports the best top-1, as Tables 3 and 4 of You et al.,
"ImageNet Training in Minutes" (ICPP 2018) do.

Grid centres (the rule each optimizer is known by):

* ``sgd``: the linear scaling rule of Goyal et al., peak LR = lr0 * B / B0
  (config ``optim.lr_scaling: linear``), with the shared warmup.
* ``lars``: square-root scaling, peak LR = lr0 * sqrt(B / B0) (``optim.lr_scaling: sqrt``).
  With the trust ratio normalising each layer's step, the LR the paper found best grows far
  slower than B (AlexNet-BN: 2 at 512, 10 at 4K, 14 at 8K, 23 at 16K, 22 at 32K, i.e. x11 for
  x64 in batch); sqrt scaling (x8 for x64) is the simplest rule that tracks that curve, and the
  grid plus automatic extension absorbs the rest.
* ``lars-paper`` / ``lars-mlperf``: LARS with every tensor adapted (the authors' Intel Caffe
  release) / with BatchNorm and bias tensors excluded (MLPerf), each pinned whatever the recipe
  says; ``lamb``: LAMB (You et al., ICLR 2020), square-root scaling. Each has its own
  ``--<name>-lr`` / ``--<name>-reference-batch`` (series.py).

With ``--set eval.bn_recompute=N`` every run reports top-1 with recomputed BatchNorm statistics
and as trained; the best LR is chosen on the recomputed number. ``--seeds`` and
``--seed-batches`` rerun the best LR of the named batches with more seeds.

Anchoring (default): the smallest batch's grid is centred on the rule as given (``--sgd-lr`` at
``--sgd-reference-batch``, likewise for LARS); every larger batch's grid is centred on the best
LR measured at the smallest batch, scaled by the optimizer's rule (lr0 = that best LR, B0 = the
smallest batch). That is how a scaling rule is used in practice (tune small, then scale), it
needs no guess of the right LR for a recipe and epoch budget, and both optimizers get exactly
the same procedure. ``--no-anchor`` centres every point on the rule as given.

Fairness: both optimizers get the same number of LRs per point, the same grid spacing, epoch
budget, warmup length, schedule (poly, power 2), micro-batch (= BatchNorm batch), model and seed.
If the best LR of a point lies at the edge of its grid, the grid is extended by one factor in that
direction and the new LR is run, up to ``max_extensions`` times; every extension is recorded.
A run that ends within FAILED_MARGIN_POINTS of chance top-1 failed to learn and counts like a
diverged one for that decision, so a grid of collapsed runs keeps growing towards smaller LRs
instead of declaring one collapsed run (10.08% against 10.00%) an interior optimum.

A run that stops on a non-finite loss is recorded as diverged (top-1 ``nan``). A run whose
``summary.json`` (or ``diverged.json``) exists is not run again, so an interrupted sweep resumes
where it stopped, and a run cut short mid-way resumes from its last checkpoint.

Modules: series (the optimizers compared), search (LR grids), records (results and files),
runner (runs and the loop).
"""
