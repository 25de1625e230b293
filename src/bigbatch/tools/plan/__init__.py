"""How far will it scale? Time per step, per epoch and to train for p data-parallel devices.

    bigbatch plan --model resnet50 --epochs 90 --batch-size 32768 --devices 2048 --preset knl-opa
    bigbatch plan --model resnet50 --epochs 90 --target-minutes 30 --preset a100-dgx
    bigbatch plan --model resnet18 --device-images-per-second 300 --allreduce-json ar.json
    bigbatch plan --paper
    bigbatch plan --published

The model (You et al., "ImageNet Training in Minutes", ICPP 2018: computation scales
with the images, communication with the parameters) for a global batch B on p devices:

- compute per step         C(p) = (B / p) / (r x f), with r the device's training images/s
  and f its losses in a multi-node run (``DeviceLosses``, 1 unless the preset states them):
    batch curve: b / (b + h) at b = B/p images per device, over the same at the batch the
                 figure was measured at (a fixed per-step cost shared by fewer images);
    core share:  the share of cores left for compute once the job spans several nodes;
- gradient all-reduce      n = parameters x 4 bytes (fp32) or x 2 (bf16), per step, costing
    ring:  T = 2(p-1) alpha + 2(p-1)/p n beta       (reduce-scatter + all-gather)
    tree:  T = 2 log2(p) (alpha + n beta)           (reduce to a root, broadcast back)
  with alpha the latency per message and beta the seconds per byte of one link. With several
  devices per node the all-reduce is hierarchical: a ring inside the node on the intra-node link,
  plus the ring (or tree) above over the nodes, where beta is the node's network injection
  bandwidth (all its NICs);
- overlap: each layer's all-reduce starts when its backward finishes (the same paper;
  DDP does the same per bucket), so up to the backward pass, taken as 2/3 of compute, can hide it.
  Assumption: a fraction ``overlap`` (default 0.5) of backward is available, because the first
  gradients arrive only after the last layers' backward, the last ones have nothing left to hide
  under, and communication shares the device with compute (NCCL kernels, MLSL cores).
  exposed = max(0, T - overlap x 2/3 x C);
- step = C + exposed; steps per epoch = floor(N / B) (the partial last batch is dropped, as
  bigbatch's sampler does); time to train = epochs x steps per epoch x step;
- scaling efficiency = single-device time / (p x time on p) = f C / step: the fraction of the
  time the devices compute at their published rate.

Not modelled: data loading, stragglers, contention in the network core, and the achievable
fraction of nominal link rates (the all-reduce uses them as they are).

Modules: network (all-reduce cost), workload (step model), stats (model size, device
throughput), paper (the paper's runs), presets (hardware and paper figures), report (text/JSON).
``bigbatch plan --published`` sets a finer model against published runs (MLPerf, the large-batch
records): published (the data file published.json and its labelled inputs), prediction (the run
model and its one fitted constant), curve (a device's step time t0 + b c), layers (kernels and
memory-bound bytes per image).
"""
