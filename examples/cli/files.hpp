// The one guarded path through which the `ctxpar` tool reads and writes files: only regular files
// are opened (a FIFO, a device or a socket is named and refused before any open, so nothing
// blocks), sizes are known before a byte is read, and outputs are written under fresh temporary
// names created exclusively and renamed into place together, or not at all.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace ctxpar::cli {

namespace impl {

// What a path that exists but is not a regular file is, for messages.
inline std::string file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace impl

/// A regular file open for reading. Anything else is refused before it is opened: `problem()`
/// says why (empty when the file is open).
class InputFile {
 public:
  /// Opens `path` when it is a regular file.
  explicit InputFile(const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      problem_ = errno == ENOENT ? "no such file" : std::strerror(errno);
      return;
    }
    if (!S_ISREG(st.st_mode)) {
      problem_ = "is " + impl::file_kind(st.st_mode) + ", not a regular file";
      return;
    }
    // O_NONBLOCK: should the path be swapped for a FIFO after the stat, the open does not block;
    // fstat then refuses it.
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) {
      problem_ = std::strerror(errno);
      return;
    }
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      problem_ = "is not a regular file";
      ::close(fd_);
      fd_ = -1;
      return;
    }
    size_ = static_cast<std::int64_t>(st.st_size);
  }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile() {
    if (fd_ >= 0) ::close(fd_);
  }

  /// Why the file is not open; empty when it is.
  const std::string& problem() const noexcept { return problem_; }
  /// The file's size in bytes (from fstat, before any read).
  std::int64_t size() const noexcept { return size_; }

  /// Reads exactly `n` bytes at `offset`; false on an error or a short read.
  bool read_at(std::int64_t offset, void* data, std::size_t n) const {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      p += got;
      offset += got;
      n -= static_cast<std::size_t>(got);
    }
    return true;
  }

 private:
  int fd_ = -1;
  std::int64_t size_ = 0;
  std::string problem_;
};

/// Why `path` cannot be the target of an output file (empty when it can): an empty path, an
/// existing entry that is not a writable regular file, or a parent that is not a writable
/// directory.
inline std::string why_not_output_file(const std::string& path) {
  if (path.empty()) return "an empty path";
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return "is " + impl::file_kind(st.st_mode) + ", not a regular file";
    if (::access(path.c_str(), W_OK) != 0) return "is not writable";
  }
  std::string parent = std::filesystem::path(path).parent_path().string();
  if (parent.empty()) parent = ".";
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return "its directory " + parent + " does not exist";
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    return "its directory " + parent + " is not writable";
  return "";
}

/// Why `dir` cannot hold output files (empty when it can): it must be a writable directory, or a
/// path where one can be created (its nearest existing ancestor a writable directory).
inline std::string why_not_output_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  if (dir.empty()) return "an empty path";
  std::error_code ec;
  fs::path p(dir);
  if (fs::exists(p, ec)) {
    if (!fs::is_directory(p, ec)) return "exists and is not a directory";
    if (::access(dir.c_str(), W_OK | X_OK) != 0) return "is not writable";
    return "";
  }
  fs::path up = p.parent_path();
  while (!up.empty() && !fs::exists(up, ec)) up = up.parent_path();
  const std::string at = up.empty() ? "." : up.string();
  if (!fs::is_directory(at, ec)) return "its parent " + at + " is not a directory";
  if (::access(at.c_str(), W_OK | X_OK) != 0) return "its parent " + at + " is not writable";
  return "";
}

/// Output files staged under fresh temporary names next to their targets and renamed into place
/// together by `commit()`. A failure anywhere removes every temporary and every file already
/// renamed, so the targets are either all written or none is. Destroyed before `commit()`, it
/// removes its temporaries.
class StagedFiles {
 public:
  StagedFiles() = default;
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;
  ~StagedFiles() { discard(); }

