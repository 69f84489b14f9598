"""Render (or check) the README's benchmark table from the committed results in bench/results/.

Usage, from anywhere:
    python scripts/readme_figures.py           # rewrite the table in README.md
    python scripts/readme_figures.py --check   # exit 1, with a diff, if README.md is out of date

The table sits between two marker comments in README.md:

    <!-- bench-table:begin (scripts/readme_figures.py) -->
    ... generated, do not edit by hand ...
    <!-- bench-table:end -->

Every figure in a row comes from a JSON twin (bench/results/<name>.json) with a fixed format; the
few that the JSON does not carry (the goals a benchmark is held to, the fairness benchmark's tenant
weights) are read from the same benchmark's committed report (bench/results/<name>.md). Each row
quotes the best and the worst row of its benchmark's result table, so a slow scenario cannot hide
behind a fast one. Nothing here runs a benchmark: a re-run that changes bench/results/ makes
`--check` (and tests/test_readme_figures.py) fail until this script is run again.

This file assembles the table and splices it into README.md; the rows are `readme_rows`' (one per
benchmark), quoting the results `bench_results` loads, in its fixed formats.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from pathlib import Path

from bench_results import RESULTS, FiguresError, Results, load_results
from readme_rows import ROWS

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- bench-table:begin (scripts/readme_figures.py) -->"
END = "<!-- bench-table:end -->"


def render_table(results: Results) -> str:
    """The markdown table (header, separator, one line per row), newline-terminated."""
    lines = ["| benchmark | result |", "|---|---|"]
    for row in ROWS:
        label, text = row(results)
        lines.append(f"| {label} | {text} |".replace("\n", " "))
    return "\n".join(lines) + "\n"


def splice(readme: str, table: str) -> str:
    """README text with the block between the markers replaced by the table."""
    begin, end = readme.find(BEGIN), readme.find(END)
    if begin < 0 or end < 0 or end < begin:
        raise FiguresError(f"README.md lacks the markers {BEGIN!r} ... {END!r}")
    head = readme[: begin + len(BEGIN)]
    return f"{head}\n\n{table}\n{readme[end:]}"


def check(readme_path: Path = README, results_dir: Path = RESULTS) -> str:
    """A unified diff from the README's table to the one the results give ('' when up to date)."""
    current = readme_path.read_text(encoding="utf-8")
    wanted = splice(current, render_table(load_results(results_dir)))
    return "".join(
        difflib.unified_diff(
            current.splitlines(keepends=True),
            wanted.splitlines(keepends=True),
            "README.md (committed)",
            "README.md (from bench/results)",
        )
    )


def write(readme_path: Path = README, results_dir: Path = RESULTS) -> bool:
    """Rewrite the table in place; True when the file changed."""
    current = readme_path.read_text(encoding="utf-8")
    wanted = splice(current, render_table(load_results(results_dir)))
    if wanted == current:
        return False
    readme_path.write_text(wanted, encoding="utf-8")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 with a diff if README.md is out of date")
    args = parser.parse_args(argv)
    try:
        if args.check:
            diff = check()
            if diff:
                sys.stdout.write(diff)
                print(
                    "README.md's benchmark table is out of date: run python scripts/readme_figures.py", file=sys.stderr
                )
                return 1
            return 0
        print("README.md rewritten" if write() else "README.md already up to date")
        return 0
    except FiguresError as exc:
        print(f"readme_figures: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
