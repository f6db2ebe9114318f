"""The DSL: `@tilefuse.fusion` traces a Python function into the fuse dialect.

The first call with a given (argument kinds, dtypes, n, alignment, device)
traces the function through the C++ builder (tilefuse._C.Builder), compiles
it and caches the kernel; later calls only run it. Argument kinds come from
the call: the first tensor with the most dimensions is full `[..., n]`;
another tensor of its shape is full, of shape `[n]` per-column (per-row if it
is an integer tensor and also matches the leading dims), of the leading
shape per-row; a Python number or a 0-d tensor is a runtime scalar.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import math
import os
import re
import threading

import torch

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


class Value:
    """A value of the fusion being traced (a tensor, per row, per column, or
    a scalar). Supports + - * / ** and comparisons."""

    __slots__ = ("_builder", "_value", "_argument")

    def __init__(self, builder, value, argument: str | None = None):
        self._builder = builder
        self._value = value
        self._argument = argument  # the fusion argument this value is, if any

    @property
    def kind(self) -> str:
        return self._value.kind

    @property
    def dtype(self) -> str:
        return self._value.dtype

    def _lift(self, other):
        if isinstance(other, Value):
            if other._builder is not self._builder:
                raise _unsupported("values of two different fusions")
            return other._value
        if isinstance(other, (bool, int, float)):
            return self._builder.scalar_like(float(other), self._value)
        raise _unsupported(f"an operand of type {type(other).__name__}")

    def _binary(self, op, other, reverse=False):
        a, b = self._value, self._lift(other)
        if reverse:
            a, b = b, a
        return Value(self._builder, self._builder.binary(op, a, b))

    def _compare(self, predicate, other):
        return Value(self._builder, self._builder.compare(predicate, self._value, self._lift(other)))

    def __add__(self, o): return self._binary("add", o)
    def __radd__(self, o): return self._binary("add", o, True)
    def __sub__(self, o): return self._binary("sub", o)
    def __rsub__(self, o): return self._binary("sub", o, True)
    def __mul__(self, o): return self._binary("mul", o)
    def __rmul__(self, o): return self._binary("mul", o, True)
    def __truediv__(self, o): return self._binary("div", o)
    def __rtruediv__(self, o): return self._binary("div", o, True)
    def __pow__(self, o): return self._binary("pow", o)
    def __rpow__(self, o): return self._binary("pow", o, True)
    def __neg__(self): return Value(self._builder, self._builder.unary("neg", self._value))
    def __lt__(self, o): return self._compare("lt", o)
    def __le__(self, o): return self._compare("le", o)
    def __gt__(self, o): return self._compare("gt", o)
    def __ge__(self, o): return self._compare("ge", o)
    def __eq__(self, o): return self._compare("eq", o)  # type: ignore[override]
    def __ne__(self, o): return self._compare("ne", o)  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    def __bool__(self):
        raise _unsupported("a data-dependent `if`, `and`, `or` or `not` on a traced value")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        raise _unsupported(f"torch.{name} on a traced value (use the tilefuse.* function "
                           "of the same name)")

    def __iter__(self):
        raise _unsupported("iteration over a traced value")

    def __index__(self):
        raise _unsupported("a traced value used as a Python integer")

    def __float__(self):
        raise _unsupported("a traced value used as a Python float")

    def __getitem__(self, index):
        raise _unsupported("indexing; use tilefuse.gather for one element per row")


def _value(x, function: str) -> Value:
    if not isinstance(x, Value):
        raise TypeError(
            f"tilefuse.{function} takes a traced value, got {type(x).__name__}; "
            "call it inside a @tilefuse.fusion function")
    return x


def _unary(op):
    def function(x):
        x = _value(x, op)
        return Value(x._builder, x._builder.unary(op, x._value))
    function.__name__ = op
    function.__doc__ = f"Elementwise {op}, like torch.{op}."
    return function


exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
tanh = _unary("tanh")
erf = _unary("erf")
abs = _unary("abs")  # noqa: A001 - torch's name
sigmoid = _unary("sigmoid")


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


def maximum(a, b):
    """Elementwise maximum, NaN-propagating like torch.maximum."""
    a = _value(a, "maximum")
    return a._binary("maximum", b)


def minimum(a, b):
    """Elementwise minimum, NaN-propagating like torch.minimum."""
    a = _value(a, "minimum")
    return a._binary("minimum", b)


def where(condition, a, b):
    """torch.where(condition, a, b)."""
    condition = _value(condition, "where")
    builder = condition._builder
    if not isinstance(a, Value) and not isinstance(b, Value):
        raise TypeError("tilefuse.where needs a traced value for a or b")
    like = a if isinstance(a, Value) else b
    a = a._value if isinstance(a, Value) else builder.scalar_like(float(a), like._value)
    b = b._value if isinstance(b, Value) else builder.scalar_like(float(b), like._value)
    return Value(builder, builder.where(condition._value, a, b))


def cast(x, dtype: torch.dtype):
    """Converts the element type (like Tensor.to(dtype))."""
    x = _value(x, "cast")
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"tilefuse.cast: unsupported dtype {dtype}")
    return Value(x._builder, x._builder.cast(x._value, DTYPE_NAMES[dtype]))


def _reduction(kind):
    def function(x, dim: int = -1):
        x = _value(x, kind)
        if dim not in (-1, 0):
            raise ValueError(
                f"tilefuse.{kind}: dim must be -1 (over each row) or 0 (over "
                f"the rows, per column), got {dim}")
        return Value(x._builder, x._builder.reduce(kind, x._value, dim == 0))
    function.__name__ = kind
    function.__doc__ = (f"{kind} over the last dim (dim=-1, per row) or over the "
                        "rows (dim=0, per column).")
    return function


sum = _reduction("sum")  # noqa: A001 - torch's name
max = _reduction("max")  # noqa: A001
min = _reduction("min")  # noqa: A001
mean = _reduction("mean")


def gather(source, index):
    """source[row, index[row]] for each row (index: per-row integers). An
    index outside [0, n) raises IndexError after the call, as torch.gather
    does (on a GPU the check waits for the kernel: one sync per call)."""
    source = _value(source, "gather")
    index = _value(index, "gather")
    gathers = getattr(_tracing, "gathers", None)
    if gathers is not None:
        gathers.append(index)
    return Value(source._builder, source._builder.gather(source._value, index._value))


def iota():
    """The column index 0..n-1, per column (int64)."""
    builder = getattr(_tracing, "builder", None)
    if builder is None:
        raise TypeError("tilefuse.iota() is only valid inside a @tilefuse.fusion function")
    return Value(builder, builder.iota())


def _classify(name: str, args: tuple, parameters: list[str]):
    """The kind, dtype and tensor of each argument, and (n, leading shape,
    storage dtype, device)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor) and a.dim() > 0]
    if not tensors:
        raise ValueError(f"tilefuse.{name}: needs at least one tensor argument with a last dimension")
    reference = builtins.max(tensors, key=lambda t: t.dim())
    reference_name = next(p for p, a in zip(parameters, args) if a is reference)
    n, lead = reference.shape[-1], tuple(reference.shape[:-1])
    device = reference.device
    storage = None
    specs = []
    for parameter, arg in zip(parameters, args):
        if isinstance(arg, torch.Tensor) and arg.dim() == 0:
            arg = arg.item()
        if isinstance(arg, bool):
            specs.append(("scalar", "f32", float(arg)))
            continue
        if isinstance(arg, (int, float)):
            specs.append(("scalar", "i64" if isinstance(arg, int) else "f32", arg))
            continue
        if not isinstance(arg, torch.Tensor):
            raise TypeError(f"tilefuse.{name}: argument '{parameter}' must be a tensor or a "
                            f"number, got {type(arg).__name__}")
        if arg.device != device:
            raise ValueError(f"tilefuse.{name}: argument '{parameter}' is on {arg.device}, "
                             f"but '{reference_name}' is on {device}")
        if arg.dtype not in DTYPE_NAMES:
            raise TypeError(f"tilefuse.{name}: argument '{parameter}' has unsupported dtype {arg.dtype}")
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
        if is_float and kind in ("full", "col"):
            if storage is None:
                storage = arg.dtype
            elif arg.dtype != storage:
                raise TypeError(f"tilefuse.{name}: argument '{parameter}' is {arg.dtype} but "
                                f"other tensors are {storage}; cast them to one dtype")
        specs.append((kind, DTYPE_NAMES[arg.dtype], arg))
    return specs, n, lead, storage or torch.float32, device


