"""tilefuse.functional.linear_cross_entropy against the unfused composition
cross_entropy(input @ weight.T + bias) in float64: forward and the gradients
of input, weight and bias, over chunks of tokens."""

import pytest
import torch
import torch.nn.functional as F

import tilefuse.functional as TF
from conftest import assert_close
from test_cross_entropy import assert_compiled_matches_eager, probabilities, reference


def composition(input, weight, target, bias=None, ce_weight=None, **options):
    """The loss of the unfused composition in float64."""
    logits = F.linear(input.double(), weight.double(), None if bias is None else bias.double())
    return reference(logits, target, ce_weight, classes_last=True, **options)[0]


def loss_and_grads(fn, input, weight, bias):
    leaves = [t.detach().clone().requires_grad_(True) for t in (input, weight, bias)
              if t is not None]
    loss = fn(*leaves, *([None] if bias is None else []))
    upstream = torch.linspace(0.5, 1.5, loss.numel()).view(loss.shape).to(loss.dtype)
    return (loss.detach(),) + torch.autograd.grad(loss, leaves, upstream)


def check(dtype, input, weight, target, bias=None, **options):
    """The fused op (in chunks of 5 rows) against the composition in float64."""
    rows = 5 * weight.shape[0] * weight.element_size()
    got = loss_and_grads(lambda x, w, b: TF.linear_cross_entropy(
        x, w, target, b, chunk_bytes=rows, **options), input, weight, bias)
    want = loss_and_grads(lambda x, w, b: composition(
        x, w, target, b, **options).to(dtype), input, weight, bias)
    for g, w in zip(got, want):
        assert_close(g, w, dtype, equal_nan=True)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("probs", [False, True], ids=["indices", "probs"])
def test_against_the_composition(reduction, bias, probs):
    input, weight = torch.randn(2, 9, 16), 0.3 * torch.randn(103, 16)
    target = probabilities((2, 9, 103)) if probs else torch.randint(0, 103, (2, 9))
    if not probs:
        target[0, 3] = -100
    check(torch.float32, input, weight, target, torch.randn(103) if bias else None,
          ce_weight=torch.rand(103) + 0.5, reduction=reduction, label_smoothing=0.1,
          lse_square_scale=1e-2, softcap=4.0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_low_precision_against_float64(dtype):
    # Both sides compared with float64: the fused op accumulates dweight and
    # dbias over chunks in float32.
    input, weight = torch.randn(40, 32).to(dtype), (0.2 * torch.randn(1001, 32)).to(dtype)
    target = torch.randint(0, 1001, (40,))
    check(dtype, input, weight, target, torch.randn(1001).to(dtype), label_smoothing=0.1)


def test_vocabulary_of_128256():
    input, weight = torch.randn(6, 8), 0.5 * torch.randn(128256, 8)
    target = torch.tensor([0, 128255, 5, -100, 77777, 1])
    check(torch.float32, input, weight, target, lse_square_scale=1e-4)


@pytest.mark.parametrize("rows", [0, 1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_zero_and_one_rows(rows, reduction):
    check(torch.float32, torch.randn(rows, 16), torch.randn(11, 16),
          torch.randint(0, 11, (rows,)), torch.randn(11), reduction=reduction)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_targets_ignored(reduction):
    check(torch.float32, torch.randn(7, 16), torch.randn(11, 16), torch.full((7,), -100),
          reduction=reduction, label_smoothing=0.1)


def test_only_the_gradients_asked_for():
    input, weight, bias = torch.randn(6, 8), torch.randn(11, 8), torch.randn(11)
    target = torch.randint(0, 11, (6,))
    frozen = weight.clone()  # a frozen head (LoRA): no dweight computed
    x = input.clone().requires_grad_()
    TF.linear_cross_entropy(x, frozen, target, bias).backward()
    (want,) = torch.autograd.grad(composition(input.requires_grad_(), weight, target, bias),
                                  input)
    assert_close(x.grad, want, torch.float32)
    assert frozen.grad is None
    loss = TF.linear_cross_entropy(input.detach(), weight, target)
    assert not loss.requires_grad
    assert_close(loss, composition(input.detach(), weight, target), torch.float32)


def test_gradcheck_float64():
    from torch.autograd import gradcheck
    d = torch.float64
    input = torch.randn(2, 3, 4, dtype=d, requires_grad=True)
    weight = torch.randn(7, 4, dtype=d, requires_grad=True)
    bias = torch.randn(7, dtype=d, requires_grad=True)
    target = torch.tensor([[1, -100, 6], [0, 2, 2]])
    probs = probabilities((2, 3, 7)).to(d)
    options = dict(ce_weight=torch.rand(7, dtype=d) + 0.5, label_smoothing=0.1,
                   lse_square_scale=0.1, softcap=2.0, chunk_bytes=2 * 7 * 8)
    # 'none': its backward recomputes the chunks, which gradcheck may run
    # more than once. 'mean' and 'sum' scale the gradients the forward
    # computed, once: 'sum' must equal the checked 'none' summed.
    for t in (target, probs):
        assert gradcheck(lambda x, w, b: TF.linear_cross_entropy(
            x, w, t, b, reduction="none", **options), (input, weight, bias))
        got = loss_and_grads(lambda x, w, b: TF.linear_cross_entropy(
            x, w, t, b, reduction="sum", **options), input, weight, bias)
        want = loss_and_grads(lambda x, w, b: TF.linear_cross_entropy(
            x, w, t, b, reduction="none", **options).sum(), input, weight, bias)
        for g, w in zip(got, want):
            assert_close(g, w, d)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_as_torch_linear_then_cross_entropy(dtype):
    """Under torch.autocast the matmul runs in autocast's dtype and the loss
    is float32, as torch's linear and cross_entropy there (it computed in
    the inputs' float32); float64 inputs stay float64, as autocast keeps
    them."""
    torch.manual_seed(0)
    x = torch.randn(64, 32, requires_grad=True)
    w, b = torch.randn(100, 32, requires_grad=True), torch.randn(100)
    t = torch.randint(0, 100, (64,))
    with torch.autocast("cpu", dtype=dtype):
        ours = TF.linear_cross_entropy(x, w, t, b, label_smoothing=0.1)
        torchs = torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, w, b), t,
                                                   label_smoothing=0.1)
        double = TF.linear_cross_entropy(x.double(), w.double(), t, b.double())
    assert ours.dtype == torchs.dtype == torch.float32
    assert double.dtype == torch.float64
    torch.testing.assert_close(ours, torchs, rtol=1e-6, atol=1e-6)
    for got, want in zip(torch.autograd.grad(ours, (x, w)),
                         torch.autograd.grad(torchs, (x, w))):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)
    # Not the float32 loss it gave before: the matmul's rounding shows.
    exact = TF.linear_cross_entropy(x, w, t, b, label_smoothing=0.1)
    assert (ours - exact).abs() > 1e-4


