"""The Solaris precompute tables: the foundation model's outputs, written back for students and serving.

Written by jobs.precompute (gem/precompute/) without Spark, through `deltalake`. The three output
tables are partitioned by (ds, shard): a shard is a fixed range of user hashes
(gem.precompute.shards), the unit of work and of commit, so a rerun of a shard replaces exactly its
rows. Every row names the model that computed it (`model_version`) and the Delta versions of the
inputs it read (`input_versions`, table name -> version).

gold.fm_user_embeddings is incremental, like silver.user_sequences: partition ds=D holds only the
users computed on D (everyone on a model refresh day; between refreshes the users whose sequence
snapshot changed since the last precompute). A user's embedding for day D is their row with the
greatest ds <= D whose model_version is the one precompute ran with on D (gem.precompute.read).

Example gold.fm_user_embeddings row:
    {"ds": 2026-01-04, "shard": 3, "user_id": "u17", "embedding": [0.12, -0.4, ...],
     "tokens": 11, "sequence_ds": 2026-01-04, "model_version": "kunlun@2026-01-03:step120",
     "input_versions": {"silver.user_sequences": 12}, "computed_at": 2026-01-05 00:03:00}
"""

from __future__ import annotations

from schemas.table import Column, TableSchema

_STAMP = (
    Column("model_version", "string", nullable=False, doc="arch@promoted mix day:step of the model that computed the row"),
    Column("input_versions", "map<string,long>", nullable=False, doc="table -> Delta version read"),
    Column("computed_at", "timestamp", nullable=False),
)
_SHARD = Column("shard", "int", nullable=False, min=0, doc="user-hash range (gem.precompute.shards)")

GOLD_FM_USER_EMBEDDINGS = TableSchema(
    name="gold.fm_user_embeddings",
    writer="deltalake",
    doc="Per user, the foundation model's user-side representation (Kunlun.user_representation), flattened.",
    columns=(
        Column("ds", "date", nullable=False, doc="the day computed; serves requests from ds+1 on"),
        _SHARD,
        Column("user_id", "string", nullable=False, personal=True),
        Column("embedding", "array<float>", nullable=False, doc="(tokens * dim,) the (tokens, dim) representation, row-major"),
        Column("tokens", "int", nullable=False, min=1, doc="token count of the representation"),
        Column("sequence_ds", "date", nullable=False, doc="silver.user_sequences partition of the snapshot read"),
        *_STAMP,
    ),
    partition_by=("ds", "shard"),
    key=("ds", "user_id"),
)

GOLD_FM_PREDICTIONS = TableSchema(
    name="gold.fm_predictions",
    writer="deltalake",
    doc="Per impression of the day's training examples: the model's per-task predictions and the "
        "representation a student reads (logged once, reused by every student).",
    columns=(
        Column("ds", "date", nullable=False, doc="the examples' impression day"),
        _SHARD,
        Column("impression_id", "string", nullable=False),
        Column("user_id", "string", nullable=False, personal=True),
        Column("ad_id", "string", nullable=False),
        Column("surface", "string", nullable=False),
        Column("predictions", "map<string,double>", nullable=False, doc="task -> probability"),
        Column("representation", "array<float>", nullable=False, doc="(body.out_dim,) the heads' input"),
        *_STAMP,
    ),
    partition_by=("ds", "shard"),
    key=("ds", "impression_id"),
)

GOLD_FM_HISTORY_CODES = TableSchema(
    name="gold.fm_history_codes",
    writer="deltalake",
    doc="LoopFM (arXiv 2605.29280): per impression of the day's training examples, the foundation "
        "model's representation compressed by its history-code autoencoder to INT4 codes, packed two "
        "per byte; a student reads a user's codes strictly before its example as a sequence feature.",
    columns=(
        Column("ds", "date", nullable=False, doc="the examples' impression day"),
        _SHARD,
        Column("user_id", "string", nullable=False, personal=True),
        Column("impression_id", "string", nullable=False),
        Column("event_time", "timestamp", nullable=False, doc="the impression's time: when the code was logged"),
        Column("codes", "binary", nullable=False, doc="code_dim / 2 bytes: INT4 codes (gem.model.ops.int4.pack_int4)"),
        *_STAMP,
    ),
    partition_by=("ds", "shard"),
    key=("ds", "impression_id"),
)

