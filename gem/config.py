"""One typed config system for every stage, on pydantic-settings.

Load order (later wins):
  1. the field defaults below (the embedded default: local Spark, local Delta folder);
  2. a YAML file: the `--config` argument, else $GEM_CONFIG, else nothing;
  3. environment variables `GEM__SECTION__FIELD=value`, e.g. `GEM__SPARK__MASTER=local[2]`,
     `GEM__LAKEHOUSE_URI=/data/lake`. Each value is read as the type of the field it sets: the text
     itself for a str field (`GEM__START_DS=2026-01-01` stays "2026-01-01"), a YAML value otherwise
     ("3" -> 3, "true" -> True, "[a, b]" or "a,b" -> a tuple);
  4. explicit overrides passed to `load_config` (tests, benchmarks).

Constraints and choices are declared on the fields (`PositiveInt`, `Literal[...]`); rules that tie
several fields together are model validators. Every error names the key, where its value came from
(the file or the variable) and the value. Unknown keys fail, and a key this config once had names
its replacement (RENAMED_KEYS).

Sections are frozen pydantic dataclasses, so `dataclasses.replace` validates the copy it makes;
`GemConfig.replace` does the same for the root.

Example:
    >>> cfg = load_config(overrides={"generator": {"users": 100}}, environ={})
    >>> cfg.generator.users
    100
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import ipaddress
import os
from collections.abc import Iterator, Mapping
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args, get_origin

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.dataclasses import dataclass
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from gem.config_types import SECTION, Fraction, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, Rate
from gem.days import DEFAULT_START_DS
from gem.environment import CONFIG_FILE_ENV
from gem.model.configs import ModelConfig, StudentConfig
from schemas.tasks import LABEL_TYPES, SURFACES  # the one task vocabulary

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_PREFIX = "GEM__"
MAX_CLICK_WINDOW_MINUTES = 24 * 60


class ConfigError(ValueError):
    """A config file or override that does not match the typed config."""


@dataclass(frozen=True, config=SECTION)
class SparkConfig:
    master: str = "local[*]"
    shuffle_partitions: PositiveInt = 8
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


@dataclass(frozen=True, config=SECTION)
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


@dataclass(frozen=True, config=SECTION)
class GeneratorConfig:
    users: PositiveInt = 20_000
    ads: PositiveInt = 2_000
    advertisers: PositiveInt = 200
    events_per_day: PositiveInt = 200_000
    latent_dim: PositiveInt = 16
    seed: int = 7
    # Extra dirty landing lines per clean line, cycling through the dirty-row kinds (schemas.events.DIRTY_KIND_REASON).
    dirty_fraction: NonNegativeFloat = 0.01
    # Events are simulated and written in chunks of at most this many impressions (bounded memory),
    # and in at least min_chunks_per_day time-ordered chunks: users' engagement and fatigue update
    # after each chunk, so more chunks mean finer time-gap effects within a day.
    chunk_impressions: PositiveInt = 250_000
    min_chunks_per_day: PositiveInt = 24
    # Weight of the user's recent engagement (decayed clicked-ad vector) in the click logit.
    history_weight: float = 1.5
    # Days simulated before start_ds and never written, so the first day starts from engaged users
    # (recent clicks and fatigue at their usual levels) instead of users who never saw an ad, whose
    # click rates climb over the first days (gem.sources.simulation.start_state).
    burn_in_days: NonNegativeInt = 3
    surface_params: dict[str, SurfaceParams] = field(default_factory=_default_surface_params)


@dataclass(frozen=True, config=SECTION)
class IngestConfig:
    # Event ids already in bronze within this many earlier days count as duplicates.
    dedup_lookback_days: NonNegativeInt = 7
    # A column whose values fail their type in more than this fraction of rows is schema drift:
    # the job fails instead of quarantining (a producer changed the contract).
    drift_max_type_error_rate: Fraction = 0.05
    # Event times more than this many days after the arrival day are "far future", not late.
    far_future_days: PositiveInt = 30
    # Event times more than this many days before the arrival day are quarantined (stale_timestamp):
    # late data beyond any use, or a unit error (epoch seconds read as milliseconds land in 1970).
    # Must exceed attribution_window_days: a conversion arriving after its window is still counted
    # (assemble_examples quarantines it as arrived_after_window).
    max_event_lag_days: PositiveInt = 30
    # Quarantined raw lines (bronze.quarantine) older than this many days are deleted by the upkeep
    # DAG (gem.lakehouse.upkeep); VACUUM removes their files retention_days after that.
    quarantine_retention_days: PositiveInt = 30


def _default_null_rate_scopes() -> dict[str, str]:
    # Nullable columns that are null by design on some rows: their null rate is computed only over
    # the rows (a Spark SQL predicate) where a value is expected. Other columns: over all rows.
    return {
        "position": "event_type <> 'conversion'",
        "conversion_type": "event_type = 'conversion'",
    }


@dataclass(frozen=True, config=SECTION)
class RateRange:
    min: Fraction
    max: Fraction

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"a rate range's min {self.min} is above its max {self.max}")
        return self


def _default_label_rates() -> dict[str, RateRange]:
    # Per task (surface, label type): the share of a day's examples with the label. Conversion
    # labels may be 0 for a small surface-day (objectives that convert are not served everywhere).
    return {
        "click": RateRange(0.001, 0.30),
        "offsite_purchase": RateRange(0.0, 0.10),
        "app_install": RateRange(0.0, 0.10),
        "lead": RateRange(0.0, 0.10),
    }


@dataclass(frozen=True, config=SECTION)
class QualityConfig:
    min_surface_ctr: Fraction = 0.001
    max_surface_ctr: Fraction = 0.30
    max_null_rate: Fraction = 0.0
    max_quarantine_rate: Fraction = 0.10
    # quarantined_by_reason['duplicate_event_id'] / rows_in of the ingest record; critical above this.
    max_duplicate_rate: Fraction = 0.05
    null_rate_scopes: dict[str, str] = field(default_factory=_default_null_rate_scopes)
    # silver.training_examples: label rate bounds per label type, checked per task.
    label_rates: dict[str, RateRange] = field(default_factory=_default_label_rates)
    # silver.user_sequences: the share of each cap a day's busiest user must leave for events before
    # an impression (see schemas/examples.py, late materialization); below it is a warning.
    min_sequence_margin: Fraction = 0.5
    # silver.training_examples: the most examples of a day whose sequence prefix (what the model
    # reads) the stored cap cut short, as a share; above it the day fails (raise sequence_caps).
    # Every cut example is counted either way. The demo's busiest users cut well under this.
    max_sequence_cut_rate: Fraction = 0.02
    # silver features: share of rows with clicks_28d <= impressions_28d (a click just inside the
    # window's start can count while its impression, just outside, does not).
    min_clicks_within_impressions: Fraction = 0.99
    # Where the Great Expectations project (results, Data Docs) lives; default under the lakehouse.
    gx_dir: str = ""
    # Pinned CSS/JS/fonts Data Docs pages load, fetched once at set-up (infra/dq_assets/assets.txt)
    # so the pages render offline.
    docs_assets_dir: str = str(REPO_ROOT / ".cache" / "dq_assets")


@dataclass(frozen=True, config=SECTION)
class SequenceCaps:
    impression: PositiveInt = 512
    click: PositiveInt = 256
    conversion: PositiveInt = 64


MixPolicy = Literal["fixed", "proportional", "temperature"]
MIX_POLICIES = get_args(MixPolicy)
# Where a day's landing files come from: "synthetic" (the DAG's generate_events task writes them) or
# "landing" (an external export or `gem import-movielens` wrote them; generate_events skips and the
# DAG waits for each day's `_SUCCESS` marker).
Source = Literal["synthetic", "landing"]
SOURCES = get_args(Source)


@dataclass(frozen=True, config=SECTION)
class MixConfig:
    """How much of each source (task x day range) training sees; see jobs/mix.py.

    policy: "proportional" draws every source at `max_rate` (shares follow volume); "temperature"
    gives source s a share proportional to rows_s ** (1 / temperature) (T=1 is proportional, large T
    tends to uniform), scaled so the largest rate is `max_rate`; "fixed" takes `fixed_rates`.
    """

    policy: MixPolicy = "temperature"
    temperature: PositiveFloat = 2.0
    max_rate: Rate = 1.0
    # task name ("reels/click") -> rate, for policy "fixed"; a task not listed gets `max_rate`.
    fixed_rates: dict[str, Rate] = field(default_factory=dict)
    # Rows whose label for the source's task is 0 are kept with this extra probability (1 = all).
    negative_rate: Rate = 1.0
    # Training sources cover this many closed example days, ending the day before the validation days.
    train_days: PositiveInt = 14
    # The example days just before the held-out day that form the "validation" split (every row,
    # rate 1, weight 1, as the held-out split): hyper-parameters are chosen on them, so the held-out
    # day stays unseen by every choice. Train, validation and held-out days are disjoint and in that
    # order; 0 = no validation split (training ends the day before the held-out day).
    validation_days: NonNegativeInt = 1
    # The pipeline's first days never train: their examples' counters have no earlier day to count
    # (all 0 on start_ds), so a model trained on them meets a feature distribution it never saw on
    # every later day. 0 = train from start_ds on.
    cold_start_days: NonNegativeInt = 0
    seed: int = 17


@dataclass(frozen=True, config=SECTION)
class LoaderConfig:
    """The training loader (gem/data/loader.py)."""

    batch_size: PositiveInt = 512
    # Shards per rank: the pass's files are dealt to them, and each is read by one DataLoader worker
    # process, served round-robin (0: one shard, read in the training process).
    num_workers: NonNegativeInt = 2
    # True: this rank's num_workers shards are read in the training process itself, in the order the
    # worker processes would serve them (same batches, same resume state). Worker processes read
    # beside the training; on a CPU-training host they only take cores from torch's own threads.
    in_process: bool = False
    # Longest sequence prefix per event type handed to the model (the most recent events before the
    # impression). Above the stored cap (sequence_caps) it simply means "all that is stored".
    max_impressions: PositiveInt = 256
    max_clicks: PositiveInt = 128
    max_conversions: PositiveInt = 32
    # Memory for the day snapshots of silver.user_sequences a worker (or the training process, with
    # in_process) keeps indexed, in MiB: the least recently used day goes first, and a day whose index
    # alone is larger raises SnapshotTooLarge (gem/data/snapshots.py). A batch reads the days of its
    # rows (up to interleave_files of them), so the cache should hold that many.
    snapshot_cache_mib: PositiveInt = 1024
    # The host's disk cache of decoded data (gem/data/local_cache.py): example files' columns and day
    # snapshots written once as Arrow IPC and memory-mapped by every worker, pass and run on the host,
    # instead of each decoding the same Parquet. Bounded in MiB (least recently used files deleted);
    # 0 turns it off. The folder must be on local disk; empty: gem-loader-cache-<uid> in the temp dir.
    local_cache_mib: NonNegativeInt = 8192
    local_cache_dir: str = ""
    # Length-aware batching: each shard buffers this many batches' rows, sorts them by sequence
    # length and cuts batches of similar lengths, emitted in a seeded order (gem/data/length_batching.py);
    # exact resume and the draws are unchanged. 1 = batches in stream order. It cuts padding, but is off
    # by default: similar history lengths mean similar users, which biases short runs' steps and costs
    # held-out NE. Jagged attention removes padding without grouping users.
    length_sort_batches: PositiveInt = 1
    # A shard reads its files this many at a time (groups of near-equal size), their drawn rows
    # shuffled together, so a batch mixes surfaces and days: the example table is partitioned by
    # (ds, surface), and one file at a time (1) gives runs of single-surface batches, so each task's
    # share of the steps follows its volume instead of the loss's equal per-task mean (gem.model.task).
    # Mixing helps the small surfaces' NE. Memory: a group's rows at once.
    interleave_files: PositiveInt = 8

    def max_length(self, event_type: str) -> int:
        return int(getattr(self, f"max_{event_type}s"))

    def capped(self, lengths: Mapping[str, int]) -> LoaderConfig:
        """This config cutting no sequence longer than `lengths` (event type -> what the model reads,
        ModelConfig.sequence_lengths()): events the model would drop are never copied or looked up,
        and the padding the trainer reports is the padding the model computes on."""
        return dataclasses.replace(self, **{f"max_{e}s": min(self.max_length(e), int(n)) for e, n in lengths.items()})


EmbeddingOptimizer = Literal["sgd", "rowwise_adagrad"]
EMBEDDING_OPTIMIZERS = get_args(EmbeddingOptimizer)
LrDecay = Literal["constant", "cosine"]
LR_DECAYS = get_args(LrDecay)


@dataclass(frozen=True, config=SECTION)
class TrainConfig:
    """Pretraining (gem/train/)."""

    steps: PositiveInt = 200
    lr: PositiveFloat = 1e-3
    # The dense optimizer's schedule (gem/train/lr_schedule.py): linear warmup, then "constant" or
    # "cosine" down to lr_min_ratio * lr at the last step.
    lr_warmup_steps: NonNegativeInt = 0
    lr_decay: LrDecay = "constant"
    lr_min_ratio: Fraction = 0.1
    weight_decay: NonNegativeFloat = 0.0
    seed: int = 0
    # Checkpoint every this many steps (and at the end); root defaults to {lakehouse}/_checkpoints/<run>.
    checkpoint_every: PositiveInt = 50
    checkpoint_root: str = ""
    # Loss weight per task name; a task not listed weighs 1.
    task_weights: dict[str, float] = field(default_factory=dict)
    log_every: PositiveInt = 10
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
    embedding_optimizer: EmbeddingOptimizer = "rowwise_adagrad"
    embedding_lr: PositiveFloat = 0.05


@dataclass(frozen=True, config=SECTION)
class StudentTrainConfig(TrainConfig):
    """A surface's student's daily training (gem/distill/): TrainConfig's fields, with the students'
    own defaults (a file that sets some of this section keeps them), and what it trains on."""

    steps: PositiveInt = 60
    lr: PositiveFloat = 3e-3
    checkpoint_every: PositiveInt = 60
    # The example days a student trains on: every day among the `days` before the held-out day
    # whose examples the FM predicted (gold.fm_predictions), as serving would have logged them; at
    # most training_horizon_days. `steps` run whole: passes over those days repeat until they do.
    days: PositiveInt = 7
    # The run's length in passes over those examples instead (per surface: steps = passes x rows /
    # loader.batch_size, rounded up), so a small surface gets as many passes as a large one; 0:
    # `steps` steps whatever the rows.
    passes: NonNegativeFloat = 0.0
    # Train beside each student the no-FM baseline (variant "baseline") on the same days and steps,
    # warm-started from its own promoted one, and score it on the same held-out examples
    # (gold.metrics arch "student:baseline"): what the FM's signals add. Ignored when the student
    # is itself the baseline.
    baseline: bool = True
    # Ship each promoted student as a serving artifact (gem.serve.export: ONNX graph, feature spec,
    # parity check). Off where no student is served and the export's seconds are not wanted.
    export: bool = True

    def length(self) -> str:
        """How long a student trains, as a person reads it: "6 passes" or "60 steps"."""
        if self.passes:
            return f"{self.passes:g} pass{'es' if self.passes != 1 else ''}"
        return f"{self.steps} steps"


@dataclass(frozen=True, config=SECTION)
class PromotionConfig:
    """The promotion gate (gem/train/gate.py) of the foundation model and of each surface's student.

    A trained model is promoted only when, per label type (its tasks pooled across surfaces), its
    held-out NE is at most the promoted model's NE on the same examples plus `ne_tolerance`; with
    no model promoted yet, below 1 (the base rate). Otherwise the model promoted before stays in use
    until `gem promote` overrides the refusal."""

    # Absolute NE: with 0.01 a candidate at 0.915 replaces a promoted model at 0.910, one at 0.925 does not.
    ne_tolerance: Fraction = 0.01
    # A task votes only with at least this many (weighted) positives on the held-out day: fewer give
    # an NE too noisy to judge by. A model with no voting task is promoted, its record saying so.
    min_positives: PositiveInt = 100


@dataclass(frozen=True, config=SECTION)
class ReportConfig:
    """What the printed tables and the run report say about held-out figures (gem/train/evaluate.py,
    gem/report/run_report.py)."""

    # A task's held-out NE, AUC and calibration are shown only with at least this many (weighted)
    # held-out positives; below it the task reads "too few positives", as its NE is noise. Each label
    # type is also shown pooled over the surfaces ("all/<label type>").
    min_positives: PositiveInt = 30


@dataclass(frozen=True, config=SECTION)
class PrecomputeConfig:
    """Solaris precompute of the foundation model's outputs (gem/precompute/, jobs/precompute.py)."""

    # A refresh loads the newest promoted model and recomputes every user; between refreshes the
    # pinned model recomputes only users whose sequence snapshot changed (the others carry forward).
    model_refresh_days: PositiveInt = 7
    # Fixed user-hash ranges: the unit of work (one Spark task each) and of commit. Fixed so a
    # shard's rows mean the same users on every run and for every executor count.
    shards: PositiveInt = 8
    # CPU threads each task computes with: an executor core runs one task, and results do not
    # depend on the thread count (reductions are ordered the same way).
    threads_per_task: PositiveInt = 1
    # GPUs each task asks Spark's scheduler for (a task resource profile on the precompute stage;
    # executors must offer `gpu` resources, spark.executor.resource.gpu.*). 0: tasks score on the CPU.
    gpus_per_task: NonNegativeFloat = 0.0
    batch_size: PositiveInt = 256
    # Speculative pairs for tomorrow, per user active on ds: the ads of their `recent_ads` most recent
    # distinct impressions, plus the day's `popular_ads` most impressed ads. On the generator's
    # traffic, where ads are drawn by global popularity, popular ads carry most of the next day's
    # hits; users' own ads matter where serving retargets.
    recent_ads: NonNegativeInt = 4
    popular_ads: NonNegativeInt = 12


