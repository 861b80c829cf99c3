#!/usr/bin/env bash
# E8 (warp groups) and E9 (the Hopper ladder, the rounds method with a control), one H200 call:
#   source .gpu/activate.sh && bash experiments/e8_run.sh $OUT/e8
set -uo pipefail
out=${1:?output folder}; mkdir -p "$out"
export FLASHATTN_PREWARM=${FLASHATTN_PREWARM:-12}
ladder="baseline@64x128,fast_math@64x128,loop_split@64x128,remap@64x128,remap@64x128:occ=2"
main="$ladder,arch_tuned,warp_groups,best,best#2"
for c in --causal --no-causal; do
  python3 -m flashbook bench --steps "$main" --baselines cudnn,flash,flex $c --quiet \
    --out "$out/fp16$c-d128.json" > "$out/fp16$c.txt" 2>&1
done
for w in "--dtype bfloat16" "--gqa 32:8" "--head-dim 64" "--head-dim 256"; do
  tag=$(echo "$w" | tr -d ' -' )
  python3 -m flashbook bench --steps arch_tuned,warp_groups,best,best#2 --baselines cudnn,flash,efficient \
    --seqlens 8192 --causal $w --quiet --out "$out/$tag.json" > "$out/$tag.txt" 2>&1
done
python3 experiments/summarize.py "$out"/*.json
