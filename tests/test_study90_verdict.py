"""benchmarks/study90_verdict.py: the 90-epoch study's claims judged on its jobs' sweep records.

Every test builds the study's folder (one sweep.json and one log per job, run folders where a
seed pass is under way) in the format `bigbatch sweep` writes, reduced from a real record."""

import csv
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import study90_verdict as verdict  # noqa: E402
from study90 import JOBS  # noqa: E402

GRID_COMMAND = ("# 2026-12-05T15:48:26Z python -m bigbatch sweep --recipe fashion-mnist "
                "--epochs 90 --out runs/batch_scaling_90ep/{job}")
SEED_COMMAND = GRID_COMMAND + " --seeds 0,1,2"


def spread(value):
    """Seeds 0, 1, 2 with mean ``value`` and sample std 0.2 (seed 0, the grid's, at the mean)."""
    return (value, value - 0.2, value + 0.2)


# (job, series, batch) -> seeds' top-1: a finished study in which every claim holds. At 1536
# nesterov's best warmup is 12 epochs (90.3 > 90.0 at 5), lars-paper's is 5 (90.4 > 89, 88).
STUDY = {
    ("baseline", "sgd", 128): (91.0, 90.0, 92.0),  # mean 91, std 1
    ("main-a", "lars-paper", 384): spread(91.0),
    ("main-a", "lars-paper", 768): spread(90.8),
    ("main-a", "lars-paper", 1536): (90.4, 90.2, 90.6),  # mean 90.4, std 0.2
    ("main-a", "lars-paper", 3072): spread(89.0),
    ("main-a", "nesterov", 384): spread(90.5),
    ("main-a", "nesterov", 768): spread(90.5),
    ("main-a", "nesterov", 1536): spread(90.0),
    ("main-a", "nesterov", 3072): spread(90.5),
    ("main-b", "sgd", 384): spread(90.8),
    ("main-b", "sgd", 768): spread(90.0),
    ("main-b", "sgd", 1536): spread(86.0),
    ("main-b", "sgd", 3072): spread(80.0),
    **{("main-b", "lamb", b): spread(90.5) for b in (384, 768, 1536, 3072)},
    ("warmup12", "lars-paper", 1536): spread(89.0),
    ("warmup12", "nesterov", 1536): spread(90.3),
    ("warmup25", "lars-paper", 1536): spread(88.0),
    ("warmup25", "nesterov", 1536): spread(89.0),
}