@dataclass(frozen=True, config=SECTION)
class DemoConfig:
    """`make demo`: the pipeline's first `days` days from start_ds (gem/pipeline/demo.py)."""

    days: PositiveInt = 2
    # The first `bulk_days` demo days load through the bulk path (gem.pipeline.bulk: every stage in one
    # process and one Spark session, as a history is loaded before daily runs take over); the rest
    # run through Airflow, one DAG run each. At least the last day runs through Airflow.
    bulk_days: NonNegativeInt = 0

    @model_validator(mode="after")
    def _last_day_through_airflow(self) -> Self:
        if self.bulk_days >= self.days:
            raise ValueError(f"demo.bulk_days={self.bulk_days} must be below demo.days={self.days}: "
                             "at least the last demo day runs through Airflow")
        return self


# How the DAG's model tasks launch (LauncherConfig.kind).
LauncherKind = Literal["in_process", "torchrun", "cluster_job"]
LAUNCHER_KINDS = get_args(LauncherKind)


@dataclass(frozen=True, config=SECTION)
class LauncherConfig:
    """How the DAG's pretrain, precompute and distill tasks launch their stage
    (gem.pipeline.airflow.orchestration.LAUNCHED_STAGES; every other task runs in its own process).

    kind: "in_process" runs the stage in the Airflow task's process, as every other stage (the
    embedded default); "torchrun" runs it in torchrun processes on the worker's host
    (gem.deploy.launch); "cluster_job" submits it to Kubernetes from the manifests gem.deploy renders:
    pretraining and distillation as Kubeflow PyTorchJobs, precompute as a SparkApplication
    (docs/cluster.md). The DAG reads this section when it is parsed: the DAG processor's config decides.
    """

    kind: LauncherKind = "in_process"
    # Pretraining's processes per node: on this host under torchrun, on each pod of its PyTorchJob
    # (precompute and distill join no process group and run one process).
    nproc_per_node: PositiveInt = 1
    # torchrun: addresses of this host that each run one torchrun node of pretraining, meeting at a
    # c10d rendezvous on the first (a multi-node run on one machine, as `make cluster-demo` trains);
    # empty: one standalone node. Precompute and distill run one standalone node either way.
    local_nodes: tuple[str, ...] = ()
    # cluster_job: pretraining's pods (an elastic job: it starts with min_nodes, takes up to max_nodes).
    min_nodes: PositiveInt = 1
    max_nodes: PositiveInt = 2
    # cluster_job: GPUs a training pod asks for (0: CPU training); distillation asks for at most one.
    gpus_per_node: NonNegativeInt = 0
    # cluster_job: precompute's Spark executors.
    spark_executors: PositiveInt = 2
    # cluster_job: the image deploy/Dockerfile builds, the namespace the jobs run in, and the Airflow
    # connection to the cluster.
    image: str = "gem-pipeline:latest"
    namespace: str = "gem"
    kubernetes_conn_id: str = "kubernetes_default"
    # cluster_job: seconds between two looks at a PyTorchJob's state.
    poll_s: PositiveFloat = 30.0

    @field_validator("local_nodes")
    @classmethod
    def _addresses(cls, nodes: tuple[str, ...]) -> tuple[str, ...]:
        for node in nodes:
            try:
                ipaddress.ip_address(node)
            except ValueError:
                raise ValueError(f"launcher.local_nodes: {node!r} is not an IP address of this host") from None
        return nodes

    @model_validator(mode="after")
    def _nodes_ordered(self) -> Self:
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"launcher.min_nodes={self.min_nodes} is above launcher.max_nodes={self.max_nodes}")
        if self.local_nodes and self.kind != "torchrun":
            raise ValueError(f"launcher.local_nodes are torchrun's nodes on this host; launcher.kind is {self.kind!r}")
        if len(set(self.local_nodes)) != len(self.local_nodes):
            raise ValueError(f"launcher.local_nodes repeats an address: {list(self.local_nodes)}")
        return self


