"""Render every results table of README.md and docs/*.md from the records in docs/results/.

    python benchmarks/render_docs.py           # rewrite the tables in place (make docs)
    python benchmarks/render_docs.py --check   # exit 1, naming the files, if any table differs

A table lives between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->``; NAME is a key of
doc_tables.TABLES, whose function draws the table from docs/results. A table whose record does
not exist yet renders as "no record yet". Nothing between the markers is kept: an edit made by
hand there is overwritten by `make docs` and fails the check (tests/test_docs_render.py).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from common import REPO, RESULTS_DIR
from doc_tables import TABLES
from figures import NoRecord

MARKED = re.compile(r"(<!-- table:([\w-]+) -->\n)(.*?)(<!-- /table:\2 -->)", re.S)
OPENING = re.compile(r"<!-- table:([\w-]+) -->")


class RenderError(Exception):
    """A marker that names no registered table, or one left unclosed."""


def documents(root: Path) -> list[Path]:
    """The Markdown files whose tables are rendered: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def render_table(name: str, results: Path) -> str:
    if name not in TABLES:
        raise RenderError(f"table '{name}' is not registered (doc_tables.TABLES: "
                          f"{', '.join(sorted(TABLES))})")
    try:
        return TABLES[name](results)
    except NoRecord as missing:
        what = missing.args[0] if missing.args else ""
        if isinstance(what, Path) and what.is_relative_to(results):
            what = Path("docs/results") / what.relative_to(results)
        return f"*No record yet ({what}).*"


def render_text(text: str, results: Path, where: str = "") -> str:
    """``text`` with every marked table rendered afresh from ``results``."""
    closed = {match.start() for match in MARKED.finditer(text)}
    for opening in OPENING.finditer(text):
        if opening.start() not in closed:
            raise RenderError(f"{where}: table '{opening.group(1)}' has no closing "
                              f"<!-- /table:{opening.group(1)} -->")
    return MARKED.sub(lambda m: m.group(1) + render_table(m.group(2), results) + "\n"
                      + m.group(4), text)


def stale(root: Path, results: Path) -> dict[Path, str]:
    """The documents whose rendered text differs from what is on disk, with the new text."""
    changed = {}
    for path in documents(root):
        text = path.read_text()
        rendered = render_text(text, results, str(path.relative_to(root)))
        if rendered != text:
            changed[path] = rendered
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    parser.add_argument("--root", type=Path, default=REPO)
    args = parser.parse_args(argv)
    results = args.root / "docs" / "results" if args.root != REPO else RESULTS_DIR
    try:
        changed = stale(args.root, results)
    except RenderError as error:
        sys.exit(f"render_docs: {error}")
    for path, text in changed.items():
        name = path.relative_to(args.root)
        if args.check:
            print(f"render_docs: {name} differs from its records; run `make docs`")
        else:
            path.write_text(text)
            print(f"render_docs: rendered {name}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
