// Hardware catalog and cluster files: figures against the datasheets quoted in
// REFERENCES.md, a source for every catalog figure, and every user error
// (absurd numbers included) naming its file and field.
#include "dlplan/error.hpp"
#include "dlplan/hardware.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace dlplan {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream out(path, std::ios::binary);
  out << text;
  return path;
}

// The message of the dlplan::Error that `f` throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Catalog, KindsInStableOrder) {
  std::vector<std::string> kinds;
  for (const auto& d : device_catalog()) kinds.push_back(d.kind);
  const std::vector<std::string> want = {"v100-32g", "a100-40g", "a100-80g", "h100-80g",
                                         "h200-141g", "b200",    "l40s",     "rtx4090",
                                         "mi300x",   "cpu"};
  EXPECT_EQ(kinds, want);
}

TEST(Catalog, EveryRowHasPositiveFiguresAndASource) {
  for (const auto& d : device_catalog()) {
    SCOPED_TRACE(d.kind);
    EXPECT_GT(d.memory_bytes, 0);
    EXPECT_GT(d.hbm_bytes_per_s, 0);
    EXPECT_GE(d.bf16_flops, 0);
    EXPECT_GT(d.fp32_flops, 0);
    EXPECT_GT(d.link_bytes_per_s, 0);
    EXPECT_GT(d.net_bytes_per_s, 0);
    for (double e : {d.gemm_efficiency, d.link_efficiency, d.net_efficiency}) {
      EXPECT_GT(e, 0);
      EXPECT_LE(e, 1);
    }
    EXPECT_GT(d.base_latency_s, 0);
    EXPECT_GT(d.link_hop_latency_s, 0);
    EXPECT_GT(d.net_hop_latency_s, 0);
    EXPECT_GE(d.runtime_bytes, 0);
    EXPECT_GE(d.gemm_workspace_bytes, 0);
    EXPECT_FALSE(d.description.empty());
    EXPECT_GT(d.source.size(), 20u);
    if (d.kind != "cpu") {
      // A source for every figure the row gives (a figure it leaves at 0,
      // "not given", needs none), and the core figures are all given.
      const auto dev = cluster_to_json(Cluster{d, 1, 1})["device"];
      for (const auto& f : device_field_names()) {
        if (f == "kind" || f == "description" || f == "source" || dev[f] == 0) continue;
        ASSERT_TRUE(d.sources.count(f)) << d.kind << "." << f << " has no source";
        EXPECT_GT(d.sources.at(f).size(), 10u) << d.kind << "." << f;
      }
      for (const char* f : {"memory_bytes", "hbm_bytes_per_s", "fp16_flops", "fp32_flops", "link_bytes_per_s", "net_bytes_per_s",
                            "gemm_efficiency", "memory_efficiency", "sm_count", "op_overhead_s", "alloc_granularity_bytes"})
        EXPECT_TRUE(d.sources.count(f)) << d.kind << "." << f;
      // Every GPU but the V100 (no published fp32 GEMM curve) has the per-op-class model.
      EXPECT_EQ(d.has_kernel_model(), d.kind != "v100-32g") << d.kind;
      EXPECT_GT(d.runtime_bytes, 0) << "a GPU has a CUDA/HIP context";
      EXPECT_GT(d.gemm_workspace_bytes, 0);
      EXPECT_TRUE(d.has_bf16() || d.kind == "v100-32g");
      EXPECT_TRUE(d.has_fp16());  // every GPU row has fp16 tensor cores, the V100 included
      // Network is slower than the in-node link on every GPU row.
      EXPECT_LT(d.net_bytes_per_s, d.link_bytes_per_s);
    }
  }
}

