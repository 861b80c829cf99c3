#!/usr/bin/env bash
# TileGym (NVIDIA's cuTile kernels, as shipped, its own autotuning) beside cuDNN, FA2 and the
# book's best step, on one H200, by the book's harness (flashbook.measure): forward at 1K-16K
# causal and not, backward (pass bwd) at 4K and 16K, decode at B=8 (Nk 4K and 32K, one token).
# FlexAttention is left out for time (torch.compile, ~30 s per shape); add flex to --baselines
# to include it. The tilegym wheel is carried (no network there); from the project root:
#   source .gpu/activate.sh && python3 -m pip install -q --no-index --no-deps --target \
#     /tmp/cutile-site .whl/tilegym-1.5.1-py3-none-any.whl &&
#   bash experiments/tilegym_bench.sh $OUT/tilegym
set -uo pipefail
out=${1:?output folder}; mkdir -p "$out"
python3 -c "from flashbook.measure import tilegym as t; print('tilegym:', t.available() or 'ok')"
N=1024,2048,4096,8192,16384
L=cudnn,flash,tilegym
# each part its own limit (the device allows 600 s a call): at most 550 s in all; the forward
# rows carry the control (best#2: the same kernel again)
timeout 170 python3 -m flashbook bench --causal --seqlens $N --steps best,best#2 --baselines $L \
  --rounds 15 --quiet --out "$out/fwd_causal.json" > "$out/fwd_causal.txt" 2>&1
echo "fwd causal rc=$?"
timeout 130 python3 -m flashbook bench --no-causal --seqlens $N --steps best,best#2 --baselines $L \
  --rounds 15 --quiet --out "$out/fwd_full.json" > "$out/fwd_full.txt" 2>&1
echo "fwd full rc=$?"
timeout 170 python3 -m flashbook bench --backward --causal --seqlens 4096,16384 --passes bwd \
  --baselines $L --rounds 10 --quiet --out "$out/bwd_causal.json" > "$out/bwd_causal.txt" 2>&1
echo "bwd causal rc=$?"
timeout 80 python3 -m flashbook decode-bench --part decode --batches 8 --cache-lens 4096,32768 \
  --nq 1 --impls decode,square_best,sdpa_flash,sdpa_cudnn,tilegym --rounds 10 --quiet \
  --out "$out/decode.json" > "$out/decode.txt" 2>&1
echo "decode rc=$?"
tail -n 30 "$out"/*.txt
