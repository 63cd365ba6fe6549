// The GUI's one door into the planner. Inputs (what the window's controls
// hold, named as the CLI's flags) -> PlanRequest (as `dlplan plan` builds it)
// -> Planning + a Simulation per strategy + a sweep over GPU counts. Plain
// C++, no Qt: the worker runs it off the UI thread, the adapters
// (table_models.hpp) turn its results into Qt models. No cost logic here:
// every number comes from dlplan::plan / dlplan::simulate_step.
#pragma once

#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/request.hpp"
#include "dlplan/simulator.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace dlplan::gui {

// The window's inputs, named as `dlplan plan`'s flags; Engine::request turns
// them into RequestFlags for build_request, the planner's one request
// builder, so the defaults and checks are the CLI's.
struct Inputs {
  std::string model = "gpt2";        // zoo name or a file (IR JSON, ONNX, HF config.json)
  std::string gpu = "h100-80g";      // catalog kind; ignored when cluster_file is set
  std::string cluster_file;          // a --cluster description instead of gpu
  int nodes = 1;
  int gpus_per_node = 8;
  bool use_global_batch = false;     // global_batch sets grad_accum, as --global-batch
  int64_t micro_batch = 1;
  int64_t global_batch = 0;
  int64_t grad_accum = 1;            // with a micro-batch (a global batch sets it)
  int64_t seq_len = 0;               // 0: the model's own length
  std::string precision;             // "": bf16-mixed (fp32 on cpu)
  std::string optimizer = "adamw";
  std::string checkpointing = "none";
  std::string attention = "math";
  std::string fusion = "engine";     // --fusion (engine, eager); read for the files dlplan imports only
  std::string syncbn = "auto";
  double bucket_mb = 25.0;           // DDP / ZeRO-1 gradient buckets, MiB
  int prefetch = 1;                  // ZeRO-3 units gathered ahead
  int shard_group = 0;               // hsdp2 / hsdp3: ranks per shard group; 0: one node
  std::string offload = "none";      // CPU offload: none, optimizer, params (--offload)
  std::string freeze;                // --freeze: comma-separated globs over node / unit names
  int64_t lora = 0;                  // --lora: adapter rank, 0: none
  std::string lora_targets;          // --lora-targets ("": q,v)
  double lora_alpha = 0;             // --lora-alpha (0: alpha = rank)
  double lr = kDefaultLr;            // written into a saved plan
  std::optional<Strategy> forced;    // --strategy
  std::optional<Strategy> show;      // the row the timeline, Gantt and tensors show (default: recommended, else the last)
  bool explain = true;               // the shown row's tensors at the peak

  int world() const { return nodes * gpus_per_node; }
  bool operator==(const Inputs&) const = default;
};

// What one recompute yields.
struct Results {
  Inputs inputs;
  Planning planning;
  int recommended = -1;                 // row of planning.chosen(), -1 when nothing fits
  int shown = -1;                       // the row simulated and explained (Inputs::show)
  Simulation simulation;                // of the shown row
  std::vector<LiveTensor> peak_tensors; // of the shown row, largest first (Inputs::explain)
  int64_t capacity_bytes = 0;           // device_capacity(cluster)
  int64_t tokens_per_sample = 0;        // > 0: the model takes token inputs (seq-len applies)
  bool imported = false;                // an ONNX file or HF config: --fusion applies
  double plan_ms = 0, simulate_ms = 0;  // where the time went
};

// Peak memory and step time against the GPU count, every strategy.
struct SweepPoint {
  int gpus = 0;
  // Per strategy, in kAllStrategies' order (ddp..hsdp3).
  std::array<int64_t, kAllStrategies.size()> peak{};  // walk peak
  std::array<int64_t, kAllStrategies.size()> total{}; // peak + runtime
  std::array<double, kAllStrategies.size()> step_seconds{};
  std::array<bool, kAllStrategies.size()> fits{};
  bool ok = false;                      // false: the planner refused this size (message)
  std::string message;
};
struct Sweep {
  std::vector<SweepPoint> points;
  int64_t capacity_bytes = 0;
  double ms = 0;
};

// GPU counts the sweep visits: 1, 2, 4, ..., 1024.
std::vector<int> sweep_gpu_counts();


class Engine {
 public:
  // The model named by inputs (zoo name or file), cached by (name, seq_len,
  // micro_batch for ONNX symbolic dims, fusion). Throws dlplan::Error naming
  // the file and node.
  std::shared_ptr<const Model> model(const Inputs& in);
  std::shared_ptr<const Model> model(const std::string& name, const ImportOptions& opt);
  // The request `dlplan plan` would build from the same flags (build_request).
  PlanRequest request(const Inputs& in);
  static RequestFlags flags(const Inputs& in);
  // --fusion as the request takes it: inputs.fusion for a file dlplan
  // imports, "" (the default) for anything else.
  static std::string fusion_flag(const Inputs& in);
  // plan (every strategy) + the shown row's tensors at the peak and simulation.
  Results compute(const Inputs& in);
  // The sweep over GPU counts with everything else as in `in`. With a global
  // batch, the per-GPU micro-batch stays and accumulation is 1 (weak scaling).
  Sweep sweep(const Inputs& in);
  // "Run locally": the same model and strategy re-planned for the `cpu`
  // device, one node of `ranks`, fp32, micro-batch kept, no accumulation.
  // The plan JSON as `dlplan --out` writes it. Throws when it does not fit.
  struct LocalPlan {
    std::string json;
    int64_t predicted_peak = 0;
  };
  LocalPlan local_plan(const Inputs& in, Strategy s, int ranks);

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Model>> cache_;
};

}  // namespace dlplan::gui