TEST(Catalog, H100IsDensePeakSoMfuCannotExceedOne) {
  const DeviceSpec h100 = find_device("h100-80g");
  EXPECT_DOUBLE_EQ(h100.bf16_flops, 989e12);
  EXPECT_NE(h100.bf16_flops, 1979e12);  // control: the sparse figure
  EXPECT_DOUBLE_EQ(h100.fp32_flops, 67e12);
  EXPECT_DOUBLE_EQ(h100.link_bytes_per_s, 450e9);
  EXPECT_EQ(h100.memory_bytes, int64_t{81559} << 20);
  // REFERENCES.md: one H200 ran a bf16 8192^3 GEMM at 769-798 TFLOP/s: 78-81 %
  // of the dense peak, under the GEMM curve's ceiling (gpu_model_test.cpp
  // holds the curve at 8192^3 to that band); against the sparse 1,979 it
  // would be a meaningless 40 %.
  const DeviceSpec h200 = find_device("h200-141g");
  EXPECT_EQ(h200.bf16_flops, h100.bf16_flops);
  EXPECT_LT(798e12 / h200.bf16_flops, 1.0);
  EXPECT_LT(798e12 / h200.bf16_flops, h200.gemm_efficiency);
  EXPECT_GT(769e12 / 1979e12, 0.35);  // control: the sparse figure would halve it
  EXPECT_LT(769e12 / 1979e12, 0.40);
  EXPECT_EQ(h200.memory_bytes, int64_t{143771} << 20);
  EXPECT_NE(h200.memory_bytes, h100.memory_bytes);  // control
}

TEST(Catalog, DatasheetFigures) {
  EXPECT_DOUBLE_EQ(find_device("a100-40g").hbm_bytes_per_s, 1555e9);
  EXPECT_DOUBLE_EQ(find_device("a100-80g").hbm_bytes_per_s, 2039e9);
  EXPECT_DOUBLE_EQ(find_device("a100-80g").bf16_flops, 312e12);

  EXPECT_DOUBLE_EQ(find_device("b200").bf16_flops, 2250e12);
  EXPECT_DOUBLE_EQ(find_device("b200").link_bytes_per_s, 900e9);
  EXPECT_DOUBLE_EQ(find_device("mi300x").link_bytes_per_s, 7 * 64e9);
  EXPECT_DOUBLE_EQ(find_device("l40s").bf16_flops, 362e12);
  EXPECT_DOUBLE_EQ(find_device("rtx4090").fp32_flops, 82.6e12);
  // cuBLAS workspace: 32 MiB on Hopper+, 4 MiB before.
  EXPECT_EQ(find_device("h100-80g").gemm_workspace_bytes, 32 << 20);
  EXPECT_EQ(find_device("a100-80g").gemm_workspace_bytes, 4 << 20);
  // link_efficiency fitted to measured 8-GPU busbw (REFERENCES.md Collectives).
  const DeviceSpec a100 = find_device("a100-80g");
  EXPECT_NEAR(a100.link_bytes_per_s * a100.link_efficiency, 230e9, 0.02 * 230e9);
  const DeviceSpec h100 = find_device("h100-80g");
  EXPECT_NEAR(h100.link_bytes_per_s * h100.link_efficiency, 365e9, 0.02 * 365e9);
  // NDR per GPU in the measured 46-49 GB/s band; HDR ~24 GB/s.
  EXPECT_GE(h100.net_bytes_per_s * h100.net_efficiency, 46e9);
  EXPECT_LE(h100.net_bytes_per_s * h100.net_efficiency, 49e9);
  EXPECT_NEAR(a100.net_bytes_per_s * a100.net_efficiency, 24e9, 1e9);
}

TEST(Catalog, V100HasNoBf16) {
  const DeviceSpec v100 = find_device("v100-32g");
  EXPECT_FALSE(v100.has_bf16());
  EXPECT_EQ(v100.bf16_flops, 0);
  EXPECT_DOUBLE_EQ(v100.fp32_flops, 15.7e12);
  EXPECT_TRUE(find_device("a100-40g").has_bf16());  // control
}

// The dense fp16 tensor-core rate with fp32 accumulate (docs/catalog.md,
// REFERENCES.md Compute): never the sparse figure, nor the RTX 4090's fp16
// accumulate rate.
TEST(Catalog, Fp16DatasheetFigures) {
  const std::pair<const char*, double> want[] = {
      {"v100-32g", 125e12},  {"a100-40g", 312e12}, {"a100-80g", 312e12},  {"h100-80g", 989.4e12}, {"h200-141g", 989.4e12},
      {"b200", 2250e12},     {"l40s", 362.05e12},  {"rtx4090", 165.2e12}, {"mi300x", 1307.4e12},
  };
  for (const auto& [kind, flops] : want) {
    const DeviceSpec d = find_device(kind);
    EXPECT_DOUBLE_EQ(d.fp16_flops, flops) << kind;
    // The same tensor cores run bf16 at the same rate, where the part has it.
    if (d.has_bf16()) {
      EXPECT_NEAR(d.fp16_flops, d.bf16_flops, 0.001 * d.bf16_flops) << kind;
    }
  }
  EXPECT_NE(find_device("h100-80g").fp16_flops, 1979e12);   // control: the sparse figure
  EXPECT_NE(find_device("rtx4090").fp16_flops, 330.3e12);   // control: fp16 accumulate
  // The V100 has fp16 tensor cores but no bf16.
  EXPECT_TRUE(find_device("v100-32g").has_fp16());
  EXPECT_FALSE(find_device("v100-32g").has_bf16());
}

