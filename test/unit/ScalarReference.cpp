//===- ScalarReference.cpp - scalar references of the reference fusions ---===//

#include "ScalarReference.h"

#include <gtest/gtest.h>

#include "llvm/ADT/STLExtras.h"

#include <cmath>
#include <cstring>
#include <random>

using tilefuse::KernelInfo;
using tilefuse::PortInfo;
using Kind = PortInfo::Kind;

namespace tilefuse::testing {

const char *dtypeName(Dtype dtype) {
  switch (dtype) {
  case Dtype::F32: return "f32";
  case Dtype::F16: return "f16";
  case Dtype::BF16: return "bf16";
  }
  return "?";
}

size_t dtypeBytes(Dtype dtype) { return dtype == Dtype::F32 ? 4 : 2; }

/// `value` rounded to nearest even in `dtype`, as raw bits.
uint32_t toBits(float value, Dtype dtype) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  switch (dtype) {
  case Dtype::F32:
    return bits;
  case Dtype::BF16:
    if (std::isnan(value))
      return (bits >> 16) | 0x40; // quiet NaN, sign kept
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
  case Dtype::F16: {
    _Float16 half = static_cast<_Float16>(value);
    uint16_t halfBits;
    std::memcpy(&halfBits, &half, 2);
    return halfBits;
  }
  }
  return 0;
}

float fromBits(uint32_t bits, Dtype dtype) {
  float value;
  switch (dtype) {
  case Dtype::F32:
    std::memcpy(&value, &bits, 4);
    return value;
  case Dtype::BF16:
    bits <<= 16;
    std::memcpy(&value, &bits, 4);
    return value;
  case Dtype::F16: {
    uint16_t halfBits = static_cast<uint16_t>(bits);
    _Float16 half;
    std::memcpy(&half, &halfBits, 2);
    return static_cast<float>(half);
  }
  }
  return 0;
}

float roundTo(float value, Dtype dtype) {
  return fromBits(toBits(value, dtype), dtype);
}

double storedAs(Dtype dtype, double value) {
  return dtype == Dtype::F32 ? value
                             : roundTo(static_cast<float>(value), dtype);
}

bool isVariant(const std::string &name) {
  return llvm::is_contained({"rms_norm_llama_fwd", "rms_norm_none_fwd",
                             "rms_norm_llama_bwd", "geglu_fwd", "geglu_bwd",
                             "geglu_tanh_fwd", "geglu_tanh_bwd",
                             "adamw_amsgrad_step"},
                            name);
}

namespace {

/// NaN-propagating max, as torch.amax.
double maxNaN(double a, double b) {
  if (std::isnan(a) || std::isnan(b))
    return NAN;
  return std::max(a, b);
}

//===----------------------------------------------------------------------===//
// Scalar references, written from the formulas in PyTorch's terms.
//===----------------------------------------------------------------------===//

/// RMSNorm forward in the three casting modes: "gemma" rounds nothing
/// before the output, "llama" rounds x * rstd to x's dtype, "none" every
/// step.
enum class Casting { Gemma, Llama, None };

void rmsNormForward(const Values &in, int64_t rows, int64_t n, Values &out,
                    Casting casting) {
  auto &x = in.floats.at("x"), &w = in.floats.at("weight");
  double eps = in.scalars.at("eps"), offset = in.scalars.at("offset");
  auto &y = out.floats["y"], &rstd = out.floats["rstd"];
  Dtype storage = in.storage.at("x");
  auto step = [&](double value) {
    return casting == Casting::None ? storedAs(storage, value) : value;
  };
  y.resize(rows * n);
  rstd.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < n; ++c)
      sum += step(x[r * n + c] * x[r * n + c]);
    rstd[r] = step(1.0 / std::sqrt(step(step(sum / n) + eps)));
    for (int64_t c = 0; c < n; ++c) {
      double xhat = x[r * n + c] * rstd[r];
      if (casting != Casting::Gemma)
        xhat = storedAs(storage, xhat);
      y[r * n + c] = xhat * step(offset + w[c]);
    }
  }
}

void rmsNormFwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  rmsNormForward(in, rows, n, out, Casting::Gemma);
}
void rmsNormLlamaFwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  rmsNormForward(in, rows, n, out, Casting::Llama);
}
void rmsNormNoneFwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  rmsNormForward(in, rows, n, out, Casting::None);
}

/// RMSNorm backward; with `roundedXhat` (llama, none) dweight sums dy times
/// xhat rounded to x's dtype, as the forward multiplied it.
void rmsNormBackward(const Values &in, int64_t rows, int64_t n, Values &out,
                     bool roundedXhat) {
  auto &dy = in.floats.at("dy"), &x = in.floats.at("x"),
       &w = in.floats.at("weight"), &rstd = in.floats.at("rstd");
  double offset = in.scalars.at("offset");
  auto &dx = out.floats["dx"], &dw = out.floats["dweight"];
  Dtype storage = in.storage.at("x");
  dx.assign(rows * n, 0);
  dw.assign(n, 0);
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (int64_t c = 0; c < n; ++c)
      dot += dy[r * n + c] * (offset + w[c]) * x[r * n + c] * rstd[r];
    double mean = dot / n;
    for (int64_t c = 0; c < n; ++c) {
      double xhat = x[r * n + c] * rstd[r];
      dx[r * n + c] = rstd[r] * (dy[r * n + c] * (offset + w[c]) - xhat * mean);
      dw[c] += dy[r * n + c] * (roundedXhat ? storedAs(storage, xhat) : xhat);
    }
  }
}

void rmsNormBwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  rmsNormBackward(in, rows, n, out, /*roundedXhat=*/false);
}
void rmsNormLlamaBwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  rmsNormBackward(in, rows, n, out, /*roundedXhat=*/true);
}

void layerNormFwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  auto &x = in.floats.at("x"), &w = in.floats.at("weight"),
       &bias = in.floats.at("bias");
  double eps = in.scalars.at("eps");
  auto &y = out.floats["y"], &mean = out.floats["mean"],
       &rstd = out.floats["rstd"];
  y.resize(rows * n);
  mean.resize(rows);
  rstd.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < n; ++c)
      sum += x[r * n + c];
    mean[r] = sum / n;
    double var = 0;
    for (int64_t c = 0; c < n; ++c)
      var += (x[r * n + c] - mean[r]) * (x[r * n + c] - mean[r]);
    rstd[r] = 1.0 / std::sqrt(var / n + eps);
    for (int64_t c = 0; c < n; ++c)
      y[r * n + c] = (x[r * n + c] - mean[r]) * rstd[r] * w[c] + bias[c];
  }
}

/// With `recentered`, layer_norm_bwd_recentered's algebra: x - mean less
/// its row mean (the saved mean's rounding taken off), as the kernel
/// computes it, so that infinities and NaNs spread as they do there.
void layerNormBackward(const Values &in, int64_t rows, int64_t n, Values &out,
                       bool recentered) {
  auto &dy = in.floats.at("dy"), &x = in.floats.at("x"),
       &w = in.floats.at("weight"), &mean = in.floats.at("mean"),
       &rstd = in.floats.at("rstd");
  auto &dx = out.floats["dx"], &dw = out.floats["dweight"],
       &db = out.floats["dbias"];
  dx.assign(rows * n, 0);
  dw.assign(n, 0);
  db.assign(n, 0);
  std::vector<double> xhat(n);
  for (int64_t r = 0; r < rows; ++r) {
    double sumG = 0, sumGX = 0, sumX = 0;
    for (int64_t c = 0; c < n; ++c) {
      double xc = x[r * n + c] - mean[r], g = dy[r * n + c] * w[c];
      xhat[c] = recentered ? xc : xc * rstd[r];
      sumG += g;
      sumGX += g * xhat[c];
      if (recentered)
        sumX += xhat[c];
    }
    double meanGXhat = sumGX / n;
    if (recentered) {
      meanGXhat = (meanGXhat - sumX / n * (sumG / n)) * rstd[r];
      for (double &value : xhat)
        value = (value - sumX / n) * rstd[r];
    }
    for (int64_t c = 0; c < n; ++c) {
      double g = dy[r * n + c] * w[c];
      dx[r * n + c] = rstd[r] * (g - sumG / n - xhat[c] * meanGXhat);
      dw[c] += dy[r * n + c] * xhat[c];
      db[c] += dy[r * n + c];
    }
  }
}

void layerNormBwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  layerNormBackward(in, rows, n, out, false);
}
void layerNormBwdRecentered(const Values &in, int64_t rows, int64_t n,
                            Values &out) {
  layerNormBackward(in, rows, n, out, true);
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

void swigluFwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  auto &a = in.floats.at("a"), &b = in.floats.at("b");
  auto &c = out.floats["c"];
  c.resize(rows * n);
  for (int64_t i = 0; i < rows * n; ++i)
    c[i] = a[i] * sigmoid(a[i]) * b[i];
}

void swigluBwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  auto &dc = in.floats.at("dc"), &a = in.floats.at("a"), &b = in.floats.at("b");
  auto &da = out.floats["da"], &db = out.floats["db"];
  da.resize(rows * n);
  db.resize(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) {
    double s = sigmoid(a[i]);
    db[i] = dc[i] * a[i] * s;
    da[i] = dc[i] * b[i] * s * (1 + a[i] * (1 - s));
  }
}

/// gelu and its derivative, exact (erf) or with approximate='tanh'.
std::pair<double, double> gelu(double a, bool tanhForm) {
  if (tanhForm) {
    const double beta = std::sqrt(2.0 / M_PI), kappa = 0.044715;
    double t = std::tanh(beta * (a + kappa * a * a * a));
    return {0.5 * a * (1 + t),
            0.5 * (1 + t) + 0.5 * a * (1 - t * t) * beta * (1 + 3 * kappa * a * a)};
  }
  double cdf = 0.5 * (1 + std::erf(a / std::sqrt(2.0)));
  return {a * cdf, cdf + a * std::exp(-0.5 * a * a) / std::sqrt(2 * M_PI)};
}

void gegluForward(const Values &in, int64_t rows, int64_t n, Values &out,
                  bool tanhForm) {
  auto &a = in.floats.at("a"), &b = in.floats.at("b");
  auto &c = out.floats["c"];
  c.resize(rows * n);
  for (int64_t i = 0; i < rows * n; ++i)
    c[i] = gelu(a[i], tanhForm).first * b[i];
}

void gegluBackward(const Values &in, int64_t rows, int64_t n, Values &out,
                   bool tanhForm) {
  auto &dc = in.floats.at("dc"), &a = in.floats.at("a"), &b = in.floats.at("b");
  auto &da = out.floats["da"], &db = out.floats["db"];
  da.resize(rows * n);
  db.resize(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) {
    auto [value, slope] = gelu(a[i], tanhForm);
    da[i] = dc[i] * b[i] * slope;
    db[i] = dc[i] * value;
  }
}

void gegluFwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  gegluForward(in, rows, n, out, /*tanhForm=*/false);
}
void gegluBwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  gegluBackward(in, rows, n, out, /*tanhForm=*/false);
}
void gegluTanhFwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  gegluForward(in, rows, n, out, /*tanhForm=*/true);
}
void gegluTanhBwd(const Values &in, int64_t rows, int64_t n, Values &out) {
  gegluBackward(in, rows, n, out, /*tanhForm=*/true);
}

