#!/usr/bin/env bash
# GPU run for issue 3 on the H200 (device tool): GPU conformance (captured capacities vs eager), then
# synthesize, export and measure a Qwen3 geometry core. Every stage is time-boxed and logs straight to $OUT.
# Needs the hub files of the Qwen3 repos in .hub/ (carried). Variables: GEOMETRY (0.6B), CAPS (1,4), PREFILL (256).
set -uo pipefail
export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub FLARE_TEST_HUB_CACHE=$PWD/.hub PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/results"
geo=${GEOMETRY:-0.6B}; caps=${CAPS:-1,4}; prefill=${PREFILL:-256}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
timeout ${TESTS_S:-170} python3 -m pytest conformance/test_graphs.py tests/recipes/test_qwen3_captured.py -m gpu \
    -p no:cacheprovider --flare-results "$OUT/results" -q -rs > "$OUT/gpu_tests.log" 2>&1
timeout 60 /usr/bin/time -f "synth_s=%e maxrss_kb=%M" python3 -m ignition.cli synth-checkpoint Qwen/Qwen3-$geo \
    --out /tmp/ckpt --hub-cache .hub --quiet > "$OUT/synth.log" 2>&1
timeout ${EXPORT_S:-200} /usr/bin/time -f "export_wall_s=%e maxrss_kb=%M" python3 -m ignition.cli export \
    --checkpoint /tmp/ckpt --out /tmp/core --hub-cache .hub --capacities "$caps" --prefill-chunks "$prefill" \
    2>&1 | grep -v "it/s\]\|B/s\]" > "$OUT/export.log"
timeout ${MEMORY_S:-150} python3 -m qualify.fixed_memory /tmp/core --json "$OUT/memory.json" > "$OUT/memory.log" 2>&1
tail -3 "$OUT/gpu_tests.log" "$OUT/synth.log" "$OUT/export.log"; cat "$OUT/memory.json" 2>/dev/null | head -30
