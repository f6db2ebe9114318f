"""The PTX emulator: tilefuse's GPU code run on the host.

``TILEFUSE_TARGET=emulate`` (or ``emulate:sm_80``; sm_90 by default) makes
CPU tensors take the GPU path: the kernels are compiled to PTX, launched
through the same driver code as on a GPU, and run by the emulator, which
checks every access (buffer bounds, shared-memory races, barriers,
uninitialized registers) and counts the traffic::

    TILEFUSE_TARGET=emulate python -c "import torch, tilefuse.functional as F; \\
        F.rms_norm(torch.randn(4, 1024), (1024,), torch.ones(1024))"

A failed check raises the op's RuntimeError naming the kernel, the PTX line,
the block and the thread.
"""

from __future__ import annotations

from . import _C


def active() -> bool:
    """Whether TILEFUSE_TARGET runs CPU tensors in the emulator."""
    return _C.target()[0] == "emulate"


def device() -> tuple[str, int]:
    """The emulated chip and its number of SMs, e.g. ('sm_90', 132)."""
    return _C.emulator_device()


def last_launches() -> list[dict]:
    """The kernel launches since the previous call, oldest first (and
    forgets them). Each is a dict: ``kernel``, ``chip``, ``grid``,
    ``block``; ``buffers`` (per buffer the launch was given, then per
    ``.global``/``.const`` variable of the kernel's module: ``name``,
    ``bytes``, ``loaded_bytes``, ``stored_bytes``, ``loads``, ``stores``);
    ``instructions`` (thread-instructions by class: memory, arithmetic, f64,
    transcendental, division, conversion, sync, control); ``barriers`` and
    ``shuffles`` completed; ``declared_registers``, ``shared_bytes``,
    ``seconds``."""
    return _C.emulator_launches()


def set_approximation(mode: str) -> None:
    """What the f32 ``.approx`` instructions (ex2, div, rcp, rsqrt, sqrt)
    return in launches from now on: ``'exact'`` (the exact result rounded to
    nearest, more accurate than a GPU; the default), ``'high'`` or ``'low'``
    (moved up or down by the whole error PTX allows: ex2 and div 2 ulp, rcp
    1 ulp, rsqrt 2^-22.9, sqrt 2^-23 relative; the worst case for sums of
    them). ``TILEFUSE_EMULATE_APPROX`` sets it when the emulator starts."""
    _C.emulator_set_approximation(mode)


__all__ = ["active", "device", "last_launches", "set_approximation"]
