//===- KernelCacheTest.cpp - the kernel cache, in memory and on disk ------===//

#include "tilefuse/Runtime/KernelCache.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/raw_ostream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace tilefuse;

namespace {

CacheKey sampleKey() {
  CacheKey key;
  key.fingerprint = "3f2a";
  key.dtype = "bf16";
  key.n = 4096;
  key.aligned = true;
  key.target = "sm_90";
  key.tileConfig = "";
  key.compilerVersion = compilerVersion();
  return key;
}

/// A fresh directory, removed at the end of the test.
class TempDir {
public:
  TempDir() {
    llvm::SmallString<128> path;
    EXPECT_FALSE(llvm::sys::fs::createUniqueDirectory("tilefuse-cache", path));
    dir = std::string(path);
  }
  ~TempDir() { llvm::sys::fs::remove_directories(dir); }
  std::string dir;
};

/// A compile function that counts its calls and returns `payload`.
struct CountingCompile {
  std::atomic<int> calls{0};
  std::string payload = "// PTX for sm_90\n.visible .entry k()\n";
  KernelCache::Compile function() {
    return [this]() -> llvm::Expected<std::string> {
      ++calls;
      return payload;
    };
  }
};

std::string readFile(const std::string &path) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  return buffer ? (*buffer)->getBuffer().str() : std::string();
}

void writeFile(const std::string &path, const std::string &contents) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << contents;
}

TEST(KernelCache, MissCompilesThenMemoryHits) {
  KernelCache cache(std::nullopt);
  CountingCompile compile;
  auto first = cache.getOrCompile(sampleKey(), compile.function());
  ASSERT_TRUE(static_cast<bool>(first));
  auto second = cache.getOrCompile(sampleKey(), compile.function());
  ASSERT_TRUE(static_cast<bool>(second));
  EXPECT_EQ(**first, compile.payload);
  EXPECT_EQ(first->get(), second->get());
  EXPECT_EQ(compile.calls, 1);
  EXPECT_EQ(cache.stats().compiles, 1);
  EXPECT_EQ(cache.stats().memoryHits, 1);
}

TEST(KernelCache, NewCacheOnSameDirectoryLoadsFromDisk) {
  TempDir temp;
  CountingCompile compile;
  {
    KernelCache cache(temp.dir);
    ASSERT_TRUE(static_cast<bool>(cache.getOrCompile(sampleKey(), compile.function())));
  }
  KernelCache fresh(temp.dir);
  auto artifact = fresh.getOrCompile(sampleKey(), compile.function());
  ASSERT_TRUE(static_cast<bool>(artifact));
  EXPECT_EQ(**artifact, compile.payload);
  EXPECT_EQ(compile.calls, 1);
  EXPECT_EQ(fresh.stats().diskHits, 1);
  EXPECT_EQ(fresh.stats().compiles, 0);
}

TEST(KernelCache, EveryKeyFieldChangesTheDigest) {
  CacheKey base = sampleKey();
  std::vector<CacheKey> variants(8, base);
  variants[0].fingerprint = "3f2b";
  variants[1].dtype = "f16";
  variants[2].n = 4097;
  variants[3].aligned = false;
  variants[4].target = "sm_80";
  variants[5].tileConfig = "threads_per_row=64";
  variants[6].compilerVersion = "tilefuse-0.0.0+llvm-21";
  variants[7].abi = "multi-tensor";
  for (const CacheKey &variant : variants)
    EXPECT_NE(variant.digest(), base.digest()) << variant.serialize();
  // The same fields give the same digest: nothing per call (rows, scalars,
  // pointers) is part of a key.
  EXPECT_EQ(sampleKey().digest(), base.digest());
}

TEST(KernelCache, CorruptEntryIsRecompiledAndReplaced) {
  TempDir temp;
  CountingCompile compile;
  {
    KernelCache cache(temp.dir);
    ASSERT_TRUE(static_cast<bool>(cache.getOrCompile(sampleKey(), compile.function())));
  }
  KernelCache probe(temp.dir);
  std::string path = probe.entryPath(sampleKey());
  std::string good = readFile(path);
  ASSERT_FALSE(good.empty());
  std::string corrupt = good;
  corrupt[corrupt.size() - 3] ^= 0x20; // one payload byte
  writeFile(path, corrupt);

  KernelCache cache(temp.dir);
  auto artifact = cache.getOrCompile(sampleKey(), compile.function());
  ASSERT_TRUE(static_cast<bool>(artifact));
  EXPECT_EQ(**artifact, compile.payload);
  EXPECT_EQ(compile.calls, 2);
  EXPECT_EQ(cache.stats().rejectedEntries, 1);
  EXPECT_EQ(readFile(path), good);
}

