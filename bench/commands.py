"""The README's two commands and the cluster demo timed on a fresh clone: `make setup`, then
`make demo`, `make test` and `make cluster-demo`.

    python -m bench.commands                # all three; writes docs/benchmarks/make_demo.json,
                                            # make_test.json and make_cluster_demo.json
    python -m bench.commands --only demo    # one of them (repeatable)
    python -m bench.commands --keep         # leave the clone (its lakehouse, logs) for a look afterwards

The clone is of this checkout's HEAD (uncommitted changes are not in it; the results name HEAD). Set-up runs first and is timed on its own: its time depends on what pip, Maven and npm
already hold in their caches on this host, while the two commands after it do not download anything.
When both demos run, the cluster demo's result also records the largest difference between the
held-out NE per task the two printed (they train on the same rows).
Each command runs as CI runs it (`CI=true`: a browser test without Chromium fails instead of
skipping); a command that fails stops the bench with the tail of its log, and nothing is recorded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from bench.results import REPO_ROOT, Figure, current_commit, record

COMMANDS = ("demo", "test", "cluster-demo")
# pytest's last summary line: "=== 662 passed, 14 skipped in 3060.43s ===", or without the rules
# when a report section (e.g. --durations) comes before it under -q.
PYTEST_SUMMARY = re.compile(r"^=*\s*(?P<body>\d+ passed.*?) in [\d.]+s", re.MULTILINE)
# A row of the demo's "pretraining: held-out metrics per task" table: task, examples, positives, NE, ...
HELD_OUT_ROW = re.compile(r"^\s+(?P<task>[a-z_]+/[a-z_]+)\s+[\d,]+\s+[\d,]+\s+(?P<ne>\d+\.\d+)\s")
HELD_OUT_HEADER = "== pretraining: held-out metrics per task"
# pytest --collect-only -q -m slow: "44/760 tests collected (716 deselected) in 5.1s".
SLOW_COLLECTED = re.compile(r"^(?P<selected>\d+)/\d+ tests collected", re.MULTILINE)


class CommandFailed(Exception):
    pass


def timed_make(target: str, clone: Path, log: Path) -> float:
    """Seconds `make <target>` took in the clone; its output goes to `log`."""
    env = {**os.environ, "CI": "true"}
    started = time.monotonic()
    with log.open("w") as out:
        completed = subprocess.run(["make", target], cwd=clone, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    seconds = time.monotonic() - started
    if completed.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        raise CommandFailed(f"`make {target}` exited {completed.returncode} after {seconds:.0f} s; log {log}:\n{tail}")
    print(f"make {target}: {seconds:.0f} s (log {log}); load average over the last 15 min: {os.getloadavg()[2]:.1f}")
    return seconds


def load_figure(command: str) -> Figure:
    """The host's 15-minute load average as a command ends: how busy the cores were beside it."""
    return Figure("load_avg_15m", f"host load average, last 15 min, as `{command}` ended", round(os.getloadavg()[2], 1))


def pytest_counts(log_text: str) -> dict[str, int]:
    """{"passed": 571, "skipped": 13, "deselected": 44} from pytest's last summary line."""
    matches = PYTEST_SUMMARY.findall(log_text)
    if not matches:
        raise CommandFailed("no pytest summary line in `make test`'s log")
    counts = {}
    for part in matches[-1].split(","):
        number, _, kind = part.strip().partition(" ")
        counts[kind] = int(number)
    return counts


def slow_tests(clone: Path) -> int:
    """How many tests the slow tier holds, collected in the clone (pytest-xdist's summary line
    under `make test` does not count the tests `-m "not slow"` deselected)."""
    collected = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pytest", "--collect-only", "-q",
                                "-m", "slow", "-p", "no:cacheprovider"], cwd=clone, capture_output=True, text=True,
                               check=False)
    found = SLOW_COLLECTED.search(collected.stdout)
    if not found:
        raise CommandFailed(f"no collection count from pytest --collect-only -m slow:\n{collected.stdout[-2000:]}")
    return int(found["selected"])


