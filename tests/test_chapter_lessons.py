"""flashbook.chapter.lessons: the SASS readers of the lesson pages, on small hand-made listings
(CPU, no compiler), and the tables they build from the recorded data.

``python -m pytest tests/test_chapter_lessons.py -o addopts=""``
"""
from __future__ import annotations

import pytest

from flashbook.chapter import lessons


def _listing(lines: list[str]) -> str:
    """A cuobjdump-style listing: one instruction per 16 bytes, from address 0."""
    out = ["        code for sm_90", "        Function : fmha_kernel"]
    for n, text in enumerate(lines):
        out.append(f"        /*{16 * n:04x}*/                   {text} ;   /* 0x000000000000 */")
    return "\n".join(out)


# A Hopper-shaped kernel: a producer branch (ELECT + TMA), a consumer K loop with the two
# products, the softmax between them, and a spin loop that jumps back across the EXIT.
HOPPER = _listing([
    "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8",                       # 0x000
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR6+0x20000], R10",         # 0x010  loop start
    "WARPGROUP.ARRIVE",                                              # 0x020
    "HGMMA.64x128x16.F32 R24, gdesc[UR52], RZ, !UPT",               # 0x030
    "HGMMA.64x128x16.F32 R24, gdesc[UR54], R24",                     # 0x040
    "WARPGROUP.DEPBAR.LE gsb0, 0x0",                                 # 0x050
    "SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR6+0x20008], RZ",              # 0x060
    "SHFL.BFLY PT, R165, R12, 0x2, 0x1f",                            # 0x070
    "SHFL.BFLY PT, R12, R165, 0x1, 0x1f",                            # 0x080
    "MUFU.EX2 R24, R24",                                             # 0x090
    "MUFU.EX2 R25, R25",                                             # 0x0a0
    "F2FP.F16.F32.PACK_AB R24, R25, R24",                            # 0x0b0
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR6+0x20010], R10",         # 0x0c0
    "WARPGROUP.ARRIVE",                                              # 0x0d0
    "HGMMA.64x128x16.F32 R88, R24, gdesc[UR52].tnspB, R88",         # 0x0e0
    "WARPGROUP.DEPBAR.LE gsb0, 0x0",                                 # 0x0f0
    "@P0 BRA 0x10",                                                  # 0x100  back to 0x010
    "STSM.16.M88.4 [R2], R4",                                        # 0x110
    "USETMAXREG.DEALLOC.CTAPOOL 0x20",                               # 0x120
    "ELECT P4, URZ, PT",                                             # 0x130
    "UTMALDG.4D [UR8], [UR22], desc[URZ]",                           # 0x140
    "EXIT",                                                          # 0x150
    "SYNCS.PHASECHK.TRANS64 P0, [R5+URZ+0x20000], R10",              # 0x160  retry stub
    "@!P0 BRA 0x20",                                                 # 0x170  back across EXIT
])


def test_instructions_strip_predicates_and_keep_operands():
    ins = lessons.instructions(HOPPER)
    assert len(ins) == 24
    assert ins[16].op == "BRA" and ins[16].addr == 0x100 and ins[16].text == "@P0 BRA 0x10"
    assert ins[3].base == "HGMMA" and ins[3].op == "HGMMA.64x128x16.F32"


def test_loops_take_the_mma_loop_and_skip_the_retry_path():
    assert lessons.loops(HOPPER) == [(0x10, 0x100)]           # the stub's branch spans EXIT
    assert lessons.loops(HOPPER, r"MUFU\.EX2") == [(0x10, 0x100)]
    assert lessons.loops(HOPPER, r"LDTM") == []


def test_outline_merges_runs_in_program_order():
    roles = lessons.order(HOPPER, 0x10, 0x100)
    assert roles[:4] == ["wait: a K/V tile landed (mbarrier)", "warpgroup: operands ready",
                         "MMA: HGMMA (warpgroup)", "wait for the MMAs"]
    t = lessons.outline(HOPPER, 0x10, 0x100)
    hgmma = t[t["role"] == "MMA: HGMMA (warpgroup)"]
    assert list(hgmma["count"]) == [2, 1]                      # the run of two, then P·V
    assert list(hgmma.index) == ["0x0030", "0x00e0"]
    assert "exp2 (MUFU)" in roles and roles.index("exp2 (MUFU)") > 3


def test_techniques_tell_operand_sources_apart():
    t = lessons.techniques({"x": HOPPER})["x"]
    assert t["MMA with both operands in shared memory (Q K^T)"] == 2
    assert t["MMA with its A operand in registers (P after softmax)"] == 1
    assert t["ldmatrix: shared memory -> MMA fragments"] == 0
    assert t["warp-shuffle reductions (SHFL)"] == 2
    assert t["register re-allocation between warp groups"] == 2


def test_hopper_schedule_verdicts():
    t = lessons.hopper_schedule(HOPPER)["does tileiras do it?"]
    assert list(t.str.split(":").str[0]) == ["yes", "no", "no"]
    # An overlapped loop waits with one MMA group still in flight: the verdict must flip.
    overlapped = HOPPER.replace("WARPGROUP.DEPBAR.LE gsb0, 0x0", "WARPGROUP.DEPBAR.LE gsb0, 0x1")
    assert lessons.hopper_schedule(overlapped)["does tileiras do it?"].iloc[2] == "yes"
    no_producer = HOPPER.replace("USETMAXREG.DEALLOC.CTAPOOL 0x20", "NOP")
    assert lessons.hopper_schedule(no_producer)["does tileiras do it?"].iloc[0] == "no"


