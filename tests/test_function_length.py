"""No function or method in src/bigbatch is longer than 60 lines (its def line to its last)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "bigbatch"
LIMIT = 60


def long_functions(root: Path = PACKAGE, limit: int = LIMIT) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length})")
    return found


def test_no_function_is_longer_than_60_lines():
    assert long_functions() == []


def test_the_check_counts_from_def_to_last_line(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 1))
    (tmp_path / "ok.py").write_text("def fits():\n" + body)
    (tmp_path / "long.py").write_text("def too_long():\n" + body + "    return 0\n")
    assert long_functions(tmp_path) == [f"long.py:1 too_long ({LIMIT + 1})"]
