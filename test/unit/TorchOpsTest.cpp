//===- TorchOpsTest.cpp - the fused ops from C++, without Python ----------===//
//
// A LibTorch program linking libtilefuse_torch: the ops compile on first
// use, match ATen, carry autograd, and report bad input as c10 errors.
//
//===----------------------------------------------------------------------===//

#include "tilefuse/Torch/Ops.h"

#include <ATen/ops/allclose.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/full.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>

#include <gtest/gtest.h>

namespace {

void expectClose(const at::Tensor &got, const at::Tensor &want) {
  EXPECT_TRUE(at::allclose(got, want, /*rtol=*/1e-5, /*atol=*/1e-5))
      << "got\n" << got << "\nwant\n" << want;
}

TEST(TorchOps, MatchATen) {
  at::manual_seed(0);
  at::Tensor x = at::randn({5, 96}), w = at::randn({96}), b = at::randn({96});
  expectClose(tilefuse::ops::rms_norm(x, {96}, w, 1e-6),
              at::rms_norm(x, {96}, w, 1e-6));
  expectClose(tilefuse::ops::layer_norm(x, {96}, w, b),
              at::layer_norm(x, {96}, w, b));
  expectClose(tilefuse::ops::swiglu(x, b.expand({5, 96}).contiguous()),
              at::silu(x).mul(b));
  at::Tensor target = at::randint(0, 96, {5});
  expectClose(tilefuse::ops::cross_entropy(x, target),
              at::cross_entropy_loss(x, target));
}

TEST(TorchOps, GradientsThroughTheFusedBackward) {
  at::Tensor x = at::randn({4, 64}).requires_grad_();
  at::Tensor w = at::randn({64}).requires_grad_();
  at::Tensor fused = tilefuse::ops::rms_norm(x, {64}, w, 1e-6).square().sum();
  at::Tensor reference = at::rms_norm(x, {64}, w, 1e-6).square().sum();
  auto got = torch::autograd::grad({fused}, {x, w});
  auto want = torch::autograd::grad({reference}, {x, w});
  expectClose(got[0], want[0]);
  expectClose(got[1], want[1]);
}

TEST(TorchOps, AdamWStepInPlace) {
  at::Tensor param = at::ones({2, 8}), grad = at::ones({2, 8});
  at::Tensor expAvg = at::zeros({2, 8}), expAvgSq = at::zeros({2, 8});
  tilefuse::ops::adamw_step_(param, grad, expAvg, expAvgSq, /*lr=*/0.1,
                             0.9, 0.999, 1e-8, /*weightDecay=*/0.0,
                             /*step=*/1);
  // First step: m/sqrt(v) = 1, so param moves by lr.
  expectClose(param, at::ones({2, 8}).mul(0.9));
  expectClose(expAvg, at::ones({2, 8}).mul(0.1));
}

TEST(TorchOps, OptionsFromCpp) {
  at::manual_seed(0);
  at::Tensor x = at::randn({3, 2, 40}), w = at::randn({2, 40});
  // Gemma's offset over a two-dimensional normalized_shape.
  at::Tensor xf = x.view({3, 80}), wf = w.view({80}).add(1.0);
  expectClose(tilefuse::ops::rms_norm(x, {2, 40}, w, 1e-6, /*offset=*/1.0),
              at::rms_norm(xf, {80}, wf, 1e-6).view({3, 2, 40}));
  at::Tensor a = at::randn({4, 33}), b = at::randn({4, 33});
  expectClose(tilefuse::ops::geglu(a, b, "tanh"), at::gelu(a, "tanh").mul(b));
  // amsgrad: the denominator keeps the running maximum of exp_avg_sq.
  at::Tensor param = at::ones({2, 8}), grad = at::ones({2, 8});
  at::Tensor expAvg = at::zeros({2, 8}), expAvgSq = at::zeros({2, 8});
  at::Tensor maxExpAvgSq = at::full({2, 8}, 4.0);
  tilefuse::ops::adamw_step_(param, grad, expAvg, expAvgSq, /*lr=*/0.1, 0.9,
                             0.999, 1e-8, /*weightDecay=*/0.0, /*step=*/1,
                             maxExpAvgSq);
  expectClose(maxExpAvgSq, at::full({2, 8}, 4.0));
  // m_hat = 1, sqrt(v_hat) = sqrt(4 / 0.001) ~ 63.2: a step of 0.1 / 63.2.
  expectClose(param, at::ones({2, 8}).sub(0.1 / std::sqrt(4.0 / 0.001)));
}

TEST(TorchOps, BadInputIsACatchableError) {
  at::Tensor x = at::randn({2, 4});
  try {
    tilefuse::ops::rms_norm(x, {4}, at::randn({5}));
    FAIL() << "expected an error";
  } catch (const c10::ValueError &error) {
    EXPECT_NE(std::string(error.what_without_backtrace())
                  .find("tilefuse.rms_norm: argument 'weight' must have shape [4]"),
              std::string::npos);
  }
}

} // namespace
