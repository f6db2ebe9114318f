//===- Numerics.cpp - PTX floating point, bit for bit ---------------------===//

#include "Numerics.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <limits>

using namespace tilefuse::emulator;
using namespace tilefuse::emulator::numerics;

namespace {

/// A binary format's precision (significand bits with the hidden one),
/// smallest normal exponent and largest finite value.
struct Format {
  int precision, minExponent;
  double maxFinite;
};

Format formatOf(FloatFormat format) {
  switch (format) {
  case FloatFormat::F16: return {11, -14, 65504.0};
  case FloatFormat::BF16: return {8, -126, 0x1.FEp127};
  case FloatFormat::F32: return {24, -126, FLT_MAX};
  case FloatFormat::F64: return {53, -1022, DBL_MAX};
  }
  return {53, -1022, DBL_MAX};
}

double roundToIntegral(double value, Rounding rounding) {
  switch (rounding) {
  case Rounding::Nearest: return std::nearbyint(value); // ties to even
  case Rounding::Zero: return std::trunc(value);
  case Rounding::Down: return std::floor(value);
  case Rounding::Up: return std::ceil(value);
  }
  return value;
}

/// `value` rounded to `format`'s precision and range (still a double).
double roundToFormat(double value, FloatFormat format, Rounding rounding) {
  if (value == 0 || !std::isfinite(value))
    return value;
  Format f = formatOf(format);
  int exponent;
  std::frexp(value, &exponent); // |value| = m * 2^exponent, m in [0.5, 1)
  int lsb = std::max(exponent - f.precision, f.minExponent - f.precision + 1);
  double rounded =
      std::ldexp(roundToIntegral(std::ldexp(value, -lsb), rounding), lsb);
  if (std::fabs(rounded) > f.maxFinite) {
    bool toInfinity = rounding == Rounding::Nearest ||
                      (rounding == Rounding::Up && value > 0) ||
                      (rounding == Rounding::Down && value < 0);
    rounded = std::copysign(
        toInfinity ? std::numeric_limits<double>::infinity() : f.maxFinite,
        value);
  }
  return rounded;
}

bool isSubnormal(double value, FloatFormat format) {
  return value != 0 && std::isfinite(value) &&
         std::fabs(value) < std::ldexp(1.0, formatOf(format).minExponent);
}

uint64_t encode(double value, FloatFormat format) {
  switch (format) {
  case FloatFormat::F16:
    if (std::isnan(value))
      return kCanonicalNaN16;
    return floatToF16(static_cast<float>(value));
  case FloatFormat::BF16:
    if (std::isnan(value))
      return kCanonicalNaN16;
    return fromFloat(static_cast<float>(value)) >> 16;
  case FloatFormat::F32:
    if (std::isnan(value))
      return kCanonicalNaN32;
    return fromFloat(static_cast<float>(value));
  case FloatFormat::F64:
    return fromDouble(value);
  }
  return 0;
}

double decode(uint64_t bits, FloatFormat format) {
  switch (format) {
  case FloatFormat::F16:
  case FloatFormat::BF16:
    return halfToDouble(static_cast<uint16_t>(bits), format);
  case FloatFormat::F32:
    return toFloat(bits);
  case FloatFormat::F64:
    return toDouble(bits);
  }
  return 0;
}

} // namespace

float numerics::f16ToFloat(uint16_t bits) {
  _Float16 half;
  std::memcpy(&half, &bits, 2);
  return static_cast<float>(half);
}

uint16_t numerics::floatToF16(float value) {
  if (std::isnan(value))
    return kCanonicalNaN16;
  _Float16 half = static_cast<_Float16>(value); // rounds to nearest even
  uint16_t bits;
  std::memcpy(&bits, &half, 2);
  return bits;
}

double numerics::halfToDouble(uint16_t bits, FloatFormat format) {
  return format == FloatFormat::BF16 ? bf16ToFloat(bits) : f16ToFloat(bits);
}

uint64_t numerics::roundTo(double value, FloatFormat format,
                           Rounding rounding) {
  if (format == FloatFormat::F64)
    return fromDouble(value);
  return encode(roundToFormat(value, format, rounding), format);
}

