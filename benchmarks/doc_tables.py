"""The results tables of README.md and docs/*.md, each drawn from its record under docs/results/.

Every table is a function of the results folder that returns Markdown, registered in
:data:`TABLES` under the name its marker uses (``<!-- table:NAME -->`` … ``<!-- /table:NAME -->``,
rendered by render_docs.py). To add one: write ``def my_table(results: Path) -> str``, decorate it
with ``@table("my-table")`` and put the two markers where it goes. Figures are printed with the
statistics of figures.py only; a missing record raises figures.NoRecord ("no record yet").
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from figures import (
    NoRecord,
    commits_text,
    duration_runs_text,
    loads_text,
    machine_label,
    paired_text,
    ratio_text,
    read_json,
    read_jsonl,
    runs_text,
)
from study90 import BASELINE_BATCH, BATCHES, MATCHED_32K, WARMUP
from study90_text import cell, imagenet_batch

Table = Callable[[Path], str]
TABLES: dict[str, Table] = {}


def table(name: str) -> Callable[[Table], Table]:
    def register(function: Table) -> Table:
        TABLES[name] = function
        return function
    return register


def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def grouped(records: Iterable[dict], key: Callable[[dict], Any]) -> dict[Any, list[dict]]:
    """Records grouped by ``key``, groups and records in file order."""
    groups: dict[Any, list[dict]] = {}
    for record in records:
        groups.setdefault(key(record), []).append(record)
    return groups


# ----------------------------------------------------------------------------- default recipe

SEEDS = "default_recipe/seeds.jsonl"


def recipe_run_key(record: dict) -> tuple:
    """Runs of one configuration on one machine: steps, processes, overrides, ISA held, machine."""
    return (record["steps"], record.get("world_size", 1), tuple(record.get("overrides", ())),
            bool(record.get("kernels_held_to_avx2")), machine_label(record["machine"]))


def recipe_machine(key: tuple) -> str:
    return key[4] + (", kernels held to AVX2, fp32" if key[3] else "")


def recipe_row(key: tuple, runs: list[dict]) -> list[str]:
    memory = [r["peak_pss_mib_all_processes"] / 1024 for r in runs
              if "peak_pss_mib_all_processes" in r]
    return [f"{key[0]} steps, {key[1]} process(es)" + (f", {', '.join(key[2])}" if key[2] else ""),
            recipe_machine(key), runs_text([r["top1"] for r in runs], unit="%"),
            duration_runs_text([r["wall_seconds"] for r in runs]),
            runs_text(memory, unit=" GiB") if memory else "not recorded",
            f"{loads_text(runs)}; {commits_text(runs)}"]


def shipped_recipe_groups(results: Path) -> dict[tuple, list[dict]]:
    """The latest group of runs of the recipe as shipped (no overrides), per ISA setting."""
    groups = grouped(read_jsonl(results / SEEDS), recipe_run_key)
    latest: dict[bool, tuple] = {}
    for key in groups:
        if not key[2]:
            latest[key[3]] = key
    return {key: groups[key] for key in latest.values()}


@table("default-recipe-runs")
def default_recipe_runs(results: Path) -> str:
    groups = grouped(read_jsonl(results / SEEDS), recipe_run_key)
    return markdown(["runs of", "machine", "top-1", "wall time of the command",
                     "memory, all processes (PSS)", "load; commits"],
                    (recipe_row(key, runs) for key, runs in groups.items()))


# ----------------------------------------------------------------------------- optimizer step

# Commit 0c1fab8 (this date) made the LARS kernel read every step's weight norms from the
# weights; before it, the norm kept from the previous update was reused (one read fewer).
LARS_NORMS_READ_SINCE = "2026-12-04T21:15:00+00:00"


def step_key(record: dict) -> tuple:
    machine = record["machine"]
    kernels = bool(record.get("lars_kernel")) and bool(record.get("lamb_kernel"))
    torch = machine.get("torch") or machine.get("versions", {}).get("torch")
    date = machine.get("date") or record.get("time") or ""
    return (machine_label(machine), machine.get("device", "cpu"), kernels, torch,
            date >= LARS_NORMS_READ_SINCE)


STEP_RATIOS = (("lars/sgd_fused", "LARS / `SGD(fused=True)`"),
               ("lamb/adamw_fused", "LAMB / `AdamW(fused=True)`"),
               ("lars/timm_lars", "LARS / timm `Lars`"),
               ("lars_compiled/sgd_fused", "LARS `fused_compile=True` / `SGD(fused=True)`"),
               ("lamb_compiled/adamw_fused", "LAMB `fused_compile=True` / `AdamW(fused=True)`"))


def step_groups(results: Path) -> dict[tuple, list[dict]]:
    """Runs with both compiled kernels (the path `pip install` builds), per machine."""
    groups = grouped(read_jsonl(results / "lars_step.jsonl"), step_key)
    return {key: runs for key, runs in groups.items() if key[2]}


def step_rows(results: Path) -> Iterable[list[str]]:
    for key, runs in step_groups(results).items():
        for name, label in STEP_RATIOS:
            compiled = "compiled" in name
            per_run = [r["ratios"][name]["median_paired"] for r in runs if name in r["ratios"]]
            if not per_run or (compiled and not key[4]):  # compiled: as the code is now only
                continue
            kernel = "" if key[1] != "cpu" or compiled else (
                ", kernels as now" if key[4] else ", LARS norm kept from the last update")
            yield [label + kernel, ratio_text(per_run), f"{key[0]}, {key[1]}, torch {key[3]}",
                   f"{loads_text(runs)}; {commits_text(runs)}"]


@table("optimizer-step")
def optimizer_step(results: Path) -> str:
    return markdown(["step time, ResNet-50's parameters", "ratio", "machine", "load; commits"],
                    step_rows(results))


# ----------------------------------------------------------------------------- input pipeline

PIPELINES = (("imagefolder_fast_decode_uint8", "ImageFolder JPEG pipeline, uint8 batches"),
             ("packed_raw", "packed raw shards"),
             ("packed_jpeg_uint8", "packed JPEG shards, uint8 batches"),
             ("webdataset_jpeg_uint8", "WebDataset shards, uint8 batches"),
             ("imagefolder_device_decode",
              "ImageFolder, JPEGs decoded on the device: the workers' share"),
             ("webdataset_device_decode",
              "WebDataset shards, JPEGs decoded on the device: the workers' share"))


def pipeline_ratio(record: dict, name: str) -> float | None:
    """A run's ratio to torchvision's ImageFolder: the median of the paired per-round ratios
    where the run kept its rounds, else the ratio the run recorded (of its medians)."""
    rounds = record.get("images_per_s_rounds", {})
    if name in rounds:
        return statistics.median(a / b for a, b in zip(rounds[name],
                                                       rounds["torchvision_imagefolder"],
                                                       strict=True))
    return record["speedup_vs_torchvision"].get(name)


@table("input-pipeline")
def input_pipeline(results: Path) -> str:
    records = read_jsonl(results / "input_pipeline.jsonl")
    rows = []
    for name, label in PIPELINES:
        runs = [r for r in records if pipeline_ratio(r, name) is not None]
        if runs:
            rows.append([label, ratio_text([pipeline_ratio(r, name) for r in runs]),
                         ", ".join(sorted({machine_label(r["machine"]) for r in runs})),
                         loads_text(runs)])
    return markdown(["images/s per core / torchvision ImageFolder", "ratio", "machine", "load"],
                    rows)


# ----------------------------------------------------------------------------- engine overhead

@table("engine-overhead")
def engine_overhead(results: Path) -> str:
    records = [r for r in read_jsonl(results / "train_throughput.jsonl")
               if r.get("suite") == "overhead"]
    if not records:
        raise NoRecord("train_throughput.jsonl: no overhead runs")
    groups = grouped(records, lambda r: (r["workload"], r["global_batch"],
                                         r["options"]["precision"], r["options"]["channels_last"],
                                         machine_label(r["machine"])))
    rows = [[f"{key[0]}, batch {key[1]}, {key[2]}" + (", channels_last" if key[3] else ""),
             ratio_text([r["ratio_to_plain_loop"]["engine"]["median_paired"] for r in runs],
                        digits=3),
             key[4], f"{loads_text(runs)}; {commits_text(runs)}"] for key, runs in groups.items()]
    return markdown(["engine / plain PyTorch loop, same objects", "ratio", "machine",
                     "load; commits"], rows)


# ----------------------------------------------------------------------------- GPU

@table("gpu")
def gpu(results: Path) -> str:
    rows = []
    for entry in read_json(results / "gpu" / "summary.json"):
        for name, run in entry["runs"].items():
            speed = run["images_per_second"]
            rows.append([name, runs_text(speed["runs"], digits=0),
                         f"one {entry['gpu']}, torch {', '.join(entry['torch'])}",
                         ", ".join(sorted(set(entry["commits"])))])
    return markdown(["workload (`benchmarks/gpu.sh`)", "images/s", "machine", "commits"], rows)


# ----------------------------------------------------------------------------- sweeps

SERIES = {"sgd": "SGD + linear scaling + warmup", "nesterov": "Nesterov SGD",
          "lars-paper": "LARS, every tensor (the paper's)",
          "lars-mlperf": "LARS, BN and bias excluded (MLPerf's)", "lars": "LARS", "lamb": "LAMB"}


def sweep_best(results: Path, folder: str) -> tuple[list, list[str], list[int]]:
    best = read_json(results / folder / "sweep.json")["best"]
    series = list(dict.fromkeys(point["optimizer"] for point in best))
    batches = sorted({point["batch"] for point in best})
    return best, series, batches


def best_cell(point: dict | None) -> str:
    if point is None or point.get("best_top1") is None:
        return "—"
    return f"{point['best_top1']:.2f}" + (" (best LR at its grid's edge)"
                                          if point.get("best_at_edge") else "")


def sweep_table(results: Path, folder: str) -> str:
    best, series, batches = sweep_best(results, folder)
    at = {(p["batch"], p["optimizer"]): p for p in best}
    rows = [[batch, next(p["steps"] for p in best if p["batch"] == batch),
             *(best_cell(at.get((batch, name))) for name in series)] for batch in batches]
    return markdown(["batch", "steps", *(SERIES.get(name, name) for name in series)], rows)


def sweep_seeds_table(results: Path, folder: str) -> str:
    best, _, _ = sweep_best(results, folder)
    rows = [[point["batch"], SERIES.get(point["optimizer"], point["optimizer"]),
             ", ".join(seeds["top1"]), runs_text(list(seeds["top1"].values()), unit="%")]
            for point in best if (seeds := point.get("seeds"))]
    if not rows:
        raise NoRecord(f"{folder}/sweep.json: no seed reruns")
    return markdown(["batch", "series", "seeds", "top-1 at the best LR"], rows)


@table("batch-scaling-20ep")
def batch_scaling_20ep(results: Path) -> str:
    return sweep_table(results, "batch_scaling_20ep")


@table("batch-scaling-20ep-seeds")
def batch_scaling_20ep_seeds(results: Path) -> str:
    return sweep_seeds_table(results, "batch_scaling_20ep")


def study90_verdict_record(results: Path) -> dict:
    return read_json(results / "batch_scaling_90ep" / "verdict.json")


@table("batch-scaling-90ep")
def batch_scaling_90ep(results: Path) -> str:
    """Each point at the warmup its verdict uses (the one chosen at the 32K-matched batch)."""
    record = study90_verdict_record(results)
    chosen = {row["series"]: row["warmup"] for row in record["warmup"] if row["chosen"]}
    at = {(p["batch"], p["series"]): p for p in record["points"]
          if p["warmup"] == (chosen.get(p["series"], WARMUP) if p["batch"] == MATCHED_32K
                             else WARMUP)}
    series = list(dict.fromkeys(name for batch, name in at if batch != BASELINE_BATCH))
    rows = [[f"{batch} (≙ {imagenet_batch(batch)})" if batch != BASELINE_BATCH
             else f"{batch} (the baseline)",
             *(cell(at[(batch, name)], details=False) if (batch, name) in at else "—"
               for name in series)]
            for batch in (BASELINE_BATCH, *BATCHES)]
    return markdown(["batch (≙ ImageNet)", *(SERIES.get(name, name) for name in series)], rows)


@table("batch-scaling-90ep-verdict")
def batch_scaling_90ep_verdict(results: Path) -> str:
    claims = study90_verdict_record(results)["claims"]
    return markdown(["claim", "verdict"],
                    ([f"{c['claim']}. {c['text']}", c["outcome"]] for c in claims))


# ----------------------------------------------------------------------------- reliability

@table("cluster-faults")
def cluster_faults(results: Path) -> str:
    """The fault matrix's latest row per scenario (benchmarks/cluster_faults.py)."""
    latest = {r["scenario"]: r for r in read_jsonl(results / "cluster_faults.jsonl")}
    return markdown(["scenario", "nodes", "steps", "re-formed", "detected in", "recovered in",
                     "finished", "bit-identical", "straggler named", "machine, commit"],
                    (cluster_fault_row(r) for r in latest.values()))