_REGISTRY: list["Fusion"] = []
_launch_fusion = torch.ops.tilefuse.launch_fusion.default
_MAX_PLANS = 1024


class Fusion:
    """A traced fusion: call it like the decorated function. Eager calls run
    the kernel through the C++ op `tilefuse::launch_fusion`; under
    torch.compile calls go through the `tilefuse::run_fusion` custom op, so
    they stay in the graph (its fake implementation traces on metadata
    alone)."""

    def __init__(self, fn, name: str | None = None):
        self._fn = fn
        self._name = name or fn.__name__
        self._parameters = list(inspect.signature(fn).parameters)
        self._traces: dict[tuple, tuple] = {}
        # Argument metadata -> how to launch (skips classifying again).
        self._plans: dict[tuple, tuple] = {}
        self._structure: tuple[list[str], str] | None = None
        self._id = len(_REGISTRY)
        _REGISTRY.append(self)
        functools.update_wrapper(self, fn)

    def _trace(self, specs, storage: torch.dtype):
        compute = "f64" if storage == torch.float64 else "f32"
        # The kernel's name is an identifier (a PTX entry point): "<lambda>"
        # becomes "_lambda_"; errors keep the function's own name.
        kernel_name = re.sub(r"\W|^(?=\d)", "_", self._name)
        builder = _C.Builder(kernel_name, compute)
        values = []
        for parameter, (kind, dtype, _) in zip(self._parameters, specs):
            # Floats of every kind compute in f32, or f64 for float64 tensors.
            declared = compute if dtype in ("f32", "f16", "bf16", "f64") else dtype
            values.append(Value(builder, builder.input(parameter, kind, declared), parameter))
        _tracing.builder, _tracing.gathers = builder, []
        try:
            result = self._fn(*values)
            gathers = _tracing.gathers
        finally:
            _tracing.builder = _tracing.gathers = None
        if isinstance(result, dict):
            names, results, shape = list(result), list(result.values()), "dict"
        elif isinstance(result, tuple):
            names = [f"out{i}" for i in range(len(result))]
            results, shape = list(result), "tuple"
        else:
            names, results, shape = ["out0"], [result], "single"
        for name, value in zip(names, results):
            if not isinstance(value, Value):
                raise TypeError(f"tilefuse.fusion {self._name}: output '{name}' is a "
                                f"{type(value).__name__}, not a traced value")
            builder.output(name, value._value)
        index_checks = self._index_checks(builder, gathers, len(names))
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
        return fusion, index_checks

    def _index_checks(self, builder, gathers: list, outputs: int) -> tuple:
        """How each gather's index is checked against [0, n) after a call:
        an index that is an argument is checked as given, ("argument",
        position, name); a computed one becomes an extra per-row output
        that the call checks and drops, ("output", position, None)."""
        checks = []
        for index in gathers:
            if index.kind != "row" or index.dtype not in ("i32", "i64"):
                continue  # the verifier rejects this gather
            if index._argument is not None:
                position = self._parameters.index(index._argument)
                checks.append(("argument", position, index._argument))
            else:
                builder.output(f"gather_index{len(checks)}", builder.cast(index._value, "i64"))
                checks.append(("output", outputs, None))
                outputs += 1
        return tuple(checks)

    def _execute(self, args: list, fake: bool = False) -> list[torch.Tensor]:
        """Traces (once per signature), then runs, or under fake tensors only
        allocates, the outputs."""
        specs, n, lead, storage, device = _classify(self._name, tuple(args), self._parameters)
        signature = tuple((kind, dtype) for kind, dtype, _ in specs)
        trace = self._traces.get(signature)
        if trace is None:
            compiled, checks = self._trace(specs, storage)
            # Floats come back in the storage dtype (per-row results too, as
            # torch's would); integers and masks as declared.
            dtypes = [storage if dtype in ("f32", "f64") else TORCH_DTYPES[dtype]
                      for _, _, dtype in compiled.outputs]
            handle = compiled.launch_handle(DTYPE_NAMES[storage])
            trace = self._traces[signature] = (compiled, handle, dtypes, checks)
        compiled, handle, dtypes, checks = trace
        outputs = len(self._structure[0])
        if fake or device.type == "meta":
            shapes = [{"full": (*lead, n), "row": lead, "col": (n,)}[kind]
                      for _, kind, _ in compiled.outputs[:outputs]]
            return [torch.empty(shape, dtype=dtype, device=device)
                    for shape, dtype in zip(shapes, dtypes)]
        # What each argument becomes: a tensor, a per-row float tensor in
        # the compute dtype, a number, or a 0-d tensor's number.
        compute = torch.float64 if storage == torch.float64 else torch.float32
        actions = []
        for (kind, dtype, _), arg in zip(specs, args):
            if not isinstance(arg, torch.Tensor):
                actions.append("number")
            elif arg.dim() == 0:
                actions.append("item")
            elif kind == "row" and arg.dtype in FLOAT_STORAGE and arg.dtype != compute:
                actions.append(compute)
            else:
                actions.append("tensor")
        if len(self._plans) >= _MAX_PLANS:  # many distinct batch shapes
            self._plans.clear()
        gathers = (n, outputs, checks) if checks else None
        plan = self._plans[_plan_key(args)] = (self, handle, actions, dtypes, gathers)
        return _run(plan, args)

    def __call__(self, *args):
        compiling = torch.compiler.is_compiling()
        # Eager calls like an earlier one go straight to the kernel.
        plan = None if compiling else self._plans.get(_plan_key(args))
        if plan is not None:
            outputs = _run(plan, args)
        elif len(args) != len(self._parameters):
            raise TypeError(f"tilefuse.{self._name}: expected {len(self._parameters)} "
                            f"arguments, got {len(args)}")
        elif compiling:
            outputs = self._compiled_call(args)
        else:
            outputs = self._execute(list(args))
        names, shape = self._structure
        if shape == "dict":
            return dict(zip(names, outputs))
        if shape == "tuple":
            return tuple(outputs)
        return outputs[0]

    def _compiled_call(self, args) -> list[torch.Tensor]:
        """Through the tilefuse::run_fusion custom op, which torch.compile
        keeps in its graph (its fake implementation needs only metadata)."""
        tensors, floats, ints, layout = [], [], [], []
        for parameter, arg in zip(self._parameters, args):
            if isinstance(arg, torch.Tensor):
                layout.append("t")
                tensors.append(arg)
            elif isinstance(arg, (bool, float)):
                layout.append("f")
                floats.append(float(arg))
            elif isinstance(arg, int):
                layout.append("i")
                ints.append(arg)
            else:
                raise TypeError(f"tilefuse.{self._name}: argument '{parameter}' must be a "
                                f"tensor or a number, got {type(arg).__name__}")
        return torch.ops.tilefuse.run_fusion(self._id, "".join(layout), tensors, floats, ints)

    @property
    def ir(self) -> list[str]:
        """The fuse IR of every trace so far."""
        return [compiled.ir for compiled, *_ in self._traces.values()]


