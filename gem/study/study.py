"""The quality study: every run of a preset, and the numbers of results.json.

Jobs: each architecture sized to each of its compute targets (gem.study.sizing), Kunlun's ablation
variants at the matched target (or the preset's ablation_target), and Kunlun trained on one conversion task alone for the transfer
comparison. Every job gets the same tuning: each learning rate of the preset's grid trained with
seed 0 and scored on the VALIDATION day; the lr of lowest pooled validation NE is kept, the other
seeds trained with it, and every seed of that lr scored on the HELD-OUT day (seed 0's held-out score
is of the model the lr was chosen with; the held-out day played no part in choosing it). An lr whose
training diverges (Trainer stops it on a NaN or infinite loss or gradient) is never chosen.

Every run trains with the pipeline's loop and is scored by its evaluation (gem.study.runner:
gem.train.trainer.Trainer, gem.train.evaluate), so the claims hold for the loop the pipeline runs.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from gem import stats
from gem.data.batch import Batch
from gem.model.build import build_task
from gem.model.configs import KunlunConfig, ModelConfig
from gem.study.job_log import JobLog
from gem.study.presets import ARCHS, SCALED, StudyPreset
from gem.study.runner import Scores, run
from gem.study.sizing import SizingContext, kunlun_switch_names, size_to
from gem.study.traffic import DENSE_DIM, SPARSE, DayRoles, Traffic, batches, simulate
from gem.train.evaluate import predictions
from gem.train.trainer import NonFiniteLossError
from schemas.tasks import CONVERSION_TYPES

# The value each Kunlun ablation switch is turned to (booleans: off).
ABLATED = {"attention": "softmax", "pooling": "mean", "compskip": False, "sliding_window": False,
           "event_personalization": False}
TOLERANCE = 0.10  # matched compute: every architecture within 10% of the target
PROBE_STEPS = 8  # training steps timed per model to predict a study's time


@dataclass
class Job:
    name: str
    arch: str
    config: ModelConfig
    flops: int
    target: float
    shape: str
    tasks: tuple[str, ...] | None = None  # None: every task
    fraction: float = 1.0  # of the training batches (the first ones: the batches are shuffled)
    seeds_to_run: int | None = None  # None: the preset's seeds
    lr_trials: list[dict[str, float]] = field(default_factory=list)
    # Per lr trial, seed 0's held-out summary (None: diverged); the chosen lr's becomes seeds[0].
    trial_seeds: list[dict[str, Any] | None] = field(default_factory=list)
    lr: float | None = None
    seeds: list[dict[str, Any]] = field(default_factory=list)  # per seed: held-out summary

    def variant(self, **changes: Any) -> Job:
        """Another job of this one's model, with `changes` and no runs of its own (its result lists new)."""
        return dataclasses.replace(self, lr_trials=[], trial_seeds=[], lr=None, seeds=[], **changes)

    def tried(self, lr: float) -> bool:
        return any(t["lr"] == lr for t in self.lr_trials)

    def values(self, key: str) -> list[float]:
        return [s[key] for s in self.seeds]


