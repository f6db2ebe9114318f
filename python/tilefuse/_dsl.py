"""The DSL: `@tilefuse.fusion` traces a Python function into the fuse dialect.

The first call with a given (argument kinds, dtypes, trace-time constants)
traces the function through the C++ builder (tilefuse._C.Builder), compiles
it and caches the kernel; later calls only run it. Argument kinds come from
the call: the first tensor with the most dimensions is full `[..., n]`;
another tensor of its shape is full, of shape `[n]` per-column (per-row if it
is an integer tensor and also matches the leading dims), of the leading
shape per-row; a Python int or float, or a 0-d tensor, is a runtime scalar;
any other argument (a bool, a string, None) is a trace-time constant. A 0-d
tensor on the tensors' device is read there, through a pointer (a new value
neither recompiles nor waits for the device).

Values follow PyTorch's type promotion (torch.result_type): an f32 weight
times bf16 activations is f32, a Python number keeps a tensor's dtype, an
integer divided is a float. Arithmetic runs in f32 (f64 when a float64 is
involved) and every output comes back in the dtype PyTorch would give it.
Python numbers (arguments, literals, `tilefuse.item` of a scalar) compute in
float64 among themselves, as Python computes them, and take the dtype of
the tensor or 0-d tensor they meet.

`fusion.multi_tensor(lists...)` runs an elementwise fusion over lists of
tensors (the i-th of each list forms a row set) in a few launches, and
`@tilefuse.fusion(inplace={"param": "param_out"})` writes an output over an
input, in single and multi-tensor calls.

Autograd: the fusion's backward is derived by the compiler
(tilefuse/Compiler/Differentiate.h) and runs as one fused kernel; see
`tilefuse::launch_fusion` in python/csrc/TorchOps.cpp (and `launch_fusion_`,
which runs a fusion writing in place).
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import inspect
import math
import os
import re
import threading
import uuid

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily

from . import _C  # also registers the tilefuse:: ops

DTYPE_NAMES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.bool: "i1",
}
TORCH_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
FLOAT_STORAGE = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_tracing = threading.local()


def _user_location() -> str:
    """`file:line: source` of the innermost frame outside tilefuse."""
    for frame in inspect.stack()[1:]:
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR):
            source = (frame.code_context or [""])[0].strip()
            return f"{frame.filename}:{frame.lineno}: {source}"
    return "<unknown>"


def _unsupported(what: str) -> TypeError:
    return TypeError(f"tilefuse.fusion cannot trace {what}, at {_user_location()}")


class _Trace:
    """One tracing of a fusion: the builder, the float type arithmetic runs
    in ("f32", or "f64" when a float64 tensor is involved), and the index of
    every gather (checked against [0, n) after each call)."""

    def __init__(self, name: str, compute: str):
        # The kernel's name is an identifier (a PTX entry point): "<lambda>"
        # becomes "_lambda_"; errors keep the function's own name.
        self.builder = _C.Builder(re.sub(r"\W|^(?=\d)", "_", name), compute)
        self.compute = compute
        self.gather_indices: list[Value] = []
        self.column_extremes: list[str] = []  # max/min over the rows (dim=0)


def _outside_fake_mode(function):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with unset_fake_temporarily():
            return function(*args, **kwargs)
    return wrapper


def _active_trace(function: str) -> _Trace:
    trace = getattr(_tracing, "trace", None)
    if trace is None:
        raise TypeError(f"tilefuse.{function} is only valid inside a @tilefuse.fusion function")
    return trace


# What PyTorch's promotion sees of a value: a Python number (it keeps a
# tensor's dtype), a 0-d tensor or a dimensioned one.
@functools.lru_cache(maxsize=None)
def _tensor_proto(dtype: torch.dtype, zero_dim: bool) -> torch.Tensor:
    return torch.empty(() if zero_dim else (1,), dtype=dtype)


def _number_proto(dtype: torch.dtype):
    return True if dtype == torch.bool else 1.0 if dtype.is_floating_point else 1


def _proto_dtype(proto) -> torch.dtype:
    if isinstance(proto, torch.Tensor):
        return proto.dtype
    return torch.result_type(proto, proto)


def _result_type(a, b):
    """torch.result_type of two protos, as a proto of their wider category."""
    return _promoted_category(a, b, torch.result_type(a, b))


def _promoted_category(a, b, dtype: torch.dtype):
    """A proto of `dtype` in the wider category of `a` and `b`."""
    if any(isinstance(p, torch.Tensor) and p.dim() > 0 for p in (a, b)):
        return _tensor_proto(dtype, False)
    if any(isinstance(p, torch.Tensor) for p in (a, b)):
        return _tensor_proto(dtype, True)
    return _number_proto(dtype)


class Value:
    """A value of the fusion being traced (a tensor, per row, per column, or
    a scalar). Supports + - * / ** comparisons, abs(), and & | ~ on masks."""

    __slots__ = ("_trace", "_value", "_proto", "_argument")

    def __init__(self, trace: _Trace, value, proto, argument: str | None = None):
        self._trace = trace
        self._value = value
        self._proto = proto
        self._argument = argument  # the fusion argument this value is, if any

    @property
    def kind(self) -> str:
        """"full", "row", "col" or "scalar"."""
        return self._value.kind

    @property
    def dtype(self) -> torch.dtype:
        """The dtype PyTorch would give this value."""
        return _proto_dtype(self._proto)

    def _binary(self, op, other, reverse=False):
        a, b = (_as_value(other, op), self) if reverse else (self, _as_value(other, op))
        if op == "sub" and torch.bool in (a.dtype, b.dtype):  # as torch refuses it
            raise _unsupported("subtraction, the `-` operator, with a bool mask; to invert "
                               "a mask use `~` (logical_not)")
        return _arithmetic(op, a, b)

    def _compare(self, predicate, other):
        other = _as_value(other, predicate)
        proto = _result_type(self._proto, other._proto)
        a, b = _computed(self, proto), _computed(other, proto)
        return Value(self._trace, self._trace.builder.compare(predicate, a, b),
                     _promoted_category(self._proto, other._proto, torch.bool))

    def __add__(self, o): return self._binary("add", o)
    def __radd__(self, o): return self._binary("add", o, True)
    def __sub__(self, o): return self._binary("sub", o)
    def __rsub__(self, o): return self._binary("sub", o, True)
    def __mul__(self, o): return self._binary("mul", o)
    def __rmul__(self, o): return self._binary("mul", o, True)
    def __truediv__(self, o): return self._binary("div", o)
    def __rtruediv__(self, o): return self._binary("div", o, True)
    def __pow__(self, o): return pow(self, o)
    def __rpow__(self, o): return pow(o, self)
    def __neg__(self):
        if self.dtype == torch.bool:  # torch's message
            raise _unsupported("negation, the `-` operator, of a bool mask; use `~` (logical_not)")
        return _unary_same("neg", self)
    def __pos__(self): return self
    def __abs__(self): return abs(self)
    def __lt__(self, o): return self._compare("lt", o)
    def __le__(self, o): return self._compare("le", o)
    def __gt__(self, o): return self._compare("gt", o)
    def __ge__(self, o): return self._compare("ge", o)
    def __eq__(self, o): return self._compare("eq", o)  # type: ignore[override]
    def __ne__(self, o): return self._compare("ne", o)  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    # Masks: & | ~ as torch's logical operators on bool tensors.
    def __and__(self, o): return _logical("&", self, o, lambda a, b: where(a, b, False))
    def __rand__(self, o): return self.__and__(o)
    def __or__(self, o): return _logical("|", self, o, lambda a, b: where(a, True, b))
    def __ror__(self, o): return self.__or__(o)
    def __invert__(self): return _logical("~", self, False, lambda a, _: where(a, False, True))

    def __bool__(self):
        raise _unsupported("a data-dependent `if`, `and`, `or` or `not` on a traced value")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        raise _unsupported(f"torch.{name} on a traced value (use the tilefuse.* function "
                           "of the same name)")

    def __iter__(self):
        raise _unsupported("iteration over a traced value")

    def __len__(self):
        raise _unsupported("len() of a traced value (its shape is only known at run time)")

    def __index__(self):
        raise _unsupported("a traced value used as a Python integer")

    def __float__(self):
        raise _unsupported("a traced value used as a Python float")

    def __getitem__(self, index):
        raise _unsupported("indexing; use tilefuse.gather for one element per row")

    def __matmul__(self, other):
        raise _unsupported("a matrix product (@): a fusion is elementwise work and "
                           "reductions over rows; multiply the matrices outside it")

    __rmatmul__ = __matmul__

    def __mod__(self, other):
        raise _unsupported("the % operator (no fuse op computes it yet)")

    __rmod__ = __floordiv__ = __rfloordiv__ = __mod__

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        hint = _METHOD_HINTS.get(name)
        if hint is None and name in _SHAPE_ATTRIBUTES:
            hint = ("the shape of a traced value is not known while tracing (a fusion "
                    "runs for every row length); use tilefuse.iota() or a reduction")
        if hint is None:
            hint = f"traced values have no attribute '{name}'; use the tilefuse.* functions"
        raise AttributeError(f"tilefuse.fusion: {hint}, at {_user_location()}")


# Tensor methods users reach for, and what to write instead.
_METHOD_HINTS = {
    name: f"Tensor.{name}() is not available on traced values; use tilefuse.{target}"
    for name, target in {
        "sum": "sum(x)", "mean": "mean(x)", "max": "max(x)", "min": "min(x)",
        "amax": "max(x)", "amin": "min(x)", "argmax": "argmax(x)", "argmin": "argmin(x)",
        "exp": "exp(x)", "log": "log(x)", "sqrt": "sqrt(x)", "rsqrt": "rsqrt(x)",
        "tanh": "tanh(x)", "sigmoid": "sigmoid(x)", "erf": "erf(x)", "abs": "abs(x)",
        "clamp": "clamp(x, min, max)", "clip": "clamp(x, min, max)", "relu": "relu(x)",
        "square": "square(x)", "pow": "pow(x, y) or x ** y", "log1p": "log1p(x)",
        "expm1": "expm1(x)", "sin": "sin(x)", "cos": "cos(x)", "floor": "floor(x)",
        "round": "round(x)", "sign": "sign(x)", "softmax": "softmax(x)",
        "log_softmax": "log_softmax(x)", "logsumexp": "logsumexp(x)",
        "maximum": "maximum(x, y)", "minimum": "minimum(x, y)", "where": "where(c, x, y)",
        "gather": "gather(x, index)", "neg": "-x",
        "to": "cast(x, dtype)", "type": "cast(x, dtype)", "float": "cast(x, torch.float32)",
        "half": "cast(x, torch.float16)", "bfloat16": "cast(x, torch.bfloat16)",
        "double": "cast(x, torch.float64)", "long": "cast(x, torch.int64)",
        "int": "cast(x, torch.int32)", "bool": "cast(x, torch.bool) or a comparison",
    }.items()
}
_SHAPE_ATTRIBUTES = {"shape", "size", "ndim", "dim", "numel", "device", "T", "mT"}


def _as_value(x, function: str) -> Value:
    """A traced value, or a Python number as a constant of the fusion being
    traced."""
    if isinstance(x, Value):
        if x._trace is not _active_trace(function):
            raise _unsupported("values of two different fusions")
        return x
    if isinstance(x, (bool, int, float)):
        trace = _active_trace(function)
        dtype = "i1" if isinstance(x, bool) else "f64" if isinstance(x, float) else "i64"
        return Value(trace, trace.builder.constant(float(x), dtype), x)
    if isinstance(x, torch.Tensor):
        raise _unsupported("a tensor captured from outside the fusion (pass it as an "
                           "argument)")
    raise _unsupported(f"an operand of type {type(x).__name__}")


def _computation(dtype: torch.dtype, trace: _Trace) -> str:
    """The element type a value of `dtype` is computed in: floats in the
    fusion's compute type (f64 for float64), integers and masks as they are."""
    if dtype == torch.float64:
        return "f64"
    if dtype.is_floating_point:
        return trace.compute
    if dtype not in DTYPE_NAMES:
        raise _unsupported(f"values of dtype {dtype}")
    return DTYPE_NAMES[dtype]