Surface = Literal[SURFACES]
LabelType = Literal[LABEL_TYPES]
# Keys this config no longer has, as dotted paths -> what replaces them (None: removed). A file or a
# variable that still sets one fails naming the replacement instead of "unknown key".
RENAMED_KEYS: dict[str, str | None] = {
    "demo.start_ds": "start_ds (the demo runs the pipeline's first demo.days days)",
    "precompute.workers": "Spark's executors (spark.executor.instances or spark.dynamicAllocation.*; precompute runs as Spark tasks)",
    "precompute.threads_per_worker": "precompute.threads_per_task",
    "precompute.lease_expiry_s": "Spark's task retries and speculation (spark.task.maxFailures, spark.speculation)",
}


class GemConfig(BaseSettings):
    """The whole pipeline's settings: defaults <- YAML <- `GEM__` variables <- explicit overrides."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", case_sensitive=False, extra="forbid", frozen=True,
        coerce_numbers_to_str=True, validate_default=False,
    )

    # Root of the lakehouse: a local folder by default, an object-store URI on a cluster.
    lakehouse_uri: str = str(REPO_ROOT / "lakehouse")
    # Landing files (raw exports); default beside the lakehouse tables.
    landing_uri: str = ""
    # Who writes the landing files: "synthetic" (the generator task) or "landing" (see SOURCES).
    source: Source = "synthetic"
    # First day of the pipeline: stages with day-over-day state start fresh here.
    start_ds: str = DEFAULT_START_DS
    surfaces: tuple[Surface, ...] = SURFACES
    # Label types trained on; a task is (surface, label type) over the enabled ones (see `tasks`).
    label_types: tuple[LabelType, ...] = LABEL_TYPES
    # Last-click attribution: a conversion counts for an impression only if it arrived by the
    # impression's day + this many days (schemas/examples.py).
    attribution_window_days: NonNegativeInt = 7
    # A click links to the user's latest impression of the ad on the surface at most this long before
    # it; at most a day, since assemble_examples reads the impressions of a click's day and the day before.
    click_window_minutes: Annotated[int, Field(ge=1, le=MAX_CLICK_WINDOW_MINUTES)] = 60
    training_horizon_days: PositiveInt = 30
    # Delta log and removed-file retention; must exceed attribution window + training horizon.
    retention_days: PositiveInt = 60
    sequence_caps: SequenceCaps = Field(default_factory=SequenceCaps)
    # Every this many days build_sequences compacts silver.user_sequences into one snapshot of all
    # users (schemas/sequences.py), so its daily lookup stays bounded; 0 never compacts.
    sequence_compaction_days: NonNegativeInt = 7
    spark: SparkConfig = Field(default_factory=SparkConfig)
    generator: GeneratorConfig = Field(default_factory=GeneratorConfig)
    ingest: IngestConfig = Field(default_factory=IngestConfig)
    quality: QualityConfig = Field(default_factory=QualityConfig)
    mix: MixConfig = Field(default_factory=MixConfig)
    loader: LoaderConfig = Field(default_factory=LoaderConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    # The per-surface students distilled from the foundation model (gem/model/student.py).
    student: StudentConfig = Field(default_factory=StudentConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    # The students' daily training (gem/distill/): student_train.steps over a surface's FM-predicted
    # days of the last student_train.days.
    student_train: StudentTrainConfig = Field(default_factory=StudentTrainConfig)
    precompute: PrecomputeConfig = Field(default_factory=PrecomputeConfig)
    # When a trained model (foundation model or student) replaces the promoted one (gem/train/gate.py).
    promotion: PromotionConfig = Field(default_factory=PromotionConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    demo: DemoConfig = Field(default_factory=DemoConfig)
    # How the DAG's pretrain, precompute and distill tasks launch (in-process, torchrun, a cluster job).
    launcher: LauncherConfig = Field(default_factory=LauncherConfig)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        missing = sorted(set(self.label_types) - set(self.quality.label_rates))
        if missing:
            raise ValueError(f"quality.label_rates lacks label types {missing}")
        missing = sorted(set(self.surfaces) - set(self.generator.surface_params))
        if missing:
            raise ValueError(f"generator.surface_params lacks surfaces {missing}")
        unknown = sorted(set(self.mix.fixed_rates) - {f"{s}/{t}" for s, t in self.tasks})
        if unknown:
            raise ValueError(f"mix.fixed_rates names unknown tasks {unknown}; tasks are surface/label_type")
        if self.ingest.max_event_lag_days <= self.attribution_window_days:
            raise ValueError(
                f"ingest.max_event_lag_days={self.ingest.max_event_lag_days} must exceed attribution_window_days="
                f"{self.attribution_window_days}: conversions arriving late must reach bronze to be counted")
        if self.student_train.days > self.training_horizon_days:
            raise ValueError(f"student_train.days={self.student_train.days} must be at most training_horizon_days="
                             f"{self.training_horizon_days}: retention_days keeps training inputs only that far back")
        floor = self.attribution_window_days + self.training_horizon_days
        if self.retention_days <= floor:
            raise ValueError(
                f"retention_days={self.retention_days} must exceed attribution_window_days + "
                f"training_horizon_days = {floor}, or time travel to training inputs breaks")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Explicit values, then `GEM__` variables, then the YAML file (earlier wins)."""
        loading = _LOADING.get() or _Loading()
        sources: list[PydanticBaseSettingsSource] = [init_settings, _GemEnvSource(settings_cls, loading.environ)]
        if loading.path is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=loading.path, deep_merge=True))
        return tuple(sources)

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
        return self.model_dump()

    def replace(self, **changes: Any) -> GemConfig:
        """A validated copy with `changes` (top-level fields), as dataclasses.replace is for a section."""
        try:
            return type(self).model_validate({**self.model_dump(), **changes})
        except ValidationError as error:
            raise ConfigError(describe_errors(error, {}, None)) from None