def held_out_ne(log_text: str) -> dict[str, float]:
    """task -> held-out NE from the pretraining table a demo prints at its end."""
    _, found, table = log_text.partition(HELD_OUT_HEADER)
    if not found:
        raise CommandFailed(f"no '{HELD_OUT_HEADER}' table in the demo's log")
    rows = {}
    for line in table.splitlines():
        match = HELD_OUT_ROW.match(line)
        if match is not None:
            rows[match["task"]] = float(match["ne"])
        elif rows and "too few positives" not in line:  # the table's end (a task too sparse to read has no NE)
            break
    return rows


def main(
    only: Annotated[list[str] | None, typer.Option("--only", help="demo, test or cluster-demo (repeatable); default: all")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="keep the clone and its logs")] = False,
) -> None:
    """Time `make demo`, `make test` and `make cluster-demo` on a fresh clone of HEAD after `make setup`."""
    wanted = only or list(COMMANDS)
    if unknown := sorted(set(wanted) - set(COMMANDS)):
        raise typer.BadParameter(f"unknown command(s) {unknown}; choose from {list(COMMANDS)}", param_hint="--only")
    commit, dirty = current_commit()
    if dirty:
        print(f"note: the checkout has uncommitted changes; the clone times HEAD ({commit[:12]}) without them")
    workspace = Path(tempfile.mkdtemp(prefix="gem-bench-commands-"))
    clone = workspace / "gem"
    try:
        subprocess.run(["git", "clone", "--quiet", str(REPO_ROOT), str(clone)], check=True)
        setup_s = timed_make("setup", clone, workspace / "setup.log")
        if "demo" in wanted:
            demo_s = timed_make("demo", clone, workspace / "demo.log")
            record(
                "make_demo",
                "`make demo` on a fresh clone",
                [
                    Figure("wall_s", "`make demo`, after set-up", round(demo_s, 1), "s"),
                    load_figure("make demo"),
                    Figure("setup_s", "`make setup` on the fresh clone (pip, Maven and npm caches as the host had them)",
                           round(setup_s, 1), "s"),
                ],
                commit=commit,
                notes="The demo: synthetic data, local Spark, a local Delta folder, SQLite Airflow, CPU torch "
                      "(configs/demo.yaml).",
            )
        if "test" in wanted:
            test_s = timed_make("test", clone, workspace / "test.log")
            counts = pytest_counts((workspace / "test.log").read_text())
            record(
                "make_test",
                "`make test` on a fresh clone",
                [
                    Figure("wall_s", "`make test`, after set-up", round(test_s, 1), "s"),
                    load_figure("make test"),
                    Figure("passed", "tests passed", counts.get("passed", 0)),
                    Figure("skipped", "tests skipped (the GPU tier without CUDA)", counts.get("skipped", 0)),
                    Figure("deselected", "slow-tier tests left to `make test-slow`", slow_tests(clone)),
                ],
                commit=commit,
            )
        if "cluster-demo" in wanted:
            cluster_s = timed_make("cluster-demo", clone, workspace / "cluster-demo.log")
            figures = [Figure("wall_s", "`make cluster-demo`, after set-up (services started and stopped included)",
                              round(cluster_s, 1), "s"), load_figure("make cluster-demo")]
            if "demo" in wanted:
                local, cluster = (held_out_ne((workspace / f"{name}.log").read_text()) for name in ("demo", "cluster-demo"))
                if set(local) != set(cluster):
                    raise CommandFailed(f"the demos' held-out tasks differ: {sorted(set(local) ^ set(cluster))}")
                gap = max(abs(local[task] - cluster[task]) for task in local)
                figures.append(Figure("max_ne_gap", f"largest absolute held-out NE difference to `make demo` over "
                                      f"{len(local)} tasks", round(gap, 4)))
            record("make_cluster_demo", "`make cluster-demo` on a fresh clone", figures, commit=commit,
                   notes="The demo's days on a local S3 API server and a standalone Spark master with two "
                         "workers, one executor of two task slots per application (gem/pipeline/cluster_demo.py).")
    except CommandFailed as error:
        keep = True
        raise SystemExit(str(error)) from None
    finally:
        if keep:
            print(f"clone kept: {clone}")
        else:
            shutil.rmtree(workspace, ignore_errors=True)


if __name__ == "__main__":
    typer.run(main)