def cluster_fault_row(record: dict) -> list[str]:
    def seconds(value: float | None) -> str:
        return "—" if value is None else f"{value:.1f} s"

    named = ", ".join(f"rank {s['rank']} ({s['kind']}, {s['host']})"
                      for s in record.get("stragglers") or []) or "—"
    return [record["scenario"], record["nodes"], record["steps"], record["restarts"],
            seconds(record["detect_seconds"]), seconds(record["recover_seconds"]),
            "yes" if record["finished"] else "no", "yes" if record["bit_identical"] else "no",
            named, f"{machine_label(record['machine'])}, {record['machine'].get('commit')}"]


# ----------------------------------------------------------------------------- README headline

def headline_recipe_rows(results: Path) -> Iterable[list[str]]:
    for key, runs in shipped_recipe_groups(results).items():
        yield ["`bigbatch train` (default recipe): top-1, wall time",
               f"{runs_text([r['top1'] for r in runs], unit='%')}; "
               f"{duration_runs_text([r['wall_seconds'] for r in runs])}",
               recipe_machine(key), f"[seeds.jsonl](docs/results/{SEEDS})"]


def headline_step_rows(results: Path) -> Iterable[list[str]]:
    """The optimizer-step ratios of the machine that measured last."""
    groups = step_groups(results)
    key = next(key for key in reversed(groups) if key[1] == "cpu")
    for name, label in STEP_RATIOS[:2]:
        yield [f"{label} step, ResNet-50's parameters",
               ratio_text([r["ratios"][name]["median_paired"] for r in groups[key]]),
               f"{key[0]}, torch {key[3]}", "[lars_step.jsonl](docs/results/lars_step.jsonl)"]


