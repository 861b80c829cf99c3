#!/usr/bin/env bash
# Issue 25 on the H200, in two device calls (each under 10 minutes), from the repository root
# after `source .gpu/activate.sh`:
#
#   bash experiments/gpu_check.sh agree     # interpreter vs GPU, the GPU suite, the spot check
#   bash experiments/gpu_check.sh chapters  # every chapter live (nbrun), times per chapter
#
# Logs and data go to $OUT/<part>/ and come back as at most 8 files (one tarball plus logs).
set -uo pipefail
part=${1:?agree or chapters}
out=${OUT:-/tmp/out}/$part
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
# Nsight Compute's report reader (chapters read the recorded profiles through it)
for d in /opt/nvidia/nsight-compute/*/extras/python; do [ -d "$d" ] && export PYTHONPATH="$PYTHONPATH:$d"; done
python3 -m flashattn info > "$out/info.txt" 2>&1

if [ "$part" = agree ]; then
  t0=$(date +%s)
  python3 experiments/gpu_agreement.py --out "$out/agreement.json" 2>&1 | tee "$out/agreement.log"
  echo "agreement: $(( $(date +%s) - t0 )) s" | tee -a "$out/times.txt"
  t0=$(date +%s)
  timeout 330 python3 -m pytest -o addopts="" -p no:cacheprovider -m gpu tests/ -n 14 -q \
    > "$out/gpu-suite.log" 2>&1
  echo "gpu suite rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$out/times.txt"
  tail -4 "$out/gpu-suite.log"
  for c in causal no-causal; do
    t0=$(date +%s)
    flag=$([ $c = causal ] && echo "" || echo "--no-causal")
    timeout 150 python3 -m flashbook bench --steps best,best#2,arch_tuned,pipeline \
      --seqlens 4096,16384 --baselines cudnn --rounds 15 $flag --out "$out/spot-$c.json" \
      > "$out/spot-$c.log" 2>&1
    echo "spot $c rc=$?: $(( $(date +%s) - t0 )) s" | tee -a "$out/times.txt"
    tail -14 "$out/spot-$c.log"
  done
else
  python3 experiments/gpu_agreement.py --targeted-only --out "$out/targeted.json" \
    > "$out/targeted.log" 2>&1
  cat "$out/targeted.log"
  python3 experiments/order_probe.py > "$out/order-probe.log" 2>&1
  cat "$out/order-probe.log"
  nbdir=/tmp/nb-live && mkdir -p "$nbdir"
  start=$(date +%s)
  for nb in ${CHAPTERS:-notebooks/[0-9]*.ipynb}; do
    name=$(basename "$nb" .ipynb)
    if [ $(( $(date +%s) - start )) -gt 480 ]; then echo "$name skipped (time)" | tee -a "$out/times.txt"; continue; fi
    t0=$(date +%s%N)
    timeout 150 python3 -m flashbook nbrun "$nb" "$nbdir/$name.ipynb" > "$nbdir/$name.log" 2>&1
    rc=$?
    echo "$name rc=$rc $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a "$out/times.txt"
    tar -cJf "$out/notebooks.tar.xz" -C "$nbdir" .
  done
fi
