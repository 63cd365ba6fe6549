// Every knob a plan carries, measured (issue: "every knob measured"): the
// factors below, a pairwise covering set of them (every pair of values of any
// two factors appears in at least one configuration), every single-knob change
// from the defaults, and the full grid for the benchmark. Each configuration
// runs a tiny model for a few steps on the CPU engine; measured memory must
// equal the plan's byte for byte in every category, at the peak and after
// every op (Trainer::ledger_check).
//
// Used by knob_grid_test.cpp (one rank), mpi/knob_grid.cpp (2 and 4 ranks)
// and bench/knob_grid.cpp (the full grid, a table).
#pragma once

#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/device.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace dlplan::exec::knobs {

// The factors and their levels; level 0 of each is the default.
enum Factor { kModel, kStrategy, kPrecision, kCheckpointing, kAttention, kAccum, kPrefetch, kBucket, kSyncBn, kOffload, kFactors };
inline const std::array<std::vector<std::string>, kFactors>& levels() {
  static const std::array<std::vector<std::string>, kFactors> l = {{
      {"tiny-gpt", "tiny-mlp", "tiny-cnn", "tiny-vit"},
      {"ddp", "zero1", "zero2", "zero3", "hsdp2", "hsdp3"},  // hsdp: 2 "nodes" of world/2 from 4 ranks on
      {"fp32", "bf16-mixed", "fp16-mixed"},
      {"none", "units"},
      {"math", "flash"},
      {"1", "3"},       // gradient accumulation
      {"1", "0", "2"},  // ZeRO-3 prefetch (units gathered ahead)
      {"25", "0.01"},   // DDP bucket MB: one bucket, or one per parameter
      {"off", "on"},    // SyncBN (BatchNorm models only)
      {"none", "optimizer", "params"},  // CPU offload (optimizer: ZeRO strategies; params: zero3)
  }};
  return l;
}
inline const char* factor_name(int f) {
  static const char* names[] = {"model", "strategy", "precision", "checkpointing", "attention",
                                "grad-accum", "prefetch", "bucket-mb", "syncbn", "offload"};
  return names[f];
}

using Config = std::array<int, kFactors>;  // a level index per factor

// Pairs of levels no plan can hold: SyncBN without BatchNorm (only tiny-cnn
// has it); offload under ddp (the optimizer runs on a shard); parameter
// offload on a strategy that does not shard parameters (only zero3, hsdp3).
inline bool pair_feasible(int f1, int l1, int f2, int l2) {
  if (f1 > f2) std::swap(f1, f2), std::swap(l1, l2);
  if (f1 == kModel && f2 == kSyncBn) return l2 == 0 || l1 == 2;
  if (f1 == kStrategy && f2 == kOffload) return l2 == 0 || (l1 != 0 && (l2 == 1 || l1 == 3 || l1 == 5));
  return true;
}
inline bool feasible(const Config& c) {
  for (int f1 = 0; f1 < kFactors; ++f1)
    for (int f2 = f1 + 1; f2 < kFactors; ++f2)
      if (!pair_feasible(f1, c[f1], f2, c[f2])) return false;
  return true;
}

inline std::string describe(const Config& c) {
  std::string s;
  for (int f = 0; f < kFactors; ++f) s += fmt::format("{}{}={}", f ? " " : "", factor_name(f), levels()[f][c[f]]);
  return s;
}

// The defaults, and each factor moved to each of its other levels.
inline std::vector<Config> single_knob_changes() {
  std::vector<Config> out{Config{}};
  for (int f = 0; f < kFactors; ++f)
    for (int l = 1; l < static_cast<int>(levels()[f].size()); ++l) {
      Config c{};
      c[f] = l;
      if (f == kSyncBn) c[kModel] = 2;  // SyncBN needs BatchNorm
      if (f == kOffload) c[kStrategy] = 3;  // zero3 takes either offload
      out.push_back(c);
    }
  return out;
}

