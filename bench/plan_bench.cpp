// Planning-time benchmark: a Llama-2-70B-sized graph (80 layers, width 8192,
// GQA 64/8 heads, SwiGLU 28672, vocab 32000, 4096 tokens) planned at 1024
// GPUs (128 nodes x 8 H100) across all four strategies, and a full search of
// 616 configurations. Prints a table; the goals on the two-core development
// machine: a plan under 50 ms, the search under 1 s.
#include "dlplan/loader.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/zoo.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

using namespace dlplan;
using Clock = std::chrono::steady_clock;

namespace {

double median_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <typename F>
double time_ms(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto start = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return median_ms(t);
}

}  // namespace

int main() {
  const nlohmann::json ir = *zoo::zoo_model("llama2-70b");
  Model model;
  const double load_ms = time_ms(5, [&] { model = parse_model(ir, "llama2-70b"); });

  PlanRequest req;
  req.model = model;
  req.cluster.device = find_device("h100-80g");
  req.cluster.nodes = 128;
  req.cluster.gpus_per_node = 8;
  req.training.micro_batch = 1;
  req.training.checkpointing = Checkpointing::units;

  Planning p;
  const int reps = 15;
  const double plan_ms = time_ms(reps, [&] { p = plan(req); });
  double per_strategy = time_ms(reps, [&] { (void)evaluate(model, req.cluster, p.results[3].training); });

  fmt::print("dlplan planning benchmark: {} ({} nodes, {:.3f} B parameters) on {} x {}\n\n", model.name, model.nodes.size(),
             static_cast<double>(model.parameter_count()) / 1e9, req.cluster.world(), req.cluster.device.kind);
  fmt::print("{:<44} {:>10}\n", "what", "median ms");
  fmt::print("{:<44} {:>10.2f}\n", "load + validate + shape inference", load_ms);
  fmt::print("{:<44} {:>10.2f}\n", "one strategy (zero3: walk + costs)", per_strategy);
  fmt::print("{:<44} {:>10.2f}\n", "plan: 4 strategies + SyncBN + recommendation", plan_ms);
  // The full search (the simulator issue): 4 strategies x SyncBN on/off x
  // micro-batches 1..64 x GPU counts 1..1024 = 616 configurations, each a
  // step program, its memory walk and its simulation.
  int configs = 0, fitting = 0;
  auto search_start = Clock::now();
  for (Strategy s : kAllStrategies)
    for (bool syncbn : {false, true})
      for (int64_t b = 1; b <= 64; b *= 2)
        for (int gpus = 1; gpus <= 1024; gpus *= 2) {
          Cluster cl = req.cluster;
          cl.nodes = gpus <= 8 ? 1 : gpus / 8;
          cl.gpus_per_node = gpus <= 8 ? gpus : 8;
          TrainingConfig t = req.training;
          t.strategy = s;
          t.micro_batch = b;
          t.syncbn = syncbn && gpus > 1;  // no BN layers here: the flag costs nothing, as it should
          t.syncbn_group = t.syncbn ? gpus : 0;
          fitting += evaluate(model, cl, t).fits;
          ++configs;
        }
  const double search_ms = std::chrono::duration<double, std::milli>(Clock::now() - search_start).count();
  fmt::print("{:<44} {:>10.2f}\n", fmt::format("full search: {} configurations ({} fit)", configs, fitting), search_ms);
  fmt::print("\ngoal: plan under 50 ms -> {}\n", plan_ms < 50 ? "met" : "NOT met");
  fmt::print("goal: full search under 1 s -> {}\n", search_ms < 1000 ? "met" : "NOT met");
  fmt::print("recommended: {}\n", p.recommendation.strategy ? to_string(*p.recommendation.strategy) : "none fits");
  return 0;
}
