"""tilefuse.functional.cross_entropy against torch: every form (torch's [N, C],
[C] and [N, C, d1, ...], language models' [B, T, V]), class weights,
probability targets, ignore_index, label smoothing, every reduction, NaN and
infinities; the z-loss, soft-capping and the in-place gradient against the
composition in float64."""

import os

import pytest
import torch
import torch.nn.functional as F

import tilefuse
import tilefuse.functional as TF
import tilefuse.nn
from conftest import assert_close

INF = float("inf")


def reference(logits, target, weight=None, ignore_index=-100, reduction="mean",
              label_smoothing=0.0, lse_square_scale=0.0, softcap=None, classes_last=False):
    """(loss, z_loss) of the composition in float64: softcap, then
    F.cross_entropy, plus lse_square_scale * logsumexp^2 per row ('mean' over
    the rows not ignored). `classes_last`: [..., V] logits with [...] targets."""
    z = logits.double()
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    probs = target.is_floating_point()
    t = target.double() if probs else target
    leading = logits.shape[:-1]
    if classes_last:
        z = z.reshape(-1, z.shape[-1])
        t = t.reshape(z.shape if probs else (-1,))
    loss = F.cross_entropy(z, t, None if weight is None else weight.double(),
                           ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
    # logsumexp about the row's max, held constant: torch.logsumexp's
    # gradient takes exp(z - lse) from a lse that rounds to the max in
    # rows of huge logits, even in float64.
    dim = 0 if z.dim() == 1 else 1
    row_max = z.amax(dim, keepdim=True).detach()
    row_max = torch.where(row_max.isfinite(), row_max, 0.0)
    lse = row_max.squeeze(dim) + torch.log(torch.exp(z - row_max).sum(dim))
    valid = torch.ones_like(lse, dtype=torch.bool) if probs else t != ignore_index
    rows = torch.where(valid, lse_square_scale * lse * lse, 0.0)
    z_loss = {"none": rows, "sum": rows.sum(), "mean": rows.sum() / valid.sum()}[reduction]
    if reduction == "none" and classes_last:
        loss, z_loss = loss.view(leading), z_loss.view(leading)
    if lse_square_scale:
        loss = loss + z_loss
    return loss, z_loss


def loss_and_grads(fn, logits, target):
    """fn's loss and the gradients of the logits (and of probability
    targets) for a fixed upstream gradient."""
    logits = logits.detach().clone().requires_grad_(True)
    leaves = [logits]
    if target.is_floating_point():
        target = target.detach().clone().requires_grad_(True)
        leaves.append(target)
    loss = fn(logits, target)
    upstream = torch.randn(loss.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad(loss, leaves, upstream.to(loss.dtype))
    return (loss.detach(),) + grads


def check(dtype, fn, ref, logits, target):
    """fn against ref (float64) on the same inputs: loss and gradients."""
    for got, want in zip(loss_and_grads(fn, logits, target), loss_and_grads(ref, logits, target)):
        assert_close(got, want, dtype, equal_nan=True)


def probabilities(shape, dim=-1):
    return torch.softmax(torch.randn(shape), dim=dim)


def rows_at_the_edges(rows, classes, dtype, generator, lowest=None):
    """4 * randn logits whose first logits in rows 1-4 are -inf, one above
    the row's max, `lowest` (the dtype's lowest by default) and -1e9."""
    logits = 4 * torch.randn(rows, classes, generator=generator)
    logits[1, 0] = -INF
    logits[2, 0] = logits[2].max() + 1
    logits[3, 0] = torch.finfo(dtype).min if lowest is None else lowest
    logits[4, 0] = -1e9
    return logits


def probability_targets_off_the_masked(rows, classes, dtype, generator):
    """Probability targets, 0 at the masked first logits of rows 3 and 4
    (rows_at_the_edges)."""
    target = torch.softmax(torch.randn(rows, classes, generator=generator), dim=-1)
    target[3:5, 0] = 0
    return (target / target.sum(-1, keepdim=True)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("classes", [3072, 5120, 12288])
def test_rows_of_fewer_threads(dtype, classes):
    # On a GPU, the forward with the gradient in place (a full row written:
    # the losses alone take one warp a row) in rows of fewer threads where
    # the rule's leave vector slots idle (TileConfig.h, "fewer idle
    # vectors": bf16 5120 classes in 128 threads of 5 chunks instead of 256
    # of 3), and 256 threads where 512 would be taken ("at most 256
    # threads": bf16 12288 in 256 of 6). Loss and gradient, against float64.
    logits = (3 * torch.randn(9, classes)).to(dtype)
    target = torch.randint(0, classes, (9,))
    target[4] = -100
    for options in (dict(label_smoothing=0.1), dict(reduction="none")):
        check(dtype, lambda x, t: TF.cross_entropy(x * 1, t, inplace_backward=True, **options),
              lambda x, t: reference(x, t, **options)[0].to(dtype), logits, target)


@pytest.mark.parametrize("softcap", [None, 30.0], ids=["plain", "capped"])
@pytest.mark.parametrize("targets", ["indices", "weighted", "probs"])
@pytest.mark.parametrize("dtype,offset", [(torch.float32, 1e4), (torch.bfloat16, 100.0)],
                         ids=["float32", "bfloat16"])
@pytest.mark.parametrize("classes", [2048, 4096, 16384])
def test_rows_of_one_warp(classes, dtype, offset, targets, softcap):
    # On a GPU a loss over at most 16384 classes takes one warp a row
    # (TileConfig.h, "one warp a row"): its lanes meet in shuffles alone
    # (emulated: blocks of 8 rows, no barrier), the row streamed in one
    # merged pass. 13 rows (two blocks): far from zero, a first logit of
    # -inf, one that is the row's max, masked first logits (the dtype's
    # lowest, -1e9; target 0 where the targets are probabilities) and an
    # ignored row, against float64; then the loss and its gradients at
    # logits near zero. With class weights the lowest is halved: weighted
    # by more than 1 it overflows float32, in torch too.
    rows = 13
    generator = torch.Generator().manual_seed(0)
    lowest = torch.finfo(dtype).min / (2 if targets == "weighted" else 1)
    logits = rows_at_the_edges(rows, classes, dtype, generator, lowest)
    if targets == "probs":
        target = probability_targets_off_the_masked(rows, classes, dtype, generator)
    else:
        target = torch.randint(1, classes, (rows,), generator=generator)
        target[5] = -100
    weight = torch.rand(classes, generator=generator) + 0.5 if targets == "weighted" else None
    options = dict(weight=weight, reduction="none", label_smoothing=0.1, lse_square_scale=1e-4,
                   softcap=softcap)
    far = (logits + offset).to(dtype)
    tilefuse.emulator.last_launches()
    loss = TF.cross_entropy(far, target, **options)
    if tilefuse.emulator.active():
        (launch,) = tilefuse.emulator.last_launches()
        assert launch["kernel"].endswith("_fwd") and launch["grid"] == (2, 1, 1), launch
        assert launch["block"] == (256, 1, 1) and launch["barriers"] == 0, launch
    assert_close(loss, reference(far, target, **options)[0], dtype, equal_nan=True)
    near = (3 * torch.randn(rows, classes, generator=generator)).to(dtype)
    check(dtype, lambda x, t: TF.cross_entropy(x, t, **options),
          lambda x, t: reference(x, t, **options)[0].to(dtype), near, target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=str)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_masked_logits(dtype, label_smoothing, reduction):
    # Half of each row masked to -inf (vocabulary masking). Regression: the
    # loss was NaN with label_smoothing=0 (0 * inf in the smoothing term);
    # torch gives the loss of the unmasked classes, and inf with smoothing.
    logits = torch.randn(3, 8).to(dtype)
    logits[:, 4:] = -INF
    target = torch.tensor([1, 2, 0])
    options = dict(reduction=reduction, label_smoothing=label_smoothing)
    loss = TF.cross_entropy(logits, target, **options)
    assert loss.isfinite().all() == (label_smoothing == 0)
    check(dtype, lambda x, t: TF.cross_entropy(x, t, **options),
          lambda x, t: reference(x, t, **options)[0].to(dtype), logits, target)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1, 1.0])
def test_nonfinite_logits_like_torch(weighted, label_smoothing):
    # NaN, +inf, a row of -inf (and one that is ignored), a -inf target and
    # a -inf class of weight 0: the loss and gradient torch gives, NaN and
    # infinities included.
    logits = torch.randn(7, 5)
    logits[0, 2] = float("nan")
    logits[1, 3] = INF
    logits[2] = -INF
    logits[3] = -INF
    logits[4, 1] = -INF
    logits[5, 3] = -INF
    target = torch.tensor([1, 2, 0, -100, 1, 2, 4])
    weight = torch.tensor([1.0, 2.0, 0.5, 0.0, 1.5]) if weighted else None
    for reduction in ("none", "sum"):
        options = dict(weight=weight, reduction=reduction, label_smoothing=label_smoothing)
        check(torch.float32, lambda x, t: TF.cross_entropy(x, t, **options),
              lambda x, t: F.cross_entropy(x, t, **options), logits, target)


def huge_logit_rows(classes, dtype):
    """Rows of 0.9 x the dtype's max, of its lowest, of -max/2 + noise and
    of 1e4 + noise (bf16: 100), then one of randn."""
    big = torch.finfo(dtype).max
    logits = torch.randn(5, classes)
    logits[0] = 0.9 * big
    logits[1] = -big
    logits[2] = -big / 2 + 4 * torch.randn(classes)
    logits[3] = (1e4 if dtype == torch.float32 else 100.0) + torch.randn(classes)
    return logits.to(dtype)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("classes", [1000, 4096, 32000])
def test_label_smoothing_of_huge_logits(classes, dtype, weighted):
    # The smoothing term sums the log-probabilities about the row's max, as
    # torch's log_softmax does, and the separate backward takes softmax as
    # exp(z - max) * exp(-log_sum) from the forward's saved max and log-sum.
    # Regressions: computed as lse - mean(z), rows of 0.9 x the dtype's max
    # or of its lowest overflowed sum(z) in float32 (a loss of -inf or +inf,
    # NaN weighted; torch gives log(n)), and lse - mean(z) lost digits at
    # 1e4; the backward took exp(z - lse) from a saved float32 lse, which
    # rounds to the max (a gradient of about 1 a class in rows of 0.9 x
    # max, 1e-6 to 1e-5 off at 1e4). Against float64: the loss and its
    # gradient, separate and fused in place (every row kernel).
    logits = huge_logit_rows(classes, dtype)
    target = torch.randint(0, classes, (5,))
    options = dict(weight=torch.rand(classes) + 0.5 if weighted else None,
                   label_smoothing=0.1, reduction="none")
    loss = TF.cross_entropy(logits, target, **options)
    assert loss.isfinite().all(), loss
    ref = lambda x, t: reference(x, t, **options)[0].to(dtype)
    check(dtype, lambda x, t: TF.cross_entropy(x, t, **options), ref, logits, target)
    check(dtype, lambda x, t: TF.cross_entropy(x * 1, t, inplace_backward=True, **options),
          ref, logits, target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gradients_from_the_saved_max_and_log_sum(dtype):
    # The gradients of the logits (the backward kernel) and of probability
    # targets (ATen ops), both from the forward's saved max and log-sum,
    # against float64 in rows of huge logits; and the z-loss's gradient,
    # 2 * lse_square_scale * lse * softmax(z), in rows of 1e18 whose logits
    # tie at the max (lse^2 stays finite). From a saved lse the softmax of
    # those rows was 1 at each tie. (Soft-capped logits never get huge:
    # softcap bounds them.)
    logits = huge_logit_rows(4096, dtype)
    target = probabilities((5, 4096)).to(dtype)
    options = dict(weight=torch.rand(4096) + 0.5, label_smoothing=0.1, reduction="none")
    check(dtype, lambda x, t: TF.cross_entropy(x, t, **options),
          lambda x, t: reference(x, t, **options)[0].to(dtype), logits, target)
    logits = torch.full((3, 1000), 1e18)
    logits[1, ::2] = 9e17
    logits = logits.to(dtype)
    target = torch.randint(0, 1000, (3,))
    options = dict(lse_square_scale=1e-4, reduction="sum")
    check(dtype, lambda x, t: TF.cross_entropy(x, t, **options),
          lambda x, t: reference(x, t, **options)[0].to(dtype), logits, target)


def test_reduced_loss_past_float32():
    # Regression: the CPU's reduction, summing the rows in double, raised
    # converting a sum past float32's range. The sum is inf (float64's,
    # rounded to float32, as torch's); the mean is float64's on the CPU,
    # and inf where the GPU code sums the rows in float32 (as torch does).
    logits = torch.full((6, 7), -3.4e38)
    logits[:, 0] = -1.7e38
    target = torch.randint(1, 7, (6,))
    gpu_code = os.environ.get("TILEFUSE_TARGET", "").startswith("emulate")
    for reduction in ("sum", "mean"):
        loss = TF.cross_entropy(logits, target, reduction=reduction)
        wide = logits if gpu_code else logits.double()
        expected = F.cross_entropy(wide, target, reduction=reduction).float()
        assert loss.item() == expected.item(), reduction


FORMS = {
    # name: (logits shape, class-index target shape)
    "[N, C]": ((6, 37), (6,)),
    "[C]": ((37,), ()),
    "[N, C, d1, d2]": ((2, 37, 3, 2), (2, 3, 2)),
    "[B, T, V]": ((2, 3, 37), (2, 3)),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("probs", [False, True], ids=["indices", "probs"])
def test_forms_against_torch(form, reduction, weighted, probs):
    shape, target_shape = FORMS[form]
    if probs and form == "[B, T, V]":
        pytest.skip("probabilities of the input's shape are torch's [N, C, d1] form")
    logits = torch.randn(shape)
    class_dim = 0 if len(shape) == 1 else -1 if form == "[B, T, V]" else 1
    if probs:
        target = probabilities(shape, class_dim)
    else:
        target = torch.randint(0, 37, target_shape)
        if target.dim():
            target.view(-1)[1] = -100
    weight = torch.rand(37) + 0.5 if weighted else None
    options = dict(weight=weight, reduction=reduction, label_smoothing=0.1)
    if not probs:
        options["ignore_index"] = -100
    check(torch.float32, lambda x, t: TF.cross_entropy(x, t, **options),
          lambda x, t: reference(x, t, classes_last=form == "[B, T, V]", **options)[0].float(),
          logits, target)


@pytest.mark.parametrize("shape", [(37,), (6, 37), (2, 37, 3)], ids=str)
def test_uint8_class_indices_as_torch_takes_them(shape):
    """torch's nll_loss takes uint8 class indices as well as int64; they
    were refused. The loss and gradient equal int64 targets' bit for bit."""
    logits = torch.randn(shape, requires_grad=True)
    target = torch.randint(0, 37, shape[:1] + shape[2:] if len(shape) > 1 else ())
    weight = torch.rand(37) + 0.5
    losses, grads = [], []
    for classes in (target, target.to(torch.uint8)):
        loss = TF.cross_entropy(logits, classes, weight=weight, reduction="sum",
                                label_smoothing=0.1)
        losses.append(loss)
        grads.append(torch.autograd.grad(loss, logits)[0])
    assert torch.equal(losses[0], losses[1]) and torch.equal(grads[0], grads[1])
    if len(shape) <= 2:  # torch's [N, C, d1] form refuses uint8
        torch.testing.assert_close(losses[1], torch.nn.functional.cross_entropy(
            logits, target.to(torch.uint8), weight=weight, reduction="sum",
            label_smoothing=0.1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("probs", [False, True], ids=["indices", "probs"])
def test_low_precision_against_float64(dtype, probs):
    # Compared with the composition in float64 on the same rounded inputs:
    # torch's own half-precision CPU result is the less accurate side.
    logits = (3 * torch.randn(9, 1003)).to(dtype)
    target = probabilities((9, 1003)).to(dtype) if probs else torch.randint(0, 1003, (9,))
    options = dict(weight=(torch.rand(1003) + 0.5).to(dtype), label_smoothing=0.1,
                   lse_square_scale=1e-3, softcap=5.0)
    check(dtype, lambda x, t: TF.cross_entropy(x, t, **options),
          lambda x, t: reference(x, t, **options)[0].to(dtype), logits, target)


@pytest.mark.parametrize("shape", [(6, 9), (2, 9, 3)], ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("softcap", [None, 2.0], ids=["plain", "capped"])
def test_class_weights_get_a_gradient_with_probability_targets(shape, reduction, softcap):
    """torch differentiates the loss of probability targets with respect to
    the class weights (it was refused); class indices get none, as from
    torch's nll_loss, nor does the in-place gradient."""
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    weight = (torch.rand(9, dtype=torch.float64) + 0.5).requires_grad_()
    target = probabilities(shape, dim=1)
    options = dict(reduction=reduction, label_smoothing=0.2, softcap=softcap)
    assert torch.autograd.gradcheck(
        lambda x, w: TF.cross_entropy(x, target, weight=w, **options), (x, weight))
    ours = torch.autograd.grad(TF.cross_entropy(x, target, weight=weight, **options).sum(),
                               weight)[0]
    expected = torch.autograd.grad(reference(x, target, weight, **options)[0].sum(), weight)[0]
    torch.testing.assert_close(ours, expected)
    # bf16 logits, targets and weights (torch takes weights of the logits'
    # dtype): against float64 of the same values, within the rounding of
    # the bf16 result (2^-9, half an ulp; computed in float32).
    x16, target16 = x.detach().bfloat16(), target.bfloat16()
    weight16 = weight.detach().bfloat16().requires_grad_()
    ours = torch.autograd.grad(TF.cross_entropy(x16, target16, weight=weight16,
                                                **options).sum(), weight16)[0]
    weight64 = weight16.detach().double().requires_grad_()
    expected = torch.autograd.grad(reference(x16.double(), target16, weight64,
                                             **options)[0].sum(), weight64)[0]
    assert ours.dtype == torch.bfloat16
    torch.testing.assert_close(ours.double(), expected, rtol=2**-8, atol=1e-6)

    indices = torch.randint(0, 9, (shape[0],) + shape[2:])
    with pytest.raises(ValueError, match=r"'weight' \(the class weights\) requires grad, but the "
                                         r"loss is not differentiable with respect to it with "
                                         r"class-index targets \(as torch's nll_loss\)"):
        TF.cross_entropy(x, indices, weight=weight)
    with pytest.raises(ValueError, match=r"not differentiable with respect to it with "
                                         r"inplace_backward=True"):
        TF.cross_entropy(x.detach().requires_grad_() * 1, target, weight=weight,
                         inplace_backward=True)
    # Where no gradient is recorded there is nothing to refuse (torch
    # returns the loss; it was refused).
    for no_gradient in (torch.no_grad, torch.inference_mode):
        with no_gradient():
            torch.testing.assert_close(
                TF.cross_entropy(x, indices, weight=weight),
                torch.nn.functional.cross_entropy(x, indices, weight=weight))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_a_float32_loss_under_autocast(reduction):
    # torch.autocast runs torch's cross_entropy in float32: the loss came
    # back rounded to bfloat16 (17.0 for 17.061).
    x, w = torch.randn(64, 32), torch.randn(100, 32, requires_grad=True)
    target = torch.randint(0, 100, (64,))
    losses, grads = [], []
    for module in (F, TF, tilefuse.nn):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = F.linear(x, w)
            if module is tilefuse.nn:
                loss = tilefuse.nn.CrossEntropyLoss(reduction=reduction)(logits, target)
            else:
                loss = module.cross_entropy(logits, target, reduction=reduction)
        assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
        losses.append(loss)
        grads.append(torch.autograd.grad(loss.sum(), w)[0])
    expected = F.cross_entropy(logits.double(), target, reduction=reduction)
    for loss, grad in zip(losses[1:], grads[1:]):
        torch.testing.assert_close(loss.double(), expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(grad, grads[0], rtol=2e-2, atol=2e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, z_loss = TF.cross_entropy(logits, target, lse_square_scale=1e-4, return_z_loss=True)
    assert z_loss.dtype == torch.float32


@pytest.mark.parametrize("lse_square_scale, softcap", [(1e-2, None), (0.0, 3.0), (1e-2, 3.0)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("probs", [False, True], ids=["indices", "probs"])
def test_z_loss_and_softcap(lse_square_scale, softcap, reduction, probs):
    logits = 4 * torch.randn(6, 37)
    target = probabilities((6, 37)) if probs else torch.tensor([3, -100, 0, 36, 5, 5])
    options = dict(weight=torch.rand(37) + 0.5, reduction=reduction, label_smoothing=0.1,
                   lse_square_scale=lse_square_scale, softcap=softcap)
    check(torch.float32, lambda x, t: TF.cross_entropy(x, t, **options),
          lambda x, t: reference(x, t, **options)[0].float(), logits, target)
    loss, z_loss = TF.cross_entropy(logits, target, return_z_loss=True, **options)
    want_loss, want_z = reference(logits, target, **options)
    assert_close(loss, want_loss, torch.float32)
    assert_close(z_loss, want_z, torch.float32)
    assert not z_loss.requires_grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_vocabulary_of_128256(dtype):
    logits = (2 * torch.randn(3, 128256)).to(dtype)
    target = torch.tensor([0, 128255, 77777])
    options = dict(label_smoothing=0.1, lse_square_scale=1e-4)
    check(dtype, lambda x, t: TF.cross_entropy(x, t, **options),
          lambda x, t: reference(x, t, **options)[0].to(dtype), logits, target)
    check(dtype, lambda x, t: TF.cross_entropy(x * 1, t, inplace_backward=True, **options),
          lambda x, t: reference(x, t, **options)[0].to(dtype), logits, target)


@pytest.mark.parametrize("softcap", [None, 30.0], ids=["plain", "capped"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_vocabulary_of_32000_with_the_gradient_in_place(weighted, softcap):
    # bf16 rows of 32000 in the forward-with-gradient kernels: on a GPU a
    # thread keeps 64 elements of the row on chip (a wide row,
    # TileConfig.h).
    logits = (4 * torch.randn(3, 32000)).to(torch.bfloat16)
    target = torch.tensor([0, 31999, 12345])
    options = dict(weight=torch.rand(32000) + 0.5 if weighted else None, label_smoothing=0.1,
                   lse_square_scale=1e-4, softcap=softcap)
    check(torch.bfloat16, lambda x, t: TF.cross_entropy(x * 1, t, inplace_backward=True, **options),
          lambda x, t: reference(x, t, **options)[0].to(torch.bfloat16), logits, target)


@pytest.mark.parametrize("softcap", [None, 30.0], ids=["plain", "capped"])
@pytest.mark.parametrize("dtype,offset", [(torch.float32, 1e4), (torch.bfloat16, 100.0)],
                         ids=["float32", "bfloat16"])
@pytest.mark.parametrize("classes", [32000, 128256])
def test_probability_targets_of_long_rows(classes, dtype, offset, softcap):
    # On a GPU the loss of these rows takes one pass (fuse-merge-reductions:
    # fuse.max_deviation sums the targets' w * (x - max) about each
    # thread's running max). Logits far from zero (1e4 +- 4 in float32,
    # where summing w * x and subtracting max * sum(w) missed the float64
    # loss by 9e-4); a first logit of -inf (the loss is infinite, as
    # torch's, unless soft-capped), one that is the row's max, and masked
    # first logits (the dtype's lowest, -1e9) of target 0 (centered on the
    # first logit, the loss of such rows was off by up to 2e31).
    generator = torch.Generator().manual_seed(0)
    logits = rows_at_the_edges(5, classes, dtype, generator)
    target = probability_targets_off_the_masked(5, classes, dtype, generator)
    for label_smoothing in (0.0, 0.1):
        options = dict(reduction="none", label_smoothing=label_smoothing, softcap=softcap)
        far = (logits + offset).to(dtype)
        loss = TF.cross_entropy(far, target, **options)
        assert_close(loss, reference(far, target, **options)[0], dtype, equal_nan=True)
        assert loss[1].isinf() == (softcap is None) and loss[[0, 2, 3, 4]].isfinite().all()
    # The gradients (the backward's saved log-sum-exp rounds at 1e-3 near
    # 1e4 in float32: logits near zero), and the loss fused with them.
    logits = logits.to(dtype)
    check(dtype, lambda x, t: TF.cross_entropy(x, t, **options),
          lambda x, t: reference(x, t, **options)[0].to(dtype), logits, target)
    options["reduction"] = "sum"

    def loss_and_logits_grad(fn):
        x = logits.detach().clone().requires_grad_(True)
        loss = fn(x)
        return (loss.detach(),) + torch.autograd.grad(loss, x)

    fused = loss_and_logits_grad(
        lambda x: TF.cross_entropy(x * 1, target, inplace_backward=True, **options))
    composed = loss_and_logits_grad(lambda x: reference(x, target, **options)[0].to(dtype))
    for got, want in zip(fused, composed):
        assert_close(got, want, dtype)


@pytest.mark.parametrize("rows", [0, 1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("probs", [False, True], ids=["indices", "probs"])
def test_zero_and_one_rows(rows, reduction, probs):
    logits = torch.randn(rows, 9)
    target = probabilities((rows, 9)) if probs else torch.randint(0, 9, (rows,))
    check(torch.float32, lambda x, t: TF.cross_entropy(x, t, reduction=reduction),
          lambda x, t: F.cross_entropy(x, t, reduction=reduction), logits, target)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_all_targets_ignored(reduction, weighted):
    # torch: 'mean' of nothing is NaN (its gradient 0), 'sum' 0.
    logits, target = torch.randn(4, 9), torch.full((4,), -100)
    options = dict(weight=torch.rand(9) if weighted else None, reduction=reduction,
                   label_smoothing=0.1, lse_square_scale=1e-2)
    check(torch.float32, lambda x, t: TF.cross_entropy(x, t, **options),
          lambda x, t: reference(x, t, **options)[0].float(), logits, target)
    check(torch.float32, lambda x, t: TF.cross_entropy(x * 1, t, inplace_backward=True, **options),
          lambda x, t: reference(x, t, **options)[0].float(), logits, target)


#===------------------------------------------------------------------------===#
# The in-place gradient
#===------------------------------------------------------------------------===#

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("probs", [False, True], ids=["indices", "probs"])
def test_inplace_backward_through_an_lm_head(reduction, probs):
    hidden, head = torch.randn(2, 5, 16), torch.randn(37, 16)
    target = probabilities((2, 5, 37)).view(10, 37) if probs else torch.randint(0, 37, (2, 5))
    options = dict(weight=torch.rand(37) + 0.5, reduction=reduction, label_smoothing=0.1,
                   lse_square_scale=1e-2, softcap=4.0)

    def step(inplace):
        h, w = hidden.clone().requires_grad_(), head.clone().requires_grad_()
        logits = h @ w.t()
        if probs:
            logits = logits.view(10, 37)
        loss = TF.cross_entropy(logits, target, inplace_backward=inplace, **options)
        upstream = torch.linspace(0.5, 1.5, loss.numel()).view(loss.shape)
        loss.backward(upstream)
        return loss.detach(), h.grad, w.grad, logits

    loss, dh, dw, logits = step(True)
    want_loss, want_dh, want_dw, want_logits = step(False)
    for got, want in ((loss, want_loss), (dh, want_dh), (dw, want_dw)):
        assert_close(got, want, torch.float32)
    # The logits now hold their gradient (times the upstream gradient).
    assert not torch.equal(logits, want_logits)


@pytest.mark.parametrize("shape", [(4, 9), (2, 3, 9)], ids=str)
def test_inplace_backward_writes_the_logits_storage(shape):
    # [B, T, V] logits too: their rows are used as they are, not copied.
    logits = torch.randn(shape).requires_grad_() * 1
    target = torch.randint(0, 9, shape[:-1])
    pointer = logits.data_ptr()
    (dlogits,) = torch.autograd.grad(TF.cross_entropy(logits, target, inplace_backward=True),
                                     logits)
    assert dlogits.data_ptr() == pointer
    torch.testing.assert_close(dlogits, logits.detach())


def test_inplace_backward_without_gradient_leaves_the_logits():
    logits, target = torch.randn(4, 9), torch.randint(0, 9, (4,))
    before = logits.clone()
    loss = TF.cross_entropy(logits, target, inplace_backward=True)
    assert torch.equal(logits, before)
    assert_close(loss, F.cross_entropy(logits, target), torch.float32)


def test_inplace_backward_refusals():
    target = torch.randint(0, 9, (4,))
    leaf = torch.randn(4, 9, requires_grad=True)
    with pytest.raises(ValueError, match=r"tilefuse.cross_entropy: inplace_backward=True writes "
                                         r"the gradient over 'input', a leaf tensor"):
        TF.cross_entropy(leaf, target, inplace_backward=True)
    with pytest.raises(ValueError, match=r"a view of a leaf tensor that requires grad"):
        TF.cross_entropy(leaf[:2], target[:2], inplace_backward=True)
    with pytest.raises(ValueError, match=r"'input', which must be contiguous"):
        TF.cross_entropy((leaf * 1).t(), torch.randint(0, 4, (9,)), inplace_backward=True)
    # Something autograd saved of the logits: its backward refuses.
    logits = leaf * 1
    saved_use = logits.pow(2).sum()
    loss = TF.cross_entropy(logits, target, inplace_backward=True)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation"):
        (loss + saved_use).backward()
    # The backward scales the written gradient in place: it runs once.
    loss = TF.cross_entropy(leaf * 1, target, inplace_backward=True)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match=r"can run only once"):
        loss.backward()


#===------------------------------------------------------------------------===#
# gradcheck, errors, torch.compile, meta tensors
#===------------------------------------------------------------------------===#

def test_gradcheck_float64():
    from torch.autograd import gradcheck
    d = torch.float64
    x = torch.randn(3, 7, dtype=d, requires_grad=True)
    weight = torch.rand(7, dtype=d) + 0.5
    target = torch.tensor([1, -100, 6])
    probs = probabilities((3, 7)).to(d).requires_grad_()
    for reduction in ("none", "mean", "sum"):
        options = dict(weight=weight, reduction=reduction, label_smoothing=0.1,
                       lse_square_scale=0.1, softcap=2.0)
        assert gradcheck(lambda x: TF.cross_entropy(x, target, **options), (x,))
        assert gradcheck(lambda x, p: TF.cross_entropy(x, p, **options), (x, probs))
        # gradcheck runs a backward more than once, which the in-place
        # gradient refuses: it must equal the gradient gradcheck checked.
        check(d, lambda x, t: TF.cross_entropy(x * 1, t, inplace_backward=True, **options),
              lambda x, t: TF.cross_entropy(x, t, **options), x, target)
    kdim = torch.randn(2, 5, 3, dtype=d, requires_grad=True)
    assert gradcheck(lambda x: TF.cross_entropy(x, torch.tensor([[0, 4, 2], [1, 1, 3]])), (kdim,))


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_target_out_of_range_names_it(weighted):
    # On the CPU target the host checks targets while it gathers their
    # weights; for GPU code (a GPU, or the emulator) tensor ops check them,
    # one wait for the device. ignore_index is not out of range.
    weight = torch.rand(5) + 0.5 if weighted else None
    for target, first_bad in ((torch.tensor([1, -100, -3]), -3), (torch.tensor([5, 0, 9]), 5)):
        with pytest.raises(IndexError, match=rf"tilefuse.cross_entropy: target {first_bad} "
                                             r"is out of bounds for 5 classes"):
            TF.cross_entropy(torch.randn(3, 5), target, weight=weight)


def test_errors_name_the_argument():
    x, target = torch.randn(4, 9), torch.randint(0, 9, (4,))
    with pytest.raises(ValueError, match=r"tilefuse.cross_entropy: 'weight' \(the class weights\) "
                                         r"requires grad"):
        TF.cross_entropy(x, target, weight=torch.rand(9, requires_grad=True))
    with pytest.raises(ValueError, match=r"tilefuse.cross_entropy: argument 'weight' must have "
                                         r"shape \[9\]"):
        TF.cross_entropy(x, target, weight=torch.rand(8))
    with pytest.raises(ValueError, match=r"tilefuse.cross_entropy: 'target' must have shape \[4\]"):
        TF.cross_entropy(x, torch.randint(0, 9, (5,)))
    with pytest.raises(TypeError, match=r"'target' must hold int64 \(or uint8\) class indices or "
                                        r"float probabilities, got Int"):
        TF.cross_entropy(x, target.int())
    with pytest.raises(ValueError, match=r"probability targets .* must have the shape of 'input'"):
        TF.cross_entropy(x, torch.rand(4, 8))
    with pytest.raises(ValueError, match=r"ignore_index is not supported with probability targets"):
        TF.cross_entropy(x, torch.rand(4, 9), ignore_index=1)
    with pytest.raises(ValueError, match=r"softcap must be a positive number \(at least 1 / "
                                         r"FLT_MAX, 2.9e-39\) or None, got -1"):
        TF.cross_entropy(x, target, softcap=-1.0)
    # Its reciprocal, which the kernels take too, would overflow float32.
    with pytest.raises(ValueError, match=r"softcap must be a positive number .* got 1e-39"):
        TF.cross_entropy(x, target, softcap=1e-39)
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\], got 1.5"):
        TF.cross_entropy(x, target, label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"reduction must be 'none', 'mean' or 'sum', got 'max'"):
        TF.cross_entropy(x, target, reduction="max")
    with pytest.raises(ValueError, match=r"'input' must have a class dimension of at least 1"):
        TF.cross_entropy(torch.randn(4, 0), target)


def assert_compiled_matches_eager(compiled, step, leaves, args):
    """step(*leaves, *args) -> (loss, ...) and its compiled form: the same
    outputs and gradients of `leaves`."""
    results = []
    for fn in (compiled, step):
        copies = [leaf.clone().requires_grad_() for leaf in leaves]
        loss, *rest = fn(*copies, *args)
        loss.backward()
        results.append((loss, *rest, *(copy.grad for copy in copies)))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("inplace", [False, True], ids=["saved-logits", "inplace"])
def test_torch_compile_fullgraph(inplace):
    def step(hidden, head, target, probs, weight):
        logits = hidden @ head.t()
        loss, z_loss = TF.cross_entropy(logits, target, weight=weight, label_smoothing=0.1,
                                        lse_square_scale=1e-2, softcap=5.0, return_z_loss=True,
                                        inplace_backward=inplace)
        soft = TF.cross_entropy((hidden @ head.t()).transpose(1, 2), probs, reduction="sum")
        return loss + soft, z_loss

    compiled = torch.compile(step, fullgraph=True, dynamic=True, backend="aot_eager")
    head = torch.randn(37, 16)
    for batch in (3, 5):
        hidden, target = torch.randn(batch, 4, 16), torch.randint(0, 37, (batch, 4))
        probs = probabilities((batch, 37, 4), dim=1)
        assert_compiled_matches_eager(compiled, step, (hidden, head),
                                      (target, probs, torch.rand(37) + 0.5))


def test_meta_tensors():
    logits = torch.empty(2, 3, 50, device="meta", dtype=torch.bfloat16)
    target = torch.empty(2, 3, dtype=torch.int64, device="meta")
    assert TF.cross_entropy(logits, target, reduction="none").shape == (2, 3)
    loss, z_loss = TF.cross_entropy(logits, target, return_z_loss=True, lse_square_scale=1e-4)
    assert (loss.shape, loss.dtype, z_loss.shape) == ((), torch.bfloat16, ())
    probs = torch.empty(2, 3, 50, device="meta")
    assert TF.cross_entropy(logits, probs, reduction="none").shape == (2, 50)
