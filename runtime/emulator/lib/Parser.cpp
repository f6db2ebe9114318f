//===- Parser.cpp - PTX text to the interpreter's decoded form ------------===//
//
// Two steps per module: parse (tokens to functions of raw instructions;
// registers, .param and .shared names resolved in their scopes), then decode
// (each raw instruction to one Instr, labels and calls resolved, and
// CheckDefined/MarkDefined inserted where a register may be read before
// this thread wrote it). Anything outside the implemented subset of PTX is
// an error naming the line, the instruction and the function: the emulator
// never guesses what an instruction means.
//
//===----------------------------------------------------------------------===//

#include "Program.h"

#include "llvm/ADT/BitVector.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/FormatVariadic.h"

#include <limits>
#include <map>
#include <optional>

using namespace tilefuse::emulator;
using llvm::StringRef;

namespace {

//===----------------------------------------------------------------------===//
// Tokens
//===----------------------------------------------------------------------===//

struct Token {
  enum Kind { Word, Number, String, Punct, End } kind = End;
  StringRef text;
  unsigned line = 0;
};

bool isWordStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == '$' ||
         c == '%' || c == '.';
}
bool isWordChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' ||
         c == '%' || c == '.' || c == ':';
}

/// Splits PTX into tokens; comments are dropped. `::` belongs to words
/// (`.shared::cta`); a single `:` ends a label.
std::vector<Token> tokenize(StringRef text) {
  std::vector<Token> tokens;
  unsigned line = 1;
  size_t i = 0, n = text.size();
  while (i < n) {
    char c = text[i];
    if (c == '\n') {
      ++line;
      ++i;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (text.substr(i).starts_with("//")) {
      while (i < n && text[i] != '\n')
        ++i;
    } else if (text.substr(i).starts_with("/*")) {
      i += 2;
      while (i < n && !text.substr(i).starts_with("*/"))
        line += text[i++] == '\n';
      i += 2;
    } else if (c == '"') {
      size_t start = i++;
      while (i < n && text[i] != '"' && text[i] != '\n')
        ++i;
      ++i;
      tokens.push_back({Token::String, text.slice(start, i), line});
    } else if (isWordStart(c)) {
      size_t start = i++;
      while (i < n && isWordChar(text[i])) {
        // A lone ':' ends the word (a label); '::' continues it.
        if (text[i] == ':' && !text.substr(i).starts_with("::") &&
            !(i > start && text[i - 1] == ':'))
          break;
        ++i;
      }
      tokens.push_back({Token::Word, text.slice(start, i), line});
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t start = i++;
      while (i < n && (std::isalnum(static_cast<unsigned char>(text[i])) ||
                       text[i] == '.'))
        ++i;
      tokens.push_back({Token::Number, text.slice(start, i), line});
    } else {
      tokens.push_back({Token::Punct, text.substr(i, 1), line});
      ++i;
    }
  }
  tokens.push_back({Token::End, StringRef(), line});
  return tokens;
}

//===----------------------------------------------------------------------===//
// Types
//===----------------------------------------------------------------------===//

struct Type {
  enum Kind { Bit, Unsigned, Signed, Float, Pred } kind = Bit;
  unsigned bits = 0;
  FloatFormat format = FloatFormat::F32; // Float
  bool pair = false;                     // .f16x2, .bf16x2
};

std::optional<Type> typeNamed(StringRef name) {
  using K = Type::Kind;
  return llvm::StringSwitch<std::optional<Type>>(name)
      .Case("b8", Type{K::Bit, 8}).Case("b16", Type{K::Bit, 16})
      .Case("b32", Type{K::Bit, 32}).Case("b64", Type{K::Bit, 64})
      .Case("u8", Type{K::Unsigned, 8}).Case("u16", Type{K::Unsigned, 16})
      .Case("u32", Type{K::Unsigned, 32}).Case("u64", Type{K::Unsigned, 64})
      .Case("s8", Type{K::Signed, 8}).Case("s16", Type{K::Signed, 16})
      .Case("s32", Type{K::Signed, 32}).Case("s64", Type{K::Signed, 64})
      .Case("f16", Type{K::Float, 16, FloatFormat::F16})
      .Case("bf16", Type{K::Float, 16, FloatFormat::BF16})
      .Case("f16x2", Type{K::Float, 32, FloatFormat::F16, true})
      .Case("bf16x2", Type{K::Float, 32, FloatFormat::BF16, true})
      .Case("f32", Type{K::Float, 32, FloatFormat::F32})
      .Case("f64", Type{K::Float, 64, FloatFormat::F64})
      .Case("pred", Type{K::Pred, 1})
      .Default(std::nullopt);
}

std::optional<IntType> intTypeOf(const Type &type) {
  bool isSigned = type.kind == Type::Signed;
  if (type.kind != Type::Bit && type.kind != Type::Unsigned && !isSigned)
    return std::nullopt;
  switch (type.bits) {
  case 16: return isSigned ? IntType::S16 : IntType::U16;
  case 32: return isSigned ? IntType::S32 : IntType::U32;
  case 64: return isSigned ? IntType::S64 : IntType::U64;
  }
  return std::nullopt;
}

std::optional<ScalarType> scalarTypeOf(const Type &type) {
  if (type.pair)
    return std::nullopt;
  if (type.kind == Type::Float)
    switch (type.format) {
    case FloatFormat::F16: return ScalarType::F16;
    case FloatFormat::BF16: return ScalarType::BF16;
    case FloatFormat::F32: return ScalarType::F32;
    case FloatFormat::F64: return ScalarType::F64;
    }
  bool isSigned = type.kind == Type::Signed;
  if (type.kind == Type::Pred)
    return std::nullopt;
  switch (type.bits) {
  case 8: return isSigned ? ScalarType::S8 : ScalarType::U8;
  case 16: return isSigned ? ScalarType::S16 : ScalarType::U16;
  case 32: return isSigned ? ScalarType::S32 : ScalarType::U32;
  case 64: return isSigned ? ScalarType::S64 : ScalarType::U64;
  }
  return std::nullopt;
}

//===----------------------------------------------------------------------===//
// Raw (parsed, not yet decoded) functions
//===----------------------------------------------------------------------===//

struct Register {
  uint32_t slot = kNoSlot;
  unsigned bits = 0;
  bool pred = false;
  std::string name;
};

/// A .param variable: a kernel parameter, or a variable in the frame's
/// .param space (a device function's parameters, call arguments).
struct ParamVar {
  bool kernel = false;
  uint32_t offset = 0, bytes = 0;
};

struct Operand {
  enum Kind {
    Reg,     // a register (or `_`: slot kNoSlot)
    Imm,     // an immediate: integer, 0f (f32 bits) or 0d (f64 bits)
    Special, // %tid.x ...
    Param,   // a .param variable
    Shared,  // a .shared array (its address)
    Name,    // a label or a function
    Address, // [base + offset]
    Vector,  // {a, b, ...}
    List     // (a, b, ...) of a call
  } kind = Reg;
  Register reg;
  uint64_t value = 0;
  char literal = 'i'; // Imm: 'i', 'f' or 'd'
  unsigned special = 0;
  ParamVar param;
  uint32_t sharedOffset = 0;
  std::string name;
  std::vector<Operand> elements;       // Vector, List; Address: the base
  int64_t offset = 0;                  // Address
  std::optional<Register> predicate;   // `d|p`
};

struct RawInstr {
  std::string opcode;
  std::vector<Operand> operands;
  std::optional<Register> guard;
  bool guardNegated = false;
  unsigned line = 0;
  std::string text;
};

struct Scope {
  llvm::StringMap<Register> registers;
  /// `.reg .b32 %r<N>` declares %r0 ... %r(N-1), given slots on first use
  /// (N may be far more than the registers used).
  struct Range {
    unsigned bits = 0;
    uint64_t count = 0;
    bool pred = false;
    llvm::DenseMap<unsigned, uint32_t> slots;
  };
  llvm::StringMap<Range> ranges;
  llvm::StringMap<ParamVar> params;
};

struct SharedDecl {
  std::string name;
  uint32_t align = 1, bytes = 0;
  bool dynamic = false;
};

/// A variable declared as `.space [.align N] .type name[[N]] [= init]`.
struct VariableDecl {
  std::string name;
  unsigned line = 0;
  uint32_t align = 1;
  uint64_t bytes = 0;
  bool unsized = false;  // name[]: sized by its initializer or the launch
  bool constant = false; // .const (module globals)
  /// The initializer's bytes (the rest of the variable is zero).
  std::vector<uint8_t> initializer;
};

struct RawFunction {
  std::unique_ptr<Function> function;
  std::vector<RawInstr> instructions;
  llvm::StringMap<unsigned> labels; // label -> raw instruction index
  std::vector<SharedDecl> shared;   // this function's own .shared arrays
  llvm::StringMap<uint32_t> locals; // .local arrays: offsets in the frame
  uint32_t carrySlot = kNoSlot;     // CC.CF, if an instruction uses it
  /// Register slots that are real registers (not specials or constants).
  llvm::BitVector registerSlots;
  std::map<uint64_t, uint32_t> constantSlots;
  std::vector<std::string> slotNames;
  unsigned bodyLine = 0;
};

llvm::Error errorAt(unsigned line, const llvm::Twine &message,
                    StringRef function) {
  std::string where =
      function.empty() ? std::string() : (" (in " + function + ")").str();
  return llvm::createStringError(
      llvm::formatv("PTX line {0}: {1}{2}", line, message.str(), where).str());
}

class Parser {
public:
  explicit Parser(StringRef text) : text(text), tokens(tokenize(text)) {
    StringRef rest = text;
    while (!rest.empty()) {
      auto [line, tail] = rest.split('\n');
      lines.push_back(line.trim());
      rest = tail;
    }
  }

  llvm::Expected<std::unique_ptr<Module>> run();

private:
  // Token access.
  const Token &peek(size_t ahead = 0) const {
    return tokens[std::min(position + ahead, tokens.size() - 1)];
  }
  const Token &next() {
    const Token &token = peek();
    if (token.kind != Token::End)
      ++position;
    return token;
  }
  bool accept(StringRef text) {
    if (peek().kind != Token::End && peek().text == text) {
      ++position;
      return true;
    }
    return false;
  }
  llvm::Error expect(StringRef text) {
    if (accept(text))
      return llvm::Error::success();
    return error(llvm::formatv("expected '{0}', found '{1}'", text,
                               peek().text));
  }
  llvm::Error error(const llvm::Twine &message) const {
    return errorAt(peek().line, message,
                   current ? current->function->name : "");
  }
  llvm::Expected<uint64_t> integer();
  /// After `.align`: a power of two.
  llvm::Expected<uint32_t> alignment();
  /// An optional `[N]` after the name of a `what` of `elementBytes`-byte
  /// elements: its size in bytes, refused above `limit`.
  llvm::Expected<uint64_t> arrayBytes(uint64_t elementBytes, uint64_t limit,
                                      StringRef what);

  // Module structure.
  llvm::Error parseDirective();
  llvm::Error parseFunction(bool entry);
  struct ParamDeclaration {
    std::string name;
    uint32_t bytes = 0, align = 0;
  };
  /// After `.param`: `[.align N] .type [.ptr [.space] [.align N]]
  /// name[[N]]`; the alignment defaults to the type's size.
  llvm::Expected<ParamDeclaration> parseParamDeclaration();
  /// Places `decl` at the first multiple of its alignment from `end` and
  /// moves `end` past it: its offset, or an error past `limit` bytes.
  llvm::Expected<uint32_t>
  placeParam(uint64_t &end, const ParamDeclaration &decl, uint64_t limit);
  llvm::Error parseParamList(RawFunction &raw, bool kernel,
                             std::vector<KernelParam> &params);
  llvm::Error parseBody(RawFunction &raw);
  llvm::Error parseStatement(RawFunction &raw);
  llvm::Error parseRegisterDeclaration();
  /// After a state space (`.shared`, `.local`, `.global`, `.const`):
  /// `[.align N] .type name[[N]] [= initializer]`, refused past `limit`
  /// bytes. Only .global and .const take an initializer.
  llvm::Expected<VariableDecl> parseVariable(StringRef space, uint64_t limit);
  llvm::Error parseInitializer(const Type &type, VariableDecl &decl);
  llvm::Expected<SharedDecl> parseSharedDeclaration(bool external);
  llvm::Error parseLocalDeclaration(RawFunction &raw);
  llvm::Error parseGlobalDeclaration(bool external);
  /// Lays out and initializes the module's .global and .const variables.
  llvm::Error allocateGlobals();
  llvm::Error parseInstruction(RawFunction &raw);
  llvm::Expected<Operand> parseOperand();
  llvm::Expected<Operand> parseAddress();
  llvm::Expected<Register> lookupRegister(StringRef name, unsigned line);
  std::optional<ParamVar> lookupParam(StringRef name) const;
  /// Whether `name` (not starting with %) is a register declared in scope.
  bool isRegister(StringRef name) const {
    for (const Scope &scope : scopes)
      if (scope.registers.count(name))
        return true;
    return false;
  }

  // Decoding.
  llvm::Error layoutShared(RawFunction &raw);
  llvm::Error decode(RawFunction &raw);

  StringRef text;
  std::vector<Token> tokens;
  std::vector<StringRef> lines;
  size_t position = 0;
  std::unique_ptr<Module> module = std::make_unique<Module>();
  std::vector<std::unique_ptr<RawFunction>> raws;
  std::vector<SharedDecl> moduleShared;
  std::vector<VariableDecl> globals;
  RawFunction *current = nullptr;
  std::vector<Scope> scopes;
  unsigned version = 0;
  /// Blocks and operands being parsed inside each other: bounded, so that
  /// no input exhausts the host's stack.
  unsigned nesting = 0;
  llvm::Error enter() {
    if (++nesting > kMaxNesting)
      return error(llvm::formatv("nested deeper than {0} levels", kMaxNesting));
    return llvm::Error::success();
  }
  static constexpr unsigned kMaxNesting = 64;
};

llvm::Expected<uint64_t> Parser::integer() {
  const Token &token = next();
  uint64_t value = 0;
  if (token.kind != Token::Number || token.text.getAsInteger(0, value))
    return errorAt(
        token.line,
        llvm::formatv("expected an integer, found '{0}'", token.text),
        current ? current->function->name : "");
  return value;
}

llvm::Expected<uint32_t> Parser::alignment() {
  unsigned line = peek().line;
  llvm::Expected<uint64_t> value = integer();
  if (!value)
    return value.takeError();
  if (!llvm::isPowerOf2_64(*value) || *value > (uint64_t(1) << 16))
    return errorAt(
        line,
        llvm::formatv(".align {0}: not a power of two up to 65536", *value),
        current ? current->function->name : "");
  return static_cast<uint32_t>(*value);
}

llvm::Expected<uint64_t> Parser::arrayBytes(uint64_t elementBytes,
                                            uint64_t limit, StringRef what) {
  if (!accept("["))
    return elementBytes;
  unsigned line = peek().line;
  llvm::Expected<uint64_t> count = integer();
  if (!count)
    return count.takeError();
  if (llvm::Error error = expect("]"))
    return std::move(error);
  if (*count > limit / elementBytes)
    return errorAt(line,
                   llvm::formatv("a {0} of {1} {2}-byte elements exceeds {3} "
                                 "bytes",
                                 what, *count, elementBytes, limit),
                   current ? current->function->name : "");
  return elementBytes * *count;
}

llvm::Expected<std::unique_ptr<Module>> Parser::run() {
  while (peek().kind != Token::End)
    if (llvm::Error error = parseDirective())
      return std::move(error);
  if (module->target.empty())
    return errorAt(1, "the module has no .target directive", "");
  if (llvm::Error error = allocateGlobals())
    return std::move(error);
  for (auto &raw : raws) {
    if (!raw->function->hasBody)
      continue;
    current = raw.get();
    if (llvm::Error error = decode(*raw))
      return std::move(error);
  }
  for (auto &raw : raws)
    module->functions.push_back(std::move(raw->function));
  return std::move(module);
}

llvm::Error Parser::parseDirective() {
  const Token &token = peek();
  if (token.text == ".version") {
    next();
    const Token &number = next();
    auto [major, minor] = number.text.split('.');
    if (major.getAsInteger(10, version) || version > 9)
      return errorAt(number.line,
                     llvm::formatv(".version {0} is not supported (PTX ISA 9.x "
                                   "and older are)",
                                   number.text),
                     "");
    return llvm::Error::success();
  }
  if (token.text == ".target") {
    next();
    const Token &target = next();
    module->target = target.text.str();
    StringRef version = target.text;
    if (!version.consume_front("sm_") ||
        version.take_while([](char c) { return std::isdigit(c); })
            .getAsInteger(10, module->smVersion))
      return errorAt(target.line,
                     llvm::formatv("unknown .target '{0}'", module->target),
                     "");
    while (accept(","))
      next(); // texmode_*, debug: no effect on execution
    return llvm::Error::success();
  }
  if (token.text == ".address_size") {
    next();
    llvm::Expected<uint64_t> size = integer();
    if (!size)
      return size.takeError();
    if (*size != 64)
      return errorAt(token.line, ".address_size must be 64", "");
    return llvm::Error::success();
  }
  bool external = false;
  while (peek().text == ".visible" || peek().text == ".extern" ||
         peek().text == ".weak") {
    external |= peek().text == ".extern";
    next();
  }
  if (accept(".entry"))
    return parseFunction(true);
  if (accept(".func"))
    return parseFunction(false);
  if (peek().text == ".shared") {
    llvm::Expected<SharedDecl> shared = parseSharedDeclaration(external);
    if (!shared)
      return shared.takeError();
    moduleShared.push_back(*shared);
    return expect(";");
  }
  if (peek().text == ".global" || peek().text == ".const")
    return parseGlobalDeclaration(external);
  return errorAt(token.line,
                 llvm::formatv("'{0}' is not supported at module scope "
                               "(only .version, .target, .address_size, "
                               ".entry, .func, .shared, .global and .const "
                               "are)",
                               token.text),
                 "");
}

llvm::Error Parser::parseFunction(bool entry) {
  auto raw = std::make_unique<RawFunction>();
  current = raw.get();
  llvm::scope_exit leave([&] { current = nullptr; });
  raw->function = std::make_unique<Function>();
  Function &fn = *raw->function;
  fn.entry = entry;
  fn.specials.fill(kNoSlot);
  scopes.assign(1, Scope());

  // A device function's return value: (.param .b64 func_retval0).
  std::vector<KernelParam> results;
  if (!entry && peek().text == "(") {
    next();
    if (llvm::Error error = parseParamList(*raw, false, results))
      return error;
  }
  const Token &name = next();
  if (name.kind != Token::Word)
    return error("expected a function name");
  fn.name = name.text.str();
  if (results.size() > 1)
    return error("a function returns at most one .param variable");
  if (!results.empty()) {
    fn.resultOffset = results[0].offset;
    fn.resultBytes = results[0].bytes;
  }
  if (peek().text == "(") {
    next();
    if (llvm::Error error = parseParamList(*raw, entry, fn.params))
      return error;
  }
  if (entry)
    for (KernelParam &param : fn.params)
      fn.kernelParamBytes =
          std::max(fn.kernelParamBytes, param.offset + param.bytes);

  // Performance directives.
  while (peek().kind == Token::Word && peek().text.starts_with(".") &&
         peek().text != "{") {
    StringRef directive = next().text;
    std::vector<uint64_t> values;
    do {
      llvm::Expected<uint64_t> value = integer();
      if (!value)
        return value.takeError();
      values.push_back(*value);
    } while (accept(","));
    bool threads = directive == ".maxntid" || directive == ".reqntid";
    if (threads &&
        (values.size() > 3 || llvm::any_of(values, [](uint64_t value) {
           return value == 0 || value > 1024;
         })))
      return error(
          llvm::formatv("{0} takes 1 to 3 sizes from 1 to 1024", directive));
    if (directive == ".maxntid") {
      fn.maxThreads = 1;
      for (uint64_t value : values)
        fn.maxThreads *= value;
    } else if (directive == ".reqntid") {
      for (size_t i = 0; i < values.size() && i < 3; ++i)
        fn.requiredThreads[i] = values[i];
      for (size_t i = values.size(); i < 3; ++i)
        fn.requiredThreads[i] = 1;
    } else if (directive == ".minnctapersm") {
      if (values.size() != 1 || values[0] == 0 ||
          values[0] > std::numeric_limits<uint32_t>::max())
        return error(".minnctapersm takes one positive block count");
      fn.minBlocksPerSM = values[0];
    } else if (directive != ".maxnreg") {
      return error(llvm::formatv("unsupported directive {0}", directive));
    }
  }

  // Prototype or definition (the definition of a declared .func replaces it).
  auto existing = module->byName.find(fn.name);
  if (accept(";")) {
    if (existing == module->byName.end()) {
      module->byName[fn.name] = raws.size();
      raws.push_back(std::move(raw));
    }
    return llvm::Error::success();
  }
  fn.hasBody = true;
  raw->bodyLine = peek().line;
  if (llvm::Error error = parseBody(*raw))
    return error;
  if (llvm::Error error = layoutShared(*raw))
    return error;
  if (existing != module->byName.end()) {
    if (raws[existing->second]->function->hasBody)
      return errorAt(raw->bodyLine, "function defined twice", fn.name);
    raws[existing->second] = std::move(raw);
  } else {
    module->byName[fn.name] = raws.size();
    raws.push_back(std::move(raw));
  }
  return llvm::Error::success();
}

llvm::Expected<Parser::ParamDeclaration> Parser::parseParamDeclaration() {
  ParamDeclaration decl;
  if (accept(".align")) {
    llvm::Expected<uint32_t> value = alignment();
    if (!value)
      return value.takeError();
    decl.align = *value;
  }
  std::optional<Type> type = typeNamed(next().text.drop_front());
  if (!type || type->kind == Type::Pred)
    return error("unsupported .param type");
  if (accept(".ptr")) {
    accept(".global") || accept(".shared") || accept(".const") ||
        accept(".local");
    if (accept(".align")) // the pointee's alignment
      if (llvm::Expected<uint64_t> ignored = integer(); !ignored)
        return ignored.takeError();
  }
  const Token &name = next();
  if (name.kind != Token::Word)
    return error("expected a parameter name");
  decl.name = name.text.str();
  llvm::Expected<uint64_t> bytes =
      arrayBytes(type->bits / 8, kMaxStackBytes, ".param variable");
  if (!bytes)
    return bytes.takeError();
  decl.bytes = *bytes;
  if (!decl.align)
    decl.align = std::max<uint32_t>(type->bits / 8, 1);
  return decl;
}

/// `( .param ..., ... )`. Kernel parameters get offsets in the launch's
/// parameter buffer; a device function's in its frame's .param space.
llvm::Error Parser::parseParamList(RawFunction &raw, bool kernel,
                                   std::vector<KernelParam> &params) {
  Function &fn = *raw.function;
  uint64_t end = kernel ? 0 : fn.paramBytes;
  while (!accept(")")) {
    if (llvm::Error error = expect(".param"))
      return error;
    llvm::Expected<ParamDeclaration> decl = parseParamDeclaration();
    if (!decl)
      return decl.takeError();
    llvm::Expected<uint32_t> offset =
        placeParam(end, *decl, kernel ? kMaxKernelParamBytes : kMaxStackBytes);
    if (!offset)
      return offset.takeError();
    params.push_back({decl->name, *offset, decl->bytes});
    scopes.front().params[decl->name] = ParamVar{kernel, *offset, decl->bytes};
    accept(",");
  }
  if (!kernel)
    fn.paramBytes = end;
  return llvm::Error::success();
}

llvm::Expected<uint32_t> Parser::placeParam(uint64_t &end,
                                            const ParamDeclaration &decl,
                                            uint64_t limit) {
  uint64_t offset = llvm::alignTo(end, decl.align);
  if (offset + decl.bytes > limit)
    return error(llvm::formatv(".param {0} ends at byte {1}: past the {2} "
                               "bytes of .param space the emulator allows "
                               "here",
                               decl.name, offset + decl.bytes, limit));
  end = offset + decl.bytes;
  return static_cast<uint32_t>(offset);
}

llvm::Error Parser::parseBody(RawFunction &raw) {
  llvm::scope_exit leave([&] { --nesting; });
  if (llvm::Error error = enter())
    return error;
  if (llvm::Error error = expect("{"))
    return error;
  scopes.emplace_back();
  while (!accept("}")) {
    if (peek().kind == Token::End)
      return error("unterminated function body");
    if (llvm::Error error = parseStatement(raw))
      return error;
  }
  scopes.pop_back();
  return llvm::Error::success();
}

llvm::Error Parser::parseStatement(RawFunction &raw) {
  const Token &token = peek();
  if (token.text == "{")
    return parseBody(raw);
  if (token.text == ".reg")
    return parseRegisterDeclaration();
  if (token.text == ".shared") {
    if (!raw.function->entry)
      return error(".shared inside a device function is not supported");
    llvm::Expected<SharedDecl> shared = parseSharedDeclaration(false);
    if (!shared)
      return shared.takeError();
    raw.shared.push_back(*shared);
    return expect(";");
  }
  if (token.text == ".local")
    return parseLocalDeclaration(raw);
  if (token.text == ".param") {
    // A call's argument or result variable, in this frame's .param space.
    next();
    llvm::Expected<ParamDeclaration> decl = parseParamDeclaration();
    if (!decl)
      return decl.takeError();
    Function &fn = *raw.function;
    uint64_t end = fn.paramBytes;
    llvm::Expected<uint32_t> offset = placeParam(end, *decl, kMaxStackBytes);
    if (!offset)
      return offset.takeError();
    scopes.back().params[decl->name] = ParamVar{false, *offset, decl->bytes};
    fn.paramBytes = end;
    return expect(";");
  }
  if (token.text == ".pragma" || token.text == ".loc" ||
      token.text == ".file") {
    // Hints and debug locations: no effect on execution.
    while (!accept(";") && peek().kind != Token::End &&
           peek().line == token.line)
      next();
    return llvm::Error::success();
  }
  if (token.kind == Token::Word && peek(1).text == ":" &&
      !token.text.starts_with(".") && !token.text.starts_with("%")) {
    if (!raw.labels.try_emplace(token.text, raw.instructions.size()).second)
      return error(llvm::formatv("label {0} defined twice", token.text));
    next();
    next();
    return llvm::Error::success();
  }
  if (token.kind == Token::Word && token.text.starts_with("."))
    return error(llvm::formatv("unsupported directive {0}", token.text));
  return parseInstruction(raw);
}

/// `.reg .type %name;`, `.reg .type a, b;` or `.reg .type %r<N>;`.
llvm::Error Parser::parseRegisterDeclaration() {
  next();
  const Token &typeToken = next();
  std::optional<Type> type = typeNamed(typeToken.text.drop_front());
  if (!type || type->pair)
    return error(llvm::formatv("unsupported register type {0}",
                               typeToken.text));
  do {
    const Token &name = next();
    if (name.kind != Token::Word)
      return error("expected a register name");
    if (accept("<")) {
      llvm::Expected<uint64_t> count = integer();
      if (!count)
        return count.takeError();
      if (llvm::Error error = expect(">"))
        return error;
      Scope::Range range;
      range.bits = type->bits;
      range.pred = type->kind == Type::Pred;
      range.count = *count;
      scopes.back().ranges[name.text] = std::move(range);
    } else {
      Register reg;
      reg.bits = type->bits;
      reg.pred = type->kind == Type::Pred;
      reg.name = name.text.str();
      scopes.back().registers[name.text] = reg;
    }
  } while (accept(","));
  return expect(";");
}

llvm::Expected<VariableDecl> Parser::parseVariable(StringRef space,
                                                   uint64_t limit) {
  VariableDecl decl;
  decl.line = next().line;
  decl.constant = space == ".const";
  if (accept(".align")) {
    llvm::Expected<uint32_t> value = alignment();
    if (!value)
      return value.takeError();
    decl.align = *value;
  }
  std::optional<Type> type = typeNamed(next().text.drop_front());
  if (!type || type->kind == Type::Pred)
    return error(llvm::formatv("unsupported {0} element type", space));
  decl.align = std::max<uint32_t>(decl.align, type->bits / 8);
  const Token &name = next();
  if (name.kind != Token::Word)
    return error(llvm::formatv("expected a {0} variable name", space));
  decl.name = name.text.str();
  if (peek().text == "[" && peek(1).text == "]") {
    next();
    next();
    decl.unsized = true;
  } else {
    llvm::Expected<uint64_t> bytes =
        arrayBytes(type->bits / 8, limit, (space + " array").str());
    if (!bytes)
      return bytes.takeError();
    decl.bytes = *bytes;
  }
  if (peek().text == "[")
    return error("multidimensional arrays are not supported");
  if (accept("=")) {
    if (space != ".global" && space != ".const")
      return error(
          llvm::formatv("initialized {0} variables are not supported", space));
    if (llvm::Error error = parseInitializer(*type, decl))
      return std::move(error);
    if (decl.unsized)
      decl.bytes = decl.initializer.size();
    if (decl.initializer.size() > decl.bytes || decl.bytes > limit)
      return errorAt(decl.line,
                     llvm::formatv("{0} {1}: {2} bytes of initializer for {3} "
                                   "bytes (at most {4})",
                                   space, decl.name, decl.initializer.size(),
                                   decl.bytes, limit),
                     "");
    decl.unsized = false;
  }
  return decl;
}

/// `= value` or `= {value, ...}`: integers for integer types, 0f/0d
/// hexadecimal literals for .f32/.f64 (what LLVM emits). Addresses of
/// variables and decimal floats are refused.
llvm::Error Parser::parseInitializer(const Type &type, VariableDecl &decl) {
  bool integerType = type.kind != Type::Float;
  if (type.pair || (!integerType && type.format != FloatFormat::F32 &&
                    type.format != FloatFormat::F64))
    return error("initializers of this type are not supported (integer, .f32 "
                 "and .f64 ones are)");
  unsigned bytes = type.bits / 8;
  bool list = accept("{");
  do {
    const Token &token = peek();
    bool negative = integerType && accept("-");
    const Token &literal = next();
    uint64_t value = 0;
    StringRef text = literal.text;
    bool valid = literal.kind == Token::Number;
    if (!integerType) {
      char prefix = type.format == FloatFormat::F32 ? 'f' : 'd';
      valid &= text.size() == 2 + bytes * 2 && text[0] == '0' &&
               std::tolower(text[1]) == prefix &&
               !text.drop_front(2).getAsInteger(16, value);
    } else {
      text.consume_back("U");
      valid &= !text.getAsInteger(0, value) &&
               (bytes == 8 ||
                (negative ? value <= (uint64_t(1) << (type.bits - 1))
                          : value < (uint64_t(1) << type.bits)));
      if (negative)
        value = 0 - value;
    }
    if (!valid)
      return errorAt(token.line,
                     llvm::formatv("{0}: unsupported initializer '{1}{2}' for "
                                   "a .{3}-bit {4} (integers, or 0f/0d "
                                   "hexadecimal floats, that fit)",
                                   decl.name, negative ? "-" : "",
                                   literal.text, type.bits,
                                   integerType ? "integer" : "float"),
                     "");
    for (unsigned i = 0; i < bytes; ++i)
      decl.initializer.push_back(static_cast<uint8_t>(value >> (8 * i)));
  } while (list && accept(","));
  return list ? expect("}") : llvm::Error::success();
}

/// `.shared [.align N] .type name[N]` (module or kernel scope); `.extern
/// .shared ... name[]` is the launch's dynamic shared memory.
llvm::Expected<SharedDecl> Parser::parseSharedDeclaration(bool external) {
  llvm::Expected<VariableDecl> variable =
      parseVariable(".shared", kMaxSharedBytes);
  if (!variable)
    return variable.takeError();
  if (variable->unsized != external)
    return error(external ? ".extern .shared arrays must be unsized ([])"
                          : "a .shared array without a size must be .extern");
  return SharedDecl{variable->name, variable->align,
                    static_cast<uint32_t>(variable->bytes), external};
}

/// `.local` arrays (LLVM's stack, __local_depot): per thread, in the frame.
llvm::Error Parser::parseLocalDeclaration(RawFunction &raw) {
  llvm::Expected<VariableDecl> variable =
      parseVariable(".local", kMaxStackBytes);
  if (!variable)
    return variable.takeError();
  if (variable->unsized)
    return error("a .local array needs a size");
  Function &fn = *raw.function;
  uint64_t offset = llvm::alignTo(fn.localBytes, variable->align);
  if (offset + variable->bytes > kMaxStackBytes)
    return error(llvm::formatv(".local arrays up to {0} take {1} bytes: past "
                               "the {2} the emulator allows",
                               variable->name, offset + variable->bytes,
                               kMaxStackBytes));
  if (!raw.locals.try_emplace(variable->name, offset).second)
    return error(llvm::formatv(".local {0} declared twice", variable->name));
  fn.localBytes = offset + variable->bytes;
  return expect(";");
}

/// Module-scope `.global` and `.const` variables, defined here (an
/// `.extern` one would live in another module: there is no linker).
llvm::Error Parser::parseGlobalDeclaration(bool external) {
  StringRef space = peek().text;
  unsigned line = peek().line;
  if (external)
    return errorAt(line,
                   llvm::formatv(".extern {0} variables are not supported "
                                 "(each module is loaded alone)",
                                 space),
                   "");
  llvm::Expected<VariableDecl> variable = parseVariable(
      space, space == ".const" ? kMaxConstBytes : kMaxGlobalBytes);
  if (!variable)
    return variable.takeError();
  if (variable->unsized || !variable->bytes)
    return errorAt(line,
                   llvm::formatv("{0} {1} has no size", space, variable->name),
                   "");
  bool taken = module->byName.count(variable->name) ||
               llvm::any_of(globals, [&](const VariableDecl &other) {
                 return other.name == variable->name;
               });
  if (taken)
    return errorAt(line,
                   llvm::formatv("{0} declared twice", variable->name), "");
  globals.push_back(std::move(*variable));
  return expect(";");
}

llvm::Error Parser::allocateGlobals() {
  // Gaps between variables, so that an access past one is an error rather
  // than a read of its neighbour.
  constexpr uint64_t kGap = 64;
  uint64_t end = 0, constEnd = 0, maxAlign = 1;
  std::vector<uint64_t> offsets;
  for (const VariableDecl &decl : globals) {
    end = llvm::alignTo(offsets.empty() ? 0 : end + kGap, decl.align);
    offsets.push_back(end);
    end += decl.bytes;
    maxAlign = std::max<uint64_t>(maxAlign, decl.align);
    if (decl.constant)
      constEnd += decl.bytes;
    if (end > kMaxGlobalBytes || constEnd > kMaxConstBytes)
      return errorAt(decl.line,
                     llvm::formatv("the module's variables up to {0} take {1} "
                                   "bytes: past the {2} the emulator allows",
                                   decl.name, decl.constant ? constEnd : end,
                                   decl.constant ? kMaxConstBytes
                                                 : kMaxGlobalBytes),
                     "");
  }
  if (globals.empty())
    return llvm::Error::success();
  // Zeroed, then each variable's initializer.
  module->globalMemory.reset(new uint8_t[end + maxAlign]());
  uint64_t base = llvm::alignTo(
      reinterpret_cast<uint64_t>(module->globalMemory.get()), maxAlign);
  for (size_t i = 0; i < globals.size(); ++i) {
    const VariableDecl &decl = globals[i];
    uint64_t address = base + offsets[i];
    // Not memcpy: an empty initializer's data() may be null (UBSan).
    llvm::copy(decl.initializer, reinterpret_cast<uint8_t *>(address));
    module->globals.push_back({decl.name, decl.constant, address, decl.bytes});
  }
  return llvm::Error::success();
}

llvm::Expected<Register> Parser::lookupRegister(StringRef name,
                                                unsigned line) {
  RawFunction &raw = *current;
  auto allocate = [&](Register &reg) {
    if (reg.slot == kNoSlot) {
      reg.slot = raw.function->slots++;
      raw.slotNames.resize(raw.function->slots);
      raw.slotNames[reg.slot] = name.str();
      raw.registerSlots.resize(raw.function->slots);
      raw.registerSlots.set(reg.slot);
      raw.function->declaredRegisters += reg.bits == 64 ? 2 : 1;
    }
  };
  for (auto scope = scopes.rbegin(); scope != scopes.rend(); ++scope) {
    auto single = scope->registers.find(name);
    if (single != scope->registers.end()) {
      allocate(single->second);
      return single->second;
    }
    StringRef prefix = name.rtrim("0123456789");
    unsigned index;
    if (prefix.size() == name.size() ||
        name.drop_front(prefix.size()).getAsInteger(10, index))
      continue;
    auto range = scope->ranges.find(prefix);
    if (range == scope->ranges.end())
      continue;
    if (index >= range->second.count)
      return errorAt(line,
                     llvm::formatv("register {0} is outside its declaration "
                                   "{1}<{2}>",
                                   name, prefix, range->second.count),
                     raw.function->name);
    Register reg;
    reg.slot = range->second.slots.lookup_or(index, kNoSlot);
    reg.bits = range->second.bits;
    reg.pred = range->second.pred;
    reg.name = name.str();
    allocate(reg);
    range->second.slots[index] = reg.slot;
    return reg;
  }
  return errorAt(line, llvm::formatv("undeclared register {0}", name),
                 raw.function->name);
}

std::optional<ParamVar> Parser::lookupParam(StringRef name) const {
  for (auto scope = scopes.rbegin(); scope != scopes.rend(); ++scope) {
    auto it = scope->params.find(name);
    if (it != scope->params.end())
      return it->second;
  }
  return std::nullopt;
}

const llvm::StringMap<unsigned> &specialRegisters() {
  static const llvm::StringMap<unsigned> table = {
      {"%tid.x", TidX},       {"%tid.y", TidY},       {"%tid.z", TidZ},
      {"%ntid.x", NtidX},     {"%ntid.y", NtidY},     {"%ntid.z", NtidZ},
      {"%ctaid.x", CtaidX},   {"%ctaid.y", CtaidY},   {"%ctaid.z", CtaidZ},
      {"%nctaid.x", NctaidX}, {"%nctaid.y", NctaidY}, {"%nctaid.z", NctaidZ},
      {"%laneid", LaneId},    {"%warpid", WarpId}};
  return table;
}

llvm::Error Parser::parseInstruction(RawFunction &raw) {
  RawInstr instr;
  instr.line = peek().line;
  instr.text = instr.line - 1 < lines.size() ? lines[instr.line - 1].str() : "";
  if (accept("@")) {
    instr.guardNegated = accept("!");
    const Token &name = next();
    llvm::Expected<Register> guard = lookupRegister(name.text, name.line);
    if (!guard)
      return guard.takeError();
    if (!guard->pred)
      return error(llvm::formatv("guard {0} is not a predicate", name.text));
    instr.guard = *guard;
  }
  const Token &opcode = next();
  if (opcode.kind != Token::Word)
    return error(llvm::formatv("expected an instruction, found '{0}'",
                               opcode.text));
  instr.opcode = opcode.text.str();
  if (!accept(";")) {
    do {
      llvm::Expected<Operand> operand = parseOperand();
      if (!operand)
        return operand.takeError();
      instr.operands.push_back(std::move(*operand));
    } while (accept(","));
    if (llvm::Error error = expect(";"))
      return error;
  }
  raw.instructions.push_back(std::move(instr));
  return llvm::Error::success();
}

llvm::Expected<Operand> Parser::parseOperand() {
  llvm::scope_exit leave([&] { --nesting; });
  if (llvm::Error error = enter())
    return std::move(error);
  Operand operand;
  const Token &token = peek();
  unsigned line = token.line;
  if (token.text == "[")
    return parseAddress();
  if (token.text == "{" || token.text == "(") {
    bool vector = token.text == "{";
    next();
    operand.kind = vector ? Operand::Vector : Operand::List;
    if (!accept(vector ? "}" : ")")) {
      do {
        llvm::Expected<Operand> element = parseOperand();
        if (!element)
          return element.takeError();
        operand.elements.push_back(std::move(*element));
      } while (accept(","));
      if (llvm::Error error = expect(vector ? "}" : ")"))
        return std::move(error);
    }
    return operand;
  }
  bool negative = false;
  if (token.text == "-" && peek(1).kind == Token::Number) {
    next();
    negative = true;
  }
  if (peek().kind == Token::Number) {
    StringRef text = next().text;
    operand.kind = Operand::Imm;
    if ((text.starts_with("0f") || text.starts_with("0F")) &&
        text.size() == 10) {
      operand.literal = 'f';
      if (text.drop_front(2).getAsInteger(16, operand.value))
        return errorAt(line, llvm::formatv("bad f32 literal {0}", text),
                       current->function->name);
    } else if ((text.starts_with("0d") || text.starts_with("0D")) &&
               text.size() == 18) {
      operand.literal = 'd';
      if (text.drop_front(2).getAsInteger(16, operand.value))
        return errorAt(line, llvm::formatv("bad f64 literal {0}", text),
                       current->function->name);
    } else {
      text.consume_back("U");
      if (text.getAsInteger(0, operand.value))
        return errorAt(line,
                       llvm::formatv("unsupported literal {0} (integers and "
                                     "0f/0d hexadecimal floats are)",
                                     text),
                       current->function->name);
    }
    if (negative) {
      if (operand.literal != 'i')
        return errorAt(line, "a negated floating-point literal",
                       current->function->name);
      operand.value = 0 - operand.value;
    }
    return operand;
  }
  if (negative || token.kind != Token::Word)
    return errorAt(line, llvm::formatv("unexpected '{0}'", token.text),
                   current->function->name);
  StringRef name = next().text;
  if (name == "_") {
    operand.kind = Operand::Reg;
    operand.reg.slot = kNoSlot;
  } else if (auto special = specialRegisters().find(name);
             special != specialRegisters().end()) {
    operand.kind = Operand::Special;
    operand.special = special->second;
  } else if (name.starts_with("%") || isRegister(name)) {
    llvm::Expected<Register> reg = lookupRegister(name, line);
    if (!reg)
      return reg.takeError();
    operand.kind = Operand::Reg;
    operand.reg = *reg;
  } else if (std::optional<ParamVar> param = lookupParam(name)) {
    operand.kind = Operand::Param;
    operand.param = *param;
    operand.name = name.str();
  } else {
    operand.kind = Operand::Name; // a label, function or .shared array
    operand.name = name.str();
  }
  if (accept("|")) {
    const Token &partner = next();
    llvm::Expected<Register> reg = lookupRegister(partner.text, partner.line);
    if (!reg)
      return reg.takeError();
    operand.predicate = *reg;
  }
  return operand;
}

/// `[reg]`, `[reg+imm]`, `[name]`, `[name+imm]` or `[imm]`.
llvm::Expected<Operand> Parser::parseAddress() {
  next();
  Operand address;
  address.kind = Operand::Address;
  unsigned line = peek().line;
  if (peek().kind == Token::Number) {
    llvm::Expected<uint64_t> value = integer();
    if (!value)
      return value.takeError();
    address.offset = static_cast<int64_t>(*value);
  } else {
    llvm::Expected<Operand> base = parseOperand();
    if (!base)
      return base.takeError();
    if (base->kind != Operand::Reg && base->kind != Operand::Param &&
        base->kind != Operand::Name)
      return errorAt(line, "unsupported address base", current->function->name);
    address.elements.push_back(std::move(*base));
    if (accept("+")) {
      bool negative = accept("-");
      llvm::Expected<uint64_t> value = integer();
      if (!value)
        return value.takeError();
      address.offset = negative ? -static_cast<int64_t>(*value)
                                : static_cast<int64_t>(*value);
    }
  }
  if (llvm::Error error = expect("]"))
    return std::move(error);
  return address;
}

/// Static .shared arrays: the module's, then the kernel's own, each at its
/// alignment; the dynamic one (.extern) after them.
llvm::Error Parser::layoutShared(RawFunction &raw) {
  Function &fn = *raw.function;
  uint64_t offset = 0;
  std::vector<SharedDecl> all = moduleShared;
  all.insert(all.end(), raw.shared.begin(), raw.shared.end());
  std::stable_partition(all.begin(), all.end(),
                        [](const SharedDecl &d) { return !d.dynamic; });
  for (const SharedDecl &decl : all) {
    uint32_t align = decl.dynamic ? std::max<uint32_t>(decl.align, 16)
                                  : decl.align;
    offset = llvm::alignTo(offset, align);
    if (offset + decl.bytes > kMaxSharedBytes)
      return errorAt(raw.bodyLine,
                     llvm::formatv("the .shared arrays up to '{0}' take {1} "
                                   "bytes: past the {2} bytes of a block",
                                   decl.name, offset + decl.bytes,
                                   kMaxSharedBytes),
                     fn.name);
    fn.shared.push_back(
        {decl.name, static_cast<uint32_t>(offset), decl.bytes, decl.dynamic});
    if (!decl.dynamic)
      fn.staticSharedBytes = offset + decl.bytes;
    offset += decl.bytes;
  }
  return llvm::Error::success();
}

//===----------------------------------------------------------------------===//
// Decoding
//===----------------------------------------------------------------------===//

/// The opcode's modifiers, taken one by one; what is left is unsupported.
class Modifiers {
public:
  explicit Modifiers(StringRef opcode) {
    llvm::SmallVector<StringRef, 8> parts;
    opcode.split(parts, '.');
    base = parts.front();
    list.assign(parts.begin() + 1, parts.end());
  }
  StringRef base;
  bool take(StringRef modifier) {
    auto it = llvm::find(list, modifier);
    if (it == list.end())
      return false;
    list.erase(it);
    return true;
  }
  std::optional<StringRef> takeAny(std::initializer_list<StringRef> options) {
    for (StringRef option : options)
      if (take(option))
        return option;
    return std::nullopt;
  }
  /// The last modifier as a type (most instructions end with it).
  std::optional<Type> takeType() {
    if (list.empty())
      return std::nullopt;
    std::optional<Type> type = typeNamed(list.back());
    if (type)
      list.pop_back();
    return type;
  }
  std::optional<Rounding> takeRounding() {
    if (take("rn"))
      return Rounding::Nearest;
    if (take("rz"))
      return Rounding::Zero;
    if (take("rm"))
      return Rounding::Down;
    if (take("rp"))
      return Rounding::Up;
    return std::nullopt;
  }
  bool empty() const { return list.empty(); }
  std::string rest() const {
    std::string text;
    for (StringRef modifier : list)
      text += "." + modifier.str();
    return text;
  }

private:
  llvm::SmallVector<StringRef, 8> list;
};

/// Decodes one function's raw instructions.
class Decoder {
public:
  Decoder(RawFunction &raw, const Module &module,
          const std::vector<std::unique_ptr<RawFunction>> &raws)
      : raw(raw), fn(*raw.function), module(module), raws(raws) {}

  llvm::Error run();

private:
  llvm::Error fail(const RawInstr &instr, const llvm::Twine &why) const {
    return errorAt(instr.line,
                   llvm::formatv("{0}: `{1}`", why.str(), instr.text).str(),
                   fn.name);
  }
  llvm::Error decodeOne(const RawInstr &instr, Instr &out);

  // Operand resolution: a slot holding the operand's value.
  llvm::Expected<uint32_t> source(const RawInstr &instr, const Operand &op,
                                  const Type &type);
  llvm::Expected<uint32_t> destination(const RawInstr &instr,
                                       const Operand &op, const Type &type);
  llvm::Expected<uint32_t> predicateSource(const RawInstr &instr,
                                           const Operand &op);
  llvm::Expected<uint32_t> predicateDestination(const RawInstr &instr,
                                                const Operand &op);
  uint32_t constant(uint64_t value);
  uint32_t special(unsigned which);
  /// The carry flag's slot (a register the thread writes with .cc).
  uint32_t carrySlot();
  /// A variable's state space ("shared", "local", "global", "const") and
  /// address, if `name` is one.
  struct Symbol {
    StringRef space;
    uint64_t address;
  };
  std::optional<Symbol> symbol(StringRef name) const;

  // Families.
  llvm::Error memory(const RawInstr &instr, Modifiers &mods, bool load,
                     Instr &out);
  llvm::Error move(const RawInstr &instr, Modifiers &mods, Instr &out);
  llvm::Error conversion(const RawInstr &instr, Modifiers &mods, Instr &out);
  llvm::Error floating(const RawInstr &instr, Modifiers &mods,
                       const Type &type, Instr &out);
  llvm::Error integer(const RawInstr &instr, Modifiers &mods,
                      const Type &type, Instr &out);
  llvm::Error carry(const RawInstr &instr, Modifiers &mods, const Type &type,
                    Instr &out);
  llvm::Error funnelShift(const RawInstr &instr, Modifiers &mods,
                          const Type &type, Instr &out);
  llvm::Error bytePermute(const RawInstr &instr, Modifiers &mods,
                          const Type &type, Instr &out);
  llvm::Error addressConversion(const RawInstr &instr, Modifiers &mods,
                                Instr &out);
  llvm::Error setp(const RawInstr &instr, Modifiers &mods, Instr &out);
  llvm::Error control(const RawInstr &instr, Modifiers &mods, Instr &out);
  llvm::Error operands(const RawInstr &instr, size_t count) const {
    if (instr.operands.size() == count)
      return llvm::Error::success();
    return fail(instr, llvm::formatv("expected {0} operands, got {1}", count,
                                     instr.operands.size()));
  }

  void insertDefinednessChecks();
  /// The reads of registers some path reaches unwritten (`check` gets the
  /// instruction and the register slot).
  void findUncertainReads(const std::vector<unsigned> &starts,
                          const std::vector<unsigned> &blockOf,
                          llvm::function_ref<void(size_t, uint32_t)> check);
  /// Rebuilds the code with CheckDefined before `checks` and MarkDefined
  /// after the writes of the `checked` registers.
  void insertChecks(const std::vector<llvm::SmallVector<uint32_t, 2>> &checks,
                    const llvm::BitVector &checked);

  RawFunction &raw;
  Function &fn;
  const Module &module;
  const std::vector<std::unique_ptr<RawFunction>> &raws;
  /// Per decoded instruction: the register slots it reads and writes.
  std::vector<llvm::SmallVector<uint32_t, 4>> reads, writes;
};

uint32_t Decoder::constant(uint64_t value) {
  auto [it, inserted] = raw.constantSlots.try_emplace(value, fn.slots);
  if (inserted) {
    ++fn.slots;
    fn.constants.push_back(value);
    fn.constantSlots.push_back(it->second);
  }
  return it->second;
}

uint32_t Decoder::carrySlot() {
  if (raw.carrySlot == kNoSlot) {
    raw.carrySlot = fn.slots++;
    raw.slotNames.resize(fn.slots);
    raw.slotNames[raw.carrySlot] = "CC.CF (the carry flag)";
    raw.registerSlots.resize(fn.slots);
    raw.registerSlots.set(raw.carrySlot);
  }
  return raw.carrySlot;
}

std::optional<Decoder::Symbol> Decoder::symbol(StringRef name) const {
  for (const SharedArray &array : fn.shared)
    if (array.name == name)
      return Symbol{"shared", array.offset};
  if (auto local = raw.locals.find(name); local != raw.locals.end())
    return Symbol{"local", local->second};
  for (const GlobalVariable &variable : module.globals)
    if (variable.name == name)
      return Symbol{variable.constant ? "const" : "global", variable.address};
  return std::nullopt;
}

uint32_t Decoder::special(unsigned which) {
  if (fn.specials[which] == kNoSlot)
    fn.specials[which] = fn.slots++;
  return fn.specials[which];
}

llvm::Expected<uint32_t> Decoder::source(const RawInstr &instr,
                                         const Operand &op, const Type &type) {
  switch (op.kind) {
  case Operand::Reg:
    if (op.reg.slot == kNoSlot)
      return fail(instr, "'_' is not a source");
    if (op.reg.pred != (type.kind == Type::Pred))
      return fail(instr, llvm::formatv("{0} is {1}a predicate", op.reg.name,
                                       op.reg.pred ? "" : "not "));
    if (op.reg.bits < type.bits)
      return fail(instr, llvm::formatv("{0} has {1} bits; the instruction "
                                       "reads {2}",
                                       op.reg.name, op.reg.bits, type.bits));
    reads.back().push_back(op.reg.slot);
    return op.reg.slot;
  case Operand::Imm: {
    if (type.kind == Type::Pred) { // 0 is false, any other integer true
      if (op.literal != 'i')
        return fail(instr, "a floating-point predicate literal");
      return constant(op.value != 0);
    }
    bool floatType = type.kind == Type::Float && !type.pair;
    if (floatType && type.format == FloatFormat::F32 && op.literal != 'f')
      return fail(instr, "an .f32 operand needs a 0f literal");
    if (floatType && type.format == FloatFormat::F64 && op.literal != 'd')
      return fail(instr, "an .f64 operand needs a 0d literal");
    if (!floatType && op.literal == 'd' && type.bits < 64)
      return fail(instr, "a 0d literal for a narrower operand");
    return constant(op.value);
  }
  case Operand::Special:
    if (type.bits != 32 || type.kind == Type::Float)
      return fail(instr, "special registers are 32-bit integers");
    return special(op.special);
  case Operand::Param:
    // A kernel parameter's address in the parameter space (PTX ISA: "the
    // address of a kernel parameter may be moved into a register").
    if (!op.param.kernel)
      return fail(instr, "only a kernel parameter's address can be taken");
    if (type.bits != 64 || type.kind == Type::Float)
      return fail(instr, "a parameter's address needs a 64-bit operand");
    for (auto [index, param] : llvm::enumerate(fn.params))
      if (param.offset == op.param.offset)
        return constant(kKernelParamSpace + (uint64_t(index) << 32));
    return fail(instr, "unknown kernel parameter");
  case Operand::Name: {
    std::optional<Symbol> found = symbol(op.name);
    if (!found)
      return fail(instr, llvm::formatv("unknown symbol {0}", op.name));
    // .shared addresses are 32-bit offsets; the others 64-bit.
    bool shared = found->space == "shared";
    if (type.bits < (shared ? 32 : 64) || type.kind == Type::Float)
      return fail(instr, llvm::formatv("a .{0} address needs a {1}-bit operand",
                                       found->space,
                                       shared ? "32- or 64" : "64"));
    return constant(found->address);
  }
  default:
    return fail(instr, "unsupported operand");
  }
}

llvm::Expected<uint32_t> Decoder::destination(const RawInstr &instr,
                                              const Operand &op,
                                              const Type &type) {
  if (op.kind != Operand::Reg)
    return fail(instr, "the destination must be a register");
  if (op.reg.slot == kNoSlot)
    return kNoSlot;
  if (op.reg.pred != (type.kind == Type::Pred))
    return fail(instr, llvm::formatv("{0} is {1}a predicate", op.reg.name,
                                     op.reg.pred ? "" : "not "));
  if (op.reg.bits < type.bits)
    return fail(instr, llvm::formatv("{0} has {1} bits; the instruction "
                                     "writes {2}",
                                     op.reg.name, op.reg.bits, type.bits));
  writes.back().push_back(op.reg.slot);
  return op.reg.slot;
}

llvm::Expected<uint32_t> Decoder::predicateSource(const RawInstr &instr,
                                                  const Operand &op) {
  return source(instr, op, Type{Type::Pred, 1});
}
llvm::Expected<uint32_t> Decoder::predicateDestination(const RawInstr &instr,
                                                       const Operand &op) {
  return destination(instr, op, Type{Type::Pred, 1});
}

/// Sets `out.r[index]` from a fallible slot lookup.
#define TILEFUSE_SLOT(out, index, expr)                                        \
  do {                                                                         \
    llvm::Expected<uint32_t> slot_ = (expr);                                   \
    if (!slot_)                                                                \
      return slot_.takeError();                                                \
    (out).r[index] = *slot_;                                                   \
  } while (false)
/// The same for a source operand (Instr::sources).
#define TILEFUSE_SOURCE(out, index, expr)                                      \
  do {                                                                         \
    TILEFUSE_SLOT(out, index, expr);                                           \
    (out).sources |= 1 << (index);                                             \
  } while (false)

llvm::Error Decoder::memory(const RawInstr &instr, Modifiers &mods, bool load,
                            Instr &out) {
  out.kind = InstructionClass::Memory;
  std::optional<Type> type = mods.takeType();
  if (!type || type->kind == Type::Pred || type->pair ||
      (type->kind == Type::Float && type->format != FloatFormat::F32 &&
       type->format != FloatFormat::F64))
    return fail(instr, "unsupported or missing type");
  unsigned count = 1;
  if (mods.take("v2"))
    count = 2;
  else if (mods.take("v4"))
    count = 4;
  std::optional<StringRef> space = mods.takeAny(
      {"global", "shared", "shared::cta", "const", "local", "param",
       "param::entry", "param::func"});
  if (!space)
    return fail(instr, "loads and stores without a state space (generic "
                       "addressing) are not supported");
  if (load && *space == "global")
    mods.take("nc");
  mods.takeAny({"ca", "cg", "cs", "lu", "cv", "wb", "wt"}); // cache hints
  if (!mods.empty())
    return fail(instr, llvm::formatv("unsupported modifier {0}", mods.rest()));
  unsigned elementBytes = type->bits / 8;
  if (elementBytes * count > 16)
    return fail(instr, "accesses wider than 16 bytes are not supported");
  out.size = elementBytes;
  out.count = count;
  if (type->kind == Type::Signed)
    out.flags |= kSignExtend;
  if (llvm::Error error = operands(instr, 2))
    return error;
  const Operand &address = instr.operands[load ? 1 : 0];
  const Operand &data = instr.operands[load ? 0 : 1];
  if (address.kind != Operand::Address)
    return fail(instr, "expected an address [..]");

  // The values: one register, or a vector of them.
  llvm::SmallVector<const Operand *, 4> values;
  if (data.kind == Operand::Vector) {
    if (data.elements.size() != count)
      return fail(instr, "the vector does not match .v2/.v4");
    for (const Operand &element : data.elements)
      values.push_back(&element);
  } else {
    if (count != 1)
      return fail(instr, "a .v2/.v4 access needs a {..} vector");
    values.push_back(&data);
  }
  for (unsigned i = 0; i < count; ++i) {
    if (load)
      TILEFUSE_SLOT(out, i, destination(instr, *values[i], *type));
    else
      TILEFUSE_SOURCE(out, i, source(instr, *values[i], *type));
  }

  // The address.
  out.imm = address.offset;
  const Operand *base = address.elements.empty() ? nullptr
                                                 : &address.elements.front();
  bool param = space->starts_with("param");
  if (param && base && base->kind == Operand::Reg && load) {
    // Through a kernel parameter's address (bounds checked as it runs).
    if (base->reg.pred || base->reg.slot == kNoSlot || base->reg.bits != 64)
      return fail(instr, "ld.param through a register needs a 64-bit one");
    reads.back().push_back(base->reg.slot);
    out.r[4] = base->reg.slot;
    out.sources |= 1 << 4;
    out.op = Op::LdKernelParamAt;
    return llvm::Error::success();
  }
  if (param) {
    if (!base || base->kind != Operand::Param)
      return fail(instr, "ld/st.param needs a .param variable or a kernel "
                         "parameter's address in a register");
    const ParamVar &var = base->param;
    if (address.offset < 0 ||
        address.offset + elementBytes * count > var.bytes)
      return fail(instr, llvm::formatv("the access is outside .param {0} "
                                       "({1} bytes)",
                                       base->name, var.bytes));
    out.imm = var.offset + address.offset;
    if (var.kernel) {
      if (!load)
        return fail(instr, "kernel parameters are read-only");
      out.op = Op::LdKernelParam;
    } else {
      out.op = load ? Op::LdFrameParam : Op::StFrameParam;
    }
    return llvm::Error::success();
  }
  bool shared = space->starts_with("shared");
  StringRef spaceName = shared ? "shared" : *space;
  if (spaceName == "const") {
    if (!load)
      return fail(instr, ".const variables are read-only");
    out.flags |= kConstSpace; // checked against the .const variables
  }
  if (spaceName == "local")
    out.op = load ? Op::LdLocal : Op::StLocal;
  else
    out.op = load ? (shared ? Op::LdShared : Op::LdGlobal)
                  : (shared ? Op::StShared : Op::StGlobal);
  if (!base) {
    out.r[4] = constant(0);
    return llvm::Error::success();
  }
  if (base->kind == Operand::Reg) {
    if (base->reg.pred || base->reg.slot == kNoSlot ||
        base->reg.bits < (shared ? 32 : 64))
      return fail(instr, llvm::formatv("address register {0} is too narrow",
                                       base->reg.name));
    // 32-bit .shared addresses are read as such.
    if (base->reg.bits == 32 && !shared)
      return fail(instr, "global addresses are 64-bit");
    reads.back().push_back(base->reg.slot);
    out.r[4] = base->reg.slot;
    out.sources |= 1 << 4;
    if (base->reg.bits == 32)
      out.flags |= kAddress32;
    return llvm::Error::success();
  }
  if (base->kind == Operand::Name) {
    std::optional<Symbol> found = symbol(base->name);
    if (found && found->space != spaceName)
      return fail(instr, llvm::formatv("{0} is a .{1} variable, not .{2}",
                                       base->name, found->space, spaceName));
    TILEFUSE_SOURCE(out, 4, source(instr, *base, Type{Type::Bit, 64}));
    return llvm::Error::success();
  }
  return fail(instr, "unsupported address");
}

llvm::Error Decoder::move(const RawInstr &instr, Modifiers &mods, Instr &out) {
  std::optional<Type> type = mods.takeType();
  if (!type || !mods.empty())
    return fail(instr, "unsupported mov");
  if (llvm::Error error = operands(instr, 2))
    return error;
  const Operand &to = instr.operands[0], &from = instr.operands[1];
  if (type->kind == Type::Pred) {
    out.op = Op::Mov;
    TILEFUSE_SLOT(out, 0, predicateDestination(instr, to));
    TILEFUSE_SOURCE(out, 1, predicateSource(instr, from));
    return llvm::Error::success();
  }
  bool pack = from.kind == Operand::Vector, unpack = to.kind == Operand::Vector;
  if (!pack && !unpack) {
    out.op = Op::Mov;
    TILEFUSE_SLOT(out, 0, destination(instr, to, *type));
    TILEFUSE_SOURCE(out, 1, source(instr, from, *type));
    return llvm::Error::success();
  }
  // {a, b} <-> one register: the first element is the low bits.
  if (type->kind != Type::Bit || (pack && unpack))
    return fail(instr, "packing moves need a .b type");
  const Operand &vector = pack ? from : to;
  size_t count = vector.elements.size();
  if (count != 2 && count != 4)
    return fail(instr, "pack or unpack 2 or 4 elements");
  unsigned elementBits = type->bits / count;
  if (elementBits < 8)
    return fail(instr, "elements narrower than 8 bits");
  Type element{Type::Bit, elementBits};
  out.kind = InstructionClass::Conversion;
  out.op = pack ? Op::Pack : Op::Unpack;
  out.count = count;
  out.size = elementBits;
  for (size_t i = 0; i < count; ++i) {
    if (pack)
      TILEFUSE_SOURCE(out, i, source(instr, vector.elements[i], element));
    else
      TILEFUSE_SLOT(out, i, destination(instr, vector.elements[i], element));
  }
  if (pack)
    TILEFUSE_SLOT(out, 4, destination(instr, to, *type));
  else
    TILEFUSE_SOURCE(out, 4, source(instr, from, *type));
  return llvm::Error::success();
}

llvm::Error Decoder::conversion(const RawInstr &instr, Modifiers &mods,
                                Instr &out) {
  out.kind = InstructionClass::Conversion;
  std::optional<Type> from = mods.takeType();
  std::optional<Type> to = mods.takeType();
  if (!from || !to || from->kind == Type::Pred || to->kind == Type::Pred)
    return fail(instr, "cvt needs a destination and a source type");
  ConversionForm form{};
  std::optional<Rounding> rounding = mods.takeRounding();
  if (!rounding) {
    if (std::optional<StringRef> integer =
            mods.takeAny({"rni", "rzi", "rmi", "rpi"})) {
      form.integerRounding = true;
      rounding = llvm::StringSwitch<Rounding>(*integer)
                     .Case("rni", Rounding::Nearest)
                     .Case("rzi", Rounding::Zero)
                     .Case("rmi", Rounding::Down)
                     .Default(Rounding::Up);
    }
  }
  form.rounding = rounding.value_or(Rounding::Nearest);
  form.ftz = mods.take("ftz");
  form.sat = mods.take("sat");
  if (!mods.empty())
    return fail(instr, llvm::formatv("unsupported modifier {0}", mods.rest()));

  // Packed pairs: d[31:16] = convert(a), d[15:0] = convert(b).
  if (to->pair) {
    if (from->kind != Type::Float || from->format != FloatFormat::F32 ||
        !rounding || form.integerRounding || *rounding != Rounding::Nearest ||
        form.ftz || form.sat)
      return fail(instr, "only cvt.rn.f16x2.f32 and cvt.rn.bf16x2.f32 are "
                         "supported");
    if (llvm::Error error = operands(instr, 3))
      return error;
    out.op = to->format == FloatFormat::F16 ? Op::CvtF16x2F32
                                            : Op::CvtBF16x2F32;
    TILEFUSE_SLOT(out, 0, destination(instr, instr.operands[0],
                                      Type{Type::Bit, 32}));
    TILEFUSE_SOURCE(out, 1, source(instr, instr.operands[1], *from));
    TILEFUSE_SOURCE(out, 2, source(instr, instr.operands[2], *from));
    return llvm::Error::success();
  }
  std::optional<ScalarType> toType = scalarTypeOf(*to),
                            fromType = scalarTypeOf(*from);
  if (!toType || !fromType || from->pair)
    return fail(instr, "unsupported cvt types");
  form.to = *toType;
  form.from = *fromType;
  bool toFloat = to->kind == Type::Float, fromFloat = from->kind == Type::Float;
  // The rounding PTX requires (and allows), as ptxas checks it.
  bool narrowing = toFloat && fromFloat && to->bits < from->bits;
  if (toFloat && fromFloat && to->bits == from->bits) {
    if (rounding && !form.integerRounding)
      return fail(instr, "a same-size float conversion takes only an integer "
                         "rounding (.rni ...)");
  } else if ((narrowing || (toFloat && !fromFloat) ||
              (!toFloat && fromFloat)) &&
             !rounding) {
    return fail(instr, "this conversion needs a rounding modifier");
  } else if (rounding && !narrowing && toFloat == fromFloat) {
    return fail(instr, "this conversion takes no rounding modifier");
  }
  if (form.integerRounding && toFloat && !fromFloat)
    return fail(instr, "integer rounding of an integer");
  if (!form.integerRounding && rounding && !toFloat && fromFloat)
    return fail(instr, "float-to-integer conversions round with .rni/.rzi/"
                       ".rmi/.rpi");
  if (llvm::Error error = operands(instr, 2))
    return error;
  // Sources and destinations wider than the type are allowed except for
  // .bf16 (PTX: "Operand Size Exceeding Instruction-Type Size").
  TILEFUSE_SLOT(out, 0, destination(instr, instr.operands[0],
                                    toFloat ? Type{Type::Bit, to->bits} : *to));
  TILEFUSE_SOURCE(out, 1,
                  source(instr, instr.operands[1],
                         fromFloat ? Type{Type::Bit, from->bits} : *from));
  auto is = [&](ScalarType t, ScalarType f) {
    return form.to == t && form.from == f && !form.ftz && !form.sat &&
           !form.integerRounding && form.rounding == Rounding::Nearest;
  };
  if (is(ScalarType::F32, ScalarType::F16))
    out.op = Op::CvtF32F16;
  else if (is(ScalarType::F32, ScalarType::BF16))
    out.op = Op::CvtF32BF16;
  else if (is(ScalarType::F16, ScalarType::F32))
    out.op = Op::CvtF16F32;
  else if (is(ScalarType::BF16, ScalarType::F32))
    out.op = Op::CvtBF16F32;
  else {
    out.op = Op::CvtGeneric;
    out.imm = fn.conversionForms.size();
    fn.conversionForms.push_back(form);
  }
  return llvm::Error::success();
}

llvm::Error Decoder::floating(const RawInstr &instr, Modifiers &mods,
                              const Type &type, Instr &out) {
  StringRef base = mods.base;
  FloatForm form{};
  form.format = type.format;
  form.lanes = type.pair ? 2 : 1;
  std::optional<Rounding> rounding = mods.takeRounding();
  form.rounding = rounding.value_or(Rounding::Nearest);
  form.approx = mods.take("approx");
  bool full = mods.take("full");
  form.ftz = mods.take("ftz");
  form.sat = mods.take("sat");
  form.nan = mods.take("NaN");
  form.relu = mods.take("relu");
  if (!mods.empty())
    return fail(instr, llvm::formatv("unsupported modifier {0}", mods.rest()));
  std::optional<FloatKind> kind =
      llvm::StringSwitch<std::optional<FloatKind>>(base)
          .Case("add", FloatKind::Add).Case("sub", FloatKind::Sub)
          .Case("mul", FloatKind::Mul).Case("fma", FloatKind::Fma)
          .Case("mad", FloatKind::Fma).Case("div", FloatKind::Div)
          .Case("min", FloatKind::Min).Case("max", FloatKind::Max)
          .Case("neg", FloatKind::Neg).Case("abs", FloatKind::Abs)
          .Case("sqrt", FloatKind::Sqrt).Case("rcp", FloatKind::Rcp)
          .Case("rsqrt", FloatKind::Rsqrt).Case("ex2", FloatKind::Ex2)
          .Case("lg2", FloatKind::Lg2).Case("copysign", FloatKind::Copysign)
          .Default(std::nullopt);
  if (!kind)
    return fail(instr, "not implemented by the emulator");
  form.kind = *kind;
  FloatFormat format = type.format;
  bool half = format == FloatFormat::F16 || format == FloatFormat::BF16;
  bool f32 = format == FloatFormat::F32, f64 = format == FloatFormat::F64;

  // What PTX allows for each (ptxas refuses the rest; so do we).
  bool arithmetic = *kind == FloatKind::Add || *kind == FloatKind::Sub ||
                    *kind == FloatKind::Mul || *kind == FloatKind::Fma;
  bool roundable = arithmetic || *kind == FloatKind::Div ||
                   *kind == FloatKind::Sqrt || *kind == FloatKind::Rcp;
  bool approximate = *kind == FloatKind::Rsqrt || *kind == FloatKind::Ex2 ||
                     *kind == FloatKind::Lg2;
  if (type.pair && !(arithmetic || *kind == FloatKind::Neg ||
                     *kind == FloatKind::Abs || *kind == FloatKind::Min ||
                     *kind == FloatKind::Max || *kind == FloatKind::Ex2))
    return fail(instr, "not implemented for packed halves");
  // ex2.approx.f16 flushes nothing; ex2.approx.ftz.bf16 must say so.
  bool halfExp2 = half && *kind == FloatKind::Ex2;
  if (halfExp2 && form.ftz != (format == FloatFormat::BF16))
    return fail(instr, "ex2 takes .ftz with .bf16 and .bf16x2, and only "
                       "there among the halves");
  if (rounding && !roundable)
    return fail(instr, "this instruction takes no rounding modifier");
  if (half && rounding && *rounding != Rounding::Nearest)
    return fail(instr, "f16/bf16 arithmetic rounds to nearest only");
  if (*kind == FloatKind::Fma && !rounding)
    return fail(instr, "fma and mad need a rounding modifier");
  if ((*kind == FloatKind::Div || *kind == FloatKind::Sqrt ||
       *kind == FloatKind::Rcp) &&
      !rounding && !form.approx && !full)
    return fail(instr, "needs .rn/.rz/.rm/.rp or .approx");
  if (approximate && !form.approx)
    return fail(instr, "needs .approx");
  if (form.approx && !(approximate || *kind == FloatKind::Div ||
                       *kind == FloatKind::Sqrt || *kind == FloatKind::Rcp))
    return fail(instr, "takes no .approx");
  if (full && !(*kind == FloatKind::Div && f32))
    return fail(instr, ".full is for div.f32 only");
  form.approx |= full;
  form.full = full;
  if (form.ftz && !(f32 || (format == FloatFormat::F16) ||
                    (f64 && form.approx) || halfExp2))
    return fail(instr, ".ftz is for .f32 and .f16");
  if (form.sat && !((f32 || format == FloatFormat::F16) &&
                    (arithmetic)))
    return fail(instr, ".sat is for .f32/.f16 add, sub, mul and fma");
  if (form.nan && !(*kind == FloatKind::Min || *kind == FloatKind::Max) )
    return fail(instr, ".NaN is for min and max");
  if (form.nan && f64)
    return fail(instr, "min/max.NaN.f64 does not exist");
  if (form.relu && !(*kind == FloatKind::Fma && half))
    return fail(instr, ".relu is for f16/bf16 fma");
  if (half && !(arithmetic || *kind == FloatKind::Neg ||
                *kind == FloatKind::Abs || *kind == FloatKind::Min ||
                *kind == FloatKind::Max || *kind == FloatKind::Ex2))
    return fail(instr, "not implemented for f16/bf16");
  if (*kind == FloatKind::Copysign && half)
    return fail(instr, "copysign is for .f32 and .f64");

  unsigned arity = *kind == FloatKind::Fma ? 3
                   : (*kind == FloatKind::Neg || *kind == FloatKind::Abs ||
                      *kind == FloatKind::Sqrt || *kind == FloatKind::Rcp ||
                      approximate)
                       ? 1
                       : 2;
  if (llvm::Error error = operands(instr, arity + 1))
    return error;
  TILEFUSE_SLOT(out, 0, destination(instr, instr.operands[0], type));
  for (unsigned i = 0; i < arity; ++i)
    TILEFUSE_SOURCE(out, i + 1, source(instr, instr.operands[i + 1], type));

  out.kind = f64 ? InstructionClass::Double : InstructionClass::Arithmetic;
  if (approximate || (form.approx && (*kind == FloatKind::Sqrt ||
                                      *kind == FloatKind::Rcp ||
                                      (*kind == FloatKind::Div && !full))))
    out.kind = InstructionClass::Transcendental;
  else if (*kind == FloatKind::Div || *kind == FloatKind::Sqrt ||
           *kind == FloatKind::Rcp)
    out.kind = InstructionClass::Division;

  // The hot forms get their own op.
  bool plain = !form.ftz && !form.sat && !form.relu &&
               form.rounding == Rounding::Nearest && form.lanes == 1;
  std::optional<Op> fast;
  if (f32 && plain && !form.approx) {
    switch (*kind) {
    case FloatKind::Add: fast = Op::AddF32; break;
    case FloatKind::Sub: fast = Op::SubF32; break;
    case FloatKind::Mul: fast = Op::MulF32; break;
    case FloatKind::Fma: fast = Op::FmaF32; break;
    case FloatKind::Neg: fast = Op::NegF32; break;
    case FloatKind::Abs: fast = Op::AbsF32; break;
    case FloatKind::Min: fast = form.nan ? Op::MinNaNF32 : Op::MinF32; break;
    case FloatKind::Max: fast = form.nan ? Op::MaxNaNF32 : Op::MaxF32; break;
    case FloatKind::Div: fast = Op::DivF32; break;
    case FloatKind::Copysign: fast = Op::CopysignF32; break;
    case FloatKind::Sqrt: fast = Op::SqrtF32; break;
    case FloatKind::Rcp: fast = Op::RcpF32; break;
    default: break;
    }
  } else if (f32 && form.approx && !form.sat && form.lanes == 1) {
    if (*kind == FloatKind::Ex2)
      fast = form.ftz ? Op::Ex2FtzF32 : Op::Ex2F32;
    else if (*kind == FloatKind::Rsqrt && !form.ftz)
      fast = Op::RsqrtF32;
    else if (*kind == FloatKind::Sqrt && !form.ftz)
      fast = Op::SqrtApproxF32;
    else if (*kind == FloatKind::Rcp && form.ftz)
      fast = Op::RcpApproxFtzF32;
  } else if (f64 && plain && !form.approx) {
    switch (*kind) {
    case FloatKind::Add: fast = Op::AddF64; break;
    case FloatKind::Sub: fast = Op::SubF64; break;
    case FloatKind::Mul: fast = Op::MulF64; break;
    case FloatKind::Fma: fast = Op::FmaF64; break;
    case FloatKind::Neg: fast = Op::NegF64; break;
    case FloatKind::Abs: fast = Op::AbsF64; break;
    case FloatKind::Min: fast = Op::MinF64; break;
    case FloatKind::Max: fast = Op::MaxF64; break;
    case FloatKind::Div: fast = Op::DivF64; break;
    case FloatKind::Copysign: fast = Op::CopysignF64; break;
    case FloatKind::Sqrt: fast = Op::SqrtF64; break;
    case FloatKind::Rcp: fast = Op::RcpF64; break;
    default: break;
    }
  } else if (f64 && form.approx) {
    if (*kind == FloatKind::Rsqrt && !form.ftz)
      fast = Op::RsqrtApproxF64;
    else if (*kind == FloatKind::Rcp && form.ftz)
      fast = Op::RcpApproxFtzF64;
    else
      return fail(instr, "not implemented for .f64");
  }
  if (fast) {
    out.op = *fast;
    return llvm::Error::success();
  }
  out.op = Op::FloatGeneric;
  out.imm = fn.floatForms.size();
  fn.floatForms.push_back(form);
  return llvm::Error::success();
}

llvm::Error Decoder::integer(const RawInstr &instr, Modifiers &mods,
                             const Type &type, Instr &out) {
  StringRef base = mods.base;
  if (type.kind == Type::Pred) {
    // Logic on predicates.
    if (!mods.empty())
      return fail(instr,
                  llvm::formatv("unsupported modifier {0}", mods.rest()));
    bool unary = base == "not";
    if (llvm::Error error = operands(instr, unary ? 2 : 3))
      return error;
    out.op = llvm::StringSwitch<Op>(base)
                 .Case("and", Op::AndU64)
                 .Case("or", Op::OrU64)
                 .Case("xor", Op::XorU64)
                 .Default(Op::NotPred);
    if (base != "and" && base != "or" && base != "xor" && !unary)
      return fail(instr, "not a predicate instruction");
    TILEFUSE_SLOT(out, 0, predicateDestination(instr, instr.operands[0]));
    TILEFUSE_SOURCE(out, 1, predicateSource(instr, instr.operands[1]));
    if (!unary)
      TILEFUSE_SOURCE(out, 2, predicateSource(instr, instr.operands[2]));
    return llvm::Error::success();
  }
  if (base == "addc" || base == "subc" || base == "madc" || mods.take("cc"))
    return carry(instr, mods, type, out);
  if (base == "shf")
    return funnelShift(instr, mods, type, out);
  if (base == "prmt")
    return bytePermute(instr, mods, type, out);
  std::optional<IntType> intType = intTypeOf(type);
  if (!intType)
    return fail(instr, "unsupported integer type");
  bool isSigned = type.kind == Type::Signed;
  bool bitType = type.kind == Type::Bit;
  std::optional<Op> first;
  unsigned arity = 2;
  Type destinationType = type, shiftType{Type::Unsigned, 32};
  bool shift = false;
  if (base == "mul" || base == "mad") {
    std::optional<StringRef> part = mods.takeAny({"lo", "hi", "wide"});
    if (!part)
      return fail(instr, "mul and mad need .lo, .hi or .wide");
    if (bitType)
      return fail(instr, "mul/mad take .u or .s types");
    bool mad = base == "mad";
    arity = mad ? 3 : 2;
    if (*part == "wide") {
      if (type.bits == 64)
        return fail(instr, ".wide is for 16- and 32-bit types");
      destinationType.bits = type.bits * 2;
      first = mad ? Op::MadWideU16 : Op::MulWideU16;
    } else {
      first = *part == "lo" ? (mad ? Op::MadLoU16 : Op::MulLoU16)
                            : (mad ? Op::MadHiU16 : Op::MulHiU16);
    }
  } else {
    std::optional<Op> op =
        llvm::StringSwitch<std::optional<Op>>(base)
            .Case("add", Op::AddU16).Case("sub", Op::SubU16)
            .Case("min", Op::MinU16).Case("max", Op::MaxU16)
            .Case("div", Op::DivU16).Case("rem", Op::RemU16)
            .Case("and", Op::AndU16).Case("or", Op::OrU16)
            .Case("xor", Op::XorU16).Case("shl", Op::ShlU16)
            .Case("shr", Op::ShrU16).Case("not", Op::NotU16)
            .Case("neg", Op::NegU16).Case("abs", Op::AbsU16)
            .Case("popc", Op::PopcU16).Case("clz", Op::ClzU16)
            .Case("bfe", Op::BfeU16)
            .Default(std::nullopt);
    if (!op)
      return fail(instr, "not implemented by the emulator");
    first = op;
    bool logic = base == "and" || base == "or" || base == "xor" ||
                 base == "not";
    if (logic && !bitType)
      return fail(instr, "logic instructions take .b types");
    if ((base == "add" || base == "sub" || base == "min" || base == "max" ||
         base == "div" || base == "rem" || base == "neg" || base == "abs" ||
         base == "bfe") &&
        bitType)
      return fail(instr, "takes .u or .s types");
    if (base == "shl" && !bitType)
      return fail(instr, "shl takes .b types");
    if ((base == "neg" || base == "abs") && !isSigned)
      return fail(instr, "takes .s types");
    if ((base == "popc" || base == "clz") && (!bitType || type.bits < 32))
      return fail(instr, "takes .b32 or .b64");
    if (base == "bfe" && type.bits < 32)
      return fail(instr, "bfe takes 32- or 64-bit types");
    if (base == "not" || base == "neg" || base == "abs" || base == "popc" ||
        base == "clz")
      arity = 1;
    if (base == "bfe")
      arity = 3;
    if (base == "popc" || base == "clz")
      destinationType = Type{Type::Unsigned, 32};
    shift = base == "shl" || base == "shr";
  }
  if (!mods.empty())
    return fail(instr, llvm::formatv("unsupported modifier {0}", mods.rest()));
  if (llvm::Error error = operands(instr, arity + 1))
    return error;
  out.op = typedOp(*first, *intType);
  TILEFUSE_SLOT(out, 0, destination(instr, instr.operands[0], destinationType));
  for (unsigned i = 0; i < arity; ++i) {
    // Shift amounts and bfe's position and length are .u32; .wide mad
    // adds a double-width c.
    Type operandType = type;
    if ((shift && i == 1) || (base == "bfe" && i > 0))
      operandType = shiftType;
    if (first == Op::MadWideU16 && i == 2)
      operandType = destinationType;
    TILEFUSE_SOURCE(out, i + 1,
                    source(instr, instr.operands[i + 1], operandType));
  }
  return llvm::Error::success();
}

/// add.cc, addc(.cc), sub.cc, subc(.cc), mad.{lo,hi}.cc, madc.{lo,hi}(.cc):
/// the carry flag in and out (`.cc` was taken by integer()).
llvm::Error Decoder::carry(const RawInstr &instr, Modifiers &mods,
                           const Type &type, Instr &out) {
  StringRef base = mods.base;
  bool carryIn = base.ends_with("c");
  bool carryOut = !carryIn || mods.take("cc");
  bool mad = base.starts_with("mad");
  std::optional<StringRef> part =
      mad ? mods.takeAny({"lo", "hi"}) : std::nullopt;
  bool known = base == "add" || base == "sub" || base == "mad" ||
               base == "addc" || base == "subc" || base == "madc";
  if (!known || type.bits < 32 || type.kind == Type::Bit ||
      type.kind == Type::Float || (mad && !part) || !mods.empty())
    return fail(instr, "carry arithmetic is add, sub and mad.lo/.hi with .cc, "
                       "or addc, subc and madc.lo/.hi, on .u32, .s32, .u64 "
                       "or .s64");
  if (llvm::Error error = operands(instr, mad ? 4 : 3))
    return error;
  out.op = Op::Carry;
  out.size = type.bits;
  out.compare = static_cast<uint8_t>(
      !mad ? (base.starts_with("add") ? CarryKind::Add : CarryKind::Sub)
           : (*part == "lo" ? CarryKind::MadLo : CarryKind::MadHi));
  if (type.kind == Type::Signed)
    out.flags |= kSigned;
  TILEFUSE_SLOT(out, 0, destination(instr, instr.operands[0], type));
  for (unsigned i = 1; i < (mad ? 4u : 3u); ++i)
    TILEFUSE_SOURCE(out, i, source(instr, instr.operands[i], type));
  out.r[4] = carrySlot();
  if (carryIn) {
    out.flags |= kCarryIn;
    out.sources |= 1 << 4;
    reads.back().push_back(out.r[4]);
  }
  if (carryOut) {
    out.flags |= kCarryOut;
    writes.back().push_back(out.r[4]);
  }
  return llvm::Error::success();
}

/// shf.{l,r}.{wrap,clamp}.b32 d, a, b, n: the high (l) or low (r) word of
/// {b, a} shifted by n.
llvm::Error Decoder::funnelShift(const RawInstr &instr, Modifiers &mods,
                                 const Type &type, Instr &out) {
  std::optional<StringRef> direction = mods.takeAny({"l", "r"});
  std::optional<StringRef> mode = mods.takeAny({"wrap", "clamp"});
  if (!direction || !mode || !mods.empty() || type.kind != Type::Bit ||
      type.bits != 32)
    return fail(instr, "only shf.{l,r}.{wrap,clamp}.b32 is implemented");
  if (llvm::Error error = operands(instr, 4))
    return error;
  out.op = Op::Funnel;
  out.compare = *direction == "l";
  if (*mode == "wrap")
    out.flags |= kWrap;
  TILEFUSE_SLOT(out, 0, destination(instr, instr.operands[0], type));
  TILEFUSE_SOURCE(out, 1, source(instr, instr.operands[1], type));
  TILEFUSE_SOURCE(out, 2, source(instr, instr.operands[2], type));
  TILEFUSE_SOURCE(out, 3, source(instr, instr.operands[3],
                                 Type{Type::Unsigned, 32}));
  return llvm::Error::success();
}

/// prmt.b32 in its default mode (what LLVM emits to pack and unpack bytes);
/// the .f4e, .b4e, .rc8, .ecl, .ecr and .rc16 modes are not implemented.
llvm::Error Decoder::bytePermute(const RawInstr &instr, Modifiers &mods,
                                 const Type &type, Instr &out) {
  if (!mods.empty() || type.kind != Type::Bit || type.bits != 32)
    return fail(instr, "only prmt.b32 (the default mode) is implemented");
  if (llvm::Error error = operands(instr, 4))
    return error;
  out.op = Op::Permute;
  TILEFUSE_SLOT(out, 0, destination(instr, instr.operands[0], type));
  for (unsigned i = 1; i < 4; ++i)
    TILEFUSE_SOURCE(out, i, source(instr, instr.operands[i], type));
  return llvm::Error::success();
}

/// cvta(.to).{global,const}.u64: global and constant addresses are host
/// addresses here, as generic ones are, so the conversion is a move.
llvm::Error Decoder::addressConversion(const RawInstr &instr, Modifiers &mods,
                                       Instr &out) {
  std::optional<Type> type = mods.takeType();
  mods.take("to");
  std::optional<StringRef> space = mods.takeAny({"global", "const"});
  if (!space || !type || type->bits != 64 || type->kind == Type::Float ||
      !mods.empty())
    return fail(instr, "only cvta(.to).global.u64 and cvta(.to).const.u64 "
                       "are implemented");
  if (llvm::Error error = operands(instr, 2))
    return error;
  const Operand &from = instr.operands[1];
  if (from.kind == Operand::Name)
    if (std::optional<Symbol> found = symbol(from.name);
        found && found->space != *space)
      return fail(instr, llvm::formatv("{0} is a .{1} variable, not .{2}",
                                       from.name, found->space, *space));
  out.op = Op::Mov;
  TILEFUSE_SLOT(out, 0, destination(instr, instr.operands[0], *type));
  TILEFUSE_SOURCE(out, 1, source(instr, from, *type));
  return llvm::Error::success();
}

std::optional<Compare> compareNamed(StringRef name, bool &unsignedSpelling) {
  unsignedSpelling = name == "lo" || name == "ls" || name == "hi" ||
                     name == "hs";
  return llvm::StringSwitch<std::optional<Compare>>(name)
      .Case("eq", Compare::Eq).Case("ne", Compare::Ne)
      .Case("lt", Compare::Lt).Case("le", Compare::Le)
      .Case("gt", Compare::Gt).Case("ge", Compare::Ge)
      .Case("lo", Compare::Lt).Case("ls", Compare::Le)
      .Case("hi", Compare::Gt).Case("hs", Compare::Ge)
      .Case("equ", Compare::Equ).Case("neu", Compare::Neu)
      .Case("ltu", Compare::Ltu).Case("leu", Compare::Leu)
      .Case("gtu", Compare::Gtu).Case("geu", Compare::Geu)
      .Case("num", Compare::Num).Case("nan", Compare::Nan)
      .Default(std::nullopt);
}

llvm::Error Decoder::setp(const RawInstr &instr, Modifiers &mods,
                          Instr &out) {
  std::optional<Type> type = mods.takeType();
  bool ftz = mods.take("ftz");
  if (!type || type->kind == Type::Pred || type->pair ||
      (type->kind != Type::Float && !intTypeOf(*type)))
    return fail(instr, "unsupported setp type");
  if (mods.empty())
    return fail(instr, "setp needs a comparison");
  std::optional<Compare> compare;
  bool unsignedSpelling = false;
  for (StringRef candidate : {"eq", "ne", "lt", "le", "gt", "ge", "lo", "ls",
                              "hi", "hs", "equ", "neu", "ltu", "leu", "gtu",
                              "geu", "num", "nan"})
    if (mods.take(candidate)) {
      compare = compareNamed(candidate, unsignedSpelling);
      break;
    }
  if (!compare || !mods.empty())
    return fail(instr, "unsupported setp (combining forms like setp.lt.and "
                       "are not implemented)");
  bool floating = type->kind == Type::Float;
  if (!floating && *compare > Compare::Ge)
    return fail(instr, "unordered comparisons are for floating point");
  if (type->kind == Type::Bit && *compare != Compare::Eq &&
      *compare != Compare::Ne)
    return fail(instr, ".b types compare with eq and ne only");
  if (unsignedSpelling && type->kind != Type::Unsigned)
    return fail(instr, "lo/ls/hi/hs are for .u types");
  if (ftz && (!floating || type->format != FloatFormat::F32))
    return fail(instr, ".ftz is for .f32");
  if (llvm::Error error = operands(instr, 3))
    return error;
  if (instr.operands[0].predicate)
    return fail(instr, "setp with two destinations (p|q) is not implemented");
  out.compare = static_cast<uint8_t>(*compare);
  TILEFUSE_SLOT(out, 0, predicateDestination(instr, instr.operands[0]));
  TILEFUSE_SOURCE(out, 1, source(instr, instr.operands[1], *type));
  TILEFUSE_SOURCE(out, 2, source(instr, instr.operands[2], *type));
  if (ftz)
    out.flags |= kSubnormalFlush;
  if (!floating) {
    out.op = typedOp(Op::SetpIntU16, *intTypeOf(*type));
    return llvm::Error::success();
  }
  switch (type->format) {
  case FloatFormat::F32: out.op = Op::SetpF32; break;
  case FloatFormat::F64:
    out.op = Op::SetpF64;
    out.kind = InstructionClass::Double;
    break;
  case FloatFormat::F16:
  case FloatFormat::BF16:
    out.op = Op::SetpHalf;
    out.size = type->format == FloatFormat::BF16;
    break;
  }
  return llvm::Error::success();
}

llvm::Error Decoder::control(const RawInstr &instr, Modifiers &mods,
                             Instr &out) {
  StringRef base = mods.base;
  out.kind = InstructionClass::Control;
  mods.take("uni");
  if (base == "bra") {
    if (!mods.empty())
      return fail(instr,
                  llvm::formatv("unsupported modifier {0}", mods.rest()));
    if (llvm::Error error = operands(instr, 1))
      return error;
    const Operand &target = instr.operands[0];
    auto label = target.kind == Operand::Name ? raw.labels.find(target.name)
                                              : raw.labels.end();
    if (label == raw.labels.end())
      return fail(instr, "unknown branch target");
    out.op = Op::Bra;
    out.imm = label->second; // a raw index until insertDefinednessChecks
    return llvm::Error::success();
  }
  if (base == "ret" || base == "exit") {
    if (!mods.empty() || !instr.operands.empty())
      return fail(instr, "unsupported form");
    if (base == "exit" && !fn.entry)
      return fail(instr, "exit in a device function is not supported");
    out.op = Op::Ret;
    return llvm::Error::success();
  }
  // call (result), function, (arguments)
  if (!mods.empty())
    return fail(instr, llvm::formatv("unsupported modifier {0}", mods.rest()));
  const std::vector<Operand> &ops = instr.operands;
  size_t index = 0;
  const Operand *result = nullptr, *arguments = nullptr;
  if (index < ops.size() && ops[index].kind == Operand::List)
    result = &ops[index++];
  if (index >= ops.size() || ops[index].kind != Operand::Name)
    return fail(instr, "only direct calls are supported");
  const std::string &calleeName = ops[index++].name;
  if (index < ops.size() && ops[index].kind == Operand::List)
    arguments = &ops[index++];
  if (index != ops.size())
    return fail(instr, "unsupported call form (call tables, prototypes)");
  auto found = module.byName.find(calleeName);
  if (found == module.byName.end())
    return fail(instr, llvm::formatv("calls unknown function {0}", calleeName));
  const Function &callee = *raws[found->second]->function;
  if (callee.entry || !callee.hasBody)
    return fail(instr, llvm::formatv("calls {0}, which has no body here",
                                     calleeName));
  CallSite site;
  site.callee = found->second;
  size_t argumentCount = arguments ? arguments->elements.size() : 0;
  if (argumentCount != callee.params.size())
    return fail(instr, llvm::formatv("{0} takes {1} arguments", calleeName,
                                     callee.params.size()));
  for (size_t i = 0; i < argumentCount; ++i) {
    const Operand &argument = arguments->elements[i];
    if (argument.kind != Operand::Param || argument.param.kernel ||
        argument.param.bytes != callee.params[i].bytes)
      return fail(instr, "arguments must be .param variables of the "
                         "parameter's size");
    site.arguments.push_back(
        {argument.param.offset, callee.params[i].offset, argument.param.bytes});
  }
  if (result) {
    if (result->elements.size() != 1 ||
        result->elements[0].kind != Operand::Param ||
        result->elements[0].param.bytes != callee.resultBytes)
      return fail(instr, "the result must be one .param variable of the "
                         "function's return size");
    site.results.push_back({callee.resultOffset,
                            result->elements[0].param.offset,
                            callee.resultBytes});
  } else if (callee.resultBytes) {
    // The caller ignores the value.
  }
  out.op = Op::Call;
  out.imm = fn.calls.size();
  fn.calls.push_back(std::move(site));
  return llvm::Error::success();
}

llvm::Error Decoder::decodeOne(const RawInstr &instr, Instr &out) {
  Modifiers mods(instr.opcode);
  StringRef base = mods.base;
  if (instr.guard) {
    out.guardSense = instr.guardNegated ? 2 : 1;
    out.guard = instr.guard->slot;
    reads.back().push_back(out.guard);
  }
  if (base == "ld" || base == "st")
    return memory(instr, mods, base == "ld", out);
  if (base == "mov")
    return move(instr, mods, out);
  if (base == "cvta")
    return addressConversion(instr, mods, out);
  if (base == "cvt")
    return conversion(instr, mods, out);
  if (base == "setp")
    return setp(instr, mods, out);
  if (base == "bra" || base == "ret" || base == "exit" || base == "call")
    return control(instr, mods, out);
  if (base == "selp") {
    std::optional<Type> type = mods.takeType();
    if (!type || type->kind == Type::Pred || !mods.empty())
      return fail(instr, "unsupported selp");
    if (llvm::Error error = operands(instr, 4))
      return error;
    out.op = Op::Selp;
    TILEFUSE_SLOT(out, 0, destination(instr, instr.operands[0], *type));
    TILEFUSE_SOURCE(out, 1, source(instr, instr.operands[1], *type));
    TILEFUSE_SOURCE(out, 2, source(instr, instr.operands[2], *type));
    TILEFUSE_SOURCE(out, 3, predicateSource(instr, instr.operands[3]));
    return llvm::Error::success();
  }
  if (base == "bar" || base == "barrier") {
    // bar.sync a{, b} = barrier.sync.aligned a{, b}: the threads of the
    // block (or b of them, whole warps) wait at barrier a.
    mods.take("cta");
    bool aligned = base == "bar" || mods.take("aligned");
    if (!mods.take("sync") || !mods.empty() || !aligned)
      return fail(instr, "only bar.sync and barrier.sync.aligned are "
                         "implemented");
    if (instr.operands.empty() || instr.operands.size() > 2 ||
        (instr.operands[0].kind == Operand::Imm &&
         instr.operands[0].value > 15))
      return fail(instr, "a barrier number 0-15 and an optional thread count "
                         "are expected");
    out.op = Op::Bar;
    out.kind = InstructionClass::Sync;
    Type word{Type::Bit, 32};
    TILEFUSE_SOURCE(out, 0, source(instr, instr.operands[0], word));
    if (instr.operands.size() == 2)
      TILEFUSE_SOURCE(out, 1, source(instr, instr.operands[1], word));
    return llvm::Error::success();
  }
  if (base == "shfl") {
    std::optional<Type> type = mods.takeType();
    if (!mods.take("sync") || !type || type->bits != 32 ||
        type->kind != Type::Bit)
      return fail(instr, "only shfl.sync.<mode>.b32 is implemented");
    std::optional<StringRef> mode = mods.takeAny({"up", "down", "bfly", "idx"});
    if (!mode || !mods.empty())
      return fail(instr, "unsupported shfl mode");
    if (llvm::Error error = operands(instr, 5))
      return error;
    out.op = Op::Shfl;
    out.kind = InstructionClass::Sync;
    out.compare = llvm::StringSwitch<uint8_t>(*mode)
                      .Case("up", 0).Case("down", 1).Case("bfly", 2)
                      .Default(3);
    Type u32{Type::Bit, 32};
    TILEFUSE_SLOT(out, 0, destination(instr, instr.operands[0], u32));
    if (instr.operands[0].predicate) {
      Operand predicate;
      predicate.reg = *instr.operands[0].predicate;
      TILEFUSE_SLOT(out, 1, predicateDestination(instr, predicate));
    }
    for (unsigned i = 1; i < 5; ++i)
      TILEFUSE_SOURCE(out, i + 1, source(instr, instr.operands[i], u32));
    return llvm::Error::success();
  }
  std::optional<Type> type = mods.takeType();
  if (!type)
    return fail(instr, "not implemented by the emulator");
  if (type->kind == Type::Float)
    return floating(instr, mods, *type, out);
  return integer(instr, mods, *type, out);
}

/// Finds register reads that may happen before any write on some path
/// (a must-be-written data flow over the function's control flow), checks
/// those at run time (CheckDefined), and records the writes of the
/// registers involved (MarkDefined). Reads that are written on every path
/// cost nothing.
void Decoder::insertDefinednessChecks() {
  size_t count = fn.code.size();
  unsigned slots = fn.slots;
  // Basic blocks: leaders are the entry, branch targets and what follows
  // a branch or return.
  std::vector<bool> leader(count + 1, false);
  leader[0] = true;
  for (size_t i = 0; i < count; ++i) {
    const Instr &instr = fn.code[i];
    if (instr.op == Op::Bra) {
      leader[instr.imm] = true;
      leader[i + 1] = true;
    } else if (instr.op == Op::Ret) {
      leader[i + 1] = true;
    }
  }
  std::vector<unsigned> blockOf(count), starts;
  for (size_t i = 0; i < count; ++i) {
    if (leader[i])
      starts.push_back(i);
    blockOf[i] = starts.size() - 1;
  }
  size_t blocks = starts.size();
  // Reads that need a run-time check, per instruction.
  std::vector<llvm::SmallVector<uint32_t, 2>> checks(count);
  llvm::BitVector checked(slots, false);
  auto check = [&](size_t i, uint32_t slot) {
    if (!llvm::is_contained(checks[i], slot))
      checks[i].push_back(slot);
    checked.set(slot);
  };
  // The analysis keeps a set of registers per basic block; past 2^28 bits
  // (a huge function) every register read is checked at run time instead.
  if (uint64_t(blocks) * slots > (uint64_t(1) << 28)) {
    for (size_t i = 0; i < count; ++i)
      for (uint32_t slot : reads[i])
        if (slot < raw.registerSlots.size() && raw.registerSlots.test(slot))
          check(i, slot);
  } else {
    findUncertainReads(starts, blockOf, check);
  }
  insertChecks(checks, checked);
}

void Decoder::findUncertainReads(
    const std::vector<unsigned> &starts, const std::vector<unsigned> &blockOf,
    llvm::function_ref<void(size_t, uint32_t)> check) {
  size_t count = fn.code.size(), blocks = starts.size();
  unsigned slots = fn.slots;
  auto successors = [&](unsigned block) {
    llvm::SmallVector<unsigned, 2> next;
    size_t end = block + 1 < blocks ? starts[block + 1] : count;
    const Instr &last = fn.code[end - 1];
    bool falls = end < count;
    if (last.op == Op::Bra) {
      next.push_back(blockOf[last.imm]);
      falls &= last.guardSense != 0;
    } else if (last.op == Op::Ret) {
      falls &= last.guardSense != 0;
    }
    if (falls)
      next.push_back(blockOf[end]);
    return next;
  };
  // Registers written on every path into each block (all, until reached).
  llvm::BitVector everything(slots, true);
  std::vector<llvm::BitVector> in(blocks, everything);
  in[0] = llvm::BitVector(slots, false);
  in[0] |= raw.registerSlots;
  in[0].flip(); // specials and constants are always written
  std::vector<bool> reached(blocks, false);
  reached[0] = true;
  std::vector<unsigned> work = {0};
  auto transfer = [&](unsigned block, llvm::BitVector state,
                      auto &&onRead) {
    size_t end = block + 1 < blocks ? starts[block + 1] : count;
    for (size_t i = starts[block]; i < end; ++i) {
      for (uint32_t slot : reads[i])
        if (!state.test(slot))
          onRead(i, slot);
      if (fn.code[i].guardSense == 0)
        for (uint32_t slot : writes[i])
          state.set(slot);
    }
    return state;
  };
  while (!work.empty()) {
    unsigned block = work.back();
    work.pop_back();
    llvm::BitVector out = transfer(block, in[block], [](size_t, uint32_t) {});
    for (unsigned next : successors(block)) {
      llvm::BitVector merged = in[next];
      if (reached[next])
        merged &= out;
      else
        merged = out;
      if (!reached[next] || merged != in[next]) {
        reached[next] = true;
        in[next] = merged;
        work.push_back(next);
      }
    }
  }
  for (unsigned block = 0; block < blocks; ++block)
    if (reached[block])
      transfer(block, in[block], check);
}

void Decoder::insertChecks(
    const std::vector<llvm::SmallVector<uint32_t, 2>> &checks,
    const llvm::BitVector &checked) {
  if (checked.none())
    return;
  size_t count = fn.code.size();
  unsigned slots = fn.slots;
  std::vector<uint32_t> index(slots, kNoSlot);
  for (unsigned slot : checked.set_bits()) {
    index[slot] = fn.checkedRegisters++;
    fn.checkedNames.push_back(raw.slotNames[slot]);
  }
  // Rebuild the code with the checks, then retarget branches.
  std::vector<Instr> code;
  std::vector<uint32_t> newIndex(count + 1);
  for (size_t i = 0; i < count; ++i) {
    newIndex[i] = code.size();
    const Instr &instr = fn.code[i];
    for (uint32_t slot : checks[i]) {
      Instr check;
      check.op = Op::CheckDefined;
      check.kind = InstructionClass::Count;
      check.r[0] = slot;
      check.imm = index[slot];
      check.source = instr.source;
      // A guard is read whether or not the instruction runs.
      if (slot != instr.guard || instr.guardSense == 0) {
        check.guardSense = instr.guardSense;
        check.guard = instr.guard;
      }
      code.push_back(check);
    }
    for (uint32_t slot : writes[i]) {
      if (index[slot] == kNoSlot)
        continue;
      Instr mark;
      mark.op = Op::MarkDefined;
      mark.kind = InstructionClass::Count;
      mark.r[0] = slot;
      mark.imm = index[slot];
      mark.source = instr.source;
      mark.guardSense = instr.guardSense;
      mark.guard = instr.guard;
      code.push_back(mark);
    }
    code.push_back(instr);
  }
  newIndex[count] = code.size();
  for (Instr &instr : code)
    if (instr.op == Op::Bra)
      instr.imm = newIndex[instr.imm];
  fn.code = std::move(code);
}

llvm::Error Decoder::run() {
  for (const RawInstr &instr : raw.instructions) {
    Instr out;
    out.source = fn.sources.size();
    fn.sources.push_back({instr.line, instr.text});
    reads.emplace_back();
    writes.emplace_back();
    if (llvm::Error error = decodeOne(instr, out))
      return error;
    fn.code.push_back(out);
  }
  // A function must end in a return or a branch: falling off the end has
  // no meaning.
  if (fn.code.empty() || (fn.code.back().op != Op::Ret &&
                          fn.code.back().op != Op::Bra) ||
      fn.code.back().guardSense != 0)
    return errorAt(raw.instructions.empty() ? raw.bodyLine
                                            : raw.instructions.back().line,
                   "the function can run past its last instruction", fn.name);
  // Labels after the last instruction point past the end.
  for (const Instr &instr : fn.code)
    if (instr.op == Op::Bra &&
        instr.imm >= static_cast<int64_t>(fn.code.size()))
      return errorAt(fn.sources[instr.source].line,
                     "a branch to the end of the function", fn.name);
  insertDefinednessChecks();
  if (fn.frameWords() * 8 > kMaxStackBytes)
    return errorAt(raw.bodyLine,
                   llvm::formatv("a thread needs {0} bytes of registers and "
                                 ".param space here: past the {1} the "
                                 "emulator allows",
                                 fn.frameWords() * 8, kMaxStackBytes),
                   fn.name);
  return llvm::Error::success();
}

} // namespace

llvm::Error Parser::decode(RawFunction &raw) {
  return Decoder(raw, *module, raws).run();
}

llvm::Expected<std::unique_ptr<Module>>
tilefuse::emulator::parseModule(StringRef ptx) {
  return Parser(ptx).run();
}

const char *tilefuse::emulator::opName(Op op) {
  static const char *const names[] = {
#define TILEFUSE_EMU_OP(name) #name,
      TILEFUSE_EMU_OPS(TILEFUSE_EMU_OP)
#undef TILEFUSE_EMU_OP
#define TILEFUSE_EMU_OP(name)                                                  \
  #name "U16", #name "S16", #name "U32", #name "S32", #name "U64", #name "S64",
          TILEFUSE_EMU_INT_OPS(TILEFUSE_EMU_OP)
#undef TILEFUSE_EMU_OP
  };
  return names[static_cast<unsigned>(op)];
}