/// torch's cross-entropy per row (reduction='none'): class weights w,
/// label smoothing eps (its term left out when eps is 0, as torch does),
/// ignore_index or probability targets, soft-capping, the z-loss; and the
/// gradient for per-row upstream gradients dloss and dz_loss.
Reference crossEntropy(CrossEntropyForm form) {
  return [form](const Values &in, int64_t rows, int64_t n, Values &out) {
    auto &logits = in.floats.at("logits");
    // Kernels without class weights: every weight is 1.
    std::vector<double> ones(n, 1.0);
    auto &weight = form.weighted ? in.floats.at("weight") : ones;
    double eps = in.scalars.at("label_smoothing");
    double zScale = in.scalars.at("lse_square_scale");
    double cap = form.capped ? in.scalars.at("softcap") : 0;
    std::vector<double> loss(rows), zLoss(rows), maxes(rows), logSums(rows),
        masses(rows), dlogits(rows * n);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> z(n), wq(n); // w_c q_c
      int64_t target = -1;
      bool valid = true;
      if (!form.probs) {
        target = in.ints.at("target")[r];
        valid = target != in.intScalars.at("ignore_index");
      }
      double max = -INFINITY, weightSum = 0;
      for (int64_t c = 0; c < n; ++c) {
        double x = logits[r * n + c];
        z[c] = form.capped ? cap * std::tanh(x / cap) : x;
        max = maxNaN(max, z[c]);
        weightSum += weight[c];
        wq[c] = form.probs ? weight[c] * ((1 - eps) * in.floats.at("target")[r * n + c] +
                                          eps / n)
                           : eps / n * weight[c];
      }
      double targetWeight =
          form.probs ? 0
          : form.weighted ? in.floats.at("target_weight")[r]
                          : 1;
      if (valid && !form.probs)
        wq[target] += (1 - eps) * targetWeight;
      double sum = 0;
      for (int64_t c = 0; c < n; ++c)
        sum += std::exp(z[c] - max);
      double lse = max + std::log(sum);
      double mass = 0;
      if (form.probs) {
        double crossTerm = 0;
        for (int64_t c = 0; c < n; ++c) {
          mass += wq[c];
          crossTerm += wq[c] * (z[c] - lse);
        }
        loss[r] = -crossTerm;
      } else if (valid) {
        double smooth = 0;
        for (int64_t c = 0; c < n; ++c)
          smooth += weight[c] * (lse - z[c]);
        loss[r] = (1 - eps) * targetWeight * (lse - z[target]) +
                  (eps != 0 ? eps / n * smooth : 0);
        mass = (1 - eps) * targetWeight + eps / n * weightSum;
      }
      zLoss[r] = valid ? zScale * lse * lse : 0;
      maxes[r] = max;
      logSums[r] = std::log(sum);
      masses[r] = form.probs ? mass : (1 - eps) * targetWeight + eps / n * weightSum;
      if (!form.backward)
        continue;
      // The backward takes the forward's saved max and log-sum.
      if (!form.forward) {
        max = in.floats.at("max")[r];
        logSums[r] = in.floats.at("log_sum")[r];
      }
      lse = max + logSums[r];
      mass = form.forward || !form.weighted ? masses[r]
                                            : in.floats.at("mass")[r];
      double dloss = valid ? in.floats.at("dloss")[r] : 0;
      double dz = valid ? in.floats.at("dz_loss")[r] : 0;
      for (int64_t c = 0; c < n; ++c) {
        double p = std::exp((z[c] - max) - logSums[r]);
        double grad = p * (dloss * mass + 2 * zScale * dz * lse) - dloss * wq[c];
        if (form.capped)
          grad *= 1 - (z[c] / cap) * (z[c] / cap);
        dlogits[r * n + c] = grad;
      }
    }
    if (form.forward) {
      out.floats["loss"] = loss;
      out.floats["z_loss"] = zLoss;
    }
    if (form.forward && !form.backward) {
      out.floats["max"] = maxes;
      out.floats["log_sum"] = logSums;
      if (form.weighted)
        out.floats["mass"] = masses;
    }
    if (form.backward)
      out.floats["dlogits"] = dlogits;
  };
}

