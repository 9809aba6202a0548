#!/usr/bin/env bash
# GPU run for issue 3 on the H200 (device tool): GPU conformance + recipe GPU tests, then synthesize,
# export and measure Qwen3-0.6B (and, with STAGE=8b, Qwen3-8B) geometry cores. Writes logs under $OUT.
# Needs the hub files of Qwen3-0.6B/8B in .hub/ (carried; see README "GPU runs").
set -uo pipefail
export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub FLARE_TEST_HUB_CACHE=$PWD/.hub PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/results"
STAGE=${STAGE:-tests}
py=python3
if [ "$STAGE" = tests ]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
  $py -m pytest conformance/test_graphs.py tests/recipes tests/core -m "gpu or not gpu" -p no:cacheprovider \
      --flare-results "$OUT/results" -q -rs 2>&1 | tail -40 | tee "$OUT/gpu_tests.log"
fi
for geo in ${GEOMETRIES:-0.6B}; do
  repo=Qwen/Qwen3-$geo
  /usr/bin/time -f "synth_s=%e maxrss_kb=%M" $py -m ignition.cli synth-checkpoint $repo --out /tmp/ckpt-$geo \
      --hub-cache .hub --quiet 2>&1 | tail -3 | tee "$OUT/synth-$geo.log"
  /usr/bin/time -f "export_wall_s=%e maxrss_kb=%M" $py -m ignition.cli export --checkpoint /tmp/ckpt-$geo \
      --out /tmp/core-$geo --hub-cache .hub 2>&1 | grep -v "it/s\]" | tail -25 | tee "$OUT/export-$geo.log"
  $py -m qualify.fixed_memory /tmp/core-$geo --json "$OUT/memory-$geo.json" 2>&1 | tail -40 > "$OUT/memory-$geo.log"
done
ls -la "$OUT"
