// The hardware catalog and cluster descriptions. The catalog is data:
// planner/catalog/*.json, one file per GPU with a source for every figure
// (docs/catalog.md), embedded at build time and read by the same field reader
// as a user's --cluster file. Rates are dense (no sparsity).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace dlplan {

struct OpCostTable;  // op_costs.hpp
struct CollectiveCostTable;  // collective_costs.hpp

// A device as the cost models see it. Every field is read and written through
// one table (hardware.cpp, device_fields()); adding a field means adding the
// member here and one row there. The per-op-class time model's fields
// (docs/gpu-time-model.md) are optional: zero means "not given", and the
// simulator then falls back to the plain roofline (gemm_efficiency, and
// memory_efficiency or its documented default).
// The widest band a profile may state (+-1000 %): calibrate clamps a wider
// held-back error to it, so that the profile it writes reads back.
inline constexpr double kMaxTimeUncertainty = 10.0;

struct DeviceSpec {
  std::string kind;                 // catalog key: "h100-80g", "cpu", ...
  std::string description;          // "NVIDIA H100 SXM 80 GB"
  int64_t memory_bytes = 0;         // usable device memory, as the device reports it
  double hbm_bytes_per_s = 0;       // memory bandwidth
  double bf16_flops = 0;            // dense bf16 peak, FLOP/s (0: no bf16 support)
  double fp16_flops = 0;            // dense fp16 tensor-core peak (fp32 accumulate), FLOP/s (0: not given)
  double fp32_flops = 0;            // dense fp32 peak (no TF32), FLOP/s; also the vector rate of non-GEMM ops
  double link_bytes_per_s = 0;      // intra-node GPU-to-GPU, per GPU, per direction
  double net_bytes_per_s = 0;       // default inter-node network per GPU
  double gemm_efficiency = 0;       // share of the peak a large GEMM reaches (the GEMM curve's ceiling)
  double link_efficiency = 0;       // achievable busbw / link rate, intra-node
  double net_efficiency = 0;        // achievable busbw / network rate
  double base_latency_s = 0;        // per collective launch (NCCL tuning model)
  double link_hop_latency_s = 0;    // per ring step on the intra-node link
  double net_hop_latency_s = 0;     // per ring step across the network
  int64_t runtime_bytes = 0;        // CUDA context + NCCL buffers + handles (0 on cpu)
  int64_t gemm_workspace_bytes = 0; // per-GEMM library workspace (cuBLAS)
  double op_overhead_s = 0;         // fixed cost per op and phase (kernel launches, dispatch)
  int64_t alloc_granularity_bytes = 1;  // the allocator's block rounding (CUDA caching allocator: 512)

  // ---- The host, for CPU offload (0: not given; docs/catalog.md) ----------
  int64_t host_memory_bytes = 0;    // CPU memory of one node
  double host_link_bytes_per_s = 0; // host <-> device copies, per GPU and direction (PCIe x16)
  double host_bytes_per_s = 0;      // CPU memory bandwidth of one node (the offloaded optimizer's rate)

