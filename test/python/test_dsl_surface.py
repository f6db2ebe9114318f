"""The DSL's surface: every op against PyTorch (NaN and infinities
included), Python numbers as operands, keyword arguments and defaults,
PyTorch's type promotion, output dtypes, and the errors for what it cannot
trace."""

import pytest
import torch
import torch.nn.functional as F

import tilefuse
from conftest import assert_close

SPECIAL = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-40, 1e-30, -1e-30, 1e-7,
           -1e-7, 1e-4, -1e-4, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, -3.0, 20.0, -20.0, 88.0, -87.0,
           100.0, -100.0, 1e4, -1e4]


@tilefuse.fusion
def elementwise(x, e):
    return {"log1p": tilefuse.log1p(x), "expm1": tilefuse.expm1(x),
            "floor": tilefuse.floor(x), "round": tilefuse.round(x),
            "sign": tilefuse.sign(x), "relu": tilefuse.relu(x), "square": tilefuse.square(x),
            "clamp": tilefuse.clamp(x, -2.0, 3.0), "clamp_min": tilefuse.clamp(x, min=0.5),
            "clamp_tensors": tilefuse.clamp(x, e, e + 1.0),
            "softplus": tilefuse.softplus(x), "softplus_beta": tilefuse.softplus(x, 2.0, 5.0),
            "pow": tilefuse.pow(tilefuse.abs(x), e), "rpow": 2.0 ** x}


def expected_elementwise(x, e):
    return {"log1p": torch.log1p(x), "expm1": torch.expm1(x),
            "floor": torch.floor(x), "round": torch.round(x),
            "sign": torch.sign(x), "relu": torch.relu(x), "square": torch.square(x),
            "clamp": torch.clamp(x, -2.0, 3.0), "clamp_min": torch.clamp(x, min=0.5),
            "clamp_tensors": torch.clamp(x, e, e + 1.0),
            "softplus": F.softplus(x), "softplus_beta": F.softplus(x, 2.0, 5.0),
            "pow": torch.pow(x.abs(), e), "rpow": 2.0 ** x}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_elementwise_ops_at_special_values(dtype):
    # Twice: vector bodies and a masked tail.
    x = torch.tensor(SPECIAL * 2, dtype=dtype).reshape(1, -1)
    e = torch.linspace(-2, 3, x.shape[-1], dtype=dtype).reshape(1, -1)
    got, want = elementwise(x, e), expected_elementwise(x, e)
    assert set(got) == set(want)
    for name, value in want.items():
        atol = 1e-6 if dtype == torch.float32 else 1e-12
        torch.testing.assert_close(got[name], value, atol=atol, rtol=1e-5, equal_nan=True,
                                   msg=lambda m, name=name: f"{name}: {m}")
        if name in ("relu", "clamp", "floor", "round", "sign"):  # -0.0 kept where torch keeps it
            assert torch.equal(got[name].signbit(), value.signbit()), name