/// torch.optim.AdamW's step as the fusion computes it from the host's
/// scalars, each in-place update rounded to the storage of the tensor it
/// writes.
void adamwStepWith(const Values &in, int64_t rows, int64_t n, Values &out,
                   bool amsgrad) {
  auto &param = in.floats.at("param"), &grad = in.floats.at("grad"),
       &m = in.floats.at("exp_avg"), &v = in.floats.at("exp_avg_sq");
  auto scalar = [&](const char *name) { return in.scalars.at(name); };
  const double gradSign = scalar("grad_sign"), decay = scalar("decay"),
               lerpWeight = scalar("lerp_weight"), beta2 = scalar("beta2"),
               oneMinusBeta2 = scalar("one_minus_beta2"),
               biasCorrection2Sqrt = scalar("bias_correction2_sqrt"),
               eps = scalar("eps"), negStepSize = scalar("neg_step_size");
  const Dtype paramStorage = in.storage.at("param"),
              expAvgStorage = in.storage.at("exp_avg"),
              expAvgSqStorage = in.storage.at("exp_avg_sq");
  const Dtype secondStorage =
      amsgrad ? in.storage.at("max_exp_avg_sq") : expAvgSqStorage;
  auto &p1 = out.floats["param_out"], &m1 = out.floats["exp_avg_out"],
       &v1 = out.floats["exp_avg_sq_out"];
  p1.resize(rows * n);
  m1.resize(rows * n);
  v1.resize(rows * n);
  std::vector<double> *vmax1 = amsgrad ? &out.floats["max_exp_avg_sq_out"] : nullptr;
  const std::vector<double> *vmax = amsgrad ? &in.floats.at("max_exp_avg_sq") : nullptr;
  if (vmax1)
    vmax1->resize(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) {
    double g = grad[i] * gradSign;
    double p = storedAs(paramStorage, param[i] * decay);
    m1[i] = storedAs(expAvgStorage, std::abs(lerpWeight) < 0.5
                                        ? m[i] + lerpWeight * (g - m[i])
                                        : g + (lerpWeight - 1) * (g - m[i]));
    v1[i] = storedAs(expAvgSqStorage, storedAs(expAvgSqStorage, v[i] * beta2) +
                                          oneMinusBeta2 * g * g);
    double s = v1[i];
    if (vmax1)
      s = (*vmax1)[i] = maxNaN((*vmax)[i], v1[i]);
    double denom = storedAs(
        secondStorage,
        storedAs(secondStorage, storedAs(secondStorage, std::sqrt(s)) /
                                    biasCorrection2Sqrt) +
            eps);
    p1[i] = p + negStepSize * m1[i] / denom;
  }
}

void adamwStep(const Values &in, int64_t rows, int64_t n, Values &out) {
  adamwStepWith(in, rows, n, out, /*amsgrad=*/false);
}
void adamwAmsgradStep(const Values &in, int64_t rows, int64_t n, Values &out) {
  adamwStepWith(in, rows, n, out, /*amsgrad=*/true);
}

} // namespace

const std::map<std::string, Reference> &references() {
  static const std::map<std::string, Reference> table = [] {
    std::map<std::string, Reference> references = {
        {"rms_norm_fwd", rmsNormFwd},       {"rms_norm_bwd", rmsNormBwd},
        {"rms_norm_llama_fwd", rmsNormLlamaFwd},
        {"rms_norm_llama_bwd", rmsNormLlamaBwd},
        {"rms_norm_none_fwd", rmsNormNoneFwd},
        {"layer_norm_fwd", layerNormFwd},   {"layer_norm_bwd", layerNormBwd},
        {"layer_norm_bwd_recentered", layerNormBwdRecentered},
        {"swiglu_fwd", swigluFwd},          {"swiglu_bwd", swigluBwd},
        {"geglu_fwd", gegluFwd},            {"geglu_bwd", gegluBwd},
        {"geglu_tanh_fwd", gegluTanhFwd},   {"geglu_tanh_bwd", gegluTanhBwd},
        {"adamw_step", adamwStep},
        {"adamw_amsgrad_step", adamwAmsgradStep},
    };
    for (const char *targets : {"", "_weighted", "_probs"})
      for (const char *cap : {"", "_capped"})
        for (const char *stage : {"_fwd", "_bwd", "_fwd_grad"}) {
          std::string name = std::string("cross_entropy") + targets + cap + stage;
          references[name] = crossEntropy(crossEntropyForm(name));
        }
    return references;
  }();
  return table;
}

CrossEntropyForm crossEntropyForm(const std::string &name) {
  llvm::StringRef view(name);
  bool grad = view.ends_with("_fwd_grad");
  bool probs = view.contains("_probs");
  return {probs, probs || view.contains("_weighted"), view.contains("_capped"),
          grad || view.ends_with("_fwd"), grad || view.ends_with("_bwd")};
}