def _computed(value: Value, proto):
    """The builder value of `value` converted to the computation type of
    `proto`'s dtype (float64 for a Python float: numbers compute among
    themselves as Python computes them)."""
    name = "f64" if isinstance(proto, float) else _computation(_proto_dtype(proto), value._trace)
    builder = value._trace.builder
    if value._value.dtype == name:
        return value._value
    if name == "i1":
        return builder.compare("ne", value._value, builder.scalar_like(0.0, value._value))
    target = _proto_dtype(proto)
    if (target in (torch.float16, torch.bfloat16) and isinstance(value._proto, torch.Tensor)
            and value._proto.dim() > 0 and not value.dtype.is_floating_point):
        # PyTorch converts an integer tensor to the 16-bit dtype it promotes
        # to, through float32 (rounded twice), and computes on that; a
        # Python number or a 0-d tensor goes to the computation unrounded.
        wide = builder.cast(value._value, name)
        return builder.cast(builder.cast(wide, DTYPE_NAMES[target]), name)
    return builder.cast(value._value, name)


def _cast(value: Value, dtype: torch.dtype) -> Value:
    proto = _promoted_category(value._proto, value._proto, dtype)
    computed = _computed(value, proto)
    if dtype in (torch.float16, torch.bfloat16):
        # Round to the narrow type, then compute on in f32.
        builder = value._trace.builder
        computed = builder.cast(builder.cast(computed, DTYPE_NAMES[dtype]),
                                value._trace.compute)
    return Value(value._trace, computed, proto)


def _arithmetic(op: str, a: Value, b: Value) -> Value:
    proto = _result_type(a._proto, b._proto)
    dtype = _proto_dtype(proto)
    if op == "div" and not dtype.is_floating_point:  # true division
        proto = _promoted_category(a._proto, b._proto, torch.get_default_dtype())
    elif dtype == torch.bool:  # torch: bool + bool is an error, True + True = 2
        raise _unsupported(f"arithmetic ({op}) on masks; cast them to a number first")
    trace = a._trace
    return Value(trace, trace.builder.binary(op, _computed(a, proto), _computed(b, proto)), proto)


def _floating(value: Value):
    """The proto of a float op's result on `value` (ints become the default
    float dtype)."""
    if value.dtype.is_floating_point:
        return value._proto
    return _promoted_category(value._proto, value._proto, torch.get_default_dtype())


def _unary_same(op: str, x) -> Value:
    x = _as_value(x, op)
    return Value(x._trace, x._trace.builder.unary(op, _computed(x, x._proto)), x._proto)


def _logical(symbol: str, a: Value, b, combine) -> Value:
    b = _as_value(b, symbol)
    if a.dtype != torch.bool or b.dtype != torch.bool:
        raise _unsupported(f"`{symbol}` on {a.dtype} and {b.dtype} values (it combines masks)")
    return combine(a, b)


def _unary(op):
    def function(x):
        x = _as_value(x, op)
        proto = _floating(x)
        return Value(x._trace, x._trace.builder.unary(op, _computed(x, proto)), proto)
    function.__name__ = op
    function.__doc__ = f"Elementwise {op}, like torch.{op}."
    return function


exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
tanh = _unary("tanh")
erf = _unary("erf")
sigmoid = _unary("sigmoid")
log1p = _unary("log1p")
expm1 = _unary("expm1")
sin = _unary("sin")
cos = _unary("cos")


def abs(x):  # noqa: A001 - torch's name
    """Elementwise absolute value, like torch.abs."""
    return _unary_same("abs", x)


def _rounding(op):
    def function(x):
        x = _as_value(x, op)
        return _unary_same(op, x) if x.dtype.is_floating_point else x
    function.__name__ = op
    function.__doc__ = (f"Elementwise {op}, like torch.{op}"
                        + (" (half to even)." if op == "round" else "."))
    return function


floor = _rounding("floor")
round = _rounding("round")  # noqa: A001 - torch's name


