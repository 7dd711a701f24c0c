"""Solaris precompute: elastic scaling, incremental cost, and (on a GPU) forward throughput vs roofline.

    python -m bench.precompute [--users 6000,30000 --impressions 4 --ads 200 --shards 8]
    python -m bench.precompute --gpu-only              # only the roofline part (needs CUDA)

One run, side by side, on a synthetic lakehouse written without Spark (gem.precompute.synthetic_lakehouse:
real Delta tables, the pipeline's default Kunlun width with random weights) of two days, everyone
active on day 1 and `--changed` of the users on day 2, once per `--users` size:
  1. day 1 (a refresh, every user active) on a local Spark session with 1 task slot, then again
     with 2 (local[1], local[2]; one single-threaded task per slot): users per second = users
     computed / wall seconds of the whole stage (plan, Python workers' start and model loads,
     commits, stats included; the session's own start excluded), and over the shard tasks alone
     (first task started to last finished);
  2. day 2 incremental (only the changed users), then the same day as a full recompute
     (model_refresh_days 1): wall seconds of the stage (both compute the same predictions and
     speculative pairs of day 2's active users) and task seconds of the user embeddings.
A small day cannot amortize what a larger one can: each Python worker's interpreter start, imports
and model load, up to a shard's worth of imbalance at the end, and each shard's fixed reads beside
the embeddings of few changed users; hence one run per size.
Before those, the speculative-pair policy on the event generator's own traffic at the demo's volumes.
On CUDA only: the precompute forward (predict: body + heads) in bf16 on synthetic full-length
batches, FLOPs from gem.model.flops, against the roofline min(matmul peak, arithmetic intensity x
copy bandwidth), both timed in the same run; bytes per batch counted as the weights plus the
batch's inputs and outputs read or written once (a lower bound, so the roofline is an upper bound).
Published through bench.results: the CPU figures as `precompute`, the GPU ones as
`precompute_roofline` (each only when its part ran; --policy-only publishes nothing).
"""

from __future__ import annotations

import datetime as dt
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import torch
import typer

from bench.gpu_train import matmul_peak_tflops, synthetic_inputs
from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import run_function
from gem.config import load_config
from gem.data.encode import DENSE_COLUMNS
from gem.data.loader import SPARSE_FEATURES
from gem.model.build import build_task
from gem.model.flops import model_flops
from gem.precompute import speculative
from gem.study.traffic import simulate


def lakehouse_config(root: Path, users: int, shards: int, **precompute: Any) -> Any:
    # The pipeline's default Kunlun (width 32); tables sized to the synthetic ids.
    buckets = {"user_id": 50_000, "ad_id": 1_000, "advertiser_id": 1_000, "campaign_id": 1_000, "surface": 8,
               "objective": 8, "creative_type": 8, "position": 65}
    # Imported here, as in cpu_bench: `--gpu-only` runs on the GPU image, which has no deltalake.
    from gem.precompute.synthetic_lakehouse import START  # noqa: PLC0415

    return load_config(overrides={
        "lakehouse_uri": str(root / "lakehouse"), "start_ds": START, "attribution_window_days": 0,
        "model": {"arch": "kunlun", "embeddings": {"buckets": buckets}},
        "precompute": {"shards": shards, **precompute}}, environ={})


@dataclass(frozen=True)
class World:
    """The synthetic lakehouse of one CPU run: its users and ads, the share of users active (changed)
    on day 2, the impressions per active user and day, and precompute's shards."""

    users: int
    changed: float
    impressions: int
    ads: int
    shards: int


