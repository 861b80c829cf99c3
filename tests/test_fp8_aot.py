"""The FP8 kernels compile ahead of time for Hopper and Blackwell, on a machine with no GPU.

Every case of ``flashbook.compile_fp8.compile_cases`` (the forward at D 64/128/256, causal or not,
V transposed or not at D=128, e5m2 and exact accumulation on sm_90; the fp8-cache decode split
kernel, contiguous and paged, FINAL or not) through ``aot.compile_spec``:

* no compile error, no register spills (stack 0, no STL);
* the forward's matrix products on FP8 tensor cores: on sm_90 QGMMA, Hopper's warpgroup MMA
  on fp8 operands (SASS spells FP8 HGMMA "QGMMA.64xNx32.F32.E4M3.E4M3"), with E4M3 (or E5M2)
  operands and no fp16 HGMMA; on sm_100 UTCQMMA (tcgen05 on fp8); on sm_120 QMMA (mma.sync
  on fp8); P's cast to fp8 (F2FP ... E4M3) present;
* the decode kernel on tensor cores (fp16/bf16 MMAs after widening the fp8 tiles);
* the FP8-MMA decode kernel (V cache transposed) on FP8 tensor cores only: QGMMA on sm_90,
  UTCQMMA on sm_100, QMMA on sm_120, no fp16 MMA, no byte loads.

    python -m pytest -o addopts="" -m slow tests/test_fp8_aot.py -s   # prints the table
"""
import pytest

from flashbook.compile_fp8 import compile_cases, compile_report, format_compile_report

pytestmark = pytest.mark.slow

CASES = compile_cases()


def _id(c):
    if c["kernel"] == "fmha_fp8":
        return (f"{c['arch']}-fwd-{c['fp8'].split('_')[1]}-d{c['D']}-"
                f"{'causal' if c['causal'] else 'full'}-{'vt' if c['v_t'] else 'v'}"
                + ("" if c["fast_acc"] else "-exactacc"))
    kind = "decode-mma" if c["kernel"] == "decode_fp8mma" else "decode"
    return (f"{c['arch']}-{kind}-d{c['D']}-{'page' + str(c['page']) if c['page'] else 'contig'}"
            + ("-final" if c["final"] else ""))


class _Reports(dict):
    """Each case compiled when a test first asks for it (``-k`` compiles only the selected)."""

    def __missing__(self, case_id):
        case = next(c for c in CASES if _id(c) == case_id)
        self[case_id] = compile_report([case])[0]
        return self[case_id]


@pytest.fixture(scope="module")
def reports():
    got = _Reports()
    yield got
    print("\n" + format_compile_report(list(got.values())))


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_fp8_kernel_compiles_without_spills(reports, case):
    r = reports[_id(case)]
    assert not r["error"], r["error"]
    assert r["registers"] > 0 and r["sass_lines"] > 50
    assert r["stack_bytes"] == 0 and r["sass"]["STL"] == 0, f"spills: {r['label']}"
    s = r["sass"]
    if case["kernel"] == "fmha_fp8":
        fmt = "E4M3" if case["fp8"] == "float8_e4m3fn" else "E5M2"
        if case["arch"] == "sm_90":
            assert s["QGMMA"] > 0 and s["HGMMA"] == 0, r["mma_forms"]
            assert any(f"{fmt}.{fmt}" in m for m in r["mma_forms"]), r["mma_forms"]
        elif case["arch"] == "sm_100":
            assert s["UTCQMMA"] > 0 and s["UTCHMMA"] == 0, r["mma_forms"]
        else:
            assert s["QMMA"] > 0 and s["HMMA"] == 0, r["mma_forms"]
        assert s[f"F2FP.{fmt}"] > 0                 # P cast to fp8 on chip
    elif case["kernel"] == "decode_fp8mma":
        # Both products on FP8 tensor cores straight from the cache's bytes: no fp16 MMA, no
        # byte loads; QGMMA (sm_90) / UTCQMMA (sm_100) at the 64-row tile, QMMA on sm_120.
        fp16_mmas = s["HMMA"] + s["HGMMA"] + s["UTCHMMA"]
        assert fp16_mmas == 0 and s["LDS.U8"] == 0, (r["mma_forms"], s)
        want = {"sm_90": "QGMMA", "sm_100": "UTCQMMA"}.get(case["arch"], "QMMA")
        assert s[want] > 0, r["mma_forms"]
        assert s["F2FP.E4M3"] > 0                   # q and P cast to fp8 on chip
    else:
        assert s["HMMA"] + s["HGMMA"] + s["UTCHMMA"] > 0, r["mma_forms"]
        if case["arch"] in ("sm_90", "sm_100"):
            # The 64-row tile: a warpgroup MMA from shared memory, the fp8 tiles widened there
            # with 16-byte loads; no byte loads (the 16-row tile had 128 LDS.U8 per thread).
            assert s["HGMMA"] + s["UTCHMMA"] > 0 and s["HMMA"] == 0, r["mma_forms"]
            assert s["LDS.U8"] == 0 and s["LDS.128"] > 0, s


def test_fp8_forward_cases_cover_the_split_kernel():
    """The cases compile what ships: on sm_90 the masked key tiles split off (SPLIT), 128x256
    at D 64 and 128, 128x128 at D=256 (128x256 split spilled 528 bytes there, 128x128 unsplit
    64 causal: experiments/data/49-fp8-fwd-split), causal and not; sm_100, sm_120 unsplit."""
    from flashattn.kernels.fp8_fwd_spec import fp8_constants
    seen = set()
    for c in CASES:
        if c["kernel"] != "fmha_fp8":
            continue
        cfg = c["config"]
        split = fp8_constants(cfg, head_dim=c["D"], causal=c["causal"], even_k=True,
                              v_transposed=c["v_t"])["SPLIT"]
        if c["arch"] == "sm_90":
            want = "128x256 occ=1 nww=8" if c["D"] <= 128 else "128x128 occ=1 nww=8"
            assert cfg.label() == want and split, c
            seen.add((c["D"], c["causal"]))
        else:
            assert not split and cfg.TILE_N <= 128, c
    assert seen == {(d, causal) for d in (64, 128, 256) for causal in (False, True)}
