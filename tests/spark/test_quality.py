"""gem.quality and jobs.validate_events with real Great Expectations on the session's Spark.

Bronze frames are built from BRONZE_AD_EVENTS with a few hand-made rows: per configured surface
ten impressions and one click (CTR 0.1, inside the default bounds) plus one conversion.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gem.config import GemConfig
from gem.lakehouse.commit import StageContext
from gem.lakehouse.completions import completion, publish_completion
from gem.lakehouse.tables import replace_partition
from gem.quality import docs_assets
from gem.quality.bronze import (
    ctr_column,
    event_statistics_expectations,
    event_statistics_frame,
    null_rate_column,
    nullable_event_columns,
)
from gem.quality.expectations import schema_expectations
from gem.quality.runner import DataQualityError, build_data_docs, docs_site_dir, validate
from jobs import validate_events
from schemas.events import BRONZE_AD_EVENTS
from schemas.ops import COMPLETIONS
from schemas.tasks import CONVERSION_TYPES, CREATIVE_TYPES, OBJECTIVES
from tests.browser import render
from tests.support import make_config

DS = "2026-01-01"
SCHEMA_SUITE = "test.bronze.schema"
STATISTICS_SUITE = "test.bronze.statistics"
IMPRESSIONS_PER_SURFACE = 10


# --------------------------------------------------------------------------------------------------
# Hand-made bronze rows.


def event(event_id: str, event_type: str = "impression", surface: str = "reels", **overrides: Any) -> dict[str, Any]:
    """One valid bronze.ad_events row; `overrides` replace single fields."""
    is_conversion = event_type == "conversion"
    row = {
        "event_id": event_id,
        "event_type": event_type,
        "event_time": dt.datetime(2026, 1, 1, 12, 0),
        "user_id": "u1",
        "ad_id": "a1",
        "advertiser_id": "adv1",
        "campaign_id": "c1",
        "objective": OBJECTIVES[0],
        "creative_type": CREATIVE_TYPES[0],
        "surface": surface,
        "position": None if is_conversion else 1,
        "conversion_type": CONVERSION_TYPES[0] if is_conversion else None,
        "user_attrs": {"age": "25-34"},
        "ds": dt.date.fromisoformat(DS),
    }
    assert set(row) == set(BRONZE_AD_EVENTS.column_names)
    return {**row, **overrides}


def clean_day(surfaces: tuple[str, ...], clicks: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Ten impressions and (by default) one click per surface, and one conversion."""
    rows = []
    for s in surfaces:
        rows += [event(f"{s}-i{i}", "impression", s) for i in range(IMPRESSIONS_PER_SURFACE)]
        rows += [event(f"{s}-c{i}", "click", s) for i in range((clicks or {}).get(s, 1))]
    return rows + [event("conv-0", "conversion", surfaces[0])]


def frame(spark: Any, rows: list[dict[str, Any]], strict: bool = True) -> Any:
    """A DataFrame with bronze's schema; strict=False relaxes NOT NULL so a dirty row can exist
    (as it would when read from a source that does not enforce it)."""
    from pyspark.sql import types as T

    schema = BRONZE_AD_EVENTS.spark_schema()
    if not strict:
        schema = T.StructType([T.StructField(f.name, f.dataType, True) for f in schema.fields])
    return spark.createDataFrame([tuple(r[c] for c in BRONZE_AD_EVENTS.column_names) for r in rows], schema)


def ingest_record(rows_written: int, quarantined: dict[str, int] | None = None) -> dict[str, Any]:
    """An ingest_events completion record as gem.lakehouse.completions.completion returns it."""
    quarantined = quarantined or {}
    rows_quarantined = sum(quarantined.values())
    return {
        "rows_in": rows_written + rows_quarantined,
        "rows_written": rows_written,
        "rows_quarantined": rows_quarantined,
        "quarantined_by_reason": quarantined,
        "table_versions": {},
    }


# --------------------------------------------------------------------------------------------------
# Derived expectations (no Spark).


def _by_type(expectations: list[Any]) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = {}
    for e in expectations:
        grouped.setdefault(e.expectation_type, []).append(e)
    return grouped