def cpu_bench(world: World) -> dict[str, float]:
    # The lakehouse half imports deltalake, which the GPU image (`--gpu-only`) does not have.
    from gem.lakehouse.commit import StageContext  # noqa: PLC0415
    from gem.lakehouse.spark import get_spark  # noqa: PLC0415
    from gem.precompute.run import run  # noqa: PLC0415
    from gem.precompute.synthetic_lakehouse import build_days, promote_model, publish_training_records  # noqa: PLC0415

    root = Path(tempfile.mkdtemp(prefix="gem-bench-precompute-"))
    cfg = lakehouse_config(root, world.users, world.shards)
    t0 = time.time()
    _, days = build_days(cfg, 2, users=world.users, ads=world.ads, active_share=world.changed,
                         impressions_per_user=world.impressions)
    promote_model(cfg, days[0])
    publish_training_records(cfg, days[1])
    print(f"lakehouse of {world.users} users ({world.impressions} impressions each a day active), 2 days, in "
          f"{time.time() - t0:.1f}s at {root}")
    out: dict[str, float] = {}
    # Elastic scaling on day 1, where every user is active: embeddings, predictions and pairs of all.
    scaling = {}
    for w in (1, 2):
        session_cfg = load_config(overrides={**cfg.to_dict(), "spark": {"master": f"local[{w}]"}}, environ={})
        spark = get_spark(session_cfg, app_name=f"bench-precompute-{w}")
        try:
            scaling[w] = run(StageContext(session_cfg, spark), days[0])
        finally:
            spark.stop()  # the next size starts its own session with its own task slots
    for w, result in scaling.items():
        users = result.details["users_computed"]
        out[f"users_per_s_{w}w"] = users / result.seconds
        out[f"shard_users_per_s_{w}w"] = users / result.details["shards_window_s"]
        print(f"day 1 (everyone active, a refresh), {w} task slot(s): {users} users in {result.seconds:.1f}s = "
              f"{out[f'users_per_s_{w}w']:.0f} users/s for the stage; {out[f'shard_users_per_s_{w}w']:.0f} users/s "
              f"from the first shard task started to the last finished ({result.details['shards_window_s']:.1f}s)")
    out["speedup_2w"] = out["users_per_s_2w"] / out["users_per_s_1w"]
    out["shard_speedup_2w"] = out["shard_users_per_s_2w"] / out["shard_users_per_s_1w"]
    print(f"2 task slots / 1: {out['speedup_2w']:.2f}x for the stage, {out['shard_speedup_2w']:.2f}x over the "
          f"shards (goal >= 1.7x)")
    # Day 2: incremental after day 1, then the same day as a full recompute.
    incremental = run(StageContext(cfg), days[1])
    full = run(StageContext(lakehouse_config(root, world.users, world.shards, model_refresh_days=1)), days[1])
    changed = incremental.details["users_computed"] / incremental.details["users_total"]
    out["changed_share"] = changed
    out["incremental_share"] = incremental.seconds / full.seconds
    inc, tot = incremental.details["shard_seconds"], full.details["shard_seconds"]
    out["incremental_embedding_share"] = inc["embeddings"] / tot["embeddings"]
    print(f"day 2 incremental ({changed:.1%} of users changed): {incremental.seconds:.1f}s = "
          f"{out['incremental_share']:.1%} of the full recompute's {full.seconds:.1f}s for the stage; the user "
          f"embeddings {inc['embeddings']:.2f}s = {out['incremental_embedding_share']:.1%} of {tot['embeddings']:.2f}s "
          f"(goal <= 15%)")
    print("task seconds by phase, incremental / full: " + ", ".join(
        f"{p} {inc[p]:.2f} / {tot[p]:.2f}" for p in tot))
    print(f"speculative pairs of day 1 on day 2: hit rate {incremental.details['hit_rate']:.1%}, wasted "
          f"{incremental.details['wasted_share']:.1%}, model age {incremental.details['model_age_days']} d, "
          f"input age {incremental.details['input_age_days']} d")
    return out


