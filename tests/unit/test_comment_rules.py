"""Comments, docstrings and the prose docs say what a thing is and why, in the present tense.

Measurement histories belong in commit messages and in the benchmark results under docs/benchmarks/
(rendered by `python -m bench.report`), not in the code. These tests scan every comment and docstring
of the repository's Python files, the comment lines of its YAML, shell, TOML and Makefile sources,
and README.md and docs/*.md (except the generated benchmark page) for three markers of a run's
history: the word "measured", a calendar date later than the example days the data descriptions use,
and a commit hash.

Run as a script (`python tests/unit/test_comment_rules.py [PATH ...]`) it prints every finding.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Generated data at the root (a demo's lakehouse, Airflow's home) and anywhere (caches, test fixtures' data).
SKIP_ROOT_DIRS = {"lakehouse", "node_modules"}
SKIP_DIRS = {"__pycache__", "fixtures"}
COMMENTED_SUFFIXES = {".yaml", ".yml", ".sh", ".toml", ".cfg"}
# The data descriptions' example days are the demo's January 2026 and MovieLens' 2000-2003; a later
# ISO date in a comment is the date something was run.
LAST_EXAMPLE_DAY = "2026-01-31"
ISO_DATE = re.compile(r"\b(20\d\d-\d\d-\d\d)\b")
MONTHS = "February|March|April|May|June|July|August|September|October|November|December"
MONTH_ABBREVIATIONS = "Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
# "December 4", "4 December", "Dec 2026", "end of November": a run's date written out (January is
# the example month, so it is allowed).
NAMED_DATE = re.compile(
    rf"\b(?:(?:{MONTHS}|{MONTH_ABBREVIATIONS})\.?\s+\d{{1,4}}\b|\d{{1,2}}\s+(?:{MONTHS})\b|of\s+(?:{MONTHS})\b)"
)
MEASURED = re.compile(r"\bmeasured\b", re.IGNORECASE)
# A commit hash: 7-40 lower-case hex digits with at least one digit and one letter.
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
# The generated benchmark page carries dates by design; this file states the rules it checks.
EXEMPT_FILES = {Path("docs/benchmarks.md"), Path("tests/unit/test_comment_rules.py")}
# Published result pages (python -m gem.study.publish) name the commit, host and date of each run by design.
GENERATED_DIRS = (Path("docs/results"),)


def python_prose(source: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of every comment and every line of every docstring in a Python source."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                for offset, line in enumerate(first.value.value.splitlines()):
                    yield first.lineno + offset, line


def hash_comment_prose(source: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of the `#` comments of a YAML, shell, TOML or Makefile source."""
    for number, line in enumerate(source.splitlines(), start=1):
        if "#" in line and not line.lstrip().startswith("#!"):
            yield number, line[line.index("#"):]


def markdown_prose(source: str) -> Iterator[tuple[int, str]]:
    yield from enumerate(source.splitlines(), start=1)


def prose_of(path: Path) -> Iterator[tuple[int, str]]:
    source = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        yield from python_prose(source)
    elif path.suffix == ".md":
        yield from markdown_prose(source)
    elif path.suffix in COMMENTED_SUFFIXES or path.name == "Makefile":
        yield from hash_comment_prose(source)


def findings_in(text: str) -> list[str]:
    """What in one line of prose reads as a run's history: 'measured', a late date, a commit hash."""
    found = []
    if MEASURED.search(text):
        found.append("'measured'")
    found += [f"date {day}" for day in ISO_DATE.findall(text) if day > LAST_EXAMPLE_DAY]
    found += [f"date '{match.group(0)}'" for match in NAMED_DATE.finditer(text)]
    found += [f"commit hash {match}" for match in COMMIT_HASH.findall(text)]
    return found


def scanned_files(paths: list[Path] | None = None) -> list[Path]:
    roots = paths or [ROOT]
    files = []
    for root in roots:
        candidates = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in candidates:
            relative = path.absolute().relative_to(ROOT)
            folders = relative.parts[:-1]
            if folders[:1] and folders[0] in SKIP_ROOT_DIRS or any(
                part in SKIP_DIRS or part.startswith(".") for part in folders
            ):
                continue
            if relative in EXEMPT_FILES or relative.parent in GENERATED_DIRS or not path.is_file():
                continue
            if path.suffix == ".md" and not (relative.parts[0] == "docs" or relative == Path("README.md")):
                continue
            if path.suffix in {".py", ".md"} | COMMENTED_SUFFIXES or path.name == "Makefile":
                files.append(path)
    return files


def history_lines(paths: list[Path] | None = None) -> list[str]:
    lines = []
    for path in scanned_files(paths):
        for number, text in prose_of(path):
            for finding in findings_in(text):
                lines.append(f"{path.absolute().relative_to(ROOT)}:{number}: {finding}: {text.strip()[:120]}")
    return lines


def test_the_rules_catch_a_run_history_and_pass_a_description():
    assert findings_in("# measured 2026-12-05 on 2 cores: 1.7x") == ["'measured'", "date 2026-12-05"]
    assert findings_in("Until December 4 the loader read one file") == ["date 'December 4'"]
    assert findings_in("the regression since the end of November") == ["date 'of November'"]
    assert findings_in("a 4x regression since commit 0c3f4e8") == ["commit hash 0c3f4e8"]
    assert findings_in("Example: start 2026-01-01, k=7 -> [2026-01-07, 2026-01-14]") == []
    assert findings_in("MovieLens-1M's first day, 2000-04-25; a day may be missed") == []
    assert findings_in("bench.backfill times both side by side") == []


def test_python_prose_reads_comments_and_docstrings_only():
    source = '"""Module doc, measured."""\nx = "measured 2026-12-05"  # a comment\ndef f():\n    """Doc."""\n'
    assert list(python_prose(source)) == [(2, "# a comment"), (1, "Module doc, measured."), (4, "Doc.")]


def test_no_run_history_in_comments_docstrings_or_docs():
    lines = history_lines()
    assert not lines, "comments and docs say what and why; histories go to commits and docs/benchmarks:\n" + "\n".join(lines)


if __name__ == "__main__":
    print("\n".join(history_lines([Path(arg) for arg in sys.argv[1:]] or None)))
