#!/usr/bin/env bash
# One H200 run for issues 3-7: per geometry a core (decode capacities 1,4; prefill chunks 256, 1024, 4096), then
#   8B:   qualify.gpu_replay (replay vs measured floor, timelines, compiled vs uncompiled, round widths), ignition bench --prefill
#   0.6B: qualify.served_equivalence (served == eager, cache hit == miss), qualify.serve_overhead, gpu_replay
#   then the GPU conformance tests. Each archived run is packed into one .tgz under $OUT (the device returns
#   few files). Every stage is time-boxed; later stages may be cut when the device time runs out.
set -uo pipefail
export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub FLARE_TEST_HUB_CACHE=$PWD/.hub PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; R=/tmp/flare-results; mkdir -p $R
log() { grep -v "Warning\|warn(\|warn_once\|^$\|Online softmax\|split the reduction\|important use case\|softmax\.$" ; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
core() {  # geometry
  [ -d /tmp/ckpt-$1 ] || timeout 90 python3 -m ignition.cli synth-checkpoint Qwen/Qwen3-$1 --out /tmp/ckpt-$1 \
      --hub-cache .hub --quiet >> "$OUT/build.log" 2>&1
  [ -f /tmp/core-$1/core.pb ] || timeout 150 /usr/bin/time -f "export $1 wall_s=%e" python3 -m ignition.cli export \
      --checkpoint /tmp/ckpt-$1 --out /tmp/core-$1 --hub-cache .hub --capacities 1,4 --prefill-chunks 256,1024,4096 2>&1 \
      | grep -E "done in|wall|compiled|rror" >> "$OUT/build.log"
}
replay() {  # geometry
  timeout ${REPLAY_S:-200} python3 -m qualify.gpu_replay --core /tmp/core-$1 --capacities 1,4 --context 1024 \
      --samples 200 --seeds 0,1 --timeline --check-compiled --steps 256 --widths 1,2,4,8 --greedy-variant --out $R/replay-$1 2>&1 | log > "$OUT/replay-$1.log"
  tar czf "$OUT/replay-$1.tgz" -C $R/replay-$1 . 2>/dev/null; tail -n 70 "$OUT/replay-$1.log"
}
core 8B; replay 8B
for chunk in 1024 4096; do  # prefill targets: % of the measured bf16 matmul throughput (same run)
  timeout 120 python3 -m ignition.cli bench /tmp/core-8B --prefill --prefill-chunk-size $chunk --samples 30 \
      --out $R/bench-8B 2>&1 | log | tail -n 4 >> "$OUT/prefill-8B.log"
done
tar czf "$OUT/bench-8B.tgz" -C $R/bench-8B . 2>/dev/null; cat "$OUT/prefill-8B.log"
core 0.6B
timeout 150 python3 -m qualify.served_equivalence /tmp/core-0.6B --max-tokens 64 --prompt-tokens 100 \
    --json "$OUT/served-0.6B.json" 2>&1 | log | grep -v "^ *[0-9]*,\?$" | tail -n 20 > "$OUT/served-0.6B.log"; cat "$OUT/served-0.6B.log"
timeout 120 python3 -m qualify.serve_overhead /tmp/core-0.6B --requests 4 --max-tokens 64 --json "$OUT/overhead-0.6B.json" \
    2>&1 | log | tail -n 5 > "$OUT/overhead-0.6B.log"
python3 -c "import json; d=json.load(open('$OUT/overhead-0.6B.json')); print(json.dumps(d['by_batch'], indent=1))" 2>&1 | head -30
replay 0.6B
timeout ${TESTS_S:-300} python3 -m pytest conformance/test_graphs.py tests/recipes/test_qwen3_captured.py \
    tests/components/test_components_gpu.py conformance/test_speculative.py conformance/test_memory.py -p no:cacheprovider --flare-results $R/tests -q -rs 2>&1 | log > "$OUT/gpu_tests.log"
tar czf "$OUT/gpu-tests.tgz" -C $R/tests . 2>/dev/null; tail -n 4 "$OUT/gpu_tests.log"; cat "$OUT/build.log"
# one archive of everything (the device returns only a few files): logs, JSON, packed runs
tar czf /tmp/all.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/all.tgz "$OUT/h200-qualify.tgz"
