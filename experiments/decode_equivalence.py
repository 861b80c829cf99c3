"""Every decode path through the cuTile interpreter, bit for bit, before and after a refactor.

    python experiments/decode_equivalence.py save  experiments/data/decode-equivalence/before.pt
    python experiments/decode_equivalence.py check experiments/data/decode-equivalence/before.pt

Runs ``flashattn.decode`` on fixed-seed inputs (fp16, bf16; fp8 caches with V in K's layout and
transposed, e4m3 and e5m2; contiguous and paged; GQA; odd lengths, length 0, a length past the
cache and a page id out of range (NaN poisoning); one split, several, the one-row combine) under
the interpreter for sm_90 and sm_120, and records the output and every fp32 scratch array of
each launch (the splits' partial outputs and log-sum-exps). ``check`` compares bit patterns
(NaN included) and prints one line per case.
"""
import sys
import zlib

import torch

import flashattn
from flashattn import interpret

try:                                   # the cache helpers' home after issue 35
    from flashattn.decoding import fp8_kv_cache
except ImportError:
    from flashattn.fp8 import fp8_kv_cache
from flashattn.fp8 import quantize_fp8

# name, B, Hq, Hkv, Nq, S (capacity or page size), D, lens, paged (pages, max_pages) or None,
# num_splits, cache kind ("fp16", "bf16", "e4m3", "e4m3_t", "e5m2", "e5m2_t"), archs
CASES = [
    ("fp16 contiguous GQA 4:2, lengths 200/0/37", 3, 4, 2, 1, 200, 64, (200, 0, 37), None,
     None, "fp16", ("sm_90", "sm_120")),
    ("fp16 contiguous one split (FINAL)", 2, 2, 1, 2, 96, 64, (96, 51), None, 1, "fp16",
     ("sm_90",)),
    ("fp16 contiguous 8 splits (row combine)", 1, 4, 1, 1, 300, 64, (299,), None, 8, "fp16",
     ("sm_90",)),
    ("bf16 paged Nq=3, 3 splits", 2, 4, 2, 3, 32, 64, (70, 5), (9, 4), 3, "bf16",
     ("sm_90", "sm_120")),
    ("fp16 D=256 paged one split", 1, 2, 1, 1, 32, 256, (45,), (3, 2), 1, "fp16", ("sm_120",)),
    ("fp16 length past the cache (NaN)", 2, 2, 1, 1, 64, 64, (70, 20), None, 2, "fp16",
     ("sm_90",)),
    ("fp16 page id out of range (NaN)", 2, 2, 1, 1, 32, 64, (40, 50), (5, 2), 2, "fp16",
     ("sm_90",)),
    ("e4m3 widened contiguous GQA, 3 splits", 3, 4, 2, 1, 160, 64, (160, 0, 33), None, 3,
     "e4m3", ("sm_90", "sm_120")),
    ("e4m3 widened paged Nq=2", 2, 4, 2, 2, 32, 64, (61, 17), (9, 4), 2, "e4m3",
     ("sm_90", "sm_120")),
    ("e4m3 widened D=256 (head-dim slices)", 1, 2, 1, 1, 64, 256, (50,), None, 2, "e4m3",
     ("sm_120",)),
    ("e5m2 widened one split", 1, 2, 1, 1, 96, 64, (95,), None, 1, "e5m2", ("sm_90",)),
    ("e4m3 V transposed contiguous GQA", 3, 4, 1, 1, 200, 64, (200, 0, 1), None, None,
     "e4m3_t", ("sm_90", "sm_120")),
    ("e4m3 V transposed Nq=3, 3 splits", 2, 2, 2, 3, 160, 64, (160, 45), None, 3, "e4m3_t",
     ("sm_90",)),
    ("e4m3 V transposed paged", 2, 8, 2, 2, 64, 64, (130, 64), (9, 4), 2, "e4m3_t",
     ("sm_90", "sm_120")),
    ("e4m3 V transposed D=128 one split", 1, 2, 1, 1, 96, 128, (96,), None, 1, "e4m3_t",
     ("sm_120",)),
    ("e5m2 V transposed 8 splits", 1, 4, 1, 1, 300, 64, (277,), None, 8, "e5m2_t",
     ("sm_90",)),
    ("e4m3 V transposed length past the cache", 2, 2, 1, 1, 64, 64, (80, 20), None, 2,
     "e4m3_t", ("sm_90",)),
]
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def _inputs(case):
    name, B, Hq, Hkv, Nq, S, D, lens, paged, splits, kind, _ = case
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    qdtype = torch.bfloat16 if kind == "bf16" else torch.float16
    q = torch.randn(B, Hq, Nq, D, generator=g).to(qdtype)
    if paged is None:
        shape = (B, Hkv, S, D)
        table = None
    else:
        pages, max_pages = paged
        shape = (pages, Hkv, S, D)
        perm = torch.randperm(pages, generator=g)[:B * max_pages].reshape(B, max_pages)
        table = perm.to(torch.int32)
        if "page id" in name:
            table[1, 1] = pages + 3
    k = torch.randn(shape, generator=g)
    v = torch.randn(shape, generator=g)
    kw = {}
    if kind in ("fp16", "bf16"):
        kc, vc = k.to(qdtype), v.to(qdtype)
        if paged is None:
            # Slots past each length hold NaN: a kernel that reads them unmasked shows it.
            for b, n in enumerate(lens):
                kc[b, :, max(n, 0):] = float("nan")
                vc[b, :, max(n, 0):] = float("nan")
    else:
        fp8 = FP8[kind[:4]]
        transposed = kind.endswith("_t")
        if paged is None:
            kc, vc, kd, vd = fp8_kv_cache(k, v, capacity=S, dtype=fp8, v_transposed=transposed)
        else:
            kc, kd = quantize_fp8(k.transpose(0, 1).reshape(1, Hkv, -1, D), dtype=fp8)
            vc, vd = quantize_fp8(v.transpose(0, 1).reshape(1, Hkv, -1, D), dtype=fp8)
            kc = kc.reshape(Hkv, shape[0], S, D).transpose(0, 1).contiguous()
            vc = vc.reshape(Hkv, shape[0], S, D).transpose(0, 1)
            vc = (vc.transpose(-1, -2) if transposed else vc).contiguous()
            kd, vd = kd.expand(B, Hkv).contiguous(), vd.expand(B, Hkv).contiguous()
        kw = dict(k_descale=kd, v_descale=vd)
        if transposed:
            kw["v_transposed"] = True
    return q, kc, vc, torch.tensor(lens, dtype=torch.int32), table, splits, kw


