"""One schema definition per table. Everything else (Spark schema, Delta DDL, expectations) derives.

`TABLES` maps each lakehouse table name to its schema.
"""

from schemas.events import BRONZE_AD_EVENTS, BRONZE_QUARANTINE, LANDING_EVENTS
from schemas.examples import SILVER_ATTRIBUTION_QUARANTINE, SILVER_CLICK_QUARANTINE, SILVER_TRAINING_EXAMPLES
from schemas.features import (
    SILVER_AD_DAILY_COUNTS,
    SILVER_AD_FEATURES,
    SILVER_USER_DAILY_COUNTS,
    SILVER_USER_FEATURES,
)
from schemas.metrics import GOLD_METRICS
from schemas.mixture import GOLD_MIXTURE_MANIFEST
from schemas.ops import COMPLETIONS
from schemas.precompute import GOLD_PRECOMPUTE_STATS, PRECOMPUTE_TABLES
from schemas.sequences import SILVER_USER_SEQUENCES, SILVER_USER_SEQUENCES_COMPACTED
from schemas.table import Column, TableSchema

TABLES: dict[str, TableSchema] = {
    t.name: t
    for t in (
        BRONZE_AD_EVENTS,
        BRONZE_QUARANTINE,
        COMPLETIONS,
        SILVER_USER_SEQUENCES,
        SILVER_USER_SEQUENCES_COMPACTED,
        SILVER_USER_FEATURES,
        SILVER_AD_FEATURES,
        SILVER_USER_DAILY_COUNTS,
        SILVER_AD_DAILY_COUNTS,
        SILVER_TRAINING_EXAMPLES,
        SILVER_ATTRIBUTION_QUARANTINE,
        SILVER_CLICK_QUARANTINE,
        GOLD_MIXTURE_MANIFEST,
        GOLD_METRICS,
        *PRECOMPUTE_TABLES,
        GOLD_PRECOMPUTE_STATS,
    )
}

__all__ = ["BRONZE_AD_EVENTS", "BRONZE_QUARANTINE", "COMPLETIONS", "LANDING_EVENTS", "TABLES", "Column", "TableSchema"]
