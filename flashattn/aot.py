"""Ahead-of-time compilation and static analysis, no GPU needed.

``compile_step(name, arch)`` compiles a step's kernels with ``tileiras`` (through cuTile's
``export_kernel``) into cubins, and ``analyze_cubin`` reads them back with ``cuobjdump``:
registers, stack (spill) bytes, shared memory and the SASS instructions the book discusses.

    python -m flashattn compile --arch sm_90 --arch sm_100 [--step NAME ...] [--json]
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .kernels import constants_for, hinted
from .kernels import kernels_of
from .config import ARCHS, Config
from .registry import get_step, registered, shipped_steps

# The workload the book's static tables describe: the seed's B=4, H=32, D=128, fp16, causal.
DEFAULT_SHAPE = dict(head_dim=128, causal=True, even_k=True, dtype="float16")

# SASS opcodes the book counts. MMA: HGMMA (Hopper warpgroup MMA), UTCHMMA/UTCQMMA
# (Blackwell tensor-memory MMA), HMMA (Ampere-style warp MMA).
SASS_COUNTS = {
    "HGMMA": r"\bHGMMA\b", "UTCHMMA": r"\bUTC\w*HMMA\b", "HMMA": r"\bHMMA\b",
    "MUFU.EX2": r"\bMUFU\.EX2\b", "MUFU.RCP": r"\bMUFU\.RCP\b",
    "LDL": r"\bLDL\b", "STL": r"\bSTL\b", "FFMA": r"\bFFMA\b", "FMUL": r"\bFMUL\b",
    "BAR": r"\bBAR\b", "UTMALDG": r"\bUTMALDG\b", "LDGSTS": r"\bLDGSTS\b",
}


@dataclass
class KernelReport:
    step: str
    arch: str
    kernel: str
    config: str
    registers: int = 0
    stack_bytes: int = 0
    shared_bytes: int = 0
    sass: dict = field(default_factory=dict)
    sass_lines: int = 0
    compile_s: float = 0.0
    cubin_bytes: int = 0
    error: str = ""

    @property
    def mma_ops(self) -> int:
        return sum(self.sass.get(k, 0) for k in ("HGMMA", "UTCHMMA", "HMMA"))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["mma_ops"] = self.mma_ops
        return d


def cuobjdump_path() -> str:
    """cuobjdump from the nvidia-cuda-cuobjdump wheel, else from PATH."""
    try:
        import nvidia.cu13 as cu  # the wheels of CUDA 13 share this namespace
        for base in cu.__path__:
            p = Path(base) / "bin" / "cuobjdump"
            if p.exists():
                return str(p)
    except ImportError:
        pass
    p = shutil.which("cuobjdump")
    if p:
        return p
    raise FileNotFoundError("cuobjdump not found: pip install nvidia-cuda-cuobjdump")


def analyze_cubin(path: str | os.PathLike) -> dict:
    """Registers, stack, shared memory and SASS opcode counts of the one kernel in a cubin."""
    exe = cuobjdump_path()
    res = subprocess.run([exe, "--dump-resource-usage", str(path)], capture_output=True,
                         text=True, check=True).stdout
    out = dict(registers=0, stack_bytes=0, shared_bytes=0)
    for key, pat in (("registers", r"REG:(\d+)"), ("stack_bytes", r"STACK:(\d+)"),
                     ("shared_bytes", r"SHARED:(\d+)")):
        m = re.search(pat, res)
        if m:
            out[key] = int(m.group(1))
    sass = subprocess.run([exe, "--dump-sass", str(path)], capture_output=True, text=True,
                          check=True).stdout
    instr = [ln for ln in sass.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
    out["sass"] = {k: sum(1 for ln in instr if re.search(p, ln)) for k, p in SASS_COUNTS.items()}
    out["sass_lines"] = len(instr)
    out["sass_text"] = sass
    return out


def _cache_dir() -> Path:
    from .env import cache_root
    return cache_root() / "cubins"


def _source_hash() -> str:
    h = hashlib.sha256()
    kdir = Path(__file__).parent / "kernels"
    for p in sorted(kdir.glob("*.py")):
        h.update(p.read_bytes())
    import cuda.tile as ct
    h.update(ct.__version__.encode())
    return h.hexdigest()[:16]


def _module_hash(module: str) -> str:
    """A kernel module's source, hashed (a kernel outside ``kernels/``, such as the book's)."""
    import importlib.util
    return hashlib.sha256(Path(importlib.util.find_spec(module).origin).read_bytes()).hexdigest()[:16]


def compile_spec(spec, arch: str, constants: dict, *, hints: dict | None = None,
                 dtype: str = "float16", align: int = 8, label: str = "", step: str = "",
                 use_cache: bool = True, keep_sass: bool = False) -> KernelReport:
    """Compile one kernel (a ``KernelSpec`` with its constants by name) for ``arch`` and read
    the cubin back. Any kernel of the package can be compiled this way, step or not (the
    backward and decoding kernels are not steps). Errors go to ``KernelReport.error``."""
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHS)}")
    hints = dict(hints or {})
    rep = KernelReport(step=step or spec.name, arch=arch, kernel=spec.name,
                       config=label or " ".join(f"{k}={v}" for k, v in hints.items()))
    key = hashlib.sha256(json.dumps([_source_hash(), _module_hash(spec.module), spec.name,
                                     spec.module, spec.function, sorted(constants.items()),
                                     sorted(hints.items()), arch, dtype, align],
                                    default=str).encode())
    cubin = _cache_dir() / f"{spec.name}-{arch}-{key.hexdigest()[:20]}.cubin"
    return compile_into(rep, cubin, lambda: hinted(spec.kernel(), hints),
                        lambda: spec.signature(dtype=dtype, align=align, constants=constants),
                        arch, use_cache=use_cache, keep_sass=keep_sass)


def compile_into(rep: KernelReport, cubin: Path, make_kernel, make_signature, arch: str, *,
                 use_cache: bool = True, keep_sass: bool = False,
                 full_error: bool = False) -> KernelReport:
    """Compile ``make_kernel()`` for ``arch`` into ``cubin`` (unless cached) and fill ``rep``
    from the cubin. Errors go to ``rep.error``: the message's last line, or with ``full_error``
    its last 2000 characters (a user's mod: the compiler's whole message)."""
    from cuda.tile.compilation import export_kernel
    t0 = time.perf_counter()
    try:
        if not (use_cache and cubin.exists()):
            kernel, sig = make_kernel(), make_signature()
            cubin.parent.mkdir(parents=True, exist_ok=True)
            tmp = cubin.with_suffix(f".tmp{os.getpid()}")
            export_kernel(kernel, [sig], str(tmp), gpu_code=arch, output_format="cubin")
            tmp.replace(cubin)
        rep.compile_s = time.perf_counter() - t0
        rep.cubin_bytes = cubin.stat().st_size
        a = analyze_cubin(cubin)
        rep.registers, rep.stack_bytes, rep.shared_bytes = (
            a["registers"], a["stack_bytes"], a["shared_bytes"])
        rep.sass, rep.sass_lines = a["sass"], a["sass_lines"]
        if keep_sass:
            rep.sass_text = a["sass_text"]  # type: ignore[attr-defined]
    except Exception as e:  # report, don't crash: the table shows which variant failed
        rep.compile_s = time.perf_counter() - t0
        msg = str(e).strip()
        rep.error = (f"{type(e).__name__}: {msg[-2000:]}" if full_error else
                     f"{type(e).__name__}: {msg.splitlines()[-1] if msg else ''}"[:500])
    return rep


def compile_step(name: str, arch: str, *, config: Config | None = None, head_dim: int = 128,
                 causal: bool = True, even_k: bool = True, dtype: str = "float16",
                 use_cache: bool = True, keep_sass: bool = False) -> list[KernelReport]:
    """Compile every kernel of step ``name`` for ``arch``; one KernelReport per kernel.

    Compilation errors are reported in ``KernelReport.error``, not raised.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHS)}")
    step = get_step(name)
    cfg = config or step.configs(arch)[0]
    return [compile_spec(spec, arch,
                         constants_for(spec, step, cfg, head_dim=head_dim, causal=causal,
                                       even_k=even_k),
                         hints=cfg.hints(), dtype=dtype, align=8 if head_dim % 8 == 0 else 1,
                         label=cfg.label(), step=name, use_cache=use_cache, keep_sass=keep_sass)
            for spec in kernels_of(step)]