TEST(KernelCache, TruncatedEntryIsRecompiled) {
  TempDir temp;
  CountingCompile compile;
  KernelCache writer(temp.dir);
  ASSERT_TRUE(static_cast<bool>(writer.getOrCompile(sampleKey(), compile.function())));
  std::string path = writer.entryPath(sampleKey());
  std::string good = readFile(path);
  for (size_t length : {size_t(0), size_t(10), good.size() / 2, good.size() - 1}) {
    writeFile(path, good.substr(0, length));
    KernelCache cache(temp.dir);
    auto artifact = cache.getOrCompile(sampleKey(), compile.function());
    ASSERT_TRUE(static_cast<bool>(artifact)) << length;
    EXPECT_EQ(**artifact, compile.payload) << length;
    EXPECT_EQ(cache.stats().compiles, 1) << length;
    EXPECT_EQ(readFile(path), good) << length;
  }
}

TEST(KernelCache, VersionMismatchedEntryIsNotLoaded) {
  TempDir temp;
  CountingCompile compile;
  CacheKey older = sampleKey();
  older.compilerVersion = "tilefuse-0.0.1+llvm-21.1.0";
  {
    KernelCache cache(temp.dir);
    ASSERT_TRUE(static_cast<bool>(cache.getOrCompile(older, compile.function())));
  }
  // An entry written by another version, found at this version's path.
  KernelCache cache(temp.dir);
  writeFile(cache.entryPath(sampleKey()), readFile(cache.entryPath(older)));
  auto artifact = cache.getOrCompile(sampleKey(), compile.function());
  ASSERT_TRUE(static_cast<bool>(artifact));
  EXPECT_EQ(cache.stats().rejectedEntries, 1);
  EXPECT_EQ(cache.stats().compiles, 1);
}

TEST(KernelCache, UnwritableDirectoryDegradesToMemoryWithOneWarning) {
  TempDir temp;
  // A regular file where the directory should be: no entry can be written
  // (permissions would not stop root, which CI runs as).
  std::string blocked = temp.dir + "/not-a-directory";
  writeFile(blocked, "x");
  std::vector<std::string> warnings;
  KernelCache cache(blocked + "/cache",
                    [&](const std::string &message) { warnings.push_back(message); });
  EXPECT_FALSE(cache.writesToDisk());
  CountingCompile compile;
  for (int i = 0; i < 3; ++i) {
    CacheKey key = sampleKey();
    key.n = 100 + i;
    ASSERT_TRUE(static_cast<bool>(cache.getOrCompile(key, compile.function())));
    ASSERT_TRUE(static_cast<bool>(cache.getOrCompile(key, compile.function())));
  }
  EXPECT_EQ(compile.calls, 3);
  EXPECT_EQ(cache.stats().memoryHits, 3);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("in memory only"), std::string::npos) << warnings[0];
}

/// Fails the test (SIGALRM ends the process) if it outlives `seconds`:
/// an entry that blocks the reader must not hang the suite.
class Watchdog {
public:
  explicit Watchdog(unsigned seconds) { alarm(seconds); }
  ~Watchdog() { alarm(0); }
};

/// Gets `key` from a fresh cache on `dir` whose entry path holds something
/// that is not an entry: it compiles, and the directory keeps serving.
void expectMissThatCompiles(const std::string &dir) {
  Watchdog watchdog(60);
  CountingCompile compile;
  KernelCache cache(dir);
  auto artifact = cache.getOrCompile(sampleKey(), compile.function());
  ASSERT_TRUE(static_cast<bool>(artifact));
  EXPECT_EQ(**artifact, compile.payload);
  EXPECT_EQ(compile.calls, 1);
  EXPECT_TRUE(cache.writesToDisk());
  // Every other key is still written to and read from disk.
  CacheKey other = sampleKey();
  other.n = 8192;
  ASSERT_TRUE(static_cast<bool>(cache.getOrCompile(other, compile.function())));
  KernelCache fresh(dir);
  ASSERT_TRUE(static_cast<bool>(fresh.getOrCompile(other, compile.function())));
  EXPECT_EQ(fresh.stats().diskHits, 1);
}

TEST(KernelCache, FifoNamedLikeAnEntryIsAMissThatDoesNotBlock) {
  TempDir temp;
  std::string path = KernelCache(temp.dir).entryPath(sampleKey());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  expectMissThatCompiles(temp.dir);
}

TEST(KernelCache, SymlinkToADeviceIsNotRead) {
  // /dev/zero would be read without end; /dev/urandom likewise.
  for (const char *device : {"/dev/zero", "/dev/urandom"}) {
    TempDir temp;
    std::string path = KernelCache(temp.dir).entryPath(sampleKey());
    ASSERT_EQ(symlink(device, path.c_str()), 0) << device;
    expectMissThatCompiles(temp.dir);
  }
}

