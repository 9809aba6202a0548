export CAPS=1,4 CHUNKS=1024 AB_TOGETHER=1 AB_NULL=1 REPLAYIN_S=200 REPLAY_S=150 TESTS=tests/components/test_components_gpu.py TESTS_K="sampl or gumbel or draw or cut or rotary" TESTS_S=150
export AB_IN_8B="FLARE_SAMPLER_PDL=0 FLARE_ROTARY_PDL=0 FLARE_DECODE_MAX_SPLITS=9 FLARE_DECODE_COMBINE_ROWS=1 FLARE_DECODE_PAGES_FIRST=1"
export AB_IN2_8B="FLARE_DECODE_REDUCE_PREFETCH_MB=8 FLARE_DECODE_REDUCE_PREFETCH_MB=16 FLARE_GEMV_CONFIG=1x4096x4096=2/1024/4/2 FLARE_GEMV_CONFIG=1x4096x12288=4/1024/4/2/0 FLARE_DRAW_FINISH=0"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then STAGES="core-8B replayin-8B replay-8B tests replayin2-8B" bash scripts/h200_run.sh; else STAGES=tests bash scripts/h200_run.sh; fi