def test_schema_expectations_cover_every_column_rule() -> None:
    schema = BRONZE_AD_EVENTS
    by_type = _by_type(schema_expectations(schema))

    (ordered,) = by_type["expect_table_columns_to_match_ordered_list"]
    assert ordered.column_list == schema.column_names
    assert [e.column for e in by_type["expect_column_values_to_be_of_type"]] == schema.column_names
    assert [e.column for e in by_type["expect_column_values_to_not_be_null"]] == [
        c.name for c in schema.columns if not c.nullable
    ]
    assert {e.column: tuple(e.value_set) for e in by_type["expect_column_values_to_be_in_set"]} == {
        c.name: c.allowed for c in schema.columns if c.allowed is not None
    }
    assert {e.column: (e.min_value, e.max_value) for e in by_type["expect_column_values_to_be_between"]} == {
        c.name: (c.min, c.max) for c in schema.columns if c.min is not None or c.max is not None
    }
    assert [e.column for e in by_type["expect_column_values_to_be_unique"]] == list(schema.key)
    checks = by_type["unexpected_rows_expectation"]
    assert len(checks) == len(schema.checks)
    for (name, expr), e in zip(schema.checks, checks):
        assert expr in e.unexpected_rows_query and e.meta["rule"] == f"check:{name}"


def test_schema_expectations_are_all_critical_with_distinct_rules() -> None:
    expectations = schema_expectations(BRONZE_AD_EVENTS)
    assert all(e.meta["critical"] is True for e in expectations)
    rules = [e.meta["rule"] for e in expectations]
    assert len(rules) == len(set(rules))


def test_compound_key_becomes_compound_uniqueness() -> None:
    by_type = _by_type(schema_expectations(COMPLETIONS))
    (unique,) = by_type["expect_compound_columns_to_be_unique"]
    assert unique.column_list == list(COMPLETIONS.key)
    assert "expect_column_values_to_be_unique" not in by_type


def test_statistics_expectations_follow_config(cfg: GemConfig) -> None:
    by_column = {e.column: e for e in event_statistics_expectations(cfg)}
    for s in cfg.surfaces:
        ctr = by_column[ctr_column(s)]
        assert (ctr.min_value, ctr.max_value) == (cfg.quality.min_surface_ctr, cfg.quality.max_surface_ctr)
        assert ctr.meta["critical"] is True
    for c in nullable_event_columns():
        null_rate = by_column[null_rate_column(c)]
        assert null_rate.max_value == cfg.quality.max_null_rate and null_rate.meta["critical"] is False
    assert by_column["quarantine_rate"].max_value == cfg.quality.max_quarantine_rate
    assert by_column["duplicate_rate"].meta["critical"] is True


def test_localize_rewrites_every_kind_of_remote_reference(tmp_path: Path) -> None:
    """Pinned CDN file -> local copy (SRI attributes dropped); GX image -> the site's copy; any
    other remote script, stylesheet, import or url() removed; remote links keep only their text."""
    site = tmp_path / "site"
    (site / docs_assets.SITE_IMAGES_DIR).mkdir(parents=True)
    (site / docs_assets.SITE_IMAGES_DIR / "logo-long.png").write_bytes(b"png")
    jquery = next(f for f in docs_assets.load_manifest() if f.package.startswith("jquery@"))
    page = site / "validations" / "suite" / "run.html"
    page.parent.mkdir(parents=True)
    page.write_text(
        f'<script src="https://cdn.example{jquery.replaces}" integrity="sha384-x" crossorigin="anonymous"></script>\n'
        '<script src="//other.example/unknown.js"></script>\n'
        "<link rel='stylesheet' href='https://other.example/unknown.css'>\n"
        '<img src="https://bucket.example/assets/logo-long.png?d=1" alt="logo">\n'
        '<a href="https://vendor.example/newsletter">Subscribe</a>\n'
        "<style>@import url('https://fonts.example/f.css'); .x { background: url(https://img.example/d.png) }</style>\n"
    )
    docs_assets.localize_site(site, [jquery])
    text = page.read_text()

    assert docs_assets.remote_references(site) == {}
    assert f'<script src="../../static/vendor/{jquery.vendor_path}"></script>' in text
    assert "unknown" not in text and "integrity" not in text and "@import" not in text
    assert 'src="../../static/images/logo-long.png"' in text
    assert "<a >Subscribe</a>" in text
    assert "background: none" in text


# --------------------------------------------------------------------------------------------------
# validate() on hand-made frames.


def test_clean_events_pass(spark: Any, cfg: GemConfig) -> None:
    expectations = schema_expectations(BRONZE_AD_EVENTS)
    report = validate(cfg, frame(spark, clean_day(cfg.surfaces)), SCHEMA_SUITE, expectations, DS)

    assert report.success and not report.failed_critical and not report.failed_warnings
    assert len(report.outcomes) == len(expectations)
    assert Path(report.result_path).is_file() and Path(cfg.gx_root) in Path(report.result_path).parents
    assert Path(report.docs_page).is_file()


