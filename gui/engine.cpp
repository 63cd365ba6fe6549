#include "engine.hpp"

#include "dlplan/error.hpp"
#include "dlplan/format.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"

#include <fmt/format.h>

#include <chrono>

namespace dlplan::gui {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

Cluster make_cluster(const Inputs& in) {
  Cluster c;
  if (!in.cluster_file.empty()) c = load_cluster_file(in.cluster_file);
  else c.device = find_device(in.gpu);
  if (in.nodes <= 0 || in.gpus_per_node <= 0) throw Error("nodes and GPUs per node must be positive");
  c.nodes = in.nodes;
  c.gpus_per_node = in.gpus_per_node;
  return c;
}

}  // namespace

std::vector<int> sweep_gpu_counts() {
  std::vector<int> n;
  for (int g = 1; g <= 1024; g *= 2) n.push_back(g);
  return n;
}

std::shared_ptr<const Model> Engine::model(const Inputs& in) {
  // ONNX symbolic dimensions take the micro-batch and sequence length, as the CLI does.
  const std::string key = fmt::format("{}\n{}\n{}", in.model, in.seq_len, in.micro_batch);
  {
    std::lock_guard lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  Model m = load_model(in.model, ImportOptions{std::max<int64_t>(in.micro_batch, 1), std::max<int64_t>(in.seq_len, 0)});
  if (in.seq_len > 0) m = with_seq_len(m, in.seq_len);
  auto shared = std::make_shared<const Model>(std::move(m));
  std::lock_guard lock(mu_);
  if (cache_.size() > 16) cache_.clear();
  cache_[key] = shared;
  return shared;
}

PlanRequest Engine::request(const Inputs& in) {
  // Mirrors cli/plan_command.cpp make_request().
  PlanRequest r;
  r.cluster = make_cluster(in);
  r.model = *model(in);
  auto& t = r.training;
  t.precision = in.precision.empty() ? (r.cluster.device.kind == "cpu" ? Precision::fp32 : Precision::bf16_mixed)
                                     : parse_precision(in.precision);
  t.optimizer.kind = parse_optimizer(in.optimizer);
  if (t.optimizer.kind != OptimizerKind::adamw) t.optimizer.weight_decay = 0.0;
  t.checkpointing = parse_checkpointing(in.checkpointing);
  t.attention = parse_attention(in.attention);
  t.micro_batch = in.micro_batch;
  if (t.micro_batch <= 0) throw Error(fmt::format("micro-batch must be positive, got {}", t.micro_batch));
  const int64_t N = r.cluster.world();
  if (in.use_global_batch) {
    if (in.global_batch <= 0 || in.global_batch % (t.micro_batch * N) != 0)
      throw Error(fmt::format("global batch {} is not a multiple of micro-batch {} x {} GPUs = {}", in.global_batch,
                              t.micro_batch, N, t.micro_batch * N));
    t.grad_accum = in.global_batch / (t.micro_batch * N);
  }
  r.forced = in.forced;
  r.syncbn = parse_syncbn_mode(in.syncbn);
  r.explain = in.explain;
  return r;
}

Results Engine::compute(const Inputs& in) {
  Results res;
  res.inputs = in;
  auto t0 = Clock::now();
  PlanRequest req = request(in);
  req.explain = false;  // the shown row alone is explained, below
  res.planning = plan(req);
  const auto& p = res.planning;
  res.capacity_bytes = device_capacity(p.request.cluster);
  res.tokens_per_sample = tokens_per_sample(p.request.model);
  if (const StrategyResult* c = p.chosen()) res.recommended = static_cast<int>(c - p.results.data());
  res.shown = res.recommended >= 0 ? res.recommended : static_cast<int>(p.results.size()) - 1;
  for (size_t i = 0; in.show && i < p.results.size(); ++i)
    if (p.results[i].strategy == *in.show) res.shown = static_cast<int>(i);
  if (res.shown < 0) throw Error("the planner returned no strategy");
  const StrategyResult& row = p.results[static_cast<size_t>(res.shown)];
  if (in.explain) res.peak_tensors = evaluate(p.request.model, p.request.cluster, row.training, true).walk.peak_tensors;
  res.plan_ms = ms_since(t0);
  auto t1 = Clock::now();
  res.simulation = simulate_step(p.request.model, p.request.cluster, row.training);
  res.simulate_ms = ms_since(t1);
  return res;
}

Sweep Engine::sweep(const Inputs& in) {
  auto t0 = Clock::now();
  Sweep s;
  PlanRequest base = request(in);
  base.explain = false;
  base.forced.reset();
  base.training.grad_accum = 1;
  s.capacity_bytes = device_capacity(base.cluster);
  for (int g : sweep_gpu_counts()) {
    SweepPoint pt;
    pt.gpus = g;
    PlanRequest r = base;
    r.cluster.gpus_per_node = std::min(g, in.gpus_per_node);
    r.cluster.nodes = g / r.cluster.gpus_per_node;
    try {
      const Planning p = plan(r);
      for (size_t i = 0; i < p.results.size() && i < 4; ++i) {
        const auto& row = p.results[i];
        pt.peak[i] = row.walk.peak;
        pt.total[i] = row.walk.peak + row.runtime_bytes;
        pt.step_seconds[i] = row.step_seconds;
        pt.fits[i] = row.fits;
      }
      pt.ok = true;
    } catch (const Error& e) {
      pt.message = e.what();
    }
    s.points.push_back(std::move(pt));
  }
  s.ms = ms_since(t0);
  return s;
}

Engine::LocalPlan Engine::local_plan(const Inputs& in, Strategy s, int ranks) {
  Inputs local = in;
  local.gpu = "cpu";
  local.cluster_file.clear();
  local.nodes = 1;
  local.gpus_per_node = ranks;
  local.precision.clear();  // fp32, the only precision of the cpu device
  local.use_global_batch = false;
  local.forced = s;
  local.explain = false;
  const Planning p = plan(request(local));
  const StrategyResult* r = p.chosen();
  if (!r) throw Error("no plan for the cpu device");
  if (!r->fits)
    throw Error(fmt::format("{} on {} cpu ranks does not fit this host: peak {} + runtime per rank exceeds {}",
                            to_string(s), ranks, format_bytes(static_cast<double>(r->walk.peak)),
                            format_bytes(static_cast<double>(r->capacity_bytes))));
  return {plan_json(p, *r).dump(1) + "\n", r->walk.peak};
}

}  // namespace dlplan::gui
