// The hardware catalog and cluster files. The catalog's rows are data
// (planner/catalog/*.json, embedded by planner/CMakeLists.txt into
// catalog_data.cpp), one file per GPU with a source for every figure; they
// are read by the same field table as a user's --cluster file, so both obey
// the same ranges. docs/catalog.md lists the fields and the sources.
#include "dlplan/hardware.hpp"

#include "dlplan/error.hpp"
#include "dlplan/json_file.hpp"
#include "dlplan/collective_costs.hpp"
#include "dlplan/op_costs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <thread>
#include <unistd.h>

namespace dlplan {

// The embedded catalog files (generated: catalog_data.cpp), in file-name order.
struct CatalogFile {
  const char* name;
  const char* text;
};
extern const CatalogFile kCatalogFiles[];
extern const size_t kCatalogFileCount;

namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr double kG = 1e9;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string json_repr(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

[[noreturn]] void bad(const std::string& src, const std::string& field, const std::string& what,
                      const nlohmann::json& got) {
  bad_json_field(src, field, what, got);
}

// ---- The field table ------------------------------------------------------
//
// Every DeviceSpec field, its type and its range. A number outside its range
// is refused with a message naming the file and the field: the ranges are far
// beyond any real device, and they keep every product the cost models form
// (bytes x micro-batch, FLOPs / rate) finite and meaningful. `zero_ok` admits
// 0 besides the range: "none" (bf16_flops) or "not given" (fp16_flops, the
// time model's optional figures).
struct FieldDef {
  const char* name;
  enum Type { Str, Int, Dbl } type;
  double lo, hi;
  bool zero_ok;
  const char* unit;       // for messages and docs
  bool required;          // in a device given in full (no "gpu" to start from)
  std::string DeviceSpec::*s = nullptr;
  int64_t DeviceSpec::*i = nullptr;
  double DeviceSpec::*d = nullptr;
};

FieldDef str(const char* name, bool required, std::string DeviceSpec::*m) {
  return {name, FieldDef::Str, 0, 0, false, "", required, m, nullptr, nullptr};
}
FieldDef integer(const char* name, double lo, double hi, bool zero_ok, const char* unit, bool required,
                 int64_t DeviceSpec::*m) {
  return {name, FieldDef::Int, lo, hi, zero_ok, unit, required, nullptr, m, nullptr};
}
FieldDef number(const char* name, double lo, double hi, bool zero_ok, const char* unit, bool required,
                double DeviceSpec::*m) {
  return {name, FieldDef::Dbl, lo, hi, zero_ok, unit, required, nullptr, nullptr, m};
}

const std::vector<FieldDef>& device_fields() {
  using D = DeviceSpec;
  constexpr double kPiB = 1125899906842624.0;  // 2^50
  static const std::vector<FieldDef> fields = {
      str("kind", true, &D::kind),
      str("description", false, &D::description),
      integer("memory_bytes", 1 << 20, kPiB, false, "bytes", true, &D::memory_bytes),
      number("hbm_bytes_per_s", 1e8, 1e15, false, "bytes/s", true, &D::hbm_bytes_per_s),
      number("bf16_flops", 1e9, 1e18, true, "FLOP/s", true, &D::bf16_flops),
      number("fp16_flops", 1e9, 1e18, true, "FLOP/s", false, &D::fp16_flops),
      number("fp32_flops", 1e8, 1e18, false, "FLOP/s", true, &D::fp32_flops),
      number("link_bytes_per_s", 1e6, 1e14, false, "bytes/s", true, &D::link_bytes_per_s),
      number("net_bytes_per_s", 1e6, 1e14, false, "bytes/s", true, &D::net_bytes_per_s),
      number("gemm_efficiency", 1e-3, 1, false, "", true, &D::gemm_efficiency),
      number("link_efficiency", 1e-3, 1, false, "", true, &D::link_efficiency),
      number("net_efficiency", 1e-3, 1, false, "", true, &D::net_efficiency),
      number("base_latency_s", 0, 1, true, "s", true, &D::base_latency_s),
      number("link_hop_latency_s", 0, 1, true, "s", true, &D::link_hop_latency_s),
      number("net_hop_latency_s", 0, 1, true, "s", true, &D::net_hop_latency_s),
      integer("runtime_bytes", 0, kPiB, true, "bytes", true, &D::runtime_bytes),
      integer("gemm_workspace_bytes", 0, 1099511627776.0, true, "bytes", true, &D::gemm_workspace_bytes),
      number("op_overhead_s", 0, 1, true, "s", false, &D::op_overhead_s),
      integer("alloc_granularity_bytes", 1, 1 << 30, false, "bytes", false, &D::alloc_granularity_bytes),
      integer("host_memory_bytes", 1 << 20, kPiB, true, "bytes", false, &D::host_memory_bytes),
      number("host_link_bytes_per_s", 1e6, 1e14, true, "bytes/s", false, &D::host_link_bytes_per_s),
      number("host_bytes_per_s", 1e8, 1e15, true, "bytes/s", false, &D::host_bytes_per_s),
      number("memory_efficiency", 1e-3, 1, true, "", false, &D::memory_efficiency),
      integer("sm_count", 1, 65536, true, "", false, &D::sm_count),
      integer("gemm_tile", 1, 4096, true, "elements", false, &D::gemm_tile),
      number("gemm_k_half", 0, 1e6, true, "elements", false, &D::gemm_k_half),
      number("gemm_split_k_min", 1, 1e9, true, "elements", false, &D::gemm_split_k_min),
      number("flash_fwd_efficiency", 1e-3, 1, true, "", false, &D::flash_fwd_efficiency),
      number("flash_bwd_efficiency", 1e-3, 1, true, "", false, &D::flash_bwd_efficiency),
      number("flash_fwd_seq_half", 0, 1e7, true, "tokens", false, &D::flash_fwd_seq_half),
      number("flash_bwd_seq_half", 0, 1e7, true, "tokens", false, &D::flash_bwd_seq_half),
      number("flash_causal_seq_half", 0, 1e7, true, "tokens", false, &D::flash_causal_seq_half),
      number("flash_head_dim_half", 0, 1e4, true, "elements", false, &D::flash_head_dim_half),
      number("comm_slowdown", 0, 10, true, "", false, &D::comm_slowdown),
      number("comm_stall", 0, 1, true, "", false, &D::comm_stall),
      number("rank_jitter", 0, 1, true, "s^0.5", false, &D::rank_jitter),
      number("sustained_share", 1e-3, 1, true, "", false, &D::sustained_share),
      number("time_uncertainty", 1e-3, kMaxTimeUncertainty, true, "", false, &D::time_uncertainty),
      str("source", false, &D::source),
  };
  return fields;
}

const FieldDef* find_field(std::string_view name) {
  for (const auto& f : device_fields())
    if (name == f.name) return &f;
  return nullptr;
}

std::string field_list() {
  std::string out;
  for (const auto& f : device_fields()) out += (out.empty() ? "" : ", ") + std::string(f.name);
  return out + ", sources";
}

std::string range_text(const FieldDef& f) {
  const std::string unit = *f.unit ? std::string(" ") + f.unit : "";
  const std::string r = fmt::format("{} in [{:g}, {:g}]{}", f.type == FieldDef::Int ? "an integer" : "a number", f.lo, f.hi, unit);
  return f.zero_ok ? r + " (or 0)" : r;
}

bool in_range(const FieldDef& f, double v) { return (f.zero_ok && v == 0) || (v >= f.lo && v <= f.hi); }

double read_number(const nlohmann::json& v, const std::string& src, const std::string& field, const FieldDef& f) {
  if (!v.is_number()) bad(src, field, range_text(f), v);
  const double x = v.get<double>();
  if (!std::isfinite(x) || !in_range(f, x)) bad(src, field, range_text(f), v);
  return x;
}

int64_t read_integer(const nlohmann::json& v, const std::string& src, const std::string& field, const FieldDef& f) {
  if (!v.is_number()) bad(src, field, range_text(f), v);
  double x = 0;
  if (v.is_number_unsigned()) x = static_cast<double>(v.get<uint64_t>());
  else if (v.is_number_integer()) x = static_cast<double>(v.get<int64_t>());
  else x = v.get<double>();  // integral floats such as 80e9 are accepted
  if (!std::isfinite(x) || std::floor(x) != x || !in_range(f, x)) bad(src, field, range_text(f), v);
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(x);
}

std::string read_string(const nlohmann::json& v, const std::string& src, const std::string& field) {
  if (!v.is_string()) bad(src, field, "a string", v);
  return v.get<std::string>();
}

// Reads the fields of `dev` (a JSON object) into `d`, over what `d` holds.
void read_device(const nlohmann::json& dev, DeviceSpec& d, const std::string& src, const std::string& prefix) {
  if (!dev.is_object()) bad(src, prefix.empty() ? "the device" : prefix.substr(0, prefix.size() - 1), "an object", dev);
  for (const auto& [key, value] : dev.items()) {
    const std::string field = prefix + key;
    if (key == "sources") {
      if (!value.is_object()) bad(src, field, "an object of field: source text", value);
      for (const auto& [name, text] : value.items()) {
        const FieldDef* f = find_field(name);
        if (!f || f->type == FieldDef::Str)
          throw Error(src + ": " + field + " names '" + name + "', which is not a device figure; known: " + field_list());
        const std::string s = read_string(text, src, field + "." + name);
        if (s.empty()) bad(src, field + "." + name, "a non-empty string", text);
        d.sources[name] = s;
      }
      continue;
    }
    const FieldDef* f = find_field(key);
    if (!f) throw Error(src + ": unknown field '" + field + "'; known: " + field_list());
    switch (f->type) {
      case FieldDef::Str: d.*(f->s) = read_string(value, src, field); break;
      case FieldDef::Int: d.*(f->i) = read_integer(value, src, field, *f); break;
      case FieldDef::Dbl: d.*(f->d) = read_number(value, src, field, *f); break;
    }
  }
  // Figures checked against each other.
  if (d.runtime_bytes > d.memory_bytes && dev.contains("runtime_bytes"))
    bad(src, prefix + "runtime_bytes", "at most memory_bytes (" + std::to_string(d.memory_bytes) + ")", dev.at("runtime_bytes"));
  if (d.alloc_granularity_bytes > d.memory_bytes && dev.contains("alloc_granularity_bytes"))
    bad(src, prefix + "alloc_granularity_bytes", "at most memory_bytes (" + std::to_string(d.memory_bytes) + ")",
        dev.at("alloc_granularity_bytes"));
}

void require_fields(const nlohmann::json& dev, const std::string& src, const std::string& prefix, const char* advice) {
  for (const auto& f : device_fields())
    if (f.required && !dev.contains(f.name))
      throw Error(src + ": missing field '" + prefix + f.name + "'" + advice);
}

// ---- The catalog ------------------------------------------------------------

std::vector<DeviceSpec> build_catalog() {
  std::vector<DeviceSpec> rows;
  for (size_t k = 0; k < kCatalogFileCount; ++k)
    rows.push_back(parse_catalog_row(kCatalogFiles[k].text, std::string("planner/catalog/") + kCatalogFiles[k].name));
  rows.push_back(host_cpu_device());
  return rows;
}

std::string known_kinds() {
  std::string out;
  for (const auto& d : device_catalog()) out += (out.empty() ? "" : ", ") + d.kind;
  return out;
}

}  // namespace

std::vector<std::string> device_field_names() {
  std::vector<std::string> out;
  for (const auto& f : device_fields()) out.emplace_back(f.name);
  return out;
}

DeviceSpec parse_catalog_row(std::string_view text, const std::string& source) {
  const nlohmann::json j = parse_json_text(text, source);
  DeviceSpec d;
  d.alloc_granularity_bytes = 1;
  read_device(j, d, source, "");
  require_fields(j, source, "", "");
  if (d.kind.empty() || d.description.empty() || d.source.empty())
    throw Error(source + ": a catalog row needs a kind, a description and a source");
  // A source for every figure the row gives.
  for (const auto& f : device_fields())
    if (f.type != FieldDef::Str && j.contains(f.name) && !d.sources.count(f.name))
      throw Error(source + ": " + f.name + " has no source (sources." + f.name + ")");
  for (const auto& [name, text_] : d.sources)
    if (!j.contains(name)) throw Error(source + ": sources." + name + " cites a figure the row does not give");
  return d;
}

const std::vector<DeviceSpec>& device_catalog() {
  static const std::vector<DeviceSpec> rows = build_catalog();
  return rows;
}

// The host as a "device" for CPU plans (fp32 only). Its figures come from the
// host (memory, hardware threads) and nominal rates that `dlplan calibrate`
// replaces with measurements; it is not a catalog file because half of it is
// this machine.
DeviceSpec host_cpu_device() {
  DeviceSpec d;
  d.kind = "cpu";
  int64_t mem = 0;
  {
    std::ifstream in("/proc/meminfo");
    std::string key, unit;
    int64_t value = 0;
    while (in >> key >> value) {
      std::getline(in, unit);
      if (key == "MemTotal:") {
        mem = value * 1024;  // /proc/meminfo reports kB (KiB)
        break;
      }
    }
  }
  if (mem <= 0) {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) mem = static_cast<int64_t>(pages) * page;
  }
  if (mem <= 0) mem = 8 * kGiB;  // last resort, stated in the source below
  d.memory_bytes = mem;
  unsigned cores = std::thread::hardware_concurrency();
  if (cores == 0) cores = 1;
  d.description = "host CPU (" + std::to_string(cores) + " hardware threads)";
  // Nominal rates: fp32 GEMM 50 GFLOP/s per hardware thread (an AVX2 FMA core
  // sustains roughly 50-100; the low end, as a thread may be a hyper-thread),
  // memory 20 GB/s, MPI shared memory 5 GB/s per rank and direction, a few
  // microseconds per message and per op.
  d.hbm_bytes_per_s = 20 * kG;
  d.fp32_flops = 50 * kG * cores;
  d.bf16_flops = d.fp32_flops;  // bf16-mixed stores bf16 and computes in fp32 (docs/precision.md)
  d.fp16_flops = d.bf16_flops;  // fp16-mixed likewise: fp16 storage, fp32 arithmetic
  d.gemm_efficiency = 1.0;  // the nominal rate is already an achievable rate
  d.memory_efficiency = 1.0;
  d.link_bytes_per_s = 5 * kG;
  d.net_bytes_per_s = 5 * kG;
  d.link_efficiency = 1.0;
  d.net_efficiency = 1.0;
  d.base_latency_s = 5e-6;
  d.op_overhead_s = 2e-6;
  d.link_hop_latency_s = 2e-6;
  d.net_hop_latency_s = 2e-6;
  d.runtime_bytes = 0;  // DESIGN.md: runtime is 0 on the cpu device
  // The device is the host: offloading moves states to another pool of the
  // same memory, at its copy rate.
  d.host_memory_bytes = d.memory_bytes;
  d.host_link_bytes_per_s = d.hbm_bytes_per_s;
  d.host_bytes_per_s = d.hbm_bytes_per_s;
  d.gemm_workspace_bytes = 0;
  d.alloc_granularity_bytes = 1;
  // Before calibration the nominal rates miss by this much: tiny-gpt steps
  // on 2 ranks of a 2-core VM were predicted 70-77 % too short (issue 13;
  // docs/time.md). `dlplan calibrate` replaces it with its own held-back
  // measurements.
  d.time_uncertainty = 0.75;
  d.sources["time_uncertainty"] =
      "nominal rates: predicted steps 70-77 % short on a 2-core VM (issue 13, docs/time.md); `dlplan calibrate` "
      "measures its own";
  d.source =
      "host: memory from /proc/meminfo MemTotal (sysconf fallback); nominal 50 GFLOP/s fp32 per hardware thread, "
      "20 GB/s memory, 5 GB/s MPI shared-memory links (documented guesses until `dlplan calibrate` measures them)";
  return d;
}

