// `dlplan models` and `dlplan gpus`.
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/format.hpp"
#include "dlplan/hardware.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/zoo.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <fstream>

namespace dlplan::cli {

Runner add_list_commands(CLI::App& models, CLI::App& gpus) {
  return [&models, &gpus]() {
    if (models.parsed()) {
      fmt::print("{:<13} {:<7} {:>15}  {}\n", "name", "family", "parameters", "source");
      for (const auto& e : zoo::zoo_entries()) {
        Model m = load_model(e.name);
        fmt::print("{:<13} {:<7} {:>15}  {}\n", e.name, e.family, format_count(m.parameter_count()), e.source);
      }
      return 0;
    }
    (void)gpus;
    fmt::print("{:<10} {:>11} {:>10} {:>12} {:>11} {:>10} {:>10} {:>9}  {}\n", "kind", "memory", "HBM", "bf16 dense",
               "fp32", "link/GPU", "net/GPU", "runtime", "device");
    for (const auto& d0 : device_catalog()) {
      DeviceSpec d = d0.kind == "cpu" ? host_cpu_device() : d0;
      fmt::print("{:<10} {:>11} {:>6.0f} GB/s {:>6.0f} TFLOP/s {:>5.1f} TFLOP/s {:>5.0f} GB/s {:>5.1f} GB/s {:>9}  {}\n", d.kind,
                 format_bytes(static_cast<double>(d.memory_bytes)), d.hbm_bytes_per_s / 1e9, d.bf16_flops / 1e12,
                 d.fp32_flops / 1e12, d.link_bytes_per_s / 1e9, d.net_bytes_per_s / 1e9,
                 format_bytes(static_cast<double>(d.runtime_bytes)), d.description);
    }
    return 0;
  };
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) throw Error(fmt::format("{}: cannot write (does the folder exist?)", path));
    f << text;
    f.flush();
    if (!f) throw Error(fmt::format("{}: write failed", path));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(fmt::format("{}: cannot replace the file", path));
  }
}

}  // namespace dlplan::cli