def run(batch, series, lr, top1, seed=0, rerun=False, exponent=0.0):
    """One entry of sweep.json's "runs"."""
    return {"batch": batch, "optimizer": series, "lr": lr, "top1": top1,
            "top5": None if top1 is None else 99.7, "steps": 90 * (60000 // batch),
            "wall_seconds": 700.0, "grid_exponent": exponent,
            "run_dir": f"runs/b{batch:05d}-{series}-lr{lr:.4g}" + (f"-seed{seed}" if rerun else ""),
            "diverged": top1 is None, "extension": False, "trained_top1": top1,
            "trained_top5": None if top1 is None else 99.7, "bn_recompute": 50, "seed": seed,
            "seed_rerun": rerun}


def point(batch, series, seeds, lr=1.0):
    """One entry of sweep.json's "best" and its runs: a 3-LR grid whose middle LR is best with
    ``seeds[0]``; more seeds: the seed pass's reruns of that LR; "diverged": every LR diverged."""
    top1 = None if seeds == "diverged" else seeds[0]
    runs = [run(batch, series, lr * 2.0 ** e, top1 and top1 - 0.5 * abs(e), exponent=e)
            for e in (-1.0, 0.0, 1.0)]
    record = None
    if top1 is not None and len(seeds) > 1:
        runs += [run(batch, series, lr, v, seed=i, rerun=True) for i, v in enumerate(seeds)][1:]
        values = [v for v in seeds if v is not None]
        per_seed = {str(i): v for i, v in enumerate(seeds)}
        record = {"lr": lr, "top1": per_seed, "trained_top1": dict(per_seed),
                  "top1_mean": statistics.fmean(values), "top1_std": statistics.stdev(values),
                  "top1_range": [min(values), max(values)]}
    best = {"batch": batch, "optimizer": series, "centre_lr": lr,
            "best_lr": None if top1 is None else lr, "best_top1": top1,
            "best_top5": top1 and 99.7, "lrs": [r["lr"] for r in runs[:3]], "extensions": [],
            "best_at_edge": top1 is None, "steps": top1 and 90 * (60000 // batch),
            "rule": {"lr": lr, "reference_batch": batch, "scaling": "linear"},
            "selected_on": "top1 with BatchNorm statistics recomputed over 50 micro-batches",
            "best_trained_top1": top1, "as_trained_best_lr": top1 and lr,
            "as_trained_best_top1": top1, "seeds": record}
    return best, runs


def write_study(root, study, seed_pass=()):
    """Each job's sweep.json and log from ``study`` (an entry None: that point not finished;
    a job with no entry: not started); jobs in ``seed_pass`` have their seed pass's command."""
    for name, job in JOBS.items():
        mine = {(s, b): v for (j, s, b), v in study.items() if j == name}
        if not mine:
            continue
        best, runs = [], []
        for (series, batch), seeds in mine.items():
            if seeds is not None:
                entry, its_runs = point(batch, series, seeds)
                best.append(entry)
                runs += its_runs
        settings = {"batch_sizes": list(job.batches), "optimizers": list(job.series),
                    "epochs": 90.0, "lrs_per_point": 3, "lr_grid_factor": 2.0,
                    "max_extensions": 2, "warmup_epochs": float(job.warmup), "micro_batch": 128,
                    "recipe": "fashion-mnist", "anchor": job.anchor,
                    "seeds": [0, 1, 2] if name in seed_pass else [], "seed_batches": []}
        record = {"settings": settings, "lr_rules": {}, "runs": runs, "best": best,
                  "selected_on": [], "machine": {"cpus": 2, "torch": "2.14.1"},
                  "sweep_seconds": 1.0}
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "sweep.json").write_text(json.dumps(record))
        commands = [GRID_COMMAND] + ([SEED_COMMAND] if name in seed_pass else [])
        (root / f"{name}.log").write_text("".join(f"\n{c.format(job=name)}\n" for c in commands))
    return root


def judged(root):
    points = verdict.all_points(verdict.load_study(root))
    return {c["claim"]: c for c in verdict.judge(points)}, points


def changed(**entries):
    """STUDY with entries replaced: changed(main_b__sgd__3072=...) spells (main-b, sgd, 3072)."""
    study = dict(STUDY)
    for key, value in entries.items():
        job, series, batch = key.replace("_", "-").split("--")
        study[(job, series, int(batch))] = value
    return study


def test_batches_map_to_imagenet_batches_of_the_same_steps_per_epoch():
    assert (verdict.TRAIN_EXAMPLES, verdict.IMAGENET_TRAIN) == (60_000, 1_281_167)
    names = [verdict.imagenet_batch(b) for b in (384, 768, 1536, 3072)]
    assert names == ["8K", "16K", "32K", "64K"]
    assert verdict.imagenet_batch(128) == "2733"  # 128 * 1,281,167 / 60,000 = 2733.2
    assert verdict.imagenet_batch(1500) == "32029"  # 2.3% short of 32,768: not named 32K
    # 1536 ≙ 32K: 39 steps per epoch, as ImageNet's 1,281,167 / 32,768 = 39.1
    assert verdict.steps_per_epoch(1536) == 39 == int(1_281_167 / 32_768)
    assert verdict.steps_per_epoch(128) == 468 and verdict.steps_per_epoch(3072) == 19


def test_a_finished_study_where_every_claim_holds(tmp_path):
    claims, points = judged(write_study(tmp_path, STUDY))
    assert {name: c["outcome"] for name, c in claims.items()} == dict.fromkeys(
        ("1", "2", "3a", "3b", "3c"), "holds")
    assert verdict.missing(verdict.load_study(tmp_path)) == []
    row = claims["1"]["rows"][0]
    assert row["a"]["value"] == pytest.approx(90.4) and row["a"]["std"] == pytest.approx(0.2)
    assert row["a"]["range"] == pytest.approx([90.2, 90.6])
    assert row["b"]["value"] == pytest.approx(91.0) and row["b"]["std"] == pytest.approx(1.0)
    assert row["difference"] == pytest.approx(-0.6) and row["threshold"] == -1.0
    assert row["se"] == pytest.approx(math.sqrt(0.2 ** 2 / 3 + 1.0 ** 2 / 3))
    assert row["holds"] is True and row["final"] is True
    assert [r["difference"] for r in claims["2"]["rows"]] == pytest.approx([4.4, 9.0])
    at_32k = {r["batch"]: r for r in claims["3a"]["rows"]}[1536]
    assert at_32k["a"]["warmup"] == 12 and at_32k["a"]["value"] == pytest.approx(90.3)
    assert at_32k["b"]["warmup"] == 5 and at_32k["difference"] == pytest.approx(-0.1)
    table = {(r["series"], r["warmup"]): r for r in verdict.warmup_table(points)}
    assert [w for (s, w), r in table.items() if r["chosen"]] == [5, 12]  # lars-paper, nesterov


def test_claim_1_is_judged_on_the_seeds_mean_not_the_grids_best_run(tmp_path):
    # Seed 0 (the grid's) is 0.5 below the baseline; the three seeds' mean 89.5 is 1.5 below.
    study = changed(main_a__lars_paper__1536=(90.5, 89.0, 89.0))
    row = judged(write_study(tmp_path, study))[0]["1"]["rows"][0]
    assert row["a"]["value"] == pytest.approx(89.5) and row["difference"] == pytest.approx(-1.5)
    assert row["holds"] is False
    assert judged(tmp_path)[0]["1"]["outcome"] == "fails"


def test_claim_2_fails_where_sgd_keeps_within_3_points(tmp_path):
    claims, _ = judged(write_study(tmp_path, changed(main_b__sgd__3072=spread(87.0))))
    rows = {r["batch"]: r for r in claims["2"]["rows"]}
    assert rows[1536]["holds"] is True and rows[3072]["holds"] is False
    assert rows[3072]["difference"] == pytest.approx(2.0) and claims["2"]["outcome"] == "fails"
    assert claims["1"]["outcome"] == "holds"


def test_claim_3a_nesterov_against_lars_and_its_best_warmup(tmp_path):
    claims, _ = judged(write_study(tmp_path, changed(main_a__nesterov__768=spread(89.0))))
    rows = {r["batch"]: r for r in claims["3a"]["rows"]}
    assert rows[768]["difference"] == pytest.approx(-1.8) and rows[768]["holds"] is False
    assert claims["3a"]["outcome"] == "fails"
    assert claims["3c"]["outcome"] == "holds"  # LAMB 90.5 against Nesterov 89.0 there
    # Without the 12-epoch warmup's 90.3 nesterov at 1536 is its 5-epoch 90.0, 0.4 behind LARS;
    # with a 25-epoch warmup of 88.9 it is 1.5 behind, and the better warmup counts.
    study = changed(warmup12__nesterov__1536=spread(88.0), main_a__nesterov__1536=spread(88.9),
                    warmup25__nesterov__1536=spread(88.5))
    rows = {r["batch"]: r for r in judged(write_study(tmp_path, study))[0]["3a"]["rows"]}
    assert rows[1536]["a"]["warmup"] == 5 and rows[1536]["difference"] == pytest.approx(-1.5)
    assert rows[1536]["holds"] is False


def test_claim_3b_and_3c_lamb_against_lars_and_nesterov(tmp_path):
    claims, _ = judged(write_study(tmp_path, changed(main_b__lamb__3072=spread(87.5))))
    rows = {r["batch"]: r for r in claims["3b"]["rows"]}
    assert rows[3072]["difference"] == pytest.approx(-1.5) and rows[3072]["holds"] is False
    assert claims["3b"]["outcome"] == "fails" and claims["3c"]["outcome"] == "fails"
    assert claims["3a"]["outcome"] == "holds"
    claims, _ = judged(write_study(tmp_path, changed(main_b__lamb__3072=spread(89.3))))
    assert claims["3b"]["outcome"] == "holds"  # 0.3 ahead of LARS
    assert claims["3c"]["outcome"] == "fails"  # 1.2 behind Nesterov's 90.5
    claims, _ = judged(write_study(tmp_path, changed(main_b__lamb__3072=spread(89.5))))
    assert claims["3c"]["outcome"] == "holds"  # 1.0 behind: within 1 point


def test_missing_points_and_seeds_are_gaps_and_no_claim_is_settled(tmp_path):
    study = {k: v for k, v in STUDY.items() if k[0] != "warmup25"}  # not started
    study[("main-b", "sgd", 3072)] = None  # its grid is still running
    study[("main-a", "lars-paper", 1536)] = (90.4,)  # grid done, seeds not yet
    jobs = verdict.load_study(write_study(tmp_path, study))
    gaps = verdict.missing(jobs)
    assert "main-b: sgd at batch 3072 (warmup 5): LR grid not finished" in gaps
    assert "main-a: lars-paper at batch 1536 (warmup 5): seeds 1, 2 not finished" in gaps
    assert "warmup25: nesterov at batch 1536 (warmup 25): LR grid not finished" in gaps
    assert len(gaps) == 4
    claims, _ = judged(tmp_path)
    assert claims["1"]["outcome"] == "holds so far"
    assert claims["1"]["rows"][0]["a"]["seeds"] == ["0"]
    assert claims["2"]["outcome"] == "holds so far (1 of 2 batches measured)"
    assert claims["2"]["rows"][1]["holds"] is None  # no SGD at 3072: not a pass
    assert claims["3b"]["outcome"] == "holds so far"  # LARS at 1536 waits for its seeds
    assert [r["final"] for r in claims["3b"]["rows"]] == [True, True, False, True]
    assert claims["3c"]["outcome"] == "holds so far"  # nesterov at 1536: a warmup missing
    text = verdict.markdown(list(claims.values()), [], None, gaps, None)
    assert "**Status: partial: 18 of 21 points' grids finished, 4 points missing" in text
    assert "| 3072 (64K) | 89.00 ± 0.20 (88.80–89.20), LR 1 | not finished | – | ≥ +3 | – |" in text
    assert "90.40 (seed 0 only), LR 1" in text
    assert "- warmup25: lars-paper at batch 1536 (warmup 25): LR grid not finished" in text


def test_a_final_failure_fails_the_claim_while_other_points_are_missing(tmp_path):
    study = changed(main_b__sgd__3072=spread(88.0), main_b__sgd__1536=None)
    claims, _ = judged(write_study(tmp_path, study))
    assert claims["2"]["outcome"] == "fails"
    assert [r["holds"] for r in claims["2"]["rows"]] == [None, False]


def test_a_diverged_seed_is_left_out_and_a_diverged_point_counts_as_0(tmp_path):
    study = changed(main_a__lars_paper__384=(91.0, None, 91.4), main_b__lamb__3072="diverged")
    claims, points = judged(write_study(tmp_path, study))
    assert verdict.missing(verdict.load_study(tmp_path)) == []  # neither waits for seeds
    lars = verdict.chosen(points, "lars-paper", 384).stats()
    assert lars["value"] == pytest.approx(91.2) and lars["std"] == pytest.approx(0.4 / 2 ** 0.5)
    assert lars["range"] == pytest.approx([91.0, 91.4])
    assert lars["seeds"] == ["0", "1", "2"] and lars["diverged_seeds"] == ["1"]
    assert "(seed 1 diverged, left out)" in verdict.cell(lars)
    lamb = {r["batch"]: r for r in claims["3b"]["rows"]}[3072]
    assert lamb["a"]["value"] == 0.0 and lamb["a"]["diverged"] and lamb["final"]
    assert lamb["difference"] == pytest.approx(-89.0) and claims["3b"]["outcome"] == "fails"


def write_run(job_dir, batch, series, base_lr, top1, seed=None):
    """A run folder as the sweep leaves it: its plan (sweep_run.json) and, if ``top1`` is not
    None, its summary; ``seed``: a seed rerun (folder name ending -seed<seed>)."""
    peak = base_lr * math.sqrt(batch / 128)  # lamb: square-root scaling from batch 128
    folder = job_dir / "runs" / (f"b{batch:05d}-{series}-lr{peak:.4g}"
                                 + ("" if seed is None else f"-seed{seed}"))
    folder.mkdir(parents=True)
    plan = {"epochs": 90.0, "global_batch": batch, "micro_batch": 128, "seed": seed or 0,
            "optim": {"name": series, "lr": base_lr, "lr_scaling": "sqrt",
                      "reference_batch": 128}}
    (folder / "sweep_run.json").write_text(json.dumps(plan))
    if top1 is not None:
        (folder / "summary.json").write_text(json.dumps(
            {"top1": top1, "top5": 99.7, "bn_recompute": 50, "trained_top1": top1 - 0.1,
             "trained_top5": 99.6, "steps": 90 * (60000 // batch), "wall_seconds": 700.0}))


def test_a_seed_pass_under_way_rebuilds_finished_grids_from_run_folders(tmp_path):
    study = {k: v for k, v in STUDY.items() if k[:2] != ("main-b", "lamb")}
    study[("main-b", "sgd", 768)] = None
    write_study(tmp_path, study, seed_pass={"main-b"})  # its record holds sgd only (so far)
    job_dir = tmp_path / "main-b"
    for base, top1 in ((0.02, 90.0), (0.04, 91.0), (0.08, 90.5)):  # lamb 384: best inside
        write_run(job_dir, 384, "lamb", base, top1)
    write_run(job_dir, 384, "lamb", 0.04, 90.6, seed=1)
    write_run(job_dir, 384, "lamb", 0.04, None, seed=2)  # still training
    write_run(job_dir, 384, "lamb", 0.08, 80.0, seed=2)  # another LR's: not this point's seed
    for base, top1 in ((0.02, 89.0), (0.04, 90.0), (0.08, 91.0)):  # lamb 768: best at the top
        write_run(job_dir, 768, "lamb", base, top1)  # edge, so the sweep extends it first
    jobs = verdict.load_study(tmp_path)
    rebuilt = {p.batch: p for p in verdict.all_points(jobs) if p.series == "lamb"}
    assert list(rebuilt) == [384] and rebuilt[384].source == "run folders"
    assert rebuilt[384].best_lr == pytest.approx(0.04 * math.sqrt(3))
    assert rebuilt[384].seeds == {"0": 91.0, "1": 90.6}
    assert rebuilt[384].stats()["value"] == pytest.approx(90.8)
    gaps = verdict.missing(jobs)
    assert "main-b: lamb at batch 384 (warmup 5): seed 2 not finished" in gaps
    assert "main-b: lamb at batch 768 (warmup 5): LR grid not finished" in gaps
    main_b = next(j for j in jobs if j.job.name == "main-b")
    assert sum(r["optimizer"] == "lamb" for r in main_b.runs) == 8  # every finished folder
    # Before the seed pass the sweep record alone says which grids have finished; the CSV
    # still has every finished run (a resumed sweep rewrites its record run by run).
    (tmp_path / "main-b.log").write_text(f"\n{GRID_COMMAND}\n")
    jobs = verdict.load_study(tmp_path)
    assert not [p for p in verdict.all_points(jobs) if p.series == "lamb"]
    assert sum(r["optimizer"] == "lamb" for r in verdict.csv_rows(jobs)) == 8


def test_beside_the_20_epoch_study_at_the_nearest_steps_per_epoch(tmp_path):
    twenty = tmp_path / "batch_scaling_20ep"
    twenty.mkdir()
    best = [{"batch": b, "optimizer": s, "best_top1": v, "steps": 20 * (60000 // b),
             "seeds": None} for b, s, v in (
        (128, "sgd", 88.0), (128, "lars-paper", 87.0), (512, "sgd", 87.5),
        (512, "lars-paper", 87.0), (2048, "sgd", 86.0), (2048, "lars-paper", 86.5),
        (4096, "sgd", 70.0), (4096, "lars-paper", 85.0))]
    (twenty / "sweep.json").write_text(json.dumps(
        {"settings": {"batch_sizes": [128, 512, 2048, 4096], "epochs": 20.0,
                      "warmup_epochs": 2.0}, "best": best}))
    _, points = judged(write_study(tmp_path / "sweeps", STUDY))
    compared = verdict.side_by_side(points, twenty)
    rows = {r["ninety"]["batch"]: r for r in compared["rows"]}
    assert {b: r["twenty"]["batch"] for b, r in rows.items()} == {
        384: 512, 768: 512, 1536: 2048, 3072: 4096}
    assert rows[3072]["twenty"]["lars_minus_sgd"] == pytest.approx(15.0)
    assert rows[3072]["twenty"]["lars_minus_baseline"] == pytest.approx(-3.0)
    assert rows[1536]["ninety"]["lars_minus_baseline"] == pytest.approx(-0.6)
    assert rows[1536]["ninety"]["lars_minus_sgd"] == pytest.approx(4.4)
    assert rows[1536]["ninety"]["final"] is True and compared["verdict"] is None


def test_script_writes_every_record(tmp_path):
    sweeps = write_study(tmp_path / "sweeps", STUDY)
    out = tmp_path / "out"
    assert verdict.main(["--sweeps", str(sweeps), "--out", str(out),
                         "--study20", str(tmp_path / "absent")]) == 0
    record = json.loads((out / "verdict.json").read_text())
    assert record["complete"] is True and record["missing"] == []
    assert [c["outcome"] for c in record["claims"]] == ["holds"] * 5
    text = (out / "verdict.md").read_text()
    assert "**Status: complete: every point and seed has finished.**" in text
    assert "batch 384 ≙ 8K, 768 ≙ 16K, 1536 ≙ 32K, 3072 ≙ 64K" in text
    assert "record (batch_scaling_20ep/sweep.json) was not found" in text
    with (out / "sweep.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 5 * len(STUDY)  # 3 grid LRs and 2 seed reruns per point
    first = rows[0]
    assert (first["batch"], first["imagenet_batch"], first["job"], first["seed"]) == (
        "128", "2733", "baseline", "0")
    assert {r["warmup_epochs"] for r in rows if r["job"] == "warmup25"} == {"25"}
    assert (out / "sweep.png").stat().st_size > 0
    assert "# warmup12:" in (out / "command.txt").read_text()
    assert "the sweeps recorded: cpus 2" in (out / "machine.txt").read_text()
    assert "the study's starts: none recorded" in (out / "machine.txt").read_text()


def test_machine_txt_lists_every_recorded_start(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    starts = [{"date": "2026-12-06T01:00:00+00:00", "cpu": "AMD EPYC", "cores_available": 2,
               "cpu_avx512": False, "cpu_native_bf16": False, "versions": {"torch": "2.14.1"}},
              {"date": "2026-12-07T05:00:00+00:00", "cpu": "AMD EPYC", "cores_available": 2,
               "cpu_avx512": True, "cpu_native_bf16": True, "versions": {"torch": "2.14.1"}}]
    (out / "machines.jsonl").write_text("".join(json.dumps(s) + "\n" for s in starts))
    verdict.write_machine(out / "machine.txt", [])
    lines = (out / "machine.txt").read_text().splitlines()
    assert "the study's starts (2 recorded in machines.jsonl" in lines[-3]
    assert lines[-2:] == [
        "  2026-12-06T01:00:00+00:00: 2-core AMD EPYC (no AVX-512, no native bf16), torch 2.14.1",
        "  2026-12-07T05:00:00+00:00: 2-core AMD EPYC (AVX-512, native bf16), torch 2.14.1"]
