//===- GluOps.cpp - swiglu and geglu as tilefuse:: ops --------------------===//
//
// The gated activations of transformer MLPs, act(a) * b: SwiGLU (silu, the
// LLaMA MLP) and GeGLU (gelu, exact or tanh-approximated as Gemma's
// "gelu_pytorch_tanh"). Public ops (CompositeImplicitAutograd) check their
// arguments and call *_fwd: CPU and CUDA kernels, Meta kernels and an
// Autograd kernel whose backward is the fused *_bwd kernel.
//
//===----------------------------------------------------------------------===//

#include "TorchOpSupport.h"
#include "TorchRunner.h"

#include "tilefuse/Runtime/Fusion.h"
#include "tilefuse/Torch/Ops.h"

#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

using at::Tensor;
using namespace tilefuse::torch_ops;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

/// a and b of a gated activation: float tensors of one shape, dtype and
/// device, with at least one dimension.
void checkGate(const char *op, const Tensor &a, const Tensor &b) {
  checkFloat(op, "a", a);
  checkFloat(op, "b", b);
  TORCH_CHECK_VALUE(a.sym_sizes() == b.sym_sizes(), "tilefuse.", op,
                    ": 'a' and 'b' must have the same shape, got ",
                    a.sym_sizes(), " and ", b.sym_sizes());
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "tilefuse.", op,
                   ": 'a' is ", a.scalar_type(), " but 'b' is ",
                   b.scalar_type());
  TORCH_CHECK_VALUE(a.dim() > 0, "tilefuse.", op,
                    ": 'a' must have at least one dimension");
  checkSameDevice(op, "b", b, "a", a);
}

/// act(a) * b by the fused forward kernel.
Tensor runGateFwd(const char *op, BuiltinFusion &fusion, const Tensor &a,
                  const Tensor &b) {
  return runFusion(op, fusion(a.scalar_type()),
                   {a.contiguous(), b.contiguous()}, {}, a.scalar_type(),
                   a.sizes())[0];
}

/// (da, db) by the fused backward kernel.
TensorPair runGateBwd(const char *op, BuiltinFusion &fusion, const Tensor &dc,
                      const Tensor &a, const Tensor &b) {
  auto out = runFusion(op, fusion(a.scalar_type()),
                       {dc.contiguous(), a.contiguous(), b.contiguous()}, {},
                       a.scalar_type(), a.sizes());
  return {out[0], out[1]};
}

TensorPair gateBwdMeta(const Tensor &, const Tensor &a, const Tensor &b) {
  return {emptyLike(a), emptyLike(b)};
}

//===----------------------------------------------------------------------===//
// SwiGLU
//===----------------------------------------------------------------------===//

BuiltinFusion swigluFwdFusion("swiglu_fwd");
BuiltinFusion swigluBwdFusion("swiglu_bwd");

using SwigluFwdOp = Tensor(const Tensor &, const Tensor &);

const c10::TypedOperatorHandle<SwigluFwdOp> &swigluFwdOp() {
  static auto op = findOp<SwigluFwdOp>("tilefuse::swiglu_fwd");
  return op;
}

Tensor swigluFwd(const Tensor &a, const Tensor &b) {
  return runGateFwd("swiglu", swigluFwdFusion, a, b);
}

Tensor swigluFwdMeta(const Tensor &a, const Tensor &) { return emptyLike(a); }

TensorPair swigluBwd(const Tensor &dc, const Tensor &a, const Tensor &b) {
  return runGateBwd("swiglu", swigluBwdFusion, dc, a, b);
}

struct SwigluFunction : torch::autograd::Function<SwigluFunction> {
  static Tensor forward(AutogradContext *ctx, const Tensor &a,
                        const Tensor &b) {
    const auto &op = swigluFwdOp();
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({a, b});
    return op.call(a, b);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static auto op =
        findOp<TensorPair(const Tensor &, const Tensor &, const Tensor &)>(
            "tilefuse::swiglu_bwd");
    variable_list saved = ctx->get_saved_variables();
    if (!grads[0].defined())
      return {Tensor(), Tensor()};
    auto [da, db] =
        op.call(grads[0].to(saved[0].scalar_type()), saved[0], saved[1]);
    return {da, db};
  }
};

Tensor swigluFwdAutograd(const Tensor &a, const Tensor &b) {
  if (!needsGraph("swiglu", a, b)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return swigluFwdOp().call(a, b);
  }
  return SwigluFunction::apply(a, b);
}

Tensor swiglu(const Tensor &a, const Tensor &b) {
  checkGate("swiglu", a, b);
  return swigluFwdOp().call(a, b);
}

//===----------------------------------------------------------------------===//
// GeGLU
//===----------------------------------------------------------------------===//

/// geglu_fwd's `approximate`: gelu's exact form (erf) or tanh's.
enum Approximate : int64_t { Exact = 0, Tanh = 1 };

void checkApproximate(int64_t approximate) {
  TORCH_CHECK_VALUE(approximate == Exact || approximate == Tanh,
                    "tilefuse.geglu: approximate must be 0 (none) or 1 "
                    "(tanh), got ",
                    approximate);
}

BuiltinFusion gegluFwdFusion("geglu_fwd");
BuiltinFusion gegluBwdFusion("geglu_bwd");
BuiltinFusion gegluTanhFwdFusion("geglu_tanh_fwd");
BuiltinFusion gegluTanhBwdFusion("geglu_tanh_bwd");

using GegluFwdOp = Tensor(const Tensor &, const Tensor &, int64_t);

