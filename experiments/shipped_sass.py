"""Compile the library's forward kernel and the book's ladder kernel with the same constants
(the shipped flags) and compare the reports: python experiments/shipped_sass.py [sm_90]
(no GPU; writes compare_*.json here). The issue-21 record is
experiments/data/40-shipped-kernel-sass/compare.json."""
import json, sys, time
import flashbook  # registers the ladder
from flashattn.aot import compile_spec
from flashattn.kernels import FMHA, fmha_constants
from flashbook.steps import get_step
from flashbook.ladder import LADDER
rows = []
cases = []
for arch, stepname in (("sm_90", "warp_groups"), ("sm_100", "arch_tuned")):
    s = get_step(stepname)
    for cfg in s.configs(arch)[:2]:
        for causal in (True, False):
            for wl in (False, True):
                cases.append((arch, s, cfg, causal, True, 128, wl))
cases.append(("sm_90", get_step("warp_groups"), get_step("warp_groups").configs("sm_90")[1], True, False, 80, False))
only = sys.argv[1] if len(sys.argv) > 1 else None
for arch, s, cfg, causal, even_k, D, wl in cases:
    if only and arch != only:
        continue
    out = {}
    for name, spec in (("shipped", FMHA), ("ladder", LADDER)):
        c = fmha_constants(s, cfg, head_dim=D, causal=causal, even_k=even_k, write_lse=wl, spec=spec)
        t = time.time()
        r = compile_spec(spec, arch, c, hints=cfg.hints(), align=8 if D % 8 == 0 else 1,
                         label=cfg.label(), step=s.name, keep_sass=True)
        out[name] = dict(err=r.error, reg=r.registers, stack=r.stack_bytes, shared=r.shared_bytes,
                         lines=r.sass_lines, sass=dict(r.sass), text=getattr(r, "sass_text", ""), s=time.time() - t)
    a, b = out["shipped"], out["ladder"]
    strip = lambda t: [x for x in t.splitlines() if "Function :" not in x]   # the mangled name
    same_text = strip(a["text"]) == strip(b["text"]) and bool(a["text"])
    row = dict(arch=arch, step=s.name, config=cfg.label(), causal=causal, even_k=even_k, D=D,
               write_lse=wl, shipped={k: a[k] for k in ("err", "reg", "stack", "shared", "lines", "sass")},
               ladder={k: b[k] for k in ("err", "reg", "stack", "shared", "lines", "sass")},
               identical_sass_text=same_text)
    rows.append(row)
    print(json.dumps({k: row[k] for k in ("arch", "config", "causal", "even_k", "D", "write_lse", "identical_sass_text")}),
          (a["reg"], a["stack"], a["shared"], a["lines"]), (b["reg"], b["stack"], b["shared"], b["lines"]),
          f"{a['s']:.0f}s/{b['s']:.0f}s", a["err"][:80], b["err"][:80], flush=True)
    json.dump(rows, open(f"compare_{only or 'all'}.json", "w"), indent=1)
