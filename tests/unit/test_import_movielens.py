"""jobs.import_movielens: both MovieLens layouts become landing events by the documented rules.

The expected numbers below are counted by hand from the fixture files in tests/fixtures/movielens/
(ratings 5 -> 3 events, 4 -> 2, else 1), so they check the job rather than repeat its code.
"""

from __future__ import annotations

import gzip
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gem.lakehouse.landing import SUCCESS_MARKER, read_manifest, require_partition
from gem.sources.movielens_events import FALLBACK_SURFACE, GENRE_SURFACE, LANDING_FILE_NAME, import_movielens
from gem.sources.movielens_format import ML100K_GENRES, MovieLensFormatError, detect_format
from jobs.import_movielens import main
from schemas.events import LANDING_EVENTS
from schemas.tasks import CONVERSION_TYPES, CREATIVE_TYPES, OBJECTIVES, SURFACES
from tests.support import FIXTURES as SHARED_FIXTURES
from tests.support import make_config

FIXTURES = SHARED_FIXTURES / "movielens"
ML_1M = FIXTURES / "ml-1m"
ML_100K = FIXTURES / "ml-100k"

# Per format: events per type and per day, counted by hand from the fixture.
EXPECTED = {
    "ml-1m": {
        "ratings": 10,
        "events_by_type": {"impression": 10, "click": 5, "conversion": 3},
        "per_day": {
            "2000-12-29": {"impression": 4, "click": 2, "conversion": 2},
            "2000-12-30": {"impression": 3, "click": 2, "conversion": 0},
            "2000-12-31": {"impression": 3, "click": 1, "conversion": 1},
        },
    },
    "ml-100k": {
        "ratings": 9,
        "events_by_type": {"impression": 9, "click": 5, "conversion": 3},
        "per_day": {
            "1997-09-20": {"impression": 4, "click": 2, "conversion": 1},
            "1997-09-21": {"impression": 2, "click": 1, "conversion": 0},
            "1997-09-22": {"impression": 3, "click": 2, "conversion": 2},
        },
    },
}
FIXTURE_DIRS = {"ml-1m": ML_1M, "ml-100k": ML_100K}

# Per format: ad_id -> (surface, advertiser_id, campaign_id), from each movie's first genre and year.
EXPECTED_ADS = {
    "ml-1m": {
        "m1": ("stories", "adv-animation", "cmp-animation-1990s"),  # Animation|Children's|Comedy, 1995
        "m2": ("reels", "adv-action", "cmp-action-1990s"),  # Action|Crime|Thriller, 1995
        "m3": ("marketplace", "adv-horror", "cmp-horror-1970s"),  # Horror|Sci-Fi|Thriller, 1979
        "m4": ("ig_feed", "adv-drama", "cmp-drama-1990s"),  # Drama|Musical, latin-1 title, 1995
        "m5": ("fb_feed", "adv-comedy", "cmp-comedy-1950s"),  # Comedy|Crime, 1959
        "m6": ("reels", "adv-adventure", "cmp-adventure-1990s"),  # Adventure|Sci-Fi, 1995
    },
    "ml-100k": {
        "m1": ("stories", "adv-animation", "cmp-animation-1990s"),  # Animation, Children's, Comedy
        "m2": ("reels", "adv-action", "cmp-action-1990s"),  # Action, Adventure, Thriller
        "m3": ("marketplace", "adv-documentary", "cmp-documentary-1990s"),  # Documentary, 1994
        "m4": ("ig_feed", "adv-drama", "cmp-drama-1940s"),  # Drama, Romance, War, 1942
        "m5": (FALLBACK_SURFACE, "adv-unknown", "cmp-unknown-unknown"),  # "unknown" flag, no date
        "m6": ("reels", "adv-adventure", "cmp-adventure-1990s"),  # Adventure, Sci-Fi, latin-1 title
        "m7": ("fb_feed", "adv-comedy", "cmp-comedy-1950s"),  # Comedy, Crime, 1959
    },
}

EXPECTED_USER_ATTRS = {
    "ml-1m": {
        "u1": {"gender": "F", "age": "1", "occupation": "10", "zip": "48067"},
        "u2": {"gender": "M", "age": "56", "occupation": "16", "zip": "70072"},
        "u3": {"gender": "M", "age": "25", "occupation": "15", "zip": "55117"},
        "u4": {"gender": "F", "age": "35", "occupation": "7", "zip": "02460"},  # leading zero kept
    },
    "ml-100k": {
        "u1": {"age": "24", "gender": "M", "occupation": "technician", "zip": "85711"},
        "u2": {"age": "53", "gender": "F", "occupation": "other", "zip": "94043"},
        "u3": {"age": "23", "gender": "M", "occupation": "writer", "zip": "32067"},
    },
}