# --------------------------------------------------------------------------------------------------
# Loading: where each value comes from, and errors that say so.


@dataclasses.dataclass(frozen=True)
class _Loading:
    path: Path | None = None
    environ: Mapping[str, str] = dataclasses.field(default_factory=lambda: os.environ)


# What the settings sources read while `load_config` builds a config; a bare `GemConfig()` reads
# only the process environment.
_LOADING: contextvars.ContextVar[_Loading | None] = contextvars.ContextVar("gem_config_loading", default=None)


@contextlib.contextmanager
def _loading(path: Path | None, environ: Mapping[str, str]) -> Iterator[None]:
    token = _LOADING.set(_Loading(path, environ))
    try:
        yield
    finally:
        _LOADING.reset(token)


class _GemEnvSource(EnvSettingsSource):
    """`GEM__SECTION__FIELD` variables from a given mapping, structured values read as YAML.

    YAML instead of pydantic-settings' JSON, so "[a, b]", "{master: local[2]}" and "a,b" (a list of
    words) all read as a shell user would write them.
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {key.lower(): value for key, value in self._environ.items() if key.upper().startswith(ENV_PREFIX)}

    def decode_complex_value(self, field_name: str, field: Any, value: Any) -> Any:
        text = str(value).strip()
        if get_origin(field.annotation) in (tuple, list) and not text.startswith("["):
            return [item.strip() for item in text.split(",") if item.strip()]
        return yaml.safe_load(text)


def _section_type(path: tuple[str, ...]) -> Any:
    """The type a dotted config path leads to (a section class, or None past a mapping or a leaf)."""
    node: Any = GemConfig
    for key in path:
        fields = _fields_of(node)
        if fields is None or key not in fields:
            return None
        node = fields[key]
    return node


def _fields_of(tp: Any) -> dict[str, Any] | None:
    """A section's field name -> type, for a config class; None for anything else."""
    if isinstance(tp, type) and issubclass(tp, BaseSettings):
        return {name: info.annotation for name, info in tp.model_fields.items()}
    if isinstance(tp, type) and hasattr(tp, "__pydantic_fields__"):  # a section (pydantic dataclass)
        return {name: info.annotation for name, info in tp.__pydantic_fields__.items()}
    return None


