//===- KernelCache.cpp - compiled kernels in memory and on disk -----------===//

#include "tilefuse/Runtime/KernelCache.h"
#include "tilefuse/Runtime/SourceHash.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace tilefuse;

namespace {
constexpr llvm::StringLiteral kMagic = "TILEFUSE-KERNEL 1\n";

/// No compiled kernel comes near this (PTX and LLVM IR of a fusion are
/// kilobytes to a few megabytes): a larger file is not read.
constexpr uint64_t kMaxEntryBytes = 64ull << 20;

/// Temporary files of writers that died (or of a disk that filled) are
/// removed once they are this old; a live writer renames its file within
/// milliseconds.
constexpr std::chrono::minutes kStaleTemporaryAge{10};

/// The contents of the regular file `path`, or nothing: without following a
/// symlink, without blocking (a FIFO), and without reading more than
/// kMaxEntryBytes (a device, a huge file).
std::optional<std::string> readRegularFile(const std::string &path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return std::nullopt;
  std::optional<std::string> contents;
  struct stat status;
  if (::fstat(fd, &status) == 0 && S_ISREG(status.st_mode) &&
      static_cast<uint64_t>(status.st_size) <= kMaxEntryBytes) {
    std::string buffer(status.st_size, '\0');
    size_t done = 0;
    while (done < buffer.size()) {
      ssize_t got = ::read(fd, buffer.data() + done, buffer.size() - done);
      if (got < 0 && errno == EINTR)
        continue;
      if (got <= 0)
        break;
      done += got;
    }
    buffer.resize(done); // shorter if the file shrank: the checksum fails
    contents = std::move(buffer);
  }
  ::close(fd);
  return contents;
}

/// Whether `path` exists and is anything but a regular file (a directory,
/// a FIFO, a symlink): an entry cannot be written there, but the rest of
/// the directory is fine.
bool isNonRegular(const std::string &path) {
  struct stat status;
  return ::lstat(path.c_str(), &status) == 0 && !S_ISREG(status.st_mode);
}

std::string sha256Hex(llvm::StringRef data) {
  return llvm::toHex(llvm::SHA256::hash(llvm::arrayRefFromStringRef(data)),
                     /*LowerCase=*/true);
}

/// The on-disk form: magic, the serialized key, the payload's size and
/// SHA-256, a blank line, the payload.
std::string header(const CacheKey &key, llvm::StringRef payload) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << kMagic << key.serialize() << "size=" << payload.size() << "\n"
     << "sha256=" << sha256Hex(payload) << "\n\n";
  return text;
}
} // namespace

std::string CacheKey::serialize() const {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "fingerprint=" << fingerprint << "\n"
     << "dtype=" << dtype << "\n"
     << "n=" << n << "\n"
     << "aligned=" << (aligned ? 1 : 0) << "\n"
     << "target=" << target << "\n"
     << "tile=" << tileConfig << "\n"
     << "abi=" << abi << "\n"
     << "compiler=" << compilerVersion << "\n";
  return text;
}

std::string CacheKey::digest() const { return sha256Hex(serialize()); }

std::string tilefuse::compilerVersion() {
  return std::string("tilefuse-") + TILEFUSE_VERSION + "+llvm-" +
         LLVM_VERSION_STRING + "+src-" +
         llvm::StringRef(TILEFUSE_SOURCE_HASH).take_front(12).str();
}

std::string KernelCache::defaultDirectory() {
  if (const char *env = std::getenv("TILEFUSE_CACHE_DIR"); env && *env)
    return env;
  llvm::SmallString<128> home;
  if (!llvm::sys::path::home_directory(home))
    return ".tilefuse-cache";
  llvm::sys::path::append(home, ".cache", "tilefuse");
  return std::string(home);
}

KernelCache::KernelCache(std::optional<std::string> directory, Warn warnFn)
    : dir(std::move(directory)), warn(std::move(warnFn)) {
  if (!warn)
    warn = [](const std::string &message) {
      llvm::errs() << "tilefuse: warning: " << message << "\n";
    };
  if (!dir)
    return;
  if (std::error_code error = llvm::sys::fs::create_directories(*dir)) {
    disableDiskWrites("cannot create cache directory " + *dir + ": " +
                      error.message());
    return;
  }
  // Probe that entries can be written here.
  llvm::SmallString<128> probe;
  int fd;
  if (std::error_code error = llvm::sys::fs::createUniqueFile(
          *dir + "/.probe-%%%%%%%%", fd, probe)) {
    disableDiskWrites("cache directory " + *dir + " is not writable: " +
                      error.message());
    return;
  }
  llvm::sys::Process::SafelyCloseFileDescriptor(fd);
  llvm::sys::fs::remove(probe);
  diskWritable = true;
  removeStaleTemporaries();
}