def _plan_key(args) -> tuple:
    """What classifying `args` depends on."""
    return tuple((a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor) else type(a)
                 for a in args)


def _run(plan: tuple, args) -> list[torch.Tensor]:
    fusion, handle, actions, dtypes, gathers = plan
    tensors, scalars = [], []
    for action, arg in zip(actions, args):
        if action == "tensor":
            tensors.append(arg.contiguous())
        elif action == "number":
            scalars.append(arg)
        elif action == "item":
            scalars.append(arg.item())
        else:  # a per-row float tensor in another dtype than the compute one
            tensors.append(arg.to(action).contiguous())
    try:
        outputs = _launch_fusion(handle, tensors, scalars)
    except (OverflowError, RuntimeError):
        _check_scalar_ranges(fusion, actions, args)
        raise
    if gathers is not None:
        outputs = _check_gather_indices(fusion._name, gathers, args, outputs)
    return [o if o.dtype == dtype else o.to(dtype) for o, dtype in zip(outputs, dtypes)]


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _check_scalar_ranges(fusion: Fusion, actions: list, args) -> None:
    """After a launch failed converting its scalars: raises OverflowError
    naming the fusion and the argument that does not fit (an int beyond
    int64, a finite float beyond float32, which f32 fusions compute in)."""
    for parameter, action, arg in zip(fusion._parameters, actions, args):
        if action not in ("number", "item"):
            continue
        value = arg.item() if action == "item" else arg
        if isinstance(value, bool):
            continue
        if isinstance(value, int) and not -2**63 <= value < 2**63:
            raise OverflowError(f"tilefuse.{fusion._name}: argument '{parameter}' = {value} "
                                "does not fit in int64") from None
        if isinstance(value, float) and math.isfinite(value) and builtins.abs(value) > _FLOAT32_MAX:
            raise OverflowError(f"tilefuse.{fusion._name}: argument '{parameter}' = {value} "
                                "is out of range for float32, the fusion's compute dtype "
                                "(float64 tensors compute in float64)") from None