GOLD_FM_SPECULATIVE_PAIRS = TableSchema(
    name="gold.fm_speculative_pairs",
    writer="deltalake",
    doc="(user, ad) pairs precomputed on ds for the requests of ds+1 (gem.precompute.speculative).",
    columns=(
        Column("ds", "date", nullable=False, doc="the day computed; the pairs serve ds+1"),
        _SHARD,
        Column("user_id", "string", nullable=False, personal=True),
        Column("ad_id", "string", nullable=False),
        Column("surface", "string", nullable=False, doc="the user's latest surface: the request context assumed"),
        Column("reason", "string", nullable=False, allowed=("recent", "popular"), doc="why the policy chose the pair"),
        Column("sequence_ds", "date", nullable=False, doc="silver.user_sequences partition of the snapshot read"),
        Column("features_ds", "date", nullable=False, doc="silver.*_features partition of the counters read"),
        Column("predictions", "map<string,double>", nullable=False, doc="task -> probability"),
        *_STAMP,
    ),
    partition_by=("ds", "shard"),
    key=("ds", "user_id", "ad_id"),
)

GOLD_PRECOMPUTE_STATS = TableSchema(
    name="gold.precompute_stats",
    writer="deltalake",
    doc="One row per precompute day: the work done, and the measured use of the previous speculation.",
    columns=(
        Column("ds", "date", nullable=False),
        Column("run_id", "string", nullable=False),
        Column("model_version", "string", nullable=False),
        Column("model_checkpoint", "string", nullable=False, doc="the checkpoint folder loaded"),
        Column("model_ds", "date", nullable=False, doc="the promoted model's mixture day"),
        Column("refresh_ds", "date", nullable=False, doc="the day this model was pinned (a full recompute)"),
        Column("refreshed", "boolean", nullable=False, doc="ds is a refresh day: every user recomputed"),
        Column("shards", "int", nullable=False, min=1),
        Column("users_total", "long", nullable=False, min=0, doc="users with a sequence snapshot up to ds"),
        Column("users_computed", "long", nullable=False, min=0),
        Column("users_carried", "long", nullable=False, min=0, doc="valid embedding from an earlier day, not rewritten"),
        Column("predictions", "long", nullable=False, min=0),
        Column("history_codes", "long", nullable=False, min=0, doc="gold.fm_history_codes rows written (0: no autoencoder)"),
        Column("history_code_bytes_per_user", "double", min=0.0,
               doc="packed code bytes per user coded on the held-out day (LoopFM's storage per user per day)"),
        Column("speculative_pairs", "long", nullable=False, min=0),
        Column("measured_ds", "date", doc="the day whose speculative pairs were measured against ds's impressions"),
        Column("impressions", "long", doc="impressions that arrived on ds with event_time on ds"),
        Column("hits", "long", doc="of them, with their (user, ad) precomputed"),
        Column("hit_rate", "double", min=0.0, max=1.0),
        Column("wasted_share", "double", min=0.0, max=1.0, doc="share of the measured pairs no impression used"),
        Column("model_age_days", "double", doc="ds - model_ds of the measured pairs' model, at use"),
        Column("input_age_days", "double", doc="mean ds - sequence_ds of the hits' inputs, at use"),
    ),
    partition_by=("ds",),
    key=("ds",),
)

PRECOMPUTE_TABLES: tuple[TableSchema, ...] = (GOLD_FM_USER_EMBEDDINGS, GOLD_FM_PREDICTIONS, GOLD_FM_HISTORY_CODES,
                                              GOLD_FM_SPECULATIVE_PAIRS)
