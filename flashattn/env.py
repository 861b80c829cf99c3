"""Where a number was measured: GPU, driver, CUDA, torch, cuTile and tileiras versions.

Every file under ``results/`` carries ``metadata()``, so a table in the book can say which
machine and which toolchain produced it (``flashattn.results.source_line``).

    python -m flashattn info            # readable
    python -m flashattn info --json     # the dict that results files carry as "meta"

Works on a machine without a GPU: the GPU fields are then ``None``.
"""
from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version

# Words of a GPU's marketing name that are not its model: vendor, product line, memory,
# form factor ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H200 NVL").
_NOT_MODEL = re.compile(r"^(nvidia|geforce|tesla|quadro|\d+gb|hbm\d*e?|sxm\d*|pcie|nvl|"
                        r"generation|mig.*|\d+g\.\d+gb)$", re.IGNORECASE)


def command_line(argv: list[str] | None = None) -> str:
    """The command that is running, as a user would type it (``python -m flashattn ...``)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return "python"
    head = argv[0].replace("\\", "/")
    for pkg in ("flashattn", "flashbook"):                   # the library's CLI or the book's
        if head.endswith(f"{pkg}/__main__.py"):
            return shlex.join(["python", "-m", pkg, *argv[1:]])
        if head.endswith(f"/{pkg}") or head == pkg:          # the console script
            return shlex.join([pkg, *argv[1:]])
    return shlex.join(["python", *argv])


def _version(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def tileiras_version() -> str | None:
    """The tileiras wheel's version, else the first version number ``tileiras --version`` prints."""
    v = _version("nvidia-cuda-tileiras")
    if v:
        return v
    exe = shutil.which("tileiras")
    if not exe:
        return None
    try:
        res = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\d+\.\d+(?:\.\d+)*", res.stdout + res.stderr)
    return m.group(0) if m else None


def cuda_tile_version() -> str | None:
    try:
        import cuda.tile as ct
        return ct.__version__
    except Exception:   # not installed, or an import that fails on this machine
        return _version("cuda-tile")


def driver_version() -> str | None:
    """The NVIDIA driver's version ("580.159"), from nvidia-smi, else NVML; None without one."""
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            res = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            line = res.stdout.strip().splitlines()
            if res.returncode == 0 and line and line[0].strip():
                return line[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import pynvml  # nvidia-ml-py, if present
        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return None


def build() -> dict:
    """Which code a number measured: the commit (git, else ``FLASHATTN_BUILD_COMMIT``) and a
    SHA-256 over the library's kernel sources (``flashattn/kernels/**/*.py``), which also
    identifies a copy without ``.git`` (the GPU host's)."""
    import hashlib
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    kdir = os.path.join(root, "kernels")
    for dirpath, dirs, files in sorted(os.walk(kdir)):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as fh:
                    h.update(fh.read())
    commit = os.environ.get("FLASHATTN_BUILD_COMMIT")
    if not commit:
        try:
            res = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                 text=True, timeout=10)
            commit = res.stdout.strip() if res.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return dict(commit=commit or None, kernels_sha256=h.hexdigest()[:16])


def _gpu_fields(device=None) -> dict:
    fields = dict(gpu=None, sm_count=None, compute_capability=None, arch=None,
                  gpu_memory_gib=None)
    try:
        import torch
        if not torch.cuda.is_available():
            return fields
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else device
        p = torch.cuda.get_device_properties(dev)
        fields.update(gpu=p.name, sm_count=p.multi_processor_count,
                      compute_capability=f"{p.major}.{p.minor}", arch=f"sm_{p.major}{p.minor}",
                      gpu_memory_gib=round(p.total_memory / 2**30, 1))
    except Exception:
        pass
    return fields


def metadata(command: str | None = None, device=None) -> dict:
    """What this machine is and runs, as a JSON-ready dict.

    Keys: gpu (name or None), sm_count, compute_capability ("9.0"), arch ("sm_90"),
    gpu_memory_gib, driver, cuda (torch.version.cuda), torch, cuda_tile, tileiras, python,
    platform (no host name), date (ISO 8601, UTC), command (the command line), build (the
    commit and a hash of the kernel sources, ``build()``).
    """
    try:
        import torch
        torch_v, cuda_v = torch.__version__, torch.version.cuda
    except ImportError:
        torch_v = cuda_v = None
    gpu = _gpu_fields(device)
    return dict(
        **gpu,
        driver=driver_version() if gpu["gpu"] else None,
        cuda=cuda_v,
        torch=torch_v,
        cuda_tile=cuda_tile_version(),
        tileiras=tileiras_version(),
        python=platform.python_version(),
        platform=f"{platform.system()}-{platform.release()}-{platform.machine()}",
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        command=command_line() if command is None else command,
        build=build(),
    )


def slug(name: str | None) -> str:
    """A GPU model as a short lowercase name: "NVIDIA H200" -> "h200"; None -> "cpu"."""
    if not name:
        return "cpu"
    words = [w for w in re.split(r"[\s\-_/]+", name) if w and not _NOT_MODEL.match(w)]
    s = "".join(c for c in "".join(words).lower() if c.isalnum())
    return s or "cpu"


def gpu_slug(name: str | None = None) -> str:
    """This machine's GPU as a directory name under results/ ("h200", "b200"); "cpu" if none."""
    if name is None:
        name = _gpu_fields()["gpu"]
    return slug(name)


_LABELS = [("gpu", "GPU"), ("sm_count", "SMs"), ("compute_capability", "compute capability"),
           ("arch", "arch"), ("gpu_memory_gib", "memory (GiB)"), ("driver", "driver"),
           ("cuda", "CUDA (torch)"), ("torch", "torch"), ("cuda_tile", "cuda-tile"),
           ("tileiras", "tileiras"), ("python", "python"), ("platform", "platform"),
           ("date", "date (UTC)"), ("command", "command")]


def format_metadata(meta: dict) -> str:
    w = max(len(label) for _, label in _LABELS)
    lines = []
    for key, label in _LABELS:
        v = meta.get(key)
        lines.append(f"{label:<{w}}  {'-' if v is None else v}")
    lines.append(f"{'results dir':<{w}}  results/{gpu_slug(meta.get('gpu'))}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m flashattn info",
                                description="What this machine has: GPU, driver, CUDA, torch, "
                                            "cuda-tile and tileiras versions.")
    p.add_argument("--json", action="store_true", help="print the metadata as JSON")
    a = p.parse_args(argv)
    meta = metadata()
    print(json.dumps(meta, indent=1) if a.json else format_metadata(meta))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


def cache_root():
    """Where flashattn caches cubins and autotune results: $FLASHATTN_CACHE or ~/.cache/flashattn."""
    from pathlib import Path
    return Path(os.environ.get("FLASHATTN_CACHE", Path.home() / ".cache" / "flashattn"))
