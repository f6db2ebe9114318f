"""Drop-in modules: each is its torch.nn counterpart (the same constructor
arguments, parameter names and state_dict) whose forward runs a fused
tilefuse op, so `model.load_state_dict` works both ways unchanged.

    norm = tilefuse.nn.RMSNorm(4096, eps=1e-6)   # loads torch.nn.RMSNorm's
                                                # and Hugging Face LlamaRMSNorm's weights
    mlp = tilefuse.nn.SwiGLU(4096, 11008)       # gate_proj, up_proj, down_proj
"""

from __future__ import annotations

from torch import Tensor, nn

from . import _dsl, functional

__all__ = ["CrossEntropyLoss", "GeGLU", "LayerNorm", "RMSNorm", "SwiGLU"]


def _last_dimension(module: nn.Module) -> None:
    """The fused norms normalize over the last dimension only."""
    if len(module.normalized_shape) != 1:
        raise ValueError(f"tilefuse.nn.{type(module).__name__} normalizes over the last "
                         f"dimension: normalized_shape must have one dimension, got "
                         f"{list(module.normalized_shape)}")


class RMSNorm(nn.RMSNorm):
    """torch.nn.RMSNorm over the last dimension (parameter `weight`), fused:
    one kernel forward, one backward."""

    def __init__(self, normalized_shape, eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        _last_dimension(self)

    def forward(self, input: Tensor) -> Tensor:
        return functional.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", fused=tilefuse.functional.rms_norm"


class LayerNorm(nn.LayerNorm):
    """torch.nn.LayerNorm over the last dimension (parameters `weight` and
    `bias`), fused: one kernel forward, one backward."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True, device=None, dtype=None):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)
        _last_dimension(self)

    def forward(self, input: Tensor) -> Tensor:
        return functional.layer_norm(input, self.normalized_shape, self.weight, self.bias,
                                     self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", fused=tilefuse.functional.layer_norm"


class CrossEntropyLoss(nn.CrossEntropyLoss):
    """torch.nn.CrossEntropyLoss for [N, C] logits and class indices, fused
    (log-softmax, NLL, label smoothing and the gradient in one pass)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return functional.cross_entropy(input, target, self.weight,
                                        ignore_index=self.ignore_index,
                                        reduction=self.reduction,
                                        label_smoothing=self.label_smoothing)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction}, "
                f"label_smoothing={self.label_smoothing}, "
                "fused=tilefuse.functional.cross_entropy")


@_dsl.fusion
def _geglu(gate, up):
    return _dsl.gelu(gate, approximate="tanh") * up


class _GatedMLP(nn.Module):
    """down_proj(activation(gate_proj(x)) * up_proj(x)), Hugging Face's
    LlamaMLP parameter names; the activation and product fused."""

    _fused = ""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False,
                 device=None, dtype=None):
        super().__init__()
        options = dict(bias=bias, device=device, dtype=dtype)
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **options)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **options)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **options)

    def _activation(self, gate: Tensor, up: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(self._activation(self.gate_proj(x), self.up_proj(x)))

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, intermediate_size="
                f"{self.intermediate_size}, fused={self._fused}")


class SwiGLU(_GatedMLP):
    """The LLaMA MLP: down_proj(silu(gate_proj(x)) * up_proj(x))."""

    _fused = "tilefuse.functional.swiglu"

    def _activation(self, gate: Tensor, up: Tensor) -> Tensor:
        return functional.swiglu(gate, up)


class GeGLU(_GatedMLP):
    """The Gemma MLP: down_proj(gelu_tanh(gate_proj(x)) * up_proj(x)), the
    activation a DSL fusion with a derived backward."""

    _fused = "gelu(gate, approximate='tanh') * up (a DSL fusion)"

    def _activation(self, gate: Tensor, up: Tensor) -> Tensor:
        return _geglu(gate, up)

