"""Solaris precompute: elastic scaling, incremental cost, and (on a GPU) forward throughput vs roofline.

    python -m bench.precompute [--users 6000 --impressions 4 --shards 16]
    python -m bench.precompute --gpu-only              # only the roofline part (needs CUDA)

One run, side by side, on a synthetic lakehouse written without Spark (tests/precompute_lakehouse.py:
real Delta tables, the pipeline's default Kunlun width with random weights) of two days, everyone
active on day 1 and `--changed` of the users on day 2:
  1. day 1 precomputed (a refresh: every user), day 2 incremental: only the changed users;
  2. day 2 again as a full recompute (model_refresh_days 1) with 1 worker, then with 2 single-threaded
     workers (this process and one more): users per second = users computed / wall seconds of the
     whole stage (plan, model loads, worker start, commits, stats included);
  3. cost of the incremental day against the full recompute of the same day (wall seconds; both
     compute the same predictions and speculative pairs of day 2's active users).
On CUDA only: the precompute forward (predict: body + heads) in bf16 on synthetic full-length
batches, FLOPs from gem.model.flops, against the roofline min(matmul peak, arithmetic intensity x
copy bandwidth), both measured in the same run; bytes per batch counted as the weights plus the
batch's inputs and outputs read or written once (a lower bound, so the roofline is an upper bound).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gem.lakehouse.commit import StageContext


def lakehouse_config(root: Path, users: int, shards: int, **precompute: Any) -> Any:
    from tests.support import make_config

    # The pipeline's default Kunlun (width 32); tables sized to the synthetic ids.
    buckets = {"user_id": 50_000, "ad_id": 1_000, "advertiser_id": 1_000, "campaign_id": 1_000, "surface": 8,
               "objective": 8, "creative_type": 8, "position": 65}
    return make_config(root, start_ds="2026-01-01", attribution_window_days=0,
                       model={"arch": "kunlun", "embeddings": {"buckets": buckets}},
                       precompute={"shards": shards, "lease_expiry_s": 30.0, **precompute})


def cpu_bench(args: argparse.Namespace) -> dict[str, float]:
    from gem.precompute.run import run
    from tests.precompute_lakehouse import build_days, promote_model, publish_training_records

    root = Path(tempfile.mkdtemp(prefix="gem-bench-precompute-"))
    cfg = lakehouse_config(root, args.users, args.shards)
    t0 = time.time()
    _, days = build_days(cfg, 2, users=args.users, ads=200, active_share=args.changed)
    promote_model(cfg, days[0])
    publish_training_records(cfg, days[1])
    print(f"lakehouse of {args.users} users, 2 days, in {time.time() - t0:.1f}s at {root}")
    out: dict[str, float] = {}
    first = run(StageContext(cfg), days[0], workers=1)
    print(f"day 1 (refresh): {first.details['users_computed']} users in {first.seconds:.1f}s")
    incremental = run(StageContext(cfg), days[1], workers=1)
    full_cfg = lakehouse_config(root, args.users, args.shards, model_refresh_days=1)
    full = {w: run(StageContext(full_cfg), days[1], workers=w) for w in (1, 2)}
    for w, result in full.items():
        users = result.details["users_computed"]
        out[f"users_per_s_{w}w"] = users / result.seconds
        out[f"shard_users_per_s_{w}w"] = users / result.details["shards_window_s"]
        print(f"day 2 full recompute, {w} worker(s): {users} users in {result.seconds:.1f}s = "
              f"{out[f'users_per_s_{w}w']:.0f} users/s for the stage; {out[f'shard_users_per_s_{w}w']:.0f} users/s "
              f"from the first shard claimed to the last done ({result.details['shards_window_s']:.1f}s)")
    out["speedup_2w"] = out["users_per_s_2w"] / out["users_per_s_1w"]
    out["shard_speedup_2w"] = out["shard_users_per_s_2w"] / out["shard_users_per_s_1w"]
    print(f"2 workers / 1 worker: {out['speedup_2w']:.2f}x for the stage, {out['shard_speedup_2w']:.2f}x over the "
          f"shards (goal >= 1.7x)")
    changed = incremental.details["users_computed"] / incremental.details["users_total"]
    out["incremental_share"] = incremental.seconds / full[1].seconds
    inc, tot = incremental.details["shard_seconds"], full[1].details["shard_seconds"]
    out["incremental_embedding_share"] = inc["embeddings"] / tot["embeddings"]
    print(f"day 2 incremental ({changed:.1%} of users changed): {incremental.seconds:.1f}s = "
          f"{out['incremental_share']:.1%} of the full recompute's {full[1].seconds:.1f}s for the stage; the user "
          f"embeddings {inc['embeddings']:.2f}s = {out['incremental_embedding_share']:.1%} of {tot['embeddings']:.2f}s "
          f"(goal <= 15%)")
    print("worker seconds by phase, incremental / full: " + ", ".join(
        f"{p} {inc[p]:.2f} / {tot[p]:.2f}" for p in tot))
    print(f"speculative pairs of day 1 on day 2: hit rate {incremental.details['hit_rate']:.1%}, wasted "
          f"{incremental.details['wasted_share']:.1%}, model age {incremental.details['model_age_days']} d, "
          f"input age {incremental.details['input_age_days']} d")
    return out


def gpu_bench(batch: int, steps: int) -> dict[str, float] | None:
    """The precompute forward on CUDA in bf16 against its roofline; None without CUDA."""
    if not torch.cuda.is_available():
        print("no CUDA: the forward roofline measurement is skipped")
        return None
    from bench.gpu_train import matmul_peak_tflops, synthetic_inputs
    from gem.config import load_config
    from gem.data.encode import DENSE_COLUMNS
    from gem.data.loader import SPARSE_FEATURES
    from gem.model.build import build_task
    from gem.model.flops import model_flops

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
    return {"tflops": achieved, "roofline_tflops": roofline, "roofline_share": achieved / roofline}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=6000)
    parser.add_argument("--changed", type=float, default=0.1, help="share of users active (changed) on day 2")
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--gpu-batch", type=int, default=4096)
    parser.add_argument("--gpu-steps", type=int, default=20)
    parser.add_argument("--gpu-only", action="store_true")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    if not args.gpu_only:
        results["cpu"] = cpu_bench(args)
    results["gpu"] = gpu_bench(args.gpu_batch, args.gpu_steps)
    return results


if __name__ == "__main__":
    main()