double numerics::sumToOdd(double a, double b) {
  double sum = a + b;
  if (!std::isfinite(sum))
    return sum;
  // Knuth's two-sum: sum + error == a + b exactly.
  double b1 = sum - a;
  double error = (a - (sum - b1)) + (b - b1);
  if (error == 0)
    return sum;
  uint64_t bits = fromDouble(sum);
  if ((error > 0) != (sum > 0))
    --bits; // the exact sum is nearer zero: truncate
  return toDouble(bits | 1);
}

double numerics::approximate(double exact, FloatKind kind,
                             Approximation mode) {
  // Results that round to 0 or to infinity in f32 stay so, and ex2 of +-0
  // and of subnormals is exactly 1 (the PTX ISA's special cases; an online
  // softmax relies on it: exp(0) = 1 keeps its merge commutative).
  if (mode == Approximation::Exact || std::fabs(exact) <= 0x1p-150 ||
      std::fabs(exact) >= 0x1.ffffffp127 || std::isnan(exact) ||
      (kind == FloatKind::Ex2 && exact == 1))
    return exact;
  double ulp = std::ldexp(1.0, std::max(std::ilogb(exact) - 23, -149));
  double bound = 0;
  switch (kind) {
  case FloatKind::Ex2:
  case FloatKind::Div: bound = 2 * ulp; break;
  case FloatKind::Rcp: bound = ulp; break;
  case FloatKind::Rsqrt: bound = std::exp2(-22.9) * std::fabs(exact); break;
  case FloatKind::Sqrt: bound = std::ldexp(std::fabs(exact), -23); break;
  default: return exact;
  }
  bool up = mode == Approximation::High;
  double moved = exact + (up ? bound : -bound);
  // A subnormal result never crosses zero: it stops at a zero of its sign.
  if (std::signbit(moved) != std::signbit(exact) || moved == 0)
    return std::copysign(0.0, exact);
  return roundToFormat(moved, FloatFormat::F32,
                       up ? Rounding::Down : Rounding::Up);
}

