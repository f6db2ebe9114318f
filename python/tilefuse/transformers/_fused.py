"""The forwards that replace a model family's modules' forwards.

Each computes what the Hugging Face module computes, dtypes and roundings
included, with tilefuse's fused ops; the module keeps its parameters and
attributes (only its class, hence its forward, changes).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import activations

import tilefuse
from tilefuse import functional as TF


def llama_rms_norm(self, hidden_states):
    """LlamaRMSNorm (and Mistral's, Qwen2's, Qwen3's): float32 statistics,
    the normalized input rounded to its dtype, times the weight."""
    return TF.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight,
                       self.variance_epsilon, casting_mode="llama")


def gemma_rms_norm(self, hidden_states):
    """GemmaRMSNorm (and Gemma 2's): x * rstd * (1 + weight) all in float32,
    rounded once to the input's dtype."""
    return TF.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight, self.eps,
                       offset=1.0, casting_mode="gemma")


@tilefuse.fusion
def _t5_layer_norm(hidden_states, weight, eps):
    # T5LayerNorm, step for step: the variance in float32, the input scaled
    # in the promoted dtype (float32 for 16-bit inputs), rounded to a 16-bit
    # weight's dtype before the weight multiplies it.
    variance = tilefuse.mean(tilefuse.square(tilefuse.cast(hidden_states, torch.float32)))
    hidden = hidden_states * tilefuse.rsqrt(variance + eps)
    if weight.dtype in (torch.float16, torch.bfloat16):
        hidden = tilefuse.cast(hidden, weight.dtype)
    return weight * hidden


def t5_layer_norm(self, hidden_states):
    """T5LayerNorm: one fused kernel (and one derived backward kernel) with
    its exact dtype rules, in float32, bfloat16 and float16."""
    return _t5_layer_norm(hidden_states, self.weight, self.variance_epsilon)


# A gated MLP's activation module -> the fused gate that computes it and its
# `approximate` (the Python variants compute the same functions).
_GATES = {
    nn.SiLU: ("swiglu", None),
    activations.SiLUActivation: ("swiglu", None),
    activations.GELUTanh: ("geglu", "tanh"),
    activations.NewGELUActivation: ("geglu", "tanh"),
    activations.GELUActivation: ("geglu", "none"),
}


def fusable_gate(mlp) -> bool:
    return type(mlp.act_fn) in _GATES


def gated_mlp(self, x):
    """down_proj(act_fn(gate_proj(x)) * up_proj(x)) with the gate fused
    (SwiGLU, GeGLU); an activation no fused gate computes runs as before (a
    class patched before construction learns its activation only here)."""
    gate = _GATES.get(type(self.act_fn))
    if gate is None:
        return self._tilefuse_original.forward(self, x)
    a, b = self.gate_proj(x), self.up_proj(x)
    kind, approximate = gate
    return self.down_proj(TF.swiglu(a, b) if kind == "swiglu"
                          else TF.geglu(a, b, approximate=approximate))
