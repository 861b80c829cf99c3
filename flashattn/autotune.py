"""Autotuning (chapter 9): search tile shapes and launch hints per shape and architecture.

The search space differs per architecture, because what is fast differs: Blackwell keeps the
accumulator in tensor memory and likes 256x128 tiles; on Hopper those tiles spill registers
(chapter 5) and 64-row tiles with two programs per SM win. Results are cached per GPU name
in memory and in ``$FLASHATTN_CACHE`` (default ``~/.cache/flashattn``), keyed by the shape
bucket, so a search runs once per GPU and shape class.

``FLASHATTN_AUTOTUNE=0`` skips the search and uses the first configuration of the space
(the test suite does this to keep compile time down).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .steps import Config, STEPS, get_step

def seed_space(arch: str) -> list[Config]:
    """The seed walkthrough's search space: one list for every architecture but sm_120."""
    if arch in ("sm_120", "sm_121"):
        return [Config(64, 64, occupancy=2)]
    return [Config(64, 64, occupancy=2), Config(128, 128, occupancy=2),
            Config(256, 128, occupancy=1)]


# Chapter 10: a space per architecture, from what the compiler report and the H200 showed.
SEARCH_SPACE: dict[str, list[Config]] = {
    # Hopper: registers hold the fp32 accumulators; small M tiles and 2 programs/SM.
    "sm_90": [Config(64, 128, occupancy=2), Config(64, 64, occupancy=2),
              Config(128, 64, occupancy=2), Config(128, 128, occupancy=1),
              Config(128, 64, occupancy=1)],
    # Datacenter Blackwell: the seed's space (tensor-memory accumulators, large tiles pay).
    "sm_100": [Config(256, 128, occupancy=1), Config(128, 128, occupancy=2),
               Config(64, 64, occupancy=2), Config(256, 128, occupancy=2)],
    # Consumer Blackwell and Ampere: less shared memory, small tiles only. Not measured here:
    # ordered by the compiler's report (python -m flashattn compile --arch sm_120 / sm_80), the
    # configuration with the fewest spill bytes first (sm_120: 0 B; sm_80: 592 B; all sm_80
    # variants with fast math spill a little, as Ampere's mma.sync holds operands in registers).
    "sm_120": [Config(64, 64), Config(64, 64, occupancy=2), Config(64, 128, occupancy=1)],
    "sm_80": [Config(64, 128, occupancy=1), Config(128, 64, occupancy=1),
              Config(64, 64, occupancy=2)],
}
SEARCH_SPACE["sm_103"] = SEARCH_SPACE["sm_100"]
SEARCH_SPACE["sm_121"] = SEARCH_SPACE["sm_120"]
SEARCH_SPACE["sm_89"] = SEARCH_SPACE["sm_86"] = SEARCH_SPACE["sm_80"]

# The fastest step measured on each architecture (results/<gpu>/; chapter 10). Architectures
# we have not measured get the seed's final step.
BEST_STEP: dict[str, str] = {"sm_90": "arch_tuned"}
DEFAULT_BEST = "arch_tuned"   # on unmeasured archs, its space there is the seed's or smaller

_memory: dict = {}


def search_space(arch: str, step=None) -> list[Config]:
    """The configurations a tuned step tries on ``arch``: the seed's for ``autotune``."""
    if step is not None and getattr(step, "name", step) == "autotune":
        return seed_space(arch)
    return SEARCH_SPACE.get(arch, SEARCH_SPACE["sm_80"])


def shape_key(q, k, causal: bool) -> str:
    """Bucket a problem: powers of two of the lengths, exact D, group size, causal, dtype."""
    from .api import next_pow2
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    return (f"nq{next_pow2(Nq)}-nk{next_pow2(Nk)}-d{D}-g{Hq // Hkv}-bh{next_pow2(B * Hq)}"
            f"-{'causal' if causal else 'full'}-{str(q.dtype).replace('torch.', '')}")


def _cache_file(gpu_name: str) -> Path:
    from .env import cache_root
    return cache_root() / f"autotune-{''.join(c if c.isalnum() else '_' for c in gpu_name)}.json"


def _load(gpu_name: str) -> dict:
    if gpu_name not in _memory:
        try:
            _memory[gpu_name] = json.loads(_cache_file(gpu_name).read_text())
        except (OSError, ValueError):
            _memory[gpu_name] = {}
    return _memory[gpu_name]


def _save(gpu_name: str) -> None:
    f = _cache_file(gpu_name)
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(_memory[gpu_name], indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only home still tunes, just not across processes


def search(step, arch: str, q, k, v, causal: bool, *, reps: int = 10):
    """Time every configuration of the space on these inputs; return [(Config, ms)], fastest first."""
    import torch

    from .api import launch
    from .timing import time_cuda
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    timings = []
    for cfg in search_space(arch, step):
        fn = lambda: launch(q, k, v, out, step, cfg, causal=causal, scale=scale)  # noqa: E731
        try:
            ms = time_cuda(fn, warmup=2, reps=reps).median_ms
        except Exception as e:  # a config that does not compile here is skipped, not fatal
            timings.append((cfg, float("inf"), f"{type(e).__name__}: {e}"[:200]))
            continue
        timings.append((cfg, ms, ""))
    timings.sort(key=lambda t: t[1])
    return timings


def choose(step, arch: str, q, k, causal: bool, v=None) -> Config:
    """The cached winner for this shape on this GPU, searching on first use."""
    import torch
    space = search_space(arch, step)
    if os.environ.get("FLASHATTN_AUTOTUNE", "1") == "0":
        return space[0]
    gpu = torch.cuda.get_device_name(q.device)
    cache = _load(gpu)
    key = f"{step.name}:{shape_key(q, k, causal)}"
    if key not in cache:
        # Search on fresh random inputs of the same shape, so the caller's data is untouched.
        kk = torch.randn_like(k)
        timings = search(step, arch, torch.randn_like(q), kk, torch.randn_like(kk), causal)
        best_cfg, best_ms, _ = timings[0]
        if best_ms == float("inf"):
            raise RuntimeError(f"no autotune configuration compiled for {arch}: "
                               + "; ".join(t[2] for t in timings))
        cache[key] = dict(TILE_M=best_cfg.TILE_M, TILE_N=best_cfg.TILE_N,
                          occupancy=best_cfg.occupancy, num_ctas=best_cfg.num_ctas,
                          ms=best_ms)
        _save(gpu)
    c = cache[key]
    return Config(c["TILE_M"], c["TILE_N"], c.get("occupancy"), c.get("num_ctas"))


def best_step_name(arch: str) -> str:
    return BEST_STEP.get(arch, DEFAULT_BEST)


def best(arch: str, q, k, causal: bool):
    s = get_step(best_step_name(arch))
    if s.tuned:
        return s, choose(s, arch, q, k, causal)
    return s, s.config_for(arch)


assert all(n in STEPS for n in BEST_STEP.values()) and DEFAULT_BEST in STEPS