DeviceSpec find_device(std::string_view kind) {
  std::string k = lower(kind);
  // Aliases: the bare family name means the largest-memory SXM part.
  static const std::pair<const char*, const char*> aliases[] = {
      {"h100", "h100-80g"},    {"h100-sxm", "h100-80g"}, {"h200", "h200-141g"}, {"a100", "a100-80g"},
      {"v100", "v100-32g"},    {"4090", "rtx4090"},      {"rtx-4090", "rtx4090"}, {"mi300", "mi300x"},
      {"b200-180g", "b200"},   {"host", "cpu"},
  };
  for (const auto& [alias, target] : aliases)
    if (k == alias) k = target;
  if (k == "cpu") return host_cpu_device();
  for (const auto& d : device_catalog())
    if (d.kind == k) return d;
  throw Error("unknown GPU kind '" + std::string(kind) + "'; known: " + known_kinds());
}

nlohmann::ordered_json cluster_to_json(const Cluster& c) {
  nlohmann::ordered_json dev = nlohmann::ordered_json::object();
  for (const auto& f : device_fields()) {
    switch (f.type) {
      case FieldDef::Str: dev[f.name] = c.device.*(f.s); break;
      case FieldDef::Int: dev[f.name] = c.device.*(f.i); break;
      case FieldDef::Dbl: dev[f.name] = c.device.*(f.d); break;
    }
  }
  if (!c.device.sources.empty()) {
    nlohmann::ordered_json s = nlohmann::ordered_json::object();
    for (const auto& f : device_fields())
      if (auto it = c.device.sources.find(f.name); it != c.device.sources.end()) s[f.name] = it->second;
    dev["sources"] = std::move(s);
  }
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["device"] = std::move(dev);
  j["nodes"] = c.nodes;
  j["gpus_per_node"] = c.gpus_per_node;
  if (c.storage_bytes_per_s > 0) j["storage_bytes_per_s"] = c.storage_bytes_per_s;
  if (c.op_costs) j["op_costs"] = op_costs_to_json(*c.op_costs);
  if (c.collective_costs) j["collective_costs"] = collective_costs_to_json(*c.collective_costs);
  return j;
}