void saveCrossEntropyStats(const std::string &name, Values &in, int64_t rows,
                           int64_t n) {
  CrossEntropyForm form = crossEntropyForm(name);
  form.forward = true;
  form.backward = false;
  Values stats;
  crossEntropy(form)(in, rows, n, stats);
  for (const char *stat : {"max", "log_sum", "mass"}) {
    if (!stats.floats.count(stat))
      continue;
    in.floats[stat] = stats.floats[stat];
    for (double &value : in.floats[stat])
      value = static_cast<float>(value);
  }
}

bool isCrossEntropyVariant(const std::string &name) {
  return name.rfind("cross_entropy_", 0) == 0 && name != "cross_entropy_fwd" &&
         name != "cross_entropy_bwd";
}

void maskHalfOfEachRow(const KernelInfo &info, Values &in, int64_t rows,
                       double labelSmoothing) {
  int64_t n = info.n;
  in.scalars["label_smoothing"] = labelSmoothing;
  auto &logits = in.floats.at("logits");
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = n / 2; c < n; ++c)
      logits[r * n + c] = -INFINITY;
  for (int64_t c = 0; c < n / 2; ++c)
    logits[5 * n + c] = -INFINITY;
  if (in.ints.count("target"))
    for (int64_t &target : in.ints.at("target"))
      target = target == kIgnoreIndex ? target : target % (n / 2);
  if (in.floats.count("log_sum"))
    saveCrossEntropyStats(info.name, in, rows, n);
  CrossEntropyForm form = crossEntropyForm(info.name);
  if (form.forward && !form.probs && !form.capped) {
    Values expected;
    references().at(info.name)(in, rows, n, expected);
    EXPECT_EQ(std::isfinite(expected.floats.at("loss")[0]),
              labelSmoothing == 0.0);
  }
}

//===----------------------------------------------------------------------===//
// Inputs and buffers
//===----------------------------------------------------------------------===//

HostBuffer makeBuffer(size_t bytes, size_t misalignment) {
  HostBuffer buffer;
  buffer.bytes.resize(bytes + 64 + misalignment);
  auto address = reinterpret_cast<uintptr_t>(buffer.bytes.data());
  buffer.offset = (64 - address % 64) % 64 + misalignment;
  buffer.size = bytes;
  return buffer;
}

size_t elementCount(Kind kind, int64_t rows, int64_t n) {
  switch (kind) {
  case Kind::Full: return rows * n;
  case Kind::Row: return rows;
  case Kind::Col: return n;
  case Kind::Scalar: return 1;
  }
  return 0;
}

bool isFloatDtype(const std::string &dtype) {
  return dtype[0] == 'f' || dtype == "bf16";
}

Dtype dtypeOf(const std::string &dtype) {
  if (dtype == "bf16")
    return Dtype::BF16;
  if (dtype == "f16")
    return Dtype::F16;
  return Dtype::F32;
}

namespace {

void storeFloats(const std::vector<double> &values, const std::string &type,
                 void *data) {
  Dtype dtype = dtypeOf(type);
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits = toBits(static_cast<float>(values[i]), dtype);
    std::memcpy(static_cast<uint8_t *>(data) + i * dtypeBytes(dtype), &bits,
                dtypeBytes(dtype));
  }
}

std::vector<double> loadFloats(const void *data, const std::string &type,
                               size_t count) {
  Dtype dtype = dtypeOf(type);
  std::vector<double> values(count);
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits,
                static_cast<const uint8_t *>(data) + i * dtypeBytes(dtype),
                dtypeBytes(dtype));
    values[i] = fromBits(bits, dtype);
  }
  return values;
}

} // namespace

size_t elementBytes(const std::string &dtype) {
  return isFloatDtype(dtype) ? dtypeBytes(dtypeOf(dtype)) : sizeof(int64_t);
}