def headline_gpu_rows(results: Path) -> Iterable[list[str]]:
    for entry in read_json(results / "gpu" / "summary.json"):
        for name, run in entry["runs"].items():
            if name.startswith("resnet50"):
                yield [f"ResNet-50 images/s, batch 256, {name[len('resnet50 '):]}",
                       runs_text(run["images_per_second"]["runs"], digits=0),
                       f"one {entry['gpu']}", "[summary.json](docs/results/gpu/summary.json)"]


def headline_sweep_rows(results: Path) -> Iterable[list[str]]:
    best, _, _ = sweep_best(results, "batch_scaling_20ep")
    machine = read_json(results / "batch_scaling_20ep" / "sweep.json")["machine"]
    for point in best:
        if point.get("seeds") and point["batch"] == max(p["batch"] for p in best if p["seeds"]):
            yield [f"20-epoch study, batch {point['batch']}: "
                   f"{SERIES.get(point['optimizer'], point['optimizer'])}, top-1",
                   runs_text(list(point["seeds"]["top1"].values()), unit="%"),
                   f"{machine_label(machine)}, {machine.get('torch_threads')} thread(s)",
                   "[sweep.json](docs/results/batch_scaling_20ep/sweep.json)"]


@table("headline")
def headline(results: Path) -> str:
    rows = [*headline_recipe_rows(results), *headline_sweep_rows(results),
            *headline_step_rows(results), *headline_gpu_rows(results)]
    return markdown(["measurement", "median (range, runs)", "machine", "record"], rows)


