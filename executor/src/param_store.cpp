#include "dlplan/exec/param_store.hpp"

#include "dlplan/conv_window.hpp"
#include "dlplan/error.hpp"
#include "dlplan/exec/backend.hpp"
#include "dlplan/ops.hpp"
#include "dlplan/step_program.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

namespace dlplan::exec {
namespace {

// Fan-in of a parameter, for PyTorch's default initialisation bound
// 1/sqrt(fan_in) (kaiming_uniform with a = sqrt(5) gives exactly that).
int64_t fan_in(const Model& m, const Node& n, const std::string& suffix) {
  if (n.inputs.empty()) return 1;  // a parameter node: drawn N(0, 0.02), not from a fan-in
  const Shape& x = m.tensor(n.inputs[0]).shape;
  switch (n.op) {
    case OpKind::linear: return x.back();
    case OpKind::conv2d: {
      const ConvWindow w = conv_window(x, n.attrs);
      return x[0] / n.attrs.integer("groups") * w.kh * w.kw;
    }
    case OpKind::conv_transpose2d: {  // torch's fan-in reads the weight [C, out/groups, kh, kw]: its dim 1
      const ConvWindow w = conv_window(x, n.attrs);
      return n.attrs.integer("out") / n.attrs.integer("groups") * w.kh * w.kw;
    }
    case OpKind::lstm:  // nn.LSTM, nn.GRU and nn.RNN draw every weight and bias from U(-1/sqrt(hidden), 1/sqrt(hidden))
    case OpKind::gru:
    case OpKind::rnn:
      return n.attrs.integer("hidden");
    case OpKind::attention: {
      if (suffix.rfind("o.", 0) == 0) return n.attrs.integer("heads") * n.attrs.integer("head_dim");
      const bool on_memory = suffix.rfind("k.", 0) == 0 || suffix.rfind("v.", 0) == 0;
      return on_memory ? attention_shape(m, n).Dm : x.back();  // k and v read the memory under cross attention
    }
    case OpKind::moe_router: return x.back();
    case OpKind::moe_expert:  // w2 [D, F] reads the hidden width; w1 and w3 read x
      return suffix == "w2.weight" ? n.attrs.integer("hidden") : x.back();
    default: return 1;
  }
}

enum class Init { uniform_fan_in, normal_002, ones, zeros, quarter };

Init init_of(const Node& n, const std::string& suffix) {
  // LoRA (Hu et al. 2021, Sec. 4.1; peft's default): A as the layer's weight,
  // B zero, so that training starts from the base model.
  if (suffix.size() >= 6 && suffix.compare(suffix.size() - 6, 6, "lora_B") == 0) return Init::zeros;
  switch (n.op) {
    case OpKind::linear:
    case OpKind::conv2d:
    case OpKind::conv_transpose2d:
    case OpKind::lstm:
    case OpKind::gru:
    case OpKind::rnn:
    case OpKind::attention:
    case OpKind::moe_router:
    case OpKind::moe_expert: return Init::uniform_fan_in;
    case OpKind::embedding:
    case OpKind::pos_embedding:
    case OpKind::cls_token:
    case OpKind::parameter:  // a weight the graph builds on (--init brings the file's)
    case OpKind::relative_position_bias:  // (HF T5 draws it N(0, d_model^-1/2))
    case OpKind::window_position_bias:    // (torchvision's Swin: truncated N(0, 0.02))
      return Init::normal_002;  // GPT-2 / BERT / ViT: N(0, 0.02)
    case OpKind::rmsnorm:  // scale w + offset starts at 1: HF GemmaRMSNorm (offset 1) initialises w to 0
    case OpKind::scale:    // (a written-out GemmaRMSNorm's weight)
      return n.attrs.number("offset") == 1.0 ? Init::zeros : Init::ones;
    case OpKind::prelu: return Init::quarter;  // nn.PReLU's slope starts at 0.25
    default: return suffix == "weight" ? Init::ones : Init::zeros;  // norms: weight 1, bias 0
  }
}

}  // namespace

ParamStore::ParamStore(const Model& m, const TrainingConfig& t, int world, int rank, Allocator& alloc, uint64_t seed,
                       DeviceOps* ops, Allocator* host)
    : m_(m),
      own_ops_(ops ? nullptr : make_cpu_device_ops()),
      ops_(ops ? ops : own_ops_.get()),
      strategy_(t.strategy),
      dtype_(storage_dtype(t.precision)),
      world_(static_cast<int>(shard_world(t, world))),
      rank_(rank % world_),
      replica_(rank / world_),
      sharded_(sharding(t.strategy, world_).optimizer),
      offload_(t.offload),
      streams_grads_(offload_streams_grads(t, world)),
      stages_grads_(stages_grads(t, world)) {
  if (world % world_ != 0)
    throw Error(fmt::format("shard group of {} ranks does not divide the world of {}", world_, world));
  if (offload_ != Offload::none && host == nullptr) throw Error("CPU offload needs a host memory pool");
  if (const std::string why = offload_conflict(t); !why.empty()) throw Error(why);
  if (t.fine_tuning.active() && t.offload == Offload::params)
    throw Error("--offload params with frozen parameters or LoRA is planned, not executed in this version: use "
                "--offload optimizer or none");
  size_ = unit_trainable_counts(m);
  frozen_size_ = unit_frozen_counts(m);
  const size_t U = size_.size();
  padded_.resize(U);
  frozen_padded_.resize(U);
  for (size_t u = 0; u < U; ++u) {
    padded_[u] = sharded_ ? pad_to(size_[u], world_) : size_[u];
    frozen_padded_[u] = sharded_ ? pad_to(frozen_size_[u], world_) : frozen_size_[u];
  }

  // Flat layout: unit u's trainable parameters in Model::params order; its
  // frozen ones likewise in the frozen run.
  std::vector<int64_t> fill(U, 0), fill_frozen(U, 0);
  segments_.resize(U);
  for (const auto& p : m.params) {
    auto u = static_cast<size_t>(p.unit);
    frozen_param_.push_back(p.trainable ? 0 : 1);
    if (!p.trainable) {
      where_.emplace_back(p.unit, fill_frozen[u]);
      fill_frozen[u] += p.numel;
      continue;
    }
    where_.emplace_back(p.unit, fill[u]);
    auto& seg = segments_[u];
    if (!seg.empty() && seg.back().decay == p.weight_decay) seg.back().end += p.numel;
    else seg.push_back({fill[u], fill[u] + p.numel, p.weight_decay});
    fill[u] += p.numel;
  }
  node_params_.resize(m.nodes.size());
  for (size_t k = 0; k < m.params.size(); ++k) node_params_[static_cast<size_t>(m.params[k].node)].push_back(static_cast<int>(k));
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    const Node& n = m.nodes[i];
    if (n.attrs.has("shares")) {  // every parameter of the earlier node it applies (it declares none)
      node_params_[i] = node_params_[static_cast<size_t>(m.node_index(n.attrs.text("shares")))];
      continue;
    }
    if (!n.attrs.has("tie")) continue;  // a linear or an embedding reading an embedding's table
    int owner = m.node_index(n.attrs.text("tie"));
    auto& list = node_params_[i];
    list.insert(list.begin(), node_params_[static_cast<size_t>(owner)].front());  // the embedding's weight
  }