def test_each_broken_rule_fails_naming_its_expectation(spark: Any, cfg: GemConfig) -> None:
    """One frame, three defects in three rows: exactly the three matching expectations fail
    (every other rule passes, as on the clean frame), and the error names each of them."""
    rows = clean_day(cfg.surfaces)
    rows[0] = {**rows[0], "event_id": None}  # null in a NOT NULL column
    rows[1] = {**rows[1], "surface": "myspace"}  # value outside `allowed`
    rows.append(dict(rows[2]))  # duplicate key
    broken = ["not_null:event_id", "allowed:surface", "unique_key:event_id"]

    with pytest.raises(DataQualityError) as failure:
        validate(cfg, frame(spark, rows, strict=False), SCHEMA_SUITE, schema_expectations(BRONZE_AD_EVENTS), DS)
    (report,) = failure.value.reports
    assert sorted(o.rule for o in report.failed_critical) == sorted(broken)
    for rule in broken:
        assert rule in str(failure.value)
    assert "myspace" in str(failure.value)  # observed values are quoted
    assert Path(report.result_path).is_file()  # a failed run is stored too
    # A contract gate's line: the bound is the schema's, and no setting relaxes it.
    (line,) = [f for f in str(failure.value).splitlines() if f.startswith(f"FAILED {SCHEMA_SUITE}/allowed:surface")]
    assert "found 1 of" in line and "myspace" in line and "value_set=" in line
    assert line.endswith("set by the bronze.ad_events contract in schemas/ (not a setting)")


def test_data_docs_and_messages_mask_personal_values_of_failed_rows(cfg: GemConfig) -> None:
    """A key made of a user id breaks: the stored result, its Data Docs page and the error keep the
    failure and how many rows broke, never whose (the schemas mark user_id personal)."""
    import pandas as pd

    from schemas.features import SILVER_USER_FEATURES

    (unique,) = [e for e in schema_expectations(SILVER_USER_FEATURES) if e.meta["rule"].startswith("unique_key")]
    rows = pd.DataFrame({"ds": ["2026-01-02"] * 3, "user_id": ["u-secret-42", "u-secret-42", "u7"]})
    with pytest.raises(DataQualityError) as failure:
        validate(cfg, rows, "test.features.key", [unique], DS)
    (report,) = failure.value.reports
    assert [o.rule for o in report.failed_critical] == ["unique_key:ds,user_id"]
    assert "2 of 3 rows unexpected" in str(failure.value)
    result_path, docs_page = Path(report.result_path), Path(report.docs_page)
    stored = result_path.read_text()
    (broken,) = json.loads(stored)["results"]
    assert broken["result"]["partial_unexpected_list"] == ["***", "***"]  # the sample was there, masked
    for text in (stored, docs_page.read_text(), str(failure.value)):
        assert "u-secret-42" not in text
    # A validation killed between GX storing its result and the masking leaves the raw sample on
    # disk: a rebuild of the Data Docs masks every stored result before rendering any page.
    result_path.write_text(stored.replace('"***"', '"u-secret-42"'))
    build_data_docs(cfg, rebuild=True)
    assert "u-secret-42" not in result_path.read_text()
    assert "u-secret-42" not in docs_page.read_text()


def test_data_docs_render_a_validation_over_a_multi_year_range(cfg: GemConfig) -> None:
    """A validation over three years of days (as `gem bulk` runs one over a long history) renders its page and
    the index in a browser. GX's page title parses the run name as a time: a bare range of days reads
    as an offset beyond a day and broke the page, so such a label is refused, naming the fix."""
    import pandas as pd

    from gem.days import day_range
    from gem.quality.expectations import expect_between

    days = day_range("2000-04-25", "2003-04-28")
    frame = pd.DataFrame({"ds": days, "rows_validated": range(1, len(days) + 1)})
    expectations = [expect_between("rows_validated", 1, None, "bronze_partition_not_empty", True, "test")]
    label = f"validate_events:{days[0]}..{days[-1]}"
    report = validate(cfg, frame, "test.long_range", expectations, label)
    assert report.success and len(days) > 3 * 365
    index = build_data_docs(cfg, rebuild=True)
    page = render(Path(report.docs_page)).text
    assert "Expectation Suite: test.long_range" in page and "Succeeded" in page and "rows_validated" in page
    assert label in render(Path(index)).text  # the index lists the run by its name
    with pytest.raises(ValueError, match="name the stage first"):
        validate(cfg, frame, "test.long_range", expectations, f"{days[0]}..{days[-1]}")


