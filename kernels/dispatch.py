"""Choosing between the Triton kernels and the PyTorch paths, and jitting kernels lazily.

The rule (one place, used by every op):

* ``BRORL_TRITON=1`` forces the Triton kernels (on CPU tensors this needs
  ``TRITON_INTERPRET=1``: the interpreter tests use exactly that pair);
* ``BRORL_TRITON=0`` forces the PyTorch paths;
* otherwise Triton runs when the input lives on CUDA and triton is importable.

Kernels are written as plain functions and wrapped by :class:`LazyKernel`, which calls
``triton.jit`` at the first launch instead of at import. ``triton.jit`` decides between
the compiler and the CPU interpreter when it decorates, so a module-level ``@triton.jit``
would freeze whatever ``TRITON_INTERPRET`` said when ``kernels`` was first imported; the
lazy wrapper reads it at every launch and keeps one jitted kernel per mode.

Triton's own library functions (``tl.sum``, ``tl.max``, ...) are ``@jit`` functions too,
decorated when ``triton`` is imported. If that import happened without the interpreter
(another test, vLLM, ...), an interpreted launch swaps them for interpreted twins for the
duration of the launch (:func:`_interpretable_stdlib`) -- what triton would have built
had ``TRITON_INTERPRET=1`` been set at its import. Compiled launches never touch this.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Callable, Iterator

import torch

_TRUE = ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when triton imports (it does on CPU machines too; it just cannot launch there)."""
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # ImportError, or a broken install
        return False
    return True


def interpret_mode() -> bool:
    """True when triton would run kernels in its CPU interpreter (``TRITON_INTERPRET``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def use_triton(x: torch.Tensor) -> bool:
    """Whether an op on tensor ``x`` should launch its Triton kernel."""
    flag = os.environ.get("BRORL_TRITON", "").strip().lower()
    if flag in ("0", "false", "no", "off"):
        return False
    if flag in _TRUE:
        if not triton_available():
            raise RuntimeError("BRORL_TRITON=1 but triton does not import; unset BRORL_TRITON")
        if not x.is_cuda and not interpret_mode():
            raise RuntimeError(
                "BRORL_TRITON=1 with CPU tensors needs TRITON_INTERPRET=1 "
                "(Triton kernels only run on CUDA or in the interpreter)"
            )
        return True
    return x.is_cuda and triton_available()


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (max(int(n), 1) - 1).bit_length()


class LazyKernel:
    """A Triton kernel jitted at first launch, once per interpreter mode.

    Use: ``_my_kernel = LazyKernel(_my_kernel_fn)``, then ``_my_kernel[grid](*args, **meta)``.
    The function body is ordinary Triton code (``tl.*`` calls, ``tl.constexpr`` annotations);
    it calls device functions only through a module that ``_interpretable_stdlib`` knows
    (``kernels.online_softmax``), so that an interpreted launch runs their interpreted twins.
    """

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self._jitted: dict[bool, Any] = {}
        functools.update_wrapper(self, fn)

    def jitted(self) -> Any:
        mode = interpret_mode()
        kernel = self._jitted.get(mode)
        if kernel is None:
            import triton

            # triton.jit reads TRITON_INTERPRET itself, at decoration; it agrees with `mode`.
            kernel = triton.jit(self.fn)
            self._jitted[mode] = kernel
        return kernel

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        launch = self.jitted()[grid]
        if not interpret_mode():
            return launch

        def interpreted(*args: Any, **kwargs: Any) -> Any:
            with _interpretable_stdlib():
                return launch(*args, **kwargs)

        return interpreted


@contextlib.contextmanager
def _interpretable_stdlib() -> Iterator[None]:
    """Temporarily replace triton.language's compiled-mode @jit helpers by interpreted ones."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    import kernels.online_softmax as online_softmax  # the project's own device functions

    modules = [tl, tl.standard, getattr(tl, "math", None), online_softmax]
    saved: list[tuple[Any, str, Any]] = []
    twins: dict[int, Any] = {}  # one twin per function, so identity checks still hold
    try:
        for module in filter(None, modules):
            for name, obj in list(vars(module).items()):
                if isinstance(obj, JITFunction):
                    twin = twins.setdefault(id(obj), InterpretedFunction(obj.fn))
                    saved.append((module, name, obj))
                    setattr(module, name, twin)
        yield
    finally:
        for module, name, obj in reversed(saved):
            setattr(module, name, obj)
