//===- Numerics.h - PTX floating point, bit for bit -------------*- C++ -*-===//
//
// PTX arithmetic is IEEE 754 with an explicit rounding per instruction. The
// host computes in round-to-nearest: operations the host does exactly in
// that mode use it directly (f32 add/mul/fma/div/sqrt .rn, f64 .rn); the
// others compute the exact result, or a double rounded to odd (which
// carries enough bits for one correct rounding to any narrower format), and
// round it once to the instruction's format and rounding. Directed
// roundings of add, sub, fma, div, sqrt and rcp go through the host's
// rounding modes in f64 (RoundingModes.cpp, compiled with -frounding-math),
// then the same direction to a narrower format: directed roundings compose,
// and the host gives exact zero sums IEEE's sign (-0 rounding down).
//
// Registers are untyped bits: every helper takes and returns raw bits.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_EMULATOR_NUMERICS_H
#define TILEFUSE_EMULATOR_NUMERICS_H

#include "Program.h"
#include "tilefuse/Emulator/Emulator.h"

#include "llvm/ADT/bit.h"

#include <cmath>
#include <cstdint>

namespace tilefuse::emulator::numerics {

inline float toFloat(uint64_t bits) {
  return llvm::bit_cast<float>(static_cast<uint32_t>(bits));
}
inline uint64_t fromFloat(float value) {
  return llvm::bit_cast<uint32_t>(value);
}
inline double toDouble(uint64_t bits) { return llvm::bit_cast<double>(bits); }
inline uint64_t fromDouble(double value) {
  return llvm::bit_cast<uint64_t>(value);
}

/// The canonical NaN PTX instructions produce, per format.
constexpr uint64_t kCanonicalNaN32 = 0x7FFFFFFF;
constexpr uint64_t kCanonicalNaN16 = 0x7FFF;

/// A subnormal f32 as a zero of its sign (.ftz).
inline float flushSubnormal(float value) {
  return std::fpclassify(value) == FP_SUBNORMAL ? std::copysign(0.0f, value)
                                                : value;
}

/// f16 and bf16 bits to the exact double.
double halfToDouble(uint16_t bits, FloatFormat format);
inline float bf16ToFloat(uint16_t bits) {
  return toFloat(static_cast<uint32_t>(bits) << 16);
}
float f16ToFloat(uint16_t bits);

/// f32 to bf16 and f16, rounded to nearest even (NaN: canonical NaN).
inline uint16_t floatToBF16(float value) {
  uint32_t bits = static_cast<uint32_t>(fromFloat(value));
  if (std::isnan(value))
    return kCanonicalNaN16;
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}
uint16_t floatToF16(float value);

/// `value` rounded once to `format` with `rounding`, as the format's bits.
/// Correct when `value` is exact or rounded to odd (53 bits is at least two
/// more than every narrower format keeps). NaN becomes the canonical NaN.
uint64_t roundTo(double value, FloatFormat format, Rounding rounding);

/// a + b, a * b + c (for a * b exact in double: f32, f16 and bf16 inputs)
/// rounded to odd: exact when representable, else the neighbour whose last
/// bit is 1.
double sumToOdd(double a, double b);
inline double fmaToOdd(double a, double b, double c) {
  return sumToOdd(a * b, c);
}

/// f64 add, sub, mul, fma, div, sqrt or rcp in a directed rounding
/// (RoundingModes.cpp).
double directedF64(FloatKind kind, Rounding rounding, double a, double b,
                   double c);

/// max/min of PTX: a NaN operand yields the other (both NaN: canonical
/// NaN); `propagateNaN` (.NaN) yields the canonical NaN for any NaN; +0.0 is
/// greater than -0.0.
template <typename T> T maxOf(T a, T b, bool propagateNaN, T canonicalNaN) {
  if (std::isnan(a) || std::isnan(b)) {
    if (propagateNaN || (std::isnan(a) && std::isnan(b)))
      return canonicalNaN;
    return std::isnan(a) ? b : a;
  }
  if (a == b)
    return std::signbit(a) ? b : a;
  return a > b ? a : b;
}
template <typename T> T minOf(T a, T b, bool propagateNaN, T canonicalNaN) {
  if (std::isnan(a) || std::isnan(b)) {
    if (propagateNaN || (std::isnan(a) && std::isnan(b)))
      return canonicalNaN;
    return std::isnan(a) ? b : a;
  }
  if (a == b)
    return std::signbit(a) ? a : b;
  return a < b ? a : b;
}

/// setp's comparison of two floating-point values.
template <typename T> bool compare(Compare op, T a, T b) {
  bool unordered = std::isnan(a) || std::isnan(b);
  switch (op) {
  case Compare::Eq: return !unordered && a == b;
  case Compare::Ne: return !unordered && a != b;
  case Compare::Lt: return !unordered && a < b;
  case Compare::Le: return !unordered && a <= b;
  case Compare::Gt: return !unordered && a > b;
  case Compare::Ge: return !unordered && a >= b;
  case Compare::Equ: return unordered || a == b;
  case Compare::Neu: return unordered || a != b;
  case Compare::Ltu: return unordered || a < b;
  case Compare::Leu: return unordered || a <= b;
  case Compare::Gtu: return unordered || a > b;
  case Compare::Geu: return unordered || a >= b;
  case Compare::Num: return !unordered;
  case Compare::Nan: return unordered;
  }
  return false;
}

/// An f32 `.approx` instruction's result under `mode` (Emulator.h's
/// Approximation), from its exact value.
double approximate(double exact, FloatKind kind, Approximation mode);

/// FloatGeneric: every floating-point form without a dedicated op, one
/// lane (f16x2 and bf16x2 call it per half). Operands and result are bits
/// of `form.format`.
uint64_t evaluate(const FloatForm &form, uint64_t a, uint64_t b, uint64_t c,
                  Approximation approximation);

/// CvtGeneric: cvt between any two scalar types.
uint64_t convert(const ConversionForm &form, uint64_t value);

} // namespace tilefuse::emulator::numerics

#endif // TILEFUSE_EMULATOR_NUMERICS_H