# ----------------------------------------------------------------------------- 20-epoch verdict

EXPECTATIONS = (("e1", "LARS ≥ SGD at every batch ≥ 2048"),
                ("e2", "LARS ≥ SGD + 3 points at every batch ≥ 8192"),
                ("e3", "LARS within 1 point of the small-batch baseline up to the batch whose "
                       "steps per epoch match ImageNet's at 32K"))


def verdict_cell(checks: list[dict], key: str) -> str:
    judged = [check for check in checks if check[key] is not None]
    failed = [str(check["batch"]) for check in judged if not check[key]]
    if not judged:
        return "not judged"
    return f"**fails** at batch {', '.join(failed)}" if failed else "holds"


@table("batch-scaling-20ep-verdict")
def batch_scaling_20ep_verdict(results: Path) -> str:
    verdict = read_json(results / "batch_scaling_20ep" / "verdict.json")[0]
    series = grouped(verdict["checks"], lambda check: check["series"])
    return markdown(["the paper's expectation", *(SERIES.get(name, name) for name in series)],
                    ([text, *(verdict_cell(checks, key) for checks in series.values())]
                     for key, text in EXPECTATIONS))


# ----------------------------------------------------------------------------- precise BN

@table("precise-bn")
def precise_bn(results: Path) -> str:
    record = read_json(results / "precise_bn" / "gap.json")
    rows = []
    for name, run in record["runs"].items():
        leads = [e["top1"] - e["trained_top1"] for e in run["evaluations"]]
        rows.append([name.removeprefix("seed"), run["steps"], f"{run['top1_as_trained']:.2f}%",
                     f"{run['top1_recomputed']:.2f}%",
                     f"{min(leads):.1f} to {max(leads):.1f} points at {len(leads)} evaluations"])
    return markdown(["seed", "steps", "final top-1 as trained", "with recomputed statistics",
                     "recomputed − as trained"], rows) + \
        f"\n\n{machine_label(record['machine'])}; `{record['command']}`"


