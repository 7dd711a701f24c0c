"""A benchmark's published result: one small JSON file under docs/benchmarks/ per benchmark.

Every benchmark that publishes a figure calls `record(...)` once at its end. The file holds the
figures with their labels and units, plus what makes them reproducible: the command that produced
them, the commit it ran on (and whether the tree had uncommitted changes), the host and the date.
`python -m bench.report` renders docs/benchmarks.md from these files; the README and docs/ quote
that page instead of typing figures by hand.

    {"name": "make_demo", "title": "...", "command": "python -m bench.commands --only demo",
     "date": "2026-01-04", "commit": "<sha>", "dirty": false,
     "host": {"cpu": "AMD EPYC 7B13", "cores": 2, "memory_gib": 23.4, "gpu": null, "python": "3.11.7"},
     "figures": [{"key": "wall_s", "label": "make demo, wall time", "value": 412.3, "unit": "s"}],
     "notes": "..."}
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from gem.environment import CODE_VERSION_ENV
from gem.host import host_description

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "docs" / "benchmarks"


@dataclass(frozen=True)
class Figure:
    """One published number: `key` is stable across runs (other pages refer to it), `label` is what a
    reader sees, `unit` is printed after the value ("s", "examples/s", "x" for a ratio, "" for a count)."""

    key: str
    label: str
    value: float | int
    unit: str = ""


@dataclass(frozen=True)
class BenchResult:
    name: str
    title: str
    command: str
    date: str
    commit: str
    dirty: bool
    host: dict[str, object]
    figures: list[Figure]
    notes: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    def figure(self, key: str) -> Figure:
        for figure in self.figures:
            if figure.key == key:
                return figure
        raise KeyError(f"benchmark {self.name!r} has no figure {key!r} (it has: {[f.key for f in self.figures]})")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()


def current_commit() -> tuple[str, bool]:
    """HEAD's full hash and whether tracked files differ from it (a result from a dirty tree says so).

    A copy of the tree without its git folder (the device machine's, for bench/gpu_check.sh) names
    the commit $GEM_CODE_VERSION gives ("unknown" without it) and counts as dirty: nothing there
    says the copy equals that commit.
    """
    try:
        commit = _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get(CODE_VERSION_ENV, "unknown"), True
    return commit, dirty




def invoked_command() -> str:
    """This process's command line as a reader would type it: `python -m bench.x --flag v`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    program = f"python -m {spec.name}" if spec is not None else f"python {Path(sys.argv[0]).name}"
    return " ".join([program, *sys.argv[1:]])


def result_path(name: str, results_dir: Path = RESULTS_DIR) -> Path:
    return results_dir / f"{name}.json"


# A benchmark's --results-dir: where `record` writes its JSON (default docs/benchmarks/; another
# folder keeps a trial run's figures out of the published ones). `results_dir: ResultsDirOption = RESULTS_DIR`.
ResultsDirOption = Annotated[Path, typer.Option(
    "--results-dir", help="folder for the result's JSON (default: docs/benchmarks)", show_default=False)]


def record(
    name: str,
    title: str,
    figures: list[Figure],
    *,
    command: str | None = None,
    notes: str = "",
    extra: dict[str, object] | None = None,
    results_dir: Path = RESULTS_DIR,
    commit: str | None = None,
) -> Path:
    """Write docs/benchmarks/<name>.json (replacing an earlier result of the same benchmark).

    `command` defaults to the command line this process was started with. `extra` holds small
    structured detail a page may show (e.g. per-stage seconds); it must stay small: the file is
    committed. `commit` names the commit that ran when it is not this checkout's working tree (a
    benchmark that times a clean clone of it).
    """
    if not figures:
        raise ValueError(f"benchmark {name!r} recorded no figures")
    keys = [figure.key for figure in figures]
    if len(set(keys)) != len(keys):
        raise ValueError(f"benchmark {name!r} has repeated figure keys: {keys}")
    commit, dirty = (commit, False) if commit else current_commit()
    result = BenchResult(
        name=name,
        title=title,
        command=command or invoked_command(),
        date=dt.datetime.now(dt.UTC).date().isoformat(),
        commit=commit,
        dirty=dirty,
        host=host_description(),
        figures=figures,
        notes=notes,
        extra=extra or {},
    )
    results_dir.mkdir(parents=True, exist_ok=True)
    path = result_path(name, results_dir)
    path.write_text(json.dumps(asdict(result), indent=2) + "\n")
    print(f"result: {path}")
    return path


def load(path: Path) -> BenchResult:
    raw = json.loads(path.read_text())
    raw["figures"] = [Figure(**figure) for figure in raw["figures"]]
    return BenchResult(**raw)


def load_all(results_dir: Path = RESULTS_DIR) -> list[BenchResult]:
    return [load(path) for path in sorted(results_dir.glob("*.json"))]
