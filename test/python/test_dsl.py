"""DSL fusions against the same math in PyTorch."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import tilefuse
from conftest import assert_close


@tilefuse.fusion
def softmax(x):
    e = tilefuse.exp(x - tilefuse.max(x))
    return e / tilefuse.sum(e)


@tilefuse.fusion
def geglu(a, b):
    return tilefuse.gelu(a, approximate="tanh") * b


@tilefuse.fusion
def scaled_column_sum(x, w):
    # A column reduction: the sum over all rows of each column.
    return tilefuse.sum(x * w, dim=0)


@tilefuse.fusion
def column_extremes(x):
    return tilefuse.max(x, dim=0), tilefuse.min(x, dim=0)


@tilefuse.fusion
def moments(x, eps):
    mean = tilefuse.mean(x)
    var = tilefuse.mean((x - mean) * (x - mean))
    return {"normalized": (x - mean) * tilefuse.rsqrt(var + eps), "mean": mean, "var": var}


@tilefuse.fusion
def pick(logits, target):
    # One element per row at a per-row index, and the column index.
    onehot = tilefuse.cast(tilefuse.iota() == target, torch.float32)
    return tilefuse.gather(logits, target), tilefuse.sum(onehot * logits)


@tilefuse.fusion
def deviation_and_mass(x, w):
    # A weighted sum about the max, then the sum of the weights: merged,
    # one pass whose sum of weights serves both (fuse-merge-reductions).
    return tilefuse.sum(w * (x - tilefuse.max(x))), tilefuse.sum(w)


SHAPES = [(5, 7), (1, 33), (0, 16), (2, 3, 17), (64,)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_softmax(shape, dtype):
    x = torch.randn(shape).to(dtype)
    assert_close(softmax(x), torch.softmax(x.float(), -1).to(dtype), dtype)


@pytest.mark.parametrize("n", [7, 4096, 32000])
def test_weighted_sum_about_the_max_then_the_weights(n):
    # Regression: merging erased the sum of the weights that directly
    # followed the weighted sum, during a walk standing on it (a segfault,
    # every target).
    x, w = 4 * torch.randn(3, n) + 1e3, torch.rand(3, n)
    deviation, mass = deviation_and_mass(x, w)
    x64, w64 = x.double(), w.double()
    expected = (w64 * (x64 - x64.amax(-1, keepdim=True))).sum(-1)
    assert_close(deviation, expected.float(), torch.float32)
    assert_close(mass, w64.sum(-1).float(), torch.float32)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_geglu(shape, dtype):
    a, b = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    expected = (F.gelu(a.float(), approximate="tanh") * b.float()).to(dtype)
    assert_close(geglu(a, b), expected, dtype)


@pytest.mark.parametrize("shape", [(5, 7), (300, 33), (1, 8)], ids=str)
def test_column_reduction(shape, dtype):
    x, w = torch.randn(shape).to(dtype), torch.randn(shape[-1]).to(dtype)
    expected = (x.float() * w.float()).sum(0)
    atol = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}[dtype]
    torch.testing.assert_close(scaled_column_sum(x, w).float(), expected, atol=atol, rtol=atol)


# 5000 rows of 33: a GPU finalize thread's share of the partial rows ends
# inside a group, whose rows past it are not loaded (their identities, -inf
# and inf, must not reach the result).
@pytest.mark.parametrize("shape", [(5000, 33), (7, 5)], ids=str)
def test_column_max_and_min(shape, dtype):
    x = torch.randn(shape).to(dtype)
    x[1, 0], x[-1, 1], x[0, 2] = float("-inf"), float("inf"), float("nan")
    x[:, 3] = float("-inf")
    high, low = column_extremes(x)
    torch.testing.assert_close(high, x.amax(0), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(low, x.amin(0), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 64)], ids=str)
def test_several_outputs(shape, dtype):
    x = torch.randn(shape).to(dtype)
    out = moments(x, 1e-5)
    xf = x.float()
    mean, var = xf.mean(-1, keepdim=True), xf.var(-1, unbiased=False, keepdim=True)
    assert set(out) == {"normalized", "mean", "var"}
    assert out["mean"].shape == shape[:-1] and out["mean"].dtype == dtype
    assert_close(out["mean"], mean.squeeze(-1).to(dtype), dtype)
    assert_close(out["var"], var.squeeze(-1).to(dtype), dtype)
    assert_close(out["normalized"], ((xf - mean) / torch.sqrt(var + 1e-5)).to(dtype), dtype)


def test_gather_and_iota():
    logits = torch.randn(6, 10)
    target = torch.tensor([0, 9, 3, 3, 7, 1])
    picked, summed = pick(logits, target)
    expected = logits.gather(1, target[:, None]).squeeze(1)
    torch.testing.assert_close(picked, expected)
    torch.testing.assert_close(summed, expected)


@tilefuse.fusion
def leading_columns_rms(x, k: int):
    kept = tilefuse.where(tilefuse.iota() < k, x, 0.0)
    return kept * tilefuse.rsqrt(tilefuse.mean(kept * kept) + 1e-6)


@pytest.mark.parametrize("k", [1, 17000, 32000])
def test_column_mask_over_a_wide_row(k):
    # bf16 n = 32000 stays on chip on a GPU, 64 elements a thread, its loads
    # held packed between passes: the mask comes from the column index, so
    # the later pass recomputes it from a copy of the chunk's first column.
    x = (2 * torch.randn(5, 32000, dtype=torch.float64) + 3).to(torch.bfloat16)
    kept = torch.where(torch.arange(32000) < k, x.double(), 0.0)
    want = kept * torch.rsqrt((kept * kept).mean(-1, keepdim=True) + 1e-6)
    got = leading_columns_rms(x, k).double()
    assert (got - want).abs().max() <= 2 ** -8 * want.abs().max(), (got - want).abs().max()
    assert (got[:, k:] == 0).all()


def test_nan_and_inf_propagate_like_torch():
    x = torch.randn(4, 9)
    x[1, 3] = float("nan")
    x[2, 0] = float("inf")
    torch.testing.assert_close(softmax(x), torch.softmax(x, -1), equal_nan=True)


def test_rows_and_scalars_do_not_recompile():
    before = tilefuse.compile_count()
    moments(torch.randn(3, 40), 1e-5)
    after_first = tilefuse.compile_count()
    moments(torch.randn(11, 40), 0.5)
    moments(torch.randn(2, 5, 40), 1e-3)
    assert after_first - before <= 1
    assert tilefuse.compile_count() == after_first


@tilefuse.fusion
def shifted(x, k):
    return tilefuse.tanh(x) + k


def test_compiled_int_arguments_that_change():
    # torch.compile traces an int's second value as a SymInt (and a size
    # taken from a dynamic shape is one): it was refused as no number.
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, k: shifted(x, k) + shifted(x, x.shape[0]),
                             backend="aot_eager", fullgraph=True)
    for rows, k in [(2, 1), (3, 2), (4, 3)]:
        x = torch.randn(rows, 4)
        torch.testing.assert_close(compiled(x, k), 2 * torch.tanh(x) + k + rows)


SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-40, 1e-30, -1e-30, 1e-4, -1e-4,
           3.0, -3.0, 5.0, -9.0, 20.0, -20.0, 80.0, -80.0, 88.0, -87.0, 100.0, -100.0]


@tilefuse.fusion
def transcendentals(x):
    return {"exp": tilefuse.exp(x), "tanh": tilefuse.tanh(x), "erf": tilefuse.erf(x),
            "log": tilefuse.log(x), "sigmoid": tilefuse.sigmoid(x),
            "gelu": tilefuse.gelu(x), "gelu_tanh": tilefuse.gelu(x, approximate="tanh")}


def test_transcendentals_at_special_values_match_torch():
    # 22 values, twice: vector bodies and a masked tail.
    x = torch.tensor(SPECIAL * 2).reshape(1, -1)
    got = transcendentals(x)
    want = {"exp": torch.exp(x), "tanh": torch.tanh(x), "erf": torch.erf(x),
            "log": torch.log(x), "sigmoid": torch.sigmoid(x),
            "gelu": torch.nn.functional.gelu(x),
            "gelu_tanh": torch.nn.functional.gelu(x, approximate="tanh")}
    # torch's gelu(+inf) is NaN; the formula (and tilefuse) give +inf.
    finite = x.isfinite()
    for name in ("gelu", "gelu_tanh"):
        got[name], want[name] = got[name][finite], want[name][finite]
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=1e-6, rtol=1e-5, equal_nan=True,
                                   msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_tanh_of_16_bit_tensors_is_within_one_unit_in_the_last_place(dtype):
    # On a GPU, tanh of 16-bit tensors skips libdevice (ex2.approx and
    # div.approx, a series near 0: relative error 2^-17 in float32): rounded
    # to the dtype, at most one unit in the last place from the correctly
    # rounded result, with NaN, the infinities and the signs of zeros exact.
    tanh = tilefuse.fusion(lambda x: tilefuse.tanh(x))
    tiny = torch.logspace(-7, 0, 400)
    x = torch.cat([torch.linspace(-12, 12, 4001), tiny, -tiny, torch.tensor(SPECIAL)])
    x = x.to(dtype).reshape(1, -1)
    got, want = tanh(x).double(), torch.tanh(x.double()).to(dtype).double()
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    got, want = got[~nan], want[~nan]
    assert torch.equal(got.signbit(), want.signbit())
    finfo = torch.finfo(dtype)
    ulp = finfo.eps * torch.exp2(torch.floor(torch.log2(want.abs()))).clamp(min=finfo.tiny)
    assert ((got - want).abs() <= ulp).all(), (got - want).abs().div(ulp).max()


@tilefuse.fusion
def scaled_by_row(x, r, s):
    return x * r + s


def test_float64_fusions_keep_rows_and_scalars_in_float64():
    x = torch.randn(3, 8, dtype=torch.float64)
    r = torch.randn(3, dtype=torch.float64)
    s = 1.0 + 1e-12
    torch.testing.assert_close(scaled_by_row(x, r, s), x * r[:, None] + s, atol=1e-15, rtol=0)


@pytest.mark.parametrize("to", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_float64_cast_to_16_bits_rounds_like_torch(to):
    # Through float32, as torch's conversion rounds (a direct f64 -> f16/bf16
    # needed a compiler-rt call the CPU JIT could not find: found by fuzzing).
    cast_to = tilefuse.fusion(lambda x: tilefuse.cast(x, to))
    x = torch.randn(3, 40, dtype=torch.float64) * 1e3
    x[0, :4] = torch.tensor([1 + 2**-11 + 2**-40, 1 + 2**-8 + 2**-30, 7e4, -1e-8], dtype=torch.float64)
    assert torch.equal(cast_to(x), x.to(to))


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_float64_beside_16_bit_tensors(low):
    """A 16-bit tensor meeting a float64 one widens exactly (on the CPU it
    widened bf16 -> f64 directly, and LLVM's compare in bf16 then called
    __truncsfbf2, which the JIT lacks: maximum failed to load)."""
    x = torch.randn(3, 1000, dtype=torch.float64)
    y = torch.randn(3, 1000).to(low)
    y[0, 0] = float("nan")
    ours = tilefuse.fusion(lambda x, y: (tilefuse.maximum(x, y), tilefuse.minimum(x, y), x > y,
                                         x * y, tilefuse.max(y) + tilefuse.sum(x)))(x, y)
    theirs = (torch.maximum(x, y), torch.minimum(x, y), x > y, x * y, y.amax(-1) + x.sum(-1))
    for got, want in zip(ours, theirs):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)


@tilefuse.fusion
def unmerged_variance(x):
    # (x - mean) * (mean - x) is not a square: fuse-merge-reductions leaves
    # the two passes, the reference the merged moments must match.
    mean = tilefuse.mean(x)
    return -tilefuse.mean((x - mean) * (mean - x))


def test_streamed_rows_merge_their_reductions():
    # n = 32000 f32 streams on both targets: max and sum(exp(x - max)) run as
    # one online max/sum, mean and mean((x - mean)^2) as Welford/Chan
    # moments (fuse-merge-reductions). Rows with -inf behave as the two
    # passes did; rows with a large mean keep more digits than two passes.
    n = 32000
    x = torch.randn(8, n, dtype=torch.float64)
    x[1] += 1e4
    x[2] = 3e5 + 0.01 * x[2]
    x[3] = 1e6 + 10 * x[3]
    x[4, : n // 2] = float("-inf")  # leading -inf, then numbers
    x[5, ::7] = float("-inf")
    x[6] = float("-inf")
    x[7, 5] = float("inf")
    x32 = x.float()
    expected = torch.softmax(x32.double(), -1).float()
    torch.testing.assert_close(softmax(x32), expected, equal_nan=True, atol=1e-9, rtol=1e-5)

    finite = x32[:4]
    want = finite.double().var(-1, unbiased=False)
    out = moments(finite, 0.0)
    error = (out["var"].double() - want).abs()
    two_pass_error = (unmerged_variance(finite).double() - want).abs()
    assert (error <= 3 * two_pass_error + 2e-6 * want).all(), (error / want, two_pass_error / want)
    assert two_pass_error[2] > 10 * error[2]  # mean 3e5, spread 0.01
    torch.testing.assert_close(out["mean"].double(), finite.double().mean(-1), atol=1e-5, rtol=1e-6)
    with_inf = moments(x32[4:], 0.0)
    assert with_inf["var"].isnan().all() and with_inf["normalized"].isnan().all()


def test_streamed_bf16_rows_merge_their_reductions():
    # bf16 rows of 131072 stream on both targets; on a GPU exp is
    # ex2.approx and the online max/sum folds a chunk at a time into one
    # lane. -inf entries (leading, scattered, a whole row), +inf and a large
    # shift, against float64 within bf16's rounding.
    n = 131072
    x = 3 * torch.randn(6, n, dtype=torch.float64)
    x[1] += 300
    x[2, : n // 2] = float("-inf")
    x[3, ::7] = float("-inf")
    x[4] = float("-inf")
    x[5, 5] = float("inf")
    x16 = x.bfloat16()
    expected = torch.softmax(x16.double(), -1).bfloat16()
    torch.testing.assert_close(softmax(x16), expected, equal_nan=True, atol=0, rtol=2**-7)


def test_streamed_rows_partly_staged():
    # f32 rows of 65537: scalar accesses, 129 chunks per thread, of which a
    # GPU keeps 113 in shared memory between the passes (fuse-stage-rows on
    # sm_90); the others and the masked tail are read again. Softmax with
    # -inf entries, and moments with a large mean, against float64.
    n = 65537
    x = torch.randn(4, n, dtype=torch.float64)
    x[1] += 1e4
    x[2, ::5] = float("-inf")
    x[3, -7:] = float("-inf")
    x32 = x.float()
    torch.testing.assert_close(softmax(x32), torch.softmax(x32.double(), -1).float(),
                               atol=1e-9, rtol=1e-5)
    finite = x32[:2]
    out = moments(finite, 0.0)
    torch.testing.assert_close(out["mean"].double(), finite.double().mean(-1), atol=1e-5, rtol=1e-6)
    want = finite.double().var(-1, unbiased=False)
    assert ((out["var"].double() - want).abs() <= 2e-6 * want).all(), (out["var"], want)
    # The output pass: x (staged chunks from shared memory, the rest from
    # global memory) normalized by the row's own mean and variance.
    mean, var = out["mean"].double()[:, None], out["var"].double()[:, None]
    torch.testing.assert_close(out["normalized"].double(), (finite.double() - mean) * var.rsqrt(),
                               atol=1e-5, rtol=1e-5)


@tilefuse.fusion
def masked_softmax(x, keep):
    # A torch.bool input that both passes read, and a bool output: in memory
    # a mask takes a byte per element (an LLVM vector of i1 would be bits).
    z = tilefuse.where(keep, x, float("-inf"))
    e = tilefuse.exp(z - tilefuse.max(z))
    return e / tilefuse.sum(e), keep & (x > 0)


@pytest.mark.parametrize("n", [7, 64, 1000, 65537])
def test_bool_masks_in_and_out(n):
    # n = 65537 streams; on a GPU x and the mask are both staged in shared
    # memory between the passes.
    x = torch.randn(3, n)
    keep = torch.rand(3, n) > 0.4
    keep[:, 0] = True  # no row entirely masked
    keep[1, 1::2] = False
    probs, positive = masked_softmax(x, keep)
    assert positive.dtype == torch.bool
    assert torch.equal(positive, keep & (x > 0))
    expected = torch.softmax(x.double().masked_fill(~keep, float("-inf")), -1).float()
    torch.testing.assert_close(probs, expected, atol=1e-9, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("int_dtype", [torch.int32, torch.int64], ids=str)
def test_integer_tensors_round_to_the_16_bit_dtype_they_meet(int_dtype, dtype):
    """As PyTorch: an integer tensor meeting a float16 or bfloat16 tensor is
    converted to it through float32, rounded twice; a Python number or a
    0-d tensor as the second factor of * is not (README: other ops differ).
    cast() rounds the same way."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(-2**31, 2**31, (4, 1000), dtype=int_dtype, generator=generator)
    x[0, :6] = torch.tensor([70000, 257, 643825637, -2034237486, 2049, 33554435])
    h = (torch.rand(4, 1000, generator=generator) + 0.5).to(dtype)
    h[0, :6] = 0.5

    @tilefuse.fusion
    def mixed(x, h):
        return x * h, x > h * 256, h * 70000, tilefuse.cast(x, h.dtype)

    product, greater, by_number, cast = mixed(x, h)
    assert torch.equal(product, x * h) and torch.equal(greater, x > h * 256)
    assert torch.equal(by_number, h * 70000) and torch.equal(cast, x.to(dtype))
    zero_dim = tilefuse.fusion(lambda h, k: h * k)(h, torch.tensor(70000, dtype=int_dtype))
    assert torch.equal(zero_dim, h * torch.tensor(70000, dtype=int_dtype))


