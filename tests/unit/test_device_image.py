"""bench/gpu_check.sh runs on the device machine's own image: torch, numpy, pandas, pyarrow, pyyaml,
typer, matplotlib and pytest, but none of torchrec (no fbgemm there), Spark, Delta, Great Expectations,
Airflow or DuckDB. A lease is short and rare, so each Python entry point the script runs is run here
first with those imports refused: the benches take their no-CUDA (or tiny CPU) path, the study runs its
smoke preset end to end, and pytest collects the GPU test tier.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support import PYTHON, REPO

# Top-level packages the device image lacks (its package list: the device tool's notes).
NOT_ON_DEVICE = ("torchrec", "fbgemm_gpu", "pyspark", "py4j", "delta", "deltalake", "great_expectations",
                 "airflow", "duckdb", "tensordict")
REFUSER = f'''
import importlib.abc, sys
class NotOnDevice(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {NOT_ON_DEVICE!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the device image)", name=name)
sys.meta_path.insert(0, NotOnDevice())
'''
SCRIPT = REPO / "bench" / "gpu_check.sh"


def _device_python(tmp_path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python *args` in the repo with the device image's missing packages refused at import."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(REFUSER)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": f"{site}:{REPO}",
           "GEM__LAKEHOUSE_URI": str(tmp_path / "lake"), "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([PYTHON, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_the_refuser_refuses(tmp_path):
    out = _device_python(tmp_path, "-c", "import torchrec")
    assert out.returncode != 0 and "not on the device image" in out.stderr


def test_every_gpu_check_entry_point_runs_without_the_cpu_only_packages(tmp_path):
    modules = set(re.findall(r"\$py -m ([\w.]+)", SCRIPT.read_text())) - {"pytest"}
    assert modules == {"bench.gpu_train", "bench.precompute", "bench.study_sharing", "gem.study"}
    # bench.gpu_train at its CPU size (its GPU size is minutes on a CPU); the others take their no-CUDA path.
    for args, says in ((["-m", "bench.gpu_train", "--tiny"], "MFU"), (["-m", "bench.precompute", "--gpu-only"], "no CUDA"),
                       (["-m", "bench.study_sharing"], ""), (["-m", "gem.study", "--preset", "smoke"], "report:")):
        out = _device_python(tmp_path, *args)
        assert out.returncode == 0, f"{args}: {out.stderr[-2000:]}"
        assert says in out.stdout, f"{args}: {out.stdout[-2000:]}"
    assert (tmp_path / "lake" / "_reports" / "study" / "smoke" / "index.html").is_file()


def test_the_gpu_test_tier_is_collected_without_the_cpu_only_packages(tmp_path):
    tier = re.search(r"-m gpu -p no:cacheprovider\s*\\\s*\n\s*(.+?)\s+2>&1", SCRIPT.read_text()).group(1).split()
    out = _device_python(tmp_path, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider", *tier)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert re.search(r"\b([1-9]\d*)/\d+ tests collected", out.stdout), out.stdout[-2000:]
