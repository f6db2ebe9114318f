//===- KernelCache.h - compiled kernels in memory and on disk ---*- C++ -*-===//
//
// Memory first, then the disk ($TILEFUSE_CACHE_DIR, default
// ~/.cache/tilefuse), then compile. The key names everything a compiled
// artifact depends on and nothing that changes per call (rows, scalars,
// pointers). Disk entries are written atomically (temp file + rename) and
// validated on every read (magic, exact key, size, SHA-256 of the payload):
// a truncated, corrupt or version-mismatched entry is recompiled and
// replaced, never loaded. Only regular files of at most 64 MiB are read as
// entries, without following symlinks or blocking (a FIFO, a device or a
// directory named like an entry is a miss). A directory that cannot be
// written degrades to memory-only with one warning. Temporary files older
// than 10 minutes (of writers that died) are removed when a cache opens
// its directory. Concurrent first requests of one key compile
// once; processes sharing a directory corrupt nothing.
//
//===----------------------------------------------------------------------===//

#ifndef TILEFUSE_RUNTIME_KERNELCACHE_H
#define TILEFUSE_RUNTIME_KERNELCACHE_H

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Error.h"

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace tilefuse {

struct CacheKey {
  std::string fingerprint;     // canonical hash of the fusion's IR
  std::string dtype;           // storage dtype
  int64_t n = 0;               // row length
  bool aligned = true;         // alignment class
  std::string target;          // sm_XX or cpu plus host features
  std::string tileConfig;      // overrides, "" for the heuristic
  std::string abi;             // KernelAbi::str(), "" for the default ABI
  std::string compilerVersion; // tilefuse and LLVM versions

  /// The fields, in a fixed order, one per line.
  std::string serialize() const;
  /// Hex SHA-256 of serialize(): the entry's file name.
  std::string digest() const;
};

/// The version string every key carries: tilefuse's, LLVM's, and a hash of
/// the compiler's sources, so that no change to the compiler is ever served
/// a kernel an older one compiled.
std::string compilerVersion();

struct CacheStats {
  int64_t memoryHits = 0;
  int64_t diskHits = 0;
  int64_t compiles = 0;
  int64_t rejectedEntries = 0; // corrupt, truncated or mismatched on disk
};

class KernelCache {
public:
  using Artifact = std::shared_ptr<const std::string>;
  using Compile = std::function<llvm::Expected<std::string>()>;
  using Warn = std::function<void(const std::string &)>;

  /// A cache backed by `directory` (created if missing), or memory-only
  /// when it is std::nullopt. `warn` reports degradation (default: stderr).
  explicit KernelCache(std::optional<std::string> directory, Warn warn = {});

  /// $TILEFUSE_CACHE_DIR, else ~/.cache/tilefuse.
  static std::string defaultDirectory();

  /// The artifact for `key`: from memory, from disk, or from `compile`
  /// (called at most once per key at a time, across threads).
  llvm::Expected<Artifact> getOrCompile(const CacheKey &key,
                                        const Compile &compile);

  /// Forgets `key`'s entry, in memory and on disk (an entry that is whole
  /// but that its reader rejects).
  void erase(const CacheKey &key);

  CacheStats stats() const;
  bool writesToDisk() const { return diskWritable.load(); }
  const std::optional<std::string> &directory() const { return dir; }
  /// The file an entry for `key` lives in (meaningful with a directory).
  std::string entryPath(const CacheKey &key) const;

private:
  struct Result {
    Artifact artifact;
    std::string error;
  };

  Artifact readEntry(const CacheKey &key);
  void writeEntry(const CacheKey &key, const std::string &payload);
  void disableDiskWrites(const std::string &reason);
  void removeStaleTemporaries();

  std::optional<std::string> dir;
  Warn warn;
  std::atomic<bool> diskWritable{false};
  std::once_flag warnedOnce;

  mutable std::mutex mutex;
  llvm::StringMap<std::shared_future<Result>> entries;
  CacheStats counters;
};

} // namespace tilefuse

#endif // TILEFUSE_RUNTIME_KERNELCACHE_H
