#!/usr/bin/env bash
# What only a GPU can confirm (README), in one run on one CUDA GPU: the GEMM rates of the validated models'
# own shapes against the performance model's curve, measured steps of Llama- and Qwen3-MoE-shaped models (to
# set beside `stepscope compare --system H100-SXM`), the attention speed goal with the Triton kernels,
# the profiler's CUDA categories with a trace, and a CUDA memory snapshot. Each part has its own time limit,
# so one that hangs or fails leaves the others' results.
#
#   bash scripts/gpu_confirm.sh [results-folder [archive-folder]]
#
# Results go to results-folder (default gpu-results). After every part, results-folder.tar.gz (all but the
# trace and the snapshot, archived in results-folder-traces.tar.gz at the end) and the log are refreshed in
# archive-folder (default: beside results-folder), so a run stopped from outside keeps its finished parts.
#
# Needs python3 with a CUDA build of torch, numpy, rich, matplotlib and triton; stepscope runs from src/.
set -u
RESULTS=${1:-gpu-results}
ARCHIVE=${2:-$(dirname "$RESULTS")}
mkdir -p "$RESULTS" "$ARCHIVE"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
S="python3 -m stepscope"
LOG="$RESULTS/log.txt"
# PARTS=op-rates,attention,... runs only those parts (default: all)
PARTS=${PARTS:-all}
part() {  # part SECONDS NAME COMMAND...: run one part under a time limit, its output into the log
  local limit=$1 name=$2
  shift 2
  [ "$PARTS" = all ] || [[ ",$PARTS," == *",$name,"* ]] || return 0
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" | tee -a "$LOG"
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  echo "=== $name: exit ${PIPESTATUS[0]}" | tee -a "$LOG"
  # records and log (small) apart from the profiler trace and the memory snapshot (large)
  tar czf "$ARCHIVE/$(basename "$RESULTS").tar.gz" --exclude='trace*' --exclude='*.pickle' \
    -C "$(dirname "$RESULTS")" "$(basename "$RESULTS")"
  [ "$(cd "$(dirname "$LOG")" && pwd)" = "$(cd "$ARCHIVE" && pwd)" ] || cp "$LOG" "$ARCHIVE/"
}

part 20 environment bash -c "nvidia-smi --query-gpu=name,power.limit,power.max_limit,clocks.max.sm,memory.total \
  --format=csv; python3 -c 'import torch, triton; print(torch.__version__, triton.__version__, \
  torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count)'"
# the SM clock, power and temperature every half second while the rates are measured (sustained or burst)
part 200 op-rates bash -c "nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv \
  -lms 500 > '$RESULTS/op_rates_smi.csv' & $S op-rates --out '$RESULTS/records'; \
  status=\$?; kill \$!; exit \$status"
part 120 step-llama $S step --model llama3-8b --n-layers 4 --seq 2048,8192 --batch 1,2 --precision bf16 \
  --mode train --warmup 3 --iters 8 --device cuda --out "$RESULTS/records"
part 90 step-moe $S step --model qwen3-30b-a3b --n-layers 2 --seq 4096 --batch 1 --precision bf16 \
  --moe-impl grouped,reference --mode train --warmup 2 --iters 5 --device cuda --out "$RESULTS/records"
part 120 attention $S attention --grid gpu-goal --impl sdpa,flash-triton --device cuda --out "$RESULTS/records"
part 50 profile $S profile --model llama3-8b --n-layers 2 --seq 2048 --batch 1 --precision bf16 --device cuda \
  --nvtx --trace "$RESULTS/trace" --out "$RESULTS/records"
part 50 profile-moe $S profile --model qwen3-30b-a3b --n-layers 2 --seq 2048 --batch 1 --precision bf16 \
  --device cuda --trace "$RESULTS/trace-moe" --out "$RESULTS/records"
# the MoE step beside the dense model of equal activated work, and its block piece by piece (issue 30)
part 120 moe-vs-dense $S step --vs-dense --model qwen3-30b-a3b --n-layers 2 --seq 4096 --batch 1 \
  --precision bf16 --warmup 2 --iters 5 --device cuda --out "$RESULTS/records"
part 40 memory $S memory --model small --batch 8 --seq 512 --precision bf16 --device cuda \
  --snapshot "$RESULTS/snapshot.pickle" --out "$RESULTS/records"
part 120 step-compiled $S step --model llama3-8b --n-layers 4 --seq 8192 --batch 1 --precision bf16 --compile \
  --mode train --warmup 3 --iters 8 --device cuda --out "$RESULTS/records"
(cd "$RESULTS" && ls -d trace* ./*.pickle 2>/dev/null | tar czf "$ARCHIVE/$(basename "$RESULTS")-traces.tar.gz" -T -)
echo "results: $ARCHIVE/$(basename "$RESULTS").tar.gz, $ARCHIVE/$(basename "$RESULTS")-traces.tar.gz"