def test_statistics_fail_on_ctr_and_quarantine_rate_but_only_warn_on_nulls(spark: Any, cfg: GemConfig) -> None:
    """CTR outside [min, max] and a quarantine rate above the bound are critical; a null in a
    nullable column is a warning."""
    too_clicky = cfg.surfaces[0]
    rows = clean_day(cfg.surfaces, clicks={too_clicky: IMPRESSIONS_PER_SURFACE})  # CTR 1.0
    rows[-1] = {**rows[-1], "user_attrs": None}
    quarantined = {"duplicate_event_id": 1, "malformed_json": len(rows)}  # about half of rows_in
    stats = event_statistics_frame(frame(spark, rows), {DS: ingest_record(len(rows), quarantined)}, {DS: len(rows) + 1}, cfg)

    with pytest.raises(DataQualityError, match=re.escape(f"surface_ctr:{too_clicky}")) as failure:
        validate(cfg, stats, STATISTICS_SUITE, event_statistics_expectations(cfg), DS)
    (report,) = failure.value.reports
    assert sorted(o.rule for o in report.failed_critical) == sorted([f"surface_ctr:{too_clicky}", "quarantine_rate"])
    assert [o.rule for o in report.failed_warnings] == ["null_rate:user_attrs"]
    ctr_failure = next(o for o in report.failed_critical if o.rule.startswith("surface_ctr"))
    assert "1.0" in ctr_failure.observed
    # A statistics gate's line: the rate found with its day, the bound and the key that sets it.
    (line,) = [f for f in str(failure.value).splitlines() if f.startswith(f"FAILED {STATISTICS_SUITE}/quarantine_rate")]
    rate = stats["quarantine_rate"].iloc[0]
    assert line == (f"FAILED {STATISTICS_SUITE}/quarantine_rate: found {rate:.4g} (ds={DS}); "
                    f"bound between 0.0 and {cfg.quality.max_quarantine_rate}; set by quality.max_quarantine_rate")


# --------------------------------------------------------------------------------------------------
# jobs.validate_events end to end, and the Data Docs it leaves.


def write_day(spark: Any, cfg: GemConfig, ds: str, rows: list[dict[str, Any]]) -> None:
    """bronze.ad_events for ds plus ingest_events' completion record, through gem.lakehouse."""
    rows = [{**r, "ds": dt.date.fromisoformat(ds)} for r in rows]
    version = replace_partition(frame(spark, rows), cfg, BRONZE_AD_EVENTS, {"ds": ds}).version
    run_id = f"ingest_events:{ds}:test"
    versions = {BRONZE_AD_EVENTS.name: version}
    publish_completion(cfg, "ingest_events", ds, run_id, len(rows), len(rows), {}, versions)


def _config_file(tmp_path: Path, cfg: GemConfig) -> Path:
    """A --config file pointing the job's CLI at the test lakehouse."""
    path = tmp_path / "gem.yaml"
    path.write_text(yaml.safe_dump({"lakehouse_uri": cfg.lakehouse_uri}))
    return path


ValidatedDay = tuple[GemConfig, dict[str, Any]]


