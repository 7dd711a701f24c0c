"""One run at a time per (stage, day): a lease file taken before a run withdraws its record.

Two runs of one (stage, ds) writing at once would each commit and publish; the table ends as one
run's contents, but the record left standing could name the commit of the run that wrote first,
whose files the other run's commit has since replaced, and a reader checking the partition's files
against that version would refuse it. The lease makes the second run fail at once, with the
holder's run id, and succeed on retry.

The lease is a file `{lakehouse}/_ops/leases/{stage}/ds={ds}.json`, created with O_EXCL (atomic on
a POSIX filesystem, where the lakehouse folder lives), holding the run id, host, pid and start
time; the run's publish removes it. A lease whose holder is gone is taken over: on the same host
when its pid no longer runs (or is this very process: a retry after an exception), on another host
once it is older than LEASE_EXPIRY_S.

`acquire_path` is the same lease on any file; with `renewed=True` its holder renews it
(`Lease.renew`, the file's mtime) while it works, and a lease not renewed for `expiry_s` is taken
over on any host: how precompute workers claim shards (gem.precompute.shards), so a killed worker's
shard passes to another within seconds.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from gem.config import GemConfig

LEASE_EXPIRY_S = 6 * 3600  # a holder on another host is presumed dead after this long


class LeaseHeldError(RuntimeError):
    """Another run of the same (stage, ds) is in progress; retry once it has finished."""


@dataclass(frozen=True)
class Lease:
    path: Path
    run_id: str

    def renew(self) -> bool:
        """Mark the holder alive (the file's mtime is its heartbeat); False if it is no longer held."""
        try:
            if json.loads(self.path.read_text())["run_id"] != self.run_id:
                return False
            os.utime(self.path)
            return True
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            return False

    def release(self) -> None:
        """Remove the lease if this run still holds it."""
        try:
            if json.loads(self.path.read_text())["run_id"] == self.run_id:
                self.path.unlink()
        except (FileNotFoundError, json.JSONDecodeError, KeyError):
            pass


def lease_path(cfg: GemConfig, stage: str, ds: str) -> Path:
    return Path(cfg.lakehouse_uri) / "_ops" / "leases" / stage / f"ds={ds}.json"


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def _holder_gone(holder: dict, path: Path, expiry_s: float, renewed: bool, taking: bool = True) -> bool:
    """taking: judged by a process about to take the lease, for which a lease held by itself is one
    left over from an earlier try (a reader leaves it alone)."""
    if holder.get("host") == socket.gethostname():
        pid = int(holder.get("pid", -1))
        if (taking and pid == os.getpid()) or not _pid_running(pid):
            return True
        if not renewed:
            return False
    if renewed:  # age since the last heartbeat (a killed holder stops renewing, even as a zombie)
        try:
            return dt.datetime.now().timestamp() - path.stat().st_mtime > expiry_s
        except FileNotFoundError:
            return True
    started = dt.datetime.fromisoformat(holder["started_at"])
    return (dt.datetime.now(dt.UTC) - started).total_seconds() > expiry_s


# What `_read_holder` returns for a lease file being written this instant (or whose writer was
# killed mid-write less than WRITING_GRACE_S ago): taken, by a holder not yet known.
BEING_WRITTEN = {"run_id": "?", "host": "?", "pid": "?", "started_at": "?"}
WRITING_GRACE_S = 60


def _read_holder(path: Path) -> dict | None:
    """The lease file's holder; BEING_WRITTEN while it is being written; {} for a file left half
    written long ago (its writer is gone); None when there is no file."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        try:
            fresh = dt.datetime.now().timestamp() - path.stat().st_mtime < WRITING_GRACE_S
        except FileNotFoundError:
            return None
        return BEING_WRITTEN if fresh else {}


def live_holder(path: Path, expiry_s: float = LEASE_EXPIRY_S, renewed: bool = False) -> dict | None:
    """The holder of the lease file `path` when it is alive (as `acquire_path` judges it: a lease
    being written counts as alive), else None; for readers that wait on a lease without taking it."""
    holder = _read_holder(path)
    if holder is BEING_WRITTEN:
        return holder
    return holder if holder and not _holder_gone(holder, path, expiry_s, renewed, taking=False) else None


def acquire(cfg: GemConfig, stage: str, ds: str, run_id: str) -> Lease:
    """Take the lease of (stage, ds) for `run_id`; LeaseHeldError naming the holder if a live run
    holds it."""
    return acquire_path(lease_path(cfg, stage, ds), run_id, f"{stage} ds={ds}")


def acquire_path(path: Path, run_id: str, what: str, expiry_s: float = LEASE_EXPIRY_S,
                 renewed: bool = False) -> Lease:
    """Take the lease file `path` for `run_id` (`what` names it in errors); LeaseHeldError naming
    the holder if a live holder has it. renewed: the holder heartbeats (Lease.renew) and is presumed
    dead `expiry_s` after its last one, on any host."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
                       "started_at": dt.datetime.now(dt.UTC).isoformat()})
    for _ in range(3):  # a stale lease is removed and the creation tried again
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read_holder(path)
            if holder is None:
                continue  # released meanwhile
            if holder is BEING_WRITTEN:
                raise LeaseHeldError(f"{what}: another run is taking the lease {path}; retry")
            if holder and not _holder_gone(holder, path, expiry_s, renewed):
                raise LeaseHeldError(
                    f"{what} is being run by {holder['run_id']} (host {holder['host']}, pid "
                    f"{holder['pid']}, since {holder['started_at']}); retry when it has finished") from None
            path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(body)
        return Lease(path, run_id)
    raise LeaseHeldError(f"{what}: could not take the lease {path}; retry")
