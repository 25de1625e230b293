"""Every figure in the README's result tables is in the committed record it came from.

Each table is recognised by its header and mapped to its record files (JSON, JSONL or CSV under
docs/results/). Every number in a table cell (except the target and column-label cells) must
equal, at the precision printed, some number in those records; a figure typed by hand, copied
from a run that was not kept, or left behind when a record changed fails here.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"

# First header cell -> (record files, columns whose numbers are not measurements).
TABLES = {
    "batch": (["batch_scaling_20ep/sweep.csv"], {0, 1}),  # batch size and step count: the grid
    "seeds at batch": (["batch_scaling_20ep/sweep.md"], {0}),
    "measurement": (["lars_step.jsonl", "lars_step_summary.json", "train_throughput.jsonl",
                     "input_pipeline.jsonl", "time_to_accuracy.jsonl", "gpu/summary.json"],
                    {0, 2}),
    "check": (["scaling_planner.json", "scaling_planner.md", "allreduce_loopback_p2.json",
               "allreduce_loopback_p4.json"], {0}),
}
# A number, with or without thousands separators ("3,546"; "1, 2" is two numbers).
NUMBER = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def parse_number(text: str) -> float:
    return float(text.replace(",", ""))


def markdown_tables(text: str) -> list[list[list[str]]]:
    """The tables of a Markdown text, each a list of rows of stripped cells (separator dropped)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def record_numbers(paths: list[str]) -> list[float]:
    numbers: list[float] = []
    for name in paths:
        path = RESULTS / name
        text = path.read_text()
        if path.suffix == ".md":  # a table the planner script printed
            numbers += [parse_number(match) for match in NUMBER.findall(text)]
            continue
        if path.suffix == ".csv":
            for row in csv.reader(text.splitlines()):
                numbers += [float(cell) for cell in row if _is_number(cell)]
            continue
        documents = [json.loads(line) for line in text.splitlines() if line.strip()] \
            if path.suffix == ".jsonl" else [json.loads(text)]
        for document in documents:
            numbers += list(_walk(document))
    return numbers


def _walk(value):
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield float(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item)
    elif isinstance(value, str):  # numbers inside a recorded table or message
        yield from (parse_number(match) for match in NUMBER.findall(value))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def figures(cell: str) -> list[str]:
    """The numbers printed in a cell, without dates, hours and model names' digits."""
    cell = re.sub(r"\d{4}-\d{2}-\d{2}|\d+:\d+|ResNet-\d+|resnet\d+|\d+²|[A-Z]+\d+\w*|\d+K", "",
                  cell)
    return NUMBER.findall(cell)


def found(figure: str, numbers: list[float]) -> bool:
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    value = parse_number(figure)
    for number in numbers:
        for candidate in (number, number * 100, number / 60):  # fractions as %, s as min
            if round(candidate, decimals) == value or abs(candidate - value) < 10 ** -decimals / 2:
                return True
    return False


def readme_tables() -> list[tuple[str, list[list[str]]]]:
    tables = markdown_tables((ROOT / "README.md").read_text())
    return [(table[0][0], table) for table in tables if table[0][0] in TABLES]


@pytest.mark.parametrize("key", sorted(TABLES))
def test_every_readme_figure_is_in_its_record(key):
    tables = [table for first, table in readme_tables() if first == key]
    assert tables, f"README has no table starting with '{key}'"
    files, skipped = TABLES[key]
    numbers = record_numbers(files)
    missing = [(row[0], figure) for table in tables for row in table[1:]
               for column, cell in enumerate(row) if column not in skipped
               for figure in figures(cell) if not found(figure, numbers)]
    assert not missing, f"figures not in {', '.join(files)}: {missing}"


def test_the_check_catches_a_figure_without_record():
    numbers = record_numbers(["batch_scaling/sweep.csv"])
    assert found("85.97", numbers) and not found("85.98", numbers)


def test_thousands_separators_are_one_number():
    assert figures("3,546 eager (3,346–3,797), 1, 2 and 4") == ["3,546", "3,346", "3,797", "1",
                                                                 "2", "4"]
    assert found("3,797", [3797.0]) and not found("3,797", [797.0, 3.0])