TEST(Catalog, CpuRowDescribesThisHost) {
  const DeviceSpec cpu = find_device("cpu");
  EXPECT_EQ(cpu.kind, "cpu");
  // The CPU engine runs bf16-mixed (bf16 storage, fp32 arithmetic, as CPU
  // autocast): the row has bf16, at the fp32 rate.
  EXPECT_TRUE(cpu.has_bf16());
  EXPECT_DOUBLE_EQ(cpu.bf16_flops, cpu.fp32_flops);
  // fp16-mixed likewise (fp16 storage, fp32 arithmetic).
  EXPECT_TRUE(cpu.has_fp16());
  EXPECT_DOUBLE_EQ(cpu.fp16_flops, cpu.bf16_flops);
  EXPECT_EQ(cpu.runtime_bytes, 0);
  EXPECT_EQ(cpu.gemm_workspace_bytes, 0);
  // Independent read of MemTotal.
  std::ifstream in("/proc/meminfo");
  std::string key;
  long long kb = 0;
  std::string unit;
  long long want = -1;
  while (in >> key >> kb >> unit)
    if (key == "MemTotal:") {
      want = kb * 1024;
      break;
    }
  if (want > 0) {
    EXPECT_EQ(cpu.memory_bytes, want);
  }
  EXPECT_GT(cpu.memory_bytes, int64_t{256} << 20);
  EXPECT_EQ(host_cpu_device().memory_bytes, cpu.memory_bytes);
}

TEST(FindDevice, CaseInsensitiveAndAliases) {
  EXPECT_EQ(find_device("H100-80G").kind, "h100-80g");
  EXPECT_EQ(find_device("h100").kind, "h100-80g");
  EXPECT_EQ(find_device("H200").kind, "h200-141g");
  EXPECT_EQ(find_device("a100").kind, "a100-80g");
  EXPECT_EQ(find_device("4090").kind, "rtx4090");
  EXPECT_EQ(find_device("MI300X").kind, "mi300x");
  EXPECT_NE(find_device("a100-40g").kind, find_device("a100").kind);  // control
}

TEST(FindDevice, UnknownListsTheKnownKinds) {
  const std::string msg = error_of([] { find_device("tpu-v5"); });
  EXPECT_NE(msg.find("unknown GPU kind 'tpu-v5'"), std::string::npos) << msg;
  for (const auto& d : device_catalog())
    EXPECT_NE(msg.find(d.kind), std::string::npos) << d.kind << " missing from: " << msg;
  EXPECT_EQ(error_of([] { find_device("b200"); }), "");  // control
}

void expect_same(const DeviceSpec& a, const DeviceSpec& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.description, b.description);
  EXPECT_EQ(a.memory_bytes, b.memory_bytes);
  EXPECT_EQ(a.hbm_bytes_per_s, b.hbm_bytes_per_s);
  EXPECT_EQ(a.bf16_flops, b.bf16_flops);
  EXPECT_EQ(a.fp16_flops, b.fp16_flops);
  EXPECT_EQ(a.fp32_flops, b.fp32_flops);
  EXPECT_EQ(a.link_bytes_per_s, b.link_bytes_per_s);
  EXPECT_EQ(a.net_bytes_per_s, b.net_bytes_per_s);
  EXPECT_EQ(a.gemm_efficiency, b.gemm_efficiency);
  EXPECT_EQ(a.link_efficiency, b.link_efficiency);
  EXPECT_EQ(a.net_efficiency, b.net_efficiency);
  EXPECT_EQ(a.base_latency_s, b.base_latency_s);
  EXPECT_EQ(a.link_hop_latency_s, b.link_hop_latency_s);
  EXPECT_EQ(a.net_hop_latency_s, b.net_hop_latency_s);
  EXPECT_EQ(a.runtime_bytes, b.runtime_bytes);
  EXPECT_EQ(a.gemm_workspace_bytes, b.gemm_workspace_bytes);
  EXPECT_EQ(a.op_overhead_s, b.op_overhead_s);
  EXPECT_EQ(a.memory_efficiency, b.memory_efficiency);
  EXPECT_EQ(a.sm_count, b.sm_count);
  EXPECT_EQ(a.gemm_k_half, b.gemm_k_half);
  EXPECT_EQ(a.flash_fwd_efficiency, b.flash_fwd_efficiency);
  EXPECT_EQ(a.flash_causal_seq_half, b.flash_causal_seq_half);
  EXPECT_EQ(a.comm_slowdown, b.comm_slowdown);
  EXPECT_EQ(a.comm_stall, b.comm_stall);
  EXPECT_EQ(a.rank_jitter, b.rank_jitter);
  EXPECT_EQ(a.sustained_share, b.sustained_share);
  EXPECT_EQ(a.time_uncertainty, b.time_uncertainty);
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(a.sources, b.sources);
}

