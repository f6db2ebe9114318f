"""tilefuse.nn modules against their torch.nn counterparts: outputs and
gradients, and state_dicts loaded both ways (Hugging Face's LlamaRMSNorm
and LlamaMLP names too)."""

import torch
import torch.nn.functional as F
from torch import nn

import tilefuse.nn


def forward_backward(module, *inputs):
    inputs = [x.detach().clone().requires_grad_(x.dtype.is_floating_point) for x in inputs]
    output = module(*inputs)
    output.backward(torch.ones_like(output) if output.dim() else None)
    return output, [x.grad for x in inputs if x.requires_grad], \
        {name: p.grad for name, p in module.named_parameters()}


def assert_same_module(ours, theirs, *inputs, tolerance=1e-5):
    ours.load_state_dict(theirs.state_dict())
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    theirs.load_state_dict(ours.state_dict())
    out, grads, params = forward_backward(ours, *inputs)
    ref_out, ref_grads, ref_params = forward_backward(theirs, *inputs)
    torch.testing.assert_close(out, ref_out, atol=tolerance, rtol=tolerance)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, atol=tolerance, rtol=tolerance)
    for name in ref_params:
        torch.testing.assert_close(params[name], ref_params[name], atol=tolerance,
                                   rtol=tolerance)


def randomized(module):
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(0.5, 1.5)
    return module


def test_rms_norm():
    assert_same_module(randomized(tilefuse.nn.RMSNorm(48, eps=1e-6)),
                       randomized(nn.RMSNorm(48, eps=1e-6)), torch.randn(3, 5, 48))
    assert "fused=tilefuse.functional.rms_norm" in repr(tilefuse.nn.RMSNorm(8))


def test_layer_norm_with_and_without_bias():
    for bias in (True, False):
        assert_same_module(randomized(tilefuse.nn.LayerNorm(40, bias=bias)),
                           randomized(nn.LayerNorm(40, bias=bias)), torch.randn(6, 40))


def test_norms_over_several_dimensions():
    x = torch.randn(3, 4, 8)
    assert_same_module(randomized(tilefuse.nn.RMSNorm((4, 8))), randomized(nn.RMSNorm((4, 8))), x)
    assert_same_module(randomized(tilefuse.nn.LayerNorm((4, 8))),
                       randomized(nn.LayerNorm((4, 8))), x)


def test_cross_entropy_loss():
    logits, target = torch.randn(12, 30), torch.randint(0, 30, (12,))
    target[3] = -100
    for options in (dict(), dict(label_smoothing=0.1, reduction="sum")):
        assert_same_module(tilefuse.nn.CrossEntropyLoss(**options),
                           nn.CrossEntropyLoss(**options), logits, target)


class _UnfusedLinearCrossEntropy(nn.Module):
    def __init__(self, ce_weight=None, **options):
        super().__init__()
        self.register_buffer("ce_weight", ce_weight)
        self.options = options

    def forward(self, input, weight, target, bias=None):
        return F.cross_entropy(F.linear(input, weight, bias), target, self.ce_weight,
                               **self.options)


def test_linear_cross_entropy_loss():
    hidden, weight, bias = torch.randn(2, 7, 16), torch.randn(50, 16), torch.randn(50)
    target = torch.randint(0, 50, (2, 7))
    target[0, 3] = -100
    class_weights = torch.rand(50) + 0.5
    for options in (dict(), dict(label_smoothing=0.1, reduction="sum"),
                    dict(reduction="none", ce_weight=class_weights)):
        ours = tilefuse.nn.LinearCrossEntropyLoss(**options)
        theirs = _UnfusedLinearCrossEntropy(**options)
        assert_same_module(ours, theirs, hidden.view(-1, 16), weight, target.view(-1), bias)
    assert "fused=tilefuse.functional.linear_cross_entropy" in repr(ours)
    assert ours.state_dict().keys() == {"ce_weight"}


class LlamaRMSNorm(nn.Module):
    """Hugging Face's LlamaRMSNorm (transformers/models/llama), its names."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states


class LlamaMLP(nn.Module):
    """Hugging Face's LlamaMLP, its names."""

    def __init__(self, hidden_size, intermediate_size, act):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act = act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def test_hugging_face_names():
    assert_same_module(randomized(tilefuse.nn.RMSNorm(32, eps=1e-6)),
                       randomized(LlamaRMSNorm(32)), torch.randn(4, 32))
    x = torch.randn(5, 16)
    assert_same_module(tilefuse.nn.SwiGLU(16, 24), LlamaMLP(16, 24, F.silu), x)
    assert_same_module(tilefuse.nn.GeGLU(16, 24),
                       LlamaMLP(16, 24, lambda g: F.gelu(g, approximate="tanh")), x)