uint64_t numerics::evaluate(const FloatForm &form, uint64_t aBits,
                            uint64_t bBits, uint64_t cBits,
                            Approximation approximation) {
  FloatFormat format = form.format;
  bool f64 = format == FloatFormat::F64;
  double a = decode(aBits, format), b = decode(bBits, format),
         c = decode(cBits, format);
  if (form.ftz) {
    auto flush = [&](double &value) {
      if (isSubnormal(value, format))
        value = std::copysign(0.0, value);
    };
    flush(a);
    flush(b);
    flush(c);
  }
  Rounding rounding = form.rounding;
  bool directed = rounding != Rounding::Nearest;
  double canonicalNaN = std::numeric_limits<double>::quiet_NaN();
  double result = 0;
  // Exact, rounded to odd, or (directed roundings, which compose) rounded
  // in the same direction in f64 for f32 and narrower; f64 rounds here.
  // The host's directed rounding also gives an exact zero sum the sign
  // IEEE 754 wants (-0 when rounding down).
  switch (form.kind) {
  case FloatKind::Add:
  case FloatKind::Sub:
  case FloatKind::Fma:
    if (directed) {
      result = directedF64(form.kind, rounding, a, b, c);
      break;
    }
    result = form.kind == FloatKind::Fma
                 ? (f64 ? std::fma(a, b, c) : fmaToOdd(a, b, c))
             : f64 ? (form.kind == FloatKind::Add ? a + b : a - b)
                   : sumToOdd(a, form.kind == FloatKind::Add ? b : -b);
    break;
  case FloatKind::Mul:
    result = f64 && directed ? directedF64(form.kind, rounding, a, b, 0)
                             : a * b; // narrower: exact in 48 bits
    break;
  case FloatKind::Div:
  case FloatKind::Sqrt:
  case FloatKind::Rcp:
    if (form.approx && form.kind == FloatKind::Div && !form.full &&
        std::fabs(b) > 0x1p126 && std::isfinite(b)) {
      // PTX: div.approx.f32 is a * (1 / b); for 2^126 < |b| < 2^128 it
      // gives NaN when a is infinite, else a zero of the quotient's sign.
      result = std::isinf(a) || std::isnan(a)
                   ? canonicalNaN
                   : (std::signbit(a) != std::signbit(b) ? -0.0 : 0.0);
      rounding = Rounding::Nearest;
    } else if (form.approx) {
      // The exact operation, moved as `approximation` says (f32).
      result = form.kind == FloatKind::Div    ? a / b
               : form.kind == FloatKind::Sqrt ? std::sqrt(a)
                                              : 1.0 / a;
      if (format == FloatFormat::F32)
        result = approximate(result, form.kind, approximation);
      rounding = Rounding::Nearest;
    } else if (directed) {
      // Rounded in the same direction in f64 first: directed roundings
      // compose, and f32 values are exact in f64.
      result = directedF64(form.kind, rounding, a, b, 0);
    } else if (f64) {
      result = form.kind == FloatKind::Div    ? a / b
               : form.kind == FloatKind::Sqrt ? std::sqrt(a)
                                              : 1.0 / a;
    } else {
      // f32 round to nearest: the host's f32 operation is exact IEEE.
      float x = static_cast<float>(a), y = static_cast<float>(b);
      result = form.kind == FloatKind::Div    ? x / y
               : form.kind == FloatKind::Sqrt ? std::sqrt(x)
                                              : 1.0f / x;
    }
    break;
  case FloatKind::Rsqrt:
  case FloatKind::Ex2:
    result = form.kind == FloatKind::Ex2 ? std::exp2(a) : 1.0 / std::sqrt(a);
    if (format == FloatFormat::F32)
      result = approximate(result, form.kind, approximation);
    break;
  case FloatKind::Lg2: result = std::log2(a); break;
  case FloatKind::Min:
    result = minOf(a, b, form.nan, canonicalNaN);
    break;
  case FloatKind::Max:
    result = maxOf(a, b, form.nan, canonicalNaN);
    break;
  case FloatKind::Neg: result = -a; break;
  case FloatKind::Abs: result = std::fabs(a); break;
  case FloatKind::Copysign: result = std::copysign(b, a); break;
  }
  if (!f64)
    result = roundToFormat(result, format, rounding);
  if (form.sat)
    result = std::isnan(result) ? 0.0 : std::clamp(result, 0.0, 1.0);
  if (form.relu && !std::isnan(result) && result < 0)
    result = 0;
  if (form.ftz && isSubnormal(result, format))
    result = std::copysign(0.0, result);
  return encode(result, format);
}