def test_errors_name_the_argument():
    input, weight, target = torch.randn(4, 8), torch.randn(11, 8), torch.randint(0, 11, (4,))
    with pytest.raises(ValueError, match=r"tilefuse.linear_cross_entropy: 'weight' must be "
                                         r"\[vocab, 8\]"):
        TF.linear_cross_entropy(input, torch.randn(11, 7), target)
    with pytest.raises(TypeError, match=r"'weight' is BFloat16, 'input' is Float"):
        TF.linear_cross_entropy(input, weight.bfloat16(), target)
    with pytest.raises(ValueError, match=r"'target' must have shape \[4\]"):
        TF.linear_cross_entropy(input, weight, target[:3])
    with pytest.raises(ValueError, match=r"argument 'bias' must have shape \[11\]"):
        TF.linear_cross_entropy(input, weight, target, torch.randn(10))
    with pytest.raises(ValueError, match=r"'ce_weight' \(the class weights\) requires grad, but "
                                         r"the loss is not differentiable .* class-index targets"):
        TF.linear_cross_entropy(input, weight, target, ce_weight=torch.rand(11).requires_grad_())
    # Probability targets: torch's cross_entropy differentiates the class
    # weights there; the fused op does not, and says so (it cited nll_loss).
    with pytest.raises(ValueError, match=r"linear_cross_entropy gives it no gradient \(torch's "
                                         r"cross_entropy gives one with probability targets"):
        TF.linear_cross_entropy(input, weight, torch.rand(4, 11).softmax(-1),
                                ce_weight=torch.rand(11).requires_grad_())
    with torch.no_grad():
        TF.linear_cross_entropy(input, weight, target, ce_weight=torch.rand(11).requires_grad_())
    with pytest.raises(ValueError, match=r"chunk_bytes must be positive, got 0"):
        TF.linear_cross_entropy(input, weight, target, chunk_bytes=0)
    with pytest.raises(TypeError, match=r"'target' must hold int64 \(or uint8\) class indices "
                                        r"or float probabilities, got Int"):
        TF.linear_cross_entropy(input, weight, target.int())
    # uint8 class indices, as torch's nll_loss takes them.
    assert torch.equal(TF.linear_cross_entropy(input, weight, target.to(torch.uint8)),
                       TF.linear_cross_entropy(input, weight, target))
    with pytest.raises(ValueError, match=r"'target' requires grad"):
        TF.linear_cross_entropy(input, weight, torch.rand(4, 11).requires_grad_())
    loss = TF.linear_cross_entropy(input, weight.requires_grad_(), target)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=r"can run only once"):
        loss.backward()


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_torch_compile_fullgraph(reduction):
    def step(hidden, head, target):
        loss, z_loss = TF.linear_cross_entropy(hidden, head, target, reduction=reduction,
                                               label_smoothing=0.1, lse_square_scale=1e-2,
                                               return_z_loss=True, chunk_bytes=4 * 37 * 4)
        return loss.sum(), z_loss

    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend="aot_eager")
    head = torch.randn(37, 16)
    for batch in (3, 5):
        hidden, target = torch.randn(batch, 4, 16), torch.randint(0, 37, (batch, 4))
        assert_compiled_matches_eager(compiled, step, (hidden, head), (target,))


def test_meta_tensors():
    input = torch.empty(2, 3, 64, device="meta", dtype=torch.bfloat16)
    weight = torch.empty(1000, 64, device="meta", dtype=torch.bfloat16)
    target = torch.empty(2, 3, dtype=torch.int64, device="meta")
    loss = TF.linear_cross_entropy(input, weight, target, reduction="none")
    assert (loss.shape, loss.dtype) == ((2, 3), torch.bfloat16)
    assert TF.linear_cross_entropy(input, weight, target).shape == ()
