#include "dlplan/exec/optimizer.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/bf16.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace dlplan::exec {

double learning_rate(const OptimizerConfig& o, int step, int total) {
  if (o.warmup_steps > 0 && step < o.warmup_steps) return o.lr * (step + 1) / o.warmup_steps;
  const int decay_steps = std::max(1, total - o.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / decay_steps);
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

Optimizer::Optimizer(const OptimizerConfig& cfg, ParamStore& store, Allocator& alloc, Allocator* host)
    : cfg_(cfg), store_(store) {
  const bool moments = cfg.kind != OptimizerKind::sgd;
  const bool offload = store.offloaded();
  if (offload && host == nullptr) throw Error("CPU offload needs a host memory pool for the optimizer");
  if (offload) host_ops_ = make_cpu_device_ops();
  Allocator& pool = offload ? *host : alloc;
  const std::string where = offload ? " (host)" : "";
  for (int u = 0; u < store.units(); ++u) {
    const std::string label = "optimizer state, unit " + std::to_string(u);
    const int64_t n = store.shard_size(u);  // the padded shard, as the planner counts it
    // Under bf16-mixed the updates go to an fp32 master copy of the shard
    // (ZeRO's "K = 12": master, m, v), made from the bf16 parameters. Under
    // offload the host always keeps one: it updates that copy and sends the
    // parameters up from it. (Offloaded parameters are host memory: copied.)
    if (is_half(store.dtype()) || offload) {
      master_.push_back(pool.zeros({n}, DType::f32, Category::optimizer, label + " master weights" + where));
      if (offload) store.ops().download_floats(master_.back().f(), store.owned_params(u));
      else store.ops().widen(master_.back().f(), store.owned_params(u));
    } else {
      master_.emplace_back();
    }
    m_.push_back(moments ? pool.zeros({n}, DType::f32, Category::optimizer, label + " m" + where) : Tensor{});
    v_.push_back(cfg.kind == OptimizerKind::adamw ? pool.zeros({n}, DType::f32, Category::optimizer, label + " v" + where)
                                                  : Tensor{});
  }
}

StepOutcome Optimizer::step(int step_index, int total_steps, Communicator& comm, double loss_scale) {
  const bool offload = store_.offloaded();
  // Offload: the gradients that backward did not stream to the host (ZeRO-1's
  // shard of its full gradients, one rank's all) go down now, widened to fp32.
  if (offload && !store_.streams_grads())
    for (int u = 0; u < store_.units(); ++u) store_.ops().download_floats(static_cast<float*>(store_.host_grads(u).data), store_.device_owned_grads(u));
  DeviceOps& ops = offload ? *host_ops_ : store_.ops();  // where the state lives
  // Global norm: each rank sums the squares of what it owns; sharded
  // gradients are summed across ranks, replicated ones counted once.
  double sq = 0;
  for (int u = 0; u < store_.units(); ++u) sq = ops.sum_of_squares(store_.owned_grads(u), sq);
  if (store_.sharded()) {
    // Each shard is held by the comm.size() / store_.world() replicas of
    // hybrid sharding (one under ZeRO): summed once.
    comm.all_reduce_doubles(&sq, 1);
    sq /= comm.size() / store_.world();
  } else if (comm.size() > 1) {
    // Replicated gradients: every rank computed the same sum, up to rounding
    // on a backend whose reductions are not bit-reproducible. One value for
    // all (the mean), so that replicas clip alike and never drift apart.
    comm.all_reduce_doubles(&sq, 1);
    sq /= comm.size();
  }
  const bool scaled = loss_scale > 0;
  if (scaled) {
    // GradScaler's found-inf check: a scaled gradient that overflowed makes
    // this rank's sum of squares inf or NaN (replicas see the same; a shard
    // only its own). One flag summed over every rank decides for all.
    double found = std::isfinite(sq) ? 0.0 : 1.0;
    if (comm.size() > 1) comm.all_reduce_doubles(&found, 1);
    if (found > 0) return {std::numeric_limits<double>::quiet_NaN(), true};
  }
  const double norm = std::sqrt(sq) / (scaled ? loss_scale : 1.0);
  const double clip = (cfg_.clip_norm > 0 && norm > cfg_.clip_norm) ? cfg_.clip_norm / (norm + 1e-6) : 1.0;

  OptimizerUpdate up;
  up.lr = learning_rate(cfg_, step_index, total_steps);
  up.clip_scale = scaled ? clip / loss_scale : clip;  // unscaled as read: g / S, then clipped
  up.t = ++t_;
  auto data = [](const std::vector<Tensor>& per_unit, int u) {
    const Tensor& t = per_unit[static_cast<size_t>(u)];
    return t.defined() ? t.f() : nullptr;
  };
  for (int u = 0; u < store_.units(); ++u) {
    // Offload: the host's fp32 master copy is the parameter the update sees.
    const Span p = offload ? master_[static_cast<size_t>(u)].span().sub(0, store_.owned_size(u)) : store_.owned_params(u);
    const Span g = store_.owned_grads(u);
    float* master = offload ? nullptr : data(master_, u);
    float* m = data(m_, u);
    float* v = data(v_, u);
    const int64_t begin = store_.owned_begin(u), n = store_.owned_size(u);
    for (const auto& seg : store_.segments(u)) {
      const int64_t lo = std::max(seg.begin, begin), hi = std::min(seg.end, begin + n);
      if (hi <= lo) continue;
      const int64_t e = lo - begin;  // the run [lo, hi) of the unit is [e, e + hi - lo) of the owned slice
      up.decay = seg.decay;
      ops.optimizer_step(cfg_, up, p.sub(e, hi - lo), g.sub(e, hi - lo), master ? master + e : nullptr,
                         m ? m + e : nullptr, v ? v + e : nullptr);
    }
    // Offload: the updated parameters go up (rounded to bf16 under
    // bf16-mixed), or into the host's parameter shard under --offload params.
    if (offload) {
      DeviceOps& to = store_.params_on_host() ? *host_ops_ : store_.ops();
      to.upload_floats(store_.owned_params(u), master_[static_cast<size_t>(u)].f());
    }
  }
  return {norm, false};
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state(int u) const {
  std::vector<std::pair<std::string, Tensor>> out;
  const auto i = static_cast<size_t>(u);
  if (master_[i].defined()) out.emplace_back("master", master_[i]);
  if (m_[i].defined()) out.emplace_back("exp_avg", m_[i]);
  if (v_[i].defined()) out.emplace_back("exp_avg_sq", v_[i]);
  return out;
}

}  // namespace dlplan::exec
