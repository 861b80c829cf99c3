"""Recompute the README's FP8, backward, TileGym, interpreter and build claims from the data:
python experiments/readme_claims.py

Each claim is the text README.md holds, computed here from ``results/h200`` and
``experiments/data`` (``claims()``: name -> the phrase); tests/test_readme_claims.py checks that
README.md still says each one. Issue 34 found five README sentences the data no longer said.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AGREEMENT = ROOT / "experiments" / "data" / "36-interpreter-gpu" / "agreement.json"
VARLEN_BWD = ROOT / "experiments" / "data" / "34-final" / "varlen_bwd.json"
COMMON = "flashattn/kernels/common.py"


def _r(lo: float, hi: float, places: int = 2) -> str:
    a, b = f"{lo:.{places}f}", f"{hi:.{places}f}"
    return f"{a}×" if a == b else f"{a}–{b}×"


def _lengths(ns) -> str:
    """{1024, 2048} -> "1K–2K" (consecutive doublings as a range), {4096} -> "4K"."""
    ns = sorted(ns)
    k = [f"{n // 1024}K" for n in ns]
    if len(ns) > 1 and all(b == 2 * a for a, b in zip(ns, ns[1:])):
        return f"{k[0]}–{k[-1]}"
    return ", ".join(k)


def _sci(x: float) -> str:
    """9.765625e-4 -> "9.8e-4 (2⁻¹⁰)": the value and the power of two it is."""
    import math
    sup = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")
    mant, exp = f"{x:.1e}".split("e")
    return f"{mant}e{int(exp)} (2⁻{str(-round(math.log2(x))).translate(sup)})"


def fp8_claims() -> dict[str, str]:
    from flashbook.chapter import fp8
    split = fp8.forward_split_table()["shipped (×)"]
    b = fp8.bench()
    fw = b[(b["part"] == "forward") & (b["D"] == 128)]
    vt = fw[fw["impl"] == "fp8-vt"]["vs_fp16"]
    host = fw[fw["impl"] == "fp8"]
    behind = host[host["vs_fp16"] < 1]
    full = {int(n) for n in behind[~behind["causal"].astype(bool)]["N"]}
    causal_only = {int(n) for n in behind[behind["causal"].astype(bool)]["N"]} - full
    dm = fp8.decode_v2_table(fp8.decode_v2(fp8.DECODE_MMA), variant="decode-fp8-mma")
    big = dm[dm.index.get_level_values("B") >= 8]["× fp16 cache"]
    one = dm.loc[1]["× fp16 cache"]
    vk = fp8.decode_speed_table(b)["fp8 speed-up (×)"]
    return {
        "fp8 forward shipped (16K)": f"ran {_r(split.min(), split.max())} our fp16 kernel at 16K",
        "fp8 forward, Vᵀ given (D=128)": f"read {_r(vt.min(), vt.max())} with Vᵀ given",
        "fp8 forward, V transposed by the call": f"and {_r(host['vs_fp16'].min(), host['vs_fp16'].max())} when the call",
        "fp8 forward behind at": f"behind the fp16 kernel at {_lengths(full)} and causal at "
                                 f"{_lengths(causal_only)}",
        "fp8 decode, V cache transposed, B ≥ 8": f"ran {_r(big.min(), big.max())} the fp16 cache's",
        "fp8 decode, V cache transposed, B = 1": f"{_r(one.min(), one.max())} at B = 1",
        "fp8 decode, V in K's layout": f"chip, {_r(vk.min(), vk.max())}",
    }


def backward_method() -> dict[str, str]:
    """The sampling method of every timed backward row (the README's table)."""
    from flashbook.data.schema import read_json
    methods = set()
    for p in sorted((ROOT / "results" / "h200" / "bench-backward").glob("*.json*")):
        doc = read_json(str(p).removesuffix(".xz"))
        methods |= {r.get("method") for r in doc["rows"] if r.get("median_ms") is not None}
    assert len(methods) == 1, methods
    return {"backward rows' method": f'`method: "{methods.pop()}"`'}


def interpreter_claims() -> dict[str, str]:
    rows = json.loads(AGREEMENT.read_text())["rows"]
    bf = max(max(r["gpu_vs_interp"]) for r in rows if "bf16" in r["case"])
    fp = max(max(r["gpu_vs_interp"]) for r in rows if "bf16" not in r["case"])
    import re
    src = (ROOT / "flashattn" / "dispatch.py").read_text()
    cost = float(re.search(r"STEP_COST_S = ([\d.e-]+)", src).group(1))
    measured = re.search(r"# (\d+\.\d+-\d+\.\d+) ms on a", src).group(1).replace("-", "–")
    return {"interpreter step cost (measured)": f"costs {measured} ms",
            "interpreter step cost (estimate)": f"at {cost * 1e3:g} ms a step",
            "interpreter vs GPU, fp16": f"at most {_sci(fp)} in fp16",
            "interpreter vs GPU, bf16": f"and {_sci(bf)} in bf16",
            "interpreter vs GPU, cases": f"in the {len(rows)} cases compared"}


def _meta(sub: str, name: str) -> dict:
    from flashbook.data.schema import read_json
    return read_json(str(ROOT / "results" / "h200" / sub / name))["meta"]


def build_claims() -> dict[str, str]:
    """When the forward, backward, decode and varlen data were recorded, on which build the
    re-timed ones ran, and when the kernels' shared math moved (the first commit of
    kernels/common.py). A dataset whose meta names a build counts as re-timed."""
    from flashbook.data.schema import read_json
    old, new = set(), {}
    h200 = ROOT / "results" / "h200"
    for sub in ("bench", "bench-backward", "decode"):
        for p in sorted((h200 / sub).glob("*.json*")):
            meta = read_json(str(p).removesuffix(".xz"))["meta"]
            date = str(meta["date"])[:10]
            if meta.get("build"):
                new[p.name.split(".")[0]] = (date, meta["build"]["commit"][:7])
            else:
                old.add(date)
    old.add(str(json.loads(VARLEN_BWD.read_text())["meta"]["date"])[:10])
    out = {"recorded on": f"were recorded on {' and '.join(sorted(old))}."}
    bwd = {v for k, v in new.items() if k.startswith("fp16-") and k.endswith("-bwd")}
    assert len(bwd) == 1, bwd
    date, commit = bwd.pop()
    out["fp16 backward re-timed"] = f"was re-timed on {date} on build {commit}"
    moved = subprocess.run(["git", "log", "--diff-filter=A", "--format=%ad", "--date=short", "--",
                            COMMON], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if moved:
        out["common.py moved on"] = f"On {moved[-1]} those kernels"
    return out


# The sources a forward or backward timing compiles: while none changed since the recorded
# commit, that recording is of "the current build".
FWD_BWD_SOURCES = ["flashattn/kernels/" + f for f in
                   ("common.py", "fmha.py", "fmha_fwd_spec.py", "fmha_bwd.py", "fmha_bwd_spec.py",
                    "spec.py")]


SASS_DIR = ROOT / "experiments" / "data" / "issue35-library"
SASS_KERNELS = ("fmha", "bwd_preprocess", "bwd_dkdv", "bwd_dq")


def _same_sm90_code(commit: str) -> bool:
    """The sources changed since ``commit`` but compile to the same sm_90 SASS text (the timed
    GPU's): ``experiments/library_sass.py`` run on ``commit`` and on the sources as they are now
    (their hash recorded beside it), every forward and backward kernel "identical"."""
    import hashlib
    import json
    meta_path = SASS_DIR / "sass_final.meta.json"
    if not meta_path.exists():
        return False
    meta = json.loads(meta_path.read_text())
    h = hashlib.sha256()
    for f in meta["sources"]:
        h.update((ROOT / f).read_bytes())
    if h.hexdigest() != meta["after_sources_sha256"]:
        return False
    same_before = subprocess.run(["git", "diff", "--quiet", meta["before_commit"], commit, "--",
                                  *meta["sources"]], cwd=ROOT, capture_output=True)
    if same_before.returncode != 0:            # the recording's sources were not the compared ones
        return False
    rows = [ln.split("|") for ln in (SASS_DIR / "sass_diff_final.md").read_text().splitlines()
            if ln.startswith("| sm_90 |")]
    mine = [r for r in rows if r[2].strip() in SASS_KERNELS]
    return bool(mine) and all(r[-2].strip() == "identical" for r in mine)


def _current(commit: str) -> bool:
    """Whether the forward and backward kernels are today what ``commit`` had: the same sources,
    or the same sm_90 machine code (``_same_sm90_code``)."""
    res = subprocess.run(["git", "diff", "--quiet", commit, "--", *FWD_BWD_SOURCES], cwd=ROOT,
                         capture_output=True)
    if res.returncode not in (0, 1):
        raise RuntimeError(f"git diff against {commit} failed: {res.stderr.decode().strip()}")
    return res.returncode == 0 or _same_sm90_code(commit)


def current_build_claims() -> dict[str, str]:
    """The README calls the fp16 backward and the TileGym forward "the current build": true while
    the kernels they timed have the sources of their recorded commits."""
    from flashbook.data import results as R
    from flashbook.chapter import backward as bw
    out = {}
    for name, commit, text in (
            ("backward on the current build", bw.bench_doc("fp16", True)["meta"]["build"]["commit"],
             "re-timed on {date} on the current build"),
            ("forward on the current build",
             R.tilegym_frame("fwd_causal").attrs["meta"]["build"]["commit"],
             "Timed again on the current build on {date}")):
        if _current(commit):
            date = (bw.bench_doc("fp16", True)["meta"] if name.startswith("backward")
                    else R.tilegym_frame("fwd_causal").attrs["meta"])["date"][:10]
            out[name] = text.format(date=date)
        else:
            out[name] = f"the kernels changed since build {commit[:7]}"
    return out


def backward_claims() -> dict[str, str]:
    """The backward's standing (chapter 11's ``ratio_range``): fp16 as re-timed, bf16 as recorded."""
    from flashbook.chapter import backward as bw
    df = bw.bench_frame()
    out = {}
    for dtype in ("fp16", "bf16"):
        fa = bw.ratio_range(df, "bwd", "fa2", dtype=dtype)
        cu = bw.ratio_range(df, "bwd", "cudnn", dtype=dtype)
        out[f"backward {dtype}"] = f"{_r(*fa)} FlashAttention-2's backward and {_r(*cu)} cuDNN's"
    date = str(bw.bench_doc("bf16", True)["meta"]["date"])[:10]
    out["backward bf16 date"] = f"the bf16 recording of {date}"
    return out


def tilegym_claims() -> dict[str, str]:
    """The forward re-timed beside TileGym (``best`` rows of results/h200/tilegym/, the current
    build), and TileGym's own standing."""
    from flashbook.data import results as R
    r = R.load("h200")
    fc, ff = R.tilegym_range("fwd_causal", "best"), R.tilegym_range("fwd_full", "best")
    drift = 0.0
    for part, w in (("fwd_causal", "fp16-causal-d128"), ("fwd_full", "fp16-full-d128")):
        now = R.tilegym_table(part, labels=False).loc["best"]
        before = r.ratio_table(w).loc["best"]
        before.index = [f"{n // 1024}K" for n in before.index]
        drift = max(drift, float((now - before.reindex(now.index)).abs().max()))
    build = R.tilegym_frame("fwd_causal").attrs["meta"]["build"]["commit"][:7]
    tg = [R.tilegym_range(p) for p in ("fwd_causal", "fwd_full")]
    tiles = R.tilegym_tiles()
    ours_b = R.tilegym_range("bwd_causal", "fmha_bwd")
    dec = R.tilegym_range("decode", value="speed_cudnn")
    ours_d = R.tilegym_range("decode", "decode", value="speed_cudnn")
    return {
        "forward re-timed": f"{_r(*fc)} cuDNN causal and {_r(*ff)} non-causal",
        "forward re-timed, drift": f"at most {100 * drift:.1f} points",
        "tilegym build": f"build {build}",
        "tilegym forward": f"reads {_r(min(t[0] for t in tg), max(t[1] for t in tg))} cuDNN",
        "tilegym forward tiles": f"({', '.join(tiles['fwd_causal'])})",
        "tilegym backward": f"reads {_r(*R.tilegym_range('bwd_causal'), places=3)} cuDNN "
                            f"with {', '.join(tiles['bwd_causal'])} tiles, ours "
                            f"{_r(*ours_b, places=3)}",
        "tilegym decode": f"{_r(*dec)} cuDNN's speed against our {_r(*ours_d)}",
        "tilegym rounds": "| {} forward, {} backward and decode |".format(
            *(R.tilegym_frame(p).attrs["meta"]["method"]["rounds"]
              for p in ("fwd_causal", "bwd_causal"))),
    }
    assert len({R.tilegym_frame(p).attrs["meta"]["method"]["rounds"]
                for p in ("bwd_causal", "decode")}) == 1


def claims() -> dict[str, str]:
    out = {}
    for part in (fp8_claims, backward_method, interpreter_claims, build_claims,
                 backward_claims, tilegym_claims, current_build_claims):
        out.update(part())
    return out


def main() -> int:
    for name, text in claims().items():
        print(f"{name:45s} {text!r}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