  params_.resize(U);
  frozen_.resize(U);
  grads_.resize(U);
  gathered_.resize(U);
  staging_.resize(U);
  const bool shard_params = sharding(strategy_, world_).params;
  const bool shard_grads = sharding(strategy_, world_).grads;  // (none are kept when they stream to the host)
  host_grads_.resize(U);
  for (size_t u = 0; u < U; ++u) {
    const std::string label = m.units[u].empty() ? "root" : m.units[u];
    const int64_t shard = shard_size(static_cast<int>(u));
    // ZeRO-1/2 keep the full parameters padded so the updated shards are
    // all-gathered in place; DDP keeps them unpadded. Under offload the host
    // pool holds what step_program.hpp's host_state_tensors lists, in its order.
    if (params_on_host()) params_[u] = host->zeros({shard}, dtype_, Category::params, label + " parameters (host)");
    else params_[u] = alloc.zeros({shard_params ? shard : padded_[u]}, dtype_, Category::params, label + " parameters");
    if (frozen_size_[u] > 0)  // as model_state_tensors lists it, right after the unit's parameters
      frozen_[u] = alloc.zeros({shard_params ? frozen_shard(static_cast<int>(u)) : frozen_padded_[u]}, dtype_,
                               Category::params, label + " frozen parameters");
    if (!streams_grads_)
      grads_[u] = alloc.zeros({shard_grads ? shard : size_[u]}, dtype_, Category::grads, label + " gradients");
    if (offload_ != Offload::none)
      host_grads_[u] = host->zeros({shard}, DType::f32, Category::grads, label + " gradients (host, fp32)");
  }
  buffers_.resize(m.nodes.size());
  for (const auto& b : m.buffers) {
    Tensor t = alloc.zeros({b.numel}, DType::f32, Category::params, b.name);
    if (b.name.size() >= 11 && b.name.compare(b.name.size() - 11, 11, "running_var") == 0) {
      const std::vector<float> ones(static_cast<size_t>(b.numel), 1.0f);  // built on the host, then uploaded
      ops_->upload_floats(t.span(), ones.data());
    }
    buffers_[static_cast<size_t>(b.node)].push_back(t);
  }
  initialize(m, seed);
}