Arguments makeArguments(const KernelInfo &info, const Values &in, int64_t rows,
                        bool aligned) {
  auto misalignment = [&](const PortInfo &port) {
    return aligned ? 0 : elementBytes(port.dtype);
  };
  Arguments arguments;
  size_t ports = info.inputs.size() + info.outputs.size();
  arguments.buffers.reserve(ports);
  arguments.floatScalars.resize(info.inputs.size());
  arguments.intScalars.resize(info.inputs.size());
  for (size_t i = 0; i < info.inputs.size(); ++i) {
    const PortInfo &port = info.inputs[i];
    if (port.kind == Kind::Scalar) {
      if (isFloatDtype(port.dtype)) {
        arguments.floatScalars[i] =
            static_cast<float>(in.scalars.at(port.name));
        arguments.pointers.push_back(&arguments.floatScalars[i]);
      } else {
        arguments.intScalars[i] = in.intScalars.at(port.name);
        arguments.pointers.push_back(&arguments.intScalars[i]);
      }
      continue;
    }
    size_t count = elementCount(port.kind, rows, info.n);
    size_t bytes = count * elementBytes(port.dtype);
    arguments.buffers.push_back(makeBuffer(bytes, misalignment(port)));
    HostBuffer &buffer = arguments.buffers.back();
    if (isFloatDtype(port.dtype))
      storeFloats(in.floats.at(port.name), port.dtype, buffer.data());
    else
      std::memcpy(buffer.data(), in.ints.at(port.name).data(), bytes);
    arguments.pointers.push_back(buffer.data());
  }
  arguments.firstOutput = arguments.buffers.size();
  for (const PortInfo &port : info.outputs) {
    size_t count = elementCount(port.kind, rows, info.n);
    arguments.buffers.push_back(
        makeBuffer(count * elementBytes(port.dtype), misalignment(port)));
    arguments.pointers.push_back(arguments.buffers.back().data());
  }
  return arguments;
}

Values readOutputs(const KernelInfo &info, Arguments &arguments, int64_t rows) {
  Values out;
  for (size_t o = 0; o < info.outputs.size(); ++o) {
    const PortInfo &port = info.outputs[o];
    size_t count = elementCount(port.kind, rows, info.n);
    const void *data = arguments.buffers[arguments.firstOutput + o].data();
    if (isFloatDtype(port.dtype)) {
      out.floats[port.name] = loadFloats(data, port.dtype, count);
    } else {
      auto *indices = static_cast<const int64_t *>(data);
      out.ints[port.name].assign(indices, indices + count);
    }
  }
  return out;
}

/// Random inputs for a kernel, rounded to their storage types. Row inputs
/// that are statistics (rstd, mean, lse) are computed from the data so that
/// backward passes see consistent values.
Values makeInputs(const KernelInfo &info, int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int64_t> column(0, info.n - 1);
  Values in;
  int64_t n = info.n;
  for (const PortInfo &port : info.inputs) {
    if (port.kind == Kind::Scalar)
      continue;
    size_t count = elementCount(port.kind, rows, n);
    if (!isFloatDtype(port.dtype)) {
      auto &target = in.ints[port.name];
      for (size_t i = 0; i < count; ++i)
        target.push_back(i % 5 == 3 ? kIgnoreIndex : column(rng));
      continue;
    }
    auto &values = in.floats[port.name];
    values.reserve(count);
    Dtype dtype = dtypeOf(port.dtype);
    in.storage[port.name] = dtype;
    bool positive = port.name == "exp_avg_sq" ||
                    port.name == "max_exp_avg_sq" || port.name == "rstd";
    bool weight = port.name == "weight" || port.name == "target_weight";
    bool probabilities = port.name == "target"; // unnormalized is fine
    for (size_t i = 0; i < count; ++i) {
      double value = normal(rng);
      if (positive)
        value = std::abs(value) + 0.1;
      if (weight)
        value = 1.0 + 0.1 * value;
      if (probabilities)
        value = std::abs(value);
      values.push_back(roundTo(static_cast<float>(value), dtype));
    }
  }
  // AdamW's scalars as the host computes them for lr 1e-3, betas (0.9,
  // 0.999), weight decay 0.01, step 7 and maximize.
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, step = 7;
  in.scalars = {{"eps", 1e-5},
                {"label_smoothing", 0.1},
                {"lse_square_scale", 0.01},
                {"softcap", 3.0},
                {"softcap_reciprocal", 1.0 / 3.0},
                {"offset", 0.5},
                {"grad_sign", -1.0},
                {"decay", 1 - lr * 0.01},
                {"lerp_weight", 1 - beta1},
                {"beta2", beta2},
                {"one_minus_beta2", 1 - beta2},
                {"bias_correction2_sqrt", std::sqrt(1 - std::pow(beta2, step))},
                {"neg_step_size", -lr / (1 - std::pow(beta1, step))}};
  if (info.name.rfind("adamw", 0) == 0)
    in.scalars["eps"] = 1e-8;
  in.intScalars = {{"ignore_index", kIgnoreIndex}};
  if (in.floats.count("log_sum"))
    saveCrossEntropyStats(info.name, in, rows, n);
  if (in.floats.count("mean")) {
    Values forward, stats;
    forward.floats = {{"x", in.floats["x"]},
                      {"weight", in.floats["weight"]},
                      {"bias", std::vector<double>(n, 0.0)}};
    forward.scalars = in.scalars;
    layerNormFwd(forward, rows, n, stats);
    for (const char *name : {"mean", "rstd"}) {
      in.floats[name] = stats.floats[name];
      for (double &value : in.floats[name])
        value = static_cast<float>(value);
    }
  }
  return in;
}

