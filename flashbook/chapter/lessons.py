"""What the lesson pages share (``book/gpu_primer``, ``final_kernel``, ``autotuners``,
``fa_generations``, ``blackwell``): the machine's figures, and the SASS of the kernels read back.

Every SASS fact these pages show is computed here from a cubin that ``flashattn.aot`` compiles at
the page's run (on a CPU, in seconds, cached in ``~/.cache/flashattn/cubins``); nothing is typed
by hand. Figures of the hardware are either the recorded device metadata (``results/<gpu>/``) or
published specifications, each with its source; published results of other people's kernels
carry their paper.

    sass = lessons.sass("best", "sm_90")          # the SASS listing of the kernel step="best" runs
    lessons.loops(sass)                           # its K loops: (start, end) addresses
    lessons.outline(sass, *lessons.loops(sass)[0])   # one K-loop iteration, instruction by role
    lessons.techniques({"sm_90": s90, "sm_100": s100})   # the seeds' techniques, counted
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..hardware import PEAK_TFLOPS

# --- the machine -------------------------------------------------------------------------------

# Short names; book/references.md gives each document in full.
HOPPER_TUNING = "Hopper tuning guide"
CUDA_GUIDE = "CUDA Programming Guide"
H100_WHITEPAPER = "H100 whitepaper"
H200_SPECS = "H200 specifications"

# (what, published value, source). Hopper's limits per SM and the H200's memory: the figures the
# primer explains, as NVIDIA publishes them. Not measurements of ours.
PUBLISHED_H200 = (
    ("threads per warp", "32", CUDA_GUIDE),
    ("resident warps per SM (most)", "64", CUDA_GUIDE),
    ("32-bit registers per SM", "65,536", CUDA_GUIDE),
    ("registers per thread (most)", "255", CUDA_GUIDE),
    ("shared memory per SM (most)", "228 KB", HOPPER_TUNING),
    ("tensor cores per SM", "4", H100_WHITEPAPER),
    ("L2 cache", "50 MB", H100_WHITEPAPER),
    ("HBM3e bandwidth", "4.8 TB/s", H200_SPECS),
    ("FP16 tensor-core peak (dense)", f"about {PEAK_TFLOPS:.0f} TFLOPS", H200_SPECS),
)


def device_table(r):
    """The H200 in one table: what the recording says about the device it ran on (GPU, SMs,
    memory, compute capability, the shared memory the driver configured for the final kernel),
    then the published limits the primer uses, each with its source."""
    import pandas as pd
    m = r.profile_meta          # the device metadata of the profiled run (the final kernel's)
    rows = [("GPU", m["gpu"], "recorded"),
            ("compute capability", f"{m['compute_capability']} (sm_90)", "recorded"),
            ("streaming multiprocessors (SMs)", f"{int(m['sm_count'])}", "recorded"),
            ("GPU memory (HBM3e)", f"{m['gpu_memory_gib']:.1f} GiB", "recorded")]
    rows += [(what, value, f"published: {src}") for what, value, src in PUBLISHED_H200]
    return pd.DataFrame(rows, columns=["quantity", "value", "source"]).set_index("quantity")


def program_resources(r, step: str):
    """How one step's kernel used the machine, from its Nsight Compute profile (B=4, H=32,
    N=4K, D=128, causal): threads per program, registers, shared memory, programs per SM, grid
    and waves (integers as integers)."""
    import pandas as pd
    rows = r.profile[r.profile["step"] == step]
    assert len(rows) == 1, f"{len(rows)} profiled kernels for {step!r}"
    p = rows.iloc[0]
    rows = [("threads per program (CTA)", p["launch__block_size"], "threads"),
            ("warps per program", p["launch__block_size"] / 32, "warps"),
            ("registers per thread (allocated)", p["launch__registers_per_thread_allocated"],
             "registers"),
            ("shared memory per program", p["launch__shared_mem_per_block"] / 1024, "KiB"),
            ("programs per SM (occupancy limit: registers)",
             p["launch__occupancy_limit_registers"], "programs"),
            ("programs in the grid", p["launch__grid_size"], "programs"),
            ("SMs", p["launch__sm_count"], "SMs"),
            ("waves (grid / (SMs × programs per SM))", p["launch__waves_per_multiprocessor"],
             "waves")]
    fmt = [f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}" for _, v, _ in rows]
    sh = (r.profile_meta.get("per_step", {}).get(step) or r.profile_meta)["shape"]
    rows.insert(0, ("workload", None, ""))
    fmt.insert(0, f"B={sh['B']} H={sh['Hq']} N={sh['N']} D={sh['D']} {sh['dtype']}"
                  f"{' causal' if sh['causal'] else ''}")
    return pd.DataFrame({"value": fmt, "unit": [u for *_, u in rows]},
                        index=pd.Index([w for w, *_ in rows], name=f"step {step}"))


# --- SASS, read back ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Instr:
    addr: int            # byte offset in the kernel
    op: str              # opcode with its modifiers, predicate stripped: "HGMMA.64x128x16.F32"
    text: str            # the instruction as cuobjdump prints it, without the trailing ';'

    @property
    def base(self) -> str:
        return self.op.split(".")[0]


_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def sass(step: str, arch: str, config=None) -> str:
    """The SASS listing of ``step``'s fused kernel for ``arch`` ("best" resolved for ``arch``),
    compiled now (or read from the cubin cache); ``config`` pins another configuration."""
    from flashattn import aot
    from flashbook.steps import resolve_name
    name = resolve_name(step, arch).name
    rep = aot.compile_step(name, arch, config=config, keep_sass=True)[0]
    if rep.error:
        raise RuntimeError(f"{name} for {arch}: {rep.error}")
    return rep.sass_text  # type: ignore[attr-defined]


def instructions(text: str) -> list[Instr]:
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            body = re.sub(r"^@!?U?P[T\d]\s+", "", m[2])
            out.append(Instr(int(m[1], 16), body.split()[0], m[2]))
    return out


def count(text_or_instrs, pattern: str) -> int:
    """Instructions whose opcode (with modifiers) matches ``pattern`` (a regex, from the start)."""
    ins = instructions(text_or_instrs) if isinstance(text_or_instrs, str) else text_or_instrs
    rx = re.compile(pattern)
    return sum(1 for i in ins if rx.match(i.op))


def _target(i: Instr) -> int | None:
    m = re.search(r"\bBRA\s+(?:`\(\S+\)\s*)?0x([0-9a-f]+)", i.text)
    return int(m[1], 16) if m and i.base == "BRA" else None


def loops(text: str, body: str = r"(HGMMA|UTC\w*MMA)") -> list[tuple[int, int]]:
    """The kernel's loops whose body holds an instruction matching ``body`` (default: a
    tensor-core MMA): (start, end) of each backward branch over such a body that does not span
    an ``EXIT`` (out-of-line retry paths jump back across the kernel's end), innermost only, in
    address order."""
    ins = instructions(text)
    rx = re.compile(body)
    found = []
    for i in ins:
        t = _target(i)
        if t is None or t >= i.addr:
            continue
        span = [j for j in ins if t <= j.addr <= i.addr]
        if any(rx.match(j.op) for j in span) and not any(j.base == "EXIT" for j in span):
            found.append((t, i.addr))
    inner = [s for s in found if not any(o != s and s[0] <= o[0] and o[1] <= s[1]
                                         for o in found)]
    return sorted(set(inner))


# The instructions a K-loop iteration is read by, and what each does there.
ROLES = (
    (r"SYNCS\.PHASECHK", "wait: a K/V tile landed (mbarrier)"),
    (r"SYNCS\.ARRIVE\.TRANS64\.A1T0", "release the K/V buffer (mbarrier)"),
    (r"SYNCS\.ARRIVE", "expect a TMA copy's bytes (mbarrier)"),
    (r"WARPGROUP\.ARRIVE", "warpgroup: operands ready"),
    (r"HGMMA", "MMA: HGMMA (warpgroup)"),
    (r"UTC\w*MMA", "MMA: UTCHMMA (tensor memory)"),
    (r"WARPGROUP\.DEPBAR", "wait for the MMAs"),
    (r"UTCBAR", "commit the MMAs (mbarrier)"),
    (r"LDTM", "tensor memory → registers"),
    (r"STTM", "registers → tensor memory"),
    (r"SHFL", "shuffle: row max / row sum"),
    (r"MUFU\.EX2", "exp2 (MUFU)"),
    (r"MUFU\.RCP", "reciprocal (MUFU)"),
    (r"UTMALDG", "TMA copy, global → shared"),
    (r"BAR\.", "barrier between warps"),
)


def role(op: str) -> str | None:
    for pat, what in ROLES:
        if re.match(pat, op):
            return what
    return None


def outline(text: str, start: int, end: int, *, first_operand: bool = True):
    """One pass over [start, end] (a loop from ``loops``) as a table: each run of instructions of
    one role, in program order, with its first address, how many in a row, and the first of
    them (``first_operand``: the opcode and its operands, which say where an MMA's operands come
    from). Instructions of no role (integer arithmetic, FMUL, FMNMX, ...) are skipped."""
    import pandas as pd
    rows = []
    for i in instructions(text):
        if not start <= i.addr <= end:
            continue
        what = role(i.op)
        if what is None:
            continue
        if rows and rows[-1]["role"] == what:
            rows[-1]["count"] += 1
            continue
        shown = re.sub(r"\s+", " ", i.text if first_operand else i.op)
        rows.append({"address": f"{i.addr:#06x}", "role": what, "count": 1,
                     "first instruction": shown[:72]})
    return pd.DataFrame(rows).set_index("address")


def order(text: str, start: int, end: int) -> list[str]:
    """The roles of [start, end] in program order, runs merged: what ``outline`` shows, as a list
    (for assertions on the page: which comes before which)."""
    return list(outline(text, start, end)["role"])


# The seeds' hand-written techniques, and the SASS that shows each (or its replacement).
TECHNIQUES = (
    ("ldmatrix: shared memory -> MMA fragments", r"LDSM"),
    ("stmatrix: MMA fragments -> shared memory (the output tile)", r"STSM"),
    ("plain shared-memory loads / stores (LDS / STS)", r"(LDS|STS)(\.|$)"),
    ("TMA tile copies, global -> shared (swizzle set in the tensor map)", r"UTMALDG"),
    ("TMA tile copies, shared -> global", r"UTMASTG"),
    ("warp-shuffle reductions (SHFL)", r"SHFL"),
    ("MMA with its A operand in registers (P after softmax)", r"HGMMA\S*\s+R\d+,\s*R\d+"),
    ("MMA with both operands in shared memory (Q K^T)", r"HGMMA\S*\s+R\d+,\s*gdesc"),
    ("MMA into tensor memory (tcgen05)", r"UTC\w*MMA"),
    ("fp32 -> fp16 packing (P for the second product)", r"F2FP"),
    ("mbarrier waits (multi-stage buffers)", r"SYNCS\.PHASECHK\.TRANS64\.TRYWAIT"),
    ("register re-allocation between warp groups", r"USETMAXREG"),
)


def techniques(listings: dict[str, str]):
    """For each technique, how many instructions of each listing (arch -> SASS) show it.
    Patterns match the instruction text (opcode and operands), so an MMA's operand sources can
    be told apart."""
    import pandas as pd
    parsed = {a: instructions(t) for a, t in listings.items()}
    rows = []
    for what, pat in TECHNIQUES:
        rx = re.compile(pat)
        rows.append({"technique": what, **{arch: sum(1 for i in ins if rx.match(i.text))
                                           for arch, ins in parsed.items()}})
    return pd.DataFrame(rows).set_index("technique")


def _hex_operands(text: str, op: str, pattern: str) -> set[int]:
    """The distinct hex numbers ``pattern``'s first group matches in the ``op`` instructions."""
    out = set()
    for i in instructions(text):
        if i.op.startswith(op):
            m = re.search(pattern, i.text)
            if m:
                out.add(int(m[1], 16))
    return out


def mbarrier_slots(text: str) -> int:
    """Distinct mbarriers the kernel waits on (``SYNCS.PHASECHK`` addresses): one per buffer
    stage and direction (full / empty), plus the output's."""
    return len(_hex_operands(text, "SYNCS.PHASECHK", r"\[[^\]]*?(0x[0-9a-f]+)\]"))


def register_split(text: str) -> dict[str, list[int]]:
    """The register budgets ``USETMAXREG`` sets: ``alloc`` (warp groups that grow: consumers)
    and ``dealloc`` (warp groups that give registers back: the producer)."""
    out = {"alloc": [], "dealloc": []}
    for i in instructions(text):
        if i.op.startswith("USETMAXREG"):
            m = re.search(r"0x([0-9a-f]+)\s*$", i.text)
            kind = "dealloc" if "DEALLOC" in i.op else "alloc"
            if m:
                out[kind].append(int(m[1], 16))
    return {k: sorted(set(v)) for k, v in out.items()}


# --- published results of other kernels ----------------------------------------------------------

FA3_CITE = "Shah et al., FlashAttention-3 (arXiv 2407.08608), abstract"

# What the FlashAttention-3 paper's abstract states for its forward pass on an H100 SXM5. The
# per-length curves of its figures are not reproduced here: no source text of them was at hand.
FA3_PUBLISHED = (
    ("FP16 forward, best reported", "up to 740 TFLOPS (75 % of the H100's peak)"),
    ("FP8 forward, best reported", "close to 1.2 PFLOPS"),
    ("speed-up over FlashAttention-2 (FP16)", "1.5–2.0×"),
)


def fa3_beside_ours(r, workload: str = "fp16-causal-d128"):
    """FlashAttention-3's published H100 figures beside the recorded H200 numbers of this
    book's final kernel (``best``) and PyTorch's FlashAttention-2 on one workload: the best
    TFLOPS over the recorded lengths, and the range over those lengths of the ratio of the two
    median times."""
    import pandas as pd
    b = r.bench[r.bench["workload"] == workload]
    best = b[b["impl"] == "best"].set_index("Nq")
    fa2 = b[b["impl"] == "sdpa_flash"].set_index("Nq")
    ns = sorted(set(best.index) & set(fa2.index))
    ratio = best.loc[ns, "tflops"] / fa2.loc[ns, "tflops"]
    rows = [("FlashAttention-3, " + what, value, f"published, H100 SXM5 (other hardware): "
             f"{FA3_CITE}") for what, value in FA3_PUBLISHED]
    rows += [(f"this book's best kernel, {workload}, best over N = {min(ns)}–{max(ns)}",
              f"{best.loc[ns, 'tflops'].max():.0f} TFLOPS", "recorded, H200 (results/h200)"),
             (f"PyTorch's FlashAttention-2, {workload}, same lengths",
              f"{fa2.loc[ns, 'tflops'].max():.0f} TFLOPS", "recorded, H200 (results/h200)"),
             ("this book's best kernel / FlashAttention-2 (ratio of the medians)",
              f"{ratio.min():.2f}–{ratio.max():.2f}×", "recorded, H200 (results/h200)")]
    return pd.DataFrame(rows, columns=["figure", "value", "source"]).set_index("figure")


# --- cuTile's own autotuner, on the book's kernel -------------------------------------------------

def cutile_search(q, k, v, *, causal: bool, step: str = "best"):
    """Tune a step's search space with cuTile's autotuner,
    ``cuda.tile.tune.exhaustive_search``, instead of the book's
    (``flashattn.autotune.search``): the same configurations, grids,
    kernels and arguments (``launch.fmha_args``), timed cuTile's way.
    Returns its ``TuningResult`` (``.best.config`` is a ``Config``).
    CUDA tensors only: there is nothing to time on a CPU."""
    import torch
    from cuda.tile import tune

    from flashattn.dispatch import device_arch
    from flashattn.launch import fmha_args
    from flashbook.steps import resolve_name
    arch = device_arch(q.device)
    s = resolve_name(step, arch)
    out = torch.empty_like(q)
    scale = q.shape[-1] ** -0.5

    def parts(cfg):        # (grid, hinted kernel, args) of one configuration
        return fmha_args(q, k, v, out, s, cfg, causal=causal, scale=scale,
                         input_pos=0)

    return tune.exhaustive_search(
        list(s.configs(arch)), torch.cuda.current_stream(),
        grid_fn=lambda cfg: parts(cfg)[0],
        kernel=lambda cfg: parts(cfg)[1],
        args_fn=lambda cfg: parts(cfg)[2], quiet=True)


def tuner_constants() -> dict:
    """The constants that steer cuTile's search, read from the installed package."""
    from cuda.tile.tune import _tune
    return {name: getattr(_tune, name) for name in ("_WARM_UP_REPEATS", "_BATCH_REPEATS",
                                                    "_MIN_REPEATS", "_MAX_REPEATS", "_TOP_K",
                                                    "_MAX_MEASURE_TIME_US")}


# --- FlashAttention-1, -2, -3 against the SASS ------------------------------------------------------

def partitioning(r, step: str = "warp_groups"):
    """Programs a launch has under FlashAttention-1's partitioning (one per batch and head) and
    under FlashAttention-2's, which the book's kernel uses (one per query tile, batch and head),
    for the profiled workload and the step's profiled tiles; beside the SMs it has to fill."""
    import pandas as pd

    from flashattn.kernels import fmha_grid
    from flashbook.steps import Config, get_step
    meta = r.profile_meta
    sh = meta["per_step"][step]["shape"]
    cfg = Config.parse(meta["per_step"][step]["config"])
    gx, gy, gz = fmha_grid(get_step(step), cfg, B=sh["B"], Hq=sh["Hq"], Nq=sh["N"])
    sms = int(meta["sm_count"])
    rows = [("FlashAttention-1: one program per (batch, head)", sh["B"] * sh["Hq"]),
            (f"FlashAttention-2: one per ({cfg.TILE_M}-row query tile, batch, head)", gx * gy * gz),
            ("SMs of the GPU", sms)]
    return pd.DataFrame({"programs": [f"{n:,}" for _, n in rows]},
                        index=pd.Index([w for w, _ in rows],
                                       name=f"B={sh['B']} H={sh['Hq']} N={sh['N']}"))


def io_model(B: int, H: int, N: int, D: int, tile_m: int, tile_n: int, nbytes: int = 2,
             *, gb: bool = True):
    """HBM traffic of one non-causal forward pass under the two loop orders, a model (bytes moved
    by the algorithm, caches ignored), in GB. FlashAttention-1 (K/V outer, Q inner) re-reads Q and
    reads and writes O and its row statistics once per K/V tile; FlashAttention-2 (Q outer, K/V
    inner) reads Q once and writes O once, and re-reads K and V once per query tile.
    ``gb=False``: bytes, unrounded."""
    import pandas as pd
    tq, tk = -(-N // tile_m), -(-N // tile_n)
    mat = B * H * N * D * nbytes                      # one (B, H, N, D) tensor
    stats = B * H * N * 4 * 2                         # m and l, fp32, per row
    fa1 = {"Q": tk * mat, "K, V": 2 * mat, "O and m, l (read + write)": tk * (2 * mat + 2 * stats)}
    fa2 = {"Q": mat, "K, V": 2 * tq * mat, "O and m, l (read + write)": mat}
    df = pd.DataFrame({"FlashAttention-1 order": fa1, "FlashAttention-2 order": fa2})
    df.loc["total"] = df.sum()
    if not gb:
        return df
    df.index.name = f"GB moved, B={B} H={H} N={N} D={D}, {tile_m}×{tile_n} tiles"
    return (df / 1e9).round(2)


def _depbar_waits(ins) -> list[int]:
    """The counts of in-flight MMA groups each ``WARPGROUP.DEPBAR.LE gsb0, N`` allows."""
    out = []
    for i in ins:
        if i.op.startswith("WARPGROUP.DEPBAR"):
            m = re.search(r"gsb0,\s*0x([0-9a-f]+)", i.text)
            out.append(int(m[1], 16) if m else -1)
    return out


def hopper_schedule(text: str):
    """What the SASS of a Hopper kernel says about FlashAttention-3's three techniques: one row
    each, with the evidence counted in the listing and a verdict in words."""
    import pandas as pd
    ins = instructions(text)
    spans = loops(text)
    body = [i for i in ins if any(a <= i.addr <= b for a, b in spans)]
    split = register_split(text)
    elect_tma = count(ins, r"ELECT") > 0 and count(ins, r"UTMALDG") > 0
    waits = _depbar_waits(body)
    named = [i for i in body if i.base == "BAR"]
    rows = [
        ("warp specialisation (a producer warpgroup feeds consumers)",
         f"USETMAXREG: producers down to {split['dealloc']}, consumers up to {split['alloc']} "
         f"registers; ELECT + UTMALDG: {'one thread issues the TMA copies' if elect_tma else 'none'}",
         "yes" if split["alloc"] and split["dealloc"] and elect_tma else "no"),
        ("ping-pong between two consumer warpgroups (named barriers order their MMAs)",
         f"named barriers (BAR) inside the K loops: {len(named)}",
         "yes" if named else "no: nothing orders the consumer warpgroups"),
        ("intra-warpgroup overlap (the next Q·Kᵀ issued before this softmax)",
         "WARPGROUP.DEPBAR in the K loops allows at most "
         f"{max(waits) if waits else 0} MMA group(s) in flight ({len(waits)} waits)",
         "yes" if waits and max(waits) > 0 else "no: each product is waited for before the "
                                                "softmax or the next product"),
    ]
    return pd.DataFrame(rows, columns=["FlashAttention-3 technique", "evidence in the SASS",
                                       "does tileiras do it?"]).set_index(
        "FlashAttention-3 technique")


def shuffle_lanes(text: str) -> list[int]:
    """The lane masks of the butterfly shuffles (``SHFL.BFLY ..., MASK, 0x1f``): which threads
    a reduction combines."""
    return sorted(_hex_operands(text, "SHFL.BFLY", r",\s*0x([0-9a-f]+),\s*0x1f\s*$"))


def chained_registers(text: str) -> dict:
    """In the first K loop: the register the first product (scores, both operands in shared
    memory) accumulates into, and the register the second product (P·V) reads its A operand
    from. Equal registers mean P is packed in place, with no data movement between the MMAs."""
    ins = instructions(text)
    a, b = loops(text)[0]
    body = [i for i in ins if a <= i.addr <= b and i.base == "HGMMA"]
    ss = next(i for i in body if re.match(r"HGMMA\S*\s+R\d+,\s*gdesc", i.text))
    rs = next(i for i in body if re.match(r"HGMMA\S*\s+R\d+,\s*R\d+", i.text))
    import pandas as pd
    return pd.Series({"the scores (Q·Kᵀ) accumulate into": re.match(r"HGMMA\S*\s+(R\d+)", ss.text)[1],
                      "P·V reads its A operand from": re.match(r"HGMMA\S*\s+R\d+,\s*(R\d+)",
                                                              rs.text)[1]},
                     name="first register, first K loop")


def best_configs(r, impl: str = "best"):
    """The configuration ``impl`` ran with in every recorded cell of the benchmark (the
    autotuner's choice per workload and length), as a table: workload × N."""
    b = r.bench[r.bench["impl"] == impl].copy()
    b["configuration"] = b["config"].str.split(": ").str[-1].str.replace("x", "×", regex=False)
    b["N"] = b["Nq"].map(lambda n: f"{n // 1024}K" if n % 1024 == 0 else str(n))
    t = b.pivot_table(index="workload", columns="N", values="configuration", aggfunc="first")
    order = sorted(t.columns, key=lambda s: int(s[:-1]) * 1024 if s.endswith("K") else int(s))
    return t[order].fillna("")


# --- Blackwell ----------------------------------------------------------------------------------

LOOP_COLUMNS = (("UTCHMMA", r"UTC\w*MMA"), ("UTCBAR", r"UTCBAR"), ("LDTM", r"LDTM"),
                ("STTM", r"STTM"), ("MUFU.EX2", r"MUFU\.EX2"),
                ("BAR", r"BAR\.(SYNC|ARV)"), ("waits", r"SYNCS\.PHASECHK"))


def loop_roles(text: str):
    """Every loop of the kernel that issues MMAs or exponentials, one row each, with how many
    instructions of each kind its body holds: which warps do what, on Blackwell. ``BAR``: named
    barriers (``BAR.SYNC``/``BAR.ARV``); ``waits``: mbarrier waits (``SYNCS.PHASECHK``)."""
    import pandas as pd
    ins = instructions(text)
    spans = sorted(set(loops(text)) | set(loops(text, r"MUFU\.EX2")))
    rows = []
    for a, b in spans:
        body = [i for i in ins if a <= i.addr <= b]
        row = {"loop": f"{a:#x}–{b:#x}"}
        row.update({name: sum(1 for i in body if re.match(p, i.op)) for name, p in LOOP_COLUMNS})
        rows.append(row)
    df = pd.DataFrame(rows).set_index("loop")
    df["does"] = ["MMAs" if r["UTCHMMA"] else "softmax" if r["MUFU.EX2"] else ""
                  for _, r in df.iterrows()]
    return df


def named_barriers(text: str):
    """How the softmax loops are tied by named barriers (``BAR.SYNC id`` waits, ``BAR.ARV id``
    arrives without waiting): for each loop, the loop that arrives at the barrier it waits on,
    and the loop that waits on the barrier it arrives at. Two loops that name each other take
    turns. Barrier ids are left out: the compiler numbers them as it likes."""
    import pandas as pd
    ins = instructions(text)
    spans = loops(text, r"MUFU\.EX2")
    waits, arrives = {}, {}
    for a, b in spans:
        for i in ins:
            if a <= i.addr <= b and re.match(r"BAR\.(SYNC|ARV)", i.op):
                m = re.search(r"\s(0x[0-9a-f]+),\s*0x[0-9a-f]+", i.text)
                if m:
                    (waits if "SYNC" in i.op else arrives).setdefault((a, b), []).append(
                        int(m[1], 16))

    def name(span):
        return f"{span[0]:#x}–{span[1]:#x}"

    def partner(span, mine, theirs):
        ids = set(mine.get(span, []))
        return ", ".join(name(o) for o in spans if o != span and ids & set(theirs.get(o, [])))

    rows = [{"softmax loop": name(sp),
             "waits for the loop": partner(sp, waits, arrives) or "none",
             "then lets go the loop": partner(sp, arrives, waits) or "none"} for sp in spans]
    return pd.DataFrame(rows).set_index("softmax loop")


# What FlashAttention-4's authors publish about the B200 (other hardware; not measured here):
# (what, as published, where). BLOG: their blog post, which opens the paper's text; NOTE: the
# paper's announcement by its last author.
FA4_BLOG = "FlashAttention-4 blog post (together.ai/blog/flashattention-4), with arXiv 2603.05451"
FA4_NOTE = "the paper's announcement by Tri Dao"
FA4_PUBLISHED = (
    ("BF16 tensor-core throughput, H100 → B200",
     "from 1 to 2.25 PFLOPS; SFU count and shared-memory bandwidth unchanged", FA4_BLOG),
    ("forward bottleneck on the B200", "the exponentials on the SFUs, not the MMAs", FA4_BLOG),
    ("backward bottleneck on the B200", "shared-memory traffic", FA4_BLOG),
    ("FlashAttention-4 forward, BF16, B200", "up to 1605 TFLOPS (71 % utilisation)", FA4_BLOG),
    ("against cuDNN 9.13 and Triton", "up to 1.3× and 2.7× faster", FA4_BLOG),
    ("the exponential", "emulated with polynomials", FA4_NOTE),
    ("softmax rescaling", "a new online softmax avoids 90 % of the rescalings", FA4_NOTE),
    ("two-CTA MMA", "two thread blocks share operands, to reduce shared-memory traffic",
     FA4_NOTE),
)


def fa4_published():
    import pandas as pd
    return pd.DataFrame([(w, v, f"published, B200 (other hardware): {src}")
                         for w, v, src in FA4_PUBLISHED],
                        columns=["FlashAttention-4", "as published", "source"]).set_index(
        "FlashAttention-4")
