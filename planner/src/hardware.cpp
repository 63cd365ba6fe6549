// The hardware catalog and cluster files. Figures come from vendor datasheets
// as collected in REFERENCES.md ("Hardware", "Collectives"); every row's
// `source` says where each number comes from, and every guess is marked so.
#include "dlplan/hardware.hpp"

#include "dlplan/error.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <unistd.h>

namespace dlplan {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr double kT = 1e12;  // tera
constexpr double kG = 1e9;   // giga

// ---- Defaults shared by several rows -------------------------------------
//
// runtime_bytes (DESIGN.md "Memory categories", `runtime`): the CUDA context
// (hundreds of MiB to over 1 GiB depending on driver and lazy loading,
// REFERENCES.md "Memory"), the cuBLAS/cuDNN handles, and NCCL's internal
// buffers (NCCL_BUFFSIZE 4 MiB per channel per peer, SIMPLE protocol: with
// 8 ranks and ~16-32 channels on NVLink that is 0.1-0.5 GiB more on the
// larger parts). Hopper / Blackwell / MI300X run more channels and ship larger
// kernel images, so we charge 1 GiB there and 768 MiB on Ampere / Ada / Volta.
// These are documented defaults, not measurements; a cluster file can
// override `runtime_bytes`.
constexpr int64_t kRuntimeLarge = 1 * kGiB;
constexpr int64_t kRuntimeSmall = 768 * kMiB;

// gemm_workspace_bytes: cuBLAS documentation (cublasSetWorkspace) recommends
// 32 MiB of workspace on Hopper and later and 4 MiB on earlier architectures;
// PyTorch's CUBLAS_WORKSPACE_CONFIG default follows the same split. MI300X
// (hipBLASLt) is given the Hopper figure: a guess.
constexpr int64_t kWorkspaceHopper = 32 * kMiB;
constexpr int64_t kWorkspaceOld = 4 * kMiB;

// Collective latencies, NCCL src/graph/tuning.cc (2.2x-2.30 tables, quoted in
// REFERENCES.md "Collectives"): base latency Ring/LL 6.6 us (LL128 14, Simple
// 8.4); per ring hop on NVLink Ring/LL 0.6 us (Simple 3.4), on PCIe 1.0 us
// (Simple 5.7), on the network Ring/LL 2.7 us (Simple 14). We take the LL
// column: latency only matters for small messages, and NCCL picks LL there.
constexpr double kBaseLat = 6.6e-6;
// Fixed cost per op on a GPU: a few kernel launches (~2-5 us each on the
// host's launch path) that small ops cannot hide; a nominal figure, which
// `dlplan calibrate` replaces with a measurement.
constexpr double kGpuOpOverhead = 5e-6;
// The CUDA caching allocator hands out blocks rounded up to 512 B (PyTorch's
// CUDACachingAllocator kMinBlockSize; REFERENCES.md), and blocks are what a
// GPU run measures.
constexpr int64_t kCudaBlock = 512;
constexpr double kNvlinkHop = 0.6e-6;
constexpr double kPcieHop = 1.0e-6;
constexpr double kNetHop = 2.7e-6;

// Networks per GPU (REFERENCES.md "Hardware", last bullet), nominal line
// rates; net_efficiency turns them into measured busbw:
//   InfiniBand NDR 400 Gb/s = 50 GB/s; measured 46-49 GB/s busbw per NIC
//   (nccl-tests #267, #290) -> 0.95 gives 47.5 GB/s.
//   InfiniBand HDR 200 Gb/s = 25 GB/s; measured ~24 GB/s (nccl #412) -> 0.95.
//   100 Gb/s Ethernet = 12.5 GB/s; RoCE/TCP on commodity NICs reaches less:
//   0.9 -> 11.25 GB/s (a documented guess).
constexpr double kNdr = 50 * kG;
constexpr double kHdr = 25 * kG;
constexpr double kEth100 = 12.5 * kG;

DeviceSpec make_cpu_row();

std::vector<DeviceSpec> build_catalog() {
  std::vector<DeviceSpec> rows;

  {
    DeviceSpec d;
    d.kind = "v100-32g";
    d.description = "NVIDIA V100 SXM2 32 GB";
    d.memory_bytes = 32768 * kMiB;  // nvidia-smi "32768MiB"
    d.hbm_bytes_per_s = 900 * kG;
    d.bf16_flops = 0;               // Volta has no bf16 (fp16 125 TFLOP/s is not used)
    d.fp32_flops = 15.7 * kT;
    d.link_bytes_per_s = 150 * kG;  // NVLink2, 300 GB/s bidirectional
    d.net_bytes_per_s = kHdr;
    d.net_efficiency = 0.95;
    d.gemm_efficiency = 0.8;        // guess: no published stas00 figure for V100
    d.link_efficiency = 0.8;        // guess, between the A100 and H100 measurements
    d.base_latency_s = kBaseLat;
    d.op_overhead_s = kGpuOpOverhead;
    d.alloc_granularity_bytes = kCudaBlock;
    d.link_hop_latency_s = kNvlinkHop;
    d.net_hop_latency_s = kNetHop;
    d.runtime_bytes = kRuntimeSmall;
    d.gemm_workspace_bytes = kWorkspaceOld;
    d.source =
        "NVIDIA V100 datasheet (900 GB/s HBM2, 15.7 TFLOP/s fp32, NVLink2 300 GB/s "
        "bidirectional); REFERENCES.md Hardware; memory 32,768 MiB as nvidia-smi "
        "reports; gemm/link efficiency 0.8 are guesses; net InfiniBand HDR 200 Gb/s";
    rows.push_back(d);
  }
  {
    DeviceSpec d;
    d.kind = "a100-40g";
    d.description = "NVIDIA A100 SXM 40 GB";
    d.memory_bytes = 40960 * kMiB;  // nvidia-smi "40960MiB"
    d.hbm_bytes_per_s = 1555 * kG;
    d.bf16_flops = 312 * kT;
    d.fp32_flops = 19.5 * kT;
    d.link_bytes_per_s = 300 * kG;  // NVLink3, 600 GB/s bidirectional
    d.net_bytes_per_s = kHdr;
    d.net_efficiency = 0.95;
    d.gemm_efficiency = 0.869;      // stas00/ml-engineering, A100 bf16 GEMM
    d.link_efficiency = 0.77;       // 8xA100 ~230 GB/s busbw of 300 (nccl-tests #149)
    d.base_latency_s = kBaseLat;
    d.op_overhead_s = kGpuOpOverhead;
    d.alloc_granularity_bytes = kCudaBlock;
    d.link_hop_latency_s = kNvlinkHop;
    d.net_hop_latency_s = kNetHop;
    d.runtime_bytes = kRuntimeSmall;
    d.gemm_workspace_bytes = kWorkspaceOld;
    d.source =
        "NVIDIA A100 datasheet (1,555 GB/s HBM2, 312 TFLOP/s dense bf16, 19.5 fp32, "
        "NVLink3 600 GB/s bidirectional); REFERENCES.md Hardware; memory 40,960 MiB "
        "as nvidia-smi reports; gemm 86.9% (stas00/ml-engineering); link 0.77 from "
        "8xA100 ~230 GB/s busbw (nccl-tests #149); net InfiniBand HDR 200 Gb/s (nccl #412)";
    rows.push_back(d);
  }
  {
    DeviceSpec d = rows.back();
    d.kind = "a100-80g";
    d.description = "NVIDIA A100 SXM 80 GB";
    d.memory_bytes = 81920 * kMiB;  // nvidia-smi "81920MiB"
    d.hbm_bytes_per_s = 2039 * kG;
    d.source =
        "NVIDIA A100 80GB datasheet (2,039 GB/s HBM2e, 312 TFLOP/s dense bf16, 19.5 "
        "fp32, NVLink3 600 GB/s bidirectional); REFERENCES.md Hardware; memory "
        "81,920 MiB as nvidia-smi reports; gemm 86.9% (stas00/ml-engineering); link "
        "0.77 from 8xA100 ~230 GB/s busbw (nccl-tests #149); net InfiniBand HDR 200 "
        "Gb/s (nccl #412)";
    rows.push_back(d);
  }
  {
    DeviceSpec d;
    d.kind = "h100-80g";
    d.description = "NVIDIA H100 SXM 80 GB";
    d.memory_bytes = 81559 * kMiB;  // nvidia-smi "81559MiB"
    d.hbm_bytes_per_s = 3.35e12;
    d.bf16_flops = 989 * kT;        // dense; 1,979 is the sparse figure
    d.fp32_flops = 67 * kT;
    d.link_bytes_per_s = 450 * kG;  // NVLink4, 900 GB/s bidirectional
    d.net_bytes_per_s = kNdr;
    d.net_efficiency = 0.95;
    d.gemm_efficiency = 0.803;      // stas00/ml-engineering, H100 bf16 GEMM
    d.link_efficiency = 0.81;       // 8xH100 ring ~365 GB/s busbw of 450 (nccl #1455)
    d.base_latency_s = kBaseLat;
    d.op_overhead_s = kGpuOpOverhead;
    d.alloc_granularity_bytes = kCudaBlock;
    d.link_hop_latency_s = kNvlinkHop;
    d.net_hop_latency_s = kNetHop;
    d.runtime_bytes = kRuntimeLarge;
    d.gemm_workspace_bytes = kWorkspaceHopper;
    d.source =
        "NVIDIA H100 SXM datasheet (3.35 TB/s HBM3, 989 TFLOP/s dense bf16 - 1,979 is "
        "sparse -, 67 fp32, NVLink4 900 GB/s bidirectional); REFERENCES.md Hardware; "
        "memory 81,559 MiB as nvidia-smi reports; gemm 80.3% (stas00/ml-engineering); "
        "link 0.81 from 8xH100 ring ~365 GB/s busbw (nccl #1455); net InfiniBand NDR "
        "400 Gb/s (nccl-tests #267, #290)";
    rows.push_back(d);
  }
  {
    DeviceSpec d = rows.back();
    d.kind = "h200-141g";
    d.description = "NVIDIA H200 SXM 141 GB";
    d.memory_bytes = 143771 * kMiB;  // measured: 143,771 MiB in nvidia-smi
    d.hbm_bytes_per_s = 4.8e12;
    // Ring busbw on 8xH200 is taken equal to H100's (same NVLink4); the 475 GB/s
    // of nccl-tests #272 is NVLink SHARP, which this model does not use.
    d.source =
        "NVIDIA H200 datasheet (4.8 TB/s HBM3e, 989 TFLOP/s dense bf16, 67 fp32, "
        "NVLink4 900 GB/s bidirectional); REFERENCES.md Hardware; memory 143,771 MiB "
        "measured in nvidia-smi (REFERENCES.md); gemm 80.3% as H100 (stas00; measured "
        "769-798 TFLOP/s bf16 = 78-81%); link 0.81 as H100 ring (8xH200 475 GB/s in "
        "nccl-tests #272 is NVLS, not modelled); net InfiniBand NDR 400 Gb/s";
    rows.push_back(d);
  }
  {
    DeviceSpec d;
    d.kind = "b200";
    d.description = "NVIDIA B200 180 GB";
    // 180 GB usable (REFERENCES.md). nvidia-smi on HGX B200 reports 183,359 MiB
    // (= 192.3 GB), which we take as the device's own figure.
    d.memory_bytes = 183359 * kMiB;
    d.hbm_bytes_per_s = 8e12;
    d.bf16_flops = 2250 * kT;
    d.fp32_flops = 80 * kT;
    d.link_bytes_per_s = 900 * kG;  // NVLink5, 1.8 TB/s bidirectional
    d.net_bytes_per_s = kNdr;
    d.net_efficiency = 0.95;
    d.gemm_efficiency = 0.776;      // stas00/ml-engineering, B200 bf16 GEMM
    d.link_efficiency = 0.8;        // guess: no published ring busbw; near H100's 0.81
    d.base_latency_s = kBaseLat;
    d.op_overhead_s = kGpuOpOverhead;
    d.alloc_granularity_bytes = kCudaBlock;
    d.link_hop_latency_s = kNvlinkHop;
    d.net_hop_latency_s = kNetHop;
    d.runtime_bytes = kRuntimeLarge;
    d.gemm_workspace_bytes = kWorkspaceHopper;
    d.source =
        "NVIDIA HGX B200 datasheet (8 TB/s HBM3e, 2,250 TFLOP/s dense bf16, 80 fp32, "
        "NVLink5 1.8 TB/s bidirectional); REFERENCES.md Hardware; memory 183,359 MiB "
        "as nvidia-smi reports on HGX B200 (180 GB usable); gemm 77.6% "
        "(stas00/ml-engineering); link efficiency 0.8 is a guess; net InfiniBand NDR "
        "400 Gb/s";
    rows.push_back(d);
  }
  {
    DeviceSpec d;
    d.kind = "l40s";
    d.description = "NVIDIA L40S 48 GB (PCIe)";
    d.memory_bytes = 46068 * kMiB;  // nvidia-smi "46068MiB" (ECC on)
    d.hbm_bytes_per_s = 864 * kG;
    d.bf16_flops = 362 * kT;        // dense (733 is sparse)
    d.fp32_flops = 91.6 * kT;
    // No NVLink: PCIe Gen4 x16, 32 GB/s nominal per direction; 0.78 gives the
    // ~25 GB/s effective that PCIe Gen4 peer traffic reaches.
    d.link_bytes_per_s = 32 * kG;
    d.link_efficiency = 0.78;
    d.net_bytes_per_s = kEth100;
    d.net_efficiency = 0.9;
    d.gemm_efficiency = 0.8;        // guess
    d.base_latency_s = kBaseLat;
    d.op_overhead_s = kGpuOpOverhead;
    d.alloc_granularity_bytes = kCudaBlock;
    d.link_hop_latency_s = kPcieHop;
    d.net_hop_latency_s = kNetHop;
    d.runtime_bytes = kRuntimeSmall;
    d.gemm_workspace_bytes = kWorkspaceOld;
    d.source =
        "NVIDIA L40S datasheet (864 GB/s GDDR6, 362 TFLOP/s dense bf16, 91.6 fp32, "
        "PCIe Gen4 x16 only); REFERENCES.md Hardware; memory 46,068 MiB as nvidia-smi "
        "reports; PCIe ~25 GB/s effective per direction; gemm 0.8 is a guess; net "
        "100 Gb/s Ethernet";
    rows.push_back(d);
  }
  {
    DeviceSpec d;
    d.kind = "rtx4090";
    d.description = "NVIDIA GeForce RTX 4090 24 GB";
    d.memory_bytes = 24564 * kMiB;  // nvidia-smi "24564MiB"
    d.hbm_bytes_per_s = 1008 * kG;
    d.bf16_flops = 165.2 * kT;      // dense, fp32 accumulate (330 with fp16 accumulate)
    d.fp32_flops = 82.6 * kT;
    // PCIe Gen4 x16 as the L40S; GeForce drivers disable P2P, so NCCL stages
    // through host memory: a lower efficiency (guess) of 0.6 -> ~19 GB/s.
    d.link_bytes_per_s = 32 * kG;
    d.link_efficiency = 0.6;
    d.net_bytes_per_s = kEth100;
    d.net_efficiency = 0.9;
    d.gemm_efficiency = 0.8;        // guess
    d.base_latency_s = kBaseLat;
    d.op_overhead_s = kGpuOpOverhead;
    d.alloc_granularity_bytes = kCudaBlock;
    d.link_hop_latency_s = kPcieHop;
    d.net_hop_latency_s = kNetHop;
    d.runtime_bytes = kRuntimeSmall;
    d.gemm_workspace_bytes = kWorkspaceOld;
    d.source =
        "NVIDIA Ada (AD102) whitepaper, RTX 4090 (1,008 GB/s GDDR6X, 165.2 TFLOP/s "
        "dense bf16 with fp32 accumulate, 82.6 fp32, PCIe Gen4 only); REFERENCES.md "
        "Hardware; memory 24,564 MiB as nvidia-smi reports; link efficiency 0.6 "
        "(no P2P) and gemm 0.8 are guesses; net 100 Gb/s Ethernet";
    rows.push_back(d);
  }
  {
    DeviceSpec d;
    d.kind = "mi300x";
    d.description = "AMD Instinct MI300X 192 GB";
    d.memory_bytes = 196592 * kMiB;  // rocm-smi VRAM total as reported (just under 192 GiB)
    d.hbm_bytes_per_s = 5.3e12;
    d.bf16_flops = 1307.4 * kT;      // dense
    d.fp32_flops = 163.4 * kT;
    // Infinity Fabric (xGMI): 64 GB/s per direction to each of 7 peers, fully
    // connected; a ring uses all of them through multiple rings (RCCL).
    d.link_bytes_per_s = 7 * 64 * kG;
    d.link_efficiency = 0.7;         // guess: RCCL all-reduce busbw below NCCL's share
    d.net_bytes_per_s = kNdr;
    d.net_efficiency = 0.95;
    d.gemm_efficiency = 0.514;       // stas00/ml-engineering, MI300X bf16 GEMM
    d.base_latency_s = kBaseLat;
    d.op_overhead_s = kGpuOpOverhead;
    d.alloc_granularity_bytes = kCudaBlock;
    d.link_hop_latency_s = kNvlinkHop;  // RCCL keeps NCCL's tuning tables; guess
    d.net_hop_latency_s = kNetHop;
    d.runtime_bytes = kRuntimeLarge;
    d.gemm_workspace_bytes = kWorkspaceHopper;
    d.source =
        "AMD Instinct MI300X datasheet (5.3 TB/s HBM3, 1,307.4 TFLOP/s dense bf16, "
        "163.4 fp32, xGMI 64 GB/s per peer x 7); REFERENCES.md Hardware; memory "
        "196,592 MiB as rocm-smi reports; gemm 51.4% (stas00/ml-engineering); link "
        "efficiency 0.7 is a guess; net InfiniBand NDR 400 Gb/s";
    rows.push_back(d);
  }
  rows.push_back(make_cpu_row());
  return rows;
}

// The host as a "device" for CPU plans (fp32 only).
DeviceSpec make_cpu_row() {
  DeviceSpec d;
  d.kind = "cpu";
  d.description = "host CPU";
  int64_t mem = 0;
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    int64_t value = 0;
    std::string unit;
    while (in >> key >> value) {
      std::getline(in, unit);
      if (key == "MemTotal:") {
        mem = value * 1024;  // /proc/meminfo reports kB (KiB)
        break;
      }
    }
  }
  if (mem <= 0) {
    long pages = sysconf(_SC_PHYS_PAGES);
    long page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) mem = static_cast<int64_t>(pages) * page;
  }
  if (mem <= 0) mem = 8 * kGiB;  // last resort, stated in description below
  d.memory_bytes = mem;
  unsigned cores = std::thread::hardware_concurrency();
  if (cores == 0) cores = 1;
  d.description = "host CPU (" + std::to_string(cores) + " hardware threads)";
  // Nominal rates, replaced by `dlplan calibrate` measurements:
  //   fp32 GEMM 50 GFLOP/s per hardware thread (an AVX2 FMA core sustains
  //   roughly 50-100 GFLOP/s; we take the low end, as a hardware thread may be
  //   a hyper-thread), memory 20 GB/s.
  d.hbm_bytes_per_s = 20 * kG;
  d.bf16_flops = 0;  // CPU plans are fp32 only
  d.fp32_flops = 50 * kG * cores;
  d.gemm_efficiency = 1.0;  // the nominal rate above is already an achievable rate
  // Ranks talk over MPI shared memory: ~5 GB/s nominal per rank and direction,
  // taken as already effective; "network" likewise (ranks of one host).
  d.link_bytes_per_s = 5 * kG;
  d.net_bytes_per_s = 5 * kG;
  d.link_efficiency = 1.0;
  d.net_efficiency = 1.0;
  // MPI shared-memory latencies: a few microseconds per message (guess).
  d.base_latency_s = 5e-6;
  d.op_overhead_s = 2e-6;  // nominal per-op dispatch on the host; dlplan calibrate measures it
  d.link_hop_latency_s = 2e-6;
  d.net_hop_latency_s = 2e-6;
  d.runtime_bytes = 0;         // DESIGN.md: runtime is 0 on the cpu device
  d.gemm_workspace_bytes = 0;
  d.source =
      "host: memory from /proc/meminfo MemTotal (sysconf fallback); nominal 50 "
      "GFLOP/s fp32 per hardware thread, 20 GB/s memory, 5 GB/s MPI shared-memory "
      "links (documented guesses until `dlplan calibrate` measures them)";
  return d;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string known_kinds() {
  std::string out;
  for (const auto& d : device_catalog()) {
    if (!out.empty()) out += ", ";
    out += d.kind;
  }
  return out;
}

