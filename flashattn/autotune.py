"""Autotuning: search tile shapes and launch hints per shape and architecture.

    step, config = resolve("best", q, k, causal=True)   # which step, which tiles and hints

The search space differs per architecture (``Step.configs(arch)``; the tables are
``kernels.fmha_fwd_spec``'s), because what is fast differs: Blackwell keeps the accumulator in
tensor memory and likes 256x128 tiles; on Hopper those tiles spill registers and
64-row tiles with two programs per SM win. Results are cached per GPU name in memory and in
``$FLASHATTN_CACHE`` (default ``~/.cache/flashattn``), keyed by the shape bucket, so a search
runs once per GPU and shape class.

``FLASHATTN_AUTOTUNE=0`` skips the search and uses the first configuration of the space
(the test suite does this to keep compile time down).

CPU tensors run by the interpreter (``flashattn.dispatch``) never search: there is no GPU to
time. They get the winner cached for the GPU the interpreter stands in for (its name, e.g.
"NVIDIA H200", keys the cache as on that GPU) when this machine's cache holds one, read and never
written; otherwise the first configuration of the space, as with ``FLASHATTN_AUTOTUNE=0``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .contract import next_pow2
from .dispatch import device_arch, device_name, interpreting
from .launch import launch
from .config import Config
from .registry import Step, resolve_name

_memory: dict = {}


def forget(gpu_name: str | None = None) -> None:
    """Drop the in-memory cache (of one GPU, or all); the disk cache is kept."""
    if gpu_name is None:
        _memory.clear()
    else:
        _memory.pop(gpu_name, None)


def shape_key(q, k, causal: bool) -> str:
    """Bucket a problem: powers of two of the lengths, exact D, group size, causal, dtype."""
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


def search(step, arch: str, q, k, v, causal: bool, *, rounds: int = 8, inner: int = 3):
    """Time every configuration of the space on these inputs; return [(Config, ms, error)],
    fastest first. The configurations are timed in alternation, as the benchmarks time
    (``timing.time_rounds``: CUDA-graph batches, a random order every round), so a
    drifting GPU does not pick the winner."""
    import torch

    from .timing import time_rounds
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    timings, fns = [], {}
    for i, cfg in enumerate(step.configs(arch)):
        fn = lambda cfg=cfg: launch(q, k, v, out, step, cfg, causal=causal, scale=scale)  # noqa: E731
        try:
            fn()                                  # compile; a failure skips this configuration
            torch.cuda.synchronize()
        except Exception as e:  # a config that does not compile here is skipped, not fatal
            timings.append((cfg, float("inf"), f"{type(e).__name__}: {e}"[:200]))
            continue
        fns[i] = (cfg, fn)
    if fns:
        timed = time_rounds({i: fn for i, (_, fn) in fns.items()}, rounds=rounds, inner=inner)
        timings += [(cfg, timed[i].median_ms, "") for i, (cfg, _) in fns.items()]
    timings.sort(key=lambda t: t[1])
    return timings


def choose(step, arch: str, q, k, causal: bool, target=None) -> Config:
    """The cached winner for this shape on this GPU, searching on first use (never for the
    interpreter: the cached winner or the first configuration, see the module docstring).
    ``target``: the ``dispatch.Target`` of q's device, if the caller has it."""
    import torch
    space = step.configs(arch)
    if os.environ.get("FLASHATTN_AUTOTUNE", "1") == "0":
        return space[0]
    device = q.device if target is None else target
    gpu, interpreted = device_name(device), interpreting(device)
    cache = _load(gpu)
    key = f"{step.name}:{shape_key(q, k, causal)}"
    if key not in cache and interpreted:
        return space[0]
    if key not in cache:
        # Search on fresh random inputs of the same shape, so the caller's data is untouched.
        kk = torch.randn_like(k)
        timings = search(step, arch, torch.randn_like(q), kk, torch.randn_like(kk), causal)
        best_cfg, best_ms, _ = timings[0]
        if best_ms == float("inf"):
            raise RuntimeError(f"no autotune configuration compiled for {arch}: "
                               + "; ".join(t[2] for t in timings))
        cache[key] = dict(TILE_M=best_cfg.TILE_M, TILE_N=best_cfg.TILE_N, **best_cfg.hints(),
                          ms=best_ms)
        _save(gpu)
    c = cache[key]
    return Config(c["TILE_M"], c["TILE_N"], **{h: c.get(h) for h in Config.HINTS})


def resolve(step: str, q, k, causal: bool, target=None, *,
            config=None) -> tuple[Step, Config]:
    """The Step object and the Config it runs with for these inputs on this GPU: "best"
    resolved for the GPU's architecture, a tuned step's configuration chosen by ``choose``.
    ``target``: the ``dispatch.Target`` the caller resolved for q's device (default: q's).
    ``config``: run with these tiles instead, or ``"first"``: the step's first configuration
    on this architecture, whatever the shape (the same compiled kernels for every length)."""
    arch = device_arch(q.device if target is None else target)
    s = resolve_name(step, arch)
    if config == "first":
        return s, s.configs(arch)[0] if s.tuned else s.config_for(arch)
    if config is not None:
        return s, config
    if s.tuned:
        return s, choose(s, arch, q, k, causal, target)
    return s, s.config_for(arch)
