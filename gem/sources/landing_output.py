"""Landing output: a day's events as gzip JSON lines, one file per arrival day.

`{landing_root}/ds=X/events-from-D.json.gz` for X in D..D+7, X the UTC date of each event's
`event_time` (late clicks and conversions land in later partitions, as late data does). A sidecar
`events-from-D.manifest.json` beside each file records its exact clean and dirty counts;
`expected_landing_counts` sums them per arrival day.

Event ids: impression n of day D is `e{YYYYMMDD}-{n:012d}`; its click is that id + "-c" and the
click's conversion that id + "-v"; a dirty copy appends "-d{k}" (except duplicate_event_id lines,
which repeat a clean line verbatim).
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import numpy as np

from gem import storage
from gem.config import GemConfig
from gem.lakehouse.landing import METADATA_FILE_PATTERN, LandingFile, partition_dir, write_manifest_file
from gem.sources.dirty import DirtyPlanter
from gem.sources.simulation import ChunkEvents
from gem.sources.world import ARRIVAL_DAYS, MAX_POSITION, World
from schemas.events import DIRTY_KIND_REASON

# ==================================================================================================
# Serialization: one f-string per event over pre-rendered fragments (LANDING_EVENTS column order).


def line_head(ymd: str, event_type: str, id_suffix: str) -> str:
    """'%'-template of a line's first three columns; fill with (impression number, event_time ms)."""
    return f'{{"event_id":"e{ymd}-%012d{id_suffix}","event_type":"{event_type}","event_time":%d,'


def positioned_lines(
    world: World, head: str, impression_rows: np.ndarray, event_time: np.ndarray, chunk: ChunkEvents
) -> list[str]:
    """JSON lines of impressions or clicks: the chunk's impressions at `impression_rows`, at `event_time`."""
    frags = world.fragments
    user, ad = chunk.user[impression_rows], chunk.ad[impression_rows]
    slot = chunk.surface[impression_rows] * (MAX_POSITION + 1) + chunk.position[impression_rows]  # (n,)
    return [
        f"{head % (i, t)}{user_id}{ad_fields}{surface_position}{user_attrs}"
        for i, t, user_id, ad_fields, surface_position, user_attrs in zip(
            chunk.impression_index[impression_rows].tolist(),
            event_time.tolist(),
            frags.user_id[user].tolist(),
            frags.ad_fields[ad].tolist(),
            frags.surface_position[slot].tolist(),
            frags.user_attrs[user].tolist(),
        )
    ]


def conversion_lines(world: World, ymd: str, chunk: ChunkEvents, conversion_rows: np.ndarray) -> list[str]:
    """JSON lines of the conversions at `conversion_rows`; position null, conversion_type set."""
    frags = world.fragments
    head = line_head(ymd, "conversion", "-v")
    impression_rows = np.flatnonzero(chunk.clicked)[np.flatnonzero(chunk.converted)[conversion_rows]]
    user, ad = chunk.user[impression_rows], chunk.ad[impression_rows]
    return [
        f"{head % (i, t)}{user_id}{ad_fields}{surface}{conversion_tail}{user_attrs}"
        for i, t, user_id, ad_fields, surface, conversion_tail, user_attrs in zip(
            chunk.impression_index[impression_rows].tolist(),
            chunk.conversion_time[conversion_rows].tolist(),
            frags.user_id[user].tolist(),
            frags.ad_fields[ad].tolist(),
            frags.surface[chunk.surface[impression_rows]].tolist(),
            frags.conversion_tail[ad].tolist(),
            frags.user_attrs[user].tolist(),
        )
    ]


# ==================================================================================================
# Landing output: one file (+ sidecar manifest) per arrival day.


def landing_file_name(source_ds: str) -> str:
    """Base name of the landing file generator day `source_ds` writes into each arrival day."""
    return f"events-from-{source_ds}"


def sidecar_path(landing_root: str, arrival_ds: str, source_ds: str) -> str:
    """The URI of the sidecar manifest beside generator day `source_ds`'s file in `arrival_ds`."""
    return storage.join(partition_dir(landing_root, arrival_ds), f"{landing_file_name(source_ds)}.manifest.json")


class ArrivalFiles:
    """The open landing files of one generator day, keyed by arrival-day offset 0..7."""

    def __init__(self, cfg: GemConfig, source_ds: str):
        self.landing_root = cfg.landing_root
        self.source_ds = source_ds
        start = dt.date.fromisoformat(source_ds)
        self.arrival_days = [(start + dt.timedelta(days=k)).isoformat() for k in range(ARRIVAL_DAYS)]
        self.files: list[LandingFile] = []
        self.planters = [DirtyPlanter(cfg.generator.dirty_fraction, day) for day in self.arrival_days]
        self.clean_by_type = [{"impression": 0, "click": 0, "conversion": 0} for _ in self.arrival_days]
        try:
            for day in self.arrival_days:
                self.files.append(LandingFile(self.landing_root, day, landing_file_name(source_ds)))
        except BaseException:
            self.abort()
            raise

    def write(self, offset: int, lines_by_type: dict[str, list[str]], rng: np.random.Generator) -> int:
        """Write one chunk's clean lines for arrival day `offset`, then its dirty lines; lines written."""
        clean = list(itertools.chain.from_iterable(lines_by_type.values()))
        for event_type, lines in lines_by_type.items():
            self.clean_by_type[offset][event_type] += len(lines)
        dirty = self.planters[offset].plant(clean, rng)
        for block in (clean, dirty):
            if block:
                self.files[offset].write_text("\n".join(block) + "\n", len(block))
        return len(clean) + len(dirty)

    def file_manifest(self, offset: int) -> dict[str, Any]:
        planter = self.planters[offset]
        return {
            "source_ds": self.source_ds,
            "arrival_ds": self.arrival_days[offset],
            "file": self.files[offset].file_name,
            "lines": planter.clean + planter.dirty,
            "clean": planter.clean,
            "clean_by_event_type": dict(self.clean_by_type[offset]),
            "dirty": dict(planter.counts),
        }

    def commit(self) -> dict[str, dict[str, Any]]:
        """Write every sidecar, then publish every data file; the per-arrival-day manifests."""
        manifests = {}
        for offset, landing_file in enumerate(self.files):
            arrival_ds = self.arrival_days[offset]
            manifests[arrival_ds] = self.file_manifest(offset)
            write_manifest_file(sidecar_path(self.landing_root, arrival_ds, self.source_ds), manifests[arrival_ds])
            landing_file.close(commit=True)
        return manifests

    def abort(self) -> None:
        for landing_file in self.files:
            landing_file.close(commit=False)


def expected_landing_counts(landing_root: str, ds: str) -> dict[str, Any]:
    """What ingest of arrival day `ds` must produce, from the generators' sidecars in that folder.

    Returns {"clean": rows bronze must receive, "quarantine": {reason: count}}, reasons mapped
    from dirty kinds via DIRTY_KIND_REASON; reasons with no lines are left out.
    """
    clean = 0
    quarantine: dict[str, int] = {}
    for sidecar in storage.glob(storage.join(partition_dir(landing_root, ds), METADATA_FILE_PATTERN)):
        manifest = storage.read_json(sidecar)
        clean += manifest["clean"]
        for kind, count in manifest["dirty"].items():
            if count:
                reason = DIRTY_KIND_REASON[kind]
                quarantine[reason] = quarantine.get(reason, 0) + count
    return {"clean": clean, "quarantine": dict(sorted(quarantine.items()))}