class Progress:
    """tqdm on a terminal, plain lines otherwise."""

    def __init__(self, total: int) -> None:
        self.bar = tqdm(total=total, unit="run") if sys.stderr.isatty() else None
        self.total, self.done = total, 0

    def step(self, text: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(text)
            self.bar.update()
        else:
            print(f"[{self.done}/{self.total}] {text}", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _interval(values: list[float]) -> list[float]:
    return list(stats.mean_interval(values))


class Study:
    def __init__(self, preset: StudyPreset, log: Callable[[str], None] = print) -> None:
        self.preset, self.log = preset, log
        self.restored: set[str] = set()  # jobs the last run took from a job log instead of running
        self.planned: list[str] = []  # the last run's jobs
        self.left: list[str] = []  # jobs the last run did not start (its time limit)
        self.clock: Callable[[], float] = time.time  # what --hours is counted on (a test's clock replaces it)
        if preset.device == "cuda":
            # Ask NVML, not the CUDA driver, whether there is a GPU: a parent that initialized CUDA
            # could not fork the workers that each take the GPU (torch.cuda's fork rule).
            os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
            if not torch.cuda.is_available():
                raise RuntimeError(f"preset {preset.name!r} runs on CUDA, and torch sees no CUDA device here "
                                   "(torch.cuda.is_available() is False); use --preset small on a CPU")
        self.device = torch.device(preset.device)
        if self.device.type == "cpu":
            torch.set_num_threads(preset.threads)
        p = preset.traffic
        self.roles = DayRoles.consecutive(p.train_days, p.warmup_days)
        start = time.perf_counter()
        self.traffic: Traffic = simulate(self.roles.days, p.impressions_per_day, p.users, p.ads, p.seed, p.history_weight)
        self.click_tasks = self.traffic.tasks(("click",))
        self.conversion_tasks = tuple(t for t in self.traffic.tasks(CONVERSION_TYPES)
                                      if self.held_out_positives(t) >= preset.conversion_min_positives)
        self.tasks = tuple(t for t in self.traffic.tasks() if t in self.click_tasks or t in self.conversion_tasks)
        self._batches: dict[tuple[str, tuple[str, ...]], list[Batch]] = {}
        self.ctx = SizingContext(lengths=dict(preset.lengths), tasks=len(self.tasks), surfaces=len(self.traffic.surfaces),
                                 buckets={"user_id": p.users, "ad_id": p.ads, "surface": 8, "position": 32},
                                 backend=preset.backend)
        self.log(f"traffic: {len(self.traffic.user):,} impressions over {self.roles.days} days "
                 f"({time.perf_counter() - start:.1f} s)")

    @property
    def ablation_index(self) -> int:
        """The target Kunlun's ablations train at (the full Kunlun of that size is their reference)."""
        return self.preset.matched if self.preset.ablation_target is None else self.preset.ablation_target

    def held_out_positives(self, task: str) -> int:
        t = self.traffic
        return int((t.eligible(task) & t.label(task) & (t.day == self.roles.held_out)).sum())

    # ---- data ------------------------------------------------------------------------------------
    def data(self, split: str, tasks: tuple[str, ...], fraction: float = 1.0) -> list[Batch]:
        """Training batches (negatives down-sampled, weighted; `fraction`: the first of them), the
        held-out day (all of it), or the validation day (all of it, or with preset.validation_fraction
        below 1 that share of its examples drawn at random: it only chooses the learning rate)."""
        if fraction < 1.0:
            full = self.data(split, tasks)
            return full[:max(1, math.ceil(len(full) * fraction))]
        key = (split, tasks)
        if key not in self._batches:
            p = self.preset
            if split == "train":
                self._batches[key] = batches(self.traffic, self.roles.train, p.batch_size, p.lengths, tasks=tasks,
                                             negative_rate=p.negative_rate)
            elif split == "validation" and p.validation_fraction < 1.0:
                day = batches(self.traffic, (self.roles.validation,), p.eval_batch_size, p.lengths, tasks=tasks)
                self._batches[key] = day[:max(1, math.ceil(len(day) * p.validation_fraction))]  # rows shuffled
            else:
                day = self.roles.validation if split == "validation" else self.roles.held_out
                self._batches[key] = batches(self.traffic, (day,), p.eval_batch_size, p.lengths, tasks=tasks,
                                             shuffle=False)
        return self._batches[key]

    # ---- jobs ------------------------------------------------------------------------------------
    def sized(self, arch: str, index: int, switches: dict[str, Any] | None = None, name: str | None = None) -> Job:
        target = self.preset.targets[index]
        ctx = dataclasses.replace(self.ctx, kunlun_switches=switches or {})
        shape = size_to(arch, target, ctx, tolerance=TOLERANCE / 2)
        return Job(name or f"{arch}@{index}", arch, shape.config, shape.flops, target, shape.describe())

    def plan(self) -> tuple[dict[str, Job], list[dict[str, Any]], list[str]]:
        """-> (the sized jobs, the ablation variants, the transfer tasks)."""
        p = self.preset
        jobs: dict[str, Job] = {}
        for arch in ARCHS:
            for i in (range(len(p.targets)) if arch in SCALED else p.baseline_targets):
                job = self.sized(arch, i)
                jobs[job.name] = job
        variants = []
        if p.ablations:
            for switch in kunlun_switch_names():
                value = ABLATED[switch]
                job = self.sized("kunlun", self.ablation_index, {switch: value}, name=f"kunlun-{switch}={value}")
                jobs[job.name] = job
                variants.append({"job": job.name, "switch": switch, "value": value})
        if p.data_limited:  # the top of each scaling curve at half the data: one seed, the same lr grid
            for arch in SCALED:
                full = jobs[f"{arch}@{len(p.targets) - 1}"]
                jobs[f"{full.name}:half"] = full.variant(name=f"{full.name}:half", fraction=0.5, seeds_to_run=1)
        # Transfer: the conversion tasks with the most training positives (measurable held-out NE).
        positives = {t: int((self.traffic.eligible(t) & self.traffic.label(t)
                             & np.isin(self.traffic.day, self.roles.train)).sum()) for t in self.conversion_tasks}
        transfer = sorted(positives, key=lambda t: -positives[t])[:p.transfer_tasks]
        matched = jobs[f"kunlun@{p.matched}"]
        for task in transfer:
            jobs[f"alone:{task}"] = matched.variant(name=f"alone:{task}", tasks=(task,))
        return jobs, variants, transfer

    def summary(self, s: Scores) -> dict[str, Any]:
        """Held-out numbers of one model."""
        tasks = s.tasks
        per_task = {t: s.ne((t,)) for t in tasks if s.positives(t) >= self.preset.min_positives}
        calibration = {}
        for surface in self.traffic.surfaces:
            mine = tuple(t for t in tasks if t.startswith(f"{surface}/"))
            if mine:
                calibration[surface] = s.calibration(mine)
        return {"ne": s.ne(tasks), "ne_click": s.ne(tuple(t for t in tasks if t in self.click_tasks)),
                "ne_conversion": s.ne(tuple(t for t in tasks if t in self.conversion_tasks)),
                "tasks": per_task, "calibration": calibration}

    def runs_left(self, job: Job) -> int:
        """Training runs the job still needs: its untried lrs, and its seeds after seed 0 (which the
        grid's run of the chosen lr is)."""
        return sum(not job.tried(lr) for lr in self.preset.lrs) + self.seeds_of(job) - max(1, len(job.seeds))

    def seeds_of(self, job: Job | None) -> int:
        return job.seeds_to_run if job is not None and job.seeds_to_run is not None else self.preset.seeds

    def complete(self, job: Job) -> bool:
        return len(job.seeds) == self.seeds_of(job)

    def execute(self, job: Job, progress: Progress, may_start: Callable[[], bool] | None = None) -> Iterator[None]:
        """Tune the job's lr on the validation day, then train its seeds and score the held-out day,
        yielding after each training run. Runs the job already has (a job log's) are not run again;
        before each other run `may_start` is asked, and a False stops the job there, unfinished."""
        p, tasks = self.preset, job.tasks or self.tasks
        train = self.data("train", tasks, job.fraction)
        evals = {"validation": self.data("validation", tasks), "held_out": self.data("held_out", tasks)}
        for lr in p.lrs:
            if job.tried(lr):
                continue
            if may_start is not None and not may_start():
                return
            try:
                r = run(job.config, train, evals, lr, 0, p.epochs, self.device, p.bf16)
            except NonFiniteLossError as e:
                # Trainer stops a run whose loss or gradients go NaN or infinite: that lr is recorded
                # without a validation NE, so it is never the one chosen.
                job.lr_trials.append({"lr": lr, "validation_ne": None, "seconds": None, "diverged": True})
                job.trial_seeds.append(None)
                progress.step(f"{job.name} lr {lr:g}: diverged ({e})")
                yield
                continue
            job.lr_trials.append({"lr": lr, "validation_ne": r.scores["validation"].ne(tasks), "seconds": r.seconds})
            job.trial_seeds.append({"seed": 0, "seconds": r.seconds, "examples": r.examples,
                                    **self.summary(r.scores["held_out"])})
            progress.step(f"{job.name} lr {lr:g}: validation NE {job.lr_trials[-1]['validation_ne']:.4f} "
                          f"({r.seconds:.1f} s)")
            yield
        if not job.seeds:
            trained = [i for i, t in enumerate(job.lr_trials) if not t.get("diverged")]
            if not trained:
                raise NonFiniteLossError(f"{job.name}: training diverged at every learning rate of the grid {p.lrs}")
            best = min(trained, key=lambda i: v if (v := job.lr_trials[i]["validation_ne"]) is not None else np.inf)
            job.lr = job.lr_trials[best]["lr"]
            job.seeds.append(job.trial_seeds[best])
        for seed in range(len(job.seeds), self.seeds_of(job)):
            if may_start is not None and not may_start():
                return
            r = run(job.config, train, {"held_out": evals["held_out"]}, job.lr, seed, p.epochs, self.device, p.bf16)
            job.seeds.append({"seed": seed, "seconds": r.seconds, "examples": r.examples,
                              **self.summary(r.scores["held_out"])})
            progress.step(f"{job.name} seed {seed}: held-out NE {job.seeds[-1]['ne']:.4f} ({r.seconds:.1f} s)")
            yield

    # ---- how long it takes -----------------------------------------------------------------------
    def probe(self, job: Job) -> tuple[float, float]:
        """(seconds per training example, seconds per scored example) of the job's model on this host:
        PROBE_STEPS training steps as a run trains, and one held-out batch scored as a run scores
        (timed after a first, warm-up scoring; a model's scoring time does not depend on its weights)."""
        tasks = job.tasks or self.tasks
        train, held = self.data("train", tasks)[:PROBE_STEPS], self.data("held_out", tasks)[:1]
        r = run(job.config, train, {}, self.preset.lrs[0], 0, 1, self.device, self.preset.bf16)
        model = build_task(job.config, tasks, SPARSE, DENSE_DIM).to(self.device)
        held = [b.to(self.device) for b in held]
        predictions(model, held)
        start = time.perf_counter()
        predictions(model, held)
        return r.seconds / r.examples, (time.perf_counter() - start) / sum(b.size for b in held)

    def predict(self, jobs: dict[str, Job], workers: int = 1) -> dict[str, float]:
        """Each job's predicted seconds on this host: the training and scoring examples of the runs it
        still needs (runs_left) times the rates `probe` measures for its model (one probe per
        distinct model and tasks). With workers > 1 the jobs run in that many forked processes, so
        the probes do too, side by side: the rates include what the processes cost each other
        (shared caches and memory bandwidth)."""
        global _PROBED
        p, out = self.preset, {}
        probes: dict[tuple[str, tuple[str, ...] | None], str] = {}  # (model, tasks) -> a job of it
        for name, job in jobs.items():
            probes.setdefault((repr(job.config), job.tasks), name)
            for split in ("train", "validation", "held_out"):  # built here, inherited by the probe process
                self.data(split, job.tasks or self.tasks)
        if workers <= 1:  # the jobs run in this process: so do the probes
            rates = {key: self.probe(jobs[name]) for key, name in probes.items()}
        else:  # in forked processes, as the jobs run: this one must not initialize CUDA (run_forked)
            _PROBED = (self, jobs)
            try:
                with multiprocessing.get_context("fork").Pool(workers) as pool:
                    rates = dict(zip(probes, pool.map(_probe_forked, list(probes.values())), strict=True))
            finally:
                _PROBED = None
        for name, job in jobs.items():
            train_s, score_s = rates[(repr(job.config), job.tasks)]
            tasks = job.tasks or self.tasks
            trained = p.epochs * sum(b.size for b in self.data("train", tasks, job.fraction))
            validation, held_out = (sum(b.size for b in self.data(split, tasks))
                                    for split in ("validation", "held_out"))
            # lr trials score both days; other seeds the held-out one
            lrs = sum(not job.tried(lr) for lr in p.lrs)
            seeds = self.seeds_of(job) - max(1, len(job.seeds))
            out[name] = (lrs + seeds) * trained * train_s + (lrs * (validation + held_out) + seeds * held_out) * score_s
        return out

    @staticmethod
    def makespan(seconds: dict[str, float], workers: int) -> float:
        """Wall seconds of the jobs taken longest first by `workers` processes, each job by the first free one."""
        free = [0.0] * max(1, workers)
        for s in sorted(seconds.values(), reverse=True):
            free[free.index(min(free))] += s
        return max(free)

    # ---- the whole study -------------------------------------------------------------------------
    def run(self, workers: int = 1, job_log: JobLog | None = None, hours: float | None = None
            ) -> dict[str, Any] | None:
        """Every job; with workers > 1, that many forked processes take jobs in turn. On CPU each run
        is single-threaded, so processes, not threads, use more cores; on a GPU each process launches
        its own small kernels, so several keep one GPU busy where one would leave it waiting on
        Python. A job's numbers do not depend on the worker that ran it. With a job log, the jobs and
        training runs it holds are not run again; each job finished here is appended to it, and
        each training run of a job not yet finished too.

        Before training it prints each job's predicted time (predict) and the whole run's. With
        `hours`, no training run starts that would end past that many hours from the start (a job's
        runs are predicted alike: its predicted time over its runs): the run returns None with the
        unfinished jobs in `self.left`, and a rerun with the same job log continues them."""
        start = self.clock()
        jobs, variants, transfer = self.plan()
        self.planned = list(jobs)
        for job in jobs.values():
            self.log(f"{job.name}: {job.shape}, {job.flops:,} FLOPs/example (target {job.target:,.0f})")
        self.restored = job_log.restore(jobs.values()) if job_log is not None else set()
        if self.restored:
            self.log(f"{len(self.restored)} of {len(jobs)} jobs restored from {job_log.path}")
        todo = {name: job for name, job in jobs.items() if name not in self.restored}
        resumed = [name for name, job in todo.items() if job.lr_trials]
        if resumed:
            self.log(f"{len(resumed)} unfinished jobs continue after the training runs {job_log.path} holds: "
                     + ", ".join(f"{n} ({self.runs_left(todo[n])} runs left)" for n in resumed))
        predicted = self.predict(todo, workers)
        per_run = {n: s / max(1, self.runs_left(todo[n])) for n, s in predicted.items()}
        too_long = {n: s for n, s in per_run.items() if hours is not None and s > hours * 3600}
        if too_long:  # the others still run; these wait for a run with a longer limit
            self.log(f"not in this run: --hours {hours} is shorter than one training run of "
                     + ", ".join(f"{n} ({s / 3600:.2f} h)" for n, s in too_long.items())
                     + f"; a later run needs --hours >= {max(too_long.values()) / 3600:.2f} to start them")
        for name in sorted(predicted, key=lambda n: -predicted[n]):
            self.log(f"predicted {name}: {predicted[name]:.0f} s ({self.runs_left(todo[name])} runs)")
        self.log(f"predicted: {sum(predicted.values()) / 3600:.2f} h of one process's time, "
                 f"{self.makespan(predicted, workers) / 3600:.2f} h wall on {workers} worker(s) for {len(todo)} jobs "
                 f"(rates from {PROBE_STEPS} training steps and one scored batch of each model on this host, "
                 f"{workers} at a time)")
        deadline = start + hours * 3600 if hours is not None else None
        todo = dict(sorted(todo.items(), key=lambda kv: -predicted[kv[0]]))  # the longest first
        if workers <= 1:
            progress = Progress(sum(self.runs_left(j) for j in todo.values()))
            for name, job in todo.items():
                self.execute_logged(job, progress, self.may_start(deadline, per_run[name]), job_log)
                if job_log is not None and self.complete(job):
                    job_log.append(job)
            progress.close()
        else:
            self.run_forked(todo, workers, job_log, deadline, per_run)
            jobs.update(todo)
        self.left = [name for name, job in jobs.items() if not self.complete(job)]
        if self.left:
            left_s = sum(per_run[n] * self.runs_left(jobs[n]) for n in self.left)
            self.log(f"stopped: {len(self.left)} of {len(jobs)} jobs unfinished at the limit of {hours} h "
                     f"({left_s / 3600:.2f} h predicted left); rerun with the same job log")
            return None
        return self.results(jobs, variants, transfer)

    def may_start(self, deadline: float | None, run_seconds: float) -> Callable[[], bool]:
        """Whether a training run of `run_seconds` would end by `deadline` (on Study.clock), asked
        before each run (no deadline: always)."""
        return lambda: deadline is None or self.clock() + run_seconds <= deadline

    def execute_logged(self, job: Job, progress: Progress, may_start: Callable[[], bool],
                       job_log: JobLog | None) -> None:
        """execute(job), each training run of it that leaves the job unfinished appended to the job log."""
        for _ in self.execute(job, progress, may_start):
            if job_log is not None and not self.complete(job):
                job_log.append_partial(job)

    def run_forked(self, jobs: dict[str, Job], workers: int, job_log: JobLog | None = None,
                   deadline: float | None = None, per_run: dict[str, float] | None = None) -> None:
        """Run the jobs in `workers` forked processes, in the order given; their results replace the
        jobs in `jobs`. Each finished job is appended to `job_log` as it arrives (each training run
        of an unfinished one by its worker). No run starts that would end past `deadline` (on
        Study.clock; `per_run`: a job's predicted seconds per training run)."""
        if self.device.type == "cuda" and torch.cuda.is_initialized():
            raise RuntimeError("this process has initialized CUDA, so the workers it forks could not use the GPU: "
                               "run the study in a fresh process (python -m gem.study) or with workers=1")
        global _FORKED
        for job in jobs.values():  # the batches are built once, here, and inherited by every worker
            tasks = job.tasks or self.tasks
            for split in ("train", "validation", "held_out"):
                self.data(split, tasks)
        _FORKED = (self, jobs, job_log, deadline, per_run or {})
        progress = Progress(len(jobs))
        try:
            with multiprocessing.get_context("fork").Pool(workers) as pool:
                for done in pool.imap_unordered(_execute_forked, list(jobs)):
                    jobs[done.name] = done
                    if not self.complete(done):  # stopped before a run that would have ended past the deadline
                        progress.step(f"{done.name}: {self.runs_left(done)} training runs left to a later run "
                                      "(the time limit)")
                        continue
                    if job_log is not None:
                        job_log.append(done)
                    progress.step(f"{done.name}: lr {done.lr:g}, held-out NE "
                                  f"{np.mean(done.values('ne')):.4f} over {len(done.seeds)} seeds")
        finally:
            _FORKED = None
            progress.close()

    def results(self, jobs: dict[str, Job], variants: list[dict[str, Any]], transfer: list[str]) -> dict[str, Any]:
        p, t, held = self.preset, self.traffic, self.roles.held_out
        floor = {"ne": t.floor(held, self.tasks), "ne_click": t.floor(held, self.click_tasks),
                 "ne_conversion": t.floor(held, self.conversion_tasks),
                 "tasks": {task: t.floor(held, (task,)) for task in self.tasks}}
        out: dict[str, Any] = {
            "preset": dataclasses.asdict(p), "roles": dataclasses.asdict(self.roles), "floor": floor,
            "tasks": list(self.tasks),
            "left_out_tasks": {task: self.held_out_positives(task) for task in t.tasks(CONVERSION_TYPES)
                               if task not in self.conversion_tasks},  # -> their held-out positives
            "traffic": {"impressions": len(t.user), "clicks": int(t.clicked.sum()),
                        "conversions": int(t.converted.sum())},
            # trial_seeds is how a job resumes: its chosen lr's entry is seeds[0], the others are no result
            "jobs": {name: {k: v for k, v in dataclasses.asdict(j).items() if k not in ("config", "trial_seeds")}
                     | {"config": repr(j.config)} for name, j in jobs.items()},
        }
        matched = {a: jobs[f"{a}@{p.matched}"] for a in ARCHS}
        out["matched"] = {a: {k: _interval(j.values(k)) for k in ("ne", "ne_click", "ne_conversion")}
                          | {"flops": j.flops, "lr": j.lr} for a, j in matched.items()}
        out["matched_diff"] = {a: _interval(list(np.subtract(matched["kunlun"].values("ne"), j.values("ne"))))
                               for a, j in matched.items() if a != "kunlun"}
        scaling: dict[str, Any] = {}
        for arch in ARCHS:
            points = [j for n, j in jobs.items() if n.startswith(f"{arch}@") and j.fraction == 1.0]
            flops = np.array([j.flops for j in points], dtype=np.float64)
            ne = np.array([j.values("ne") for j in points]).T  # (seeds, sizes)
            fitted = len(points) >= 2  # one size has no slope
            ne0, eta = stats.fit_eta(flops, ne.mean(0)) if fitted else (float("nan"), float("nan"))
            scaling[arch] = {"flops": flops.tolist(), "ne": ne.tolist(), "ne0": ne0, "eta": eta,
                             "eta_interval": list(stats.eta_interval(flops, ne)) if fitted else [float("nan")] * 3}
        k, i = scaling["kunlun"], scaling["interformer"]
        scaling["ratio"] = list(stats.ratio_interval(np.array(k["flops"]), np.array(k["ne"]),
                                                    np.array(i["flops"]), np.array(i["ne"])))
        out["scaling"] = scaling
        joint = matched["kunlun"]
        out["transfer"] = []
        for task in transfer:
            alone = jobs[f"alone:{task}"]
            j_ne = [s["tasks"].get(task) for s in joint.seeds]
            a_ne = [s["ne"] for s in alone.seeds]
            ok = all(v is not None for v in j_ne + a_ne)
            out["transfer"].append({
                "task": task, "floor": floor["tasks"][task], "lr_alone": alone.lr,
                "joint": _interval(j_ne) if ok else None, "alone": _interval(a_ne) if ok else None,
                "diff": _interval(list(np.subtract(j_ne, a_ne))) if ok else None,
                "held_out_positives": int((t.eligible(task) & t.label(task) & (t.day == held)).sum())})
        # Data-limited check: the half-data run against the full-data model of the same seed (0).
        out["data_limited"] = [
            {"job": j.name.removesuffix(":half"), "fraction": j.fraction, "lr": j.lr,
             "full_ne": jobs[j.name.removesuffix(":half")].seeds[0]["ne"], "half_ne": j.seeds[0]["ne"],
             "gap": j.seeds[0]["ne"] - jobs[j.name.removesuffix(":half")].seeds[0]["ne"]}
            for j in jobs.values() if j.fraction < 1.0]
        out["calibration"] = {s: _interval([x["calibration"][s] for x in joint.seeds])
                              for s in t.surfaces if all(x["calibration"].get(s) is not None for x in joint.seeds)}
        full = jobs[f"kunlun@{self.ablation_index}"]  # the ablations' reference: full Kunlun of their size
        out["ablations"] = {
            "available": kunlun_switch_names(), "missing": [s for s in ABLATED if s not in kunlun_switch_names()],
            "reference": {"job": full.name, "flops": full.flops, "ne": _interval(full.values("ne"))},
            "variants": [v | {"ne": _interval(jobs[v["job"]].values("ne")), "flops": jobs[v["job"]].flops,
                              "diff": _interval(list(np.subtract(jobs[v["job"]].values("ne"), full.values("ne"))))}
                         for v in variants]}
        out["kunlun_defaults"] = {f.name: repr(f.default) for f in dataclasses.fields(KunlunConfig)
                                  if f.name in ABLATED}
        return out


# The study, its jobs, the job log, the deadline and the jobs' predicted seconds per training run, set
# in the parent just before it forks its workers (which inherit them, so only job names travel to the
# workers and finished jobs back).
_FORKED: tuple[Study, dict[str, Job], JobLog | None, float | None, dict[str, float]] | None = None


_PROBED: tuple[Study, dict[str, Job]] | None = None  # the same, for Study.predict's probe process


def _probe_forked(name: str) -> tuple[float, float]:
    assert _PROBED is not None, "_probe_forked runs only in a process forked by Study.predict"
    study, jobs = _PROBED
    if study.device.type == "cpu":
        torch.set_num_threads(study.preset.threads)
    return study.probe(jobs[name])


class _WorkerLines:
    """A worker's runs as plain lines when the parent draws no bar (a log, CI), else nothing."""

    def __init__(self) -> None:
        self.quiet = sys.stderr.isatty()

    def step(self, text: str) -> None:
        if not self.quiet:
            print(f"  worker {os.getpid()}: {text}", flush=True)


def _execute_forked(name: str) -> Job:
    assert _FORKED is not None, "_execute_forked runs only in a worker forked by Study.run_forked"
    study, jobs, job_log, deadline, per_run = _FORKED
    torch.set_num_threads(study.preset.threads)
    job = jobs[name]
    study.execute_logged(job, _WorkerLines(), study.may_start(deadline, per_run.get(name, 0.0)), job_log)
    return job
