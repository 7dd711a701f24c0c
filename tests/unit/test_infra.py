"""Deployment descriptions agree with the pinned packages they describe."""

from __future__ import annotations

import re

from tests.support import REPO


def _pin(name: str) -> str:
    text = (REPO / "requirements.txt").read_text()
    match = re.search(rf"^{re.escape(name)}==(\S+)$", text, re.MULTILINE | re.IGNORECASE)
    assert match, f"{name} is not pinned in requirements.txt"
    return match.group(1)


def _delta_artifact(text: str) -> tuple[str, str]:
    """(spark major.minor, delta version) of a delta-spark_<spark>_<scala> coordinate in text."""
    m = re.search(r"delta-spark_(\d+\.\d+)_2\.13(?::|</artifactId>\s*<version>)([\d.]+)", text)
    assert m, "no delta-spark_<spark>_2.13 artifact found"
    return m.group(1), m.group(2)


def test_delta_jars_match_the_pinned_pyspark_and_delta_spark():
    spark_minor = ".".join(_pin("pyspark").split(".")[:2])
    assert _pin("pyspark-client") == _pin("pyspark")  # unequal versions break `import pyspark`
    for path in ("infra/delta-jars/pom.xml", "infra/spark/spark-defaults.conf"):
        assert _delta_artifact((REPO / path).read_text()) == (spark_minor, _pin("delta_spark")), path


def test_every_package_is_pinned_exactly():
    for path in ("requirements.txt", "requirements-nodeps.txt"):
        for line in (REPO / path).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z0-9,]+\])?==[\w.+]+", line), f"{path}: {line!r}"


def _airflow_env(home) -> dict[str, str]:
    """The environment infra/airflow/airflow_env.sh exports for AIRFLOW_HOME=home (a clean shell)."""
    import subprocess

    out = subprocess.run(["bash", "-c", ". infra/airflow/airflow_env.sh && env -0"], cwd=REPO, check=True,
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "AIRFLOW_HOME": str(home)})
    return dict(item.split("=", 1) for item in out.stdout.split("\0") if "=" in item)


def test_airflow_api_binds_to_localhost_requires_login_and_keeps_generated_secrets_owner_only(tmp_path):
    import base64
    import stat
    import subprocess

    env = _airflow_env(tmp_path / "home")
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] == "False"
    assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("SimpleAuthManager")
    secrets_file = tmp_path / "home" / "secrets.env"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    # The home itself too: Airflow writes the admin's generated password there under the umask.
    assert stat.S_IMODE((tmp_path / "home").stat().st_mode) == 0o700
    keys = ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY", "AIRFLOW__CORE__FERNET_KEY")
    assert all(len(env[k]) >= 32 for k in keys)
    assert len(base64.urlsafe_b64decode(env["AIRFLOW__CORE__FERNET_KEY"])) == 32  # a valid fernet key
    assert {k: _airflow_env(tmp_path / "home")[k] for k in keys} == {k: env[k] for k in keys}  # generated once
    other = _airflow_env(tmp_path / "other")
    assert all(other[k] != env[k] for k in keys)  # per home, never a shared default
    # The default home is gitignored: the secrets can never be committed.
    ignored = subprocess.run(["git", "check-ignore", "-q", ".airflow/secrets.env"], cwd=REPO, check=False)
    assert ignored.returncode == 0
