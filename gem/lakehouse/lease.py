"""One run at a time per (stage, day): a lease file taken before a run withdraws its record.

Two runs of one (stage, ds) writing at once would each commit and publish; the table ends as one
run's contents, but the record left standing could name the commit of the run that wrote first,
whose files the other run's commit has since replaced, and a reader checking the partition's files
against that version would refuse it. The lease makes the second run fail at once, with the
holder's run id, and succeed on retry.

The lease is a file `{lakehouse}/_ops/leases/{stage}/ds={ds}.json` (a local folder or an object
store, through gem.storage), made with `storage.create` (atomic and exclusive on both: one creator
wins), holding the run id, host, pid, start time and `renewed_at` (epoch seconds of the holder's
last heartbeat); the run's publish removes it. A lease whose holder is gone is taken over: on the
same host when its pid no longer runs (or is this very process: a retry after an exception), on
another host once it is older than LEASE_EXPIRY_S.

`acquire_path` is the same lease on any file; with `renewed=True` its holder renews it
(`Lease.renew` rewrites `renewed_at`) while it works, and a lease not renewed for `expiry_s` is
taken over on any host: how backfills hold their range (gem.lakehouse.backfill_hold) and precompute
workers claim shards (gem.precompute.shards), so a killed worker's shard passes to another within
seconds.

Every change to an existing lease file is conditional on the version read before it
(`storage.replace_if` / `storage.delete_if`: If-Match on S3, a locked inode check on the local
disk): a takeover replaces only the stale lease it judged, and a holder renewing or releasing never
overwrites or removes a lease another run has taken over in the meantime.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gem import storage
from gem.config import GemConfig

LEASE_EXPIRY_S = 6 * 3600  # a holder on another host is presumed dead after this long


class LeaseHeldError(RuntimeError):
    """Another run of the same (stage, ds) is in progress; retry once it has finished."""


@dataclass(frozen=True)
class Lease:
    path: str | Path  # the lease file, a local path or URI, as the caller of acquire_path named it
    run_id: str

    @property
    def uri(self) -> str:
        return storage.normalized(self.path)

    def _held_version(self) -> tuple[str, dict] | None:
        """(the lease file's version, its holder) while this run holds it, else None."""
        seen = storage.version(self.uri)  # before the read: a change after it fails the condition
        holder = _read_holder(self.uri) if seen is not None else None
        return (seen, holder) if holder and holder.get("run_id") == self.run_id else None

    def renew(self) -> bool:
        """Mark the holder alive (rewrite `renewed_at`); False if it is no longer held."""
        held = self._held_version()
        if held is None:
            return False
        seen, holder = held
        return storage.replace_if(self.uri, json.dumps({**holder, "renewed_at": time.time()}), seen)

    def release(self) -> None:
        """Remove the lease if this run still holds it."""
        held = self._held_version()
        if held is not None:
            storage.delete_if(self.uri, held[0])


def lease_path(cfg: GemConfig, stage: str, ds: str) -> str:
    return storage.join(cfg.lakehouse_uri, "_ops", "leases", stage, f"ds={ds}.json")


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def _heartbeat(holder: dict, uri: str) -> float | None:
    """Epoch seconds of the holder's last heartbeat: its `renewed_at`, else (a file without one) the
    file's modification time; None when the file is gone."""
    if "renewed_at" in holder:
        return float(holder["renewed_at"])
    try:
        return storage.modified(uri)
    except FileNotFoundError:
        return None


def _holder_gone(holder: dict, uri: str, expiry_s: float, renewed: bool, taking: bool = True) -> bool:
    """taking: judged by a process about to take the lease, for which a lease held by itself is one
    left over from an earlier try (a reader leaves it alone)."""
    if holder.get("host") == socket.gethostname():
        pid = int(holder.get("pid", -1))
        if (taking and pid == os.getpid()) or not _pid_running(pid):
            return True
        if not renewed:
            return False
    if renewed:  # age since the last heartbeat (a killed holder stops renewing, even as a zombie)
        beat = _heartbeat(holder, uri)
        return beat is None or time.time() - beat > expiry_s
    started = dt.datetime.fromisoformat(holder["started_at"])
    return (dt.datetime.now(dt.UTC) - started).total_seconds() > expiry_s


def _read_holder(uri: str) -> dict | None:
    """The lease file's holder; {} for a file that is no lease (storage writes whole files, so no
    holder wrote it: it is taken over); None when there is no file."""
    try:
        holder = storage.read_json(uri)
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return holder if isinstance(holder, dict) else {}


def live_holder(path: str | Path, expiry_s: float = LEASE_EXPIRY_S, renewed: bool = False) -> dict | None:
    """The holder of the lease file `path` when it is alive (as `acquire_path` judges it), else
    None; for readers that wait on a lease without taking it."""
    uri = storage.normalized(path)
    holder = _read_holder(uri)
    return holder if holder and not _holder_gone(holder, uri, expiry_s, renewed, taking=False) else None


def acquire(cfg: GemConfig, stage: str, ds: str, run_id: str) -> Lease:
    """Take the lease of (stage, ds) for `run_id`; LeaseHeldError naming the holder if a live run
    holds it."""
    return acquire_path(lease_path(cfg, stage, ds), run_id, f"{stage} ds={ds}")


def acquire_path(path: str | Path, run_id: str, what: str, expiry_s: float = LEASE_EXPIRY_S,
                 renewed: bool = False) -> Lease:
    """Take the lease file `path` (a local path or URI) for `run_id` (`what` names it in errors);
    LeaseHeldError naming the holder if a live holder has it. renewed: the holder heartbeats
    (Lease.renew) and is presumed dead `expiry_s` after its last one, on any host."""
    uri = storage.normalized(path)
    now = time.time()
    body = json.dumps({"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
                       "started_at": dt.datetime.fromtimestamp(now, dt.UTC).isoformat(), "renewed_at": now})
    for _ in range(3):  # a lease released or taken over meanwhile is looked at again
        if storage.create(uri, body):
            return Lease(path, run_id)
        seen = storage.version(uri)  # before the read: a change after it fails the takeover
        holder = _read_holder(uri) if seen is not None else None
        if holder is None:
            continue  # released meanwhile
        if holder and not _holder_gone(holder, uri, expiry_s, renewed):
            raise LeaseHeldError(
                f"{what} is being run by {holder['run_id']} (host {holder['host']}, pid "
                f"{holder['pid']}, since {holder['started_at']}); retry when it has finished")
        if storage.replace_if(uri, body, seen):  # the stale lease, unless another took it first
            return Lease(path, run_id)
    raise LeaseHeldError(f"{what}: could not take the lease {uri}; retry")


@contextmanager
def held(path: str | Path, run_id: str, what: str, expiry_s: float, renew_s: float,
         wait_s: float = 0.0, poll_s: float = 1.0) -> Iterator[Lease]:
    """Hold the lease file `path` for the block, renewed every `renew_s` by a background thread
    (presumed dead `expiry_s` after its last renewal); a live holder makes it wait up to `wait_s`,
    then LeaseHeldError naming the holder."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            lease = acquire_path(path, run_id, what, expiry_s=expiry_s, renewed=True)
            break
        except LeaseHeldError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(poll_s)
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(renew_s):
            lease.renew()

    renewer = threading.Thread(target=renew, name=f"lease-{storage.name(path)}", daemon=True)
    renewer.start()
    try:
        yield lease
    finally:
        stop.set()
        renewer.join()
        lease.release()