std::string json_repr(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// ---- JSON field readers ---------------------------------------------------

enum class Rule { Positive, NonNegative, Fraction };  // Fraction: (0, 1]

std::string rule_text(Rule r, bool integer) {
  switch (r) {
    case Rule::Positive: return integer ? "a positive integer" : "a positive number";
    case Rule::NonNegative: return integer ? "a non-negative integer" : "a non-negative number";
    case Rule::Fraction: return "a number in (0, 1]";
  }
  return "";
}

[[noreturn]] void bad(const std::string& src, const std::string& field,
                      const std::string& what, const nlohmann::json& got) {
  throw Error(src + ": " + field + " must be " + what + " (got " + json_repr(got) + ")");
}

bool rule_ok(Rule r, double v) {
  switch (r) {
    case Rule::Positive: return v > 0;
    case Rule::NonNegative: return v >= 0;
    case Rule::Fraction: return v > 0 && v <= 1;
  }
  return false;
}

double read_double(const nlohmann::json& v, const std::string& src,
                   const std::string& field, Rule r) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || !rule_ok(r, v.get<double>()))
    bad(src, field, rule_text(r, false), v);
  return v.get<double>();
}

int64_t read_int(const nlohmann::json& v, const std::string& src,
                 const std::string& field, Rule r) {
  const std::string what = rule_text(r, true);
  int64_t out = 0;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad(src, field, what, v);
    out = static_cast<int64_t>(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    out = v.get<int64_t>();
  } else if (v.is_number_float()) {
    // Accept integral floats such as 80e9.
    double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) > 9.0e18)
      bad(src, field, what, v);
    out = static_cast<int64_t>(d);
  } else {
    bad(src, field, what, v);
  }
  if (!rule_ok(r, static_cast<double>(out))) bad(src, field, what, v);
  return out;
}