def _composite(op, floating: bool):
    def function(x):
        x = _as_value(x, op)
        proto = _floating(x) if floating else x._proto
        return Value(x._trace, x._trace.builder.composite(op, _computed(x, proto)), proto)
    return function


sign = _composite("sign", False)
sign.__doc__ = "-1, 0 or 1 (0 for NaN), like torch.sign."
relu = _composite("relu", False)
relu.__doc__ = "max(x, 0), like torch.relu (-0.0 and NaN kept, gradient 0 at 0)."
square = _composite("square", False)
square.__doc__ = "x * x, like torch.square."


def _row_composite(op):
    def function(x, dim: int = -1):
        if dim != -1:
            raise ValueError(f"tilefuse.{op}: dim must be -1 (over each row), got {dim}")
        return _composite(op, True)(x)
    function.__name__ = op
    return function


softmax = _row_composite("softmax")
softmax.__doc__ = "torch.softmax over the last dim."
log_softmax = _row_composite("log_softmax")
log_softmax.__doc__ = "torch.log_softmax over the last dim."
logsumexp = _row_composite("logsumexp")
logsumexp.__doc__ = "torch.logsumexp over the last dim (per row)."


def silu(x):
    """x * sigmoid(x), like torch.nn.functional.silu."""
    return x * sigmoid(x)


def gelu(x, approximate: str = "none"):
    """torch.nn.functional.gelu, with approximate='none' (erf) or 'tanh'."""
    if approximate == "tanh":
        return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    if approximate != "none":
        raise ValueError(f"tilefuse.gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return 0.5 * x * (1.0 + erf(x * 0.7071067811865476))


def softplus(x, beta=1.0, threshold=20.0):
    """torch.nn.functional.softplus: log1p(exp(beta * x)) / beta, or x where
    beta * x > threshold."""
    x = _as_value(x, "softplus")
    proto = _floating(x)
    trace, computed = x._trace, _computed(x, proto)
    beta, threshold = (_computed(_as_value(v, "softplus"), proto) for v in (beta, threshold))
    return Value(trace, trace.builder.softplus(computed, beta, threshold), proto)


def clamp(x, min=None, max=None):  # noqa: A002 - torch's names
    """torch.clamp: either bound may be None (not both); numbers or values."""
    if min is None and max is None:
        raise ValueError("tilefuse.clamp: at least one of min and max must be given")
    x = _as_value(x, "clamp")
    bounds = [None if b is None else _as_value(b, "clamp") for b in (min, max)]
    proto = functools.reduce(_result_type, [b._proto for b in bounds if b is not None], x._proto)
    low, high = (None if b is None else _computed(b, proto) for b in bounds)
    return Value(x._trace, x._trace.builder.clamp(_computed(x, proto), low, high), proto)


def pow(base, exponent):  # noqa: A001 - torch's name
    """base ** exponent, like torch.pow: either may be a value or a number
    (x ** 2 is x * x, as torch computes it)."""
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool) and exponent == 2:
        return square(base)
    trace = _active_trace("pow")
    base, exponent = _as_value(base, "pow"), _as_value(exponent, "pow")
    proto = _result_type(base._proto, exponent._proto)
    if not _proto_dtype(proto).is_floating_point:
        raise _unsupported(f"an integer power ({base.dtype} ** {exponent.dtype}); cast "
                           "the base to a float dtype")
    return Value(trace, trace.builder.binary("pow", _computed(base, proto),
                                             _computed(exponent, proto)), proto)


def maximum(a, b):
    """Elementwise maximum, NaN-propagating like torch.maximum."""
    return _arithmetic("maximum", _as_value(a, "maximum"), _as_value(b, "maximum"))


def minimum(a, b):
    """Elementwise minimum, NaN-propagating like torch.minimum."""
    return _arithmetic("minimum", _as_value(a, "minimum"), _as_value(b, "minimum"))


def where(condition, a, b):
    """torch.where(condition, a, b); a and b may be values or numbers."""
    condition = _as_value(condition, "where")
    if condition.dtype != torch.bool:
        raise TypeError(f"tilefuse.where: condition must be a bool mask (a comparison), "
                        f"got {condition.dtype}")
    a, b = _as_value(a, "where"), _as_value(b, "where")
    values = _result_type(a._proto, b._proto)
    proto = _promoted_category(values, condition._proto, _proto_dtype(values))
    trace = condition._trace
    return Value(trace, trace.builder.where(condition._value, _computed(a, proto),
                                            _computed(b, proto)), proto)


def cast(x, dtype: torch.dtype):
    """Converts the element type (like Tensor.to(dtype)); the result has
    that dtype, outputs included."""
    x = _as_value(x, "cast")
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"tilefuse.cast: unsupported dtype {dtype}")
    return _cast(x, dtype)


def item(x):
    """Like Tensor.item(): a scalar (a 0-d tensor's value) as a Python
    number, which computes in float64 with other numbers (see Value)."""
    x = _as_value(x, "item")
    if x.kind != "scalar":
        raise TypeError(f"tilefuse.item takes a scalar, got a {x.kind} value")
    proto = _number_proto(x.dtype)
    return Value(x._trace, _computed(x, proto), proto)


def fma(a, b, c):
    """a * b + c, rounded once, in the dtype PyTorch gives the three."""
    trace = _active_trace("fma")
    a, b, c = (_as_value(v, "fma") for v in (a, b, c))
    proto = functools.reduce(_result_type, (b._proto, c._proto), a._proto)
    if not _proto_dtype(proto).is_floating_point:
        raise _unsupported(f"fma of {a.dtype}, {b.dtype} and {c.dtype} values (it is for floats)")
    return Value(trace, trace.builder.fma(*(_computed(v, proto) for v in (a, b, c))), proto)


# torch's pointwise ops as its CPU kernels round them (one FMA where they
# use one), so that a fusion repeats a torch computation bit for bit.

def add(input, other, alpha=1):  # noqa: A002 - torch's names
    """torch.add(input, other, alpha=alpha): input + alpha * other."""
    if _is_number(alpha) and alpha == 1:
        return input + other
    return fma(alpha, other, input)


def addcmul(input, tensor1, tensor2, value=1):  # noqa: A002
    """torch.addcmul: input + value * tensor1 * tensor2."""
    return fma(value * tensor1, tensor2, input)


def addcdiv(input, tensor1, tensor2, value=1):  # noqa: A002
    """torch.addcdiv: input + value * tensor1 / tensor2."""
    return input + value * tensor1 / tensor2


def lerp(start, end, weight):
    """torch.lerp(start, end, weight), as torch rounds it: a scalar weight in
    start's dtype, start + weight * (end - start) for |weight| < 0.5, else
    end - (end - start) * (1 - weight)."""
    start = _as_value(start, "lerp")
    weight = _as_value(weight, "lerp")
    if weight.kind == "scalar":
        proto = _tensor_proto(start.dtype, True)
        weight = Value(weight._trace, _computed(weight, proto), proto)
    small = abs(weight) < 0.5
    return fma(where(small, weight, weight - 1), end - start, where(small, start, end))


def _reduction(kind):
    def function(x, dim: int = -1):
        x = _as_value(x, kind)
        if dim not in (-1, 0):
            raise ValueError(
                f"tilefuse.{kind}: dim must be -1 (over each row) or 0 (over "
                f"the rows, per column), got {dim}")
        dtype = x.dtype
        if kind == "mean" and not dtype.is_floating_point:
            raise TypeError(f"tilefuse.mean: needs a float input, got {dtype}; cast it first")
        if kind == "sum" and not dtype.is_floating_point:
            dtype = torch.int64  # as torch.sum
        builder = x._trace.builder
        if dim == 0 and kind in ("max", "min"):
            x._trace.column_extremes.append(kind)
        if dtype == torch.bool:  # any / all, as torch.amax / amin of a mask
            if dim == 0:  # a per-column output is the column reduction itself
                raise _unsupported(f"{kind} over the rows (dim=0) of a bool mask; reduce "
                                   "tilefuse.cast(mask, torch.int32) instead")
            counts = _tensor_proto(torch.int32, False)
            extreme = builder.reduce(kind, _computed(x, counts), dim == 0)
            return Value(x._trace, builder.compare("ne", extreme, builder.scalar_like(0, extreme)),
                         _tensor_proto(torch.bool, False))
        proto = _tensor_proto(dtype, False)
        return Value(x._trace, builder.reduce(kind, _computed(x, proto), dim == 0), proto)
    function.__name__ = kind
    function.__doc__ = (f"{kind} over the last dim (dim=-1, per row) or over the "
                        "rows (dim=0, per column).")
    return function