//===----------------------------------------------------------------------===//
// Comparison
//===----------------------------------------------------------------------===//

Tolerance toleranceFor(const std::string &storage) {
  switch (dtypeOf(storage)) {
  case Dtype::F32: return {1e-5, 1e-5};
  case Dtype::F16: return {2e-3, 2e-3};
  case Dtype::BF16: return {1.6e-2, 1.6e-2};
  }
  return {0, 0};
}

/// Counts mismatches; reports the first few.
void expectClose(const std::string &what, const std::vector<double> &actual,
                 const std::vector<double> &expected, Tolerance tolerance,
                 double scale) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  size_t mismatches = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    double a = actual[i], e = expected[i];
    bool ok;
    if (std::isnan(e) || std::isinf(e))
      ok = std::isnan(e) ? std::isnan(a) : a == e;
    else
      ok = std::abs(a - e) <=
           scale * (tolerance.atol + tolerance.rtol * std::abs(e));
    if (!ok) {
      ++mismatches;
      if (reported++ < 5)
        ADD_FAILURE() << what << "[" << i << "]: got " << a << ", expected "
                      << e;
    }
  }
  EXPECT_EQ(mismatches, 0u) << what;
}

/// Column reductions sum `rows` terms: the tolerance grows with sqrt(rows).
double columnScale(const PortInfo &port, int64_t rows) {
  return port.kind == Kind::Col ? std::sqrt(std::max<int64_t>(rows, 1)) : 1.0;
}

void addNaNAndInf(const KernelInfo &info, Values &in) {
  // A saved row mean (layer norm's backward) a little below row 4's own:
  // the recentered backward takes the difference off, and where dy is
  // infinite, inf - difference * inf is inf or NaN by its sign, which
  // rounding noise would otherwise decide.
  if (auto mean = in.floats.find("mean"); mean != in.floats.end())
    mean->second[4] = static_cast<float>(
        mean->second[4] - 1e-3 * (1 + std::abs(mean->second[4])));
  for (const PortInfo &port : info.inputs) {
    if (port.kind != Kind::Full || !isFloatDtype(port.dtype))
      continue;
    in.floats[port.name][2 * info.n + 5] = NAN;
    in.floats[port.name][4 * info.n + 9] = INFINITY;
    return;
  }
}

void expectMatchesReference(const KernelInfo &info, const Reference &reference,
                            const Values &in, const Values &actual,
                            int64_t rows) {
  Values expected;
  reference(in, rows, info.n, expected);
  for (const PortInfo &port : info.outputs) {
    std::vector<double> want = expected.floats.at(port.name);
    for (double &value : want)
      value = roundTo(static_cast<float>(value), dtypeOf(port.dtype));
    expectClose(port.name, actual.floats.at(port.name), want,
                toleranceFor(port.dtype), columnScale(port, rows));
  }
}

std::string caseName(const Case &c) {
  return c.fusion + "/" + dtypeName(c.dtype) + "/n=" + std::to_string(c.n) +
         "/rows=" + std::to_string(c.rows) +
         (c.aligned ? "/aligned" : "/unaligned");
}

} // namespace tilefuse::testing
