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

}  // namespace

std::vector<int> sweep_gpu_counts() {
  std::vector<int> n;
  for (int g = 1; g <= 1024; g *= 2) n.push_back(g);
  return n;
}

std::shared_ptr<const Model> Engine::model(const Inputs& in) {
  ImportOptions opt{std::max<int64_t>(in.micro_batch, 1), std::max<int64_t>(in.seq_len, 0)};
  opt.fusion = parse_fusion(fusion_flag(in), in.model);
  return model(in.model, opt);
}

// The window's fusion as `dlplan plan --fusion` would take it: only for a
// file dlplan imports (for a zoo model or an IR JSON the control is off and
// the flag would be refused). The default needs no flag, and no look into
// the file (a .json is read to tell an HF config from an IR).
std::string Engine::fusion_flag(const Inputs& in) {
  if (in.fusion.empty() || in.fusion == to_string(FusionMode::engine)) return {};
  return imports_model(in.model) ? in.fusion : std::string();
}

std::shared_ptr<const Model> Engine::model(const std::string& name, const ImportOptions& opt) {
  // ONNX symbolic dimensions take the micro-batch and sequence length, as the CLI does.
  const std::string key = fmt::format("{}\n{}\n{}\n{}", name, opt.seq_len, opt.micro_batch, to_string(opt.fusion));
  {
    std::lock_guard lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  auto shared = std::make_shared<const Model>(load_model(name, opt));
  std::lock_guard lock(mu_);
  if (cache_.size() > 16) cache_.clear();
  cache_[key] = shared;
  return shared;
}

RequestFlags Engine::flags(const Inputs& in) {
  RequestFlags f;
  f.model = in.model;
  if (in.cluster_file.empty()) f.gpu = in.gpu;
  f.cluster_file = in.cluster_file;
  f.gpus = static_cast<int64_t>(in.nodes) * in.gpus_per_node;
  f.nodes = in.nodes;
  f.micro_batch = in.micro_batch;
  if (in.use_global_batch) f.global_batch = in.global_batch;
  else f.grad_accum = in.grad_accum;
  if (in.seq_len > 0) f.seq_len = in.seq_len;
  f.precision = in.precision;
  f.optimizer = in.optimizer;
  f.checkpointing = in.checkpointing;
  f.attention = in.attention;
  f.fusion = fusion_flag(in);
  f.syncbn = in.syncbn;
  if (in.forced) f.strategy = to_string(*in.forced);
  f.bucket_mb = in.bucket_mb;
  f.prefetch = in.prefetch;
  // The shard group only where hybrid sharding is planned (a forced ZeRO
  // strategy refuses --shard-group).
  if (in.shard_group > 0 && (!in.forced || hybrid(*in.forced))) f.shard_group = in.shard_group;
  f.offload = in.offload;
  f.freeze = in.freeze;
  if (in.lora > 0) {
    f.lora = in.lora;
    f.lora_targets = in.lora_targets;
    if (in.lora_alpha > 0) f.lora_alpha = in.lora_alpha;
  }
  f.lr = in.lr;
  f.explain = in.explain;
  return f;
}

PlanRequest Engine::request(const Inputs& in) {
  return build_request(flags(in), [this](const std::string& name, const ImportOptions& opt) { return *model(name, opt); });
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
  res.imported = imports_model(in.model);
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
      auto put = [&pt](size_t i, const StrategyResult& row) {
        pt.peak[i] = row.walk.peak;
        pt.total[i] = row.walk.peak + row.runtime_bytes;
        pt.step_seconds[i] = row.step_seconds;
        pt.fits[i] = row.fits;
      };
      for (const auto& row : p.results) put(static_cast<size_t>(row.strategy), row);
      // Where the shard group is the whole world (one node), hybrid sharding
      // is ZeRO-2 / ZeRO-3 itself and the planner shows no row of its own.
      for (Strategy h : {Strategy::hsdp2, Strategy::hsdp3})
        if (std::none_of(p.results.begin(), p.results.end(), [h](const StrategyResult& x) { return x.strategy == h; }))
          for (const auto& row : p.results)
            if (row.strategy == within_group(h)) put(static_cast<size_t>(h), row);
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
  local.grad_accum = 1;
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
