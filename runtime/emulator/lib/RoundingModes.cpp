//===- RoundingModes.cpp - f64 arithmetic in a directed rounding ----------===//
//
// Compiled with -frounding-math: the host's rounding mode is switched for
// one operation and restored. Only PTX instructions with .rz/.rm/.rp come
// here (f32 ones computed in f64 in the same direction).
//
//===----------------------------------------------------------------------===//

#include "Numerics.h"

#include <cfenv>

using namespace tilefuse::emulator;

namespace {

int hostRounding(Rounding rounding) {
  switch (rounding) {
  case Rounding::Nearest: return FE_TONEAREST;
  case Rounding::Zero: return FE_TOWARDZERO;
  case Rounding::Down: return FE_DOWNWARD;
  case Rounding::Up: return FE_UPWARD;
  }
  return FE_TONEAREST;
}

/// Kept out of line and opaque so that no compiler moves the arithmetic
/// across the rounding-mode switches around the call.
#if defined(__GNUC__) && !defined(__clang__)
[[gnu::noipa]]
#else
[[gnu::noinline]]
#endif
double apply(FloatKind kind, double a, double b, double c) {
  switch (kind) {
  case FloatKind::Add: return a + b;
  case FloatKind::Sub: return a - b;
  case FloatKind::Mul: return a * b;
  case FloatKind::Fma: return std::fma(a, b, c);
  case FloatKind::Div: return a / b;
  case FloatKind::Sqrt: return std::sqrt(a);
  case FloatKind::Rcp: return 1.0 / a;
  default: return std::nan("");
  }
}

} // namespace

double numerics::directedF64(FloatKind kind, Rounding rounding, double a,
                             double b, double c) {
  int saved = std::fegetround();
  std::fesetround(hostRounding(rounding));
  volatile double result = apply(kind, a, b, c);
  std::fesetround(saved);
  return result;
}