# ----------------------------------------------------------------------------- planner

def batches_text(values: Sequence[float]) -> str:
    return " → ".join(f"{value:,.0f}" for value in values)


def published_mark(row: dict) -> str:
    if row["calibration"]:
        return "calibration"
    return "ok" if row["in_band"] else "**miss** (cause below)"


@table("published-runs")
def published_runs(results: Path) -> str:
    """`bigbatch plan --published --json`: each published run predicted, then the speed-up."""
    record = read_json(results / "published_runs.json")
    rows = [[row["label"], row["hardware"], f"{row['devices']:,}",
             batches_text(row["global_batch"]), batches_text(row["per_device_batch"]),
             f"{row['epochs']:g}", f"{row['published_minutes']:g} min",
             f"{row['predicted_minutes']:.3g} min", f"{row['ratio']:.2f}",
             f"{row['band'][0]:.2f}–{row['band'][1]:.2f} {published_mark(row)}"]
            for row in record["rows"]]
    check, fitted = record["speedup"], record["calibration"]
    return markdown(["run", "hardware", "devices", "global batch", "per device", "epochs",
                     "published", "predicted", "ratio", "band"], rows) + (
        f"\n\nSpeed-up {check['from']} → {check['to']}: published {check['published']:.1f}×, "
        f"predicted {check['predicted']:.1f}× (ratio {check['ratio']:.2f}). One fitted "
        f"constant, `{fitted['constant']}` = {fitted['value']:.2f}, on {fitted['run']} only. "
        "`bigbatch plan --published --json > docs/results/published_runs.json` (each run's "
        "source and assumptions are in that record).\n\n" + "\n".join(
            f"- Miss, {row['label']}: {row['known_miss']}." for row in record["rows"]
            if row["known_miss"] and not row["in_band"]))


PUBLISHED_GROUPS = {"mlperf": "MLPerf Training ResNet-50, H100/H200, 8 to 3,584 GPUs",
                    "record": "large-batch ImageNet records (Goyal, Akiba, Mikami, Ying)",
                    "paper": "You et al., ICPP 2018: AlexNet on SKX, ResNet-50 on KNL"}


@table("published-runs-summary")
def published_runs_summary(results: Path) -> str:
    """The published-runs table in one row per group: how many runs fall in their band."""
    record = read_json(results / "published_runs.json")
    rows = []
    for group, runs in grouped(record["rows"], lambda row: row["group"]).items():
        ratios = [row["ratio"] for row in runs]
        band = runs[0]["band"]
        fitted = sum(bool(row["calibration"]) for row in runs)
        rows.append([PUBLISHED_GROUPS.get(group, group),
                     f"{len(runs)}" + (f" ({fitted} the calibration)" if fitted else ""),
                     f"{min(ratios):.2f}–{max(ratios):.2f}",
                     f"{band[0]:.2f}–{band[1]:.2f}",
                     f"{sum(row['in_band'] for row in runs)} of {len(runs)}"])
    check = record["speedup"]
    return markdown(["published runs", "runs", "predicted / published time", "band",
                     "in band"], rows) + (
        f"\n\nStrong scaling, {check['from']} → {check['to']}: published "
        f"{check['published']:.1f}×, predicted {check['predicted']:.1f}×.")


# ----------------------------------------------------------------------------- one-run ratios

