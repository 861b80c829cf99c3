"""A kernel's contract, written once: its parameters by name, checked against its source.

Every cuTile kernel of the package has one ``KernelSpec``: the names of its array, scalar and
``ct.Constant`` parameters in signature order, and which arrays hold the input dtype. The launch
(``flashattn.launch``) and the ahead-of-time compiler (``flashattn.aot``) both build the
argument list through ``KernelSpec.args`` from *named* values, so they cannot disagree, and a
constant passed under the wrong name, or a spec that lists the signature in another order than
the kernel, raises ``KernelContractError`` before anything is launched or compiled.

The signature check reads the kernel's file with ``ast``: no GPU and no cuda.tile needed.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path


class KernelContractError(ValueError):
    """Arguments that do not match a kernel's parameters, or a spec that does not match its kernel."""


@dataclass(frozen=True)
class Array:
    """An array parameter: its rank, and its element type ("io": the dtype of q, k, v)."""
    name: str
    ndim: int
    dtype: str = "io"        # "io", "float32", "int32" (tables: block table, lengths), or a
                             # cuda.tile dtype name ("float8_e4m3fn": the FP8 kernels' inputs)


@dataclass(frozen=True)
class ArrayTuple:
    """A tuple of arrays as one parameter (a mod's tensors: any number, each its own rank and
    dtype); ``items`` fills it in for a compile, empty in the spec itself."""
    name: str
    items: tuple = ()


@dataclass(frozen=True)
class KernelSpec:
    name: str                               # "fmha", "naive_scores", ...
    module: str                             # "flashattn.kernels.fmha"
    function: str                           # "fmha_kernel"
    arrays: tuple[Array, ...]
    scalars: tuple[tuple[str, type], ...]   # (name, float | int), runtime values
    constants: tuple[str, ...]              # ct.Constant parameters, compile-time values
    _checked: list = field(default_factory=list, init=False, compare=False, repr=False)

    @property
    def params(self) -> tuple[str, ...]:
        return (*(a.name for a in self.arrays), *(n for n, _ in self.scalars), *self.constants)

    # --- the kernel and its source ------------------------------------------------------------
    def kernel(self):
        """The ``@ct.kernel`` object (imports cuda.tile; where it is not installed, the
        interpreter's stand-in for it, so the kernel still runs on a CPU)."""
        self.check_signature()
        from ..interpret import install_shim
        install_shim()
        return getattr(importlib.import_module(self.module), self.function)

    def source_params(self) -> tuple[str, ...]:
        """The parameter names of the kernel function, read from its source file."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or spec.origin is None:
            raise KernelContractError(f"kernel module {self.module} not found")
        tree = ast.parse(Path(spec.origin).read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == self.function:
                return tuple(a.arg for a in node.args.args)
        for node in ast.walk(tree):         # a kernel built by a factory (the flex kernels)
            if isinstance(node, ast.FunctionDef) and node.name == self.function:
                return tuple(a.arg for a in node.args.args)
        raise KernelContractError(f"{self.module} has no function {self.function}")

    def check_signature(self) -> None:
        """Raise KernelContractError unless ``params`` is the kernel's signature, in order."""
        if self._checked:
            return
        src = self.source_params()
        if src != self.params:
            diff = [f"{i}: spec {a!r} vs kernel {b!r}" for i, (a, b) in
                    enumerate(zip(self.params, src)) if a != b]
            if len(src) != len(self.params):
                n = min(len(src), len(self.params))
                diff.append(f"spec has {len(self.params)} parameters, kernel {len(src)}"
                            f" (only in spec: {list(self.params[n:])}, only in kernel: "
                            f"{list(src[n:])})")
            raise KernelContractError(f"kernel spec {self.name!r} does not match "
                                      f"{self.module}.{self.function}: " + "; ".join(diff))
        self._checked.append(True)

    # --- arguments ----------------------------------------------------------------------------
    def _exact(self, what: str, given: dict, expected: tuple[str, ...]) -> None:
        missing = [n for n in expected if n not in given]
        extra = [n for n in given if n not in expected]
        if missing or extra:
            raise KernelContractError(
                f"kernel {self.name!r}: {what} " +
                (f"missing {missing}" if missing else "") + (", " if missing and extra else "") +
                (f"unknown {extra}" if extra else "") + f"; expected {list(expected)}")

    def args(self, arrays: dict, scalars: dict, constants: dict) -> tuple:
        """The positional argument tuple for ``ct.launch``, from values given by name."""
        self.check_signature()
        self._exact("arrays", arrays, tuple(a.name for a in self.arrays))
        self._exact("scalars", scalars, tuple(n for n, _ in self.scalars))
        self._exact("constants", constants, self.constants)
        return (*(arrays[a.name] for a in self.arrays),
                *(t(scalars[n]) for n, t in self.scalars),
                *(constants[n] for n in self.constants))

    def signature(self, *, dtype: str, constants: dict, align: int = 8):
        """The ``KernelSignature`` cuTile's JIT builds for contiguous arrays of ``dtype``."""
        import cuda.tile as ct
        from cuda.tile.compilation import (ArrayConstraint, CallingConvention,
                                           ConstantConstraint, KernelSignature,
                                           ScalarConstraint)
        self.check_signature()
        self._exact("constants", constants, self.constants)
        io = {"float16": ct.float16, "bfloat16": ct.bfloat16}[dtype]

        def arr(a: Array):
            if a.dtype == "int32":
                # Tables come as the caller made them: any row stride, 4-byte aligned.
                return ArrayConstraint(ct.int32, a.ndim, index_dtype=ct.int32,
                                       stride_lower_bound_incl=0, alias_groups=(),
                                       may_alias_internally=False,
                                       stride_constant=(None,) * (a.ndim - 1) + (1,),
                                       stride_divisible_by=1, base_addr_divisible_by=4)
            return ArrayConstraint(io if a.dtype == "io" else getattr(ct, a.dtype), a.ndim,
                                   index_dtype=ct.int32, stride_lower_bound_incl=0,
                                   alias_groups=(), may_alias_internally=False,
                                   stride_constant=(None,) * (a.ndim - 1) + (1,),
                                   stride_divisible_by=(align,) * (a.ndim - 1) + (1,),
                                   base_addr_divisible_by=16)
        scalar = {float: ScalarConstraint(ct.float32), int: ScalarConstraint(ct.int32)}

        def param(a):
            if isinstance(a, ArrayTuple):
                from cuda.tile.compilation import TupleConstraint
                return TupleConstraint([arr(x) for x in a.items])
            return arr(a)
        params = ([param(a) for a in self.arrays] + [scalar[t] for _, t in self.scalars] +
                  [ConstantConstraint(constants[n]) for n in self.constants])
        return KernelSignature(params, calling_convention=CallingConvention.cutile_python_v2())


_HINTED: dict = {}


def hinted(kernel, hints: dict):
    """``kernel.replace_hints(**hints)``, built once per kernel and hints.

    ``replace_hints`` returns a new kernel object; calling it in a loop recompiles (through the
    disk cache) on every launch, so hinted kernels are cached here.
    """
    if not hints:
        return kernel
    key = (id(kernel), tuple(sorted(hints.items())))
    if key not in _HINTED:
        _HINTED[key] = kernel.replace_hints(**hints)
    return _HINTED[key]
