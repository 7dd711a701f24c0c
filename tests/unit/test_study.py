"""The quality study (gem.study): traffic labels and day roles, matched-compute sizing, the scaling
fit, and the smoke preset end to end (report and results.json)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from gem.stats import eta_interval, fit_eta
from gem.study.presets import ARCHS
from gem.study.sizing import SizingContext, flops_of, size_to
from gem.study.traffic import DayRoles, batches, simulate
from schemas.tasks import CONVERSION_TYPES
from tests.support import PYTHON, REPO, needs_cuda

LENGTHS = {"impression": 8, "click": 8, "conversion": 4}


@pytest.fixture(scope="module")
def traffic():
    return simulate(days=3, impressions_per_day=4_000, users=200, ads=30)


def test_conversion_labels_follow_the_simulation(traffic):
    """A clicked-and-converted impression is labelled for its ad's conversion type; no other is."""
    out = batches(traffic, (0, 1, 2), 100_000, LENGTHS, shuffle=False)
    b = out[0]
    assert b.size == len(traffic.user)  # no down-sampling: every impression, in order
    types = traffic.conversion_type
    for j, task in enumerate(b.tasks):
        surface, label_type = task.split("/")
        on = traffic.surface == traffic.surfaces.index(surface)
        mask = b.label_mask[:, j].numpy()
        label = b.labels[:, j].numpy() > 0
        if label_type == "click":
            assert (mask == on).all() and (label == (on & traffic.clicked)).all()
        else:
            assert (mask == (on & (types == label_type))).all()
            assert (label == (mask & traffic.clicked & traffic.converted)).all()
    assert traffic.converted.sum() > 0 and not (traffic.converted & ~traffic.clicked).any()
    assert set(np.unique(types)) <= set(CONVERSION_TYPES)


def test_negative_down_sampling_is_importance_weighted(traffic):
    rate = {"click": 0.25}
    out = batches(traffic, (0,), 100_000, LENGTHS, label_types=("click",), negative_rate=rate)[0]
    w, y, m = out.weights.numpy(), out.labels.numpy(), out.label_mask.numpy()
    assert np.allclose(w[m & (y > 0)], 1.0) and np.allclose(w[m & (y == 0)], 4.0) and (w[~m] == 0).all()
    # weighted negatives estimate the unsampled count
    negatives = ((traffic.day == 0) & ~traffic.clicked).sum()
    assert abs(w[m & (y == 0)].sum() / negatives - 1) < 0.1


def test_validation_and_held_out_days_are_distinct():
    roles = DayRoles.consecutive(train_days=2, warmup_days=1)
    assert roles.train == (1, 2) and roles.validation == 3 and roles.held_out == 4
    with pytest.raises(ValueError):
        DayRoles(train=(0,), validation=1, held_out=1)
    with pytest.raises(ValueError):
        DayRoles(train=(0, 1), validation=1, held_out=2)


def test_floor_is_below_the_base_rate(traffic):
    tasks = traffic.tasks(("click",))
    floor = traffic.floor(2, tasks)
    assert 0 < floor < 1


@pytest.mark.parametrize("target", [1e6, 4e6])
def test_matched_compute_sizing_within_ten_percent(target):
    ctx = SizingContext(lengths={"impression": 32, "click": 16, "conversion": 4}, tasks=24, surfaces=6,
                        buckets={"user_id": 512, "ad_id": 64, "surface": 8, "position": 32})
    for arch in ARCHS:
        shape = size_to(arch, target, ctx)
        assert abs(shape.flops / target - 1) <= 0.10, (arch, shape.flops)
        assert flops_of(shape.config, ctx) == shape.flops


def test_scaling_fit_recovers_eta():
    rng = np.random.default_rng(0)
    flops = np.geomspace(1e5, 1e7, 6)
    ne = 1.2 - 0.03 * np.log(flops)[None, :] + rng.normal(0, 0.002, size=(5, 6))
    ne0, eta = fit_eta(flops, ne.mean(0))
    assert abs(eta - 0.03) < 0.003 and abs(ne0 - 1.2) < 0.05
    _mean, lo, hi = eta_interval(flops, ne)
    assert lo < 0.03 < hi and hi - lo < 0.01


