"""The registry of implementations (flashbook.impls) and the names the benchmark accepts:
steps, experiments, ``best``, variants "STEP@CONFIG", control copies "STEP#N", libraries."""
import pytest

from flashbook import impls
from flashbook.impls import IMPLS, ORDER, base_name, color_of, get, rank
from flashbook.measure.bench import check_impl_name
from flashbook.steps import ARCHS, EXPERIMENTS, STEP_NAMES, STEPS, Config

ALL_STEPS = {**STEPS, **EXPERIMENTS}


def test_every_step_and_experiment_is_registered():
    for name in STEP_NAMES:
        assert IMPLS[name].kind == "step" and IMPLS[name].name == name
    for name in EXPERIMENTS:
        assert IMPLS[name].kind == "experiment" and IMPLS[name].name == name
    assert IMPLS["best"].kind == "best"
    assert impls.STEP_IMPLS == (*STEP_NAMES, *EXPERIMENTS)
    assert set(IMPLS) == {*STEP_NAMES, *EXPERIMENTS, "best", *impls.LIBRARY_IMPLS}
    for name, impl in IMPLS.items():
        assert impl.color.startswith("#") and len(impl.color) == 7, name
        assert impl.label and impl.linestyle, name


def test_steps_have_distinct_colours():
    colours = [IMPLS[n].color for n in STEP_NAMES]
    assert len(set(colours)) == len(colours), dict(zip(STEP_NAMES, colours))
    # Chapter 10 draws the experiments against the steps: theirs differ from the steps' too.
    both = [IMPLS[n].color for n in (*STEP_NAMES, *EXPERIMENTS)]
    assert len(set(both)) == len(both), {n: IMPLS[n].color for n in (*STEP_NAMES, *EXPERIMENTS)}


def test_best_is_drawn_as_the_step_it_runs():
    from flashbook.steps import DEFAULT_BEST
    assert color_of("best") == color_of(DEFAULT_BEST)


def test_libraries():
    assert impls.RATIO_REF == "sdpa_cudnn" and IMPLS[impls.RATIO_REF].kind == "library"
    libs = impls.LIBRARY_IMPLS
    assert set(impls.LIBRARY_OPTIONS.values()) == set(libs)
    colours = [IMPLS[n].color for n in libs]
    assert len(set(colours)) == len(colours)
    assert all(IMPLS[n].linestyle != "-" for n in libs)          # libraries are never solid
    styles = [str(IMPLS[n].linestyle) for n in libs]
    assert len(set(styles)) == len(libs)                         # each its own dash
    assert all(IMPLS[n].linestyle == "-" for n in ORDER if n not in libs)
    for alias, name in impls.ALIASES.items():
        assert name in libs and get(alias) is IMPLS[name] and color_of(alias) == IMPLS[name].color


def test_order_is_the_book_order():
    assert ORDER[:len(STEP_NAMES)] == STEP_NAMES
    assert ORDER.index("best") > max(ORDER.index(n) for n in EXPERIMENTS)
    assert all(ORDER.index(n) > ORDER.index("best") for n in impls.LIBRARY_IMPLS)
    shuffled = ["sdpa_cudnn", "zzz_new", "arch_tuned#2", "baseline@128x64", "naive", "best"]
    assert sorted(shuffled, key=rank) == ["naive", "baseline@128x64", "arch_tuned#2", "best",
                                          "sdpa_cudnn", "zzz_new"]


@pytest.mark.parametrize("name,base", [
    ("arch_tuned@128x128:occ=1", "arch_tuned"), ("arch_tuned@128x128 occ=1 nww=8", "arch_tuned"),
    ("arch_tuned#2", "arch_tuned"), ("pair@64x64#3", "pair"), ("best#2", "best"),
    ("sdpa_cudnn#2", "sdpa_cudnn"), ("fa2", "sdpa_flash"), ("baseline", "baseline"),
])
def test_variants_and_controls_belong_to_their_base(name, base):
    assert base_name(name) == base
    assert get(name) is IMPLS[base]
    assert color_of(name) == IMPLS[base].color
    assert rank(name)[0] == ORDER.index(base)


def test_unknown_names():
    with pytest.raises(KeyError, match="unknown implementation"):
        get("fastest")
    assert color_of("fastest") == color_of("fastest")            # stable, not an error
    assert color_of("my_cudnn_v10") == IMPLS["sdpa_cudnn"].color  # a spelling of a library
    assert rank("fastest")[0] == len(ORDER)


# --- the names bench takes ----------------------------------------------------------------------
GOOD = [*STEP_NAMES, *EXPERIMENTS, "best", "best#2", "arch_tuned@128x128:occ=1",
        "arch_tuned@128x128 occ=1 nww=8", "arch_tuned@128x128,occ=1,nww=8", "arch_tuned#2",
        "baseline#10", "pair@64x64#3", "autotune@256x128:ctas=2", "naive@64x32"]
BAD = ["fastest", "fastest#2", "fastest@64x64", "sdpa_cudnn", "cudnn", "best@64x64",
       "arch_tuned@64", "arch_tuned@64x", "arch_tuned@48x64", "arch_tuned@8x8",
       "arch_tuned@64x64:occ=x", "arch_tuned@64x64:warps=4", "arch_tuned@64x64 occ",
       "arch_tuned#", "arch_tuned#x", "arch_tuned#2#3", "", "@64x64", "#2"]


@pytest.mark.parametrize("name", GOOD)
def test_check_impl_name_accepts(name):
    check_impl_name(name)


@pytest.mark.parametrize("name", BAD)
def test_check_impl_name_rejects(name):
    with pytest.raises(ValueError):
        check_impl_name(name)


def test_the_hopper_ladder_names_are_bench_names():
    from flashbook.measure.bench import step_of
    from flashbook.steps import HOPPER_LADDER
    assert HOPPER_LADDER
    for name, label in HOPPER_LADDER:
        check_impl_name(name)
        step, config = step_of(name, "sm_90")
        assert config is not None and not step.tuned and label
        assert color_of(name) == IMPLS[step.name].color


# --- configurations as text ---------------------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("step", list(ALL_STEPS))
def test_config_label_round_trips(step, arch):
    for c in ALL_STEPS[step].configs(arch):
        assert Config.parse(c.label()) == c, c
        assert Config(*c.as_tuple()) == c                        # bench's worker processes
        assert Config.parse(c.label().replace(" ", ":")) == c    # the variant spelling


@pytest.mark.parametrize("config", [Config(64, 64), Config(128, 128, occupancy=1,
                                                             num_worker_warps=8),
                                    Config(256, 128, num_ctas=2),
                                    Config(64, 128, occupancy=2, num_ctas=1,
                                           num_worker_warps=4)])
def test_config_text_forms(config):
    assert Config.parse(config.label()) == config
    assert config.as_tuple() == (config.TILE_M, config.TILE_N,
                                 *(getattr(config, h) for h in Config.HINTS))
    assert set(config.hints()) <= set(Config.HINTS)
    assert all(v is not None for v in config.hints().values())


def test_config_parse_spellings_and_errors():
    c = Config(128, 128, occupancy=1, num_worker_warps=8)
    assert Config.parse("128x128 occ=1 nww=8") == c
    assert Config.parse("128X128,occupancy=1,num_worker_warps=8") == c
    assert c.label() == "128x128 occ=1 nww=8"
    for bad in ("", "128", "128x", "x128", "100x128", "128x128 occ", "128x128 occ=one",
                "128x128 warps=4", "8x8"):
        with pytest.raises(ValueError):
            Config.parse(bad)
