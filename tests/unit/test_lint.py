"""ruff over the whole repository with the project's configuration (pyproject.toml [tool.ruff]), in
`make test`: among its rules, imports at the top of each module (PLC0415) except where the
configuration or a `# noqa: PLC0415 - why` on the line says otherwise.

The configuration's exceptions for the DAG files' import closure stay honest: each file listed there
must still be one that parsing dags/ imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

from tests.support import PYTHON, REPO, ruff_path

# The PLC0415 exceptions that are not the DAG files' import closure (pyproject.toml says why).
NOT_DAG_CLOSURE = {"gem/pipeline/command.py", "bench/train_throughput.py", "bench/data_path.py", "tests/**"}


def test_ruff_check_passes() -> None:
    out = subprocess.run([ruff_path(), "check", "--no-cache", "--output-format", "concise", "."], cwd=REPO, check=False,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def _dag_closure(tmp_path: Path) -> set[str]:
    """The repository's files a fresh interpreter imports when it parses every file of dags/."""
    probe = (
        "import importlib.util, json, pathlib, sys\n"
        f"root = pathlib.Path({str(REPO)!r})\n"
        "dags = sorted((root / 'dags').glob('*.py'))\n"
        "for i, path in enumerate(dags):\n"
        "    spec = importlib.util.spec_from_file_location(f'dag_probe_{i}', path)\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "files = [pathlib.Path(getattr(m, '__file__', None) or '/') for m in list(sys.modules.values())] + dags\n"
        "print(json.dumps(sorted({str(f.relative_to(root)) for f in files if f.is_relative_to(root)\n"
        "                         and not f.relative_to(root).parts[0].startswith('.')})))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GEM_"))}
    env |= {"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PYTHONPATH": str(REPO)}
    out = subprocess.run([PYTHON, "-c", probe], env=env, cwd=REPO, check=False, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_dag_closure_exceptions_name_files_a_dag_parse_imports(tmp_path: Path) -> None:
    lint = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    listed = {path for path, rules in lint.get("per-file-ignores", {}).items() if "PLC0415" in rules}
    closure = _dag_closure(tmp_path)
    assert {"dags/gem_daily.py", "dags/gem_upkeep.py", "gem/pipeline/airflow/daily_dag.py"} <= closure, closure
    stale = sorted(listed - NOT_DAG_CLOSURE - closure)
    assert not stale, f"listed as the DAG files' import closure, but a DAG parse does not import them: {stale}"
