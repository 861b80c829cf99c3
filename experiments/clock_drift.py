"""Why two timings of the same kernel drift apart at 16K (issue 26; the control of E33/E34).

At 4K and 8K the control (our flex kernel timed twice in the same rounds) agrees within 1 %; at
16K it differed by up to 13 % (forward) and 5 % (backward), and one sample's spread (largest
minus smallest over the median) grew from 1 % to 7-20 %. Each sample there is one launch of
30-100 ms after the method's idle gap (``flashattn.timing.IDLE_MS``). Hypothesis: a launch that
long runs into the GPU's power limit, and the SM clock it ends at depends on where in the power
controller's cycle it started. This probe times launches one by one with CUDA events, each after
the method's idle gap, while ``nvidia-smi`` logs the SM clock, power draw and the clock-event
reasons every 50 ms; it prints, per length, the spread of the launch times, the clock range and
the share of polls with the power cap active.

    python experiments/clock_drift.py --out $OUT/clock              # H200, about 40 s
    python experiments/clock_drift.py --dry-run --out /tmp/clock     # CPU: fake launches
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
POWER_CAP = 0x4          # nvmlClocksEventReasonSwPowerCap
HW_SLOWDOWN = 0x8 | 0x40 | 0x80   # hardware slowdown, thermal (hw), power brake


def _poll(path: Path):
    """nvidia-smi polling into ``path`` every 50 ms (None where there is no nvidia-smi)."""
    fields = FIELDS
    try:
        probe = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader",
                                "-i", "0"], capture_output=True, text=True)
        if probe.returncode:            # older drivers name the reasons "throttle"
            fields = fields.replace("clocks_event_reasons", "clocks_throttle_reasons")
        f = open(path, "w")
        return subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits",
                                 "-i", "0", "-lms", "50"], stdout=f, stderr=subprocess.STDOUT), f
    except (FileNotFoundError, OSError):
        return None, None


def _parse(path: Path) -> list[dict]:
    from datetime import datetime
    out = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        try:
            t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append(dict(t=t, sm_mhz=float(parts[1]), power_w=float(parts[2]),
                            temp_c=float(parts[3]), reasons=int(parts[4], 16)))
        except ValueError:
            continue
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    p.add_argument("--launches", type=int, default=40, help="per length")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    import torch
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dry = a.dry_run
    if not dry and not torch.cuda.is_available():
        print("no GPU: use --dry-run")
        return 2
    from flashattn.timing import IDLE_MS
    proc, fh = (None, None) if dry else _poll(out / "smi.csv")
    time.sleep(0.2)
    runs = {}
    for N in a.n:
        B, H, D = (1, 2, 32) if dry else (4, 32, 128)
        N = 64 if dry else N
        dev = "cpu" if dry else "cuda"
        q, k, v = (torch.randn(B, H, N, D, device=dev, dtype=torch.float16) for _ in range(3))
        if dry:
            fn = (lambda: torch.nn.functional.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=True))
        else:
            import flashattn
            fn = (lambda: flashattn.attention(q, k, v, causal=True))
            fn()
            torch.cuda.synchronize()
        rows = []
        for i in range(a.launches):
            time.sleep(IDLE_MS / 1e3)
            t0 = time.time()
            if dry:
                c0 = time.perf_counter()
                fn()
                ms = (time.perf_counter() - c0) * 1e3
            else:
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(4):          # four back-to-back launches: the second-to-fourth
                    fn()                    # show a clock that changed during the first
                e.record()
                e.synchronize()
                ms = s.elapsed_time(e) / 4
            rows.append(dict(t0=t0, t1=time.time(), ms=ms))
        runs[str(N)] = rows
    if proc is not None:
        time.sleep(0.2)
        proc.terminate()
        proc.wait()
        fh.close()
    smi = [] if dry else _parse(out / "smi.csv")
    summary = {}
    for N, rows in runs.items():
        ms = [r["ms"] for r in rows]
        med = statistics.median(ms)
        polls = [s for s in smi if any(r["t0"] - 0.03 <= s["t"] <= r["t1"] + 0.03 for r in rows)]
        summary[N] = dict(launches=len(ms), median_ms=med, spread=(max(ms) - min(ms)) / med,
                          polls=len(polls),
                          sm_mhz=[min((s["sm_mhz"] for s in polls), default=None),
                                  max((s["sm_mhz"] for s in polls), default=None)],
                          power_w_max=max((s["power_w"] for s in polls), default=None),
                          power_cap_share=(sum(bool(s["reasons"] & POWER_CAP) for s in polls)
                                           / len(polls)) if polls else None,
                          hw_slowdown_share=(sum(bool(s["reasons"] & HW_SLOWDOWN) for s in polls)
                                             / len(polls)) if polls else None)
        s = summary[N]
        print(f"N={N}: {len(ms)} samples of 4 launches, median {med:.3f} ms, spread "
              f"{100 * s['spread']:.1f} %, SM clock {s['sm_mhz']} MHz, power max "
              f"{s['power_w_max']} W, power cap in {s['power_cap_share']} of {len(polls)} polls")
    from flashattn.env import metadata
    meta = metadata("python experiments/clock_drift.py " + " ".join(
        sys.argv[1:] if argv is None else argv)) if not dry else dict(device="CPU (dry run)")
    (out / "clock_drift.json").write_text(json.dumps(
        dict(meta=meta, summary=summary, runs=runs, smi=smi), indent=1) + "\n")
    print(f"wrote {out / 'clock_drift.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
