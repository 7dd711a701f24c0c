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
                assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z,]+\])?==[\w.+]+", line), f"{path}: {line!r}"
