// The hardware catalog and cluster descriptions. Every catalog row cites its
// source (vendor datasheet; REFERENCES.md). Rates are dense (no sparsity).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlplan {

struct DeviceSpec {
  std::string kind;                 // catalog key: "h100-80g", "cpu", ...
  std::string description;          // "NVIDIA H100 SXM 80 GB"
  int64_t memory_bytes = 0;         // usable device memory, as the device reports it
  double hbm_bytes_per_s = 0;       // memory bandwidth
  double bf16_flops = 0;            // dense bf16 peak, FLOP/s (0: no bf16 support)
  double fp32_flops = 0;            // dense fp32 peak (no TF32), FLOP/s
  double link_bytes_per_s = 0;      // intra-node GPU-to-GPU, per GPU, per direction
  double net_bytes_per_s = 0;       // default inter-node network per GPU
  double gemm_efficiency = 0.8;     // achievable share of peak for large GEMMs
  double link_efficiency = 0.8;     // achievable busbw / link rate, intra-node
  double net_efficiency = 0.9;      // achievable busbw / network rate
  double base_latency_s = 10e-6;    // per collective launch (NCCL tuning model)
  double link_hop_latency_s = 1e-6; // per ring step on the intra-node link
  double net_hop_latency_s = 5e-6;  // per ring step across the network
  int64_t runtime_bytes = 0;        // CUDA context + NCCL buffers + handles (0 on cpu)
  int64_t gemm_workspace_bytes = 0; // per-GEMM library workspace (cuBLAS)
  double op_overhead_s = 0;         // fixed cost per op (kernel launches, dispatch)
  int64_t alloc_granularity_bytes = 1;  // the allocator's block rounding (CUDA caching allocator: 512)
  std::string source;               // citation for the figures above

  bool has_bf16() const { return bf16_flops > 0; }
};

// The built-in catalog, in a stable order.
const std::vector<DeviceSpec>& device_catalog();

// A catalog row by kind (case-insensitive); the `cpu` row describes this host
// (memory from /proc/meminfo). Throws dlplan::Error listing the known kinds.
DeviceSpec find_device(std::string_view kind);

// Host memory and a nominal GEMM rate for the `cpu` device.
DeviceSpec host_cpu_device();

struct Cluster {
  DeviceSpec device;
  int nodes = 1;
  int gpus_per_node = 1;
  int world() const { return nodes * gpus_per_node; }
};

// JSON form used by --cluster files and by the plan's "cluster" object:
// {"device": {all DeviceSpec fields}, "nodes": n, "gpus_per_node": g}.
// A --cluster file may instead name a catalog kind ("gpu": "h100-80g") and
// override single fields under "device". Errors name the file and the field.
nlohmann::ordered_json cluster_to_json(const Cluster& c);
Cluster cluster_from_json(const nlohmann::json& j, const std::string& source);
Cluster load_cluster_file(const std::string& path);

}  // namespace dlplan
