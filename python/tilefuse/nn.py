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

__all__ = ["CrossEntropyLoss", "GeGLU", "LayerNorm", "LinearCrossEntropyLoss", "RMSNorm",
           "SwiGLU"]


class RMSNorm(nn.RMSNorm):
    """torch.nn.RMSNorm (parameter `weight`), fused: one kernel forward, one
    backward."""

    def forward(self, input: Tensor) -> Tensor:
        return functional.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", fused=tilefuse.functional.rms_norm"


class LayerNorm(nn.LayerNorm):
    """torch.nn.LayerNorm (parameters `weight` and `bias`), fused: one kernel
    forward, one backward."""

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


class LinearCrossEntropyLoss(nn.Module):
    """The loss of a language model's head, cross_entropy(input @ weight.T +
    bias, target), without the [tokens, vocab] logits (Liger's fused linear
    cross-entropy). The head's `weight` and `bias` are the forward's
    arguments, so they stay the model's parameters; `ce_weight` are class
    weights (a buffer, as torch.nn.CrossEntropyLoss keeps `weight`)."""

    def __init__(self, ce_weight: Tensor | None = None, ignore_index: int = -100,
                 reduction: str = "mean", label_smoothing: float = 0.0,
                 lse_square_scale: float = 0.0, softcap: float | None = None,
                 return_z_loss: bool = False):
        super().__init__()
        self.register_buffer("ce_weight", ce_weight)
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing, self.lse_square_scale = label_smoothing, lse_square_scale
        self.softcap, self.return_z_loss = softcap, return_z_loss

    def forward(self, input: Tensor, weight: Tensor, target: Tensor,
                bias: Tensor | None = None):
        return functional.linear_cross_entropy(
            input, weight, target, bias, ce_weight=self.ce_weight,
            ignore_index=self.ignore_index, reduction=self.reduction,
            label_smoothing=self.label_smoothing, lse_square_scale=self.lse_square_scale,
            softcap=self.softcap, return_z_loss=self.return_z_loss)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction}, "
                f"label_smoothing={self.label_smoothing}, "
                f"lse_square_scale={self.lse_square_scale}, softcap={self.softcap}, "
                "fused=tilefuse.functional.linear_cross_entropy")


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

