"""The results tables of README.md and docs/*.md are what benchmarks/render_docs.py draws from
docs/results: a figure edited by hand, or a record changed without `make docs`, fails here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import doc_tables  # noqa: E402
import figures  # noqa: E402
import render_docs  # noqa: E402


def copy_of_docs(tmp_path: Path) -> Path:
    """README.md, docs/*.md and docs/results in a temporary tree."""
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    for page in (ROOT / "docs").glob("*.md"):
        shutil.copy(page, tmp_path / "docs" / page.name)
    shutil.copytree(ROOT / "docs" / "results", tmp_path / "docs" / "results",
                    ignore=shutil.ignore_patterns("finished_runs", "*.png", "*.log"))
    return tmp_path


def check(root: Path) -> subprocess.CompletedProcess:
    """render_docs.py --check with no site-packages (-S): `make docs` runs on the system Python,
    so the renderer may use the standard library only."""
    return subprocess.run([sys.executable, "-S", str(BENCHMARKS / "render_docs.py"), "--check",
                           "--root", str(root)], capture_output=True, text=True)


def test_every_table_is_rendered_from_its_record(tmp_path):
    result = check(copy_of_docs(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_number_edited_by_hand_fails_and_make_docs_restores_it(tmp_path):
    root = copy_of_docs(tmp_path)
    readme = root / "README.md"
    text = readme.read_text()
    start = text.index("<!-- table:headline -->")
    edited = text[:start] + text[start:].replace("91.36%", "91.63%", 1)
    assert edited != text, "the headline table no longer shows the default recipe's 91.36%"
    readme.write_text(edited)
    result = check(root)
    assert result.returncode == 1 and "README.md differs" in result.stdout
    subprocess.run([sys.executable, str(BENCHMARKS / "render_docs.py"), "--root", str(root)],
                   check=True, capture_output=True)
    assert readme.read_text() == text


def test_a_changed_record_fails(tmp_path):
    root = copy_of_docs(tmp_path)
    seeds = root / "docs" / "results" / "default_recipe" / "seeds.jsonl"
    lines = seeds.read_text().splitlines()
    record = json.loads(lines[-1])
    record["top1"] += 0.5
    seeds.write_text("\n".join(lines[:-1] + [json.dumps(record)]) + "\n")
    assert check(root).returncode == 1


def test_a_missing_record_renders_as_no_record_yet(tmp_path):
    text = "a\n<!-- table:cluster-faults -->\nold\n<!-- /table:cluster-faults -->\nb\n"
    rendered = render_docs.render_text(text, tmp_path)
    assert "No record yet" in rendered and "old" not in rendered
    assert rendered.startswith("a\n<!-- table:cluster-faults -->\n")
    assert rendered.endswith("<!-- /table:cluster-faults -->\nb\n")


def test_unknown_and_unclosed_markers_are_one_line_errors(tmp_path):
    with pytest.raises(render_docs.RenderError, match="'nosuch' is not registered"):
        render_docs.render_text("<!-- table:nosuch -->\n<!-- /table:nosuch -->", tmp_path)
    with pytest.raises(render_docs.RenderError, match="no closing"):
        render_docs.render_text("x\n<!-- table:headline -->\nrest\n", tmp_path, "README.md")


def test_the_statistics_are_medians_with_ranges_and_medians_of_paired_ratios():
    assert figures.runs_text([91.06, 91.43, 91.36], unit="%") == "91.36% (91.06–91.43, 3 runs)"
    assert figures.ratio_text([1.2, 1.37, 1.26]) == "1.26× (1.20–1.37, 3 runs)"
    # per round 2.0, 2.0, 0.5 (paired median 2.0) where the ratio of the medians would be 1.0
    record = {"images_per_s_rounds": {"a": [2.0, 4.0, 3.0], "torchvision_imagefolder":
                                      [1.0, 2.0, 6.0]}}
    assert doc_tables.pipeline_ratio(record, "a") == 2.0
    assert figures.duration_runs_text([131.4, 129.8, 135.5]) == \
        "2 min 11 s (2 min 10 s – 2 min 16 s)"


def test_the_machine_is_named_from_the_record():
    assert figures.machine_label({"cpu": "Intel(R) Xeon(R) Processor", "cores_available": 2,
                                  "cpu_avx512": True, "cpu_native_bf16": True}) == \
        "2-core Intel(R) Xeon(R) Processor (AVX-512, native bf16)"
    assert figures.machine_label({"cpu": "AMD EPYC", "gpu": "NVIDIA H200"}) == "one NVIDIA H200"


def log_excerpts(page: Path) -> list[tuple[Path, list[str]]]:
    """The fenced blocks of ``page`` that follow a paragraph linking a .log under docs/results:
    (that log, the block's lines)."""
    excerpts, log = [], None
    lines = page.read_text().splitlines()
    for i, line in enumerate(lines):
        linked = re.search(r"\]\(((?:docs/)?results/[^)]+\.log)\)", line)
        if linked:
            log = (page.parent / linked.group(1)).resolve()
        if line.startswith("```") and log and i and not lines[i - 1].startswith("```"):
            end = lines.index("```", i + 1)
            excerpts.append((log, lines[i + 1:end]))
            log = None
    return excerpts


def test_a_quoted_log_excerpt_is_in_its_log():
    """Each line of an abridged log excerpt (README's default run) occurs in the log it cites;
    an elided tail is written '...'."""
    excerpts = log_excerpts(ROOT / "README.md")
    assert excerpts, "the README quotes the default run's log"
    for log, block in excerpts:
        text = log.read_text()
        for line in block:
            assert line.split(", ...")[0] in text, f"not in {log.name}: {line}"


def test_every_relative_link_in_the_docs_leads_to_a_file():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, broken