def test_smoke_preset_end_to_end(tmp_path):
    from gem.study.__main__ import run_study

    path = run_study("smoke", tmp_path)
    assert path == str(tmp_path / "index.html") and Path(path).is_file()
    html = Path(path).read_text()
    assert "Claims" in html and "Bayes floor" in html
    results = json.loads((tmp_path / "results.json").read_text())
    assert {c["status"] for c in results["claims"]} <= {"reproduced", "not reproduced", "inconclusive"}
    assert len(results["claims"]) == 4
    for arch, m in results["matched"].items():
        assert all(math.isfinite(x) for x in m["ne"]), arch
    assert math.isfinite(results["floor"]["ne"]) and results["floor"]["ne"] < 1
    for job in results["jobs"].values():
        assert job["seeds"] and all(math.isfinite(s["ne"]) for s in job["seeds"])


def test_forked_workers_give_the_serial_numbers():
    """Jobs run by forked worker processes score exactly as when run one after another here."""
    import copy

    from gem.study.presets import PRESETS
    from gem.study.study import Study

    study = Study(PRESETS["smoke"], log=lambda _: None)
    jobs, _, _ = study.plan()
    names = ("dlrm@0", "kunlun@0")

    class Quiet:
        def step(self, text: str) -> None:
            pass

    serial = {n: copy.deepcopy(jobs[n]) for n in names}
    for job in serial.values():
        for _ in study.execute(job, Quiet()):
            pass
    forked = {n: copy.deepcopy(jobs[n]) for n in names}
    study.run_forked(forked, workers=2)

    def numbers(job):
        return job.lr, [{k: v for k, v in s.items() if k != "seconds"} for s in job.seeds]

    assert all(numbers(forked[n]) == numbers(serial[n]) for n in names)
    assert all(forked[n].seeds for n in names)
    # Predicted times probe the models in forked processes side by side, as the workers run them.
    predicted = study.predict({n: jobs[n] for n in names}, workers=2)
    assert set(predicted) == set(names) and all(0 < s < 600 for s in predicted.values())


@needs_cuda
def test_the_gpu_path_trains_in_forked_workers_sharing_the_gpu():
    """The gpu preset's path at the smoke preset's size: bf16 on CUDA, two forked worker processes
    (the parent never initializes CUDA, or its workers could not use it)."""
    code = ("import dataclasses, json; from gem.study.presets import PRESETS; from gem.study.study import Study; "
            "s = Study(dataclasses.replace(PRESETS['smoke'], device='cuda', bf16=True), log=lambda _: None); "
            "jobs, _, _ = s.plan(); sub = {n: jobs[n] for n in ('kunlun@0', 'hstu@0')}; "
            "s.run_forked(sub, workers=2); print(json.dumps({n: [x['ne'] for x in j.seeds] for n, j in sub.items()}))")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    ne = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(ne) == {"kunlun@0", "hstu@0"}
    assert all(len(v) == 2 and all(0 < x < 1.2 for x in v) for v in ne.values()), ne


def test_a_job_log_carries_finished_jobs_into_the_next_run(tmp_path, monkeypatch):
    """A study split over runs: the second run of the same preset reuses the jobs the first logged
    (running none, whatever partial lines precede a finished job's) and reports the same numbers;
    another preset's lines are not reused."""
    import dataclasses

    from gem.study.job_log import JobLog
    from gem.study.presets import PRESETS
    from gem.study.study import Study

    preset = dataclasses.replace(PRESETS["smoke"], ablations=False, transfer_tasks=0)
    log = JobLog(tmp_path / "jobs.jsonl", repr(preset))
    first = Study(preset, log=lambda _: None).run(job_log=log)
    records = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert sum(not r.get("partial") for r in records) == len(first["jobs"])  # one line per job, once finished

    def refuse(*_):
        raise AssertionError("a logged job ran again")

    monkeypatch.setattr(Study, "execute", refuse)
    second_study = Study(preset, log=lambda _: None)
    second = second_study.run(job_log=log)
    assert second_study.restored == set(first["jobs"])
    assert json.dumps(second, sort_keys=True) == json.dumps(first, sort_keys=True)  # NaN intervals compare as text
    other = dataclasses.replace(preset, seeds=3)
    assert JobLog(log.path, repr(other)).restore(Study(other, log=lambda _: None).plan()[0].values()) == set()


