"""Shared fixtures: one local Spark session for the whole suite, and a throwaway lakehouse config
(helpers the test modules share live in tests/support.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gem.config import GemConfig, load_config
from tests.support import make_config


@pytest.fixture(scope="session")
def spark():
    from gem.lakehouse.spark import get_spark

    cfg = load_config(overrides={"spark": {"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g"}})
    session = get_spark(cfg, app_name="gem-tests")
    yield session
    session.stop()
    # py4j logs "Closing down clientserver connection" from __del__ at interpreter exit, after
    # pytest has closed the captured stream: a spurious "Logging error" traceback under the summary.
    logging.getLogger("py4j").setLevel(logging.WARNING)


@pytest.fixture
def cfg(tmp_path: Path) -> GemConfig:
    return make_config(tmp_path)
