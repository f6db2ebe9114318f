//===- Program.h - PTX decoded for the interpreter --------------*- C++ -*-===//
//
// The parser (Parser.cpp) turns PTX text into Functions of Instrs: every
// operand is a slot in the thread's register frame (immediates, special
// registers and symbol addresses included: they are written into the frame
// when it is made), labels are instruction indices, and the opcode with its
// modifiers is one Op. The interpreter (Interpreter.cpp) never looks at a
// string.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_EMULATOR_PROGRAM_H
#define TILEFUSE_EMULATOR_PROGRAM_H

#include "tilefuse/Emulator/Emulator.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tilefuse::emulator {

/// Integer ops specialized per integer type (U16 S16 U32 S32 U64 S64, in
/// that order: the op for type t is `Op(unsigned(first) + t)`). Signedness
/// decides extension, comparison, division, high products and right
/// shifts; .wide ops exist for 16 and 32 bits only.
#define TILEFUSE_EMU_INT_OPS(X)                                                \
  X(Add) X(Sub) X(MulLo) X(MulHi) X(MulWide) X(Min) X(Max) X(Div) X(Rem)       \
      X(And) X(Or) X(Xor) X(Shl) X(Shr) X(Not) X(Neg) X(Abs) X(Popc) X(Clz)    \
          X(MadLo) X(MadHi) X(MadWide) X(Bfe) X(SetpInt)

/// Interpreter ops that are not specialized per integer type.
#define TILEFUSE_EMU_OPS(X)                                                    \
  /* moves */                                                                  \
  X(Mov) X(Pack) X(Unpack) X(Selp) X(NotPred)                                  \
  /* memory */                                                                 \
  X(LdGlobal) X(StGlobal) X(LdShared) X(StShared) X(LdKernelParam)            \
  X(LdKernelParamAt) X(LdFrameParam) X(StFrameParam) X(LdLocal) X(StLocal)     \
  /* integer ops on the carry flag (CarryKind), funnel shifts, prmt */         \
  X(Carry) X(Funnel) X(Permute)                                                \
  /* f32, hot forms: .rn, no .ftz or .sat */                                   \
  X(AddF32) X(SubF32) X(MulF32) X(FmaF32) X(NegF32) X(AbsF32) X(MinF32)        \
  X(MaxF32) X(MinNaNF32) X(MaxNaNF32) X(DivF32) X(CopysignF32) X(SetpF32)     \
  X(Ex2F32) X(Ex2FtzF32) X(RsqrtF32) X(SqrtApproxF32) X(SqrtF32) X(RcpF32)    \
  X(RcpApproxFtzF32)                                                           \
  /* f64 */                                                                    \
  X(AddF64) X(SubF64) X(MulF64) X(FmaF64) X(NegF64) X(AbsF64) X(MinF64)        \
  X(MaxF64) X(DivF64) X(CopysignF64) X(SetpF64) X(SqrtF64) X(RcpF64)          \
  X(RsqrtApproxF64) X(RcpApproxFtzF64)                                         \
  /* everything else in floating point: directed rounding, .ftz, .sat,     */ \
  /* f16/bf16 scalars and pairs (FloatForm says which)                     */ \
  X(FloatGeneric) X(SetpHalf)                                                  \
  /* conversions: hot forms, then the general one (ConversionForm) */          \
  X(CvtF32F16) X(CvtF32BF16) X(CvtF16F32) X(CvtBF16F32) X(CvtF16x2F32)        \
  X(CvtBF16x2F32) X(CvtGeneric)                                                \
  /* control and synchronization */                                            \
  X(Bra) X(Call) X(Ret) X(Bar) X(Shfl)                                         \
  /* checks the parser inserts where a register may be read unwritten */       \
  X(CheckDefined) X(MarkDefined)

/// A kernel parameter's address (`mov.u64 %rd, param`) is this tag plus the
/// parameter's index << 32 (the low 32 bits: the offset within it):
/// `ld.param` through a register reads that parameter, bounds-checked
/// against it, and the value can never pass for a global address.
constexpr uint64_t kKernelParamSpace = 0x7e57'0000'0000'0000ull;

enum class Op : uint16_t {
#define TILEFUSE_EMU_OP(name) name,
  TILEFUSE_EMU_OPS(TILEFUSE_EMU_OP)
#undef TILEFUSE_EMU_OP
#define TILEFUSE_EMU_OP(name)                                                  \
  name##U16, name##S16, name##U32, name##S32, name##U64, name##S64,
  TILEFUSE_EMU_INT_OPS(TILEFUSE_EMU_OP)
#undef TILEFUSE_EMU_OP
  Count
};