@pytest.mark.parametrize("name", ["small", "cpu", "gpu"])
def test_the_study_presets_measure_what_the_claims_need(name):
    """Scaling: the two compared architectures at >= 5 sizes over >= 1.5 decades of FLOPs per
    example, the others at 3 (the published cpu preset: at the matched size only); every number over
    >= 3 seeds, on a validation day apart from the held-out day. The cpu preset trains on >= 1M
    examples (no negative down-sampling: every impression of the training days), reads only conversion
    tasks with >= 200 held-out positives and checks its top sizes at half the data."""
    from gem.study.presets import PRESETS

    p = PRESETS[name]
    assert len(p.targets) >= 5 and math.log10(p.targets[-1] / p.targets[0]) >= 1.5
    assert p.seeds >= 3 and p.matched in p.baseline_targets
    assert p.baseline_targets == (p.matched,) if name == "cpu" else len(p.baseline_targets) >= 3
    if name == "cpu":
        assert p.traffic.impressions_per_day * p.traffic.train_days >= 1_000_000 and not p.negative_rate
        assert p.conversion_min_positives >= 200 and p.data_limited and p.device == "cpu"
        assert p.ablation_target is not None and 0 < p.validation_fraction < 1
    roles = DayRoles.consecutive(p.traffic.train_days, p.traffic.warmup_days)
    assert roles.validation != roles.held_out and roles.validation not in roles.train


def test_a_time_limit_leaves_training_runs_to_the_next_run(tmp_path, monkeypatch):
    """--hours: no training run starts that would end past the limit (the prediction is printed
    first; the run returns no results); an unfinished job's runs are in the job log, and the next run
    trains only the runs it lacks, to the numbers of the job run in one go. A run longer than the
    whole limit is named with the limit it needs. conversion_min_positives: only conversion tasks with
    that many held-out positives are in the study; validation_fraction: the lr is chosen on part of
    its day."""
    import copy
    import dataclasses

    from gem.study import study as study_module
    from gem.study.job_log import JobLog
    from gem.study.presets import PRESETS
    from gem.study.study import Progress, Study

    preset = dataclasses.replace(PRESETS["smoke"], ablations=False, transfer_tasks=0, data_limited=True,
                                 lrs=(3e-3, 1e-3), conversion_min_positives=5, validation_fraction=0.5,
                                 eval_batch_size=512)
    lines: list[str] = []
    study = Study(preset, log=lines.append)
    every = study.traffic.tasks(CONVERSION_TYPES)
    assert set(study.conversion_tasks) == {t for t in every if study.held_out_positives(t) >= 5} != set(every)
    assert all(t in study.tasks for t in study.click_tasks + study.conversion_tasks)
    day = [b.size for b in study.data("validation", study.tasks)]  # a random half of the validation day
    assert sum(day) < sum(b.size for b in study.data("held_out", study.tasks))
    log = JobLog(tmp_path / "jobs.jsonl", repr(preset))
    # Each training run predicted at 15 s, on a (test's) clock that moves 15 s per run trained, and a
    # limit of 65 s: runs start at 0, 15, 30 and 45 s; the one at 60 s would end past the limit.
    trained: list[tuple[tuple[str, int], float, int]] = []  # (the job's model and batches, lr, seed) of each run
    real_run = study_module.run

    def counted(cfg, train, evals, lr, seed, *args):
        trained.append(((repr(cfg), len(train)), lr, seed))
        return real_run(cfg, train, evals, lr, seed, *args)

    def key(job) -> tuple[str, int]:
        return repr(job.config), len(study.data("train", job.tasks or study.tasks, job.fraction))

    monkeypatch.setattr(study_module, "run", counted)
    monkeypatch.setattr(Study, "predict", lambda self, jobs, workers=1: {n: 15.0 * self.runs_left(j)
                                                                           for n, j in jobs.items()})
    study.clock = lambda: 15.0 * len(trained)
    assert study.run(job_log=log, hours=65 / 3600) is None
    assert len(trained) == 4 and any(line.startswith("predicted: ") and " h wall on 1 worker(s)" in line
                                     for line in lines)
    jobs = study.plan()[0]
    first = next(name for name, job in jobs.items() if key(job) == trained[0][0])
    second = next(name for name, job in jobs.items() if key(job) == trained[3][0])
    assert log.finished_in_run == [first] and set(study.left) == set(jobs) - {first}
    records = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert [(r["name"], bool(r.get("partial"))) for r in records] == [(first, True), (first, True), (first, False),
                                                                         (second, True)]

    # The next run: the finished job is restored, the unfinished one trains its 2 missing runs only.
    trained.clear()
    resumed = Study(preset, log=lines.append)
    resumed.clock = lambda: 15.0 * len(trained)
    results = resumed.run(job_log=log)
    assert results is not None and resumed.restored == {first}
    mine = [(lr, seed) for job, lr, seed in trained if job == key(jobs[second])]
    assert mine[0] == (1e-3, 0) and len(mine) == 2  # the second lr of the grid, then seed 1 with the chosen lr
    alone = copy.deepcopy(jobs[second])
    for _ in study.execute(alone, Progress(3)):
        pass

    def numbers(job: dict) -> str:  # as text: the restored runs came through JSON
        return json.dumps([job["lr"], [{k: v for k, v in s.items() if k != "seconds"} for s in job["seeds"]]],
                          sort_keys=True)

    in_one_go = {k: v for k, v in dataclasses.asdict(alone).items() if k not in ("config", "trial_seeds")}
    assert numbers(results["jobs"][second]) == numbers(in_one_go)

    # A limit shorter than one training run of a job: said, with the limit that job needs.
    monkeypatch.setattr(Study, "predict", lambda self, jobs, workers=1: {n: 60.0 * self.runs_left(j)
                                                                           for n, j in jobs.items()})
    lines.clear()
    assert Study(preset, log=lines.append).run(job_log=JobLog(tmp_path / "other.jsonl", repr(preset)),
                                               hours=0.005) is None  # 18 s
    assert any(line.startswith("not in this run: --hours 0.005 is shorter than one training run of ")
               and "a later run needs --hours >= 0.02" in line for line in lines)