// A pairwise covering set, built greedily (AETG, Cohen et al. 1997): each new
// configuration is the best of 50 random greedy candidates by the number of
// uncovered pairs it covers. Pairs no feasible configuration can hold are not
// required. Deterministic (fixed seed).
inline std::vector<Config> pairwise() {
  const auto& L = levels();
  auto key = [](int f1, int l1, int f2, int l2) { return ((f1 * 8 + l1) * 16 + f2) * 8 + l2; };
  std::set<int> uncovered;
  for (int f1 = 0; f1 < kFactors; ++f1)
    for (int f2 = f1 + 1; f2 < kFactors; ++f2)
      for (int l1 = 0; l1 < static_cast<int>(L[f1].size()); ++l1)
        for (int l2 = 0; l2 < static_cast<int>(L[f2].size()); ++l2) {
          if (!pair_feasible(f1, l1, f2, l2)) continue;
          uncovered.insert(key(f1, l1, f2, l2));
        }
  auto gain = [&](const Config& c) {
    int g = 0;
    for (int f1 = 0; f1 < kFactors; ++f1)
      for (int f2 = f1 + 1; f2 < kFactors; ++f2) g += static_cast<int>(uncovered.count(key(f1, c[f1], f2, c[f2])));
    return g;
  };
  std::mt19937 rng(20261130);
  std::vector<Config> out;
  while (!uncovered.empty()) {
    Config best{};
    int best_gain = -1;
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<int> order(kFactors);
      for (int f = 0; f < kFactors; ++f) order[static_cast<size_t>(f)] = f;
      std::shuffle(order.begin(), order.end(), rng);
      Config c{};
      std::array<bool, kFactors> fixed{};
      for (int f : order) {  // each factor takes the level that covers most with those fixed so far
        int pick = 0, pick_gain = -1;
        for (int l = 0; l < static_cast<int>(L[f].size()); ++l) {
          c[f] = l;
          int g = 0;
          for (int o = 0; o < kFactors; ++o)
            if (fixed[static_cast<size_t>(o)] && o != f)
              g += static_cast<int>(uncovered.count(o < f ? key(o, c[o], f, l) : key(f, l, o, c[o])));
          if (g > pick_gain || (g == pick_gain && rng() % 2)) pick = l, pick_gain = g;
        }
        c[f] = pick;
        fixed[static_cast<size_t>(f)] = true;
      }
      if (!feasible(c)) c[kSyncBn] = 0;
      if (!feasible(c)) c[kOffload] = 0;
      const int g = gain(c);
      if (g > best_gain) best = c, best_gain = g;
    }
    if (best_gain <= 0) break;  // nothing feasible covers what is left
    for (int f1 = 0; f1 < kFactors; ++f1)
      for (int f2 = f1 + 1; f2 < kFactors; ++f2) uncovered.erase(key(f1, best[f1], f2, best[f2]));
    out.push_back(best);
  }
  return out;
}

// Every feasible configuration (the benchmark's grid).
inline std::vector<Config> full_grid() {
  std::vector<Config> out;
  Config c{};
  while (true) {
    if (feasible(c)) out.push_back(c);
    int f = 0;
    while (f < kFactors && ++c[f] == static_cast<int>(levels()[f].size())) c[f++] = 0;
    if (f == kFactors) break;
  }
  return out;
}

// The plan of a configuration for `world` ranks on the cpu device (whose
// allocations are rounded to `granularity` bytes when it is not 0); with
// fused_loss, the model's cross_entropy is the fused one (keeps logits + lse);
// a `model` file or zoo name replaces the model factor's level, imported
// with `import` (an ONNX file's sequence, --fusion).
// expert_units: each expert of a mixture of experts a unit of its own (with_expert_units).
inline PlanDocument plan_of(const Config& k, int world, int64_t granularity = 0, bool fused_loss = false,
                            const std::string& model = "", const ImportOptions& import = {}, bool expert_units = false) {
  const auto& L = levels();
  PlanRequest req;
  req.model = load_model(model.empty() ? L[kModel][k[kModel]] : model, import);
  if (expert_units) req.model = with_expert_units(req.model);
  if (fused_loss)
    for (Node& n : req.model.nodes)
      if (n.op == OpKind::cross_entropy) n.attrs.values["fused"] = true;
  req.cluster.device = find_device("cpu");
  if (granularity > 0) req.cluster.device.alloc_granularity_bytes = granularity;
  req.cluster.nodes = 1;
  req.cluster.gpus_per_node = world;
  TrainingConfig& t = req.training;
  const Strategy strategy = parse_strategy(L[kStrategy][k[kStrategy]]);
  if (hybrid(strategy) && world >= 4) {  // hybrid sharding proper: 2 groups of world / 2
    req.cluster.nodes = 2;
    req.cluster.gpus_per_node = world / 2;
    t.shard_group = world / 2;
  }
  t.precision = parse_precision(L[kPrecision][k[kPrecision]]);
  t.checkpointing = parse_checkpointing(L[kCheckpointing][k[kCheckpointing]]);
  t.attention = parse_attention(L[kAttention][k[kAttention]]);
  t.micro_batch = 2;
  t.grad_accum = std::stoi(L[kAccum][k[kAccum]]);
  t.prefetch = std::stoi(L[kPrefetch][k[kPrefetch]]);
  t.bucket_mb = std::stod(L[kBucket][k[kBucket]]);
  t.optimizer.lr = 1e-3;
  t.offload = parse_offload(L[kOffload][k[kOffload]]);
  req.forced = strategy;
  req.syncbn = k[kSyncBn] ? SyncBnMode::on : SyncBnMode::off;
  Planning p = plan(req);
  return plan_from_json(plan_json(p, *p.chosen()), model.empty() ? describe(k) : model + ": " + describe(k));
}