FORMATS = sorted(EXPECTED)


def landing_files(landing_root: str) -> dict[str, bytes]:
    """Every file under the landing root (relative path -> bytes)."""
    root = Path(landing_root)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def read_events(landing_root: str) -> list[tuple[str, dict]]:
    """(ds, event) for every line of every imported landing file, in file order."""
    events = []
    for folder in sorted(Path(landing_root).glob("ds=*")):
        ds = folder.name.removeprefix("ds=")
        with gzip.open(folder / f"{LANDING_FILE_NAME}.json.gz", "rt", encoding="utf-8") as f:
            events.extend((ds, json.loads(line)) for line in f)
    return events


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, list[tuple[str, dict]], str]]:
    """Each fixture format imported once: (summary, events, landing root)."""
    out = {}
    for fmt in FORMATS:
        cfg = make_config(tmp_path_factory.mktemp(fmt))
        summary = import_movielens(cfg, FIXTURE_DIRS[fmt])
        out[fmt] = (summary, read_events(cfg.landing_root), cfg.landing_root)
    return out


def copy_fixture(fmt: str, tmp_path: Path) -> Path:
    target = tmp_path / fmt
    shutil.copytree(FIXTURE_DIRS[fmt], target)
    return target


# --------------------------------------------------------------------------------------------------
# Format detection and the fixed choices.


@pytest.mark.parametrize("fmt", FORMATS)
def test_format_is_detected_from_files(fmt: str) -> None:
    assert detect_format(FIXTURE_DIRS[fmt]).name == fmt


def test_fixed_choices_are_in_the_vocabulary() -> None:
    from gem.sources import movielens_events as job

    assert set(GENRE_SURFACE.values()) | {FALLBACK_SURFACE} <= set(SURFACES)
    assert 5 <= len(set(GENRE_SURFACE.values()) | {FALLBACK_SURFACE}) <= 6
    assert set(ML100K_GENRES) - {"unknown"} == set(GENRE_SURFACE)
    assert job.OBJECTIVE in OBJECTIVES
    assert job.CREATIVE_TYPE in CREATIVE_TYPES
    assert job.CONVERSION_TYPE in CONVERSION_TYPES


# --------------------------------------------------------------------------------------------------
# Conversion rules.


@pytest.mark.parametrize("fmt", FORMATS)
def test_summary_counts_events_per_type_and_days(fmt: str, imported) -> None:
    summary, events, _ = imported[fmt]
    expected = EXPECTED[fmt]
    assert summary["format"] == fmt
    assert summary["ratings"] == expected["ratings"]
    assert summary["events_by_type"] == expected["events_by_type"]
    assert summary["days"] == sorted(expected["per_day"])
    assert len(events) == sum(expected["events_by_type"].values())


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_day_file_holds_the_expected_events(fmt: str, imported) -> None:
    _, events, landing_root = imported[fmt]
    for ds, expected_counts in EXPECTED[fmt]["per_day"].items():
        counts = {t: sum(1 for d, e in events if d == ds and e["event_type"] == t) for t in expected_counts}
        assert counts == expected_counts, ds
        manifest = read_manifest(landing_root, ds)
        assert manifest["producer"] == "import_movielens"
        assert manifest["events_by_type"] == expected_counts
        assert require_partition(landing_root, ds)  # _SUCCESS present and a data file there


@pytest.mark.parametrize("fmt", FORMATS)
def test_partition_day_is_utc_day_of_event_time(fmt: str, imported) -> None:
    _, events, _ = imported[fmt]
    for ds, event in events:
        utc = datetime.fromtimestamp(event["event_time"] / 1000, tz=UTC)
        assert ds == utc.date().isoformat(), event["event_id"]
        assert event["event_time"] % 1000 == 0  # seconds scaled to milliseconds


def test_midnight_boundary_splits_days(imported) -> None:
    """ml-1m rates at 23:59:59 and 00:00:00 UTC: the two land in consecutive days."""
    _, events, _ = imported["ml-1m"]
    day_of = {e["event_id"]: ds for ds, e in events}
    assert day_of["ml-1-4-impression"] == "2000-12-29"  # 978134399 = 2000-12-29T23:59:59Z
    assert day_of["ml-1-5-impression"] == "2000-12-30"  # 978134400 = 2000-12-30T00:00:00Z


