// `dlplan models` and `dlplan gpus` (--format table or json).
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/format.hpp"
#include "dlplan/hardware.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/output_file.hpp"
#include "dlplan/zoo.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <memory>

namespace dlplan::cli {

Runner add_list_commands(CLI::App& models, CLI::App& gpus) {
  auto models_format = std::make_shared<std::string>("table"), gpus_format = std::make_shared<std::string>("table");
  models.add_option("--format", *models_format, "table or json")->capture_default_str()->check(CLI::IsMember({"table", "json"}));
  gpus.add_option("--format", *gpus_format, "table or json")->capture_default_str()->check(CLI::IsMember({"table", "json"}));
  return [&models, models_format, gpus_format]() {
    if (models.parsed()) {
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      if (*models_format == "table") fmt::print("{:<13} {:<7} {:>15}  {}\n", "name", "family", "parameters", "source");
      for (const auto& e : zoo::zoo_entries()) {
        Model m = load_model(e.name);
        if (*models_format == "table")
          fmt::print("{:<13} {:<7} {:>15}  {}\n", e.name, e.family, format_count(m.parameter_count()), e.source);
        else
          list.push_back({{"name", e.name}, {"family", e.family}, {"params", m.parameter_count()},
                          {"seq_len", tokens_per_sample(m)}, {"source", e.source}});
      }
      if (*models_format == "json") fmt::print("{}\n", list.dump(2));
      return 0;
    }
    if (*gpus_format == "json") {  // every field of the device description, as --cluster files hold it
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (const auto& d0 : device_catalog()) {
        Cluster c;
        c.device = d0.kind == "cpu" ? host_cpu_device() : d0;
        list.push_back(cluster_to_json(c)["device"]);
      }
      fmt::print("{}\n", list.dump(2));
      return 0;
    }
    fmt::print("{:<10} {:>11} {:>10} {:>12} {:>12} {:>11} {:>10} {:>10} {:>9}  {}\n", "kind", "memory", "HBM", "bf16 dense",
               "fp16 dense", "fp32", "link/GPU", "net/GPU", "runtime", "device");
    for (const auto& d0 : device_catalog()) {
      DeviceSpec d = d0.kind == "cpu" ? host_cpu_device() : d0;
      fmt::print("{:<10} {:>11} {:>6.0f} GB/s {:>6.0f} TFLOP/s {:>6.0f} TFLOP/s {:>5.1f} TFLOP/s {:>5.0f} GB/s {:>5.1f} GB/s "
                 "{:>9}  {}\n",
                 d.kind, format_bytes(static_cast<double>(d.memory_bytes)), d.hbm_bytes_per_s / 1e9, d.bf16_flops / 1e12,
                 d.fp16_flops / 1e12, d.fp32_flops / 1e12, d.link_bytes_per_s / 1e9, d.net_bytes_per_s / 1e9,
                 format_bytes(static_cast<double>(d.runtime_bytes)), d.description);
    }
    return 0;
  };
}

void write_file_atomically(const std::string& path, const std::string& text) { write_output_file(path, text); }

}  // namespace dlplan::cli