  // ---- The per-op-class GPU time model (docs/gpu-time-model.md) ----------
  double memory_efficiency = 0;     // share of hbm_bytes_per_s that memory-bound kernels reach
  int64_t sm_count = 0;             // streaming multiprocessors (CUs): GEMM wave quantization
  int64_t gemm_tile = 0;            // GEMM output tile edge (elements): tiles = ceil(M/t) ceil(N/t)
  double gemm_k_half = 0;           // reduction length at which a tile's fixed cost equals its main loop
  double gemm_split_k_min = 0;      // least K per split when a GEMM has fewer tiles than SMs (split-K)
  double flash_fwd_efficiency = 0;  // FlashAttention forward: share of the peak, long sequences, large heads
  double flash_bwd_efficiency = 0;  // FlashAttention backward, likewise
  double flash_fwd_seq_half = 0;    // sequence length at which the forward reaches half its ceiling
  double flash_bwd_seq_half = 0;    // likewise for the backward
  double flash_causal_seq_half = 0; // added to either for a causal mask
  double flash_head_dim_half = 0;   // head width at which the kernel reaches half its ceiling
  double comm_slowdown = 0;         // compute runs 1 + this times slower while a collective runs beside it
  double comm_stall = 0;            // share of its speed a collective loses while compute runs beside it (simulator.cpp)
  double rank_jitter = 0;           // ranks' step-time drift, s^0.5: skew at the gradient sync (simulator.cpp)
  double sustained_share = 0;       // share of the GEMM and attention curves a training step sustains (0: 1)
  // The band a predicted step time is good to, relative (0.1: +-10 %): the
  // GPU model's held-out validation error for a catalog GPU, calibration's
  // held-back steps for a calibrated profile (0: kDefaultTimeUncertainty,
  // planner.hpp). The recommendation's tie rule follows it.
  double time_uncertainty = 0;  // at most kMaxTimeUncertainty

  std::string source;               // one line: where this description comes from
  std::map<std::string, std::string> sources;  // per field: its source (every catalog figure has one)

  bool has_bf16() const { return bf16_flops > 0; }
  bool has_fp16() const { return fp16_flops > 0; }
  // The per-op-class model applies (the GEMM curve is given; FlashAttention
  // without its figures is costed from its GEMMs).
  bool has_kernel_model() const { return sm_count > 0 && gemm_tile > 0; }
};

// The built-in catalog, in a stable order (the files' order).
const std::vector<DeviceSpec>& device_catalog();

// A catalog row by kind (case-insensitive); the `cpu` row describes this host
// (memory from /proc/meminfo). Throws dlplan::Error listing the known kinds.
DeviceSpec find_device(std::string_view kind);

// Host memory and a nominal GEMM rate for the `cpu` device.
DeviceSpec host_cpu_device();

// The names of every device field, in the table's order (docs, messages).
std::vector<std::string> device_field_names();

// Checkpoint writes per node when a cluster file does not say
// (storage_bytes_per_s): 1 GB/s, below one NVMe SSD's sequential write and a
// common per-client rate of shared file systems; measure yours (docs/cluster.md).
inline constexpr double kDefaultStorageBytesPerS = 1e9;

struct Cluster {
  DeviceSpec device;
  int nodes = 1;
  int gpus_per_node = 1;
  double storage_bytes_per_s = 0;  // checkpoint writes per node (0: kDefaultStorageBytesPerS)
  // Per-op costs measured by `dlplan calibrate --model` (op_costs.hpp); null
  // for a catalog device or a profile calibrated without a model.
  std::shared_ptr<const OpCostTable> op_costs = nullptr;
  // Collective times measured by `dlplan calibrate` over its ranks
  // (collective_costs.hpp); null for a catalog device.
  std::shared_ptr<const CollectiveCostTable> collective_costs = nullptr;
  int world() const { return nodes * gpus_per_node; }
};

// JSON form used by --cluster files and by the plan's "cluster" object:
// {"device": {all DeviceSpec fields, "sources": {field: text}}, "nodes": n,
// "gpus_per_node": g, optionally "storage_bytes_per_s", "op_costs" and "collective_costs"}. A --cluster file may instead name a catalog kind
// ("gpu": "h100-80g") and override single fields under "device". Every
// number is checked against its field's range; errors name the file and the
// field.
nlohmann::ordered_json cluster_to_json(const Cluster& c);
Cluster cluster_from_json(const nlohmann::json& j, const std::string& source);
Cluster load_cluster_file(const std::string& path);

// One catalog row from its JSON text (planner/catalog/*.json): every field,
// and a source for every figure. `source` names the file in messages.
DeviceSpec parse_catalog_row(std::string_view text, const std::string& source);

}  // namespace dlplan