/// The integer types of TILEFUSE_EMU_INT_OPS, in order.
enum class IntType : uint8_t { U16, S16, U32, S32, U64, S64 };
inline Op typedOp(Op first, IntType type) {
  return static_cast<Op>(static_cast<unsigned>(first) +
                         static_cast<unsigned>(type));
}

/// Comparison operators of setp (PTX names; lo/ls/hi/hs are the unsigned
/// spellings of lt/le/gt/ge).
enum class Compare : uint8_t {
  Eq, Ne, Lt, Le, Gt, Ge, // ordered
  Equ, Neu, Ltu, Leu, Gtu, Geu, // unordered: true when either is NaN
  Num, Nan
};

/// What Op::Carry computes (add.cc, addc, sub.cc, subc, mad.cc, madc).
enum class CarryKind : uint8_t { Add, Sub, MadLo, MadHi };

/// Floating-point rounding of an operation.
enum class Rounding : uint8_t { Nearest, Zero, Down, Up };

/// Floating-point storage formats.
enum class FloatFormat : uint8_t { F16, BF16, F32, F64 };

/// What FloatGeneric computes.
enum class FloatKind : uint8_t {
  Add, Sub, Mul, Fma, Div, Min, Max, Neg, Abs, Sqrt, Rcp, Rsqrt, Ex2, Lg2,
  Copysign
};

struct FloatForm {
  FloatKind kind;
  FloatFormat format;
  Rounding rounding;
  uint8_t lanes;   // 1, or 2 for .f16x2/.bf16x2
  bool ftz, sat, nan, approx, relu;
  bool full; // div.full (approx is set too)
};

/// cvt's destination or source type.
enum class ScalarType : uint8_t {
  U8, U16, U32, U64, S8, S16, S32, S64, F16, BF16, F32, F64
};

struct ConversionForm {
  ScalarType to, from;
  Rounding rounding;
  bool integerRounding; // .rni/.rzi/.rmi/.rpi
  bool ftz, sat;
};

/// What the emulator accepts, as a GPU has it: kernel parameter space (PTX
/// ISA 8.1 and later on sm_70 and later), shared memory per block without
/// an opt-in, and the registers and .param space of the frames one thread
/// holds (CUDA's local memory per thread).
constexpr uint64_t kMaxKernelParamBytes = 32764;
constexpr uint64_t kMaxSharedBytes = 48 * 1024;
/// A module's .const variables (the 64 KiB constant bank) and all of its
/// .global and .const variables (host memory allocated when it loads).
constexpr uint64_t kMaxConstBytes = 64 * 1024;
constexpr uint64_t kMaxGlobalBytes = uint64_t(1) << 28;
constexpr uint64_t kMaxStackBytes = 512 * 1024;
/// Thread-instructions one block may run before it is stopped as a runaway
/// (about two minutes here; the largest block of this project's tests runs
/// under 2^29).
constexpr uint64_t kDefaultBlockInstructionBudget = uint64_t(1) << 34;

/// A register slot that is never read: `_` and the destinations of
/// predicated-off shuffles' optional predicates.
constexpr uint32_t kNoSlot = ~0u;

/// One decoded instruction.
struct Instr {
  Op op = Op::Mov;
  InstructionClass kind = InstructionClass::Arithmetic;
  /// 0: always runs; 1: runs when slot `guard` is true; 2: when false.
  uint8_t guardSense = 0;
  uint32_t guard = 0;
  /// Register slots: destinations first, then sources (per Op).
  uint32_t r[6] = {kNoSlot, kNoSlot, kNoSlot, kNoSlot, kNoSlot, kNoSlot};
  /// Address offset, branch target, call site, or a constant.
  int64_t imm = 0;
  /// Op-specific: access size and vector count, compare, form index.
  uint8_t size = 0, count = 0;
  uint8_t compare = 0, flags = 0;
  /// Bit i: r[i] is a register the instruction reads (not the guard).
  uint8_t sources = 0;
  /// Index into Function::sources.
  uint32_t source = 0;
};

/// Flags of Instr::flags.
constexpr uint8_t kSignExtend = 1;     // loads of signed types
constexpr uint8_t kSubnormalFlush = 2; // setp.ftz
constexpr uint8_t kAddress32 = 4;      // a .shared address in a 32-bit register
constexpr uint8_t kConstSpace = 8;     // ld.const (Op::LdGlobal)
constexpr uint8_t kCarryIn = 16;       // Op::Carry: addc, subc, madc
constexpr uint8_t kCarryOut = 32;      // Op::Carry: .cc
constexpr uint8_t kSigned = 64;        // Op::Carry: mad.hi of signed types
constexpr uint8_t kWrap = 128;         // Op::Funnel: shf.wrap (else .clamp)