sum = _reduction("sum")  # noqa: A001 - torch's name
max = _reduction("max")  # noqa: A001
min = _reduction("min")  # noqa: A001
mean = _reduction("mean")


def _arg_reduction(kind):
    def function(x, dim: int = -1):
        x = _as_value(x, f"arg{kind}")
        if dim != -1:
            raise ValueError(f"tilefuse.arg{kind}: dim must be -1 (over each row), got {dim}")
        # Integers compare as integers (a float would round those past
        # 2^24 or 2^53 into ties); a mask as a float.
        proto = x._proto if x.dtype in (torch.int32, torch.int64) else _floating(x)
        return Value(x._trace, x._trace.builder.arg_reduce(kind, _computed(x, proto)),
                     _tensor_proto(torch.int64, False))
    function.__name__ = f"arg{kind}"
    function.__doc__ = (f"The column of each row's {kind}imum (the first among ties; NaN "
                        f"counts as the {kind}imum), like torch.arg{kind}(x, dim=-1).")
    return function


argmax = _arg_reduction("max")
argmin = _arg_reduction("min")


def gather(source, index):
    """source[row, index[row]] for each row (index: per-row integers). An
    index outside [0, n) raises IndexError after the call, as torch.gather
    does (on a GPU the check waits for the kernel: one sync per call)."""
    source = _as_value(source, "gather")
    index = _as_value(index, "gather")
    if index.dtype.is_floating_point or index.dtype == torch.bool:
        raise TypeError(f"tilefuse.gather: index must be an integer value, got {index.dtype}")
    trace = source._trace
    trace.gather_indices.append(index)
    return Value(trace, trace.builder.gather(_computed(source, source._proto), index._value),
                 source._proto)


def iota():
    """The column index 0..n-1, per column (int64)."""
    trace = _active_trace("iota()")
    return Value(trace, trace.builder.iota(), _tensor_proto(torch.int64, False))


#===----------------------------------------------------------------------===#
# Calls
#===----------------------------------------------------------------------===#

def _is_number(arg) -> bool:
    # A SymInt: an int torch.compile traces as dynamic (its second value).
    return isinstance(arg, (int, float, torch.SymInt)) and not isinstance(arg, bool)


def _number_dtype(arg) -> str:
    return "f64" if isinstance(arg, float) else "i64"


def _classify(name: str, args: tuple, parameters: list[str]):
    """The kind, dtype and value of each argument ("static" for trace-time
    constants; "pointer" for a 0-d tensor read on the tensors' device,
    "scalar0d" for one whose value is taken: on another device, or in a call
    autograd records), the fusion's compute type, and (n, leading shape,
    device)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.dim() > 0]
    if not tensors:
        raise ValueError(f"tilefuse.{name}: needs at least one tensor argument with a last dimension")
    reference = builtins.max(tensors, key=lambda t: t.dim())
    reference_name = next(p for p, a in zip(parameters, args) if a is reference)
    n, lead = reference.shape[-1], tuple(reference.shape[:-1])
    device = reference.device
    compute = "f64" if any(t.dtype == torch.float64 for t in tensors) else "f32"
    specs = []
    for parameter, arg in zip(parameters, args):
        if _is_number(arg):
            specs.append(("scalar", _number_dtype(arg), arg))
            continue
        if not isinstance(arg, torch.Tensor):
            try:
                hash(arg)
            except TypeError:
                raise TypeError(f"tilefuse.{name}: argument '{parameter}' must be a tensor, a "
                                f"number or a hashable trace-time constant, got "
                                f"{type(arg).__name__}") from None
            specs.append(("static", arg, arg))
            continue
        if arg.dtype not in DTYPE_NAMES:
            raise TypeError(f"tilefuse.{name}: argument '{parameter}' has unsupported dtype {arg.dtype}")
        if arg.dim() == 0:
            if arg.dtype == torch.bool:
                raise TypeError(f"tilefuse.{name}: argument '{parameter}' is a 0-d bool tensor; "
                                "pass a Python bool (a trace-time constant)")
            by_value = arg.device != device or arg.requires_grad or _records_graph(tensors)
            specs.append(("scalar0d" if by_value else "pointer", DTYPE_NAMES[arg.dtype], arg))
            continue
        if arg.device != device:
            raise ValueError(f"tilefuse.{name}: argument '{parameter}' is on {arg.device}, "
                             f"but '{reference_name}' is on {device}")
        shape = tuple(arg.shape)
        is_float = arg.dtype in FLOAT_STORAGE
        if shape == (*lead, n):
            kind = "full"
        elif shape == (n,) and (is_float or shape != lead):
            kind = "col"
        elif shape == lead:
            kind = "row"
        else:
            raise ValueError(
                f"tilefuse.{name}: argument '{parameter}' has shape {list(shape)}; expected "
                f"{list((*lead, n))} (full), [{n}] (per column) or {list(lead)} (per row)")
        specs.append((kind, DTYPE_NAMES[arg.dtype], arg))
    return specs, compute, n, lead, device


def _scalar_dtype(where: str, tensor: torch.Tensor) -> str:
    """The fuse dtype of a scalar read through a pointer."""
    if tensor.dtype not in DTYPE_NAMES:
        raise TypeError(f"{where} has unsupported dtype {tensor.dtype}")
    return DTYPE_NAMES[tensor.dtype]


def _records_graph(tensors) -> bool:
    """Whether autograd records a call on `tensors`."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class per_tensor:  # noqa: N801 - reads as a function at call sites
    """One scalar per row set of a `multi_tensor` call: a list of 0-d
    tensors (an optimizer's per-parameter step count), each read on the
    device."""

    __slots__ = ("tensors",)

    def __init__(self, tensors):
        self.tensors = list(tensors)


class _Compiled:
    """A trace: the fusion, its launch handle, its outputs (name, kind,
    dtype), and how autograd runs it (C++ FusionDerivative, derived on first
    use)."""

    __slots__ = ("fusion", "handle", "outputs", "index_checks", "column_extremes",
                 "_derivative")

    def __init__(self, fusion, inplace=(), pointers=(), index_checks: tuple = (),
                 column_extremes: tuple = ()):
        """`inplace`: (output, input) index pairs written in place;
        `pointers`: a flag per input, for scalars read through pointers."""
        self.fusion = fusion
        self.handle = fusion.launch_handle(list(inplace), list(pointers))
        self.outputs = fusion.outputs
        self.index_checks = index_checks  # see Fusion._index_checks
        self.column_extremes = column_extremes  # max/min over the rows: need a row
        self._derivative = None

    @property
    def derivative(self) -> dict:
        """differentiable (input indices), saved_outputs, forward_outputs."""
        if self._derivative is None:
            self._derivative = self.fusion.derivative()
        return self._derivative

    @property
    def differentiable(self) -> bool:
        """Whether the fusion has a float output and an input with gradients."""
        floats = any(TORCH_DTYPES[dtype].is_floating_point for _, _, dtype in self.outputs)
        return floats and any(kind in ("full", "row", "col") and dtype in ("f32", "f16", "bf16", "f64")
                              for _, kind, dtype in self.fusion.inputs)


# Fusions by key: what torch.compile's and torch.export's graphs name them by.
_REGISTRY: dict[str, "Fusion"] = {}
_REGISTRY_LOCK = threading.Lock()


@functools.cache
def _file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as file:
            return hashlib.sha256(file.read()).hexdigest()
    except OSError:
        return None


def _code_text(code) -> str:
    """A function's compiled code (two functions on one line differ)."""
    return "|".join([code.co_code.hex(), repr(code.co_names), *(
        _code_text(const) if inspect.iscode(const) else repr(const)
        for const in code.co_consts)])