def sass_of(name: str, arch: str, **kw) -> str:
    """The full SASS listing of a step's (first) kernel."""
    rep = compile_step(name, arch, keep_sass=True, **kw)[0]
    if rep.error:
        raise RuntimeError(rep.error)
    return rep.sass_text  # type: ignore[attr-defined]


def format_table(reports: list[KernelReport]) -> str:
    cols = ["step", "arch", "kernel", "config", "REG", "STACK", "SHARED", "MMA", "EX2", "RCP",
            "LDL", "STL", "compile s"]
    rows = []
    for r in reports:
        if r.error:
            rows.append([r.step, r.arch, r.kernel, r.config, "ERROR: " + r.error[:60]] +
                        [""] * 8)
            continue
        rows.append([r.step, r.arch, r.kernel, r.config, r.registers, r.stack_bytes,
                     r.shared_bytes, r.mma_ops, r.sass.get("MUFU.EX2", 0),
                     r.sass.get("MUFU.RCP", 0), r.sass.get("LDL", 0), r.sass.get("STL", 0),
                     f"{r.compile_s:.1f}"])
    w = [max(len(str(c)), *(len(str(row[i])) for row in rows)) for i, c in enumerate(cols)]
    lines = ["  ".join(str(c).ljust(w[i]) for i, c in enumerate(cols))]
    lines += ["  ".join(str(v).ljust(w[i]) for i, v in enumerate(row)) for row in rows]
    return "\n".join(lines)