TEST(ClusterJson, RoundTripsEveryRowThroughText) {
  for (const auto& d : device_catalog()) {
    SCOPED_TRACE(d.kind);
    Cluster c{d, 3, 8};
    const std::string text = cluster_to_json(c).dump(2);
    const Cluster back = cluster_from_json(nlohmann::json::parse(text), "round-trip");
    expect_same(back.device, d);
    EXPECT_EQ(back.nodes, 3);
    EXPECT_EQ(back.gpus_per_node, 8);
    EXPECT_EQ(cluster_to_json(back), cluster_to_json(c));
  }
  // Control: a changed field shows up in the JSON.
  Cluster a{find_device("h100-80g"), 1, 8};
  Cluster b = a;
  b.device.link_efficiency = 0.5;
  EXPECT_NE(cluster_to_json(a), cluster_to_json(b));
}

TEST(ClusterJson, FieldNamesAreTheStructsSnakeCaseNames) {
  const auto j = cluster_to_json(Cluster{find_device("a100-80g"), 2, 4});
  ASSERT_TRUE(j.contains("device"));
  EXPECT_EQ(j["nodes"], 2);
  EXPECT_EQ(j["gpus_per_node"], 4);
  for (const char* f : {"kind", "description", "memory_bytes", "hbm_bytes_per_s", "bf16_flops", "fp16_flops",
                        "fp32_flops", "link_bytes_per_s", "net_bytes_per_s", "gemm_efficiency",
                        "link_efficiency", "net_efficiency", "base_latency_s",
                        "link_hop_latency_s", "net_hop_latency_s", "runtime_bytes",
                        "gemm_workspace_bytes", "op_overhead_s", "alloc_granularity_bytes", "host_memory_bytes",
                        "host_link_bytes_per_s", "host_bytes_per_s", "memory_efficiency",
                        "sm_count", "gemm_tile", "gemm_k_half", "gemm_split_k_min", "flash_fwd_efficiency",
                        "flash_bwd_efficiency", "flash_fwd_seq_half", "flash_bwd_seq_half", "flash_causal_seq_half",
                        "flash_head_dim_half", "comm_slowdown", "comm_stall", "rank_jitter", "sustained_share", "time_uncertainty", "source",
                        "sources"})
    EXPECT_TRUE(j["device"].contains(f)) << f;
  EXPECT_EQ(j["device"].size(), device_field_names().size() + 1);  // + sources
  EXPECT_EQ(device_field_names().size(), 39u);
}

TEST(ClusterFile, CatalogKindWithOverrides) {
  const std::string path = write_temp(
      "gpu_override.json",
      R"({"gpu": "H100", "nodes": 2, "gpus_per_node": 8,
          "device": {"net_bytes_per_s": 25e9, "runtime_bytes": 536870912}})");
  const Cluster c = load_cluster_file(path);
  const DeviceSpec base = find_device("h100-80g");
  EXPECT_EQ(c.device.kind, "h100-80g");
  EXPECT_EQ(c.world(), 16);
  EXPECT_EQ(c.device.net_bytes_per_s, 25e9);
  EXPECT_NE(c.device.net_bytes_per_s, base.net_bytes_per_s);  // control: override applied
  EXPECT_EQ(c.device.runtime_bytes, int64_t{512} << 20);
  EXPECT_EQ(c.device.bf16_flops, base.bf16_flops);  // untouched fields come from the catalog
}