/// A device function's call site: what `call` copies.
struct CallSite {
  uint32_t callee;
  struct Copy {
    uint32_t from, to, bytes; // frame param offsets (caller to callee)
  };
  std::vector<Copy> arguments;
  /// The callee's return value copied back into the caller's param.
  std::vector<Copy> results;
};

/// A .shared array: [offset, offset + bytes) of the block's shared memory.
struct SharedArray {
  std::string name;
  uint32_t offset = 0, bytes = 0;
  bool dynamic = false; // .extern .shared: sized by the launch
};

/// A .param variable of a function's signature.
struct KernelParam {
  std::string name;
  uint32_t offset = 0, bytes = 0;
};

struct Function {
  std::string name;
  bool entry = false;
  std::vector<Instr> code;
  /// Source of each instruction: PTX line and text.
  struct Source {
    unsigned line;
    std::string text;
  };
  std::vector<Source> sources;
  std::vector<FloatForm> floatForms;
  std::vector<ConversionForm> conversionForms;
  std::vector<CallSite> calls;

  /// Frame: `slots` 64-bit registers (registers as first used, special
  /// registers and constants), then `paramBytes` of .param space (a device
  /// function's parameters and every call's argument and result
  /// variables), then `localBytes` of .local arrays (a local address is an
  /// offset in them), then one byte per register whose reads are checked
  /// (CheckDefined).
  uint32_t slots = 0, paramBytes = 0, localBytes = 0, checkedRegisters = 0;
  uint64_t localWord() const { return uint64_t(slots) + (paramBytes + 7) / 8; }
  uint64_t definedWord() const { return localWord() + (localBytes + 7) / 8; }
  uint64_t frameWords() const {
    return definedWord() + (checkedRegisters + 7) / 8;
  }
  /// The names of the checked registers, by CheckDefined index.
  std::vector<std::string> checkedNames;
  /// Constants (immediates, .shared addresses): written into their slots
  /// when a frame is made.
  std::vector<uint64_t> constants;
  std::vector<uint32_t> constantSlots;
  /// Special register slots, kNoSlot when unused: %tid, %ntid, %ctaid,
  /// %nctaid (x, y, z each), %laneid, %warpid.
  std::array<uint32_t, 14> specials;
  /// Kernel parameters (entry) or the function's own .param variables.
  std::vector<KernelParam> params;
  uint32_t kernelParamBytes = 0;
  /// A device function's return variable (offset in its param space).
  uint32_t resultOffset = 0, resultBytes = 0;
  /// .shared arrays this kernel may touch (the module's and its own), and
  /// the static total.
  std::vector<SharedArray> shared;
  uint32_t staticSharedBytes = 0;
  /// .maxntid / .reqntid (0 when absent).
  uint32_t maxThreads = 0;
  std::array<uint32_t, 3> requiredThreads = {0, 0, 0};
  /// .minnctapersm (0 when absent): the blocks per SM ptxas must fit.
  uint32_t minBlocksPerSM = 0;
  /// 32-bit registers declared (a 64-bit one counts twice).
  unsigned declaredRegisters = 0;
  /// False for a declaration (.func prototype without a body).
  bool hasBody = false;
};

/// Index of the special registers in Function::specials.
enum Special : unsigned {
  TidX, TidY, TidZ, NtidX, NtidY, NtidZ, CtaidX, CtaidY, CtaidZ, NctaidX,
  NctaidY, NctaidZ, LaneId, WarpId
};

/// A module-scope .global or .const variable: [address, address + bytes)
/// of the module's own host memory (Module::globalMemory), initialized when
/// the module is loaded.
struct GlobalVariable {
  std::string name;
  bool constant = false; // .const: read-only, ld.const only
  uint64_t address = 0, bytes = 0;
};

struct Module {
  std::string target; // sm_80, sm_90, ...
  unsigned smVersion = 0;
  std::vector<std::unique_ptr<Function>> functions;
  llvm::StringMap<unsigned> byName;
  std::vector<GlobalVariable> globals;
  std::unique_ptr<uint8_t[]> globalMemory;
  const Function *find(llvm::StringRef name) const {
    auto it = byName.find(name);
    return it == byName.end() ? nullptr : functions[it->second].get();
  }
};

/// Parses and decodes `ptx`. An error names the line, the instruction and
/// the function for anything outside what the emulator implements.
llvm::Expected<std::unique_ptr<Module>> parseModule(llvm::StringRef ptx);

/// The name of an op for diagnostics.
const char *opName(Op op);

} // namespace tilefuse::emulator

#endif // TILEFUSE_EMULATOR_PROGRAM_H
