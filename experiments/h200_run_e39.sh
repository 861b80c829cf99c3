#!/usr/bin/env bash
# The H200 call of 2026-12-04 (E39): MLA decode at DeepSeek-V3's shape, the GPU tests of the
# merged tree's new and changed paths, the backward candidates, first-call latency, the flex dQ
# error. Each part has its own limit (the call's is 600 s); files straight under $1.
# Carry: main's tracked files (17.8 MiB of blocks) and .gpu (~54-56 MiB) exceed 64 MiB. Run from a
# throwaway branch without what this call does not read (none of it reads results/ or
# experiments/data/): git checkout -b gpu-run && git rm -rq notebooks book results
# experiments/data && git commit -m "gpu-run only" (4.0 MiB of blocks), carry .gpu and .whl.
set -uo pipefail
out=${1:?output folder}
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/cutile-site \
  .whl/tilegym-1.5.1-py3-none-any.whl
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > "$out/tests.log"
timeout 150 python3 experiments/mla_bench.py "$out/mla_decode.json" > "$out/mla.log" 2>&1
echo "mla rc=$?" >> "$out/tests.log"
# The last three lines: the CUDA side of dispatch.Target (one device record per call, issue 35).
timeout 200 python3 -m pytest -o addopts="" -m gpu -q -rf -n 12 -p no:cacheprovider \
  tests/test_mla_gpu.py tests/test_flex_gpu.py tests/test_decode_gpu.py tests/test_fp8_gpu.py tests/test_precompile.py \
  tests/test_flash_attn_compat.py::test_flash_attn_kvcache_gpu \
  tests/test_kernels_gpu.py tests/test_autograd_gpu.py tests/test_backward_gpu.py \
  tests/test_varlen_gpu.py tests/test_decode_path.py >> "$out/tests.log" 2>&1
echo "tests rc=$?" >> "$out/tests.log"
timeout 80 python3 experiments/tilegym_bwd_bench.py --out "$out/bwd_cand.json" > "$out/bwd_cand.log" 2>&1
echo "bwd rc=$?" >> "$out/tests.log"
timeout 50 python3 experiments/first_call.py --ops attention,decode --how export \
  --out "$out/first_call.json" > "$out/first_call.log" 2>&1
echo "first_call rc=$?" >> "$out/tests.log"