LIBRARY_PROG = "python -m flashattn compile"


def main(argv: list[str] | None = None, prog: str = LIBRARY_PROG,
         default_steps: list[str] | None = None) -> int:
    import argparse

    from .contract import MAX_HEAD_DIM, head_dim_arg
    p = argparse.ArgumentParser(prog=prog,
                                description="Compile steps ahead of time (no GPU needed) and "
                                            "report registers, spills, shared memory and SASS.")
    p.add_argument("--arch", action="append", choices=ARCHS,
                   help="target architecture (repeatable; default sm_90 and sm_100)")
    default_steps = default_steps or shipped_steps()
    p.add_argument("--step", action="append", metavar="NAME",
                   help="step or experiment to compile (repeatable; default: "
                        + ", ".join(default_steps) + ")")
    p.add_argument("--head-dim", type=head_dim_arg, default=128,
                   help="head dim D, 1 to %d as the API takes (default 128)" % MAX_HEAD_DIM)
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--out", help="also write the JSON report to this file")
    p.add_argument("--no-cache", action="store_true", help="recompile even if a cubin is cached")
    a = p.parse_args(argv)
    archs = a.arch or ["sm_90", "sm_100"]
    steps = a.step or default_steps
    unknown = [s for s in steps if s not in registered()]
    if unknown and prog != LIBRARY_PROG:
        try:
            get_step(unknown[0])
        except ValueError as e:
            p.error(str(e))
    if unknown:                 # the library's command: the book's steps are the book's command
        p.error(f"{', '.join(unknown)} run{'s' if len(unknown) == 1 else ''} the book's ladder "
                "kernel, which the library does not ship: python -m flashbook compile "
                + " ".join(f"--step {s}" for s in unknown))
    reports = []
    for arch in archs:
        for s in steps:
            for r in compile_step(s, arch, head_dim=a.head_dim, causal=not a.no_causal,
                                  dtype=a.dtype, use_cache=not a.no_cache):
                reports.append(r)
                if not a.json:
                    print(f"compiled {r.step} for {r.arch} ({r.kernel}) in {r.compile_s:.1f} s"
                          + (f": {r.error}" if r.error else ""), file=sys.stderr)
    doc = dict(meta=_meta(a, archs, steps), kernels=[r.as_dict() for r in reports])
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1) if a.json else format_table(reports))
    return 1 if any(r.error for r in reports) else 0


def _meta(a, archs, steps) -> dict:
    import platform

    import cuda.tile as ct
    from importlib.metadata import PackageNotFoundError, version
    try:
        tileiras = version("nvidia-cuda-tileiras")
    except PackageNotFoundError:
        tileiras = "unknown"
    return dict(command="python -m flashattn compile " + " ".join(sys.argv[2:] if
                sys.argv[1:2] == ["compile"] else sys.argv[1:]),
                cuda_tile=ct.__version__, tileiras=tileiras, archs=archs, steps=steps,
                head_dim=a.head_dim, causal=not a.no_causal, dtype=a.dtype,
                python=platform.python_version(),
                date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
