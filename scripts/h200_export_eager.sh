#!/usr/bin/env bash
# H200: synthesize Qwen3-$GEOMETRY, export it with the full default catalog captured from the eager prepared
# steps (--eager: no torch.compile), then report the fixed-memory split of the loaded core. Logs to $OUT.
set -uo pipefail
export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; geo=${GEOMETRY:-0.6B}
timeout 60 /usr/bin/time -f "synth_s=%e" python3 -m ignition.cli synth-checkpoint Qwen/Qwen3-$geo --out /tmp/ck \
    --hub-cache .hub --quiet > "$OUT/synth-$geo.log" 2>&1
timeout ${EXPORT_S:-90} /usr/bin/time -f "export_wall_s=%e maxrss_kb=%M" python3 -m ignition.cli export --eager \
    --checkpoint /tmp/ck --out /tmp/core --hub-cache .hub 2>&1 | grep -v "it/s\]\|B/s\]" > "$OUT/export-eager-$geo.log"
timeout ${MEMORY_S:-60} python3 -m qualify.fixed_memory /tmp/core --eager --json "$OUT/memory-eager-$geo.json" \
    > "$OUT/memory-eager-$geo.log" 2>&1
tail -n 4 "$OUT/export-eager-$geo.log"; cat "$OUT/memory-eager-$geo.json"