@tilefuse.fusion
def rope_parts(x):
    return tilefuse.sin(x), tilefuse.cos(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_sin_and_cos_at_special_values(dtype):
    # Huge arguments take libdevice's slow reduction (its .global table of
    # 2/pi, a .local array, carry chains): against float64.
    huge = [1e5, -3e5, 12345678.0, 1e10, -1e22, 3e38] + ([1e200, -1e308] if dtype == torch.float64
                                                          else [])
    x = torch.tensor(SPECIAL * 2 + huge, dtype=dtype).reshape(1, -1)
    exact = x.double()
    atol = 1e-6 if dtype == torch.float32 else 1e-12
    for got, want in zip(rope_parts(x), (torch.sin(exact), torch.cos(exact))):
        torch.testing.assert_close(got.double(), want, atol=atol, rtol=1e-5, equal_nan=True)


@tilefuse.fusion
def row_ops(x):
    return {"softmax": tilefuse.softmax(x), "log_softmax": tilefuse.log_softmax(x),
            "logsumexp": tilefuse.logsumexp(x), "argmax": tilefuse.argmax(x),
            "argmin": tilefuse.argmin(x)}


@pytest.mark.parametrize("n", [7, 64, 1000], ids=lambda n: f"n={n}")  # on chip, streamed
def test_row_ops_match_torch(n):
    x = torch.randn(9, n)
    x[1, 3] = float("nan")                  # NaN: the row is NaN, argmax the NaN
    x[2, :] = float("-inf")                 # all -inf: logsumexp -inf
    x[3, n // 2] = float("inf")             # +inf
    x[4] = torch.round(x[4])                # ties: the first column
    x[5, :] = 1.0
    got = row_ops(x)
    torch.testing.assert_close(got["softmax"], torch.softmax(x, -1), equal_nan=True)
    torch.testing.assert_close(got["log_softmax"], torch.log_softmax(x, -1), equal_nan=True)
    torch.testing.assert_close(got["logsumexp"], torch.logsumexp(x, -1), equal_nan=True)
    assert got["argmax"].dtype == torch.int64
    assert torch.equal(got["argmax"], x.argmax(-1)) and torch.equal(got["argmin"], x.argmin(-1))


def test_python_numbers_anywhere():
    @tilefuse.fusion
    def numbers(x):
        return (tilefuse.where(x > 0, -1.0, 0.0), tilefuse.maximum(0.0, x), 2.0 ** x,
                tilefuse.where(x > 0, x, 1), tilefuse.exp(1.0) * x)

    x = torch.randn(3, 8)
    got = numbers(x)
    want = (torch.where(x > 0, -1.0, 0.0), torch.maximum(torch.tensor(0.0), x), 2.0 ** x,
            torch.where(x > 0, x, 1), torch.exp(torch.tensor(1.0)) * x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w)


def test_keyword_arguments_and_defaults():
    @tilefuse.fusion
    def norm(x, weight, eps=1e-6, *, approximate="none"):
        y = x * tilefuse.rsqrt(tilefuse.mean(x * x) + eps) * weight
        return tilefuse.gelu(y, approximate=approximate)

    x, w = torch.randn(4, 16), torch.randn(16)

    def reference(eps, approximate="none"):
        return F.gelu(F.rms_norm(x, (16,), w, eps), approximate=approximate)

    torch.testing.assert_close(norm(x, w), reference(1e-6))
    before = tilefuse.compile_count()
    # A default number is a runtime scalar: another value does not recompile.
    torch.testing.assert_close(norm(x, weight=w, eps=0.5), reference(0.5))
    torch.testing.assert_close(norm(weight=w, x=x, eps=0.25), reference(0.25))
    assert tilefuse.compile_count() == before
    # A string is a trace-time constant: a new value traces again.
    torch.testing.assert_close(norm(x, w, approximate="tanh"), reference(1e-6, "tanh"))
    with pytest.raises(TypeError, match=r"tilefuse.norm: got an unexpected keyword argument 'epsilon'"):
        norm(x, w, epsilon=1e-5)
    with pytest.raises(TypeError, match=r"tilefuse.norm: missing a required argument: 'weight'"):
        norm(x)


def test_mixed_dtypes_promote_like_torch():
    @tilefuse.fusion
    def mixed(x, w, h, i):
        return x * w, x + h, x * 2.0, i / 2, i + 1, x * i

    x = torch.randn(3, 16, dtype=torch.bfloat16)
    w = torch.randn(16)                                # f32 weight, bf16 activations
    h = torch.randn(3, 16, dtype=torch.float16)
    i = torch.randint(-5, 5, (3, 16), dtype=torch.int32)
    got = mixed(x, w, h, i)
    # torch rounds every intermediate to its dtype; the fusion computes in f32
    # and rounds once: values agree to the output dtype's precision.
    want = (x * w, x + h, x * 2.0, i / 2, i + 1, x * i)
    for g, w_ in zip(got, want):
        assert g.dtype == w_.dtype
        torch.testing.assert_close(g.double(), w_.double(), atol=1e-2, rtol=1e-2)


def test_output_dtypes_are_what_the_fusion_declares():
    @tilefuse.fusion
    def stats(x):
        xf = tilefuse.cast(x, torch.float32)
        return tilefuse.mean(xf * xf), tilefuse.mean(x * x), tilefuse.cast(x, torch.float32)

    x = torch.randn(5, 64, dtype=torch.bfloat16)
    f32_mean, bf16_mean, wide = stats(x)
    assert (f32_mean.dtype, bf16_mean.dtype, wide.dtype) == (torch.float32, torch.bfloat16,
                                                             torch.float32)
    torch.testing.assert_close(f32_mean, (x.float() ** 2).mean(-1))
    assert torch.equal(wide, x.float())


def test_masks_combine_with_logical_operators():
    @tilefuse.fusion
    def band(x):
        inside = (x > -1.0) & (x < 1.0)
        return tilefuse.where(inside | (x > 3.0), x, 0.0), tilefuse.where(~inside, 1.0, 0.0)

    x = torch.randn(4, 32) * 2
    inside = (x > -1) & (x < 1)
    a, b = band(x)
    torch.testing.assert_close(a, torch.where(inside | (x > 3), x, 0.0))
    torch.testing.assert_close(b, (~inside).float())


@pytest.mark.parametrize("source, message", [
    ("x.sum()", r"Tensor.sum\(\) is not available on traced values; use tilefuse.sum\(x\)"),
    ("x.clamp(0, 1)", r"use tilefuse.clamp\(x, min, max\)"),
    ("x.float()", r"use tilefuse.cast\(x, torch.float32\)"),
    ("x.shape", r"the shape of a traced value is not known while tracing"),
    ("x.foo", r"traced values have no attribute 'foo'"),
    ("x @ x", r"cannot trace a matrix product"),
    ("x % 2", r"cannot trace the % operator"),
    ("len(x)", r"cannot trace len\(\) of a traced value"),
    ("tilefuse.where(x, x, x)", r"tilefuse.where: condition must be a bool mask"),
    ("tilefuse.clamp(x)", r"tilefuse.clamp: at least one of min and max"),
    ("x + outside", r"cannot trace a tensor captured from outside the fusion"),
    ("tilefuse.softmax(x, dim=0)", r"tilefuse.softmax: dim must be -1"),
])
def test_errors_name_the_fix_and_the_line(source, message):
    outside = torch.ones(3)

    def body(x):
        return eval(source, globals(), {"x": x, "outside": outside})

    with pytest.raises((AttributeError, TypeError, ValueError), match=message):
        tilefuse.fusion(body, name="bad")(torch.ones(2, 3))


def test_star_args_are_refused():
    with pytest.raises(TypeError, match=r"\*args and \*\*kwargs are not supported \('rest'\)"):
        tilefuse.fusion(lambda x, *rest: x)