@pytest.mark.parametrize("fmt", FORMATS)
def test_lines_carry_exactly_the_landing_columns(fmt: str, imported) -> None:
    _, events, _ = imported[fmt]
    for _, event in events:
        assert list(event) == LANDING_EVENTS.column_names


@pytest.mark.parametrize("fmt", FORMATS)
def test_event_ids_unique_and_events_of_a_rating_share_its_time(fmt: str, imported) -> None:
    _, events, _ = imported[fmt]
    ids = [e["event_id"] for _, e in events]
    assert len(ids) == len(set(ids))
    time_of_rating: dict[str, set[int]] = {}
    for _, e in events:
        rating_key = e["event_id"].rsplit("-", 1)[0]
        assert e["event_id"] == f"{rating_key}-{e['event_type']}"
        time_of_rating.setdefault(rating_key, set()).add(e["event_time"])
    assert all(len(times) == 1 for times in time_of_rating.values())


@pytest.mark.parametrize("fmt", FORMATS)
def test_clicks_and_conversions_follow_their_impression(fmt: str, imported) -> None:
    _, events, _ = imported[fmt]
    ids = {e["event_id"] for _, e in events}
    for _, e in events:
        rating_key = e["event_id"].rsplit("-", 1)[0]
        if e["event_type"] == "click":
            assert f"{rating_key}-impression" in ids
        if e["event_type"] == "conversion":
            assert f"{rating_key}-click" in ids


@pytest.mark.parametrize("fmt", FORMATS)
def test_conversion_fields(fmt: str, imported) -> None:
    _, events, _ = imported[fmt]
    for _, e in events:
        if e["event_type"] == "conversion":
            assert e["conversion_type"] == "offsite_purchase"
            assert e["position"] is None
        else:
            assert e["conversion_type"] is None
            assert e["position"] == 0
        assert (e["objective"], e["creative_type"]) == ("sales", "video")


@pytest.mark.parametrize("fmt", FORMATS)
def test_surface_advertiser_campaign_from_genre_and_year(fmt: str, imported) -> None:
    _, events, _ = imported[fmt]
    seen = {e["ad_id"]: (e["surface"], e["advertiser_id"], e["campaign_id"]) for _, e in events}
    assert seen == EXPECTED_ADS[fmt]


@pytest.mark.parametrize("fmt", FORMATS)
def test_user_demographics_kept_as_strings(fmt: str, imported) -> None:
    _, events, _ = imported[fmt]
    attrs = {e["user_id"]: e["user_attrs"] for _, e in events}
    assert attrs == EXPECTED_USER_ATTRS[fmt]


@pytest.mark.parametrize("fmt", FORMATS)
def test_day_file_ordered_by_time(fmt: str, imported) -> None:
    _, events, _ = imported[fmt]
    for ds in EXPECTED[fmt]["per_day"]:
        times = [e["event_time"] for d, e in events if d == ds]
        assert times == sorted(times)


# --------------------------------------------------------------------------------------------------
# Determinism and streaming.


@pytest.mark.parametrize("fmt", FORMATS)
def test_rerun_is_byte_identical(fmt: str, tmp_path: Path, imported) -> None:
    cfg = make_config(tmp_path)
    import_movielens(cfg, FIXTURE_DIRS[fmt])
    first = landing_files(cfg.landing_root)
    import_movielens(cfg, FIXTURE_DIRS[fmt])
    assert landing_files(cfg.landing_root) == first
    assert first == landing_files(imported[fmt][2])  # and equal to a run into another root


@pytest.mark.parametrize("fmt", FORMATS)
def test_tiny_spool_batches_and_shuffled_source_give_same_bytes(fmt: str, tmp_path: Path, imported) -> None:
    """Flushing the day spool after every rating, on a reversed ratings file, changes no byte."""
    source = copy_fixture(fmt, tmp_path)
    ratings_file = source / detect_format(source).ratings_file
    lines = ratings_file.read_text(encoding="latin-1").splitlines(keepends=True)
    ratings_file.write_text("".join(reversed(lines)), encoding="latin-1")
    cfg = make_config(tmp_path)
    import_movielens(cfg, source, spool_batch=1)
    assert landing_files(cfg.landing_root) == landing_files(imported[fmt][2])


# --------------------------------------------------------------------------------------------------
# Errors.


