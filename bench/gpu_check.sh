#!/usr/bin/env bash
# Every GPU check in one device call: the GPU test tier (correctness), every GPU timing
# (bench.gpu_train's models and layouts, the precompute forward against its roofline), then the
# quality study's gpu preset, given what is left of TOTAL_SECONDS (default 570: one 10-minute call).
# Each part's output lands in OUT_DIR; the study's report as one tarball; the benches' published
# results (bench.results) in OUT_DIR/benchmarks, to copy into docs/benchmarks/.
#
#   bash bench/gpu_check.sh OUT_DIR [TOTAL_SECONDS]
#   PARTS="tests train sharing" bash bench/gpu_check.sh OUT_DIR   # some parts only
#   PARTS=study STUDY_JOB_LOG=.gpu/study_jobs.jsonl bash bench/gpu_check.sh OUT_DIR   # resume a study
#
# Parts: tests, train (bench.gpu_train), precompute (bench.precompute --gpu-only), sharing
# (bench.study_sharing: how many processes the study's GPU workers pay), study (default: all but sharing).
# Runs under the machine's own python3 (torch with CUDA; no torchrec, Spark or Delta needed).
set -uo pipefail
out=${1:?usage: bash bench/gpu_check.sh OUT_DIR [TOTAL_SECONDS]}
total_seconds=${2:-570}
export GEM_CODE_VERSION=${GEM_CODE_VERSION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out"
lake=$(mktemp -d)
started=$SECONDS
parts=" ${PARTS:-tests train precompute study} "
part() { echo "== $1 (at ${SECONDS}s)"; }
wanted() { [[ $parts == *" $1 "* ]]; }

part environment
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  $py -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__,
  'triton', triton.__version__, torch.cuda.get_device_name(), torch.cuda.get_device_capability())"
} 2>&1 | tee "$out/environment.txt"

wanted tests && part "GPU test tier" && timeout 300 $py -m pytest -q -m gpu -p no:cacheprovider \
  tests/unit/test_kunlun.py tests/unit/test_heads.py tests/unit/test_study.py tests/unit/test_bench_smoke.py 2>&1 | tee "$out/gpu_tests.txt"

wanted train && part "training throughput: Kunlun jagged and padded, HSTU (bf16)" \
  && timeout 180 $py -m bench.gpu_train --results-dir "$out/benchmarks" 2>&1 | tee "$out/gpu_train.txt"

wanted precompute && part "precompute forward against its roofline (bf16)" \
  && timeout 120 $py -m bench.precompute --gpu-only --results-dir "$out/benchmarks" 2>&1 \
  | tee "$out/precompute_roofline.txt"

wanted sharing && part "study workers sharing the GPU" \
  && timeout 200 $py -m bench.study_sharing --results-dir "$out/benchmarks" 2>&1 \
  | tee "$out/study_sharing.txt"

if wanted study; then
  study_seconds=$((total_seconds - SECONDS))
  part "quality study, gpu preset (at most ${study_seconds}s)"
  # Finished jobs go to a job log as they finish; STUDY_JOB_LOG (an earlier call's, carried along)
  # seeds it, so a study too long for one call finishes over several.
  if [ -n "${STUDY_JOB_LOG:-}" ]; then cp "$STUDY_JOB_LOG" "$out/study_jobs.jsonl"; fi
  GEM__LAKEHOUSE_URI="$lake" timeout "$study_seconds" $py -m gem.study --preset gpu \
    --job-log "$out/study_jobs.jsonl" 2>&1 | tee "$out/study.txt"
  if [ -d "$lake/_reports/study/gpu" ]; then
    tar czf "$out/study_gpu_report.tgz" -C "$lake/_reports/study" gpu
  fi
fi
part "done in $((SECONDS - started))s"
