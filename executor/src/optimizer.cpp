#include "dlplan/exec/optimizer.hpp"

#include <cmath>

namespace dlplan::exec {

double learning_rate(const OptimizerConfig& o, int step, int total) {
  if (o.warmup_steps > 0 && step < o.warmup_steps) return o.lr * (step + 1) / o.warmup_steps;
  const int decay_steps = std::max(1, total - o.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / decay_steps);
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress));
}

Optimizer::Optimizer(const OptimizerConfig& cfg, ParamStore& store, Allocator& alloc) : cfg_(cfg), store_(store) {
  const bool moments = cfg.kind != OptimizerKind::sgd;
  for (int u = 0; u < store.units(); ++u) {
    const std::string label = "optimizer state, unit " + std::to_string(u);
    const int64_t n = store.shard_size(u);  // the padded shard, as the planner counts it
    m_.push_back(moments ? alloc.zeros({n}, DType::f32, Category::optimizer, label + " m") : Tensor{});
    v_.push_back(cfg.kind == OptimizerKind::adamw ? alloc.zeros({n}, DType::f32, Category::optimizer, label + " v")
                                                  : Tensor{});
  }
}

double Optimizer::step(int step_index, int total_steps, Communicator& comm) {
  // Global norm: each rank sums the squares of what it owns; sharded
  // gradients are summed across ranks, replicated ones counted once.
  double sq = 0;
  for (int u = 0; u < store_.units(); ++u) {
    const float* g = store_.owned_grads(u);
    for (int64_t e = 0, n = store_.owned_size(u); e < n; ++e) sq += static_cast<double>(g[e]) * g[e];
  }
  if (store_.sharded()) comm.all_reduce_doubles(&sq, 1);
  const double norm = std::sqrt(sq);
  const double clip = (cfg_.clip_norm > 0 && norm > cfg_.clip_norm) ? cfg_.clip_norm / (norm + 1e-6) : 1.0;

  const double lr = learning_rate(cfg_, step_index, total_steps);
  ++t_;
  const double bc1 = 1.0 - std::pow(cfg_.beta1, t_), bc2 = 1.0 - std::pow(cfg_.beta2, t_);
  for (int u = 0; u < store_.units(); ++u) {
    float* p = store_.owned_params(u);
    const float* g = store_.owned_grads(u);
    float* m = m_[static_cast<size_t>(u)].defined() ? m_[static_cast<size_t>(u)].f() : nullptr;
    float* v = v_[static_cast<size_t>(u)].defined() ? v_[static_cast<size_t>(u)].f() : nullptr;
    const int64_t begin = store_.owned_begin(u), n = store_.owned_size(u);
    for (const auto& seg : store_.segments(u)) {
      const int64_t lo = std::max(seg.begin, begin), hi = std::min(seg.end, begin + n);
      const double wd = seg.decay ? cfg_.weight_decay : 0.0;
      for (int64_t f = lo; f < hi; ++f) {
        const int64_t e = f - begin;
        const double grad = g[e] * clip;
        switch (cfg_.kind) {
          case OptimizerKind::adamw: {
            // Decoupled weight decay (Loshchilov & Hutter, AdamW), then Adam.
            double w = p[e] * (1.0 - lr * wd);
            m[e] = static_cast<float>(cfg_.beta1 * m[e] + (1 - cfg_.beta1) * grad);
            v[e] = static_cast<float>(cfg_.beta2 * v[e] + (1 - cfg_.beta2) * grad * grad);
            w -= lr * (m[e] / bc1) / (std::sqrt(v[e] / bc2) + cfg_.eps);
            p[e] = static_cast<float>(w);
            break;
          }
          case OptimizerKind::sgd:
            p[e] = static_cast<float>(p[e] - lr * (grad + wd * p[e]));
            break;
          case OptimizerKind::sgd_momentum: {
            m[e] = static_cast<float>(cfg_.momentum * m[e] + grad + wd * p[e]);
            p[e] = static_cast<float>(p[e] - lr * m[e]);
            break;
          }
        }
      }
    }
  }
  return norm;
}

}  // namespace dlplan::exec