def _env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + "__".join(path).upper()


def _yaml_has(data: Any, path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(data, Mapping) or key not in data:
            return False
        data = data[key]
    return True


def describe_errors(error: ValidationError, environ: Mapping[str, str], path: Path | None,
                    yaml_data: Mapping[str, Any] | None = None) -> str:
    """One line per problem: the key, where its value came from, the value, and what is wrong."""
    upper_env = {key.upper() for key in environ}
    lines = []
    for problem in error.errors():
        loc = tuple(str(part) for part in problem["loc"])
        key = ".".join(loc) or "config"
        where = ""
        for depth in range(len(loc), 0, -1):
            if _env_name(loc[:depth]) in upper_env:
                where = f" (${_env_name(loc[:depth])})"
                break
            if yaml_data is not None and _yaml_has(yaml_data, loc[:depth]):
                where = f" (config file {path})"
                break
        if problem["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
            known = _fields_of(_section_type(loc[:-1]))
            lines.append(f"{key}{where}: unknown key; known: {sorted(known or [])}")
            continue
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "value_error" or not loc:
            lines.append(f"{key}{where}: {message}")
        else:
            lines.append(f"{key}{where}: {message}, got {problem['input']!r}")
    return "\n".join(lines)


def _renamed_keys_used(yaml_data: Mapping[str, Any] | None, environ: Mapping[str, str], path: Path | None) -> list[str]:
    upper_env = {key.upper() for key in environ}
    found = []
    for old, new in RENAMED_KEYS.items():
        parts = tuple(old.split("."))
        replacement = f"use {new}" if new else "it was removed"
        if yaml_data is not None and _yaml_has(yaml_data, parts):
            found.append(f"{old} (config file {path}): this key is gone; {replacement}")
        if _env_name(parts) in upper_env:
            found.append(f"{old} (${_env_name(parts)}): this key is gone; {replacement}")
    return found


def _unknown_env_keys(environ: Mapping[str, str]) -> list[str]:
    """`GEM__` variables that name no setting (pydantic-settings would skip them silently)."""
    problems = []
    names = sorted(key for key in environ if key.upper().startswith(ENV_PREFIX))
    for name in names:
        parts = tuple(part.lower() for part in name[len(ENV_PREFIX):].split("__"))
        if ".".join(parts) in RENAMED_KEYS:
            continue
        for depth in range(1, len(parts)):
            if _env_name(parts[:depth]) in {n.upper() for n in names}:
                problems.append(f"{name} overrides a field of a section ${_env_name(parts[:depth])} sets whole; "
                                "set one of the two")
                break
        else:
            parent = _section_type(parts[:-1])
            known = _fields_of(parent)
            if known is not None and parts[-1] not in known:
                problems.append(f"{name} names no setting: {'.'.join(parts)} is unknown; known: {sorted(known)}")
    return problems


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> GemConfig:
    """Defaults <- YAML file (path, else $GEM_CONFIG) <- env `GEM__*` <- explicit overrides."""
    environ = os.environ if environ is None else environ
    path = path or environ.get(CONFIG_FILE_ENV) or None
    file = Path(path) if path else None
    yaml_data: Mapping[str, Any] | None = None
    if file is not None:
        if not file.is_file():
            raise ConfigError(f"config file {file} does not exist")
        yaml_data = yaml.safe_load(file.read_text()) or {}
        if not isinstance(yaml_data, Mapping):
            raise ConfigError(f"config file {file} must hold a mapping at top level")
    problems = _renamed_keys_used(yaml_data, environ, file) + _unknown_env_keys(environ)
    if problems:
        raise ConfigError("\n".join(problems))
    try:
        with _loading(file, environ):
            return GemConfig(**dict(overrides or {}))
    except ValidationError as error:
        raise ConfigError(describe_errors(error, environ, file, yaml_data)) from None