TEST(ClusterFile, StorageBandwidthIsReadCheckedAndWrittenBack) {
  const Cluster c = load_cluster_file(write_temp("storage.json", R"({"gpu": "h100", "storage_bytes_per_s": 2.5e9})"));
  EXPECT_EQ(c.storage_bytes_per_s, 2.5e9);
  EXPECT_EQ(cluster_from_json(nlohmann::json(cluster_to_json(c)), "round trip").storage_bytes_per_s, 2.5e9);
  EXPECT_FALSE(cluster_to_json(Cluster{find_device("h100-80g"), 1, 8, 0}).contains("storage_bytes_per_s")) << "the default is not written";
  for (const char* bad : {R"({"gpu": "h100", "storage_bytes_per_s": 0})", R"({"gpu": "h100", "storage_bytes_per_s": "fast"})",
                          R"({"gpu": "h100", "storage_bytes_per_s": 1e20})"}) {
    const std::string path = write_temp("storage_bad.json", bad);
    const std::string msg = error_of([&] { load_cluster_file(path); });
    EXPECT_NE(msg.find(path + ": storage_bytes_per_s"), std::string::npos) << msg;
  }
}

TEST(ClusterFile, UnknownFieldNamesFileAndField) {
  const std::string path = write_temp(
      "unknown_field.json", R"({"gpu": "a100", "device": {"memory_gb": 80}, "nodes": 1})");
  const std::string msg = error_of([&] { load_cluster_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("device.memory_gb"), std::string::npos) << msg;

  const std::string top = write_temp("unknown_top.json", R"({"gpu": "a100", "gpus": 8})");
  const std::string msg2 = error_of([&] { load_cluster_file(top); });
  EXPECT_NE(msg2.find(top), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("'gpus'"), std::string::npos) << msg2;

  const std::string ok = write_temp("known_field.json",
                                    R"({"gpu": "a100", "device": {"memory_bytes": 85899345920}})");
  EXPECT_EQ(error_of([&] { load_cluster_file(ok); }), "");  // control
}

TEST(ClusterFile, NegativeMemoryNamesFileAndField) {
  auto j = cluster_to_json(Cluster{find_device("h100-80g"), 1, 8});
  j["device"]["memory_bytes"] = -5;
  const std::string path = write_temp("negative_memory.json", j.dump());
  const std::string msg = error_of([&] { load_cluster_file(path); });
  EXPECT_NE(msg.find(path + ": device.memory_bytes must be an integer in ["), std::string::npos) << msg;
  j["device"]["memory_bytes"] = int64_t{16} << 30;
  const std::string fine = write_temp("positive_memory.json", j.dump());
  EXPECT_EQ(load_cluster_file(fine).device.memory_bytes, int64_t{16} << 30);  // control
}

// Issue 16: numbers a fuzzer or a typo produces, which used to print as
// normal (negative activations, "fits yes", inf step times), are refused with
// the file and the field.
TEST(ClusterFile, AbsurdNumbersAreRefusedNamingTheField) {
  struct Case {
    const char* device;  // the "device" object's text
    const char* field;
  };
  const Case cases[] = {
      {R"({"alloc_granularity_bytes": 8.999e18})", "device.alloc_granularity_bytes"},
      {R"({"bf16_flops": 1e-320})", "device.bf16_flops"},
      {R"({"fp32_flops": -67e12})", "device.fp32_flops"},
      {R"({"hbm_bytes_per_s": 1e300})", "device.hbm_bytes_per_s"},
      {R"({"memory_bytes": 1e30})", "device.memory_bytes"},
      {R"({"runtime_bytes": 999999999999999})", "device.runtime_bytes"},  // more than the memory
      {R"({"gemm_workspace_bytes": -1})", "device.gemm_workspace_bytes"},
      {R"({"net_efficiency": 0})", "device.net_efficiency"},
      {R"({"base_latency_s": 3600})", "device.base_latency_s"},
      {R"({"sm_count": 0.5})", "device.sm_count"},
      {R"({"flash_fwd_efficiency": 1.5})", "device.flash_fwd_efficiency"},
      {R"({"comm_slowdown": -0.1})", "device.comm_slowdown"},
      {R"({"sources": {"memory_gb": "x"}})", "device.sources"},
      {R"({"sources": {"memory_bytes": 7}})", "device.sources.memory_bytes"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string path = write_temp("absurd" + std::to_string(i++) + ".json",
                                        std::string(R"({"gpu": "h100", "device": )") + c.device + "}");
    const std::string msg = error_of([&] { load_cluster_file(path); });
    EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << c.device << " -> " << msg;
    EXPECT_NE(msg.find(c.field), std::string::npos) << c.device << " -> " << msg;
  }
  // NaN and infinity are not JSON: the reader says where the file breaks.
  const std::string nan = write_temp("nan.json", R"({"gpu": "h100", "device": {"bf16_flops": NaN}})");
  EXPECT_NE(error_of([&] { load_cluster_file(nan); }).find(nan + ": malformed JSON"), std::string::npos);
  const std::string big = write_temp("huge.json", R"({"gpu": "h100", "device": {"bf16_flops": 1e400}})");
  EXPECT_NE(error_of([&] { load_cluster_file(big); }).find(big), std::string::npos);
  // Control: the same fields at sane values load.
  const std::string ok = write_temp("sane.json", R"({"gpu": "h100", "device": {"alloc_granularity_bytes": 512,
      "bf16_flops": 1e15, "runtime_bytes": 1073741824, "comm_slowdown": 0.1, "sources": {"bf16_flops": "ours"}}})");
  const Cluster c = load_cluster_file(ok);
  EXPECT_EQ(c.device.bf16_flops, 1e15);
  EXPECT_EQ(c.device.sources.at("bf16_flops"), "ours");
}