TEST(KernelCache, DirectoryNamedLikeAnEntryIsAMissNotMemoryOnly) {
  TempDir temp;
  std::string path = KernelCache(temp.dir).entryPath(sampleKey());
  ASSERT_FALSE(llvm::sys::fs::create_directories(path + "/inside"));
  expectMissThatCompiles(temp.dir);
  EXPECT_TRUE(llvm::sys::fs::is_directory(path));
}

TEST(KernelCache, StaleTemporaryFilesAreRemoved) {
  TempDir temp;
  std::string stale = temp.dir + "/.tmp-" + sampleKey().digest() + "-0a1b2c3d";
  std::string fresh = temp.dir + "/.tmp-" + sampleKey().digest() + "-4e5f6a7b";
  writeFile(stale, "partial entry of a writer that died");
  writeFile(fresh, "a writer at work");
  int fd;
  ASSERT_FALSE(llvm::sys::fs::openFileForWrite(stale, fd, llvm::sys::fs::CD_OpenExisting));
  auto anHourAgo = std::chrono::system_clock::now() - std::chrono::hours(1);
  ASSERT_FALSE(llvm::sys::fs::setLastAccessAndModificationTime(fd, anHourAgo));
  close(fd);
  KernelCache cache(temp.dir);
  EXPECT_FALSE(llvm::sys::fs::exists(stale));
  EXPECT_TRUE(llvm::sys::fs::exists(fresh));
}

TEST(KernelCache, FailedCompileIsReportedAndNotCached) {
  KernelCache cache(std::nullopt);
  int calls = 0;
  auto failing = [&]() -> llvm::Expected<std::string> {
    ++calls;
    return llvm::createStringError("rms_norm: n must be positive");
  };
  auto first = cache.getOrCompile(sampleKey(), failing);
  ASSERT_FALSE(static_cast<bool>(first));
  EXPECT_EQ(llvm::toString(first.takeError()), "rms_norm: n must be positive");
  auto second = cache.getOrCompile(sampleKey(), failing);
  ASSERT_FALSE(static_cast<bool>(second));
  llvm::consumeError(second.takeError());
  EXPECT_EQ(calls, 2);
}

TEST(KernelCache, EightThreadsRacingOnOneKeyCompileOnce) {
  TempDir temp;
  KernelCache cache(temp.dir);
  std::atomic<int> calls{0};
  auto slowCompile = [&]() -> llvm::Expected<std::string> {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return std::string("artifact");
  };
  std::vector<std::thread> threads;
  std::vector<const std::string *> seen(8, nullptr);
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      auto artifact = cache.getOrCompile(sampleKey(), slowCompile);
      if (artifact)
        seen[t] = artifact->get();
      else
        llvm::consumeError(artifact.takeError());
    });
  for (std::thread &thread : threads)
    thread.join();
  EXPECT_EQ(calls, 1);
  for (const std::string *artifact : seen) {
    ASSERT_NE(artifact, nullptr);
    EXPECT_EQ(artifact, seen[0]);
  }
}

TEST(KernelCache, FourProcessesSharingADirectoryCorruptNothing) {
  TempDir temp;
  constexpr int kKeys = 24;
  auto payloadFor = [](int i) {
    return "kernel " + std::to_string(i) + "\n" + std::string(4096 + i, 'x');
  };
  std::vector<pid_t> children;
  for (int p = 0; p < 4; ++p) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      KernelCache cache(temp.dir);
      bool ok = true;
      for (int round = 0; round < 3; ++round)
        for (int i = 0; i < kKeys; ++i) {
          CacheKey key = sampleKey();
          key.n = i;
          auto artifact = cache.getOrCompile(
              key, [&]() -> llvm::Expected<std::string> { return payloadFor(i); });
          ok &= artifact && **artifact == payloadFor(i);
          if (!artifact)
            llvm::consumeError(artifact.takeError());
        }
      _exit(ok ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  // Every entry is whole and loads without compiling; no temp file is left.
  KernelCache cache(temp.dir);
  for (int i = 0; i < kKeys; ++i) {
    CacheKey key = sampleKey();
    key.n = i;
    auto artifact = cache.getOrCompile(key, []() -> llvm::Expected<std::string> {
      return llvm::createStringError("must not compile");
    });
    ASSERT_TRUE(static_cast<bool>(artifact)) << i;
    EXPECT_EQ(**artifact, payloadFor(i));
  }
  EXPECT_EQ(cache.stats().diskHits, kKeys);
  std::error_code error;
  int files = 0;
  for (llvm::sys::fs::directory_iterator it(temp.dir, error), end;
       it != end && !error; it.increment(error)) {
    ++files;
    EXPECT_TRUE(llvm::StringRef(it->path()).ends_with(".tfk")) << it->path();
  }
  EXPECT_EQ(files, kKeys);
}

} // namespace