Cluster cluster_from_json(const nlohmann::json& j, const std::string& source) {
  const std::string& src = source;
  if (!j.is_object())
    throw Error(src + ": a cluster must be a JSON object with \"device\" (or \"gpu\"), \"nodes\" and \"gpus_per_node\" (got " +
                json_repr(j) + ")");
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (key != "device" && key != "gpu" && key != "nodes" && key != "gpus_per_node" && key != "storage_bytes_per_s" &&
        key != "op_costs" && key != "collective_costs")
      throw Error(src + ": unknown field '" + key +
                  "'; known: device, gpu, nodes, gpus_per_node, storage_bytes_per_s, op_costs, collective_costs");
  }
  Cluster c;
  const bool from_catalog = j.contains("gpu");
  if (from_catalog) {
    const std::string kind = read_string(j.at("gpu"), src, "gpu");
    try {
      c.device = find_device(kind);
    } catch (const Error& e) {
      throw Error(src + ": gpu: " + e.what());
    }
  } else if (!j.contains("device")) {
    throw Error(src + ": missing field 'device' (or 'gpu' naming a catalog kind: " + known_kinds() + ")");
  }
  if (j.contains("device")) {
    const auto& dev = j.at("device");
    if (!from_catalog) c.device = DeviceSpec{};
    read_device(dev, c.device, src, "device.");
    if (!from_catalog)
      require_fields(dev, src, "device.", " (give every device field, or \"gpu\": a catalog kind to start from)");
    if (c.device.kind.empty()) bad(src, "device.kind", "a non-empty string", dev.contains("kind") ? dev.at("kind") : nlohmann::json(""));
    if (c.device.source.empty()) c.device.source = src;
    // A figure the file overrides no longer has the catalog's source.
    if (from_catalog)
      for (const auto& [key, value] : dev.items())
        if (key != "sources" && !(dev.contains("sources") && dev.at("sources").contains(key))) c.device.sources.erase(key);
  }
  // Ranges checked before narrowing to int.
  auto count = [&](const char* field, int64_t hi) {
    static const FieldDef f{"", FieldDef::Int, 1, 0, false, "", false, nullptr, nullptr, nullptr};
    FieldDef g = f;
    g.hi = static_cast<double>(hi);
    return static_cast<int>(read_integer(j.at(field), src, field, g));
  };
  if (j.contains("nodes")) c.nodes = count("nodes", 1000000);
  if (j.contains("gpus_per_node")) c.gpus_per_node = count("gpus_per_node", 1024);
  if (j.contains("storage_bytes_per_s")) {
    // Checkpoint writes per node: 1 MB/s to 10 TB/s.
    static const FieldDef f{"storage_bytes_per_s", FieldDef::Dbl, 1e6, 1e13, false, "B/s", false, nullptr, nullptr, nullptr};
    c.storage_bytes_per_s = read_number(j.at("storage_bytes_per_s"), src, "storage_bytes_per_s", f);
  }
  if (j.contains("op_costs")) c.op_costs = std::make_shared<const OpCostTable>(op_costs_from_json(j.at("op_costs"), src));
  if (j.contains("collective_costs"))
    c.collective_costs =
        std::make_shared<const CollectiveCostTable>(collective_costs_from_json(j.at("collective_costs"), src));
  return c;
}

Cluster load_cluster_file(const std::string& path) { return cluster_from_json(read_json_file(path, "cluster file"), path); }

}  // namespace dlplan
