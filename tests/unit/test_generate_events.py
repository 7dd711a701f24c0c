"""jobs.generate_events: determinism, day-over-day state, arrival-day routing, behaviour, dirty rows.

Every test runs the real generator into a tmp lakehouse with small sizes and reads the gzip JSON
lines back itself (independently of the generator's own bookkeeping).
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gem.config import GemConfig
from gem.lakehouse.landing import MissingLandingPartition, partition_dir, read_manifest, require_partition
from gem.sources.engagement import IncompatibleGeneratorState, MissingGeneratorState, load_state
from gem.sources.landing_output import expected_landing_counts, sidecar_path
from gem.sources.synthetic_day import generate_day
from gem.sources.world import ARRIVAL_DAYS, OBJECTIVE_CONVERSION_TYPE, build_world
from schemas.events import DIRTY_KIND_REASON, ID_COLUMNS, LANDING_EVENTS
from schemas.tasks import CONVERSION_TYPES, CREATIVE_TYPES, EVENT_TYPES, OBJECTIVES, SURFACES
from tests.support import PYTHON, REPO, make_config, subprocess_env

DAY1, DAY2, DAY3 = "2026-01-01", "2026-01-02", "2026-01-03"
DAY_MS = 86_400_000
COLUMNS = LANDING_EVENTS.column_names


# --------------------------------------------------------------------------------------------------
# Reading the landing zone back.


def _shift(ds: str, days: int) -> str:
    return (dt.date.fromisoformat(ds) + dt.timedelta(days=days)).isoformat()


def _day_start_ms(ds: str) -> int:
    return (dt.date.fromisoformat(ds) - dt.date(1970, 1, 1)).days * DAY_MS


def _raw_lines(cfg: GemConfig, arrival_ds: str, source_ds: str) -> list[str]:
    path = Path(partition_dir(cfg.landing_root, arrival_ds)) / f"events-from-{source_ds}.json.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def _clean_events(cfg: GemConfig, source_ds: str) -> pd.DataFrame:
    """Every clean event generator day `source_ds` wrote, with its arrival day (cfg must have no dirt)."""
    records, arrival_days = [], []
    for offset in range(ARRIVAL_DAYS):
        arrival = _shift(source_ds, offset)
        lines = _raw_lines(cfg, arrival, source_ds)
        records += [json.loads(line) for line in lines]
        arrival_days += [arrival] * len(lines)
    return pd.DataFrame(records, columns=COLUMNS).assign(arrival_ds=arrival_days)


def _impressions_with_clicks(events: pd.DataFrame) -> pd.DataFrame:
    """Impressions with a boolean `clicked` (a click's id is its impression's id + '-c')."""
    impressions = events[events.event_type == "impression"].copy()
    clicked_ids = set(events.loc[events.event_type == "click", "event_id"].str.removesuffix("-c"))
    impressions["clicked"] = impressions.event_id.isin(clicked_ids)
    return impressions


def _snapshot(cfg: GemConfig) -> dict[str, bytes]:
    """Every file under the lakehouse (landing, sidecars, markers, state), by relative path."""
    root = Path(cfg.lakehouse_uri)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------------------------------
# An independent checker of landing lines, following ingest's rule order.


def _defects(line: str, arrival_ds: str, far_future_days: int) -> list[str]:
    """Every dirty kind this line shows (not just the first), so 'exactly one defect' is checkable.

    Duplicates are file-level and checked separately.
    """
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return ["malformed_json"]
    assert list(event) == COLUMNS, f"columns differ from LANDING_EVENTS: {line}"
    found = []
    time_ok = isinstance(event["event_time"], int) and not isinstance(event["event_time"], bool)
    position_ok = event["position"] is None or isinstance(event["position"], int)
    if not (time_ok and position_ok):
        found.append("wrong_type")
    found += ["null_id" for c in ID_COLUMNS if event[c] is None]
    found += ["empty_id" for c in ID_COLUMNS if event[c] == ""]
    if event["surface"] not in SURFACES:
        found.append("unknown_surface")
    assert event["event_type"] in EVENT_TYPES and event["objective"] in OBJECTIVES, line
    assert event["creative_type"] in CREATIVE_TYPES, line
    assert (event["event_type"] == "conversion") == (event["conversion_type"] in CONVERSION_TYPES), line
    assert (event["event_type"] == "conversion") == (event["position"] is None), line
    assert event["position"] is None or not position_ok or event["position"] >= 0, line
    if time_ok:
        arrival_end = _day_start_ms(arrival_ds) + DAY_MS
        if event["event_time"] < 0:
            found.append("negative_timestamp")
        elif event["event_time"] >= arrival_end + far_future_days * DAY_MS:
            found.append("far_future_timestamp")
        elif event["event_time"] >= arrival_end:
            found.append("event_after_arrival")
        else:
            assert event["event_time"] >= _day_start_ms(arrival_ds), f"clean event before its arrival day: {line}"
    return found


def _count_file_kinds(lines: list[str], arrival_ds: str, far_future_days: int) -> tuple[int, dict[str, int]]:
    """(clean lines, {dirty kind: lines}) of one landing file, each line checked for <= 1 defect."""
    counts = dict.fromkeys(DIRTY_KIND_REASON, 0)
    seen: dict[str, str] = {}
    clean = 0
    for line in lines:
        found = _defects(line, arrival_ds, far_future_days)
        event_id = json.loads(line)["event_id"] if not found or found[0] != "malformed_json" else None
        if event_id and event_id in seen:
            assert seen[event_id] == line, "a duplicate_event_id line must be an exact copy"
            found.append("duplicate_event_id")
        elif event_id:
            seen[event_id] = line
        assert len(found) <= 1, f"{found} in one line: {line}"
        if found:
            counts[found[0]] += 1
        else:
            clean += 1
    return clean, counts


# --------------------------------------------------------------------------------------------------
# Determinism and reruns.


def test_same_seed_writes_byte_identical_files_in_separate_folders(tmp_path: Path) -> None:
    cfg_a, cfg_b = make_config(tmp_path / "a"), make_config(tmp_path / "b")
    generate_day(cfg_a, DAY1)
    generate_day(cfg_b, DAY1)
    snapshot_a = _snapshot(cfg_a)
    assert snapshot_a == _snapshot(cfg_b)
    assert f"_generator/state/ds={DAY1}.npz" in snapshot_a
    assert sum(name.endswith(".json.gz") for name in snapshot_a) == ARRIVAL_DAYS

    cfg_other_seed = make_config(tmp_path / "c", generator={"seed": 8})
    generate_day(cfg_other_seed, DAY1)
    assert _snapshot(cfg_other_seed) != snapshot_a


def test_rerun_of_a_day_is_idempotent(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    generate_day(cfg, DAY1)
    first_manifest = generate_day(cfg, DAY2)
    before = _snapshot(cfg)
    assert generate_day(cfg, DAY2) == first_manifest
    assert _snapshot(cfg) == before
    assert not [name for name in before if ".tmp" in name]


def test_only_the_generated_day_is_marked_complete(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    manifest = generate_day(cfg, DAY1)
    assert read_manifest(cfg.landing_root, DAY1) == manifest
    assert require_partition(cfg.landing_root, DAY1)
    with pytest.raises(MissingLandingPartition, match="incomplete"):
        require_partition(cfg.landing_root, DAY2)
    assert sorted(manifest["files"]) == [_shift(DAY1, k) for k in range(ARRIVAL_DAYS)]


# --------------------------------------------------------------------------------------------------
# Day-over-day state.


def test_day_fails_clearly_when_previous_state_is_missing_but_earlier_exists(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    generate_day(cfg, DAY1)
    with pytest.raises(MissingGeneratorState, match=rf"ds={DAY2}\.npz"):
        generate_day(cfg, DAY3)
    assert not (Path(partition_dir(cfg.landing_root, DAY3)) / "_SUCCESS").exists()


def test_next_day_continues_from_the_previous_days_state(tmp_path: Path) -> None:
    continued = make_config(tmp_path / "continued")
    generate_day(continued, DAY1)
    generate_day(continued, DAY2)
    fresh = make_config(tmp_path / "fresh")  # no earlier state at all: DAY2 starts fresh
    generate_day(fresh, DAY2)

    day1 = load_state(continued, DAY1)
    assert day1.clicked_weight.sum() > 0
    continued_day2, fresh_day2 = load_state(continued, DAY2), load_state(fresh, DAY2)
    assert not np.allclose(continued_day2.clicked_sum, fresh_day2.clicked_sum)
    # Two generator days both feed arrival day DAY2; the expected counts add both sidecars.
    expected = expected_landing_counts(continued.landing_root, DAY2)
    sidecars = [
        json.loads(Path(sidecar_path(continued.landing_root, DAY2, source)).read_text()) for source in (DAY1, DAY2)
    ]
    assert expected["clean"] == sum(s["clean"] for s in sidecars)


def test_state_from_another_world_is_rejected(tmp_path: Path) -> None:
    generate_day(make_config(tmp_path), DAY1)
    bigger_world = make_config(tmp_path, generator={"users": 600})
    with pytest.raises(IncompatibleGeneratorState, match="users"):
        generate_day(bigger_world, DAY2)


# --------------------------------------------------------------------------------------------------
# Arrival-day routing of clicks and conversions.


def test_conversions_follow_their_click_and_arrive_in_later_partitions(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, generator={"events_per_day": 60_000, "chunk_impressions": 7_000, "dirty_fraction": 0.0})
    generate_day(cfg, DAY1)
    events = _clean_events(cfg, DAY1)
    event_day = pd.to_datetime(events.event_time, unit="ms", utc=True).dt.strftime("%Y-%m-%d")
    assert (event_day == events.arrival_ds).all(), "every event lands in the partition of its UTC event date"
    assert events.event_id.is_unique

    clicks = events[events.event_type == "click"].set_index("event_id")
    conversions = events[events.event_type == "conversion"]
    assert len(conversions) > 50
    click_of = clicks.loc[conversions.event_id.str.removesuffix("-v") + "-c"]
    delay = conversions.event_time.to_numpy() - click_of.event_time.to_numpy()
    assert (delay >= 0).all() and (delay < 7 * DAY_MS).all()
    same = ["user_id", "ad_id", "advertiser_id", "campaign_id", "objective", "creative_type", "surface"]
    assert (conversions[same].to_numpy() == click_of[same].to_numpy()).all()
    assert conversions.position.isna().all() and conversions.conversion_type.notna().all()
    expected_type = conversions.objective.map(OBJECTIVE_CONVERSION_TYPE)
    assert (conversions.conversion_type == expected_type).all()
    assert events.loc[events.event_type != "conversion", "conversion_type"].isna().all()

    later = conversions[conversions.arrival_ds > DAY1]
    assert len(later) > 0.3 * len(conversions), "most late conversions must land after the click's day"
    assert later.arrival_ds.nunique() >= 4
    impressions = events[events.event_type == "impression"]
    assert (impressions.arrival_ds == DAY1).all()
    clicks_per_impression = len(clicks) / len(impressions)
    assert 0.01 < clicks_per_impression < 0.08
    assert 0.02 < len(conversions) / len(clicks) < 0.20


# --------------------------------------------------------------------------------------------------
# Click behaviour: surfaces, positions, sequences.


@pytest.fixture(scope="module")
def big_day(tmp_path_factory: pytest.TempPathFactory) -> tuple[GemConfig, pd.DataFrame]:
    """One larger day (200k impressions) for the statistical tests."""
    cfg = make_config(
        tmp_path_factory.mktemp("big"),
        generator={
            "users": 2_000,
            "ads": 300,
            "events_per_day": 200_000,
            "chunk_impressions": 50_000,
            "dirty_fraction": 0.0,
        },
    )
    generate_day(cfg, DAY1)
    return cfg, _impressions_with_clicks(_clean_events(cfg, DAY1))


def test_surfaces_have_clearly_different_click_rates(big_day: tuple[GemConfig, pd.DataFrame]) -> None:
    cfg, impressions = big_day
    ctr = impressions.groupby("surface").clicked.mean()
    base = pd.Series({s: cfg.generator.surface_params[s].base_ctr for s in cfg.surfaces})
    rank_correlation = np.corrcoef(ctr[base.index].rank(), base.rank())[0, 1]
    assert rank_correlation > 0.9, f"surface CTRs {ctr.round(4).to_dict()} do not follow base CTRs"
    assert ctr["marketplace"] > 2.5 * ctr["audience_network"]
    assert 0.01 < impressions.clicked.mean() < 0.06


def test_click_rate_falls_with_position(big_day: tuple[GemConfig, pd.DataFrame]) -> None:
    _, impressions = big_day
    bucket = pd.cut(impressions.position, [-1, 0, 2, 100], labels=["0", "1-2", "3+"])
    ctr = impressions.groupby(bucket, observed=True).clicked.mean()
    assert ctr["0"] > ctr["1-2"] > ctr["3+"]

    # Stories (decay 0.20) lose more of their clicks to low positions than reels (decay 0.05).
    def deep_over_top(surface: str) -> float:
        rows = impressions[impressions.surface == surface]
        return rows[rows.position >= 2].clicked.mean() / rows[rows.position == 0].clicked.mean()

    assert deep_over_top("stories") < deep_over_top("reels") - 0.2


def _alignment_lift(tmp_path: Path, history_weight: float) -> float:
    """CTR of the quarter of day-2 impressions whose ad best matches the user's day-1 clicks, over the worst quarter.

    One chunk per day, so day 2's recent-engagement vectors are exactly the saved day-1 state.
    """
    cfg = make_config(
        tmp_path,
        generator={
            "users": 1_000,
            "ads": 200,
            "events_per_day": 100_000,
            "chunk_impressions": 100_000,
            "min_chunks_per_day": 1,
            "history_weight": history_weight,
            "dirty_fraction": 0.0,
        },
    )
    generate_day(cfg, DAY1)
    generate_day(cfg, DAY2)
    world = build_world(cfg)
    history = load_state(cfg, DAY1).recent_clicks()  # (users, dim)
    lines = _raw_lines(cfg, DAY2, DAY2)
    events = pd.DataFrame([json.loads(line) for line in lines], columns=COLUMNS)
    impressions = _impressions_with_clicks(events)
    user = impressions.user_id.str[1:].astype(int).to_numpy()
    ad = impressions.ad_id.str[1:].astype(int).to_numpy()
    alignment = np.einsum("nd,nd->n", history[user], world.ad_latent[ad])  # (impressions,)
    quartile = pd.qcut(alignment, 4, labels=False)
    ctr = impressions.clicked.groupby(quartile).mean()
    return float(ctr.iloc[-1] / ctr.iloc[0])


def test_recent_clicks_carry_signal_for_the_next_clicks(tmp_path: Path) -> None:
    with_history = _alignment_lift(tmp_path / "with", history_weight=1.5)
    # Without the history term, alignment still helps a little (it echoes the user's interests);
    # the history term must add clearly more.
    without_history = _alignment_lift(tmp_path / "without", history_weight=0.0)
    assert with_history > 2.0
    assert with_history > 1.4 * without_history


# --------------------------------------------------------------------------------------------------
# Dirty rows and manifests.


def test_every_dirty_kind_is_planted_and_counted_exactly(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, generator={"dirty_fraction": 0.05})
    manifest = generate_day(cfg, DAY1)
    total_dirty = dict.fromkeys(DIRTY_KIND_REASON, 0)
    for offset in range(ARRIVAL_DAYS):
        arrival = _shift(DAY1, offset)
        clean, counts = _count_file_kinds(_raw_lines(cfg, arrival, DAY1), arrival, cfg.ingest.far_future_days)
        sidecar = json.loads(Path(sidecar_path(cfg.landing_root, arrival, DAY1)).read_text())
        assert (sidecar["clean"], sidecar["dirty"]) == (clean, counts)
        assert manifest["files"][arrival] == sidecar
        assert sidecar["clean"] == sum(sidecar["clean_by_event_type"].values())
        assert sum(counts.values()) == int(cfg.generator.dirty_fraction * clean)
        total_dirty = {k: total_dirty[k] + counts[k] for k in counts}
    assert all(total_dirty.values()), f"some dirty kinds never planted: {total_dirty}"

    expected = expected_landing_counts(cfg.landing_root, DAY1)
    day1 = manifest["files"][DAY1]
    assert expected["clean"] == day1["clean"]
    by_reason: dict[str, int] = {}
    for kind, count in day1["dirty"].items():
        by_reason[DIRTY_KIND_REASON[kind]] = by_reason.get(DIRTY_KIND_REASON[kind], 0) + count
    assert expected["quarantine"] == by_reason
    assert expected["quarantine"]["missing_id"] == day1["dirty"]["null_id"] + day1["dirty"]["empty_id"]


def test_dirty_copies_get_fresh_unique_ids(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, generator={"dirty_fraction": 0.05})
    generate_day(cfg, DAY1)
    ids = []
    for line in _raw_lines(cfg, DAY1, DAY1):
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        ids.append(event["event_id"])
    dirty_ids = [i for i in ids if isinstance(i, str) and "-d" in i]
    assert dirty_ids and len(set(dirty_ids)) == len(dirty_ids)
    duplicated = pd.Series(ids).dropna().value_counts()
    assert not [i for i in duplicated[duplicated > 1].index if "-d" in i], "only clean ids are duplicated"


# --------------------------------------------------------------------------------------------------
# CLI.


def test_cli_applies_flag_overrides_and_prints_a_summary(tmp_path: Path) -> None:
    config_file = tmp_path / "gem.yaml"
    config_file.write_text(json.dumps({"lakehouse_uri": str(tmp_path / "lake"), "generator": {"ads": 50}}))
    command = [PYTHON, "-m", "jobs.generate_events", "--ds", DAY1, "--users", "300", "--events", "3000"]
    command += ["--seed", "11", "--config", str(config_file)]
    result = subprocess.run(
        command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "events/s" in result.stdout
    manifest: dict[str, Any] = read_manifest(str(tmp_path / "lake" / "_landing"), DAY1)
    assert manifest["events"]["impression"] == 3000
    assert manifest["world"]["users"] == 300 and manifest["world"]["ads"] == 50 and manifest["seed"] == 11


def test_landing_source_generates_nothing_and_exits_99(tmp_path: Path) -> None:
    """Under `source: landing` the landing files come from elsewhere: the generator's task skips
    (exit 99) and writes nothing, not even a `_SUCCESS` marker the DAG's sensor would take for data."""
    from jobs.generate_events import main

    config_file = tmp_path / "gem.yaml"
    config_file.write_text(json.dumps({"lakehouse_uri": str(tmp_path / "lake"), "source": "landing"}))
    assert main(["--ds", DAY1, "--config", str(config_file)]) == 99
    assert not (tmp_path / "lake").exists()


def test_the_first_day_starts_from_burned_in_users(tmp_path):
    """With no earlier state the start day begins from users carried through generator.burn_in_days
    simulated days: their click memory is at the level a simulated day leaves it at, not at zero."""
    from gem.sources.simulation import state_before

    cfg = make_config(tmp_path)
    world = build_world(cfg)
    burned = state_before(cfg, DAY1, world)
    generate_day(cfg, DAY1)
    after_day1 = load_state(cfg, DAY1)
    fresh = state_before(make_config(tmp_path / "none", generator={"burn_in_days": 0}), DAY1, world)
    assert cfg.generator.burn_in_days > 0 and fresh.clicked_weight.sum() == 0
    level = after_day1.clicked_weight.mean()
    assert abs(burned.clicked_weight.mean() - level) < 0.25 * level, (burned.clicked_weight.mean(), level)
    assert abs(burned.impressed_weight.mean() - after_day1.impressed_weight.mean()) < 0.25 * after_day1.impressed_weight.mean()