// What one configuration measured against what its plan predicted.
struct Outcome {
  CategoryBytes measured{}, predicted{};
  CategoryBytes host_measured{}, host_predicted{};  // CPU offload's host pool (0 without)
  int64_t peak_measured = 0, peak_predicted = 0;
  int64_t ledger_worst = 0;    // largest |measured - program| after any op
  std::string ledger_where;
  double loss = 0;
  bool equal() const {
    return measured == predicted && host_measured == host_predicted && peak_measured == peak_predicted && ledger_worst == 0;
  }
};

// Host memory whose blocks are requests rounded up to `granularity` bytes, as
// a GPU's caching allocator rounds to 512 B: the prediction of rounded
// allocations, checked without a GPU.
class RoundingHostMemory final : public MemoryResource {
 public:
  explicit RoundingHostMemory(int64_t granularity) : g_(granularity) {}
  void* allocate(int64_t bytes, int64_t& granted) override {
    int64_t ignored = 0;
    void* p = host_->allocate(bytes, ignored);
    granted = (std::max<int64_t>(bytes, 1) + g_ - 1) / g_ * g_;
    return p;
  }
  void release(void* p, int64_t granted) override { host_->release(p, granted); }
  void zero(void* p, int64_t bytes) override { host_->zero(p, bytes); }
  bool host_visible() const override { return true; }

 private:
  int64_t g_;
  std::unique_ptr<MemoryResource> host_ = make_host_memory();
};

inline Outcome run_config(const Config& k, Communicator& comm, Backend& backend, int steps = 3,
                          int64_t granularity = 0, bool fused_loss = false, const std::string& model = "",
                          const ImportOptions& import = {}, bool expert_units = false) {
  const PlanDocument plan = plan_of(k, comm.size(), granularity, fused_loss, model, import, expert_units);
  TrainOptions opt;
  opt.steps = steps;
  Trainer t(plan, comm, backend, opt,
            granularity > 0 ? std::make_unique<RoundingHostMemory>(granularity) : make_host_memory());
  Outcome o;
  for (int s = 0; s < steps; ++s) o.loss = t.step().loss;
  const StepWalk w = walk_step(plan.model, plan.cluster, plan.training);
  o.measured = t.allocator().at_peak();
  o.predicted = w.at_peak;
  o.peak_measured = t.allocator().peak();
  o.peak_predicted = w.peak;
  o.host_measured = t.host_allocator().max_each();
  o.host_predicted = host_states(plan.model, comm.size(), plan.training);
  o.ledger_worst = t.ledger_check().worst_bytes;
  o.ledger_where = t.ledger_check().where;
  return o;
}

inline std::string mismatch(const Outcome& o) {
  std::string s = fmt::format("peak {} / {}", o.peak_measured, o.peak_predicted);
  for (Category c : kAllCategories)
    if (o.measured[static_cast<size_t>(c)] != o.predicted[static_cast<size_t>(c)])
      s += fmt::format("; {} {} / {}", to_string(c), o.measured[static_cast<size_t>(c)], o.predicted[static_cast<size_t>(c)]);
  for (Category c : kAllCategories)
    if (o.host_measured[static_cast<size_t>(c)] != o.host_predicted[static_cast<size_t>(c)])
      s += fmt::format("; host {} {} / {}", to_string(c), o.host_measured[static_cast<size_t>(c)],
                       o.host_predicted[static_cast<size_t>(c)]);
  if (o.ledger_worst) s += fmt::format("; after an op {} B apart ({})", o.ledger_worst, o.ledger_where);
  return s + " (measured / predicted)";
}

}  // namespace dlplan::exec::knobs