std::string read_string(const nlohmann::json& v, const std::string& src,
                        const std::string& field) {
  if (!v.is_string()) bad(src, field, "a string", v);
  return v.get<std::string>();
}

// One table of every DeviceSpec field, used by both directions so that
// to_json and from_json cannot drift apart.
struct FieldDef {
  const char* name;
  enum { Str, Int, Dbl } type;
  Rule rule;
  std::string DeviceSpec::*s = nullptr;
  int64_t DeviceSpec::*i = nullptr;
  double DeviceSpec::*d = nullptr;
  bool required;  // required when the file gives no "gpu" to start from
};

const std::vector<FieldDef>& device_fields() {
  using F = FieldDef;
  static const std::vector<FieldDef> fields = {
      {"kind", F::Str, Rule::Positive, &DeviceSpec::kind, nullptr, nullptr, true},
      {"description", F::Str, Rule::Positive, &DeviceSpec::description, nullptr, nullptr, false},
      {"memory_bytes", F::Int, Rule::Positive, nullptr, &DeviceSpec::memory_bytes, nullptr, true},
      {"hbm_bytes_per_s", F::Dbl, Rule::Positive, nullptr, nullptr, &DeviceSpec::hbm_bytes_per_s, true},
      {"bf16_flops", F::Dbl, Rule::NonNegative, nullptr, nullptr, &DeviceSpec::bf16_flops, true},
      {"fp32_flops", F::Dbl, Rule::Positive, nullptr, nullptr, &DeviceSpec::fp32_flops, true},
      {"link_bytes_per_s", F::Dbl, Rule::Positive, nullptr, nullptr, &DeviceSpec::link_bytes_per_s, true},
      {"net_bytes_per_s", F::Dbl, Rule::Positive, nullptr, nullptr, &DeviceSpec::net_bytes_per_s, true},
      {"gemm_efficiency", F::Dbl, Rule::Fraction, nullptr, nullptr, &DeviceSpec::gemm_efficiency, true},
      {"link_efficiency", F::Dbl, Rule::Fraction, nullptr, nullptr, &DeviceSpec::link_efficiency, true},
      {"net_efficiency", F::Dbl, Rule::Fraction, nullptr, nullptr, &DeviceSpec::net_efficiency, true},
      {"base_latency_s", F::Dbl, Rule::NonNegative, nullptr, nullptr, &DeviceSpec::base_latency_s, true},
      {"link_hop_latency_s", F::Dbl, Rule::NonNegative, nullptr, nullptr, &DeviceSpec::link_hop_latency_s, true},
      {"net_hop_latency_s", F::Dbl, Rule::NonNegative, nullptr, nullptr, &DeviceSpec::net_hop_latency_s, true},
      {"runtime_bytes", F::Int, Rule::NonNegative, nullptr, &DeviceSpec::runtime_bytes, nullptr, true},
      {"gemm_workspace_bytes", F::Int, Rule::NonNegative, nullptr, &DeviceSpec::gemm_workspace_bytes, nullptr, true},
      {"op_overhead_s", F::Dbl, Rule::NonNegative, nullptr, nullptr, &DeviceSpec::op_overhead_s, false},
      {"alloc_granularity_bytes", F::Int, Rule::Positive, nullptr, &DeviceSpec::alloc_granularity_bytes, nullptr, false},
      {"source", F::Str, Rule::Positive, &DeviceSpec::source, nullptr, nullptr, false},
  };
  return fields;
}