def _identity(value, depth: int = 0) -> str | None:
    """Text that is the same for `value` in every process running the same
    source, None where there is none: a literal or dtype, or a function's
    file (its source where it has no file), qualified name, defaults and
    closure."""
    if isinstance(value, torch.dtype):
        return repr(value)
    if isinstance(value, Fusion):
        return value._key
    if not callable(value):
        try:
            return repr(value) if ast.literal_eval(repr(value)) == value else None
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    if inspect.ismethod(value):  # its object's identity too
        owner = _identity(value.__self__, depth + 1)
        return None if owner is None else f"{owner}\n{_identity(value.__func__, depth + 1)}"
    code = getattr(value, "__code__", None)
    if code is None or depth > 8:
        return None
    source = _file_digest(code.co_filename)
    if source is None:
        try:
            source = inspect.getsource(value)
        except (OSError, TypeError):
            return None
    parts = [source, value.__qualname__, _code_text(code)]
    try:
        captured = [*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values(),
                    *(cell.cell_contents for cell in value.__closure__ or ())]
    except ValueError:  # a closure cell not yet assigned
        return None
    for capture in captured:
        part = _identity(capture, depth + 1)
        if part is None:
            return None
        parts.append(part)
    return "\n".join(parts)


def _register(fusion: "Fusion") -> str:
    """The fusion's key: its name and a digest of its code (_identity), the
    same in each process that defines it from the same source, so that a
    graph torch.compile cached on disk or torch.export saved calls the fusion
    it traced, or fails to find it; unique in this process (a function
    without such an identity, a closure over a tensor say, gets a random
    one)."""
    identity = _identity(fusion._fn)
    if identity is None:
        identity = uuid.uuid4().hex
    identity += f"\n{fusion._name}\n{sorted(fusion._inplace.items())}"
    base = f"{fusion._name}-{hashlib.sha256(identity.encode()).hexdigest()[:16]}"
    with _REGISTRY_LOCK:
        key, copy = base, 0
        while key in _REGISTRY:
            copy += 1
            key = f"{base}-{copy}"
        _REGISTRY[key] = fusion
    return key


def _registered(key: str) -> "Fusion":
    fusion = _REGISTRY.get(key)
    if fusion is None:
        raise RuntimeError(f"tilefuse.run_fusion: no fusion '{key}' is defined in this process "
                           "(a saved graph calls it: define it from the same source first, by "
                           "importing the module that defines it)")
    return fusion


_launch_fusion = torch.ops.tilefuse.launch_fusion.default
_launch_fusion_ = torch.ops.tilefuse.launch_fusion_.default
_launch_multi_tensor = torch.ops.tilefuse.launch_multi_tensor.default
_MAX_PLANS = 1024