TEST(ClusterFile, AnOverriddenFigureLosesTheCatalogsSource) {
  const std::string path = write_temp("override_source.json", R"({"gpu": "h100", "device": {"net_bytes_per_s": 25e9}})");
  const Cluster c = load_cluster_file(path);
  EXPECT_FALSE(c.device.sources.count("net_bytes_per_s"));
  EXPECT_TRUE(c.device.sources.count("hbm_bytes_per_s"));  // control: untouched figures keep theirs
}

// fp16_flops is optional: a device given in full without it (a cluster file
// written before the field existed) loads with 0, "not given"; given, it is
// read and range-checked like bf16_flops.
TEST(ClusterFile, Fp16FlopsIsOptional) {
  auto j = cluster_to_json(Cluster{find_device("a100-80g"), 1, 8});
  j["device"].erase("fp16_flops");
  j["device"]["sources"].erase("fp16_flops");
  ASSERT_FALSE(j["device"].contains("fp16_flops"));
  const std::string without = write_temp("no_fp16.json", j.dump());
  const Cluster c = load_cluster_file(without);
  EXPECT_EQ(c.device.fp16_flops, 0);
  EXPECT_FALSE(c.device.has_fp16());
  EXPECT_TRUE(c.device.has_bf16());  // control: the other figures are read
  EXPECT_EQ(c.device.bf16_flops, 312e12);
  // A required field dropped the same way is refused (control).
  auto k = j;
  k["device"].erase("bf16_flops");
  const std::string no_bf16 = write_temp("no_bf16.json", k.dump());
  EXPECT_NE(error_of([&] { load_cluster_file(no_bf16); }).find("missing field 'device.bf16_flops'"), std::string::npos);
  // Given, it is read; out of range, refused naming the field.
  j["device"]["fp16_flops"] = 2e14;
  const std::string with = write_temp("with_fp16.json", j.dump());
  EXPECT_EQ(load_cluster_file(with).device.fp16_flops, 2e14);
  j["device"]["fp16_flops"] = -1;
  const std::string negative = write_temp("negative_fp16.json", j.dump());
  EXPECT_NE(error_of([&] { load_cluster_file(negative); }).find(negative + ": device.fp16_flops must be a number in ["),
            std::string::npos);
  // Starting from a catalog row, the row's figure stays unless overridden.
  const std::string from_row = write_temp("fp16_from_row.json", R"({"gpu": "v100", "device": {"net_bytes_per_s": 25e9}})");
  EXPECT_EQ(load_cluster_file(from_row).device.fp16_flops, 125e12);
}

