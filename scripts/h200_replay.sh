#!/usr/bin/env bash
# H200 run for issue 4: per geometry, synthesize a Qwen3 checkpoint, export a core of decode capacities 1,4 and one 256-token prefill chunk (a core must declare one),
# then qualify.gpu_replay: complete-graph replay vs the measured floor, kernel timelines, compiled vs uncompiled
# bytewise over 256 steps. Logs and archived runs under $OUT. Variables: GEOMETRIES ("8B 0.6B"), CAPS (1,4),
# CONTEXT (1024), SAMPLES (200), REPLAY_ARGS (extra gpu_replay flags).
set -uo pipefail
export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/results"; caps=${CAPS:-1,4}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv > "$OUT/gpu.txt"
for geo in ${GEOMETRIES:-8B 0.6B}; do
  [ -d /tmp/ckpt-$geo ] || timeout 90 python3 -m ignition.cli synth-checkpoint Qwen/Qwen3-$geo --out /tmp/ckpt-$geo \
      --hub-cache .hub --quiet > "$OUT/synth-$geo.log" 2>&1
  [ -f /tmp/core-$geo-replay/core.pb ] || timeout ${EXPORT_S:-150} /usr/bin/time -f "export_wall_s=%e" python3 -m ignition.cli export --checkpoint /tmp/ckpt-$geo \
      --out /tmp/core-$geo-replay --hub-cache .hub --capacities "$caps" --prefill-chunks 256 --overwrite 2>&1 \
      | grep -E "done in|wall|rror" > "$OUT/export-$geo.log"
  timeout ${REPLAY_S:-240} python3 -m qualify.gpu_replay --core /tmp/core-$geo-replay --capacities "$caps" \
      --context ${CONTEXT:-1024} --samples ${SAMPLES:-200} --seeds 0,1 --timeline --check-compiled --steps 256 \
      --out "$OUT/results" --json "$OUT/replay-$geo.json" ${REPLAY_ARGS:-} 2>&1 | grep -v "Warning\|warn(" > "$OUT/replay-$geo.log"
  tail -n 60 "$OUT/replay-$geo.log"
done