SUITE_METHODS = {"threads": {"all_cores_passive_wait": "`OMP_WAIT_POLICY=PASSIVE`, all cores",
                             "one_thread": "one thread (`--set threads=1`)"},
                 "options": {"channels_last": "channels_last", "bf16": "bf16 autocast",
                             "bf16_channels_last": "bf16 + channels_last",
                             "compile": "torch.compile (fp32, contiguous)"},
                 "peer": {"bigbatch": "`bigbatch train`"}}
SUITE_BASES = {"threads": "PyTorch's default (all cores, spinning wait)",
               "options": "fp32, contiguous", "peer": "timm's `train.py`"}


def suite_precision(record: dict) -> str:
    """', bf16', ', channels_last' or both where a peer comparison ran so (its command says)."""
    command = record.get("commands", {}).get("bigbatch", "")
    options = [name for name, flag in (("bf16", "precision=bf16"),
                                       ("channels_last", "channels_last=True")) if flag in command]
    return f", {' + '.join(options)}" if options else ""


def suite_rows(results: Path, suite: str) -> Iterable[list[str]]:
    for line, record in enumerate(read_jsonl(results / "train_throughput.jsonl"), start=1):
        if record.get("suite") != suite:
            continue
        ratios = next(value for key, value in record.items() if key.startswith("ratio_to_"))
        for method, label in SUITE_METHODS[suite].items():
            if method in ratios:
                rounds = len(record["images_per_second"][method].get("per_round", ())) or \
                    record["rounds"]
                yield [f"{record['workload']}, batch {record['global_batch']}"
                       f"{suite_precision(record)}", label, paired_text(ratios[method], rounds),
                       machine_label(record["machine"]), f"{loads_text([record])}; line {line}"]


def suite_table(results: Path, suite: str) -> str:
    return markdown(["workload", f"against {SUITE_BASES[suite]}", "ratio (one run)", "machine",
                     "load; train_throughput.jsonl"], suite_rows(results, suite))


@table("cpu-threads")
def cpu_threads(results: Path) -> str:
    return suite_table(results, "threads")


@table("cpu-options")
def cpu_options(results: Path) -> str:
    return suite_table(results, "options")


@table("peer-train-py")
def peer_train_py(results: Path) -> str:
    return suite_table(results, "peer")


@table("local-processes")
def local_processes(results: Path) -> str:
    rows = [[f"{r['settings']['recipe']}, {r['settings']['precision']}"
             + (", kernels held to AVX2" if r["settings"]["kernels_held_to_avx2"] else ""),
             paired_text(r["speedup_auto_over_one"], r["settings"]["rounds"]),
             machine_label(r["machine"]), f"{loads_text([r])}; {commits_text([r])}"]
            for r in read_jsonl(results / "local_processes.jsonl")]
    return markdown(["training images/s", "one rank per core / one process, all cores",
                     "machine", "load; commit"], rows)


# ----------------------------------------------------------------------------- time to accuracy

@table("time-to-accuracy")
def time_to_accuracy(results: Path) -> str:
    """Every run of time_to_accuracy.py: each recipe's epochs and seconds to the target."""
    records = read_jsonl(results / "time_to_accuracy.jsonl")
    rows = []
    for record in records:
        machine = record["machine"]
        for recipe, result in record["recipes"].items():
            config = result["config"]
            reached = result["runs"][0]["reached"]
            rows.append([
                f"`{recipe}` ({config['optim']['name'].upper()}, LR {config['optim']['lr']:g}, "
                f"{config['epochs']:g} epochs at most)", f"{config['global_batch']:,}",
                f"{config['precision']}, threads {record['threads'] or 'default'}",
                (f"{reached['epoch']:g} ({reached['top1']:.2f}%)" if reached
                 else f"not reached (best {result['best_top1']:.2f}%)"),
                f"{reached['wall_seconds']:.1f}" if reached else "–",
                f"{result['images_per_second_median']:,.0f}",
                f"{machine_label(machine)}; {loads_text([record])}; {commits_text([record])}"])
    return markdown(["recipe", "global batch", "precision, threads",
                     f"epochs to ≥ {records[0]['target_top1']:g}% top-1",
                     "wall s", "images/s", "machine; load; commit"], rows)


# ----------------------------------------------------------------------------- webdataset reader

WIDS_READS = [("bigbatch_tarfile_scan", "bigbatch: index one shard (tarfile scan), ms"),
              ("bigbatch_cached_index", "bigbatch: load the cached index of one shard, ms"),
              ("wids_mmindexedtar_open", "`wids`: index one shard on opening it, ms")]