// Deterministic initialisation keyed by (seed, parameter index, element), the
// same on every rank and for every strategy; each rank keeps what it owns.
// The index counts the model's own parameters first and LoRA's adapters
// after them, so that an adapted model starts from the same base weights.
// Each unit is built in a host buffer (zeros where nothing is owned, like the
// padding), then uploaded.
void ParamStore::initialize(const Model& m, uint64_t seed) {
  const uint64_t init_seed = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
  const bool shard_params = sharding(strategy_, world_).params;
  std::vector<int> key(m.params.size());
  int next = 0;
  for (int adapters = 0; adapters < 2; ++adapters)
    for (size_t k = 0; k < m.params.size(); ++k)
      if (m.params[k].adapter == (adapters == 1)) key[k] = next++;
  for (size_t run = 0; run < 2 * params_.size(); ++run) {
    const size_t unit = run / 2;
    const bool frozen_run = run % 2 == 1;
    Tensor& target = frozen_run ? frozen_[unit] : params_[unit];
    if (!target.defined()) continue;
    std::vector<float> dst(static_cast<size_t>(target.numel()), 0.0f);
    for (size_t k = 0; k < m.params.size(); ++k) {
      auto [u, off] = where_[k];
      if (static_cast<size_t>(u) != unit || (frozen_param_[k] != 0) != frozen_run) continue;
      const ParamInfo& p = m.params[k];
      const Node& n = m.nodes[static_cast<size_t>(p.node)];
      const std::string suffix = p.name.substr(n.name.size() + 1);
      const Init init = init_of(n, suffix);
      const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in(m, n, suffix)));
      const int64_t lo = shard_params ? (frozen_run ? rank_ * frozen_shard(u) : shard_offset(u)) : 0;
      const int64_t hi = lo + static_cast<int64_t>(dst.size());
      for (int64_t e = 0; e < p.numel; ++e) {
        const int64_t flat = off + e;
        if (flat < lo || flat >= hi) continue;
        float v = 0;
        switch (init) {
          case Init::uniform_fan_in:
            v = static_cast<float>((2.0 * dropout_uniform(init_seed, key[k], 0, e) - 1.0) * bound);
            break;
          case Init::normal_002: {  // Box-Muller
            double u1 = std::max(1e-12, static_cast<double>(dropout_uniform(init_seed, key[k], 1, e)));
            double u2 = dropout_uniform(init_seed, key[k], 2, e);
            v = static_cast<float>(0.02 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
            break;
          }
          case Init::ones: v = 1.0f; break;
          case Init::zeros: v = 0.0f; break;
          case Init::quarter: v = 0.25f; break;
        }
        dst[static_cast<size_t>(flat - lo)] = v;
      }
    }
    ops_->upload_floats(target.span(), dst.data());  // rounded once under bf16-mixed
  }
}

const Tensor& ParamStore::full_unit(int u) const {
  if (sharding(strategy_, world_).params) return gathered_[static_cast<size_t>(u)];
  return params_[static_cast<size_t>(u)];
}

const Tensor& ParamStore::grad_target(int u) const {
  if (stages_grads_) return staging_[static_cast<size_t>(u)];
  return grads_[static_cast<size_t>(u)];
}

