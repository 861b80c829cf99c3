"""The command lines, ``python -m flashattn COMMAND`` (the library's: compile, info) and
``python -m flashbook COMMAND`` (the book's: steps, bench, profile, ...): help for each package
and every command, and the exit status of a mistake (argparse's 2). Run as a user runs it, in a
subprocess."""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flashattn.__main__ as lib_cli
import flashbook.__main__ as book_cli
from flashbook.__main__ import main

REPO = Path(__file__).resolve().parent.parent
CLIS = {"flashattn": lib_cli, "flashbook": book_cli}
ALL = [(pkg, name) for pkg, cli in CLIS.items() for name in cli.COMMANDS]


def run(*args, module="flashbook"):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.strip().split("\n\n") if p.strip()]


@pytest.mark.parametrize("pkg", list(CLIS))
@pytest.mark.parametrize("args", [["--help"], ["-h"], []])
def test_package_help(pkg, args):
    res = run(*args, module=pkg)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith(f"usage: python -m {pkg}")
    assert "FlashAttention in cuTile" in out                   # the description
    for name, (_, help_, example) in CLIS[pkg].COMMANDS.items():
        assert name in out and example in out, name
        assert " ".join(help_.split()[:3]) in " ".join(out.split()), name


@pytest.mark.parametrize("pkg,command", ALL)
def test_command_help(pkg, command):
    res = run(command, "--help", module=pkg)
    assert res.returncode == 0, f"{command} --help: exit {res.returncode}\n{res.stderr}"
    ps = paragraphs(res.stdout)
    assert ps and ps[0].startswith(f"usage: python -m {pkg} {command}"), res.stdout[:300]
    # argparse prints the description right after the usage.
    assert len(ps) > 1 and not ps[1].startswith(("options:", "positional arguments:")), \
        f"{command} --help prints no description:\n{res.stdout}"
    assert len(ps[1].split()) >= 4, ps[1]
    assert "-h, --help" in res.stdout


@pytest.mark.parametrize("pkg,command", ALL)
def test_command_modules_have_a_main(pkg, command):
    module = CLIS[pkg].COMMANDS[command][0]
    assert callable(importlib.import_module(module).main), module
    if pkg == "flashattn":                       # the library's commands never reach the book
        assert module.startswith("flashattn."), module


def test_commands_are_the_subparsers():
    for pkg, cli in CLIS.items():
        p = cli.build_parser()
        sub = next(a for a in p._actions if a.dest == "command")
        assert list(sub.choices) == list(cli.COMMANDS), pkg
    assert set(lib_cli.COMMANDS) == {"compile", "info"}
    assert set(book_cli.COMMANDS) == {"steps", "compile", "bench", "decode-bench", "profile",
                                      "record", "nbrun"}


@pytest.mark.parametrize("pkg", list(CLIS))
def test_unknown_command_exits_2(pkg):
    res = run("benchmark", module=pkg)
    assert res.returncode == 2
    assert "unknown command 'benchmark'" in res.stderr
    for name in CLIS[pkg].COMMANDS:
        assert name in res.stderr
    assert CLIS[pkg].main(["nope"]) == 2


def test_a_book_command_is_not_a_library_command():
    res = run("bench", "--help", module="flashattn")
    assert res.returncode == 2 and "unknown command 'bench'" in res.stderr


def test_bad_option_of_a_command_exits_2():
    res = run("bench", "--steps", "fastest", "--seqlens", "256")
    assert res.returncode == 2
    assert "unknown step 'fastest'" in res.stderr


def test_steps_command_lists_every_step_and_experiment(capsys):
    from flashbook import EXPERIMENTS, STEP_NAMES
    assert main(["steps"]) == 0
    out = capsys.readouterr().out
    names = [ln.split()[0] for ln in out.splitlines() if ln.strip() and not ln.endswith(":")]
    assert names == [*STEP_NAMES, *EXPERIMENTS]


def test_nbrun_module_still_runs_on_its_own():
    res = run("--help", module="flashbook.nbrun")
    assert res.returncode == 0, res.stderr
    assert "notebook" in res.stdout


def test_decode_bench_plan_runs_without_a_gpu():
    res = run("decode-bench", "--plan", "--part", "decode,host,crossover,varlen")
    assert res.returncode == 0, res.stderr
    for part in ("decode:", "host:", "crossover:", "varlen:", "estimated time on an H200"):
        assert part in res.stdout, part


def test_decode_bench_bad_option_exits_2():
    res = run("decode-bench", "--nq", "32")
    assert res.returncode == 2
    assert "--nq needs integers in [1, 16]" in res.stderr
