// Shared by the fuzz targets (fuzz/README.md): each feeds libFuzzer's bytes to
// one of dlplan's readers, the way a user's file reaches it. A reader may
// refuse the input with a dlplan::Error (the message a user would see, exit
// 1); anything else — a crash, a sanitizer report, another exception (the
// CLI's "internal error"), a hang — is a finding.
#pragma once

#include "dlplan/error.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <unistd.h>

namespace dlplan::fuzz {

inline std::string_view bytes(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Runs `f`, accepting a dlplan::Error as the reader's answer.
template <typename F>
void expect_answer(F&& f) {
  try {
    f();
  } catch (const dlplan::Error&) {
  }
}

// A file holding `text` (readers that take a path): one per process, rewritten
// for every input, named with `suffix` (the extension picks the reader).
inline std::string scratch_file(std::string_view text, const std::string& suffix) {
  const char* dir = std::getenv("TMPDIR");
  const std::string path = std::string(dir && *dir ? dir : "/tmp") + "/dlplan-fuzz-" + std::to_string(::getpid()) + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (!text.empty() && std::fwrite(text.data(), 1, text.size(), f) != text.size()) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace dlplan::fuzz
