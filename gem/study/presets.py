"""The study's presets: typed, one per scale (`smoke` for a test, `small` for a quick look on 2 CPU
cores, `cpu` for the published run on 2 CPU cores, `gpu`).

A preset fixes the traffic (gem.study.traffic), the compute targets (forward FLOPs per example,
gem.study.sizing), which targets each architecture is trained at, the tuning grid every
architecture gets alike, the seeds, and where it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ARCHS = ("kunlun", "interformer", "hstu", "wukong", "dlrm")
SCALED = ("kunlun", "interformer")  # the two whose scaling efficiency is compared


@dataclass(frozen=True)
class TrafficPreset:
    users: int
    ads: int
    impressions_per_day: int
    train_days: int  # then one validation day, then one held-out day
    # Days simulated before the first training day and never trained on: the users' engagement,
    # fatigue and interest drift leave their fresh start first (its rates differ from later days').
    warmup_days: int = 1
    seed: int = 7
    history_weight: float | None = None  # None: the generator's default


@dataclass(frozen=True)
class StudyPreset:
    name: str
    traffic: TrafficPreset
    targets: tuple[float, ...]  # forward FLOPs per example, increasing; SCALED archs train at all
    baseline_targets: tuple[int, ...]  # indices into targets the other architectures train at
    matched: int  # index of the matched-compute target (in baseline_targets)
    lrs: tuple[float, ...]  # the tuning grid, the same for every architecture and size
    seeds: int
    epochs: int
    batch_size: int
    lengths: dict[str, int] = field(default_factory=lambda: {"impression": 32, "click": 16, "conversion": 4})
    # Kept fraction of training negatives per label type (positives all kept; weight 1 / rate).
    negative_rate: dict[str, float] = field(default_factory=lambda: {
        "click": 0.3, "offsite_purchase": 0.15, "app_install": 0.15, "lead": 0.15})
    transfer_tasks: int = 2  # conversion tasks (most training positives first) trained alone
    ablations: bool = True
    min_positives: int = 20  # per-task NE only for tasks with this many held-out positives
    # A conversion task is in the study only with at least this many held-out positives (counted from
    # the traffic's labels before any model trains): an NE over fewer is too noisy to compare. 0: all.
    conversion_min_positives: int = 0
    # The largest size of each scaled architecture also trained on the first half of the training
    # batches (one seed, the same lr grid): its NE gap to the full data says whether the scaling
    # curve's top is data-limited.
    data_limited: bool = False
    # The share of the validation day's examples (drawn at random) that score each lr trial: it only
    # chooses the learning rate, so a sample does, for less compute.
    validation_fraction: float = 1.0
    ablation_target: int | None = None  # index into targets Kunlun's ablations train at (None: matched)
    device: str = "cpu"
    bf16: bool = False
    backend: str = "torch"
    eval_batch_size: int = 4096
    # CPU threads for torch: the models' many small kernels run fastest on one thread, and a
    # shared machine's oversubscribed threads are far slower.
    threads: int = 1
    workers: int = 1  # processes running jobs side by side (`--workers` overrides)

    def __post_init__(self) -> None:
        if list(self.targets) != sorted(self.targets) or self.matched not in self.baseline_targets:
            raise ValueError("targets must increase and the matched target must be one the baselines train at")
        if self.seeds < 2 or not self.lrs:
            raise ValueError("a preset needs >= 2 seeds (intervals) and >= 1 learning rate")


def _geometric(lo: float, hi: float, n: int) -> tuple[float, ...]:
    return tuple(lo * (hi / lo) ** (i / (n - 1)) for i in range(n))


PRESETS: dict[str, StudyPreset] = {
    "smoke": StudyPreset(
        name="smoke", traffic=TrafficPreset(users=200, ads=30, impressions_per_day=3_000, train_days=1),
        targets=(6e5, 1.5e6), baseline_targets=(0,), matched=0, lrs=(3e-3,), seeds=2, epochs=1, batch_size=512,
        lengths={"impression": 8, "click": 8, "conversion": 4}, transfer_tasks=1, min_positives=1),
    "small": StudyPreset(
        name="small", traffic=TrafficPreset(users=1_000, ads=100, impressions_per_day=30_000, train_days=2),
        targets=_geometric(5e5, 1.6e7, 5), baseline_targets=(0, 2, 4), matched=2, lrs=(1e-3, 4e-3), seeds=3,
        epochs=1, batch_size=512, transfer_tasks=2),
    # The published run (docs/results/): 1.02M training examples (3 days of 340k impressions, no
    # negative down-sampling), Kunlun and InterFormer at 5 sizes over 1.5 decades, the other
    # architectures at the matched size only, the conversion tasks with >= 200 held-out positives,
    # the top sizes checked for being data-limited. Fitted to 6 hours of 2 cores by a 2-point lr grid,
    # the lr chosen on a third of the validation day, and Kunlun's ablations at the second size.
    "cpu": StudyPreset(
        name="cpu", traffic=TrafficPreset(users=20_000, ads=2_000, impressions_per_day=340_000, train_days=3),
        targets=_geometric(4e5, 1.3e7, 5), baseline_targets=(2,), matched=2, lrs=(1e-3, 4e-3), seeds=3,
        epochs=1, batch_size=512, negative_rate={}, transfer_tasks=2, min_positives=200,
        conversion_min_positives=200, data_limited=True, validation_fraction=1 / 3, ablation_target=1, workers=2),
    # One H200 within part of a 10-minute call (tests and benches beside it): 5 sizes over 1.5 decades
    # up to 6.4e7 FLOPs/example, batch 4096 (about 100 steps a run), eight processes sharing the GPU
    # (bench.study_sharing times the sharing against one process).
    "gpu": StudyPreset(
        name="gpu", traffic=TrafficPreset(users=20_000, ads=2_000, impressions_per_day=300_000, train_days=3),
        targets=_geometric(2e6, 6.4e7, 5), baseline_targets=(0, 2, 4), matched=2, lrs=(1e-3, 2e-3, 4e-3),
        seeds=3, epochs=1, batch_size=4096, lengths={"impression": 64, "click": 32, "conversion": 8},
        transfer_tasks=3, min_positives=50, device="cuda", bf16=True, backend="torch", workers=8),
}