class Fusion:
    """A traced fusion: call it like the decorated function (positional or
    keyword arguments, defaults applied). Eager calls run the kernel through
    the C++ op `tilefuse::launch_fusion`, which records the derived backward
    when an input needs a gradient (`tilefuse::launch_fusion_` where the
    fusion writes `inplace` outputs); under torch.compile calls go through the
    `tilefuse::run_fusion` custom op (its fake implementation traces on
    metadata alone, its autograd formula runs the derived backward)."""

    def __init__(self, fn, name: str | None = None, inplace=None):
        self._fn = fn
        self._name = name or getattr(fn, "__name__", type(fn).__name__)  # a partial's
        self._signature = inspect.signature(fn)
        for parameter in self._signature.parameters.values():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                raise TypeError(f"tilefuse.fusion {self._name}: *args and **kwargs are not "
                                f"supported ('{parameter.name}'); name every argument")
        self._parameters = list(self._signature.parameters)
        # {parameter: output}; a list of names: outputs named as parameters.
        self._inplace = dict(inplace) if isinstance(inplace, dict) else \
            {name: name for name in inplace or ()}
        for parameter in self._inplace:
            if parameter not in self._parameters:
                raise ValueError(f"tilefuse.fusion {self._name}: inplace names '{parameter}', "
                                 f"which is not a parameter ({', '.join(self._parameters)})")
        outputs = list(self._inplace.values())
        for output in outputs:
            if outputs.count(output) > 1:
                shared = [p for p, o in self._inplace.items() if o == output]
                raise ValueError(f"tilefuse.fusion {self._name}: inplace writes output "
                                 f"'{output}' over {' and '.join(map(repr, shared))}; one "
                                 "output overwrites one input")
        self._traces: dict[tuple, _Compiled] = {}
        self._multi_traces: dict[tuple, _Compiled] = {}
        # Argument metadata -> how to launch (skips classifying again).
        self._plans: dict[tuple, tuple] = {}
        self._structure: tuple[list[str], str] | None = None
        self._key = _register(self)
        functools.update_wrapper(self, fn)

    def _bind(self, args, kwargs, call: str = "") -> list:
        """Every argument in parameter order, defaults filled in (`call`:
        the method bound for, as errors name it)."""
        if not kwargs and len(args) == len(self._parameters):
            return list(args)
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"tilefuse.{self._name}{call}: {error}") from None
        bound.apply_defaults()
        return list(bound.arguments.values())

    # Tracing runs the builder (C++), which torch.compile does not trace;
    # its dtype protos are real tensors (cached across traces), so no fake
    # mode of torch.compile's may be active while it runs.
    @torch.compiler.disable
    @_outside_fake_mode
    def _trace(self, specs, compute: str) -> _Compiled:
        trace = _Trace(self._name, compute)
        builder = trace.builder
        values = []
        for parameter, (kind, dtype, arg) in zip(self._parameters, specs):
            if kind == "static":
                values.append(arg)
                continue
            if kind == "scalar":
                proto = _number_proto(TORCH_DTYPES[dtype])
                values.append(Value(trace, builder.input(parameter, "scalar", dtype), proto))
                continue
            zero_dim = kind in ("scalar0d", "pointer", "per_tensor")
            torch_dtype = TORCH_DTYPES[dtype]
            declared = _computation(torch_dtype, trace) if zero_dim else dtype
            value = builder.input(parameter, "scalar" if zero_dim else kind, declared)
            proto = _tensor_proto(torch_dtype, zero_dim)
            if value.dtype != _computation(torch_dtype, trace):
                value = builder.cast(value, _computation(torch_dtype, trace))
            values.append(Value(trace, value, proto, parameter))
        positional, keywords = [], {}
        for parameter, value in zip(self._signature.parameters.values(), values):
            if parameter.kind == parameter.KEYWORD_ONLY:
                keywords[parameter.name] = value
            else:
                positional.append(value)
        _tracing.trace = trace
        try:
            result = self._fn(*positional, **keywords)
        finally:
            _tracing.trace = None
        if isinstance(result, dict):
            names, results, shape = list(result), list(result.values()), "dict"
        elif isinstance(result, tuple):
            names = [f"out{i}" for i in range(len(result))]
            results, shape = list(result), "tuple"
        else:
            names, results, shape = ["out0"], [result], "single"
        taken = set(self._parameters)
        written = {output: parameter for parameter, output in self._inplace.items()}
        for name, value in zip(names, results):
            if not isinstance(value, Value):
                raise TypeError(f"tilefuse.fusion {self._name}: output '{name}' is a "
                                f"{type(value).__name__}, not a traced value")
            # An output may share an input's name ({"param": ...} of an
            # optimizer step); the kernel's names must differ.
            port = name
            while port in taken:
                port += "_out"
            taken.add(port)
            # Stored in the dtype PyTorch would give it; written in place, in
            # its input's, as torch's in-place ops cast (p.sub_(g) of a bf16
            # p and an f32 g).
            dtype = value.dtype
            if name in written:
                kind, input_dtype, _ = specs[self._parameters.index(written[name])]
                if kind in ("full", "row", "col") and TORCH_DTYPES[input_dtype] != dtype:
                    if not torch.can_cast(dtype, TORCH_DTYPES[input_dtype]):
                        # torch's error for p.sub_(g) of an int p, float g
                        raise RuntimeError(f"tilefuse.{self._name}: result type {dtype} of "
                                           f"output '{name}' can't be cast to the dtype of "
                                           f"'{written[name]}', {TORCH_DTYPES[input_dtype]}, "
                                           "which it is written over")
                    dtype = TORCH_DTYPES[input_dtype]
            stored = value._value
            if stored.dtype != DTYPE_NAMES[dtype]:
                stored = builder.cast(stored, DTYPE_NAMES[dtype])
            builder.output(port, stored)
        index_checks = self._index_checks(trace, len(names))
        try:
            fusion = builder.finish()
        except ValueError as error:
            raise ValueError(f"tilefuse.fusion {self._name}: {error}") from None
        if self._structure not in (None, (names, shape)):
            raise TypeError(f"tilefuse.fusion {self._name}: returns {shape} {names} for "
                            f"these arguments but {self._structure[1]} "
                            f"{self._structure[0]} for earlier ones; a fusion's outputs "
                            "must not depend on its arguments' kinds")
        self._structure = (names, shape)
        # The kernel's inputs are the arguments but trace-time constants.
        port = {}
        for index, (kind, _, _) in enumerate(specs):
            if kind != "static":
                port[index] = len(port)
        return _Compiled(fusion, [(o, port[i]) for o, i in self._inplace_pairs(specs)],
                         [kind == "pointer" for kind, _, _ in specs if kind != "static"],
                         index_checks, tuple(trace.column_extremes))

    def _inplace_pairs(self, specs) -> list[tuple[int, int]]:
        """(output, argument) index pairs of the outputs written in place."""
        names = self._structure[0]
        pairs = []
        for parameter, output in self._inplace.items():
            if output not in names:
                raise ValueError(f"tilefuse.fusion {self._name}: inplace maps '{parameter}' to "
                                 f"'{output}', which is not an output ({', '.join(names)})")
            index = self._parameters.index(parameter)
            if specs[index][0] not in ("full", "row", "col"):
                raise TypeError(f"tilefuse.fusion {self._name}: '{parameter}' is written in "
                                f"place and must be a tensor, got a {specs[index][0]}")
            pairs.append((names.index(output), index))
        return pairs

    def _index_checks(self, trace: _Trace, outputs: int) -> tuple:
        """How each gather's index is checked against [0, n) after a call:
        an index that is an argument is checked as given, ("argument",
        position, name); a computed one becomes an extra per-row output
        that the call checks and drops, ("output", position, None)."""
        checks = []
        for index in trace.gather_indices:
            if index.kind != "row" or index._value.dtype not in ("i32", "i64"):
                continue  # the verifier rejects this gather
            if index._argument is not None:
                position = self._parameters.index(index._argument)
                checks.append(("argument", position, index._argument))
            else:
                builder = trace.builder
                builder.output(f"gather_index{len(checks)}", builder.cast(index._value, "i64"))
                checks.append(("output", outputs, None))
                outputs += 1
        return tuple(checks)

    def _compiled_for(self, args) -> tuple[_Compiled, list, tuple, int]:
        """The trace for `args` (traced on first use), their specs, the
        leading shape and n."""
        specs, compute, n, lead, device = _classify(self._name, tuple(args), self._parameters)
        signature = tuple((kind, dtype) for kind, dtype, _ in specs)
        compiled = self._traces.get(signature)
        if compiled is None:
            compiled = self._traces[signature] = self._trace(specs, compute)
        return compiled, specs, lead, n, device

    def _execute(self, args: list, in_place: bool = True) -> list[torch.Tensor]:
        """Traces (once per signature), then runs the outputs (with
        `in_place` False, every one to a new tensor)."""
        compiled, specs, lead, n, device = self._compiled_for(args)
        written = dict(self._inplace_pairs(specs)) if in_place else {}
        if device.type == "meta":  # the C++ op checks the others' rows
            if compiled.column_extremes and math.prod(lead) == 0:  # as torch.amax(x, 0)
                raise IndexError(f"tilefuse.{self._name}: {compiled.column_extremes[0]} over "
                                 "the rows (dim=0) of zero rows: expected reduction dim 0 to "
                                 "have non-zero size")
            outputs = _empty_outputs(compiled.outputs, lead, n, device)
            return [args[written[o]] if o in written else output
                    for o, output in enumerate(outputs)]
        for parameter, (kind, _, arg) in zip(self._parameters, specs):
            if kind == "scalar0d" and arg.requires_grad:
                raise TypeError(f"tilefuse.{self._name}: argument '{parameter}' is a 0-d tensor "
                                "that requires grad; scalar arguments have no gradient (detach "
                                "it, or pass it as a tensor of the leading shape)")
        # What each argument becomes: a tensor (as given when written in
        # place: a copy would not be), a number, a 0-d tensor's number, a
        # scalar read through a pointer, or nothing (a trace-time constant).
        updated = set(written.values())
        actions = ["inplace" if index in updated else
                   {"scalar": "number", "scalar0d": "item", "static": "static",
                    "pointer": "pointer"}.get(kind, "tensor")
                   for index, (kind, _, _) in enumerate(specs)]
        if len(self._plans) >= _MAX_PLANS:  # many distinct batch shapes
            self._plans.clear()
        plan = (self, compiled, written, actions, lead, n, device)
        if in_place:
            self._plans[_plan_key(args)] = plan
        return _run(plan, args)

    def __call__(self, *args, **kwargs):
        compiling = torch.compiler.is_compiling()
        # Eager positional calls like an earlier one go straight to the kernel.
        try:
            plan = None if compiling or kwargs else self._plans.get(_plan_key(args))
        except TypeError:  # an unhashable argument: _classify says which
            plan = None
        if plan is not None:
            outputs = _run(plan, args)
        else:
            args = self._bind(args, kwargs)
            outputs = self._compiled_call(args) if compiling else self._execute(args)
        return self._shaped(outputs)

    def _shaped(self, outputs):
        """The outputs as the function returned them: one, a tuple or a dict."""
        names, shape = self._structure
        if shape == "dict":
            return dict(zip(names, outputs))
        if shape == "tuple":
            return tuple(outputs[:len(names)])  # less the gathers' index outputs
        return outputs[0]

    def _compiled_call(self, args) -> list[torch.Tensor]:
        """Through the tilefuse::run_fusion custom op, which torch.compile
        keeps in its graph (its fake implementation needs only metadata)."""
        tensors, floats, ints, layout, statics = [], [], [], [], []
        for parameter, arg in zip(self._parameters, args):
            if isinstance(arg, torch.Tensor):
                layout.append("t")
                tensors.append(arg)
            elif isinstance(arg, float):
                layout.append("f")
                floats.append(arg)
            elif _is_number(arg):
                layout.append("i")
                ints.append(arg)
            else:
                layout.append("s")
                statics.append(arg)
        layout, statics = "".join(layout), repr(tuple(statics))
        differentiable = not self._inplace and torch.is_grad_enabled() and any(
            t.requires_grad for t in tensors if t.dtype.is_floating_point)
        outputs = torch.ops.tilefuse.run_fusion(self._key, layout, statics,
                                                tensors, floats, ints, differentiable)
        outputs = outputs[:len(self._structure[0])] if self._structure else outputs
        # Outputs written in place: run_fusion is functional (a mutating
        # custom op cannot return a list), then copied into their inputs,
        # which torch.compile's functionalization sees.
        written = dict(self._inplace_pairs_by_output())
        for o, index in written.items():
            args[index].copy_(outputs[o])
        return [args[written[o]] if o in written else output
                for o, output in enumerate(outputs)]

    def _inplace_pairs_by_output(self):
        names = self._structure[0]
        return [(names.index(output), self._parameters.index(parameter))
                for parameter, output in self._inplace.items()]

    def multi_tensor(self, *args, skip_if: torch.Tensor | None = None, **kwargs):
        """Runs this elementwise fusion over lists of tensors: the i-th tensor
        of every list forms one row set (tensors of one shape, any shape per
        set, any number of sets). Each argument is a list of tensors, a
        number, a 0-d tensor (read on the device) or `tilefuse.per_tensor`
        (one 0-d tensor per set). Sets run in one launch per (dtypes,
        alignment class) and table of tensors on a GPU, one parallel loop on
        the CPU; the kernel never depends on the tensors' sizes. Float lists
        compute in f32 (f64 for float64 lists) and each tensor keeps its
        dtype: a bfloat16 parameter beside float32 state is one row set.
        Outputs declared `inplace` overwrite their inputs; the others come
        back as lists (in their row set's float dtype), shaped as the
        function returns them. When `skip_if` (a one-element tensor, e.g.
        GradScaler's found_inf) is nonzero nothing is written. Arguments
        bind as in a single call (keywords, defaults)."""
        args = self._bind(args, kwargs, ".multi_tensor")
        layout, updated, tensors, scalars, scalar_tensors = [], [], [], [], []
        specs, per_tensor_lists, count, compute = [], [], None, None
        for parameter, arg in zip(self._parameters, args):
            where = f"tilefuse.{self._name}.multi_tensor: argument '{parameter}'"
            if isinstance(arg, (per_tensor, list, tuple)):
                items = arg.tensors if isinstance(arg, per_tensor) else list(arg)
                if not all(isinstance(t, torch.Tensor) for t in items):
                    raise TypeError(f"{where} must hold tensors")
                if count is not None and len(items) != count:
                    raise ValueError(f"{where} has {len(items)} tensors, the other lists {count}")
                count = len(items)
            if isinstance(arg, per_tensor):
                specs.append(("per_tensor", _scalar_dtype(where, items[0]) if items else "f32",
                              None))
                layout.append("t")
                per_tensor_lists.append(items)
            elif isinstance(arg, (list, tuple)):
                floats = {t.dtype for t in items if t.dtype in FLOAT_STORAGE}
                wide = torch.float64 in floats
                if wide and len(floats) > 1:
                    raise TypeError(f"{where} mixes float64 with other float dtypes")
                if floats and compute not in (None, "f64" if wide else "f32"):
                    raise TypeError(f"{where}: float64 lists cannot mix with other float lists")
                if floats:
                    compute = "f64" if wide else "f32"
                dtype = DTYPE_NAMES.get(items[0].dtype, "f32") if items else "f32"
                specs.append(("full", "f32" if dtype in ("f16", "bf16") else dtype, None))
                if parameter in self._inplace:
                    layout.append("u")
                    updated.extend(items)
                else:
                    layout.append("f")
                    tensors.append(items)
            elif isinstance(arg, torch.Tensor):
                if arg.dim() != 0:
                    raise TypeError(f"{where} is a tensor of shape {list(arg.shape)}; pass a "
                                    "list of tensors, or a 0-d tensor for a scalar")
                specs.append(("pointer", _scalar_dtype(where, arg), None))
                layout.append("p")
                scalar_tensors.append(arg)
            elif _is_number(arg):
                specs.append(("scalar", _number_dtype(arg), None))
                layout.append("v")
                scalars.append(arg)
            else:
                raise TypeError(f"{where} must be a list of tensors, a number, a 0-d tensor "
                                f"or tilefuse.per_tensor(...), got {type(arg).__name__}")
        if count is None:
            raise ValueError(f"tilefuse.{self._name}.multi_tensor: needs at least one list "
                             "of tensors")
        for parameter in self._inplace:
            if layout[self._parameters.index(parameter)] != "u":
                raise TypeError(f"tilefuse.{self._name}.multi_tensor: '{parameter}' is written "
                                "in place and must be a list of tensors")
        compute = compute or "f32"
        signature = (compute, tuple((kind, dtype) for kind, dtype, _ in specs))
        compiled = self._multi_traces.get(signature)
        if compiled is None:
            compiled = self._trace(specs, compute)
            for output, kind, _ in compiled.outputs:
                if kind != "full":
                    raise ValueError(f"tilefuse.{self._name}.multi_tensor: a multi-tensor "
                                     f"kernel is elementwise; output '{output}' is per {kind} "
                                     "(a reduction)")
            self._multi_traces[signature] = compiled
        # Outputs not written in place: laid out as their row set's first
        # list (an updated one if any), float ones in its float dtype.
        reference = next(list(arg) for arg, code in zip(args, layout)
                         if code == "u" or (code == "f" and "u" not in layout))
        written = dict(self._inplace_pairs_by_output())
        results, fresh = [], []
        for o, (_, _, dtype) in enumerate(compiled.outputs):
            if o in written:
                results.append(list(args[written[o]]))
                continue
            floating = dtype in ("f32", "f64")
            outputs = [torch.empty_like(like, dtype=(
                like.dtype if like.dtype in FLOAT_STORAGE else torch.float32)
                if floating else TORCH_DTYPES[dtype]) for like in reference]
            results.append(outputs)
            fresh.extend(outputs)
        flat_tensors = [t for items in tensors for t in items] + \
            [t for items in per_tensor_lists for t in items]
        _launch_multi_tensor(compiled.handle, "".join(layout), updated, fresh, flat_tensors,
                             scalars, scalar_tensors, skip_if)
        return self._shaped(results)

    @property
    def ir(self) -> list[str]:
        """The fuse IR of every trace so far."""
        return [compiled.fusion.ir for compiled in self._traces.values()]