Tensor ParamStore::frozen_view(int u, int64_t off, int64_t n) const {
  if (sharding(strategy_, world_).params) {  // after the trainable run in the gathered unit
    const Tensor& g = gathered_[static_cast<size_t>(u)];
    return g.defined() ? g.slice(unit_padded(u) + off, {n}) : Tensor{};
  }
  return frozen_[static_cast<size_t>(u)].slice(off, {n});
}

std::vector<Tensor> ParamStore::param_views(int node) const {
  std::vector<Tensor> v;
  for (int k : node_params_[static_cast<size_t>(node)]) {
    auto [u, off] = where_[static_cast<size_t>(k)];
    if (frozen_param_[static_cast<size_t>(k)]) {
      v.push_back(frozen_view(u, off, m_.params[static_cast<size_t>(k)].numel));
      continue;
    }
    const Tensor& base = full_unit(u);
    v.push_back(base.defined() ? base.slice(off, {m_.params[static_cast<size_t>(k)].numel}) : Tensor{});
  }
  return v;
}

std::vector<Tensor> ParamStore::grad_views(int node) const {
  std::vector<Tensor> v;
  for (int k : node_params_[static_cast<size_t>(node)]) {
    auto [u, off] = where_[static_cast<size_t>(k)];
    if (frozen_param_[static_cast<size_t>(k)]) {  // no gradient: the op skips it
      v.emplace_back();
      continue;
    }
    const Tensor& base = grad_target(u);
    v.push_back(base.defined() ? base.slice(off, {m_.params[static_cast<size_t>(k)].numel}) : Tensor{});
  }
  return v;
}

std::vector<Tensor> ParamStore::buffer_views(int node) const { return buffers_[static_cast<size_t>(node)]; }

int64_t ParamStore::owned_begin(int u) const { return shard_offset(u); }

int64_t ParamStore::owned_size(int u) const {
  return std::max<int64_t>(0, std::min(shard_offset(u) + shard_size(u), unit_size(u)) - shard_offset(u));
}

Span ParamStore::owned_params(int u) {
  const Span p = params_[static_cast<size_t>(u)].span();
  return p.sub(sharding(strategy_, world_).params ? 0 : owned_begin(u), owned_size(u));
}

Span ParamStore::owned_grads(int u) const {
  if (offload_ != Offload::none) return host_grads(u).sub(0, owned_size(u));
  return device_owned_grads(u);
}

Span ParamStore::device_owned_grads(int u) const {
  const Span g = grads_[static_cast<size_t>(u)].span();
  return g.sub(sharding(strategy_, world_).grads ? 0 : owned_begin(u), owned_size(u));
}

void ParamStore::zero_grads() {
  for (auto& g : grads_)
    if (g.defined()) ops_->zero(g.span());
  for (auto& g : host_grads_)  // host memory: plain stores
    if (g.defined()) std::memset(g.data(), 0, static_cast<size_t>(g.bytes()));
}

std::vector<float> ParamStore::snapshot_full_params(const std::function<void(float*, int64_t)>& gather) const {
  std::vector<float> all;
  for (int u = 0; u < units(); ++u) {
    std::vector<float> unit(static_cast<size_t>(unit_padded(u)), 0.0f);
    const Span p = params_[static_cast<size_t>(u)].span();
    if (sharding(strategy_, world_).params) {
      ops_->download_floats(unit.data() + shard_offset(u), p.sub(0, shard_size(u)));
      gather(unit.data(), unit_padded(u));  // exact: the shards widened to fp32 first
    } else {
      ops_->download_floats(unit.data(), p.sub(0, unit_size(u)));
    }
    all.insert(all.end(), unit.begin(), unit.begin() + unit_size(u));
    if (frozen_size(u) == 0) continue;
    std::vector<float> fz(static_cast<size_t>(frozen_padded(u)), 0.0f);  // then the frozen run
    const Span f = frozen_[static_cast<size_t>(u)].span();
    if (sharding(strategy_, world_).params) {
      ops_->download_floats(fz.data() + rank_ * frozen_shard(u), f.sub(0, frozen_shard(u)));
      gather(fz.data(), frozen_padded(u));
    } else {
      ops_->download_floats(fz.data(), f.sub(0, frozen_size(u)));
    }
    all.insert(all.end(), fz.begin(), fz.begin() + frozen_size(u));
  }
  return all;
}

}  // namespace dlplan::exec
