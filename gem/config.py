"""One typed config system for every stage: dataclasses loaded from YAML, then environment overrides.

Load order (later wins):
  1. the dataclass defaults below (the embedded default: local Spark, local Delta folder);
  2. a YAML file: the `--config` argument, else $GEM_CONFIG, else nothing;
  3. environment variables `GEM__SECTION__FIELD=value`, e.g. `GEM__SPARK__MASTER=local[2]`,
     `GEM__LAKEHOUSE_URI=/data/lake`. Each value is read as the type of the field it sets: the text
     itself for a str field (`GEM__START_DS=2026-01-01` stays "2026-01-01"), a YAML value otherwise
     ("3" -> 3, "true" -> True, "[a, b]" or "a,b" -> a tuple).

Unknown keys and values of the wrong type fail loudly with the offending path.

Example:
    >>> cfg = load_config(overrides={"generator": {"users": 100}})
    >>> cfg.generator.users
    100
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gem.model.configs import ModelConfig, StudentConfig
from schemas.tasks import LABEL_TYPES, SURFACES  # the one task vocabulary

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_PREFIX = "GEM__"
MAX_CLICK_WINDOW_MINUTES = 24 * 60


class ConfigError(ValueError):
    """A config file or override that does not match the typed config."""


@dataclass(frozen=True)
class SparkConfig:
    master: str = "local[*]"
    shuffle_partitions: int = 8
    driver_memory: str = "4g"
    # Extra spark.* settings; under spark-submit the cluster's own settings win over all of these.
    conf: dict[str, str] = field(default_factory=dict)
    # Folder of Delta (and dependency) jars fetched once at set-up so sessions start offline.
    jars_dir: str = str(REPO_ROOT / ".cache" / "jars")
    # The JVM's class-data-sharing archive of the classes a Delta job loads, written once at set-up
    # (`python -m gem.lakehouse.spark archive-classes`): a local session maps it instead of loading
    # and verifying those classes, so it starts faster. Absent (or made by another JDK), sessions
    # load the classes themselves.
    class_archive: str = str(REPO_ROOT / ".cache" / "spark-classes.jsa")
    # A jar with Hadoop's local file system setting file modes through java.nio, built once at set-up
    # from infra/spark/localfs (javac): without Hadoop's native library every file a write creates
    # forks a chmod process, which slows writes of many small partitions. Absent, sessions use Hadoop's own.
    local_fs_jar: str = str(REPO_ROOT / ".cache" / "gem-localfs.jar")


@dataclass(frozen=True)
class SurfaceParams:
    """Generator behaviour of one surface: base click rate and how fast it decays with position."""

    base_ctr: float
    position_decay: float
    traffic_share: float


def _default_surface_params() -> dict[str, SurfaceParams]:
    return {
        "fb_feed": SurfaceParams(base_ctr=0.030, position_decay=0.10, traffic_share=0.30),
        "ig_feed": SurfaceParams(base_ctr=0.025, position_decay=0.12, traffic_share=0.22),
        "reels": SurfaceParams(base_ctr=0.018, position_decay=0.05, traffic_share=0.18),
        "stories": SurfaceParams(base_ctr=0.012, position_decay=0.20, traffic_share=0.12),
        "marketplace": SurfaceParams(base_ctr=0.040, position_decay=0.15, traffic_share=0.10),
        "audience_network": SurfaceParams(base_ctr=0.008, position_decay=0.25, traffic_share=0.08),
    }


@dataclass(frozen=True)
class GeneratorConfig:
    users: int = 20_000
    ads: int = 2_000
    advertisers: int = 200
    events_per_day: int = 200_000
    latent_dim: int = 16
    seed: int = 7
    # Extra dirty landing lines per clean line, cycling through the dirty-row kinds (schemas.events.DIRTY_KIND_REASON).
    dirty_fraction: float = 0.01
    # Events are simulated and written in chunks of at most this many impressions (bounded memory),
    # and in at least min_chunks_per_day time-ordered chunks: users' engagement and fatigue update
    # after each chunk, so more chunks mean finer time-gap effects within a day.
    chunk_impressions: int = 250_000
    min_chunks_per_day: int = 24
    # Weight of the user's recent engagement (decayed clicked-ad vector) in the click logit.
    history_weight: float = 1.5
    # Days simulated before start_ds and never written, so the first day starts from engaged users
    # (recent clicks and fatigue at their usual levels) instead of users who never saw an ad, whose
    # click rates climb over the first days (gem.sources.simulation.start_state).
    burn_in_days: int = 3
    surface_params: dict[str, SurfaceParams] = field(default_factory=_default_surface_params)


@dataclass(frozen=True)
class IngestConfig:
    # Event ids already in bronze within this many earlier days count as duplicates.
    dedup_lookback_days: int = 7
    # A column whose values fail their type in more than this fraction of rows is schema drift:
    # the job fails instead of quarantining (a producer changed the contract).
    drift_max_type_error_rate: float = 0.05
    # Event times more than this many days after the arrival day are "far future", not late.
    far_future_days: int = 30
    # Event times more than this many days before the arrival day are quarantined (stale_timestamp):
    # late data beyond any use, or a unit error (epoch seconds read as milliseconds land in 1970).
    # Must exceed attribution_window_days: a conversion arriving after its window is still counted
    # (assemble_examples quarantines it as arrived_after_window).
    max_event_lag_days: int = 30
    # Quarantined raw lines (bronze.quarantine) older than this many days are deleted by the upkeep
    # DAG (gem.lakehouse.upkeep); VACUUM removes their files retention_days after that.
    quarantine_retention_days: int = 30

    def __post_init__(self) -> None:
        if self.quarantine_retention_days < 1:
            raise ConfigError(f"ingest.quarantine_retention_days must be >= 1, got {self.quarantine_retention_days}")


def _default_null_rate_scopes() -> dict[str, str]:
    # Nullable columns that are null by design on some rows: their null rate is computed only over
    # the rows (a Spark SQL predicate) where a value is expected. Other columns: over all rows.
    return {
        "position": "event_type <> 'conversion'",
        "conversion_type": "event_type = 'conversion'",
    }


@dataclass(frozen=True)
class RateRange:
    min: float
    max: float


def _default_label_rates() -> dict[str, RateRange]:
    # Per task (surface, label type): the share of a day's examples with the label. Conversion
    # labels may be 0 for a small surface-day (objectives that convert are not served everywhere).
    return {
        "click": RateRange(0.001, 0.30),
        "offsite_purchase": RateRange(0.0, 0.10),
        "app_install": RateRange(0.0, 0.10),
        "lead": RateRange(0.0, 0.10),
    }


@dataclass(frozen=True)
class QualityConfig:
    min_surface_ctr: float = 0.001
    max_surface_ctr: float = 0.30
    max_null_rate: float = 0.0
    max_quarantine_rate: float = 0.10
    # quarantined_by_reason['duplicate_event_id'] / rows_in of the ingest record; critical above this.
    max_duplicate_rate: float = 0.05
    null_rate_scopes: dict[str, str] = field(default_factory=_default_null_rate_scopes)
    # silver.training_examples: label rate bounds per label type, checked per task.
    label_rates: dict[str, RateRange] = field(default_factory=_default_label_rates)
    # silver.user_sequences: the share of each cap a day's busiest user must leave for events before
    # an impression (see schemas/examples.py, late materialization); below it is a warning.
    min_sequence_margin: float = 0.5
    # silver.training_examples: the most examples of a day whose sequence prefix (what the model
    # reads) the stored cap cut short, as a share; above it the day fails (raise sequence_caps).
    # Every cut example is counted either way. The demo's busiest users cut well under this.
    max_sequence_cut_rate: float = 0.02
    # silver features: share of rows with clicks_28d <= impressions_28d (a click just inside the
    # window's start can count while its impression, just outside, does not).
    min_clicks_within_impressions: float = 0.99
    # Where the Great Expectations project (results, Data Docs) lives; default under the lakehouse.
    gx_dir: str = ""
    # Pinned CSS/JS/fonts Data Docs pages load, fetched once at set-up (infra/dq_assets/assets.txt)
    # so the pages render offline.
    docs_assets_dir: str = str(REPO_ROOT / ".cache" / "dq_assets")


@dataclass(frozen=True)
class SequenceCaps:
    impression: int = 512
    click: int = 256
    conversion: int = 64


MIX_POLICIES = ("fixed", "proportional", "temperature")
# Where a day's landing files come from: "synthetic" (the DAG's generate_events task writes them) or
# "landing" (an external export or `gem import-movielens` wrote them; generate_events skips and the
# DAG waits for each day's `_SUCCESS` marker).
SOURCES = ("synthetic", "landing")


@dataclass(frozen=True)
class MixConfig:
    """How much of each source (task x day range) training sees; see jobs/mix.py.

    policy: "proportional" draws every source at `max_rate` (shares follow volume); "temperature"
    gives source s a share proportional to rows_s ** (1 / temperature) (T=1 is proportional, large T
    tends to uniform), scaled so the largest rate is `max_rate`; "fixed" takes `fixed_rates`.
    """

    policy: str = "temperature"
    temperature: float = 2.0
    max_rate: float = 1.0
    # task name ("reels/click") -> rate, for policy "fixed"; a task not listed gets `max_rate`.
    fixed_rates: dict[str, float] = field(default_factory=dict)
    # Rows whose label for the source's task is 0 are kept with this extra probability (1 = all).
    negative_rate: float = 1.0
    # Training sources cover this many closed example days, ending the day before the validation days.
    train_days: int = 14
    # The example days just before the held-out day that form the "validation" split (every row,
    # rate 1, weight 1, as the held-out split): hyper-parameters are chosen on them, so the held-out
    # day stays unseen by every choice. Train, validation and held-out days are disjoint and in that
    # order; 0 = no validation split (training ends the day before the held-out day).
    validation_days: int = 1
    # The pipeline's first days never train: their examples' counters have no earlier day to count
    # (all 0 on start_ds), so a model trained on them meets a feature distribution it never saw on
    # every later day. 0 = train from start_ds on.
    cold_start_days: int = 0
    seed: int = 17

    def __post_init__(self) -> None:
        if self.policy not in MIX_POLICIES:
            raise ConfigError(f"mix.policy must be one of {MIX_POLICIES}, got {self.policy!r}")
        if self.temperature <= 0:
            raise ConfigError(f"mix.temperature must be > 0, got {self.temperature}")
        for name, rate in {"max_rate": self.max_rate, "negative_rate": self.negative_rate,
                           **{f"fixed_rates[{k}]": v for k, v in self.fixed_rates.items()}}.items():
            if not 0.0 < rate <= 1.0:
                raise ConfigError(f"mix.{name} must be in (0, 1], got {rate}")
        if self.train_days < 1:
            raise ConfigError(f"mix.train_days must be >= 1, got {self.train_days}")
        for name in ("validation_days", "cold_start_days"):
            if getattr(self, name) < 0:
                raise ConfigError(f"mix.{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class LoaderConfig:
    """The training loader (gem/data/loader.py)."""

    batch_size: int = 512
    # Shards per rank: the pass's files are dealt to them, and each is read by one DataLoader worker
    # process, served round-robin (0: one shard, read in the training process).
    num_workers: int = 2
    # True: this rank's num_workers shards are read in the training process itself, in the order the
    # worker processes would serve them (same batches, same resume state). Worker processes read
    # beside the training; on a CPU-training host they only take cores from torch's own threads.
    in_process: bool = False
    # Longest sequence prefix per event type handed to the model (the most recent events before the
    # impression). Above the stored cap (sequence_caps) it simply means "all that is stored".
    max_impressions: int = 256
    max_clicks: int = 128
    max_conversions: int = 32
    # Day snapshots of silver.user_sequences each worker keeps indexed in memory.
    snapshot_cache_days: int = 2
    # Length-aware batching: each shard buffers this many batches' rows, sorts them by sequence
    # length and cuts batches of similar lengths, emitted in a seeded order (gem/data/length_batching.py);
    # exact resume and the draws are unchanged. 1 = batches in stream order. It cuts padding, but is off
    # by default: similar history lengths mean similar users, which biases short runs' steps and costs
    # held-out NE. Jagged attention removes padding without grouping users.
    length_sort_batches: int = 1
    # A shard reads its files this many at a time (groups of near-equal size), their drawn rows
    # shuffled together, so a batch mixes surfaces and days: the example table is partitioned by
    # (ds, surface), and one file at a time (1) gives runs of single-surface batches, so each task's
    # share of the steps follows its volume instead of the loss's equal per-task mean (gem.model.task).
    # Mixing helps the small surfaces' NE. Memory: a group's rows at once.
    interleave_files: int = 8

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_impressions", "max_clicks", "max_conversions", "snapshot_cache_days",
                     "length_sort_batches", "interleave_files"):
            if getattr(self, name) < 1:
                raise ConfigError(f"loader.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise ConfigError(f"loader.num_workers must be >= 0, got {self.num_workers}")

    def max_length(self, event_type: str) -> int:
        return int(getattr(self, f"max_{event_type}s"))

    def capped(self, lengths: Mapping[str, int]) -> LoaderConfig:
        """This config cutting no sequence longer than `lengths` (event type -> what the model reads,
        ModelConfig.sequence_lengths()): events the model would drop are never copied or looked up,
        and the padding the trainer reports is the padding the model computes on."""
        return dataclasses.replace(self, **{f"max_{e}s": min(self.max_length(e), int(n)) for e, n in lengths.items()})


EMBEDDING_OPTIMIZERS = ("sgd", "rowwise_adagrad")
LR_DECAYS = ("constant", "cosine")


@dataclass(frozen=True)
class TrainConfig:
    """Pretraining (gem/train/)."""

    steps: int = 200
    lr: float = 1e-3
    # The dense optimizer's schedule (gem/train/lr_schedule.py): linear warmup, then "constant" or
    # "cosine" down to lr_min_ratio * lr at the last step.
    lr_warmup_steps: int = 0
    lr_decay: str = "constant"
    lr_min_ratio: float = 0.1
    weight_decay: float = 0.0
    seed: int = 0
    # Checkpoint every this many steps (and at the end); root defaults to {lakehouse}/_checkpoints/<run>.
    checkpoint_every: int = 50
    checkpoint_root: str = ""
    # Loss weight per task name; a task not listed weighs 1.
    task_weights: dict[str, float] = field(default_factory=dict)
    log_every: int = 10
    # GPU only: bf16 autocast.
    bf16: bool = True
    # torch.compile of the dense body (GPU and CPU; on the CPU inductor's C++ kernels, dynamic shapes).
    # On the CPU the compiled steps are faster but the compile time pays back only in long runs;
    # the demo's short runs stay eager.
    compile: bool = False
    # CPU training in bf16 autocast too (matmuls in bf16, the loss and torch's fp32-listed ops in
    # fp32); emulated, so slower, on CPUs without native bf16 matmuls (AMX or AVX512-BF16). Even with
    # them it is no faster than fp32 at the demo size, and it changes the numerics: off unless asked.
    cpu_bf16: bool = False
    # model.embeddings.backend "torchrec" only: the tables' optimizer, fused into the backward
    # (gem/train/sharding.py); the dense part keeps AdamW at `lr`.
    embedding_optimizer: str = "rowwise_adagrad"
    embedding_lr: float = 0.05

    def __post_init__(self) -> None:
        if self.embedding_optimizer not in EMBEDDING_OPTIMIZERS:
            raise ConfigError(f"train.embedding_optimizer must be one of {EMBEDDING_OPTIMIZERS}, "
                              f"got {self.embedding_optimizer!r}")
        if self.steps < 1 or self.checkpoint_every < 1:
            raise ConfigError(f"train.steps and train.checkpoint_every must be >= 1, got {self.steps}, {self.checkpoint_every}")
        if self.lr_decay not in LR_DECAYS:
            raise ConfigError(f"train.lr_decay must be one of {LR_DECAYS}, got {self.lr_decay!r}")
        if self.lr_warmup_steps < 0 or not 0.0 <= self.lr_min_ratio <= 1.0:
            raise ConfigError(f"train.lr_warmup_steps must be >= 0 and train.lr_min_ratio in [0, 1], "
                              f"got {self.lr_warmup_steps}, {self.lr_min_ratio}")


@dataclass(frozen=True)
class PrecomputeConfig:
    """Solaris precompute of the foundation model's outputs (gem/precompute/, jobs/precompute.py)."""

    # A refresh loads the newest promoted model and recomputes every user; between refreshes the
    # pinned model recomputes only users whose sequence snapshot changed (the others carry forward).
    model_refresh_days: int = 7
    # Fixed user-hash ranges: the unit of work, of lease and of commit. Fixed so a shard's rows mean
    # the same users on every run and for every worker count.
    shards: int = 8
    # Worker processes the job starts; more can join a running day (python -m gem.precompute.worker).
    workers: int = 1
    # Each worker computes single-threaded: N workers use N cores, and results do not depend on the
    # thread count (reductions are ordered the same way).
    threads_per_worker: int = 1
    # A shard lease not renewed for this long is taken over (its worker is presumed dead).
    lease_expiry_s: float = 60.0
    batch_size: int = 256
    # Speculative pairs for tomorrow, per user active on ds: the ads of their `recent_ads` most recent
    # distinct impressions, plus the day's `popular_ads` most impressed ads. On the generator's
    # traffic, where ads are drawn by global popularity, popular ads carry most of the next day's
    # hits; users' own ads matter where serving retargets.
    recent_ads: int = 4
    popular_ads: int = 12

    def __post_init__(self) -> None:
        for name in ("model_refresh_days", "shards", "workers", "threads_per_worker", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"precompute.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("recent_ads", "popular_ads"):
            if getattr(self, name) < 0:
                raise ConfigError(f"precompute.{name} must be >= 0, got {getattr(self, name)}")
        if self.lease_expiry_s <= 0:
            raise ConfigError(f"precompute.lease_expiry_s must be > 0, got {self.lease_expiry_s}")


@dataclass(frozen=True)
class DemoConfig:
    start_ds: str = "2026-01-01"
    days: int = 2
    # The first `bulk_days` demo days load through the bulk path (gem.pipeline.bulk: every stage in one
    # process and one Spark session, as a history is loaded before daily runs take over); the rest
    # run through Airflow, one DAG run each. At least the last day runs through Airflow.
    bulk_days: int = 0

    def __post_init__(self) -> None:
        if self.days < 1 or not 0 <= self.bulk_days < self.days:
            raise ConfigError(f"demo.days must be >= 1 and 0 <= demo.bulk_days < demo.days, got days={self.days}, "
                              f"bulk_days={self.bulk_days}")


@dataclass(frozen=True)
class GemConfig:
    # Root of the lakehouse: a local folder by default, an object-store URI on a cluster.
    lakehouse_uri: str = str(REPO_ROOT / "lakehouse")
    # Landing files (raw exports); default beside the lakehouse tables.
    landing_uri: str = ""
    # Who writes the landing files: "synthetic" (the generator task) or "landing" (see SOURCES).
    source: str = "synthetic"
    # First day of the pipeline: stages with day-over-day state start fresh here.
    start_ds: str = "2026-01-01"
    surfaces: tuple[str, ...] = SURFACES
    # Label types trained on; a task is (surface, label type) over the enabled ones (see `tasks`).
    label_types: tuple[str, ...] = LABEL_TYPES
    # Last-click attribution: a conversion counts for an impression only if it arrived by the
    # impression's day + this many days (schemas/examples.py).
    attribution_window_days: int = 7
    # A click links to the user's latest impression of the ad on the surface at most this long before it.
    click_window_minutes: int = 60
    training_horizon_days: int = 30
    # Delta log and removed-file retention; must exceed attribution window + training horizon.
    retention_days: int = 60
    sequence_caps: SequenceCaps = field(default_factory=SequenceCaps)
    # Every this many days build_sequences compacts silver.user_sequences into one snapshot of all
    # users (schemas/sequences.py), so its daily lookup stays bounded; 0 never compacts.
    sequence_compaction_days: int = 7
    spark: SparkConfig = field(default_factory=SparkConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    ingest: IngestConfig = field(default_factory=IngestConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    mix: MixConfig = field(default_factory=MixConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    # The per-surface students distilled from the foundation model (gem/model/student.py).
    student: StudentConfig = field(default_factory=StudentConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    # The students' daily training (gem/distill/): one pass over a surface's newest FM-predicted day.
    student_train: TrainConfig = field(default_factory=lambda: TrainConfig(steps=60, lr=3e-3, checkpoint_every=60))
    precompute: PrecomputeConfig = field(default_factory=PrecomputeConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ConfigError(f"source must be one of {SOURCES}, got {self.source!r}")
        unknown = sorted(set(self.surfaces) - set(SURFACES))
        if unknown:
            raise ConfigError(f"surfaces {unknown} are not in schemas.tasks.SURFACES {list(SURFACES)}")
        unknown = sorted(set(self.label_types) - set(LABEL_TYPES))
        if unknown:
            raise ConfigError(f"label_types {unknown} are not in schemas.tasks.LABEL_TYPES {list(LABEL_TYPES)}")
        missing = sorted(set(self.label_types) - set(self.quality.label_rates))
        if missing:
            raise ConfigError(f"quality.label_rates lacks label types {missing}")
        missing = sorted(set(self.surfaces) - set(self.generator.surface_params))
        if missing:
            raise ConfigError(f"generator.surface_params lacks surfaces {missing}")
        if self.sequence_compaction_days < 0:
            raise ConfigError(f"sequence_compaction_days must be >= 0 (0: never), got {self.sequence_compaction_days}")
        if self.attribution_window_days < 0:
            raise ConfigError(f"attribution_window_days must be >= 0, got {self.attribution_window_days}")
        if not 1 <= self.click_window_minutes <= MAX_CLICK_WINDOW_MINUTES:
            # assemble_examples reads the impressions of a click's day and the day before only.
            raise ConfigError(
                f"click_window_minutes must be in [1, {MAX_CLICK_WINDOW_MINUTES}], got {self.click_window_minutes}"
            )
        unknown = sorted(set(self.mix.fixed_rates) - {f"{s}/{t}" for s, t in self.tasks})
        if unknown:
            raise ConfigError(f"mix.fixed_rates names unknown tasks {unknown}; tasks are surface/label_type")
        if self.ingest.max_event_lag_days <= self.attribution_window_days:
            raise ConfigError(
                f"ingest.max_event_lag_days={self.ingest.max_event_lag_days} must exceed attribution_window_days="
                f"{self.attribution_window_days}: conversions arriving late must reach bronze to be counted")
        floor = self.attribution_window_days + self.training_horizon_days
        if self.retention_days <= floor:
            raise ConfigError(
                f"retention_days={self.retention_days} must exceed attribution_window_days + "
                f"training_horizon_days = {floor}, or time travel to training inputs breaks"
            )

    @property
    def tasks(self) -> tuple[tuple[str, str], ...]:
        """The enabled tasks: (surface, label type) pairs, in vocabulary order."""
        return tuple((s, lt) for s in self.surfaces for lt in self.label_types)

    @property
    def landing_root(self) -> str:
        return self.landing_uri or f"{self.lakehouse_uri.rstrip('/')}/_landing"

    @property
    def gx_root(self) -> str:
        return self.quality.gx_dir or f"{self.lakehouse_uri.rstrip('/')}/_dq/gx"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------------
# Loading: dict -> dataclass with type checks.


@dataclass(frozen=True)
class EnvText:
    """An environment override's raw text, read only once the type of the field it sets is known
    (parsing it as YAML first would turn `GEM__START_DS=2026-01-01` into a date for a str field)."""

    variable: str
    text: str

    def read_as(self, tp: Any) -> Any:
        """The text for a str field; otherwise its YAML value (numbers, booleans, lists, mappings)."""
        if tp is str or self.text == "":
            return self.text
        return yaml.safe_load(self.text)


def _coerce(value: Any, tp: Any, path: str) -> Any:
    if isinstance(value, EnvText):
        return _coerce(value.read_as(tp), tp, f"{path} (${value.variable})")
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping for {tp.__name__}, got {value!r}")
        return _build(tp, value, path)
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return {_coerce(k, key_tp, f"{path}.{k}"): _coerce(v, val_tp, f"{path}.{k}") for k, v in value.items()}
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}")
        return tuple(_coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{path}: union types are not supported in config")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if tp in (int, float, str, bool) and (type(value) is not tp):
        raise ConfigError(f"{path}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


def _build(cls: type, data: Mapping[str, Any], path: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{path or 'config'}: unknown keys {unknown}; known: {sorted(names)}")
    kwargs = {k: _coerce(v, hints[k], f"{path}.{k}" if path else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # includes the model configs' own validation
        raise ConfigError(f"{path or 'config'}: {e}") from e


def _deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _deep_merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """`GEM__A__B=v` -> {"a": {"b": EnvText("GEM__A__B", v)}}, read as field a.b's type when built."""
    tree: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in key[len(ENV_PREFIX) :].split("__")]
        node = tree
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if isinstance(node, EnvText):  # e.g. GEM__SPARK=... beside GEM__SPARK__MASTER=...
                raise ConfigError(f"{key} overrides a field of a section {node.variable} sets whole; set one of the two")
        if isinstance(node.get(parts[-1]), dict):
            raise ConfigError(f"{key} sets a whole section other GEM__ variables override fields of; set one of the two")
        node[parts[-1]] = EnvText(key, raw)
    return tree


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> GemConfig:
    """Defaults <- YAML file (path, else $GEM_CONFIG) <- env `GEM__*` <- explicit overrides."""
    environ = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    path = path or environ.get("GEM_CONFIG") or None
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"config file {p} must hold a mapping at top level")
        data = _deep_merge(data, loaded)
    data = _deep_merge(data, _env_overrides(environ))
    if overrides:
        data = _deep_merge(data, overrides)
    return _build(GemConfig, data, "")


def add_config_arg(parser: Any) -> None:
    """The `--config FILE` flag every job and entry point shares."""
    parser.add_argument("--config", default=None, help="YAML config file (default: $GEM_CONFIG or built-in)")
