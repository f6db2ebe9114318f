"""The DSL: `@tilefuse.fusion` traces a Python function into the fuse dialect.

The first call with a given (argument kinds, dtypes, n, alignment, device)
traces the function through the C++ builder (tilefuse._C.Builder), compiles
it and caches the kernel; later calls only run it. Argument kinds come from
the call: the first tensor with the most dimensions is full `[..., n]`;
another tensor of its shape is full, of shape `[n]` per-column (per-row if it
is an integer tensor and also matches the leading dims), of the leading
shape per-row; a Python number or a 0-d tensor is a runtime scalar. A 0-d
tensor on the tensors' device is read there, through a pointer (a new value
neither recompiles nor waits for the device); Python floats are float64
scalars which, as in torch, take a tensor's dtype when combined with it.

`fusion.multi_tensor(lists...)` runs an elementwise fusion over lists of
tensors (the i-th of each list forms a row set) in a few launches, and
`@tilefuse.fusion(inplace={"param": "param_out"})` writes an output over an
input, in single and multi-tensor calls.
"""

from __future__ import annotations

import builtins
import functools
import inspect
import os
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
    a scalar). Supports + - * / ** and comparisons. Values computed from
    Python-number arguments and literals alone are numbers: as in Python
    they compute in float64 among themselves, and take the dtype of the
    value they meet otherwise, a 0-d tensor's or a tensor's (torch's rule)."""

    __slots__ = ("_builder", "_value", "_number")

    def __init__(self, builder, value, number: bool = False):
        self._builder = builder
        self._value = value
        self._number = number

    @property
    def kind(self) -> str:
        return self._value.kind

    @property
    def dtype(self) -> str:
        return self._value.dtype

    def _lift(self, other) -> "Value":
        if isinstance(other, Value):
            if other._builder is not self._builder:
                raise _unsupported("values of two different fusions")
            return other
        if isinstance(other, (bool, int, float)):
            return Value(self._builder, self._builder.scalar_like(float(other), self._value),
                         number=True)
        raise _unsupported(f"an operand of type {type(other).__name__}")

    def _operands(self, other, reverse=False):
        """Both operands, a number meeting a float 0-d tensor's value cast to
        its dtype (a tensor's dtype wins in the builder), and whether the
        result is a number."""
        a, b = self, self._lift(other)
        if reverse:
            a, b = b, a
        if a._number != b._number and a.kind == b.kind == "scalar":
            number, other_value = (a, b) if a._number else (b, a)
            if other_value.dtype in ("f16", "bf16", "f32", "f64"):
                cast_value = self._builder.cast(number._value, other_value.dtype)
                if a._number:
                    a = Value(self._builder, cast_value)
                else:
                    b = Value(self._builder, cast_value)
        return a._value, b._value, a._number and b._number

    def _binary(self, op, other, reverse=False):
        a, b, number = self._operands(other, reverse)
        return Value(self._builder, self._builder.binary(op, a, b), number)

    def _compare(self, predicate, other):
        a, b, _ = self._operands(other)
        return Value(self._builder, self._builder.compare(predicate, a, b))

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
    def __neg__(self):
        return Value(self._builder, self._builder.unary("neg", self._value), self._number)
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
        return Value(x._builder, x._builder.unary(op, x._value), x._number)
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


def item(x):
    """Like Tensor.item(): a scalar (a 0-d tensor's value) as a Python
    number, float64 from here on (see Value)."""
    x = _value(x, "item")
    if x.kind != "scalar":
        raise TypeError(f"tilefuse.item takes a scalar, got a {x.kind} value")
    return Value(x._builder, x._builder.cast(x._value, "f64"), number=True)


def fma(a, b, c):
    """a * b + c, rounded once (a scalar takes the dtype of the tensors)."""
    values = [x if isinstance(x, Value) else None for x in (a, b, c)]
    anchor = next((v for v in values if v is not None), None)
    if anchor is None:
        raise TypeError("tilefuse.fma needs a traced value")
    values = [anchor._lift(x) for x in (a, b, c)]
    tensor = next((v for v in values if v.kind != "scalar"), None)
    if tensor is not None and tensor.dtype in ("f16", "bf16", "f32", "f64"):
        values = [cast(v, TORCH_DTYPES[tensor.dtype]) if v.kind == "scalar" else v
                  for v in values]
    builder = anchor._builder
    return Value(builder, builder.fma(*(v._value for v in values)),
                 all(v._number for v in values))


# torch's pointwise ops as its CPU kernels round them (one FMA where they
# use one), so that a fusion repeats a torch computation bit for bit.

def add(input, other, alpha=1):
    """torch.add(input, other, alpha=alpha): input + alpha * other."""
    return input + other if isinstance(alpha, (int, float)) and alpha == 1 else \
        fma(alpha, other, input)


def addcmul(input, tensor1, tensor2, value=1):
    """torch.addcmul: input + value * tensor1 * tensor2."""
    return fma(value * tensor1, tensor2, input)


def addcdiv(input, tensor1, tensor2, value=1):
    """torch.addcdiv: input + value * tensor1 / tensor2."""
    return input + value * tensor1 / tensor2


def lerp(start, end, weight):
    """torch.lerp(start, end, weight): a scalar weight in start's dtype,
    start + weight * (end - start) for |weight| < 0.5, else
    end - (end - start) * (1 - weight)."""
    start = _value(start, "lerp")
    if not isinstance(weight, Value) or weight.kind == "scalar":
        weight = cast(start._lift(weight), TORCH_DTYPES[start.dtype])
    small = abs(weight) < 0.5
    return fma(where(small, weight, weight - 1), end - start, where(small, start, end))


def sign(x):
    """torch.sign: 1, -1, or 0 (for zeros and NaN, as torch gives)."""
    x = _value(x, "sign")
    return where(x > 0, 1.0, where(x < 0, -1.0, 0.0))


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
    """source[row, index[row]] for each row (index: per-row integers)."""
    source = _value(source, "gather")
    index = _value(index, "gather")
    return Value(source._builder, source._builder.gather(source._value, index._value))


def iota():
    """The column index 0..n-1, per column (int64)."""
    builder = getattr(_tracing, "builder", None)
    if builder is None:
        raise TypeError("tilefuse.iota() is only valid inside a @tilefuse.fusion function")
    return Value(builder, builder.iota())


def _number_spec(arg):
    """The spec of a Python number: a float64 scalar (bools too) or int64."""
    if isinstance(arg, bool):
        return ("scalar", "f64", float(arg))
    return ("scalar", "i64" if isinstance(arg, int) else "f64", arg)


def _pointer_dtype(name: str, parameter: str, tensor: torch.Tensor) -> str:
    """The fuse dtype of a scalar read through a pointer."""
    if tensor.dtype not in DTYPE_NAMES:
        raise TypeError(f"tilefuse.{name}: argument '{parameter}' has unsupported dtype "
                        f"{tensor.dtype}")
    return DTYPE_NAMES[tensor.dtype]


def _classify(name: str, args: tuple, parameters: list[str]):
    """The kind, dtype and tensor of each argument, and (n, leading shape,
    storage dtype, device). Kinds: full, row, col, scalar (a number) and
    pointer (a 0-d tensor on the tensors' device, read there)."""
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
            if arg.device == device:
                specs.append(("pointer", _pointer_dtype(name, parameter, arg), arg))
                continue
            arg = arg.item()  # a CPU scalar beside device tensors: its value
        if isinstance(arg, (bool, int, float)):
            specs.append(_number_spec(arg))
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
_launch_multi_tensor = torch.ops.tilefuse.launch_multi_tensor.default
_MAX_PLANS = 1024


def _declared(kind: str, dtype: str, compute: str) -> str:
    """The element type a traced input is declared with: tensors of floats
    compute in `compute` (f32, or f64 for float64 tensors); numbers are
    float64 or int64; a scalar read through a pointer keeps its tensor's
    dtype (16-bit floats widened to f32)."""
    floats = ("f32", "f16", "bf16", "f64")
    if kind == "scalar":
        return dtype
    if kind == "pointer":
        return "f32" if dtype in ("f16", "bf16") else dtype
    return compute if dtype in floats else dtype


class per_tensor:  # noqa: N801 - reads as a function at call sites
    """One scalar per row set of a `multi_tensor` call: a list of one-element
    tensors (an optimizer's per-parameter step count), each read on the
    device."""

    __slots__ = ("tensors",)

    def __init__(self, tensors):
        self.tensors = list(tensors)


class Fusion:
    """A traced fusion: call it like the decorated function. Eager calls run
    the kernel through the C++ op `tilefuse::launch_fusion`; under
    torch.compile calls go through the `tilefuse::run_fusion` custom op, so
    they stay in the graph (its fake implementation traces on metadata
    alone). `multi_tensor` applies an elementwise fusion to lists of
    tensors."""

    def __init__(self, fn, name: str | None = None, inplace: dict | None = None):
        self._fn = fn
        self._name = name or fn.__name__
        self._parameters = list(inspect.signature(fn).parameters)
        # {parameter: output}; a list of names: outputs named as parameters.
        self._inplace = dict(inplace) if isinstance(inplace, dict) else \
            {name: name for name in inplace or ()}
        for parameter in self._inplace:
            if parameter not in self._parameters:
                raise ValueError(f"tilefuse.fusion {self._name}: inplace names '{parameter}', "
                                 f"which is not a parameter ({', '.join(self._parameters)})")
        self._traces: dict[tuple, tuple] = {}
        self._multi_traces: dict[tuple, tuple] = {}
        # Argument metadata -> how to launch (skips classifying again).
        self._plans: dict[tuple, tuple] = {}
        self._structure: tuple[list[str], str] | None = None
        self._id = len(_REGISTRY)
        _REGISTRY.append(self)
        functools.update_wrapper(self, fn)

    def _trace(self, specs, compute: str):
        builder = _C.Builder(self._name, compute)
        values = []
        for parameter, (kind, dtype, _) in zip(self._parameters, specs):
            builder_kind = "scalar" if kind in ("pointer", "per_tensor") else kind
            values.append(Value(builder, builder.input(parameter, builder_kind,
                                                       _declared(kind, dtype, compute)),
                                number=kind == "scalar"))
        _tracing.builder = builder
        try:
            result = self._fn(*values)
        finally:
            _tracing.builder = None
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
            # An output named as a parameter (the one it overwrites, say) is
            # name_out in the kernel, whose ports have distinct names.
            port = name
            while port in self._parameters or (port != name and port in names):
                port += "_out"
            builder.output(port, value._value)
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
        return fusion

    def _inplace_pairs(self, specs) -> list[tuple[int, int]]:
        """(output, input) index pairs of the outputs written in place."""
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

    def _execute(self, args: list, fake: bool = False) -> list[torch.Tensor]:
        """Traces (once per signature), then runs, or under fake tensors only
        allocates, the outputs."""
        specs, n, lead, storage, device = _classify(self._name, tuple(args), self._parameters)
        signature = tuple((kind, dtype) for kind, dtype, _ in specs)
        trace = self._traces.get(signature)
        if trace is None:
            compute = "f64" if storage == torch.float64 else "f32"
            compiled = self._trace(specs, compute)
            # Floats come back in the storage dtype (per-row results too, as
            # torch's would); integers and masks as declared.
            dtypes = [storage if dtype in ("f32", "f64") else TORCH_DTYPES[dtype]
                      for _, _, dtype in compiled.outputs]
            pairs = self._inplace_pairs(specs)
            pointers = [kind == "pointer" for kind, _, _ in specs]
            handle = compiled.launch_handle(DTYPE_NAMES[storage], pairs, pointers)
            trace = self._traces[signature] = (compiled, handle, dtypes, pairs)
        compiled, handle, dtypes, pairs = trace
        if fake or device.type == "meta":
            shapes = [{"full": (*lead, n), "row": lead, "col": (n,)}[kind]
                      for _, kind, _ in compiled.outputs]
            written = dict(pairs)
            return [args[written[o]] if o in written else
                    torch.empty(shape, dtype=dtype, device=device)
                    for o, (shape, dtype) in enumerate(zip(shapes, dtypes))]
        # What each argument becomes: a tensor (as given when written in
        # place: a copy would not be), a per-row float tensor in the compute
        # dtype, a number, a scalar read through a pointer, or a CPU 0-d
        # tensor's number.
        compute = torch.float64 if storage == torch.float64 else torch.float32
        written = {index for _, index in pairs}
        actions = []
        for index, ((kind, dtype, _), arg) in enumerate(zip(specs, args)):
            if not isinstance(arg, torch.Tensor):
                actions.append("number")
            elif kind == "pointer":
                actions.append("pointer")
            elif arg.dim() == 0:
                actions.append("item")
            elif index in written:
                actions.append("inplace")
            elif kind == "row" and arg.dtype in FLOAT_STORAGE and arg.dtype != compute:
                actions.append(compute)
            else:
                actions.append("tensor")
        if len(self._plans) >= _MAX_PLANS:  # many distinct batch shapes
            self._plans.clear()
        plan = self._plans[_plan_key(args)] = (handle, actions, dtypes)
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
        return self._shaped(outputs)

    def _shaped(self, outputs):
        """The outputs as the function returned them: one, a tuple or a dict."""
        names, shape = self._structure
        if shape == "dict":
            return dict(zip(names, outputs))
        if shape == "tuple":
            return tuple(outputs)
        return outputs[0]

    def _compiled_call(self, args) -> list[torch.Tensor]:
        """Through the tilefuse::run_fusion custom op, which torch.compile
        keeps in its graph (its fake implementation needs only metadata);
        fusions that write in place through tilefuse::run_fusion_inplace,
        which declares the mutation."""
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
        if not self._inplace:
            return torch.ops.tilefuse.run_fusion(self._id, "".join(layout), tensors, floats,
                                                 ints)
        fresh = iter(torch.ops.tilefuse.run_fusion_inplace(self._id, "".join(layout), tensors,
                                                           floats, ints))
        written = dict(self._inplace_pairs_by_output())
        return [args[written[o]] if o in written else next(fresh)
                for o in range(len(self._structure[0]))]

    def _inplace_pairs_by_output(self):
        names = self._structure[0]
        return [(names.index(output), self._parameters.index(parameter))
                for parameter, output in self._inplace.items()]

    def multi_tensor(self, *args, skip_if: torch.Tensor | None = None):
        """Runs this elementwise fusion over lists of tensors: the i-th tensor
        of every list forms one row set (tensors of one shape, any shape per
        set, any number of sets). Each argument is a list of tensors, a
        number, a 0-d tensor (read on the device) or `tilefuse.per_tensor`
        (one 0-d tensor per set). Sets run in one launch per (dtype,
        alignment class) and table of tensors on a GPU, one parallel loop on
        the CPU; the kernel never depends on the tensors' sizes. Outputs
        declared `inplace` overwrite their inputs; the others come back as
        lists, shaped as the function returns them. When `skip_if` (a
        one-element tensor, e.g. GradScaler's found_inf) is nonzero nothing
        is written."""
        if len(args) != len(self._parameters):
            raise TypeError(f"tilefuse.{self._name}.multi_tensor: expected "
                            f"{len(self._parameters)} arguments, got {len(args)}")
        layout, updated, tensors, scalars, scalar_tensors = [], [], [], [], []
        specs, per_tensor_lists, count, compute = [], [], None, None
        for parameter, arg in zip(self._parameters, args):
            where = f"tilefuse.{self._name}.multi_tensor: argument '{parameter}'"
            if isinstance(arg, per_tensor) or isinstance(arg, (list, tuple)):
                items = arg.tensors if isinstance(arg, per_tensor) else list(arg)
                if not all(isinstance(t, torch.Tensor) for t in items):
                    raise TypeError(f"{where} must hold tensors")
                if count is not None and len(items) != count:
                    raise ValueError(f"{where} has {len(items)} tensors, the other lists {count}")
                count = len(items)
            if isinstance(arg, per_tensor):
                dtype = _pointer_dtype(self._name, parameter, arg.tensors[0]) if arg.tensors \
                    else "f32"
                specs.append(("per_tensor", dtype, None))
                layout.append("t")
                per_tensor_lists.append(items)
            elif isinstance(arg, (list, tuple)):
                floats = {t.dtype for t in items if t.dtype in FLOAT_STORAGE}
                wide = torch.float64 in floats
                if wide and len(floats) > 1:
                    raise TypeError(f"{where} mixes float64 with other float dtypes")
                if floats and compute is not None and compute != ("f64" if wide else "f32"):
                    raise TypeError(f"{where}: float64 lists cannot mix with other float lists")
                if floats:
                    compute = "f64" if wide else "f32"
                dtype = DTYPE_NAMES.get(items[0].dtype, "f32") if items else "f32"
                specs.append(("full", dtype if dtype not in ("f16", "bf16") else "f32", None))
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
                specs.append(("pointer", _pointer_dtype(self._name, parameter, arg), None))
                layout.append("p")
                scalar_tensors.append(arg)
            elif isinstance(arg, (bool, int, float)):
                specs.append(_number_spec(arg)[:2] + (None,))
                layout.append("v")
                scalars.append(float(arg) if isinstance(arg, bool) else arg)
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
        trace = self._multi_traces.get(signature)
        if trace is None:
            compiled = self._trace(specs, compute)
            pairs = self._inplace_pairs(specs)
            trace = self._multi_traces[signature] = (
                compiled.launch_handle(compute, pairs),
                [dtype for _, _, dtype in compiled.outputs])
        handle, output_dtypes = trace
        # Outputs not written in place: laid out as their row set's first
        # list (an updated one if any), float ones in its float dtype.
        reference = next(list(arg) for parameter, arg, code in
                         zip(self._parameters, args, layout) if code in "uf" and
                         (code == "u" or "u" not in layout))
        written = dict(self._inplace_pairs_by_output())
        results, fresh = [], []
        for o, dtype in enumerate(output_dtypes):
            if o in written:
                results.append(list(args[written[o]]))
                continue
            tensors_o = [torch.empty_like(
                like, dtype=(like.dtype if like.dtype in FLOAT_STORAGE else torch.float32)
                if dtype in ("f32", "f64") else TORCH_DTYPES[dtype]) for like in reference]
            results.append(tensors_o)
            fresh.extend(tensors_o)
        flat_tensors = [t for items in tensors for t in items] + \
            [t for items in per_tensor_lists for t in items]
        _launch_multi_tensor(handle, "".join(layout), updated, fresh, flat_tensors, scalars,
                             scalar_tensors, skip_if)
        return self._shaped(results)

    @property
    def ir(self) -> list[str]:
        """The fuse IR of every trace so far."""
        return [trace[0].ir for trace in self._traces.values()]


def _plan_key(args) -> tuple:
    """What classifying `args` depends on."""
    return tuple((a.shape, a.dtype, a.device) if isinstance(a, torch.Tensor) else type(a)
                 for a in args)


def _run(plan: tuple, args) -> list[torch.Tensor]:
    handle, actions, dtypes = plan
    tensors, scalars, scalar_tensors = [], [], []
    for action, arg in zip(actions, args):
        if action == "tensor":
            tensors.append(arg.contiguous())
        elif action == "inplace":
            tensors.append(arg)
        elif action == "number":
            scalars.append(arg)
        elif action == "pointer":
            scalar_tensors.append(arg)
        elif action == "item":
            scalars.append(arg.item())
        else:  # a per-row float tensor in another dtype than the compute one
            tensors.append(arg.to(action).contiguous())
    outputs = _launch_fusion(handle, tensors, scalars, scalar_tensors)
    return [o if o.dtype == dtype else o.to(dtype) for o, dtype in zip(outputs, dtypes)]


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


def _fresh_outputs(fusion: Fusion, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The outputs not written in place (a custom op returns no aliases)."""
    written = dict(fusion._inplace_pairs_by_output())
    return [output for o, output in enumerate(outputs) if o not in written]


@torch.library.custom_op("tilefuse::run_fusion_inplace", mutates_args=("tensors",))
def _run_fusion_inplace(fusion_id: int, layout: str, tensors: list[torch.Tensor],
                        floats: list[float], ints: list[int]) -> list[torch.Tensor]:
    fusion = _REGISTRY[fusion_id]
    return _fresh_outputs(fusion, fusion._execute(_arguments(layout, tensors, floats, ints)))


@_run_fusion_inplace.register_fake
def _(fusion_id, layout, tensors, floats, ints):
    fusion = _REGISTRY[fusion_id]
    return _fresh_outputs(fusion, fusion._execute(_arguments(layout, tensors, floats, ints),
                                                  fake=True))


def fusion(fn=None, *, name: str | None = None, inplace=None):
    """Decorator: trace `fn` into a fused kernel compiled on first call.
    `inplace` maps parameters to the outputs written over them
    ({"param": "param_out"}), or lists parameters that outputs of the same
    name overwrite (("param", "exp_avg")): such calls write no new
    tensors."""
    if fn is None:
        return lambda f: Fusion(f, name, inplace)
    return Fusion(fn, name, inplace)
