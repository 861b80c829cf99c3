"""A quick GPU check of the launch path: a few steps and configurations against the fp64
reference on small odd shapes (the full matrix is tests/test_kernels_gpu.py)."""
import sys

import torch

import flashattn
import flashbook
from flashattn.launch import launch
from flashattn.reference import attention as ref
from flashbook.steps import Config, get_step, with_config

torch.manual_seed(0)
fails = 0
cases = [("naive", None), ("baseline", None), ("large_tiles", None), ("arch_tuned", None),
         ("pair", None), ("persistent", None), ("unchecked_kv", None),
         ("arch_tuned", "128x128 occ=1 nww=8"), ("arch_tuned", "128x128 occ=1 nww=4"),
         ("arch_tuned", "128x64 occ=1 nww=8"), ("arch_tuned", "128x256 occ=1 nww=8")]
for name, cfg in cases:
    for causal, (B, Hq, Hkv, N, D) in [(True, (2, 8, 2, 1023, 128)), (False, (1, 4, 4, 300, 64))]:
        q = torch.randn(B, Hq, N, D, device="cuda", dtype=torch.float16)
        k = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        if cfg is None:
            o = flashbook.attention(q, k, v, causal=causal, step=name)
        else:
            c = Config.parse(cfg)
            o = torch.full_like(q, float("nan"))
            launch(q, k, v, o, with_config(get_step(name), c), c, causal=causal,
                   scale=D ** -0.5)
        r = ref(q.double(), k.double(), v.double(), causal=causal)
        err = (o.double() - r).abs().max().item()
        ok = err < 2e-2
        fails += not ok
        print(f"{name:<12} {cfg or 'default':<22} causal={causal!s:<5} max err {err:.2e} "
              f"{'ok' if ok else 'FAIL'}", flush=True)
print(f"{len(cases) * 2 - fails} passed, {fails} failed")
sys.exit(1 if fails else 0)