TEST(CatalogRow, EveryFigureNeedsASource) {
  const std::string row = R"({"kind": "x", "description": "X", "source": "test", "memory_bytes": 1073741824,
      "hbm_bytes_per_s": 1e12, "bf16_flops": 1e14, "fp32_flops": 1e13, "link_bytes_per_s": 1e11,
      "net_bytes_per_s": 1e10, "gemm_efficiency": 0.8, "link_efficiency": 0.8, "net_efficiency": 0.9,
      "base_latency_s": 1e-5, "link_hop_latency_s": 1e-6, "net_hop_latency_s": 1e-6, "runtime_bytes": 0,
      "gemm_workspace_bytes": 0, "sources": {SOURCES}})";
  std::string all;
  for (const char* f : {"memory_bytes", "hbm_bytes_per_s", "bf16_flops", "fp32_flops", "link_bytes_per_s", "net_bytes_per_s",
                        "gemm_efficiency", "link_efficiency", "net_efficiency", "base_latency_s", "link_hop_latency_s",
                        "net_hop_latency_s", "runtime_bytes", "gemm_workspace_bytes"})
    all += std::string(all.empty() ? "" : ", ") + "\"" + f + "\": \"a datasheet\"";
  auto with = [&](const std::string& sources) {
    std::string t = row;
    t.replace(t.find("SOURCES"), 7, sources);
    return t;
  };
  EXPECT_EQ(error_of([&] { parse_catalog_row(with(all), "row.json"); }), "");  // control
  const std::string missing = all.substr(all.find(',') + 2);  // memory_bytes's source dropped
  EXPECT_NE(error_of([&] { parse_catalog_row(with(missing), "row.json"); }).find("row.json: memory_bytes has no source"),
            std::string::npos);
  const std::string extra = all + R"(, "sm_count": "a whitepaper")";
  EXPECT_NE(error_of([&] { parse_catalog_row(with(extra), "row.json"); }).find("sources.sm_count cites a figure the row does not give"),
            std::string::npos);
}

TEST(ClusterFile, TypeAndRangeErrorsNameTheField) {
  struct Case {
    const char* text;
    const char* field;
  };
  const Case cases[] = {
      {R"({"gpu": "h100", "nodes": 0})", "nodes must be an integer in [1, 1e+06]"},
      {R"({"gpu": "h100", "gpus_per_node": 2.5})", "gpus_per_node must be an integer in [1, 1024]"},
      {R"({"gpu": "h100", "device": {"link_efficiency": 1.5}})", "device.link_efficiency"},
      {R"({"gpu": "h100", "device": {"fp32_flops": "fast"}})", "device.fp32_flops"},
      {R"({"gpu": "h100", "device": {"kind": 7}})", "device.kind must be a string"},
      {R"({"gpu": 100})", "gpu must be a string"},
      {R"({"gpu": "tpu"})", "unknown GPU kind 'tpu'"},
      {R"({"device": {"kind": "mine", "memory_bytes": 8589934592}})", "missing field 'device.hbm_bytes_per_s'"},
      {R"({"device": {"kind": "mine", "memory_bytes": 1}})", "device.memory_bytes must be an integer in ["},
      {R"({"nodes": 1})", "missing field 'device'"},
      {R"([1, 2])", "must be a JSON object"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string path = write_temp("case" + std::to_string(i++) + ".json", c.text);
    const std::string msg = error_of([&] { load_cluster_file(path); });
    EXPECT_NE(msg.find(path), std::string::npos) << c.text << " -> " << msg;
    EXPECT_NE(msg.find(c.field), std::string::npos) << c.text << " -> " << msg;
  }
}

TEST(ClusterFile, MalformedJsonNamesFileAndPosition) {
  const std::string path = write_temp("malformed.json", "{\"gpu\": \"h100\",, }");
  const std::string msg = error_of([&] { load_cluster_file(path); });
  EXPECT_EQ(msg.rfind(path + ": malformed JSON at byte ", 0), 0u) << msg;
  EXPECT_NE(msg.find("byte 16"), std::string::npos) << msg;
  const std::string good = write_temp("wellformed.json", "{\"gpu\": \"h100\" }");
  EXPECT_EQ(error_of([&] { load_cluster_file(good); }), "");  // control
}

TEST(ClusterFile, MissingFileNamesIt) {
  const std::string path = ::testing::TempDir() + "no/such/cluster.json";
  const std::string msg = error_of([&] { load_cluster_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

}  // namespace
}  // namespace dlplan
