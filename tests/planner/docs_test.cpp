// The documents exist and are true: every Markdown file that README.md,
// docs/ and the GPU catalog's `source` strings cite is in the repository,
// and the catalog table in docs/catalog.md holds the catalog's numbers.
#include "dlplan/hardware.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

namespace fs = std::filesystem;
using namespace dlplan;

namespace {

const fs::path kRoot = DLPLAN_SOURCE_DIR;

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The .md files a text cites (links and bare names), URLs left out.
std::vector<std::string> cited(const std::string& text) {
  std::vector<std::string> out;
  static const std::regex md(R"(([A-Za-z0-9_./-]+\.md)\b)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), md); it != std::sregex_iterator(); ++it) {
    const auto pos = static_cast<size_t>(it->position(1));
    const size_t line = text.rfind('\n', pos);
    const std::string before = text.substr(line == std::string::npos ? 0 : line, pos - (line == std::string::npos ? 0 : line));
    const size_t scheme = before.rfind("://");
    if (scheme != std::string::npos && before.find(' ', scheme) == std::string::npos) continue;  // part of a URL
    out.push_back((*it)[1]);
  }
  return out;
}

// Resolves a citation from `from` (a file): relative to its folder or to the
// repository; a bare name may also be a file of docs/ (any case). A path into
// another project (nccl-tests' doc/PERFORMANCE.md) is not ours to check: its
// first folder is not one of the repository's.
bool resolves(const std::string& name, const fs::path& from) {
  if (const size_t slash = name.find('/'); slash != std::string::npos && slash > 0 &&
                                           !fs::exists(kRoot / name.substr(0, slash)) &&
                                           !fs::exists(from.parent_path() / name.substr(0, slash)))
    return true;
  if (fs::exists(from.parent_path() / name) || fs::exists(kRoot / name)) return true;
  if (name.find('/') != std::string::npos) return false;
  for (const auto& e : fs::directory_iterator(kRoot / "docs"))
    if (lower(e.path().filename().string()) == lower(name)) return true;
  return false;
}

std::vector<fs::path> documents() {
  std::vector<fs::path> d = {kRoot / "README.md"};
  for (const auto& e : fs::directory_iterator(kRoot / "docs"))
    if (e.path().extension() == ".md") d.push_back(e.path());
  return d;
}

TEST(Docs, EveryCitedDocumentExists) {
  for (const auto& doc : documents()) {
    const std::string text = read(doc);
    ASSERT_FALSE(text.empty()) << doc;
    for (const auto& name : cited(text)) EXPECT_TRUE(resolves(name, doc)) << doc.filename() << " cites " << name;
  }
  // The topics a user looks for each have a document.
  for (const char* f : {"memory.md", "time.md", "references.md", "catalog.md", "deepspeed.md", "cluster.md", "data.md", "gui.md"})
    EXPECT_TRUE(fs::exists(kRoot / "docs" / f)) << f;
  // Control: the check can fail.
  EXPECT_FALSE(resolves("NO-SUCH-FILE.md", kRoot / "README.md"));
}

TEST(Docs, CatalogSourcesCiteDocumentsThatExist) {
  for (const auto& d : device_catalog())
    for (const auto& name : cited(d.source)) EXPECT_TRUE(resolves(name, kRoot / "README.md")) << d.kind << ": " << name;
}

// docs/catalog.md's table: | kind | memory MiB | HBM GB/s | bf16
// TFLOP/s | fp16 TFLOP/s | fp32 TFLOP/s | link GB/s | net GB/s | ... holds
// the catalog.
TEST(Docs, CatalogTableHoldsTheCatalogsNumbers) {
  std::map<std::string, std::vector<double>> table;
  std::istringstream in(read(kRoot / "docs" / "catalog.md"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream s(line.substr(1));
    for (std::string c; std::getline(s, c, '|');) cells.push_back(c);
    if (cells.size() < 8) continue;  // the host table below it has 5
    auto trim = [](std::string c) {
      c.erase(std::remove(c.begin(), c.end(), '`'), c.end());
      c.erase(std::remove(c.begin(), c.end(), ','), c.end());
      c.erase(0, c.find_first_not_of(' '));
      c.erase(c.find_last_not_of(' ') + 1);
      return c;
    };
    std::vector<double> v;
    for (size_t i = 1; i < 8; ++i) v.push_back(std::atof(trim(cells[i]).c_str()));
    table[trim(cells[0])] = v;
  }
  int checked = 0;
  for (const auto& d : device_catalog()) {
    if (d.kind == "cpu") continue;  // the host: measured, not a datasheet
    SCOPED_TRACE(d.kind);
    ASSERT_TRUE(table.count(d.kind)) << "docs/catalog.md has no row for " << d.kind;
    const auto& v = table[d.kind];
    const double expect[] = {static_cast<double>(d.memory_bytes) / (1 << 20), d.hbm_bytes_per_s / 1e9,
                             d.bf16_flops / 1e12, d.fp16_flops / 1e12, d.fp32_flops / 1e12,
                             d.link_bytes_per_s / 1e9, d.net_bytes_per_s / 1e9};
    for (size_t i = 0; i < 7; ++i) EXPECT_NEAR(v[i], expect[i], 0.005 * expect[i] + 0.05) << "column " << i + 1;
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

}  // namespace
