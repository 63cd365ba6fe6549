#include "dlplan/output_file.hpp"

#include "dlplan/error.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dlplan {
namespace {

std::string why() { return std::strerror(errno); }

// Writes all of `text` to `fd`; false on an error (errno says which).
bool write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    text.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

void write_through(const std::string& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("{}: cannot write ({})", path, why()));
  const bool ok = write_all(fd, text);
  const std::string error = ok ? "" : why();
  ::close(fd);
  if (!ok) throw Error(fmt::format("{}: write failed ({})", path, error));
}

void replace_atomically(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  struct stat st {};
  if (::lstat(tmp.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw Error(fmt::format("{}: cannot write: {} exists and is not a regular file", path, tmp));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) throw Error(fmt::format("{}: cannot write ({}; does the folder exist?)", path, why()));
  const bool ok = write_all(fd, text) && ::fsync(fd) == 0;
  const std::string error = ok ? "" : why();
  ::close(fd);
  if (!ok) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("{}: write failed ({})", path, error));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = why();
    std::remove(tmp.c_str());
    throw Error(fmt::format("{}: cannot replace the file ({})", path, e));
  }
}

}  // namespace

void write_output_file(const std::string& path, std::string_view text) {
  if (path.empty()) throw Error("an output path is empty");
  std::string target = path;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    std::error_code ec;
    const auto resolved = std::filesystem::weakly_canonical(path, ec);  // the link stays a link
    if (ec) throw Error(fmt::format("{}: cannot follow the symbolic link ({})", path, ec.message()));
    target = resolved.string();
  }
  if (::stat(target.c_str(), &st) != 0) {
    if (errno != ENOENT) throw Error(fmt::format("{}: cannot write ({})", path, why()));
    replace_atomically(target, text);  // a new file
    return;
  }
  if (S_ISREG(st.st_mode)) replace_atomically(target, text);
  else if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) write_through(target, text);
  else if (S_ISDIR(st.st_mode)) throw Error(fmt::format("{}: is a folder; give a file name", path));
  else throw Error(fmt::format("{}: is not a regular file, a character device or a pipe; refusing to write there", path));
}

}  // namespace dlplan
