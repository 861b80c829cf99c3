"""The FP8 kernels' compile report (issue 24): tileiras for sm_90, sm_100, sm_120, no GPU.

    PYTHONPATH=$PWD python experiments/fp8_compile.py [--quick] [--out experiments/data/42-fp8-aot]

Compiles every case of ``flashbook.compile_fp8.compile_cases`` (the FP8 forward with V transposed
(K-major) and not, e5m2 and exact accumulation on sm_90, and the fp8-cache decode split kernel)
and writes ``report.txt`` (the table) and ``report.json.xz`` (registers, stack, shared memory,
SASS counts and the MMA instruction forms of each).
"""
import argparse
import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="D=128 only")
    ap.add_argument("--arch", action="append", help="sm_90, sm_100, sm_120 (repeatable)")
    ap.add_argument("--out", default="experiments/data/42-fp8-aot")
    a = ap.parse_args(argv)
    from flashbook.compile_fp8 import compile_cases, compile_report, format_compile_report
    archs = tuple(a.arch or ("sm_90", "sm_100", "sm_120"))
    t0 = time.time()
    rows = compile_report(compile_cases(archs=archs, quick=a.quick))
    table = format_compile_report(rows)
    print(table)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import cuda.tile as ct
    meta = dict(cuda_tile=ct.__version__, archs=archs, quick=a.quick,
                seconds=round(time.time() - t0, 1))
    (out / "report.txt").write_text(table + "\n")
    import lzma                       # records over ~20 KB are kept xz-compressed (CONTRIBUTING)
    (out / "report.json.xz").write_bytes(lzma.compress(
        (json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n").encode(), preset=9))
    print(f"wrote {out}/report.txt, report.json.xz ({meta['seconds']} s)")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
