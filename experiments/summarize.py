"""Print the ratio to cuDNN (with its 95 % interval), TFLOPS and the control's gap of bench
documents: ``python experiments/summarize.py FILE.json ...`` (CPU only)."""
from __future__ import annotations

import json
import sys

from flashattn.stats import gap


def summarize(doc: dict) -> str:
    rows = [r for r in doc["rows"]]
    wl = doc["meta"].get("workload", {})
    out = [f"== {wl.get('name')} (B={wl.get('B')} Hq={wl.get('Hq')} Hkv={wl.get('Hkv')} "
           f"D={wl.get('D')} {wl.get('dtype')} {'causal' if wl.get('causal') else 'full'})"]
    for n in sorted({r["Nq"] for r in rows}):
        by = {r["impl"]: r for r in rows if r["Nq"] == n}
        out.append(f"  N={n}")
        for impl, r in by.items():
            if r.get("error"):
                out.append(f"    {impl:<34} {r['error'][:70]}")
                continue
            ci = (f" [{r['ratio_cudnn_lo']:.3f}, {r['ratio_cudnn_hi']:.3f}]"
                  if r.get("ratio_cudnn_lo") is not None else "")
            host = f"  host {1e3 * r['host_ms']:.0f} us" if r.get("host_ms") else ""
            out.append(f"    {impl:<34} {r['tflops']:6.1f} TFLOPS  x{r['ratio_cudnn'] or 0:.3f}"
                       f"{ci}  {r.get('config') or ''}{host}")
            twin = by.get(f"{impl}#2")
            if twin and r.get("samples_ms") and twin.get("samples_ms"):
                g, lo, hi = gap(r["samples_ms"], twin["samples_ms"])
                out.append(f"    {'control ' + impl + ' vs #2':<34} gap {g:.2%} "
                           f"[{lo:+.2%}, {hi:+.2%}]")
    return "\n".join(out)


if __name__ == "__main__":
    for f in sys.argv[1:]:
        print(summarize(json.load(open(f))))