def test_folder_without_movielens_files_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MovieLensFormatError, match="holds no MovieLens files") as err:
        import_movielens(make_config(tmp_path), tmp_path)
    for name in ("ratings.dat", "movies.dat", "users.dat", "u.data", "u.item", "u.user"):
        assert name in str(err.value)


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(MovieLensFormatError, match="does not exist"):
        import_movielens(make_config(tmp_path), tmp_path / "nowhere")


@pytest.mark.parametrize(("fmt", "removed"), [("ml-1m", "users.dat"), ("ml-100k", "u.item")])
def test_incomplete_folder_names_the_missing_file(fmt: str, removed: str, tmp_path: Path) -> None:
    source = copy_fixture(fmt, tmp_path)
    (source / removed).unlink()
    with pytest.raises(MovieLensFormatError, match=rf"looks like {fmt} but lacks \['{removed}'\]"):
        import_movielens(make_config(tmp_path), source)


@pytest.mark.parametrize(
    ("fmt", "file_name", "bad_line", "problem"),
    [
        ("ml-1m", "ratings.dat", "5::1::4", "expected 4 fields"),
        ("ml-1m", "ratings.dat", "1::2::six::978081300", "rating 'six'"),
        ("ml-1m", "ratings.dat", "1::2::7::978081300", "rating 7 is outside"),
        ("ml-1m", "movies.dat", "7::Broken Movie (1999)", "expected 3 fields"),
        ("ml-100k", "u.data", "1 2 3 874724400", "expected 4 fields"),
        ("ml-100k", "u.item", "8|Short|01-Jan-1995||url|0|1", "expected 24 fields"),
        ("ml-100k", "u.user", "4|30|M|writer", "expected 5 fields"),
    ],
)
def test_malformed_line_names_file_and_line(
    fmt: str, file_name: str, bad_line: str, problem: str, tmp_path: Path
) -> None:
    source = copy_fixture(fmt, tmp_path)
    target = source / file_name
    n_lines = len(target.read_text(encoding="latin-1").splitlines())
    with open(target, "a", encoding="latin-1") as f:
        f.write(bad_line + "\n")
    cfg = make_config(tmp_path)
    with pytest.raises(MovieLensFormatError) as err:
        import_movielens(cfg, source)
    message = str(err.value)
    assert f"{file_name}, line {n_lines + 1}" in message
    assert problem in message
    assert not Path(cfg.landing_root).exists()  # nothing written before the input is known good


def test_rating_of_unknown_movie_names_file_and_line(tmp_path: Path) -> None:
    source = copy_fixture("ml-1m", tmp_path)
    with open(source / "ratings.dat", "a", encoding="latin-1") as f:
        f.write("1::99::4::978081300\n")
    with pytest.raises(MovieLensFormatError, match=r"ratings.dat, line 11: movie 99 is not in movies.dat"):
        import_movielens(make_config(tmp_path), source)


# --------------------------------------------------------------------------------------------------
# CLI.


def test_cli_imports_with_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg_file = tmp_path / "gem.yaml"
    cfg_file.write_text(f"lakehouse_uri: {tmp_path / 'lake'}\n")
    assert main(["--path", str(ML_100K), "--config", str(cfg_file)]) == 0
    lines = capsys.readouterr().out.splitlines()
    # A few lines, whatever the number of days; the full summary in the file the last one names.
    where = tmp_path / "lake" / "_landing" / "_imports" / "movielens.json"
    assert len(lines) == 3 and lines[-1] == f"full summary (every day written): {where}"
    summary = json.loads(where.read_text())
    assert summary["events_by_type"] == EXPECTED["ml-100k"]["events_by_type"]
    assert sorted(summary["days"]) == sorted(EXPECTED["ml-100k"]["per_day"])
    assert lines[0].startswith(f"MovieLens ml-100k: {summary['ratings']:,} ratings -> {len(summary['days'])} landing days")
    impressions = EXPECTED["ml-100k"]["events_by_type"]["impression"]
    assert f"impression {impressions:,}" in lines[1]
    for ds in EXPECTED["ml-100k"]["per_day"]:
        assert (tmp_path / "lake" / "_landing" / f"ds={ds}" / SUCCESS_MARKER).is_file()


def test_cli_error_is_one_line_and_nonzero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg_file = tmp_path / "gem.yaml"
    cfg_file.write_text(f"lakehouse_uri: {tmp_path / 'lake'}\n")
    assert main(["--path", str(tmp_path), "--config", str(cfg_file)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("import_movielens: ") and "holds no MovieLens files" in err