def policy_on_generator_traffic(users: int, ads: int, impressions: int, days: int, recent: int,
                                popular: int) -> dict[str, float]:
    """The speculative-pair policy (gem.precompute.speculative) on the event generator's own traffic
    (gem.study.traffic.simulate: the demo's world at its volumes, no Spark): pairs chosen from each
    day's impressions, checked against the next day's. -> mean hit rate, wasted share, pairs per user."""
    t = simulate(days, impressions, users, ads)
    origin = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    hit_rates, wasted, per_user = [], [], []
    for day in range(days - 1):
        seen = np.flatnonzero(t.day <= day)  # the users' impressions up to the end of `day`, oldest first
        order = seen[np.lexsort((t.time_ms[seen], t.user[seen]))]
        active = np.unique(t.user[t.day == day])
        rows = order[np.isin(t.user[order], active)]
        users_of = t.user[rows]
        starts = np.flatnonzero(np.r_[True, users_of[1:] != users_of[:-1]])
        offsets = np.r_[starts, len(rows)].astype(np.int32)
        elements = pa.StructArray.from_arrays(
            [pa.array([f"a{a}" for a in t.ad[rows]]), pa.array([t.surfaces[s] for s in t.surface[rows]]),
             pa.array(origin + dt.timedelta(milliseconds=int(ms)) for ms in t.time_ms[rows])],
            names=["ad_id", "surface", "event_time"])
        table = pa.table({"user_id": pa.array([f"u{u}" for u in users_of[starts]]),
                          "impressions": pa.ListArray.from_arrays(pa.array(offsets), elements)})
        ds = (origin + dt.timedelta(days=day)).date().isoformat()
        top = speculative.popular_ads(speculative.day_impressions(table, ds), popular)
        pairs = speculative.choose_pairs(table, top, recent)
        chosen = pa.table({"user_id": [p.user_id for p in pairs], "ad_id": [p.ad_id for p in pairs],
                           "sequence_ds": pa.array([dt.date.fromisoformat(ds)] * len(pairs), pa.date32())})
        tomorrow = t.day == day + 1
        served = pa.table({"user_id": [f"u{u}" for u in t.user[tomorrow]], "ad_id": [f"a{a}" for a in t.ad[tomorrow]]})
        measured = speculative.measure(served, chosen, (origin + dt.timedelta(days=day + 1)).date().isoformat())
        hit_rates.append(measured.hit_rate)
        wasted.append(measured.wasted_share)
        per_user.append(len(pairs) / len(active))
    out = {"hit_rate": float(np.mean(hit_rates)), "wasted_share": float(np.mean(wasted)),
           "pairs_per_active_user": float(np.mean(per_user))}
    print(f"policy (recent {recent}, popular {popular}) on the generator's traffic ({users} users, {ads} ads, "
          f"{impressions:,} impressions a day, {days} days): hit rate {out['hit_rate']:.1%}, wasted "
          f"{out['wasted_share']:.1%}, {out['pairs_per_active_user']:.1f} pairs per active user")
    return out


