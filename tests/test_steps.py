"""The steps as data (flashbook.steps, registered with flashattn.registry): the configurations each step may run with per
architecture, which step ``best`` is, and autotune's cache (CPU only: no search runs)."""
import json

import pytest
import torch

from flashattn import autotune
from flashbook.steps import (ARCHS, BEST_STEP, DEFAULT_BEST, EXPERIMENTS, SEARCH_SPACE, STEPS,
                             Config, best_step_name, get_step, resolve_name, seed_space,
                             with_config)

ALL_STEPS = {**STEPS, **EXPERIMENTS}
SOME_ARCHS = (*ARCHS, "sm_86", "sm_89", "sm_103", "sm_121", "sm_75", None)


@pytest.mark.parametrize("arch", SOME_ARCHS)
@pytest.mark.parametrize("step", list(ALL_STEPS))
def test_configs_per_arch(step, arch):
    s = ALL_STEPS[step]
    configs = s.configs(arch)
    assert configs and all(isinstance(c, Config) for c in configs)
    assert len(set(configs)) == len(configs), "a configuration listed twice"
    if not s.tuned:
        assert configs == [s.config_for(arch)]
    elif step == "autotune":
        assert configs == seed_space(arch)           # the seed walkthrough's space
    elif step == "arch_tuned":
        assert configs == SEARCH_SPACE.get(arch, SEARCH_SPACE["sm_80"])
    if s.tuned and arch == "sm_90":
        # The configuration a tuned step names is its space's default on Hopper (what it runs
        # with under FLASHATTN_AUTOTUNE=0, and what the book's tables call it).
        assert configs[0] == s.config_for(arch)
    configs.append(Config(16, 16))                 # a caller's list, not the step's
    assert Config(16, 16) not in s.configs(arch)


def test_tuned_steps_and_their_spaces():
    tuned = {n for n, s in ALL_STEPS.items() if s.tuned}
    assert {"autotune", "arch_tuned"} <= tuned
    assert not any(s.tuned for s in EXPERIMENTS.values())
    for arch in SOME_ARCHS:
        assert STEPS["autotune"].configs(arch) == seed_space(arch)
    assert STEPS["arch_tuned"].configs("sm_90")[0] == Config(64, 128, occupancy=2)
    assert seed_space("sm_120") == [Config(64, 64, occupancy=2)]
    for arch in ARCHS:
        assert arch in SEARCH_SPACE


@pytest.mark.parametrize("arch", SOME_ARCHS)
def test_best_resolves_to_a_step(arch):
    name = best_step_name(arch)
    assert name in STEPS                              # a step of the book, not an experiment
    assert resolve_name("best", arch) is STEPS[name]
    assert name == BEST_STEP.get(arch, DEFAULT_BEST)
    for other in ALL_STEPS:
        assert resolve_name(other, arch) is get_step(other)


def test_with_config_untunes():
    c = Config(128, 128, occupancy=1, num_worker_warps=8)
    for name, s in ALL_STEPS.items():
        pinned = with_config(s, c)
        assert not pinned.tuned and pinned.name == s.name
        assert pinned.flag_values() == s.flag_values()
        for arch in SOME_ARCHS:
            assert pinned.configs(arch) == [c]
    assert STEPS["arch_tuned"].tuned                   # the original is untouched


# --- autotune's choice and cache, on the CPU ----------------------------------------------------
@pytest.fixture
def tune_cache(monkeypatch, tmp_path):
    """autotune with its disk cache in tmp_path, a fake GPU name, and no search allowed."""
    gpu = "NVIDIA Test GPU"
    monkeypatch.setenv("FLASHATTN_CACHE", str(tmp_path))
    monkeypatch.setenv("FLASHATTN_AUTOTUNE", "1")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **kw: gpu)

    def no_search(*a, **kw):
        raise AssertionError("autotune searched: the cache should have answered")
    monkeypatch.setattr(autotune, "search", no_search)
    autotune.forget()
    yield gpu, tmp_path / "autotune-NVIDIA_Test_GPU.json"
    autotune.forget()


def _write(path, key, config: Config, ms=1.0):
    path.write_text(json.dumps({key: dict(TILE_M=config.TILE_M, TILE_N=config.TILE_N,
                                          **config.hints(), ms=ms)}))


def test_autotune_reads_its_cache_and_forget_drops_it(tune_cache):
    gpu, path = tune_cache
    step = STEPS["arch_tuned"]
    q, k = torch.zeros(1, 4, 100, 64, dtype=torch.float16), torch.zeros(1, 2, 100, 64,
                                                                        dtype=torch.float16)
    key = f"{step.name}:{autotune.shape_key(q, k, True)}"
    assert key == "arch_tuned:nq128-nk128-d64-g2-bh4-causal-float16"
    first = Config(128, 128, occupancy=1, num_worker_warps=8)
    _write(path, key, first)
    assert autotune.choose(step, "sm_90", q, k, True) == first   # every hint round-trips
    _write(path, key, Config(64, 64))
    assert autotune.choose(step, "sm_90", q, k, True) == first   # served from memory
    autotune.forget("another GPU")
    assert autotune.choose(step, "sm_90", q, k, True) == first
    autotune.forget(gpu)
    assert autotune.choose(step, "sm_90", q, k, True) == Config(64, 64)
    _write(path, key, Config(64, 128, occupancy=2))
    autotune.forget()
    assert autotune.choose(step, "sm_90", q, k, True) == Config(64, 128, occupancy=2)


def test_autotune_off_takes_the_first_configuration(tune_cache, monkeypatch):
    monkeypatch.setenv("FLASHATTN_AUTOTUNE", "0")
    q = torch.zeros(1, 2, 8, 16, dtype=torch.float16)
    for name in ("autotune", "arch_tuned"):
        for arch in ARCHS:
            assert autotune.choose(STEPS[name], arch, q, q, False) == STEPS[name].configs(arch)[0]


def test_autotune_moved_its_spaces_to_steps():
    assert not hasattr(autotune, "search_space") and not hasattr(autotune, "best")
    assert not hasattr(autotune, "SEARCH_SPACE")