const c10::TypedOperatorHandle<GegluFwdOp> &gegluFwdOp() {
  static auto op = findOp<GegluFwdOp>("tilefuse::geglu_fwd");
  return op;
}

Tensor gegluFwd(const Tensor &a, const Tensor &b, int64_t approximate) {
  checkApproximate(approximate);
  return runGateFwd(
      "geglu", approximate == Tanh ? gegluTanhFwdFusion : gegluFwdFusion, a, b);
}

Tensor gegluFwdMeta(const Tensor &a, const Tensor &, int64_t approximate) {
  checkApproximate(approximate);
  return emptyLike(a);
}

TensorPair gegluBwd(const Tensor &dc, const Tensor &a, const Tensor &b,
                    int64_t approximate) {
  checkApproximate(approximate);
  return runGateBwd("geglu",
                    approximate == Tanh ? gegluTanhBwdFusion : gegluBwdFusion,
                    dc, a, b);
}

TensorPair gegluBwdMeta(const Tensor &dc, const Tensor &a, const Tensor &b,
                        int64_t) {
  return gateBwdMeta(dc, a, b);
}

struct GegluFunction : torch::autograd::Function<GegluFunction> {
  static Tensor forward(AutogradContext *ctx, const Tensor &a, const Tensor &b,
                        int64_t approximate) {
    const auto &op = gegluFwdOp();
    at::AutoDispatchBelowADInplaceOrView below;
    ctx->save_for_backward({a, b});
    ctx->saved_data["approximate"] = approximate;
    return op.call(a, b, approximate);
  }
  static variable_list backward(AutogradContext *ctx, variable_list grads) {
    static auto op =
        findOp<TensorPair(const Tensor &, const Tensor &, const Tensor &,
                          int64_t)>("tilefuse::geglu_bwd");
    variable_list saved = ctx->get_saved_variables();
    if (!grads[0].defined())
      return {Tensor(), Tensor(), Tensor()};
    auto [da, db] = op.call(grads[0].to(saved[0].scalar_type()), saved[0],
                            saved[1], ctx->saved_data["approximate"].toInt());
    return {da, db, Tensor()};
  }
};

Tensor gegluFwdAutograd(const Tensor &a, const Tensor &b, int64_t approximate) {
  if (!needsGraph("geglu", a, b)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return gegluFwdOp().call(a, b, approximate);
  }
  return GegluFunction::apply(a, b, approximate);
}

Tensor geglu(const Tensor &a, const Tensor &b, c10::string_view approximate) {
  checkGate("geglu", a, b);
  TORCH_CHECK_VALUE(approximate == "none" || approximate == "tanh",
                    "tilefuse.geglu: approximate must be 'none' or 'tanh', "
                    "got '",
                    approximate, "'");
  return gegluFwdOp().call(a, b, approximate == "tanh" ? Tanh : Exact);
}

} // namespace

//===----------------------------------------------------------------------===//
// The C++ API (Ops.h)
//===----------------------------------------------------------------------===//

at::Tensor tilefuse::ops::swiglu(const at::Tensor &a, const at::Tensor &b) {
  static auto op =
      findOp<Tensor(const Tensor &, const Tensor &)>("tilefuse::swiglu");
  return op.call(a, b);
}

at::Tensor tilefuse::ops::geglu(const at::Tensor &a, const at::Tensor &b,
                                std::string_view approximate) {
  static auto op =
      findOp<Tensor(const Tensor &, const Tensor &, c10::string_view)>(
          "tilefuse::geglu");
  return op.call(a, b, approximate);
}

TORCH_LIBRARY_FRAGMENT(tilefuse, m) {
  m.def("swiglu(Tensor a, Tensor b) -> Tensor");
  m.def("swiglu_fwd(Tensor a, Tensor b) -> Tensor");
  m.def("swiglu_bwd(Tensor dc, Tensor a, Tensor b) -> (Tensor, Tensor)");
  m.def("geglu(Tensor a, Tensor b, str approximate='none') -> Tensor");
  // approximate: 0 none (erf), 1 tanh.
  m.def("geglu_fwd(Tensor a, Tensor b, int approximate=0) -> Tensor");
  m.def("geglu_bwd(Tensor dc, Tensor a, Tensor b, int approximate=0) -> "
        "(Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(tilefuse, CompositeImplicitAutograd, m) {
  m.impl("swiglu", swiglu);
  m.impl("geglu", geglu);
}

#define TILEFUSE_GATE_KERNELS(key)                                             \
  TORCH_LIBRARY_IMPL(tilefuse, key, m) {                                       \
    m.impl("swiglu_fwd", swigluFwd);                                           \
    m.impl("swiglu_bwd", swigluBwd);                                           \
    m.impl("geglu_fwd", gegluFwd);                                             \
    m.impl("geglu_bwd", gegluBwd);                                             \
  }
TILEFUSE_GATE_KERNELS(CPU)
TILEFUSE_GATE_KERNELS(CUDA)

TORCH_LIBRARY_IMPL(tilefuse, Meta, m) {
  m.impl("swiglu_fwd", swigluFwdMeta);
  m.impl("swiglu_bwd", gateBwdMeta);
  m.impl("geglu_fwd", gegluFwdMeta);
  m.impl("geglu_bwd", gegluBwdMeta);
}

TORCH_LIBRARY_IMPL(tilefuse, Autograd, m) {
  m.impl("swiglu_fwd", swigluFwdAutograd);
  m.impl("geglu_fwd", gegluFwdAutograd);
  for (const char *op : {"swiglu_bwd", "geglu_bwd"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}