uint64_t numerics::convert(const ConversionForm &form, uint64_t bits) {
  auto isFloat = [](ScalarType type) { return type >= ScalarType::F16; };
  auto widthOf = [](ScalarType type) -> unsigned {
    switch (type) {
    case ScalarType::U8: case ScalarType::S8: return 8;
    case ScalarType::U16: case ScalarType::S16: case ScalarType::F16:
    case ScalarType::BF16: return 16;
    case ScalarType::U32: case ScalarType::S32: case ScalarType::F32: return 32;
    default: return 64;
    }
  };
  auto formatOfType = [](ScalarType type) {
    switch (type) {
    case ScalarType::F16: return FloatFormat::F16;
    case ScalarType::BF16: return FloatFormat::BF16;
    case ScalarType::F32: return FloatFormat::F32;
    default: return FloatFormat::F64;
    }
  };
  auto isSignedType = [](ScalarType type) {
    return type >= ScalarType::S8 && type <= ScalarType::S64;
  };
  unsigned fromBits = widthOf(form.from), toBits = widthOf(form.to);
  uint64_t fromMask = fromBits == 64 ? ~0ull : (1ull << fromBits) - 1;
  uint64_t toMask = toBits == 64 ? ~0ull : (1ull << toBits) - 1;
  bits &= fromMask;

  // Integer sources, exact.
  bool fromSigned = isSignedType(form.from);
  int64_t signedValue = 0;
  uint64_t unsignedValue = bits;
  if (fromSigned) {
    unsigned shift = 64 - fromBits;
    signedValue = static_cast<int64_t>(bits << shift) >> shift;
  }

  if (!isFloat(form.to) && !isFloat(form.from)) {
    // Integer to integer: chop or extend, clamped with .sat.
    bool toSigned = isSignedType(form.to);
    if (form.sat) {
      // Clamp through a wide signed view of both ranges.
      __int128 value = fromSigned ? __int128(signedValue)
                                  : __int128(unsignedValue);
      __int128 low = toSigned ? -(__int128(1) << (toBits - 1)) : 0;
      __int128 high = toSigned ? (__int128(1) << (toBits - 1)) - 1
                               : (__int128(1) << toBits) - 1;
      value = std::clamp(value, low, high);
      bits = static_cast<uint64_t>(value);
    } else {
      bits = fromSigned ? static_cast<uint64_t>(signedValue) : unsignedValue;
    }
    bits &= toMask;
    if (toSigned && toBits < 64) {
      unsigned shift = 64 - toBits;
      bits =
          static_cast<uint64_t>(static_cast<int64_t>(bits << shift) >> shift);
    }
    return bits;
  }

  if (isFloat(form.to) && !isFloat(form.from)) {
    // Integer to float: two exact parts (at most 53 and 11 significant
    // bits), summed in the instruction's rounding (f64) or to odd first.
    FloatFormat format = formatOfType(form.to);
    auto halves = [](auto value) {
      auto high = value & ~decltype(value)(0x7FF);
      return std::pair(static_cast<double>(high),
                       static_cast<double>(value - high));
    };
    auto [high, low] = fromSigned ? halves(signedValue) : halves(unsignedValue);
    double value;
    if (format != FloatFormat::F64)
      value = sumToOdd(high, low);
    else if (form.rounding == Rounding::Nearest)
      value = high + low;
    else
      value = directedF64(FloatKind::Add, form.rounding, high, low, 0);
    return roundTo(value, format, form.rounding);
  }

  // Float sources, exact in double.
  FloatFormat fromFormat = formatOfType(form.from);
  double value = decode(bits, fromFormat);
  if (form.ftz && fromFormat == FloatFormat::F32 &&
      isSubnormal(value, FloatFormat::F32))
    value = std::copysign(0.0, value);
  if (form.integerRounding)
    value = roundToIntegral(value, form.rounding);

  if (isFloat(form.to)) {
    FloatFormat toFormat = formatOfType(form.to);
    double result = form.integerRounding || toFormat == FloatFormat::F64
                        ? value
                        : roundToFormat(value, toFormat, form.rounding);
    if (form.sat)
      result = std::isnan(result) ? 0.0 : std::clamp(result, 0.0, 1.0);
    if (form.ftz && toFormat == FloatFormat::F32 &&
        isSubnormal(result, FloatFormat::F32))
      result = std::copysign(0.0, result);
    return encode(result, toFormat);
  }

  // Float to integer: rounded above, clamped to the destination's range;
  // NaN is 0, or 1 << (width - 1) for 64-bit destinations and f64 sources.
  bool toSigned = isSignedType(form.to);
  if (std::isnan(value)) {
    if (form.from != ScalarType::F64 && toBits < 64)
      return 0;
    return uint64_t(1) << (toBits - 1);
  }
  if (toSigned) {
    double low = -std::ldexp(1.0, toBits - 1),
           high = std::ldexp(1.0, toBits - 1);
    int64_t result = value <= low  ? static_cast<int64_t>(low)
                     : value >= high
                         ? static_cast<int64_t>(
                               (uint64_t(1) << (toBits - 1)) - 1)
                         : static_cast<int64_t>(value);
    return static_cast<uint64_t>(result);
  }
  double high = std::ldexp(1.0, toBits);
  uint64_t result = value <= 0      ? 0
                    : value >= high ? toMask
                                    : static_cast<uint64_t>(value);
  return result;
}