def _empty_output(output, lead, n, device) -> torch.Tensor:
    """A new tensor for `output` (name, kind, dtype) of a call over [*lead, n]."""
    _, kind, dtype = output
    shape = {"full": (*lead, n), "row": lead, "col": (n,)}[kind]
    return torch.empty(shape, dtype=TORCH_DTYPES[dtype], device=device)


def _empty_outputs(outputs, lead, n, device) -> list[torch.Tensor]:
    return [_empty_output(output, lead, n, device) for output in outputs]


def _plan_key(args) -> tuple:
    """What classifying `args` depends on (whether autograd records the call
    decides how a 0-d tensor is read)."""
    return (torch.is_grad_enabled(),) + tuple(
        (a.shape, a.dtype, a.device, a.requires_grad) if isinstance(a, torch.Tensor)
        else type(a) if _is_number(a) else ("static", a) for a in args)


def _run(plan: tuple, args) -> list[torch.Tensor]:
    fusion, compiled, written, actions, lead, n, device = plan
    tensors, updated, scalars, scalar_tensors = [], [], [], []
    for action, arg in zip(actions, args):
        if action == "tensor":
            tensors.append(arg.contiguous())
        elif action == "inplace":
            updated.append(arg)
        elif action == "number":
            scalars.append(arg)
        elif action == "item":
            scalars.append(arg.item())
        elif action == "pointer":
            scalar_tensors.append(arg)
    try:
        if written:  # the others to new tensors
            outputs = [args[written[o]] if o in written else
                       _empty_output(output, lead, n, device)
                       for o, output in enumerate(compiled.outputs)]
            _launch_fusion_(compiled.handle, updated,
                            [output for o, output in enumerate(outputs) if o not in written],
                            tensors, scalars, scalar_tensors)
        else:
            outputs = _launch_fusion(compiled.handle, tensors, scalars, scalar_tensors)
    except (OverflowError, ValueError, RuntimeError):
        _check_scalar_ranges(fusion, args)
        raise
    _check_gather_indices(fusion._name, compiled, n, args, outputs)
    return outputs


def _check_scalar_ranges(fusion: Fusion, args) -> None:
    """After a launch failed converting its scalars: raises OverflowError
    naming the fusion and the int beyond int64 (a float beyond float32 the
    runner reports itself)."""
    for parameter, arg in zip(fusion._parameters, args):
        if isinstance(arg, int) and _is_number(arg) and not -2**63 <= arg < 2**63:
            raise OverflowError(f"tilefuse.{fusion._name}: argument '{parameter}' = {arg} "
                                "does not fit in int64") from None


def _check_gather_indices(name: str, compiled: _Compiled, n: int, args,
                          outputs: list) -> None:
    """Raises IndexError, as torch.gather does, if a gather of this call had
    an index outside [0, n). On a GPU the test waits for the kernel (one
    sync), like cross_entropy's target check."""
    for source, position, argument in compiled.index_checks:
        index = args[position] if source == "argument" else outputs[position]
        if index.numel() == 0:
            continue
        low, high = torch.aminmax(index)
        if bool((low < 0) | (high >= n)):
            row = tuple(((index < 0) | (index >= n)).nonzero()[0].tolist())
            value = index[row].item()
            what = f"argument '{argument}'" if argument else "a computed index"
            where = row[0] if len(row) == 1 else row
            raise IndexError(f"tilefuse.{name}: gather index {value} is out of bounds for "
                             f"size {n} (the last dimension) at row {where} ({what})")