def test_every_run_of_a_study_is_recorded_and_the_top_sizes_are_checked_at_half_the_data(tmp_path, monkeypatch):
    """run_study over two runs through one job log: the first (a time limit it cannot meet) publishes
    nothing; the second publishes results.json naming both runs, its wall time their sum.
    data_limited: the top size of each scaled architecture also trains on half the batches, one seed,
    kept out of the scaling fit, its gap to the full data's seed 0 reported."""
    import dataclasses

    from gem.study import __main__ as study_main
    from gem.study.presets import PRESETS, SCALED

    quick = dataclasses.replace(PRESETS["smoke"], ablations=False, transfer_tasks=0, data_limited=True)
    monkeypatch.setitem(study_main.PRESETS, "smoke", quick)
    log = tmp_path / "jobs.jsonl"
    # A first run whose clock reads past its limit as soon as it starts: it starts no job.
    monkeypatch.setattr(study_main.Study, "predict", lambda self, jobs, workers=1: dict.fromkeys(jobs, 1.0))
    real_init = study_main.Study.__init__

    def late_clock(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        ticks = iter([0.0])
        self.clock = lambda: next(ticks, 1e9)

    monkeypatch.setattr(study_main.Study, "__init__", late_clock)
    assert study_main.run_study("smoke", tmp_path / "out", job_log=log, hours=0.5, command="first") is None
    monkeypatch.undo()
    monkeypatch.setitem(study_main.PRESETS, "smoke", quick)
    assert study_main.run_study("smoke", tmp_path / "out", job_log=log, command="second") is not None
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = results["runs"]
    assert [r["command"] for r in runs] == ["first", "second"]
    assert runs[0]["jobs_finished"] == 0 and runs[0]["jobs_left"] == runs[1]["jobs_finished"] == len(results["jobs"])
    assert results["wall_s"] == pytest.approx(sum(r["wall_s"] for r in runs))
    assert runs[1]["host"]["cores"] >= 1 and runs[1]["commit"]
    top = len(quick.targets) - 1
    assert {d["job"] for d in results["data_limited"]} == {f"{a}@{top}" for a in SCALED}
    for d in results["data_limited"]:
        full, half = results["jobs"][d["job"]], results["jobs"][f"{d['job']}:half"]
        assert len(half["seeds"]) == 1 and half["fraction"] == 0.5
        assert half["seeds"][0]["examples"] < full["seeds"][0]["examples"]
        assert d["gap"] == pytest.approx(half["seeds"][0]["ne"] - full["seeds"][0]["ne"])
    assert all(len(results["scaling"][a]["flops"]) == len(quick.targets) for a in SCALED)  # no half-data point

    # Published as a page from the results file, which is kept beside it and regenerates it alike.
    import matplotlib.pyplot as plt

    from gem.study.publish import headline, publish

    readme = tmp_path / "README.md"
    readme.write_text("Intro.\n<!-- study-headline smoke -->old<!-- /study-headline -->\nEnd.\n")
    page = publish(tmp_path / "out" / "results.json", tmp_path / "docs", readme=readme)
    text = page.read_text()
    kept = tmp_path / "docs" / "study-smoke.json"
    assert json.loads(kept.read_text()) == results
    assert f"Generated by `python -m gem.study.publish {kept.as_posix()}`" in text
    assert headline(results) in text and headline(results) in readme.read_text() and "old" not in readme.read_text()
    assert all(f"**{c['status']}**" in text and c["detail"] in text for c in results["claims"])
    assert "`first`" in text and "`second`" in text and "## Data-limited check" in text
    images = [line.split("(")[1].rstrip(")") for line in text.splitlines() if line.startswith("![")]
    assert {"img/study-smoke-matched.png", "img/study-smoke-scaling.png"} <= set(images)
    for image in images:
        pixels = plt.imread(tmp_path / "docs" / image)
        assert pixels.ndim == 3 and pixels.shape[0] < 400 and pixels.shape[1] < 600  # a small PNG
    assert publish(kept, tmp_path / "docs", readme=readme).read_text() == text


def test_a_study_run_trains_through_the_pipelines_trainer_and_scores_with_its_evaluation(monkeypatch):
    """gem.study.runner.run trains with gem.train.trainer.Trainer (its fit called once for epochs x
    batches steps; the run's steps, examples and seconds are Trainer's) and its per-task NE is
    gem.train.evaluate.evaluate's on the same model and batches."""
    import torch

    from gem.study import runner
    from gem.study.presets import PRESETS
    from gem.study.study import Study
    from gem.train.evaluate import evaluate
    from gem.train.trainer import Trainer

    study = Study(PRESETS["smoke"], log=lambda _: None)
    job = study.plan()[0]["kunlun@0"]
    train, held_out = study.data("train", study.tasks), study.data("held_out", study.tasks)
    calls = []
    fit = Trainer.fit

    def recorded_fit(self, *args, **kwargs):
        result = fit(self, *args, **kwargs)
        calls.append((self, result))
        return result

    monkeypatch.setattr(Trainer, "fit", recorded_fit)
    r = runner.run(job.config, train, {"held_out": held_out}, 3e-3, 0, 2, torch.device("cpu"), False)
    assert len(calls) == 1
    trainer, result = calls[0]
    assert trainer.run_dir is None and result.checkpoint is None and trainer.cfg.lr == 3e-3
    assert r.steps == result.steps == 2 * len(train) and r.examples == result.examples == 2 * sum(b.size for b in train)
    assert r.seconds == result.seconds
    reference = evaluate(trainer.task, held_out)
    scores = r.scores["held_out"]
    compared = [t for t in study.tasks if reference[t]["ne"] is not None]
    assert compared
    for t in compared:
        assert scores.ne((t,)) == reference[t]["ne"], t
        assert scores.calibration((t,)) == reference[t]["calibration"], t


def test_a_learning_rate_whose_training_diverges_is_never_chosen(monkeypatch):
    """Trainer stops a run on a NaN or infinite loss: that lr's trial has no validation NE and the job
    goes on with the others; a grid where every lr diverges fails the job with a clear error."""
    import dataclasses

    from gem.study import study as study_module
    from gem.study.presets import PRESETS
    from gem.train.trainer import NonFiniteLossError

    preset = dataclasses.replace(PRESETS["smoke"], lrs=(10.0, 3e-3))
    study = study_module.Study(preset, log=lambda _: None)
    real_run = study_module.run

    def diverging(cfg, train, evals, lr, *args):
        if lr == 10.0:
            raise NonFiniteLossError("step 2: the loss is nan")
        return real_run(cfg, train, evals, lr, *args)

    monkeypatch.setattr(study_module, "run", diverging)

    class Quiet:
        def step(self, text: str) -> None:
            pass

    job = study.plan()[0]["dlrm@0"]
    for _ in study.execute(job, Quiet()):
        pass
    assert job.lr == 3e-3 and job.lr_trials[0] == {"lr": 10.0, "validation_ne": None, "seconds": None, "diverged": True}
    assert len(job.seeds) == preset.seeds
    every = study_module.Study(dataclasses.replace(preset, lrs=(10.0,)), log=lambda _: None)
    with pytest.raises(NonFiniteLossError, match="every learning rate"):
        for _ in every.execute(every.plan()[0]["dlrm@0"], Quiet()):
            pass
