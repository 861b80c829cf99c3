"""The flex kernels where a BlockMask block straddles the end of K (TAIL forward; dQ and dK/dV
with more than one kernel tile per block and ragged ends), compiled ahead of time (no GPU) for
sm_90, sm_100 and sm_120: registers, stack, SASS lines and a hash of the SASS text, to compare a
refactor of the tail skip before and after (``flex_sass_snapshot.py`` compiles N = 8K, where no
block straddles the end).

    python experiments/flex_tail_sass.py OUT.json       # against the flashattn on PYTHONPATH
"""
import hashlib
import json
import sys

from flashattn import mods
from flashattn.flex import compile_flex, compile_flex_bwd

NK = 8100                  # not a multiple of any tile: EVEN_K and EVEN_M off
BLOCK = (256, 256)         # two or more kernel tiles per block on every architecture


def _row(r):
    return (r.registers, r.stack_bytes, r.sass_lines,
            hashlib.sha1(r.sass_text.encode()).hexdigest()[:10], r.error[:100])


def main(out):
    res = {}
    for arch in ("sm_90", "sm_100", "sm_120"):
        for name, kw in {"causal": dict(mask=mods.causal()),
                         "softcap+causal": dict(mask=mods.causal(), score=mods.softcap(30.0))}.items():
            res[f"{arch} fwd {name}"] = _row(compile_flex(arch, Nk=NK, block_size=BLOCK,
                                                          keep_sass=True, **kw))
            for kn, r in zip(("dq", "dkdv"), compile_flex_bwd(arch, Nk=NK, block_size=BLOCK,
                                                               keep_sass=True, **kw)):
                res[f"{arch} {kn} {name}"] = _row(r)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    for k, v in res.items():
        print(k, v)


if __name__ == "__main__":
    main(sys.argv[1])