def run_all():
    records = {}
    launches = []
    real = interpret.launch

    def spy(grid, kernel, args, **kw):
        real(grid, kernel, args, **kw)
        # The fp32 scratch a launch wrote: the partial outputs (4-d) and LSEs (3-d).
        launches.append([a.clone() for a in args if isinstance(a, torch.Tensor)
                         and a.dtype == torch.float32 and a.ndim in (3, 4) and a.numel() > 1])

    interpret.launch = spy
    try:
        for case in CASES:
            for arch in case[-1]:
                q, kc, vc, lens, table, splits, kw = _inputs(case)
                launches.clear()
                with interpret.enabled(arch):
                    out = flashattn.decode(q, kc, vc, lens, block_table=table,
                                           num_splits=splits, check_values=False, **kw)
                scratch = [t for launch in launches for t in launch]
                records[f"{case[0]} [{arch}]"] = dict(out=out, scratch=scratch)
                print(f"ran {case[0]} [{arch}]: {len(launches)} launches", flush=True)
    finally:
        interpret.launch = real
    return records


def _bits(t):
    t = t.contiguous()
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def check(path):
    before = torch.load(path)
    after = run_all()
    bad = 0
    for key, rec in before.items():
        new = after.get(key)
        if new is None:
            print(f"MISSING {key}")
            bad += 1
            continue
        same_out = torch.equal(_bits(rec["out"]), _bits(new["out"]))
        # The scratch of the new code, matched by shape (its launch order may differ).
        old_s = sorted(((tuple(t.shape), _bits(t)) for t in rec["scratch"]), key=lambda x: x[0])
        new_s = sorted(((tuple(t.shape), _bits(t)) for t in new["scratch"]), key=lambda x: x[0])
        same_scratch = (len(old_s) == len(new_s)
                        and all(a[0] == b[0] and torch.equal(a[1], b[1])
                                for a, b in zip(old_s, new_s)))
        ok = same_out and same_scratch
        bad += not ok
        print(f"{'bit-equal' if ok else 'DIFFERS'}  out={same_out} scratch={same_scratch} "
              f"({len(new_s)} arrays)  {key}")
    print(f"{len(before) - bad}/{len(before)} cases bit-equal")
    return bad


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "save":
        import os
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(run_all(), path)
        print(f"saved {path}")
    else:
        sys.exit(1 if check(path) else 0)
