#!/usr/bin/env bash
# One H200 device call made of named stages (STAGES="gemv core-0.6B served-0.6B tests replay-0.6B ..."), each
# time-boxed; after every stage everything written so far is packed into $OUT/h200-run.tgz, so a call cut
# by its time limit still returns what finished (the device returns only a few files: one archive).
# The hub files it reads come from .hub/ (git-ignored): `python3 scripts/device_hub.py Qwen/Qwen3-8B` writes a model's
# (11.4 MB), to be named in the call's carry (".hub/models--Qwen--Qwen3-8B"; the tree and the carried paths share
# the call's 64 MiB).  The archived results/ (tracked, ~55 MB) no longer fit beside them: no stage reads them, so leave
# them out of the working tree for the call (`git sparse-checkout set --no-cone '/*' '!/results/'`, then
# `git sparse-checkout disable` to restore them; commit first, the sparse tree hides results/ from git add).
#
# NEED_GPU=H200 (any text of the card's name) stops the call before its first stage on another card (exit 3) -- or,
# with OTHER_STAGES set, runs those stages there instead of STAGES (e.g. OTHER_STAGES=tests: the GPU tests on whichever
# card comes, the measurements only on the named one).  Before either, a preflight: a side-by-side stage
# (replayinN-G) of STAGES or OTHER_STAGES without its exported entries stops the call (exit 2) before any stage.
#
# Stages:
#   gemv            scripts/bench_gemv.py: decode GEMV (Triton fused_linear) vs cuBLAS, config sweep
#   core-G          synthesize Qwen/Qwen3-G (random weights) and export a core (capacities $CAPS, prefill $CHUNKS;
#                   either set empty: the recipe's full catalog); exported with --eager ($EXPORT_ARGS, default
#                   --eager: the same core, its steps validated uncompiled -- every stage that times a core compiles
#                   its own steps; Qwen3-8B's export compile took 24 s of the 134 s stage in run 29; both written
#                   with --no-fsync: scratch files -- run 190's export stalled ~3 s per 2 GiB shard on fsync).  A machine
#                   still warm from the previous call reuses its core when ignition/'s files, the catalog and the
#                   export arguments are the same (the stage says so in build.log)
#   memory-G        qualify.fixed_memory on core G ($ATTN attention): weights, KV pool, graph pool, workspaces, slack
#   served-G        qualify.served_equivalence on core G (served == eager, cache hit == miss)
#   overhead-G      qualify.serve_overhead on core G, batch 1 and 8 ($ATTN attention)
#   replay-G        qualify.gpu_replay on core G: timeline, --check-compiled, widths, greedy and top-k variants ($ATTN;
#                   REPLAY_ARGS more arguments, e.g. "--timeline-widths 1,2": the width-2 round's timeline too;
#                   "--timeline-variants decode_greedy": the greedy variant's)
#   replayab-G      qualify.gpu_replay on core G, plain timing, once per variant in $AB (side by side), each
#                   ATTENTION[:separate][:nopdl][:NAME=VALUE...] (separate: projections unfused,
#                   --no-fused-projections; nopdl: FLARE_PDL=0, no programmatic dependent launch; NAME=VALUE: an
#                   environment switch of that run, e.g. FLARE_PDL_EARLY=0 -- README, "Side-by-side switches");
#                   AB_TIMELINE=1 adds --timeline, AB_ARGS more gpu_replay arguments (e.g. "--topk-variant 64");
#                   the first variant runs again last (AB_BRACKET=0: not), so the same version is timed twice and an
#                   order effect shows (run 23's first variant was ~15 us slower than every later one at Qwen3-0.6B
#                   B=1; run 26 with the order swapped found the "gains" within noise)
#   replayin-G      qualify.gpu_replay --ab on core G: side by side inside one process, interleaved, once per entry of
#                   $AB_IN (each NAME=VALUE[:NAME=VALUE...], the B side; A is the environment as started; AB_ARGS more
#                   gpu_replay arguments -- AB_ARGS=--timeline: A's and B's decode timelines at B=1/4 and B's critical
#                   path against A's per layer position, give it REPLAYIN_S=300; AB_NULL=1: --ab-null, A built again
#                   after B; AB_IN_8B, AB_IN_0_6B: the entries of that model's stage instead; AB_TOGETHER=1: every
#                   entry a B bench of ONE process, all interleaved with one A (and A2): A's load, build and
#                   timelines once instead of once per entry; each bench holds its own copy of the weights, Qwen3-8B's
#                   16 GB) -- the order and machine effects of separate processes cancel; the benches that fit the
#                   card (1.1x the core's bytes each, 90% of its memory less 4 GB): on a smaller one the null goes,
#                   then the last entries (named in stages.log)
#   replayinN-G     the same with the entries of $AB_INN_G or $AB_INN (N any suffix, e.g. replayin2-8B with
#                   AB_IN2_8B): a second side-by-side set on the same core in the same call, no second build
#   pdl             scripts/pdl_smoke.py: PDL kernels bitwise equal with and without PDL, eager and captured, and
#                   the side-by-side graph cost; when it fails, later stages run with FLARE_PDL=0
#   prefill-G       ignition bench --prefill, chunks 1024 and 4096 (% of the measured matmul throughput)
#   decodeattn      scripts/bench_decode_attention.py: a decode step's attention per layer, three launches vs fused
#   attnprobe       scripts/probe_decode_attention.py: clock stamps inside the fused decode attention and its reduce
#                   in a graph of one-row decode layers ($PROBE_ARGS, e.g. --env "" --env FLARE_DECODE_KV_PREFETCH=0)
#   chain           scripts/bench_kernel_chain.py: the cost of one dependent kernel (a chain of trivial kernels in
#                   one graph; without PDL, with it, with the early trigger; $CHAIN_ARGS)
#   sampler         scripts/bench_sampler.py: the general sampler alone, full sort vs the top-64 route with
#                   flare::sampling_cut, per row mix, batches 1 and 4 ($SAMPLER_ARGS)
#   prefillprof     scripts/prefill_profile.py: kernel timeline of a Qwen3-8B prefill chunk (4 layers, chunks $PROF_CHUNKS)
#   prefillparts    scripts/bench_prefill_parts.py: a 4096-token chunk's attention (config sweep) and projections
#   tests           pytest conformance -m gpu + the GPU tests of tests/ (archived run; $TESTS narrows the paths,
#                   $TESTS_K selects by name: pytest -k "$TESTS_K");
#                   when the Triton prefill kernel's GPU test fails, later stages use ATTN=triton-decode (its decode
#                   kernel only); when the fused decode kernel's fails, ATTN=triton-unfused
set -uo pipefail
export HF_HUB_OFFLINE=1 HF_HUB_CACHE=$PWD/.hub FLARE_TEST_HUB_CACHE=$PWD/.hub PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# R: the tools' archived runs, W: cores and staging (FLARE_RUN_RESULTS, FLARE_RUN_WORK move them: the CPU tests)
DEST=${OUT:-/tmp/out}; mkdir -p "$DEST"; R=${FLARE_RUN_RESULTS:-/tmp/flare-results}; mkdir -p $R
W=${FLARE_RUN_WORK:-/tmp/flare-work}; mkdir -p $W
OUT=$W/out; rm -rf $OUT; mkdir -p $OUT  # staged here (emptied: a warm machine keeps /tmp); only the archive goes back
CAPS=${CAPS-1,4,8}; CHUNKS=${CHUNKS-256,1024,4096}; ATTN=${ATTN:-triton}; AB=${AB:-torch:separate triton:separate triton}
log() { grep -v "Warning\|warn(\|warn_once\|^$\|Online softmax\|split the reduction\|important use case\|softmax\.$" ; }
pack() { tar czf $W/run.tgz -C "$OUT" . 2>/dev/null && cp $W/run.tgz "$DEST/.run.tmp" && mv "$DEST/.run.tmp" "$DEST/h200-run.tgz"; }
stage() { echo "== $1 $(date -u +%T)" | tee -a "$OUT/stages.log"; }
slug() { printf %s "$1" | tr ":/;=" "----"; }  # a side-by-side entry as a file name (values may hold / ; =)
# Preflight: each side-by-side stage of STAGES and OTHER_STAGES has its entries before the first stage runs -- exit 2
# at once, naming the variable (run 197's replayin3-8B found its AB_IN3_8B unexported after the 86 s export before it)
# entry_vars STAGE: the variables a replayinN-G stage takes its entries from, the model's first (AB_INN_G AB_INN)
entry_vars() { local sfx=${1%%-*} g=${1#*-}; sfx=${sfx#replayin}; echo "AB_IN${sfx}_${g//./_} AB_IN$sfx"; }
missing=()
for s in ${STAGES:-} ${OTHER_STAGES:-}; do
  case $s in replayin*-*) read -r k kk <<< "$(entry_vars "$s")"
    [ -n "${!k:-}${!kk:-}" ] || missing+=("preflight: $s has no entries: export $kk or $k") ;; esac; done
if [ ${#missing[@]} -gt 0 ]; then printf '%s\n' "${missing[@]}" | tee -a "$OUT/stages.log"; pack; exit 2; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt"
GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1)  # the card's memory
# NEED_GPU=TEXT (e.g. H200): stop before any stage unless the card's name holds TEXT -- a call asking for one kind may
# be given another (runs 174-178 asked for an H200 and ran on H100s); a record or a target measured on the wrong card
# is device time spent for nothing.  Exit 3, gpu.txt and stages.log still come back.
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
if [ -n "${NEED_GPU:-}" ] && [[ "$GPU_NAME" != *"$NEED_GPU"* ]]; then
  if [ -z "${OTHER_STAGES:-}" ]; then
    echo "NEED_GPU=$NEED_GPU: this card is $GPU_NAME -- no stage run" | tee -a "$OUT/stages.log"; pack; exit 3; fi
  echo "NEED_GPU=$NEED_GPU: this card is $GPU_NAME -- OTHER_STAGES instead: $OTHER_STAGES" | tee -a "$OUT/stages.log"
  STAGES=$OTHER_STAGES; fi
# the device copy's .git may name an older commit than the tree it runs: the caller writes the tree's commit to
# .tree-commit (git-ignored; `git rev-parse --short HEAD > .tree-commit`, carried) -- archives and commit.txt take it
if [ -s .tree-commit ]; then
  export FLARE_GIT_SHA=$(cat .tree-commit); echo "$FLARE_GIT_SHA (.tree-commit)" > "$OUT/commit.txt"
else git log -1 --format="%H %s" > "$OUT/commit.txt" 2>/dev/null; fi
for s in ${STAGES:?set STAGES}; do
  stage "$s"; t0=$(date +%s); g=${s#*-}
  case $s in
    gemv) timeout 150 python3 scripts/bench_gemv.py --budget-s ${GEMV_S:-70} ${GEMV_ARGS:-} --json "$OUT/gemv.json" > "$OUT/gemv.log" 2>&1
          tail -n 45 "$OUT/gemv.log" ;;
    core-*)
      catalog=(); [ -n "$CAPS" ] && catalog+=(--capacities "$CAPS"); [ -n "$CHUNKS" ] && catalog+=(--prefill-chunks "$CHUNKS")
      # a machine still warm from the last call keeps $W: its core is reused when what made it is the same (the
      # ignition/ sources, the catalog and the export arguments); anything else exports again
      key=$( (find ignition -type f -not -path "*/__pycache__/*" | LC_ALL=C sort | xargs cat;
              echo "$g ${catalog[*]} ${EXPORT_ARGS---eager}") | md5sum | cut -d" " -f1)
      if [ -s $W/core-$g.key ] && [ "$(cat $W/core-$g.key)" = "$key" ] && [ -d $W/core-$g ]; then
        echo "core $g reused from the warm machine (same sources and catalog, key $key)" | tee -a "$OUT/build.log"
      else
        rm -rf $W/core-$g $W/core-$g.key $W/ckpt-$g
        timeout 120 python3 -m ignition.cli synth-checkpoint Qwen/Qwen3-$g --out $W/ckpt-$g --hub-cache .hub --quiet --no-fsync >> "$OUT/build.log" 2>&1
        timeout ${EXPORT_S:-240} /usr/bin/time -f "export $g wall_s=%e" python3 -m ignition.cli export --checkpoint $W/ckpt-$g \
            --out $W/core-$g --hub-cache .hub --no-fsync "${catalog[@]}" ${EXPORT_ARGS---eager} 2>&1 \
            | grep -E "done in|wall|compiled|rror" >> "$OUT/build.log"
        [ "${PIPESTATUS[0]}" = 0 ] && echo "$key" > $W/core-$g.key
      fi; tail -n 4 "$OUT/build.log" ;;
    memory-*) timeout ${MEMORY_S:-200} python3 -m qualify.fixed_memory $W/core-$g --attention $ATTN --json "$OUT/memory-$g.json" \
          > "$OUT/memory-$g.log" 2>&1; tail -n 3 "$OUT/memory-$g.log" ;;
    served-*) timeout 200 python3 -m qualify.served_equivalence $W/core-$g --max-tokens 64 --prompt-tokens 100 \
          --json "$OUT/served-$g.json" 2>&1 | log | grep -v "^ *[0-9]*,\?$" | tail -n 20 > "$OUT/served-$g.log"; cat "$OUT/served-$g.log" ;;
    overhead-*) timeout 240 python3 -m qualify.serve_overhead $W/core-$g --requests 1,8 --max-tokens 64 --attention $ATTN \
          --json "$OUT/overhead-$g.json" --out "$OUT/overhead-$g-run" 2>&1 | log | tail -n 4 > "$OUT/overhead-$g.log"; cat "$OUT/overhead-$g.log" ;;
    replay-*) timeout ${REPLAY_S:-240} python3 -m qualify.gpu_replay --core $W/core-$g --capacities 1,4 --context 1024 \
          --samples 200 --seeds 0,1 --timeline --check-compiled --steps 256 --widths 1,2,4,8 --greedy-variant \
          --topk-variant 64 --attention $ATTN ${REPLAY_ARGS:-} --out $R/replay-$g 2>&1 | log > "$OUT/replay-$g.log"
          tar czf "$OUT/replay-$g.tgz" -C $R/replay-$g . 2>/dev/null; tail -n 60 "$OUT/replay-$g.log" ;;
    pdl) if ! timeout 150 python3 scripts/pdl_smoke.py --json "$OUT/pdl.json" > "$OUT/pdl.log" 2>&1; then
           export FLARE_PDL=0; echo "PDL smoke failed: FLARE_PDL=0 from here" | tee -a "$OUT/stages.log"; fi
         tail -n 5 "$OUT/pdl.log" ;;
    replayab-*) vs="$AB"; [ "${AB_BRACKET:-1}" = 1 ] && [ "${AB%% *}" != "$AB" ] && vs="$AB ${AB%% *}"; i=0
        for v in $vs; do  # ATTENTION[:separate][:nopdl][:NAME=VALUE...]: backend, projections unfused, PDL off, env
          a=${v%%:*}; extra=""; [[ "$v" == *:separate* ]] && extra=--no-fused-projections; i=$((i + 1)); n=$i-$(slug "$v")
          pdl=${FLARE_PDL:-1}; [[ "$v" == *:nopdl* ]] && pdl=0
          envs=(); IFS=: read -ra parts <<< "$v"; for p in "${parts[@]:1}"; do [[ "$p" == *=* ]] && envs+=("$p"); done
          env FLARE_PDL=$pdl "${envs[@]}" timeout ${REPLAYAB_S:-120} python3 -m qualify.gpu_replay --core $W/core-$g --capacities 1,4 --context 1024 \
            --samples 200 --seeds 0,1 --attention $a $extra ${AB_TIMELINE:+--timeline} ${AB_ARGS:-} --out $R/replayab-$g-$n 2>&1 | log > "$OUT/replayab-$g-$n.log"
          tar czf "$OUT/replayab-$g-$n.tgz" -C $R/replayab-$g-$n . 2>/dev/null; grep -E "^ +[14] +decode|timeline B|per layer" "$OUT/replayab-$g-$n.log"; done ;;
    replayin*-*) i=0; sfx=${s%%-*}; sfx=${sfx#replayin}; read -r k kk <<< "$(entry_vars "$s")"
          entries=(${!k:-${!kk:?set $kk or $k}}); runs=(); null=${AB_NULL:-}
          if [ "${AB_TOGETHER:-0}" = 1 ]; then  # every entry a B bench of one process: A (and A2) built once
            # each bench holds the core's weights: on a smaller card (an H100's 78 GiB for Qwen3-8B's 16 GB) the null
            # goes first, then the last entries -- named in stages.log
            fit=$(( (GPU_MIB * 1048576 * 9 / 10 - 4000000000) / ($(du -sb $W/core-$g | cut -f1) * 11 / 10) ))
            if [ -n "$null" ] && [ $((${#entries[@]} + 2)) -gt $fit ]; then
              null=; echo "replayin: A, A2 and ${#entries[@]} B benches do not fit this card ($fit): no null" | tee -a "$OUT/stages.log"; fi
            if [ $((${#entries[@]} + 1)) -gt $fit ] && [ $fit -ge 2 ]; then
              echo "replayin: only the first $((fit - 1)) entries fit this card: dropped ${entries[*]:$((fit - 1))}" | tee -a "$OUT/stages.log"
              entries=("${entries[@]:0:$((fit - 1))}"); fi
            abs=(); for v in "${entries[@]}"; do abs+=(--ab "$v"); done; runs=("${#entries[@]}-together")
          else for v in "${entries[@]}"; do i=$((i + 1)); runs+=("$i-$(slug "$v")"); done; fi
          i=0; for n in "${runs[@]}"; do
            [ "${AB_TOGETHER:-0}" = 1 ] || { abs=(--ab "${entries[$i]}"); i=$((i + 1)); }
            name=replayin$sfx-$g-$n
            timeout ${REPLAYIN_S:-200} python3 -m qualify.gpu_replay --core $W/core-$g --capacities 1,4 --context 1024 \
              --samples 200 --seeds 0 --attention $ATTN "${abs[@]}" ${null:+--ab-null} ${AB_ARGS:-} \
              --out $R/$name 2>&1 | log > "$OUT/$name.log"
            tar czf "$OUT/$name.tgz" -C $R/$name . 2>/dev/null
            grep -A 3 "side by side in one process" "$OUT/$name.log" | head -n 40; done ;;
    prefill-*) for chunk in 1024 4096; do
          timeout 150 python3 -m ignition.cli bench $W/core-$g --prefill --prefill-chunk-size $chunk --samples 30 --attention $ATTN \
            --out $R/bench-$g 2>&1 | log | tail -n 4 >> "$OUT/prefill-$g.log"; done
          tar czf "$OUT/bench-$g.tgz" -C $R/bench-$g . 2>/dev/null; cat "$OUT/prefill-$g.log" ;;
    tests) targs=(${TESTS:-conformance tests/recipes/test_qwen3_captured.py tests/components/test_components_gpu.py} \
                 ${TESTS_K:+-k "$TESTS_K"} -m gpu -p no:cacheprovider)
          # cut by its time limit, pytest is interrupted (SIGINT) so it still prints what failed and what passed (-rA)
          timeout -s INT -k 30 ${TESTS_S:-420} python3 -m pytest "${targs[@]}" --flare-results $R/tests -q -rA \
          --durations=15 2>&1 | log > "$OUT/gpu_tests.log"; trc=${PIPESTATUS[0]}
          tar czf "$OUT/gpu-tests.tgz" -C $R/tests . 2>/dev/null; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests.log" | tail -n 15
          if [ "$trc" = 124 ]; then  # cut: which tests were selected (the kernels below whose tests did not run)
            python3 -m pytest "${targs[@]}" --collect-only -q 2>/dev/null | grep "::" > "$OUT/gpu_tests.collected"; fi
          if [ "$ATTN" = triton ] && grep -qE "(FAILED|ERROR).*prefill_kernel_on_this_gpu" "$OUT/gpu_tests.log"; then
            ATTN=triton-decode; echo "the Triton prefill kernel failed on this GPU: ATTN=triton-decode from here" | tee -a "$OUT/stages.log"; fi
          if [ "$ATTN" = triton ] && grep -qE "(FAILED|ERROR).*fused_decode_kernel_on_this_gpu" "$OUT/gpu_tests.log"; then
            ATTN=triton-unfused; echo "the fused decode kernel failed on this GPU: ATTN=triton-unfused from here" | tee -a "$OUT/stages.log"; fi
          # a kernel whose GPU test failed is switched off for the later stages (named in stages.log); a
          # stage cut by its time limit (a hung kernel: the handoff's or the combine's spin) switches off each of
          # them whose test was selected and did not pass (run 185's narrowed selection switched off all five)
          for t in mlp_handoff_chain:FLARE_GEMV_HANDOFF=0 decode_combine_in_kernel:FLARE_DECODE_COMBINE_ROWS=0 \
                   gumbel:FLARE_GUMBEL_KERNEL=0 draw_finish:FLARE_DRAW_FINISH=0 sampler_front:FLARE_SAMPLER_FRONT_KERNEL=0 width_one:FLARE_COMPILE_TAILS=0 \
                   head_logits_into:FLARE_HEAD_INTO=0 embed_rotary_on_this_gpu:FLARE_FUSED_EMBED_ROTARY=0 \
                   embed_rotary_batch_on_this_gpu:FLARE_FUSED_STEP_BATCH=0 done-early:FLARE_SAMPLER_EARLY_SKIP=0; do
            if grep -qE "(FAILED|ERROR).*${t%%:*}" "$OUT/gpu_tests.log" || { [ "$trc" = 124 ] && \
                 grep -q "${t%%:*}" "$OUT/gpu_tests.collected" && ! grep -qE "^PASSED .*${t%%:*}" "$OUT/gpu_tests.log"; }; then
              export "${t#*:}"; echo "${t%%:*} failed or the tests timed out (rc $trc): ${t#*:} from here" | tee -a "$OUT/stages.log"; fi
          done ;;
    chain) timeout 150 python3 scripts/bench_kernel_chain.py ${CHAIN_ARGS:-} --json "$OUT/chain.json" > "$OUT/chain.log" 2>&1
          tail -n 12 "$OUT/chain.log" ;;
    sampler) timeout ${SAMPLER_S:-200} python3 scripts/bench_sampler.py ${SAMPLER_ARGS:-} --json "$OUT/sampler.json" \
          > "$OUT/sampler.log" 2>&1; tail -n 25 "$OUT/sampler.log" ;;
    decodeattn) timeout 200 python3 scripts/bench_decode_attention.py ${DECODEATTN_ARGS:-} --json "$OUT/decode-attn.json" \
          > "$OUT/decode-attn.log" 2>&1; tail -n 50 "$OUT/decode-attn.log" ;;
    attnprobe) eval "timeout ${PROBE_S:-200} python3 scripts/probe_decode_attention.py ${PROBE_ARGS:-} --json \"\$OUT/attn-probe.json\"" \
          > "$OUT/attn-probe.log" 2>&1; tail -n 80 "$OUT/attn-probe.log" ;;
    prefillprof) for chunk in ${PROF_CHUNKS:-4096}; do
          timeout 200 python3 scripts/prefill_profile.py --chunk $chunk --layers 4 --attention $ATTN --json "$OUT/prefill-prof-$chunk.json" \
            2>&1 | log | tail -n 30 > "$OUT/prefill-prof-$chunk.log"; cat "$OUT/prefill-prof-$chunk.log"; done ;;
    prefillparts) timeout 200 python3 scripts/bench_prefill_parts.py --tokens 4096 --json "$OUT/prefill-parts.json" \
          > "$OUT/prefill-parts.log" 2>&1; tail -n 20 "$OUT/prefill-parts.log" ;;
    *) echo "unknown stage $s" ;;
  esac
  echo "   $s took $(( $(date +%s) - t0 )) s" | tee -a "$OUT/stages.log"
  pack
done
