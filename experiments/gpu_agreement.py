"""The interpreter against the GPU: the same random inputs through every shipped kernel, once on
the GPU and once in ``flashattn.interpret`` (CPU), and both against the fp64 reference.

    python experiments/gpu_agreement.py --out agreement.json          # on a GPU: both sides
    python experiments/gpu_agreement.py --cpu-only --out cpu.json     # the interpreter's side

Inputs come from a fixed seed per case, made on the CPU and copied to the GPU, so both sides
see the same bits. Each row: the case, max |GPU - interpreter| per output, each side's max error
against the fp64 reference and whether it meets the FlashAttention criterion (2 x PyTorch's
own same-precision error + a floor). A second part runs small targeted kernels
(``tests/interpret_kernels.py``: ``ct.load``'s ``order``, zero/NaN padding, ragged edge
stores, atomics) on both and requires bit-equal results where the GPU's behaviour is defined.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import zlib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import flashattn                                    # noqa: E402
import flashbook                                    # noqa: E402
from flashattn import interpret, reference          # noqa: E402


def _seed(name: str) -> int:
    return zlib.crc32(name.encode()) % (1 << 31)


def _randn(g, *shape, dtype=torch.float16):
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)


# --- the cases ------------------------------------------------------------------------------
# Each case: name -> (make(g) -> dict of CPU tensors, run(inputs, device) -> list of outputs,
# ref(inputs) -> list of fp64 references (and the same-precision "pt" outputs for the
# criterion), floor).

def _fwd_case(step, *, causal, N=200, Nk=None, D=64, Hq=4, Hkv=2, input_pos=0,
              dtype=torch.float16):
    Nk = Nk or N

    def make(g):
        return dict(q=_randn(g, 1, Hq, N, D, dtype=dtype), k=_randn(g, 1, Hkv, Nk, D, dtype=dtype),
                    v=_randn(g, 1, Hkv, Nk, D, dtype=dtype))

    def run(x):
        return [flashbook.attention(x["q"], x["k"], x["v"], causal=causal, step=step,
                                    input_pos=input_pos)]

    def ref(x):
        q, k, v = (x[n] for n in "qkv")
        r = reference.attention(q.double(), k.double(), v.double(), causal=causal,
                                input_pos=input_pos)
        pt = reference.attention(q.float(), k.float(), v.float(), causal=causal,
                                 input_pos=input_pos).to(dtype)
        return [(r, pt)]
    return make, run, ref, 1e-3 if dtype == torch.float16 else 8e-3


def _bwd_case(*, causal, deterministic, N=150, D=64, Hq=4, Hkv=2):
    def make(g):
        return dict(q=_randn(g, 1, Hq, N, D), k=_randn(g, 1, Hkv, N, D), v=_randn(g, 1, Hkv, N, D),
                    do=_randn(g, 1, Hq, N, D))

    def run(x):
        from flashattn import launch_bwd
        q, k, v, do = (x[n] for n in ("q", "k", "v", "do"))
        lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
        out = torch.empty_like(q)
        step = flashbook.get_step("arch_tuned")
        from flashattn.launch import launch
        launch(q, k, v, out, step, step.config_for(_arch(q.device)), causal=causal,
               scale=D ** -0.5, lse=lse)
        r = launch_bwd.attention_backward(q, k, v, out, do, lse, causal=causal,
                                          deterministic=deterministic)
        return list(r[:3])

    def ref(x):
        q, k, v, do = (x[n] for n in ("q", "k", "v", "do"))
        r = reference.attention_backward(q.double(), k.double(), v.double(), do.double(),
                                         causal=causal)
        pt = reference.attention_backward(q.float(), k.float(), v.float(), do.float(),
                                          causal=causal)
        return [(a, b.half()) for a, b in zip(r, pt)]
    return make, run, ref, 1e-2


def _arch(device):
    if device.type == "cpu":
        return interpret.arch()
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _decode_case(*, B, Hq, Hkv, Nq, S, lens, num_splits, paged=False, fused=False, D=64):
    page = 32

    def make(g):
        x = dict(q=_randn(g, B, Hq, Nq, D), seqlens=torch.tensor(lens, dtype=torch.int32))
        if paged:
            pages = B * (S // page)
            x["k"] = _randn(g, pages, Hkv, page, D)
            x["v"] = _randn(g, pages, Hkv, page, D)
            perm = torch.randperm(pages, generator=g).to(torch.int32)
            x["table"] = perm.reshape(B, S // page)
        else:
            x["k"] = _randn(g, B, Hkv, S, D)
            x["v"] = _randn(g, B, Hkv, S, D)
        return x

    def run(x):
        from flashbook.ladder import variants  # the fused merge is the book's ladder kernel
        fn = variants.decode if fused else flashattn.decode
        old = variants.DECODE_FUSED_COMBINE
        variants.DECODE_FUSED_COMBINE = fused
        try:
            return [fn(x["q"], x["k"], x["v"], x["seqlens"], block_table=x.get("table"),
                       num_splits=num_splits)]
        finally:
            variants.DECODE_FUSED_COMBINE = old

    def ref(x):
        args = (x["k"], x["v"], x["seqlens"].cpu())
        r = reference.decode_attention(x["q"].double(), args[0].double(), args[1].double(),
                                       args[2], x.get("table"))
        pt = reference.decode_attention(x["q"].float(), args[0].float(), args[1].float(),
                                        args[2], x.get("table"))
        return [(torch.as_tensor(r), torch.as_tensor(pt).half())]
    return make, run, ref, 1e-3


def _varlen_case(*, lens_q, lens_k, causal, D=64, Hq=4, Hkv=2):
    def make(g):
        tq, tk = sum(lens_q), sum(lens_k)
        cq = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
        ck = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
        return dict(q=_randn(g, tq, Hq, D), k=_randn(g, tk, Hkv, D), v=_randn(g, tk, Hkv, D),
                    cq=cq, ck=ck)

    def run(x):
        return [flashattn.attention_varlen(x["q"], x["k"], x["v"], x["cq"], x["ck"],
                                           max(lens_q), max(lens_k), causal=causal)]

    def ref(x):
        a = (x["cq"].cpu(), x["ck"].cpu(), max(lens_q), max(lens_k))
        r = reference.varlen_attention(x["q"].double(), x["k"].double(), x["v"].double(), *a,
                                       causal=causal)
        pt = reference.varlen_attention(x["q"].float(), x["k"].float(), x["v"].float(), *a,
                                        causal=causal)
        return [(torch.as_tensor(r), torch.as_tensor(pt).half())]
    return make, run, ref, 1e-3


def cases() -> dict:
    out = {}
    for step in list(flashbook.STEP_NAMES) + list(flashbook.EXPERIMENTS):
        for causal in (True, False):
            out[f"forward {step} {'causal' if causal else 'full'}"] = _fwd_case(step, causal=causal)
    out["forward best bf16 GQA 4:1 D=128"] = _fwd_case("best", causal=True, D=128, Hq=8, Hkv=2,
                                                       dtype=torch.bfloat16)
    out["forward best input_pos"] = _fwd_case("best", causal=True, N=100, Nk=300, input_pos=200)
    out["forward best MQA D=80 N=17"] = _fwd_case("best", causal=True, N=17, D=80, Hq=4, Hkv=1)
    for det in (True, False):
        for causal in (True, False):
            out[f"backward {'deterministic' if det else 'atomic'} "
                f"{'causal' if causal else 'full'}"] = _bwd_case(causal=causal, deterministic=det)
    out["decode final (1 split)"] = _decode_case(B=2, Hq=8, Hkv=2, Nq=1, S=256, lens=[200, 1],
                                                 num_splits=1)
    out["decode block combine"] = _decode_case(B=4, Hq=8, Hkv=2, Nq=4, S=512,
                                               lens=[512, 300, 4, 129], num_splits=4)
    out["decode row combine"] = _decode_case(B=1, Hq=8, Hkv=2, Nq=1, S=1024, lens=[1000],
                                             num_splits=8)
    out["decode fused merge"] = _decode_case(B=2, Hq=8, Hkv=2, Nq=2, S=512, lens=[511, 64],
                                             num_splits=4, fused=True)
    out["decode paged"] = _decode_case(B=2, Hq=8, Hkv=2, Nq=1, S=256, lens=[256, 37],
                                       num_splits=2, paged=True)
    out["decode lengths 0 and 1"] = _decode_case(B=2, Hq=4, Hkv=4, Nq=1, S=128, lens=[0, 1],
                                                 num_splits=2)
    out["varlen causal, an empty sequence"] = _varlen_case(lens_q=[100, 0, 37, 200],
                                                           lens_k=[100, 0, 37, 200], causal=True)
    out["varlen full, Nq != Nk"] = _varlen_case(lens_q=[50, 17], lens_k=[120, 17], causal=False)
    return out


# --- running a case on a device ---------------------------------------------------------------

def _side(run, x, device):
    xs = {k: v.to(device) for k, v in x.items()}
    ctx = interpret.enabled() if device == "cpu" else contextlib.nullcontext()
    t = time.perf_counter()
    with ctx:
        outs = run(xs)
        if device != "cpu":
            torch.cuda.synchronize()
    return [o.detach().cpu() for o in outs], time.perf_counter() - t


def _err(a, b) -> float:
    d = (a.double() - b.double()).abs()
    return float("nan") if torch.isnan(d).any() else d.max().item()


def _meets(out, r, pt, floor) -> bool:
    if not torch.isfinite(out).all():
        return False
    return _err(out, r) <= 2 * _err(pt, r) + floor


def run_cases(gpu: bool, only: str | None = None) -> list[dict]:
    rows = []
    for name, (make, run, ref, floor) in cases().items():
        if only and only not in name:
            continue
        g = torch.Generator().manual_seed(_seed(name))
        x = make(g)
        refs = ref(x)
        row = dict(case=name)
        try:
            cpu, row["interp_s"] = _side(run, x, "cpu")
            row["interp_err"] = [_err(o, r) for o, (r, _) in zip(cpu, refs)]
            row["interp_ok"] = all(_meets(o, r, pt, floor) for o, (r, pt) in zip(cpu, refs))
        except Exception as e:                                         # recorded, not hidden
            row["interp_error"] = f"{type(e).__name__}: {e}"[:400]
            cpu = None
        if gpu:
            try:
                dev, row["gpu_s"] = _side(run, x, "cuda")
                row["gpu_err"] = [_err(o, r) for o, (r, _) in zip(dev, refs)]
                row["gpu_ok"] = all(_meets(o, r, pt, floor) for o, (r, pt) in zip(dev, refs))
                if cpu is not None:
                    row["gpu_vs_interp"] = [_err(a, b) for a, b in zip(dev, cpu)]
            except Exception as e:
                row["gpu_error"] = f"{type(e).__name__}: {e}"[:400]
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _fmt(v):
    if isinstance(v, list):
        return "/".join(f"{x:.1e}" for x in v)
    return str(v)


def _line(r) -> str:
    parts = [f"{r['case']:<44}"]
    for k in ("gpu_vs_interp", "gpu_err", "interp_err", "gpu_ok", "interp_ok"):
        if k in r:
            parts.append(f"{k}={_fmt(r[k])}")
    for k in ("interp_error", "gpu_error"):
        if k in r:
            parts.append(f"{k}={r[k][:160]}")
    return "  ".join(parts)


# --- targeted kernels: the interpreter's assumptions about ct.load/ct.store --------------------

def targeted(gpu: bool) -> list[dict]:
    import interpret_kernels as K

    def both(kernel, grid, make):
        """``make()`` builds the inputs once (CPU); each side runs on its own copy."""
        inputs = make()
        res = {}
        for dev in (["cpu", "cuda"] if gpu else ["cpu"]):
            args = tuple(a.clone().to(dev) if isinstance(a, torch.Tensor) else a for a in inputs)
            if dev == "cpu":
                interpret.launch(grid, kernel, args)
            else:
                import cuda.tile as ct
                ct.launch(torch.cuda.current_stream(), grid, kernel, args)
                torch.cuda.synchronize()
            res[dev] = [a.cpu() for a in args if isinstance(a, torch.Tensor)]
        return res

    x = torch.randn(100).half()
    out = []

    def rec(name, res, idx=-1, defined=slice(None)):
        row = dict(case=name)
        if "cuda" in res:
            a, b = res["cpu"][idx][defined], res["cuda"][idx][defined]
            row["equal"] = bool(torch.equal(a, b))
        out.append(row)
        print(row, flush=True)

    rec("zero padding past the end (load, ragged store dropped)",
        both(K.copy_kernel, (2,), lambda: (x, torch.full((100,), 7.0).half(), 64)))
    rec("undetermined padding: the defined part",
        both(K.load_no_padding, (2,), lambda: (x, torch.zeros(128).half(), 64)),
        defined=slice(0, 100))
    a2 = torch.randn(4, 4).half()
    rec("order='F' load (transposed), as documented",
        both(K.transpose_kernel, (1,), lambda: (a2, torch.zeros(4, 4).half())))
    rec("order=(0,2,1) with a ragged tile and zero padding",
        both(K.order_kernel, (2, 2), lambda: (torch.randn(3, 5, 6).half(),
                                              torch.zeros(3, 8, 8).half())))
    rec("atomic tickets: every program once",
        both(K.ticket, (16,), lambda: (torch.zeros(1, dtype=torch.int32),
                                      torch.full((16,), -1, dtype=torch.int32))), idx=0)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cpu-only", action="store_true", help="the interpreter's side only")
    p.add_argument("--only", help="run the cases whose name contains this")
    p.add_argument("--targeted-only", action="store_true", help="only the targeted kernels")
    a = p.parse_args(argv)
    gpu = not a.cpu_only and torch.cuda.is_available()
    torch.manual_seed(0)
    rows = [] if a.targeted_only else run_cases(gpu, a.only)
    checks = [] if a.only else targeted(gpu)
    doc = dict(meta=flashattn.env.metadata() if hasattr(flashattn.env, "metadata") else {},
               gpu=gpu, rows=rows, targeted=checks)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1, default=str))
    bad = [r["case"] for r in rows if r.get("interp_ok") is False or r.get("gpu_ok") is False
           or "interp_error" in r or "gpu_error" in r]
    bad += [c["case"] for c in checks if c.get("equal") is False]
    print(f"{len(rows)} cases, {len(checks)} targeted checks; failing: {bad or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
