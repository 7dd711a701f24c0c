"""Shared fixtures: one local Spark session for the whole suite, and a throwaway lakehouse config."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from gem.config import GemConfig, load_config

REPO = Path(__file__).resolve().parent.parent
# Subprocess runs of `python -m jobs...` use the same interpreter and import path.
PYTHON = sys.executable


@pytest.fixture(scope="session")
def spark():
    from gem.spark import get_spark

    cfg = load_config(overrides={"spark": {"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g"}})
    session = get_spark(cfg, app_name="gem-tests")
    yield session
    session.stop()
    # py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
    # pytest has closed the captured stream: a spurious "Logging error" traceback under the summary.
    logging.getLogger("py4j").setLevel(logging.WARNING)


def make_config(tmp_path: Path, **overrides) -> GemConfig:
    """A config whose lakehouse and landing live under tmp_path; small generator defaults."""
    base = {
        "lakehouse_uri": str(tmp_path / "lakehouse"),
        # Jobs a test starts as subprocesses get short-lived JVMs: C1 only, as in the demo (the
        # in-process tests share the session fixture's JVM, which this does not touch).
        "spark": {"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g",
                  "conf": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}},
        "generator": {"users": 500, "ads": 100, "advertisers": 20, "events_per_day": 5000, "chunk_impressions": 2000},
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return load_config(overrides=base, environ={})


@pytest.fixture
def cfg(tmp_path: Path) -> GemConfig:
    return make_config(tmp_path)


def subprocess_env(cfg_path: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEM__")}
    env["PYTHONPATH"] = str(REPO)
    if cfg_path is not None:
        env["GEM_CONFIG"] = str(cfg_path)
    return env