def gpu_bench(batch: int, steps: int) -> dict[str, float] | None:
    """The precompute forward on CUDA in bf16 against its roofline; None without CUDA."""
    if not torch.cuda.is_available():
        print("no CUDA: the forward roofline part is skipped")
        return None

    device = torch.device("cuda")
    cfg = load_config(environ={}).model
    tasks = tuple(f"{s}/{t}" for s, t in load_config(environ={}).tasks)
    task = build_task(cfg, tasks, SPARSE_FEATURES, len(DENSE_COLUMNS), sparse_backend="torch").to(device).eval()
    lengths = cfg.sequence_lengths()
    sparse_ids, dense, seq, _ = synthetic_inputs(batch, cfg.kunlun.dim, lengths, device)
    dense = dense[:, : len(DENSE_COLUMNS)]

    def forward() -> torch.Tensor:
        sparse = {f: task.embeddings.lookup(f, v) for f, v in sparse_ids.items()}
        sequences = {e: {"id_emb": task.embeddings.lookup("ad_id", s["ids"]),
                         **{k: s[k] for k in ("surface", "objective", "gap_s", "offsets")}} for e, s in seq.items()}
        return torch.sigmoid(task.heads(task.body(sparse, dense, sequences)))

    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        for _ in range(3):
            out = forward()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(steps):
            out = forward()
        end.record()
        torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / steps
    flops = model_flops(cfg, len(SPARSE_FEATURES), len(DENSE_COLUMNS), len(tasks), len({t.split("/")[0] for t in tasks}))
    achieved = flops["total"] * batch / seconds / 1e12
    weights = sum(p.numel() * 2 for n, p in task.named_parameters() if not n.startswith("embeddings."))
    inputs = sum(t.numel() * t.element_size() for t in [dense, *sparse_ids.values()]) + sum(
        v.numel() * v.element_size() for s in seq.values() for v in s.values())
    rows = batch * (len(SPARSE_FEATURES) + sum(lengths.values())) * cfg.kunlun.dim * 2  # embedding rows read
    moved = weights + inputs + rows + out.numel() * out.element_size()
    peak = matmul_peak_tflops(device, torch.bfloat16, 8192)
    src = torch.empty(1 << 28, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    bandwidth = 2 * src.numel() * 10 / (time.perf_counter() - t0)  # bytes read + written per second
    roofline = min(peak, flops["total"] * batch / moved * bandwidth / 1e12)
    print(f"forward: {batch / seconds:,.0f} examples/s, {achieved:.1f} TFLOP/s; roofline {roofline:.1f} TFLOP/s "
          f"(matmul peak {peak:.0f}, {bandwidth / 1e12:.2f} TB/s x {flops['total'] * batch / moved:.1f} FLOP/byte): "
          f"{achieved / roofline:.1%} of it (goal >= 80%)")
    return {"examples_per_s": batch / seconds, "tflops": achieved, "roofline_tflops": roofline,
            "roofline_share": achieved / roofline, "matmul_peak_tflops": peak, "copy_tb_per_s": bandwidth / 1e12,
            "flop_per_byte": flops["total"] * batch / moved}


def command_line(
    users: Annotated[str, typer.Option(
        help="users of the synthetic lakehouse, comma-separated for one run per size")] = "6000,30000",
    changed: Annotated[float, typer.Option(help="share of users active (changed) on day 2")] = 0.1,
    impressions: Annotated[int, typer.Option(help="impressions per active user and day")] = 4,
    ads: Annotated[int, typer.Option()] = 200,
    shards: Annotated[int, typer.Option()] = 8,
    gpu_batch: Annotated[int, typer.Option()] = 4096,
    gpu_steps: Annotated[int, typer.Option()] = 20,
    gpu_only: Annotated[bool, typer.Option("--gpu-only")] = False,
    policy_only: Annotated[bool, typer.Option(
        "--policy-only", help="only the pair policy on generator traffic (printed, not published)")] = False,
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> dict[str, Any]:
    try:
        sizes = [int(x) for x in users.split(",")]
    except ValueError:
        raise typer.BadParameter(f"{users!r} is not comma-separated numbers", param_hint="--users") from None
    results: dict[str, Any] = {}
    if not gpu_only:
        demo = load_config(Path(__file__).resolve().parent.parent / "configs" / "demo.yaml", environ={})
        defaults = demo.precompute
        results["policy"] = policy_on_generator_traffic(demo.generator.users, demo.generator.ads,
                                                        demo.generator.events_per_day, 3, defaults.recent_ads,
                                                        defaults.popular_ads)
    worlds = [World(size, changed, impressions, ads, shards) for size in sizes]
    if not (gpu_only or policy_only):
        # Per size: the fixed costs (Python workers' start, imports and model loads, each shard's reads)
        # weigh on a small day and fade on a larger one.
        results["cpu"] = {world.users: cpu_bench(world) for world in worlds}
        if len(sizes) > 1:
            print("by size: " + "; ".join(
                f"{size} users: 2 task slots {r['speedup_2w']:.2f}x (shards {r['shard_speedup_2w']:.2f}x), "
                f"10%-changed embeddings {r['incremental_embedding_share']:.1%} of full"
                for size, r in results["cpu"].items()))
    results["gpu"] = None if policy_only else gpu_bench(gpu_batch, gpu_steps)
    if results.get("cpu"):
        publish_cpu(results["cpu"], results["policy"], worlds[0], results_dir)
    if results["gpu"] is not None:
        publish_gpu(results["gpu"], gpu_batch, gpu_steps, results_dir)
    return results


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    """The policy's, the CPU runs' and the GPU's figures (None after --help)."""
    return run_function(command_line, argv, prog="python -m bench.precompute", help=__doc__.splitlines()[0])


def publish_cpu(by_size: dict[int, dict[str, float]], policy: dict[str, float], world: World,
                results_dir: Path) -> None:
    """The CPU figures of every size (`world`: any size's, for what the sizes share), and the
    policy's, as the `precompute` result."""
    figures = []
    for users, r in by_size.items():
        key, who = f"users{users}", f"{users:,} users"
        figures += [
            Figure(f"{key}_users_per_s_1w", f"{who}, day 1 (a refresh), local[1]: whole stage",
                   round(r["users_per_s_1w"]), "users/s"),
            Figure(f"{key}_users_per_s_2w", f"{who}, day 1 (a refresh), local[2]: whole stage",
                   round(r["users_per_s_2w"]), "users/s"),
            Figure(f"{key}_speedup_2w", f"{who}: local[2] / local[1], whole stage", round(r["speedup_2w"], 2), "x"),
            Figure(f"{key}_shard_speedup_2w", f"{who}: local[2] / local[1], first shard task started to last finished",
                   round(r["shard_speedup_2w"], 2), "x"),
            Figure(f"{key}_incremental_share", f"{who}: day 2 incremental ({r['changed_share']:.0%} of users "
                   "changed) / full recompute, whole stage", round(100 * r["incremental_share"], 1), "%"),
            Figure(f"{key}_incremental_embedding_share", f"{who}: day 2 incremental / full recompute, "
                   "user-embedding task seconds", round(100 * r["incremental_embedding_share"], 1), "%"),
        ]
    figures += [
        Figure("policy_hit_rate", "speculative pairs on generator traffic: hit rate",
               round(100 * policy["hit_rate"], 1), "%"),
        Figure("policy_wasted_share", "speculative pairs on generator traffic: wasted share",
               round(100 * policy["wasted_share"], 1), "%"),
        Figure("policy_pairs_per_active_user", "speculative pairs per active user",
               round(policy["pairs_per_active_user"], 1)),
    ]
    record("precompute", "Precompute on the CPU: 2 Spark task slots against 1, an incremental day against a full recompute",
           figures, notes=f"{world.impressions} impressions per active user and day, {world.ads} ads, "
                          f"{world.shards} shards; one single-threaded torch task per Spark task slot.", results_dir=results_dir)


def publish_gpu(gpu: dict[str, float], batch: int, steps: int, results_dir: Path) -> None:
    """The forward's figures on CUDA as the `precompute_roofline` result."""
    record("precompute_roofline", "Precompute forward on a GPU (bf16) against its roofline", [
        Figure("examples_per_s", "forward, bf16", round(gpu["examples_per_s"]), "examples/s"),
        Figure("tflops", "forward, model FLOPs", round(gpu["tflops"], 2), "TFLOP/s"),
        Figure("roofline_tflops", "roofline: min(matmul peak, FLOP/byte x copy bandwidth)",
               round(gpu["roofline_tflops"], 1), "TFLOP/s"),
        Figure("roofline_share", "forward / roofline", round(100 * gpu["roofline_share"], 2), "%"),
        Figure("matmul_peak_tflops", "matmul peak, timed in the same run (8192^3 bf16)",
               round(gpu["matmul_peak_tflops"]), "TFLOP/s"),
        Figure("copy_tb_per_s", "copy bandwidth, timed in the same run", round(gpu["copy_tb_per_s"], 2), "TB/s"),
    ], notes=f"the demo's model, batch {batch}, {steps} steps.", results_dir=results_dir)


if __name__ == "__main__":
    main()
