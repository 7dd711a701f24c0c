"""What the tests on the Airflow cluster share (tests/e2e/test_celery_postgres.py, test_celery_faults.py):
the services they need, a small world's config, the cluster started for it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from bench.backfill import airflow_env
from gem.pipeline.airflow.stack import LocalAirflow, local_airflow
from gem.pipeline.services import REDIS_SERVER, ServiceStartError, postgres_bin
from gem.sources.small_world import world_config
from tests.browser import in_ci


def require_cluster_services() -> None:
    """Skip the calling test without redis-server or PostgreSQL's programs; fail it under CI
    (`make test-slow` installs them: infra/cluster_services.sh)."""
    missing = [] if shutil.which(REDIS_SERVER) else [REDIS_SERVER]
    try:
        postgres_bin()
    except ServiceStartError:
        missing.append("PostgreSQL (initdb)")
    if not missing:
        return
    reason = f"no {' or '.join(missing)}: install Debian's redis-server and postgresql packages"
    if in_ci():
        pytest.fail(f"{reason}: CI must run the Airflow cluster tests (infra/cluster_services.sh)", pytrace=False)
    pytest.skip(reason)


def small_world(root: Path, **overrides: object) -> Path:
    """gem.sources.small_world's config in root/gem.yaml, with `overrides` (top-level keys) on top."""
    path = world_config(root)
    cfg = yaml.safe_load(path.read_text()) | overrides
    path.write_text(yaml.safe_dump(cfg))
    return path


@contextmanager
def cluster_on(root: Path, cfg_path: Path, **settings: str) -> Iterator[LocalAirflow]:
    """Postgres, Redis and the Airflow cluster (two Celery workers of concurrency 1) for the world of
    cfg_path, under root; `settings` go on top of the cluster's environment (retries, timeouts)."""
    require_cluster_services()
    env = airflow_env(root / "airflow_home", cfg_path)
    with local_airflow(env, root / "services", settings=settings) as running:
        yield running