def test_small_readers():
    assert lessons.register_split(HOPPER) == {"alloc": [0xe8], "dealloc": [0x20]}
    assert lessons.shuffle_lanes(HOPPER) == [1, 2]
    assert lessons.mbarrier_slots(HOPPER) == 2
    regs = lessons.chained_registers(HOPPER)
    assert list(regs) == ["R24", "R24"]
    assert lessons.count(HOPPER, r"HGMMA") == 3


BLACKWELL = _listing([
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR6+0x38088], R2",          # 0x000  softmax A
    "LDTM.x8 R128, tmem[UR8+0x100]",                                 # 0x010
    "BAR.SYNC.DEFER_BLOCKING 0x2, 0x100",                            # 0x020
    "MUFU.EX2 R176, R176",                                           # 0x030
    "STTM.x8 tmem[UR8], R12",                                        # 0x040
    "BAR.ARV 0x1, 0x100",                                            # 0x050
    "@P0 BRA 0x0",                                                   # 0x060
    "UTCHMMA gdesc[UR40], gdesc[UR20], tmem[UR14], tmem[UR26], idesc[UR27], !UPT",  # 0x070
    "UTCBAR [UR38], URZ",                                            # 0x080
    "@P1 BRA 0x70",                                                  # 0x090
    "EXIT",                                                          # 0x0a0
])


def test_loop_roles_and_named_barriers():
    t = lessons.loop_roles(BLACKWELL)
    assert list(t["does"]) == ["softmax", "MMAs"]
    assert t.iloc[0]["LDTM"] == 1 and t.iloc[0]["BAR"] == 2 and t.iloc[0]["UTCHMMA"] == 0
    assert t.iloc[1]["UTCHMMA"] == 1 and t.iloc[1]["UTCBAR"] == 1
    nb = lessons.named_barriers(BLACKWELL)
    assert list(nb["waits for the loop"]) == ["none"]        # one loop: no partner
    # Two softmax loops in turn: each waits on the barrier the other arrives at, whatever ids.
    two = _listing([
        "BAR.SYNC.DEFER_BLOCKING 0x5, 0x100", "MUFU.EX2 R1, R1", "BAR.ARV 0x6, 0x100",
        "@P0 BRA 0x0",                                                   # loop 0x0-0x30
        "BAR.SYNC.DEFER_BLOCKING 0x6, 0x100", "MUFU.EX2 R1, R1", "BAR.ARV 0x5, 0x100",
        "@P0 BRA 0x40",                                                  # loop 0x40-0x70
        "EXIT"])
    nb = lessons.named_barriers(two)
    assert list(nb["waits for the loop"]) == ["0x40–0x70", "0x0–0x30"]
    assert list(nb["then lets go the loop"]) == ["0x40–0x70", "0x0–0x30"]


def test_io_model_arithmetic():
    # One head, N = 4 tiles of 1 row, D = 1, 1-byte elements: small enough to count by hand.
    t = lessons.io_model(1, 1, 4, 1, 1, 1, nbytes=1, gb=False)
    col1, col2 = t["FlashAttention-1 order"], t["FlashAttention-2 order"]
    assert round(col1["Q"]) == 16 and round(col1["K, V"]) == 8
    assert round(col1["O and m, l (read + write)"]) == 4 * (2 * 4 + 2 * 32)
    assert round(col2["Q"]) == 4 and round(col2["K, V"]) == 32 and round(col2["total"]) == 40


# --- on the recorded data -------------------------------------------------------------------
@pytest.fixture(scope="module")
def r():
    from flashbook.data import results
    return results.load("h200")


def test_device_table_separates_recorded_from_published(r):
    t = lessons.device_table(r)
    assert t.loc["streaming multiprocessors (SMs)", "value"] == str(int(r.profile_meta["sm_count"]))
    assert t.loc["GPU", "source"] == "recorded"
    published = t[t["source"].str.startswith("published: ")]
    assert len(published) == len(lessons.PUBLISHED_H200)


def test_program_resources_are_the_profile(r):
    t = lessons.program_resources(r, "baseline")
    row = r.profile[r.profile["step"] == "baseline"].iloc[0]
    assert t.loc["registers per thread (allocated)", "value"] == \
        f"{row['launch__registers_per_thread_allocated']:,.0f}"
    assert t.loc["workload", "value"].startswith("B=4 H=32 N=")


def test_partitioning_and_best_configs(r):
    t = lessons.partitioning(r)
    sh = r.profile_meta["per_step"]["warp_groups"]["shape"]
    assert t.iloc[0, 0] == f"{sh['B'] * sh['Hq']:,}"
    wg = r.profile[r.profile["step"] == "warp_groups"].iloc[0]
    assert t.iloc[1, 0] == f"{int(wg['launch__grid_size']):,}"   # the grid that was profiled
    cfg = lessons.best_configs(r)
    assert "fp16-causal-d128" in cfg.index and all(c.endswith("K") for c in cfg.columns)
    assert all(("nww" in v or "occ" in v) for v in cfg.loc["fp16-causal-d128"] if v)


def test_published_tables_are_labelled(r):
    t = lessons.fa3_beside_ours(r)
    assert all(s.startswith(("published, H100", "recorded, H200")) for s in t["source"])
    assert any("2407.08608" in s for s in t["source"])
    assert all(s.startswith("published, B200") for s in lessons.fa4_published()["source"])