@functools.lru_cache(maxsize=256)
def _literals(text: str) -> tuple:
    """The trace-time constants a compiled call carries as their repr."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise TypeError(f"tilefuse.fusion: under torch.compile, trace-time constant arguments "
                        f"must be Python literals (bool, str, None, ...), got {text}") from None


def _arguments(layout: str, statics: str, tensors, floats, ints) -> list:
    sources = {"t": iter(tensors), "f": iter(floats), "i": iter(ints),
               "s": iter(_literals(statics))}
    return [next(sources[code]) for code in layout]


def _split(name: str, args: list, specs) -> tuple[list, list]:
    """The tensors and scalars a launch takes, under torch.compile (where a
    0-d tensor's value is not known while tracing); the tensors as given
    (a launch takes them contiguous)."""
    tensors, scalars = [], []
    for (kind, _, _), arg in zip(specs, args):
        if kind == "scalar":
            scalars.append(arg)
        elif kind in ("scalar0d", "pointer"):
            raise TypeError(f"tilefuse.{name}: under torch.compile, a differentiated fusion "
                            "takes its scalar arguments as Python numbers, not 0-d tensors")
        elif kind != "static":
            tensors.append(arg)
    return tensors, scalars


@torch.library.custom_op("tilefuse::run_fusion", mutates_args=())
def _run_fusion(fusion_key: str, layout: str, statics: str, tensors: list[torch.Tensor],
                floats: list[float], ints: list[int], differentiable: bool) -> list[torch.Tensor]:
    fusion = _registered(fusion_key)
    args = _arguments(layout, statics, tensors, floats, ints)
    compiled, specs, _, n, _ = fusion._compiled_for(args)
    if not (differentiable and compiled.differentiable):
        return fusion._execute(args, in_place=False)
    # The derived forward: the outputs, then the statistics autograd saves.
    tensors, scalars = _split(fusion._name, args, specs)
    outputs = torch.ops.tilefuse.launch_fusion_forward(
        compiled.handle, [t.contiguous() for t in tensors], scalars)
    _check_gather_indices(fusion._name, compiled, n, args, outputs)
    return outputs


@_run_fusion.register_fake
def _(fusion_key, layout, statics, tensors, floats, ints, differentiable):
    fusion = _registered(fusion_key)
    compiled, _, lead, n, device = fusion._compiled_for(
        _arguments(layout, statics, tensors, floats, ints))
    outputs = compiled.outputs
    if differentiable and compiled.differentiable:
        outputs = compiled.derivative["forward_outputs"]
    return _empty_outputs(outputs, lead, n, device)


def _setup_context(ctx, inputs, output):
    fusion_key, layout, statics, tensors, floats, ints, differentiable = inputs
    # The backward returns a gradient per input, in the inputs' structure
    # (an empty list of numbers reads as a list of tensors).
    ctx.no_gradients = (None, None, None, [None] * len(tensors),
                        None if floats else [], None if ints else [], None)
    fusion = _registered(fusion_key)
    args = _arguments(layout, statics, tensors, floats, ints)
    compiled = fusion._compiled_for(args)[0]
    ctx.differentiable = differentiable and compiled.differentiable
    ctx.name, ctx.inplace = fusion._name, bool(fusion._inplace)
    count = len(compiled.outputs)
    ctx.mark_non_differentiable(*[o for o in output[count:]],
                                *[o for o in output[:count] if not o.dtype.is_floating_point])
    if not ctx.differentiable:
        return
    # Whether each needs a gradient: the arguments' (a contiguous copy of a
    # view, made while torch.compile traces, needs none). Every tensor of a
    # differentiated call is a launch tensor (_split refuses 0-d ones).
    ctx.requires = [t.requires_grad for t in tensors]
    saved = compiled.derivative["saved_outputs"]
    ctx.save_for_backward(*tensors, *[output[i] for i in saved])
    ctx.compiled, ctx.count = compiled, len(tensors)
    ctx.call = (fusion_key, layout, statics, floats, ints)
    ctx.output_meta = [(o.shape, o.dtype) for o in output[:count]]


def _backward(ctx, grads):
    if not ctx.differentiable:
        # Autograd reached a call traced with no gradient to give (torch.export
        # or torch.compile of inputs that did not require grad, run now on
        # some that do): dropping theirs would be silently wrong.
        if ctx.inplace:
            raise RuntimeError(f"tilefuse.{ctx.name}: writes in place and is not "
                               "differentiable; call it under torch.no_grad() or on tensors "
                               "that do not require grad")
        raise RuntimeError(f"tilefuse.{ctx.name}: this call was traced (torch.export, "
                           "torch.compile) with no input requiring grad, so it has no "
                           "backward; trace it with the inputs that need gradients "
                           "requiring grad")
    compiled = ctx.compiled
    saved = ctx.saved_tensors
    tensors, kept = list(saved[:ctx.count]), saved[ctx.count:]
    derivative = compiled.derivative
    forward_outputs = [None] * len(derivative["forward_outputs"])
    for index, tensor in zip(derivative["saved_outputs"], kept):
        forward_outputs[index] = tensor
    # Tensor inputs in launch order, as the fusion declares them.
    tensor_of, position = {}, 0
    for index, (_, kind, _) in enumerate(compiled.fusion.inputs):
        if kind != "scalar":
            tensor_of[index] = position
            position += 1
    wanted = 0
    for bit, index in enumerate(derivative["differentiable"]):
        if ctx.requires[tensor_of[index]]:
            wanted |= 1 << bit
    gradients = [g if g is not None else torch.zeros(shape, dtype=dtype, device=tensors[0].device)
                 for g, (shape, dtype) in zip(grads, ctx.output_meta)]
    key, layout, statics, floats, ints = ctx.call
    computed = iter(torch.ops.tilefuse.run_fusion_backward(
        key, layout, statics, tensors, floats, ints, wanted, gradients, forward_outputs))
    result = [None] * ctx.count
    for bit, index in enumerate(derivative["differentiable"]):
        if wanted >> bit & 1:
            result[tensor_of[index]] = next(computed)
    return (*ctx.no_gradients[:3], result, *ctx.no_gradients[4:])


_run_fusion.register_autograd(_backward, setup_context=_setup_context)


def _fusion_gradients(fusion_key: str, layout: str, statics: str, tensors: list[torch.Tensor],
                      floats: list[float], ints: list[int], wanted: int,
                      gradients: list[torch.Tensor],
                      forward_outputs: list[torch.Tensor | None]) -> list[torch.Tensor]:
    """The gradients `wanted` (a bit per differentiable input) of the
    run_fusion call with these arguments: named by the fusion's key, not by
    the kernel's handle (a number in this process), in the backward graphs
    torch.compile traces and may cache on disk."""
    fusion = _registered(fusion_key)
    args = _arguments(layout, statics, tensors, floats, ints)
    compiled, specs, _, _, _ = fusion._compiled_for(args)
    given, scalars = _split(fusion._name, args, specs)
    return torch.ops.tilefuse.launch_fusion_backward(
        compiled.handle, wanted, gradients, [t.contiguous() for t in given], forward_outputs,
        scalars)


_run_fusion_backward = torch.library.custom_op("tilefuse::run_fusion_backward",
                                               mutates_args=())(_fusion_gradients)
# On fake tensors the same: launch_fusion_backward's Meta kernel shapes them.
_run_fusion_backward.register_fake(_fusion_gradients)


def fusion(fn=None, *, name: str | None = None, inplace=None):
    """Decorator: trace `fn` into a fused kernel compiled on first call.
    `inplace` maps parameters to the outputs written over them
    ({"param": "param_out"}), or lists parameters that outputs of the same
    name overwrite (("param", "exp_avg")): such calls write no new
    tensors."""
    if fn is None:
        return lambda f: Fusion(f, name, inplace)
    return Fusion(fn, name, inplace)