std::string field_names() {
  std::string out;
  for (const auto& f : device_fields()) {
    if (!out.empty()) out += ", ";
    out += f.name;
  }
  return out;
}

}  // namespace

const std::vector<DeviceSpec>& device_catalog() {
  static const std::vector<DeviceSpec> rows = build_catalog();
  return rows;
}

DeviceSpec host_cpu_device() { return make_cpu_row(); }

DeviceSpec find_device(std::string_view kind) {
  std::string k = lower(kind);
  // Aliases: the bare family name means the largest-memory SXM part.
  static const std::pair<const char*, const char*> aliases[] = {
      {"h100", "h100-80g"},     {"h100-sxm", "h100-80g"}, {"h200", "h200-141g"},
      {"a100", "a100-80g"},     {"v100", "v100-32g"},     {"4090", "rtx4090"},
      {"rtx-4090", "rtx4090"},  {"mi300", "mi300x"},      {"b200-180g", "b200"},
      {"host", "cpu"},
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
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["device"] = std::move(dev);
  j["nodes"] = c.nodes;
  j["gpus_per_node"] = c.gpus_per_node;
  return j;
}

Cluster cluster_from_json(const nlohmann::json& j, const std::string& source) {
  const std::string& src = source;
  if (!j.is_object())
    throw Error(src + ": a cluster must be a JSON object with \"device\" (or \"gpu\"), "
                      "\"nodes\" and \"gpus_per_node\" (got " + json_repr(j) + ")");
  for (const auto& [key, value] : j.items()) {
    (void)value;
    if (key != "device" && key != "gpu" && key != "nodes" && key != "gpus_per_node")
      throw Error(src + ": unknown field '" + key +
                  "'; known: device, gpu, nodes, gpus_per_node");
  }
  Cluster c;
  const bool from_catalog = j.contains("gpu");
  if (from_catalog) {
    std::string kind = read_string(j.at("gpu"), src, "gpu");
    try {
      c.device = find_device(kind);
    } catch (const Error& e) {
      throw Error(src + ": gpu: " + e.what());
    }
  } else if (!j.contains("device")) {
    throw Error(src + ": missing field 'device' (or 'gpu' naming a catalog kind: " +
                known_kinds() + ")");
  }
  if (j.contains("device")) {
    const auto& dev = j.at("device");
    if (!dev.is_object()) bad(src, "device", "an object", dev);
    for (const auto& [key, value] : dev.items()) {
      const FieldDef* def = nullptr;
      for (const auto& f : device_fields())
        if (key == f.name) def = &f;
      if (!def)
        throw Error(src + ": unknown field 'device." + key + "'; known: " + field_names());
      const std::string field = "device." + key;
      switch (def->type) {
        case FieldDef::Str: c.device.*(def->s) = read_string(value, src, field); break;
        case FieldDef::Int: c.device.*(def->i) = read_int(value, src, field, def->rule); break;
        case FieldDef::Dbl: c.device.*(def->d) = read_double(value, src, field, def->rule); break;
      }
    }
    if (!from_catalog) {
      for (const auto& f : device_fields())
        if (f.required && !dev.contains(f.name))
          throw Error(src + ": missing field 'device." + std::string(f.name) +
                      "' (give every device field, or \"gpu\": a catalog kind to start from)");
    }
    if (c.device.kind.empty()) bad(src, "device.kind", "a non-empty string", dev.at("kind"));
    if (c.device.source.empty()) c.device.source = src;
  }
  // Check the range before narrowing to int.
  if (j.contains("nodes")) {
    const int64_t v = read_int(j.at("nodes"), src, "nodes", Rule::Positive);
    if (v > 1000000) bad(src, "nodes", "at most 1000000", j.at("nodes"));
    c.nodes = static_cast<int>(v);
  }
  if (j.contains("gpus_per_node")) {
    const int64_t v = read_int(j.at("gpus_per_node"), src, "gpus_per_node", Rule::Positive);
    if (v > 1024) bad(src, "gpus_per_node", "at most 1024", j.at("gpus_per_node"));
    c.gpus_per_node = static_cast<int>(v);
  }
  return c;
}

Cluster load_cluster_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open cluster file");
  std::stringstream buf;
  buf << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(buf.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(path + ": malformed JSON at byte " + std::to_string(e.byte) + ": " + e.what());
  }
  return cluster_from_json(j, path);
}

}  // namespace dlplan
