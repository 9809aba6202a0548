#!/usr/bin/env bash
# GPU run for issue 3 on the H200 (device tool): GPU conformance (captured capacities vs eager), then
# synthesize, export (compiled + captured catalog) and measure a Qwen3 geometry core. Every stage is
# time-boxed and logs straight to $OUT. Needs the hub files of the Qwen3 repos in .hub/ (carried).
# Variables: STAGES ("tests export memory"), GEOMETRY (0.6B), CAPS / PREFILL (default: the recipe's full
# catalog), TESTS_S / EXPORT_S / MEMORY_S (time boxes).
set -uo pipefail
export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub FLARE_TEST_HUB_CACHE=$PWD/.hub PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/results"
geo=${GEOMETRY:-0.6B}; stages=${STAGES:-tests export memory}
catalog=(); [ -n "${CAPS:-}" ] && catalog+=(--capacities "$CAPS"); [ -n "${PREFILL+x}" ] && catalog+=(--prefill-chunks "$PREFILL")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
if [[ $stages == *tests* ]]; then
  timeout ${TESTS_S:-170} python3 -m pytest conformance/test_graphs.py tests/recipes/test_qwen3_captured.py -m gpu \
      -p no:cacheprovider --flare-results "$OUT/results" -q -rs > "$OUT/gpu_tests.log" 2>&1
  tail -3 "$OUT/gpu_tests.log"
fi
if [[ $stages == *export* ]]; then
  timeout 90 /usr/bin/time -f "synth_s=%e maxrss_kb=%M" python3 -m ignition.cli synth-checkpoint Qwen/Qwen3-$geo \
      --out /tmp/ckpt-$geo --hub-cache .hub --quiet > "$OUT/synth-$geo.log" 2>&1
  timeout ${EXPORT_S:-330} /usr/bin/time -f "export_wall_s=%e maxrss_kb=%M" python3 -m ignition.cli export \
      --checkpoint /tmp/ckpt-$geo --out /tmp/core-$geo --hub-cache .hub "${catalog[@]}" \
      2>&1 | grep -v "it/s\]\|B/s\]" > "$OUT/export-$geo.log"
  tail -3 "$OUT/synth-$geo.log"; grep -E "compiled|captured|done in|wall" "$OUT/export-$geo.log" | tail -30
fi
if [[ $stages == *memory* ]]; then
  timeout ${MEMORY_S:-150} /usr/bin/time -f "memory_wall_s=%e" python3 -m qualify.fixed_memory /tmp/core-$geo \
      --json "$OUT/memory-$geo.json" > "$OUT/memory-$geo.log" 2>&1
  tail -2 "$OUT/memory-$geo.log"; cat "$OUT/memory-$geo.json" 2>/dev/null | head -30
fi