@tilefuse.fusion
def integer_row_stats(x):
    return (tilefuse.sum(x), tilefuse.max(x), tilefuse.min(x), tilefuse.argmax(x),
            tilefuse.argmin(x))


@pytest.mark.parametrize("n", [1000, 4096, 70000])  # one warp, across warps, streamed
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integer_row_reductions_are_exact(dtype, n):
    """Integer sums, extremes and their columns as torch computes them, past
    the integers a float holds exactly (2^24, 2^53): the columns of values
    one apart, ties to the first column, sums that wrap."""
    info = torch.iinfo(dtype)
    generator = torch.Generator().manual_seed(n)
    x = torch.randint(info.min, info.max, (4, n), dtype=dtype, generator=generator)
    x[1] = info.max - 7  # ties everywhere but one column
    x[1, n // 3] = info.max - 6
    x[1, n - 1] = info.max - 6  # a later tie of the max
    x[2] = info.min + 5
    x[2, n // 2] = info.min + 4
    x[3, :] = 0
    total, high, low, highest, lowest = integer_row_stats(x)
    assert torch.equal(total, x.sum(-1))  # int64 (wrapping), as torch.sum
    assert torch.equal(high, x.amax(-1)) and torch.equal(low, x.amin(-1))
    assert torch.equal(highest, x.argmax(-1)) and torch.equal(lowest, x.argmin(-1))
    assert highest[1] == n // 3 and lowest[2] == n // 2 and highest[3] == lowest[3] == 0


@tilefuse.fusion
def any_and_all(mask):
    return tilefuse.max(mask), tilefuse.min(mask)


@pytest.mark.parametrize("n", [7, 4096, 70000])
def test_extremes_of_a_mask_are_any_and_all(n):
    mask = torch.rand(5, n) > 0.3
    mask[0], mask[1] = True, False
    high, low = any_and_all(mask)
    assert high.dtype == low.dtype == torch.bool
    assert torch.equal(high, mask.amax(-1)) and torch.equal(low, mask.amin(-1))
    with pytest.raises(TypeError, match=r"negation, the `-` operator, of a bool mask; use `~`"):
        tilefuse.fusion(lambda m: -m)(mask)
    with pytest.raises(TypeError, match=r"subtraction, the `-` operator, with a bool mask"):
        tilefuse.fusion(lambda m: 1 - m)(mask)
    with pytest.raises(TypeError, match=r"max over the rows \(dim=0\) of a bool mask"):
        tilefuse.fusion(lambda m: tilefuse.max(m, dim=0))(mask)


@tilefuse.fusion
def mask_order(a, b):
    return a < b, a <= b, a > b, a >= b, a >= True, a < True


def test_masks_compare_false_below_true():
    a = torch.tensor([[True, False, True, False]] * 3)
    b = torch.tensor([[False, True, True, False]] * 3)
    for got, want in zip(mask_order(a, b), (a < b, a <= b, a > b, a >= b, a >= True, a < True)):
        assert torch.equal(got, want)


def test_column_extremes_of_zero_rows_raise_as_torch():
    column_stats = tilefuse.fusion(lambda x: (tilefuse.max(x, dim=0), tilefuse.sum(x, dim=0)))
    for _ in range(2):  # the second call as the first (no cached launch plan)
        for device in ("cpu", "meta"):
            with pytest.raises(IndexError, match=r"max over the rows \(dim=0\) of zero rows"):
                column_stats(torch.empty(0, 5, dtype=torch.int32, device=device))
    total = tilefuse.fusion(lambda x: tilefuse.sum(x, dim=0))(torch.empty(0, 5))
    assert torch.equal(total, torch.zeros(5))  # a sum of nothing, as torch.sum


def test_a_fusion_of_too_many_operations_is_refused():
    # A chain of 60000 crashed the process (the lowering's and the
    # derivative's recursion overflowed the stack).
    def chain(x):
        for _ in range(8200):
            x = tilefuse.sin(x)
        return x

    x = torch.randn(2, 4, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"fuse-differentiate: kernel @chain has 8201 "
                                           r"operations; the limit is 8192"):
        tilefuse.fusion(chain)(x)
    with pytest.raises(RuntimeError, match=r"fuse-select-tiles: kernel @chain has 8201 "
                                           r"operations; the limit is 8192"):
        tilefuse.fusion(chain)(x.detach())


@tilefuse.fusion
def absolute(x):
    return abs(x), tilefuse.sqrt(abs(x))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integer_abs_as_torch(dtype):
    """abs of integers, the dtype's lowest wrapping as torch's: int64's
    failed to compile for a GPU (math.absi had no GPU conversion)."""
    info = torch.iinfo(dtype)
    x = torch.tensor([[-3, 4, 0, info.min, info.max, info.min + 1, -1]], dtype=dtype)
    magnitude, root = absolute(x)
    assert torch.equal(magnitude, x.abs())
    torch.testing.assert_close(root, torch.sqrt(x.abs()), rtol=0, atol=0, equal_nan=True)


def test_integer_division_is_refused():
    # A zero divisor killed the process on the CPU target (SIGFPE).
    handle = torch.ops.tilefuse.register_fusion("""module {
  fuse.kernel @idiv(%x: !fuse.full<i32>, %y: !fuse.full<i32>) -> (z: !fuse.full<i32>) {
    %0 = fuse.div %x, %y : !fuse.full<i32>
    fuse.yield %0 : !fuse.full<i32>
  }
}""", "f32")
    ints = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="integer division is not lowered"):
        torch.ops.tilefuse.launch_fusion(handle, [ints, ints], [])


def test_a_column_reduction_read_in_its_own_fusion_is_refused():
    # It crashed the compiler: a column's sum is complete only after every row.
    for read in (lambda x: x - tilefuse.sum(x, dim=0), lambda x: x / tilefuse.max(x, dim=0),
                 lambda x: tilefuse.sum(x * tilefuse.sum(x, dim=0))):
        with pytest.raises(RuntimeError, match=r"a column reduction \(over the rows\) can only "
                                               "be an output"):
            tilefuse.fusion(read)(torch.randn(4, 5))


SAVED_PROGRAM = """
import sys, torch, tilefuse
if sys.argv[1] == "load":  # one more fusion, defined first
    @tilefuse.fusion
    def other(x):
        return tilefuse.exp(x)
@tilefuse.fusion
def capped(x, cap=5.0):
    return cap * tilefuse.tanh(x / cap)
class Capped(torch.nn.Module):
    def forward(self, x):
        return capped(x)
x = torch.linspace(-8, 8, 8).reshape(2, 4)
if sys.argv[1] == "save":
    torch.export.save(torch.export.export(Capped(), (x,)), sys.argv[2])
else:
    torch.testing.assert_close(torch.export.load(sys.argv[2]).module()(x), 5 * torch.tanh(x / 5))
"""


def test_a_saved_program_calls_the_fusion_it_traced(tmp_path):
    # Graphs named a fusion by its place among this process's fusions: a
    # program saved by torch.export (or cached on disk by torch.compile) ran
    # whichever fusion another process had defined there.
    script = tmp_path / "program.py"
    script.write_text(SAVED_PROGRAM)
    saved = str(tmp_path / "capped.pt2")
    for mode in ("save", "load"):
        done = subprocess.run([sys.executable, str(script), mode, saved], capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    # Another fusion's source, or its code captured differently: another key.
    keys = {tilefuse.fusion(lambda x: x * k)._key.rsplit("-", 2)[1] for k in (2.0, 3.0)}
    keys.add(tilefuse.fusion(lambda x: x * 2.0)._key.rsplit("-", 2)[1])
    one_line = [tilefuse.fusion(f, name="act") for f in (lambda x: x * 2, lambda x: x + 2)]
    keys |= {f._key.rsplit("-", 2)[1] for f in one_line}
    assert len(keys) == 5
    with pytest.raises(RuntimeError, match="no fusion 'nothing-0' is defined in this process"):
        torch.ops.tilefuse.run_fusion("nothing-0", "t", "()", [torch.ones(1, 1)], [], [], False)


@tilefuse.fusion
def weighted_deviation(x, w):
    return tilefuse.sum(w * (x - tilefuse.max(x)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64], ids=str)
def test_weighted_sum_about_the_max_of_a_long_row(dtype):
    # A streamed row merges the float sum into the max's pass
    # (fuse.max_deviation); an integer one stays as written (exact).
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(-1000, 1000, (3, 32000), generator=generator).to(dtype)
    w = torch.randint(0, 5, (3, 32000), generator=generator).to(dtype)
    x[1, 0] = -10**9  # a masked first element of weight 0
    w[1, 0] = 0
    want = (w * (x - x.amax(-1, keepdim=True))).sum(-1)
    torch.testing.assert_close(weighted_deviation(x, w), want, rtol=1e-12, atol=0)
