#!/usr/bin/env bash
# One H200 call: the GPU test suite, then E4' (exp_poly without F2I) and E8' (best = warp_groups,
# autotune timing its candidates in alternation):  source .gpu/activate.sh && bash experiments/e10_run.sh $OUT
set -uo pipefail
out=${1:?output folder}; mkdir -p "$out"
export FLASHATTN_PREWARM=${FLASHATTN_PREWARM:-12}
timeout 240 python3 -m pytest -o addopts="" -p no:cacheprovider -m gpu tests/ -n 12 -q \
  --junitxml="$out/gpu-tests.xml" > "$out/gpu-tests.log" 2>&1; echo "gpu tests rc=$?"; tail -3 "$out/gpu-tests.log"
timeout 150 python3 -m flashbook bench --steps arch_tuned,arch_tuned#2,exp_poly --baselines cudnn \
  --seqlens 4096,16384 --causal --quiet --out "$out/e4-exp-poly.json" > "$out/e4.txt" 2>&1
timeout 150 python3 -m flashbook bench --steps best,arch_tuned,warp_groups@128x128:occ=1:nww=8 \
  --baselines cudnn --seqlens 4096,16384 --causal --quiet --out "$out/e8-best-causal.json" > "$out/e8c.txt" 2>&1
timeout 100 python3 -m flashbook bench --steps best,arch_tuned --baselines cudnn --seqlens 8192 \
  --head-dim 256 --causal --quiet --out "$out/e8-best-d256.json" > "$out/e8d.txt" 2>&1
python3 experiments/summarize.py "$out"/*.json
