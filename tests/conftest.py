"""Shared fixtures: one local Spark session for the whole suite, a throwaway lakehouse config, and
the local S3 API server with a fresh bucket per test (helpers the test modules share live in
tests/support.py)."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pytest

from gem import storage
from gem.config import GemConfig, load_config
from gem.pipeline.services import S3Server
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


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    """moto's S3 API in server mode (gem.pipeline.services), its AWS variables set for the session,
    so boto-, s3fs-, delta-rs- and S3A-based clients in this process and its children reach it."""
    server = S3Server(tmp_path_factory.mktemp("s3-server")).start()
    saved = {k: os.environ.get(k) for k in server.environment()}
    os.environ.update(server.environment())
    yield server
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A new, empty bucket on the local S3 API: its URI, s3://<name>."""
    name = f"gem-test-{uuid.uuid4().hex[:12]}"
    storage.filesystem("s3://").mkdir(name)
    return f"s3://{name}"


@pytest.fixture(params=["local", "s3"])
def lake_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A lakehouse root on a local folder, then on the local S3 API: a test taking it runs on both."""
    if request.param == "local":
        return str(tmp_path / "lake")
    return request.getfixturevalue("s3_bucket") + "/lake"
