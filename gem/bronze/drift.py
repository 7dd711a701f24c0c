"""Schema drift: fail the ingest when a column's type or the key set changed for many rows."""

from __future__ import annotations

from gem.bronze.census import LineCensus
from gem.config import GemConfig
from gem.quality.gate import GateError, GateFailure
from schemas.events import LANDING_EVENTS


class SchemaDriftError(GateError):
    """The landing data no longer matches the landing contract in schemas/events.py."""


def check_drift(census: LineCensus, cfg: GemConfig, where: str) -> None:
    """Fail when a column's type or the key set changed for more than the configured share of rows.

    A few bad rows are dirty data (quarantined); a column that is wrong in many rows is a producer
    that changed the contract, and quarantining the whole day would hide it.
    """
    total = census.parsed
    if total == 0:
        return
    limit = cfg.ingest.drift_max_type_error_rate
    problems, failures = [], []
    for label, counts in (("unexpected column", census.unexpected), ("wrong type in column", census.wrong_type)):
        for name, n in sorted(counts.items()):
            if n / total > limit:
                problems.append(f"{label} {name!r} in {n} of {total} rows ({n / total:.1%})")
                failures.append(GateFailure(f"schema_drift:{name}", f"{label} in {n} of {total} rows ({n / total:.4g})",
                                            f"at most {limit} of a day's rows", "ingest.drift_max_type_error_rate"))
    if problems:
        expected = ", ".join(f"{c.name}: {c.dtype}" for c in LANDING_EVENTS.columns)
        raise SchemaDriftError(
            f"schema drift in {where}: " + "; ".join(problems)
            + f". The landing contract (schemas/events.py LANDING_EVENTS) is {{{expected}}}; "
            f"rates above ingest.drift_max_type_error_rate={limit} fail the job.", failures)