void KernelCache::removeStaleTemporaries() {
  auto now = std::chrono::system_clock::now();
  std::error_code error;
  for (llvm::sys::fs::directory_iterator it(*dir, error, /*follow=*/false), end;
       it != end && !error; it.increment(error)) {
    llvm::StringRef name = llvm::sys::path::filename(it->path());
    if (!name.starts_with(".tmp-") && !name.starts_with(".probe-"))
      continue;
    llvm::ErrorOr<llvm::sys::fs::basic_file_status> status = it->status();
    if (status && status->type() == llvm::sys::fs::file_type::regular_file &&
        now - status->getLastModificationTime() > kStaleTemporaryAge)
      llvm::sys::fs::remove(it->path());
  }
}

void KernelCache::disableDiskWrites(const std::string &reason) {
  diskWritable = false;
  std::call_once(warnedOnce, [&] {
    warn(reason + "; caching compiled kernels in memory only");
  });
}

std::string KernelCache::entryPath(const CacheKey &key) const {
  return dir ? *dir + "/" + key.digest() + ".tfk" : std::string();
}

KernelCache::Artifact KernelCache::readEntry(const CacheKey &key) {
  if (!dir)
    return nullptr;
  auto reject = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    ++counters.rejectedEntries;
    return nullptr;
  };
  std::string path = entryPath(key);
  std::optional<std::string> file = readRegularFile(path);
  if (!file)
    return llvm::sys::fs::exists(path) ? reject() : nullptr;
  llvm::StringRef contents = *file;
  size_t end = contents.find("\n\n");
  if (!contents.starts_with(kMagic) || end == llvm::StringRef::npos)
    return reject();
  llvm::StringRef payload = contents.substr(end + 2);
  // The header must be exactly what this key and payload produce: the key
  // (version included) matches, the size is whole, the checksum holds.
  if (contents.substr(0, end + 2) != header(key, payload))
    return reject();
  return std::make_shared<const std::string>(payload.str());
}

void KernelCache::writeEntry(const CacheKey &key, const std::string &payload) {
  if (!dir || !diskWritable)
    return;
  llvm::SmallString<128> temporary;
  int fd;
  if (std::error_code error = llvm::sys::fs::createUniqueFile(
          *dir + "/.tmp-" + key.digest() + "-%%%%%%%%", fd, temporary)) {
    disableDiskWrites("cannot write to cache directory " + *dir + ": " +
                      error.message());
    return;
  }
  {
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/true);
    os << header(key, payload) << payload;
    os.flush();
    if (os.has_error()) {
      std::string message = os.error().message();
      os.clear_error();
      llvm::sys::fs::remove(temporary);
      disableDiskWrites("cannot write to cache directory " + *dir + ": " +
                        message);
      return;
    }
  }
  // Readers see the old entry or the whole new one, never a partial file.
  std::string path = entryPath(key);
  if (std::error_code error = llvm::sys::fs::rename(temporary, path)) {
    llvm::sys::fs::remove(temporary);
    // Something other than an entry where this one goes: this key stays
    // in memory, the directory still serves every other key.
    if (isNonRegular(path))
      return;
    disableDiskWrites("cannot write to cache directory " + *dir + ": " +
                      error.message());
  }
}

llvm::Expected<KernelCache::Artifact>
KernelCache::getOrCompile(const CacheKey &key, const Compile &compile) {
  std::string digest = key.digest();
  std::promise<Result> promise;
  std::shared_future<Result> future;
  bool owner = false;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = entries.find(digest);
    if (it != entries.end()) {
      ++counters.memoryHits;
      future = it->second;
    } else {
      future = promise.get_future().share();
      entries[digest] = future;
      owner = true;
    }
  }
  if (owner) {
    Result result;
    if ((result.artifact = readEntry(key))) {
      std::lock_guard<std::mutex> lock(mutex);
      ++counters.diskHits;
    } else {
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++counters.compiles;
      }
      llvm::Expected<std::string> compiled = compile();
      if (compiled) {
        writeEntry(key, *compiled);
        result.artifact = std::make_shared<const std::string>(std::move(*compiled));
      } else {
        result.error = llvm::toString(compiled.takeError());
      }
    }
    if (!result.artifact) {
      // A failed compile is not cached: the next request tries again.
      std::lock_guard<std::mutex> lock(mutex);
      entries.erase(digest);
    }
    promise.set_value(result);
  }
  const Result &result = future.get();
  if (!result.artifact)
    return llvm::createStringError(result.error);
  return result.artifact;
}

void KernelCache::erase(const CacheKey &key) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    entries.erase(key.digest());
  }
  if (dir)
    llvm::sys::fs::remove(entryPath(key));
}

CacheStats KernelCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex);
  return counters;
}