WIDS_SAMPLES = [("bigbatch_mmap_by_offset", "bigbatch: one sample's bytes, random order, µs"),
                ("wids_lru10", "`wids`, 10 open shards (its default): one sample, µs"),
                ("wids_lru33", "`wids`, every shard open: one sample, µs")]


@table("webdataset-reader")
def webdataset_reader(results: Path) -> str:
    """Reading WebDataset shards by index: bigbatch's tarfile reader against webdataset's wids."""
    records = read_jsonl(results / "webdataset_reader.jsonl")
    rows = []
    for section, names in (("index_ms_per_shard", WIDS_READS),
                           ("read_us_per_sample", WIDS_SAMPLES)):
        for key, label in names:
            cells = [f"{r[section][key]['median']:,.2f} ({r[section][key]['range'][0]:,.2f}–"
                     f"{r[section][key]['range'][1]:,.2f} over {r['setup']['rounds']} rounds)"
                     for r in records]
            rows.append([label, "; ".join(cells),
                         ", ".join(sorted({machine_label(r["machine"]) for r in records})),
                         loads_text(records)])
    return markdown(["operation", "median per run (range over its rounds)", "machine", "load"],
                    rows)


# ------------------------------------------------------------------------ world-size invariance

def invariance_cell(by_world_size: dict[str, dict], key: str) -> str:
    """Per world size, 'bit-identical' or the largest difference to 1 process:
    '2e-03 (2), 1e-01 (4)'."""
    cells = []
    for world, result in by_world_size.items():
        if world == "1":
            continue
        value = result[key]
        value = max(value) if isinstance(value, list) else value
        cells.append(f"{value:.0e} ({world})" if value else f"bit-identical ({world})")
    return ", ".join(cells)


@table("world-size-invariance")
def world_size_invariance(results: Path) -> str:
    """Every run of world_size_invariance.py: 2 and 4 gloo processes against 1, per LR."""
    rows = []
    for record in read_jsonl(results / "world_size_invariance.jsonl"):
        mode = "exact" if record.get("exact_reduction") else "default"
        for run in record["results"]:
            rows.append([
                f"{record['model']}, LR {run['lr']:g}, {record['precision']}, "
                f"{record['memory_format']}, {mode} mode", run["steps"],
                invariance_cell(run["by_world_size"], "loss_relative_difference_per_step"),
                invariance_cell(run["by_world_size"], "final_state_max_relative_difference"),
                machine_label(record["machine"])])
    return markdown(["model, settings", "steps", "largest per-step loss difference to 1 process "
                     "(processes)", "largest final-state difference (processes)", "machine"],
                    rows)


@table("exact-full-run")
def exact_full_run(results: Path) -> str:
    """Every layout of exact_full_run.py's whole-recipe runs, against its record's first."""
    rows = []
    for name in ("full_run.json", "full_run_1thread.json"):
        record = read_json(results / "exact_reduction" / name)
        threads = record.get("threads_per_process") or record["machine"]["torch_threads"]
        for layout, run in record["runs"].items():
            same = run.get("bit_identical_to_exact_w1")
            rows.append([f"`{layout}`", threads, run["steps"], f"{run['top1']:.2f}",
                         "–" if same is None else ("**yes**" if same else "no"),
                         f"`{name}`; {machine_label(record['machine'])}; "
                         f"{commits_text([record])}"])
    return markdown(["layout (mode-processes)", "threads per process", "steps", "top-1 %",
                     "bit-identical to `exact-w1` of its record", "record; machine; commit"],
                    rows)


@table("exact-reduction-cost")
def exact_reduction_cost(results: Path) -> str:
    """exact_reduction.py: the step time of exact mode over the default mode, and the bytes."""
    rows = []
    for record in read_jsonl(results / "exact_reduction.jsonl"):
        ratio, sent = record["ratio_exact_over_default"], record["allreduce_bytes_per_step"]
        rounds = len(record["step_seconds"]["exact"])
        rows.append([record["processes"], record["steps_per_run"],
                     f"{ratio['median']:.2f}× ({ratio['min']:.2f}–{ratio['max']:.2f} over "
                     f"{rounds} rounds)", f"{sent['exact'] / sent['default']:.2f}×",
                     f"{machine_label(record['machine'])}; {loads_text([record])}"])
    return markdown(["processes", "steps a run", "exact / default step time",
                     "exact / default all-reduce bytes", "machine; load"], rows)