  /// Writes `n` bytes at `data` to a new temporary for `target`, checking every write and the
  /// close. Empty on success, else the problem (naming `target`).
  std::string stage(const std::string& target, const char* data, std::size_t n) {
    const std::string problem = why_not_output_file(target);
    if (!problem.empty()) return target + ": " + problem;
    std::string name;
    const int fd = create_beside(target, "ctxpar", name);
    if (fd < 0) return target + ": cannot create a temporary file: " + std::strerror(errno);
    staged_.emplace_back(name, target);
    // mkstemp creates the file 0600; an output gets the mode a plain create would give it.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(fd, 0666 & ~mask);
    while (n > 0) {
      const ssize_t put = ::write(fd, data, n);
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) {
        const std::string why = put < 0 ? std::strerror(errno) : "no progress";
        ::close(fd);
        return target + ": write failed: " + why;
      }
      data += put;
      n -= static_cast<std::size_t>(put);
    }
    if (::fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return target + ": write failed: " + why;
    }
    if (::close(fd) != 0) return target + ": write failed: " + std::strerror(errno);
    return "";
  }

  /// Same, for a string.
  std::string stage(const std::string& target, const std::string& bytes) {
    return stage(target, bytes.data(), bytes.size());
  }

  /// Renames every staged file onto its target. Empty on success; on a failure, every file
  /// renamed so far and every temporary is removed, every file a target replaced is put back, and
  /// the problem is returned. A target that already exists is first moved aside under a fresh
  /// name (so a failed run loses no earlier output) and removed once every rename succeeded.
  std::string commit() {
    std::vector<std::string> renamed;
    std::vector<std::pair<std::string, std::string>> kept;  // earlier file's new name, target
    auto roll_back = [&](const std::string& problem) {
      for (const auto& r : renamed) std::remove(r.c_str());
      for (const auto& [old, target] : kept) std::rename(old.c_str(), target.c_str());
      discard();
      return problem;
    };
    for (const auto& [temporary, target] : staged_) {
      struct stat st;
      if (::stat(target.c_str(), &st) == 0) {
        if (!S_ISREG(st.st_mode))
          return roll_back(target + ": is " + impl::file_kind(st.st_mode) + ", not a regular file");
        std::string aside;
        const std::string problem = move_aside(target, aside);
        if (!problem.empty()) return roll_back(problem);
        kept.emplace_back(aside, target);
      }
      if (::rename(temporary.c_str(), target.c_str()) != 0)
        return roll_back(target +
                         ": cannot rename the temporary into place: " + std::strerror(errno));
      renamed.push_back(target);
    }
    for (const auto& k : kept) std::remove(k.first.c_str());
    staged_.clear();
    return "";
  }

  /// Removes every temporary not yet renamed.
  void discard() {
    for (const auto& s : staged_) std::remove(s.first.c_str());
    staged_.clear();
  }

 private:
  /// Creates a new empty file `.<target's name>.<tag>-XXXXXX` beside `target` (mkstemp:
  /// O_CREAT | O_EXCL under a name no other file has), its name in `name`. The descriptor, or -1
  /// with errno set.
  static int create_beside(const std::string& target, const char* tag, std::string& name) {
    const std::filesystem::path t(target);
    const std::string pattern =
        (t.parent_path() / ("." + t.filename().string() + "." + tag + "-XXXXXX")).string();
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    const int fd = ::mkstemp(buffer.data());
    if (fd >= 0) name = buffer.data();
    return fd;
  }

  /// Renames the existing `target` to a fresh name beside it (reserved exclusively by mkstemp,
  /// then replaced atomically), returned in `aside`. Empty on success, else the problem.
  static std::string move_aside(const std::string& target, std::string& aside) {
    const int fd = create_beside(target, "ctxpar-old", aside);
    if (fd < 0) return target + ": cannot keep the earlier file aside: " + std::strerror(errno);
    ::close(fd);
    if (::rename(target.c_str(), aside.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      std::remove(aside.c_str());
      return target + ": cannot keep the earlier file aside: " + why;
    }
    return "";
  }

  std::vector<std::pair<std::string, std::string>> staged_;  // temporary, target
};

}  // namespace ctxpar::cli
