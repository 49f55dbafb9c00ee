#!/usr/bin/env bash
# numpy vs C data path, interleaved, 3 repeats: switch alone (switch on core 0, generator on core 1) and bench
set -u
cd "$(dirname "$0")/../../.."  # the repository root
S=".venv/bin/stepscope"
OUT=${1:-innet-data-paths}
mkdir -p $OUT
for rep in 1 2 3; do
  for path in numpy c; do
    export STEPSCOPE_INNET_DATA_PATH=$path
    port=$((39500 + rep * 10 + ${#path}))
    taskset -c 0 $S innet switch --port $port --no-records --duration-s 600 > $OUT/switch-$path-$rep.log 2>&1 &
    sw=$!
    sleep 2
    taskset -c 1 $S innet switch-bench --switch 127.0.0.1:$port --payload 1K,16K --repeats 1 --duration-s 2 --out $OUT/sw-$path-$rep > $OUT/swbench-$path-$rep.txt 2>&1
    kill $sw; wait $sw 2>/dev/null
    for vpp in 256 4096; do
      $S innet bench --world 2 --sizes 4M --call-mode per-op --iters 5 --warmup 2 --values-per-packet $vpp --out $OUT/bench-$path-$rep > $OUT/bench-$path-$vpp-$rep.txt 2>&1
    done
  done
done
# exact under faults: int32 sums checked element by element, C path
for v in 256 4096; do
  STEPSCOPE_INNET_DATA_PATH=c $S innet bench --world 2 --sizes 4M --call-mode per-op --iters 3 --warmup 1 --dtype int32 \
    --check --drop 0.05 --duplicate 0.01 --reorder 0.01 --values-per-packet $v --out $OUT/check
done
echo done $OUT