def _check_gather_indices(name: str, gathers: tuple, args, outputs: list) -> list[torch.Tensor]:
    """Raises IndexError, as torch.gather does, if a gather of this call had
    an index outside [0, n); returns the fusion's own outputs. On a GPU the
    test waits for the kernel (one sync), like cross_entropy's target check."""
    n, count, checks = gathers
    for source, position, argument in checks:
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
    return outputs[:count]


def _arguments(layout: str, tensors, floats, ints) -> list:
    sources = {"t": iter(tensors), "f": iter(floats), "i": iter(ints)}
    return [next(sources[code]) for code in layout]


@torch.library.custom_op("tilefuse::run_fusion", mutates_args=())
def _run_fusion(fusion_id: int, layout: str, tensors: list[torch.Tensor],
                floats: list[float], ints: list[int]) -> list[torch.Tensor]:
    return _REGISTRY[fusion_id]._execute(_arguments(layout, tensors, floats, ints))


@_run_fusion.register_fake
def _(fusion_id, layout, tensors, floats, ints):
    return _REGISTRY[fusion_id]._execute(_arguments(layout, tensors, floats, ints), fake=True)


def fusion(fn=None, *, name: str | None = None):
    """Decorator: trace `fn` into a fused kernel compiled on first call."""
    if fn is None:
        return lambda f: Fusion(f, name)
    return Fusion(fn, name)
