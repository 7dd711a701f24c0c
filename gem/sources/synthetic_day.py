"""One synthetic day end to end: `generate_day(cfg, ds)` simulates day D of the seed's world chunk by
chunk, writes its landing files by arrival day, saves the day's engagement state and marks ds
complete (`_SUCCESS` holding the run's manifest) last. Only ds=D is marked: later arrival days are
completed by their own generator day. The manifest also holds the day's Bayes floor per task
(gem.sources.bayes_floor): the NE of the world's true probabilities on its impressions. Rerunning
a ds writes byte-identical files, sidecars, marker and state.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import numpy as np

from gem.config import GemConfig
from gem.lakehouse.landing import clear_partition_complete, mark_partition_complete
from gem.sources.bayes_floor import FloorAccumulator
from gem.sources.engagement import EngagementState, save_state, world_fingerprint
from gem.sources.landing_output import ArrivalFiles, conversion_lines, line_head, positioned_lines
from gem.sources.simulation import ChunkEvents, day_start_ms, simulate_day, state_before
from gem.sources.world import ARRIVAL_DAYS, DAY_MS, DIRTY_STREAM, PRODUCER, World, build_world

# ==================================================================================================
# The day.


def _write_chunk(
    files: ArrivalFiles, world: World, ymd: str, chunk: ChunkEvents, day_start_ms: int, rng: np.random.Generator
) -> int:
    """Route a chunk's impressions, clicks and conversions to their arrival-day files; lines written."""
    click_offset = (chunk.click_time - day_start_ms) // DAY_MS  # (clicks,) 0 or 1
    conversion_offset = (chunk.conversion_time - day_start_ms) // DAY_MS  # (conversions,) 0..7
    click_impression_rows = np.flatnonzero(chunk.clicked)  # (clicks,)
    impression_head, click_head = line_head(ymd, "impression", ""), line_head(ymd, "click", "-c")
    written = 0
    for offset in range(ARRIVAL_DAYS):
        clicks = np.flatnonzero(click_offset == offset)
        impressions = np.arange(len(chunk.impression_time)) if offset == 0 else np.arange(0)
        lines_by_type = {
            "impression": positioned_lines(
                world, impression_head, impressions, chunk.impression_time[impressions], chunk
            ),
            "click": positioned_lines(
                world, click_head, click_impression_rows[clicks], chunk.click_time[clicks], chunk
            ),
            "conversion": conversion_lines(world, ymd, chunk, np.flatnonzero(conversion_offset == offset)),
        }
        written += files.write(offset, lines_by_type, rng)
    return written


def _simulate_day(cfg: GemConfig, ds: str, world: World, state: EngagementState, files: ArrivalFiles,
                  floor: FloorAccumulator) -> dict[str, int]:
    """Simulate day `ds` chunk by chunk (gem.sources.simulation.simulate_day) into `files`, adding
    each chunk's true probabilities to `floor`; event totals."""
    ymd = dt.date.fromisoformat(ds).strftime("%Y%m%d")
    dirty_rng = np.random.default_rng([cfg.generator.seed, DIRTY_STREAM, int(ymd)])
    start_ms = day_start_ms(ds)
    totals = {"impression": 0, "click": 0, "conversion": 0}
    for chunk in simulate_day(cfg, world, state, ds, start_ms + ARRIVAL_DAYS * DAY_MS):
        _write_chunk(files, world, ymd, chunk, start_ms, dirty_rng)
        floor.add_chunk(world, chunk)
        totals["impression"] += len(chunk.user)
        totals["click"] += len(chunk.click_time)
        totals["conversion"] += len(chunk.conversion_time)
    return totals


def generate_day(cfg: GemConfig, ds: str) -> dict[str, Any]:
    """Simulate day `ds`, write its landing files and state, mark ds complete; the run's manifest.

    Order: landing files (each with its sidecar), then the day's state, then ds's `_SUCCESS` last,
    so a reader that sees the marker sees everything; a failed run leaves no marker and no state.
    """
    g = cfg.generator
    world = build_world(cfg)
    state = state_before(cfg, ds, world)
    clear_partition_complete(cfg.landing_root, ds)
    files = ArrivalFiles(cfg, ds)
    # Labels close attribution_window_days after the impression day (schemas/examples.py).
    floor = FloorAccumulator(window_end_ms=day_start_ms(ds) + (1 + cfg.attribution_window_days) * DAY_MS)
    try:
        totals = _simulate_day(cfg, ds, world, state, files, floor)
        file_manifests = files.commit()
    except BaseException:
        files.abort()
        raise

    save_state(cfg, ds, state)
    manifest = {
        "producer": PRODUCER,
        "ds": ds,
        "seed": g.seed,
        "world": json.loads(world_fingerprint(cfg)),
        "events": totals,
        "bayes_floor": floor.result(),  # per task: the NE of the world's true probabilities on ds's impressions
        "lines": sum(m["lines"] for m in file_manifests.values()),
        "dirty": sum(sum(m["dirty"].values()) for m in file_manifests.values()),
        "files": file_manifests,
        "state": f"_generator/state/ds={ds}.npz",
    }
    mark_partition_complete(cfg.landing_root, ds, manifest)
    return manifest