@pytest.fixture(scope="module")
def validated_day(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> ValidatedDay:
    """One clean day validated by the job; its lakehouse, GX results and Data Docs stay for the
    tests below."""
    cfg = make_config(tmp_path_factory.mktemp("validated"))
    write_day(spark, cfg, DS, clean_day(cfg.surfaces))
    return cfg, validate_events.run(StageContext(cfg), DS).details


def test_validate_events_passes_and_publishes_completion(spark: Any, validated_day: ValidatedDay) -> None:
    cfg, summary = validated_day
    rows = len(clean_day(cfg.surfaces))
    assert summary["success"] and summary["rows_validated"] == rows and not summary["failed_critical"]
    record = completion(cfg, "validate_events", DS)
    assert record is not None
    assert (record["rows_in"], record["rows_written"], record["rows_quarantined"]) == (None, rows, 0)
    assert record["reconciliation"] == validate_events.VALIDATION_WRITES_NOTHING
    assert record["table_versions"] == {BRONZE_AD_EVENTS.name: summary["events_version"]}


def test_results_persist_under_gx_root(validated_day: ValidatedDay) -> None:
    cfg, summary = validated_day
    assert set(summary["results"]) == {validate_events.STATISTICS_SUITE}
    for path in summary["results"].values():
        assert Path(path).is_file() and Path(cfg.gx_root) in Path(path).parents


# Independent of gem.quality.docs_assets' scanner: remote URLs in src/href/srcset, CSS url() and @import.
_REMOTE_LOAD = re.compile(
    r"""(?:\b(?:src|href|srcset)\s*=\s*["']?|url\(\s*["']?|@import\s+(?:url\(\s*)?["']?)\s*(?:https?:)?//""",
    re.IGNORECASE,
)


def test_data_docs_have_no_external_url(validated_day: ValidatedDay) -> None:
    cfg, summary = validated_day
    index = Path(summary["data_docs_index"])
    assert index.is_file() and index.parent == docs_site_dir(cfg)
    assert build_data_docs(cfg) == str(index)  # a full re-render is made offline too

    files = docs_assets.site_files(index.parent)
    pages = [p for p in files if p.suffix == ".html"]
    assert len(pages) >= 3  # index, the statistics suite, its validation result
    assert {str(p): _REMOTE_LOAD.findall(p.read_text()) for p in files if _REMOTE_LOAD.search(p.read_text())} == {}
    # Pages do not even mention a remote URL; vendored CSS may (licence comments, SVG namespaces).
    assert [str(p) for p in pages if re.search(r"https?://", p.read_text())] == []
    assert docs_assets.remote_references(index.parent) == {}
    assert _REMOTE_LOAD.search('<script src="https://x.example/a.js"></script>')  # the check can fail


_LOCAL_PAGE_ASSET = re.compile(r"""\b(?:src|href)\s*=\s*["']([^"'#:?]+\.(?:css|js|png|ico))["']""")
_LOCAL_CSS_ASSET = re.compile(r"""url\(\s*["']?([^"')#?:]+)["']?\s*\)""")


def test_vendored_assets_referenced_by_pages_exist(validated_day: ValidatedDay) -> None:
    """Every local CSS/JS/image a page loads exists, and so does every font its CSS loads."""
    cfg, _ = validated_day
    site = docs_site_dir(cfg)
    referenced: set[Path] = set()
    for page in site.rglob("*.html"):
        for link in _LOCAL_PAGE_ASSET.findall(page.read_text()):
            target = (page.parent / link).resolve()
            if link.endswith("favicon.ico"):
                continue  # GX's own favicon link on result pages is one folder short; not ours
            assert target.is_file(), f"{page.relative_to(site)} references missing {link}"
            referenced.add(target)
    for stylesheet in [p for p in referenced if p.suffix == ".css"]:
        for link in _LOCAL_CSS_ASSET.findall(stylesheet.read_text()):
            assert (stylesheet.parent / link).resolve().is_file(), f"{stylesheet} loads missing {link}"
    vendor = site / docs_assets.SITE_VENDOR_DIR
    vendored = {(vendor / f.vendor_path).resolve() for f in docs_assets.load_manifest() if f.replaces}
    assert vendored <= referenced  # every CDN file GX pages use is served locally


def test_validate_events_fails_on_critical_expectation(
    spark: Any, validated_day: ValidatedDay, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, _ = validated_day
    bad_ds = "2026-01-02"
    surface = cfg.surfaces[-1]
    write_day(spark, cfg, bad_ds, clean_day(cfg.surfaces, clicks={surface: IMPRESSIONS_PER_SURFACE}))

    config_file = _config_file(tmp_path, cfg)
    assert validate_events.main(["--ds", bad_ds, "--config", str(config_file)]) == 1
    err = capsys.readouterr().err
    assert f"surface_ctr:{surface}" in err and "[1.0]" in err and "Data Docs of" in err
    # It ends with the gate's line: check, value found and day, bound, config key, rerun command.
    assert err.strip().splitlines()[-1] == (
        f"FAILED {validate_events.STATISTICS_SUITE}/surface_ctr:{surface}: found 1 (ds={bad_ds}); "
        f"bound between {cfg.quality.min_surface_ctr} and {cfg.quality.max_surface_ctr}; "
        "set by quality.min_surface_ctr / quality.max_surface_ctr; "
        f"rerun: python -m jobs.validate_events --ds {bad_ds} --config {config_file}")
    assert completion(cfg, "validate_events", bad_ds) is None


def test_validate_events_requires_ingest_completion(
    validated_day: ValidatedDay, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, _ = validated_day
    assert validate_events.main(["--ds", "2026-02-01", "--config", str(_config_file(tmp_path, cfg))]) == 1
    assert "ingest_events" in capsys.readouterr().err
