#!/usr/bin/env bash
# E19 (issue 10): the refuted experiments again at 128-row tiles with two consumer warp groups,
# beside best, arch_tuned and cuDNN; run once per compiler (E20: tileiras 13.4 and 13.5 bundles):
#   source .gpu/activate.sh && bash experiments/e19_run.sh $OUT/e19-<tileiras version>
set -uo pipefail
out=${1:?output folder}; mkdir -p "$out"
export FLASHATTN_PREWARM=${FLASHATTN_PREWARM:-14}
V=128x128:occ=1:nww=8
timeout ${E19_TIMEOUT:-200} python3 -m flashbook bench --causal --seqlens 4096,16384 --rounds 20 \
  --steps best,arch_tuned,warp_groups@$V,warp_groups@$V#2,pair@$V,lazy_rescale@$V,exp_poly@$V,persistent@$V \
  --baselines cudnn --quiet --out "$out/causal.json" > "$out/causal.txt" 2>&1; echo "causal rc=$?"
timeout ${E19_TIMEOUT:-200} python3 -m flashbook bench --no-causal --seqlens 4096,16384 --rounds 20 \
  --steps best,arch_tuned,warp_groups@$V,warp_groups@$V#2,lazy_rescale@$V,exp_poly@$V,persistent@$V \
  --baselines cudnn --quiet --out "$out/full.json" > "$out/full.txt" 2>&1; echo "full rc=$?"
python3 experiments/summarize.py "$out"/*.json > "$out/summary.txt" 2>&1; cat "$out/summary.txt"
