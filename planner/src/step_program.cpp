// Builds the step program (see step_program.hpp for the rules it encodes).
#include "dlplan/step_program.hpp"

#include "dlplan/caching_allocator.hpp"
#include "dlplan/conv_window.hpp"
#include "dlplan/cpu_conv.hpp"
#include "dlplan/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>

namespace dlplan {

const char* to_string(Category c) {
  switch (c) {
    case Category::params: return "params";
    case Category::grads: return "grads";
    case Category::optimizer: return "optimizer";
    case Category::activations: return "activations";
    case Category::gathered: return "gathered";
    case Category::comm: return "comm";
    case Category::workspace: return "workspace";
  }
  return "?";
}

const char* to_string(Phase p) {
  switch (p) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::recompute: return "recompute";
    case Phase::optimizer: return "optimizer";
  }
  return "?";
}

int64_t total(const CategoryBytes& b) {
  int64_t t = 0;
  for (int64_t v : b) t += v;
  return t;
}

bool checkpointed(const Node& n, const TrainingConfig& cfg) {
  return cfg.checkpointing == Checkpointing::units && n.unit != 0;
}

int64_t pad_to(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

std::vector<int64_t> unit_parameter_counts(const Model& m) {
  std::vector<int64_t> counts(m.units.size(), 0);
  for (const auto& p : m.params) counts[static_cast<size_t>(p.unit)] += p.numel;
  return counts;
}

std::vector<int64_t> unit_trainable_counts(const Model& m) {
  std::vector<int64_t> counts(m.units.size(), 0);
  for (const auto& p : m.params)
    if (p.trainable) counts[static_cast<size_t>(p.unit)] += p.numel;
  return counts;
}

std::vector<int64_t> unit_frozen_counts(const Model& m) {
  std::vector<int64_t> counts(m.units.size(), 0);
  for (const auto& p : m.params)
    if (!p.trainable) counts[static_cast<size_t>(p.unit)] += p.numel;
  return counts;
}

CategoryBytes model_states(const Model& m, int world, const TrainingConfig& cfg) {
  const int64_t N = shard_world(cfg, world);  // hsdp: the shard group
  // Per unit, the trainable run (T) and the frozen run (F), each padded when
  // sharded: parameters count both, gradients and optimizer state only T.
  int64_t full = 0, padded = 0, shard = 0, train_full = 0, train_shard = 0;
  const std::vector<int64_t> trainable = unit_trainable_counts(m), frozen = unit_frozen_counts(m);
  for (size_t u = 0; u < trainable.size(); ++u) {
    const int64_t T = trainable[u], F = frozen[u];
    full += T + F;
    padded += pad_to(T, N) + pad_to(F, N);
    shard += pad_to(T, N) / N + pad_to(F, N) / N;
    train_full += T;
    train_shard += pad_to(T, N) / N;
  }
  const int64_t pb = param_bytes(cfg.precision), gb = grad_bytes(cfg.precision);
  const int64_t ob = optimizer_bytes_per_param(cfg.precision, cfg.optimizer.kind);
  CategoryBytes s{};
  // ZeRO-1/2 keep full parameters in padded flat buffers, so that the updated
  // shards are all-gathered in place.
  switch (within_group(cfg.strategy)) {
    case Strategy::ddp: s[0] = full * pb; s[1] = train_full * gb; s[2] = train_full * ob; break;
    case Strategy::zero1: s[0] = padded * pb; s[1] = train_full * gb; s[2] = train_shard * ob; break;
    case Strategy::zero2: s[0] = padded * pb; s[1] = train_shard * gb; s[2] = train_shard * ob; break;
    case Strategy::zero3: s[0] = shard * pb; s[1] = train_shard * gb; s[2] = train_shard * ob; break;
    case Strategy::hsdp2:
    case Strategy::hsdp3: break;  // not reached: within_group() maps them to zero2 / zero3
  }
  if (N == 1) s[0] = full * pb, s[1] = train_full * gb, s[2] = train_full * ob;
  if (cfg.offload != Offload::none) {  // on the host instead (host_states)
    s[2] = 0;
    if (offload_streams_grads(cfg, world)) s[1] = 0;
    if (cfg.offload == Offload::params && sharding(cfg.strategy, N).params) s[0] = 0;
  }
  s[0] += m.buffer_count() * 4;  // fp32 running statistics, replicated
  return s;
}

std::vector<StateTensor> model_state_tensors(const Model& m, int world, const TrainingConfig& cfg) {
  const int64_t N = shard_world(cfg, world);  // hsdp: the shard group
  const Sharding sh = sharding(cfg.strategy, N);
  const bool sharded = sh.optimizer, shard_params = sh.params, shard_grads = sh.grads;
  const int64_t pb = param_bytes(cfg.precision), gb = grad_bytes(cfg.precision);
  const std::vector<int64_t> sizes = unit_trainable_counts(m), frozen = unit_frozen_counts(m);
  std::vector<StateTensor> out;
  auto shard = [&](int64_t size) { return sharded ? pad_to(size, N) / N : size; };
  // ZeRO-1/2 keep the full parameters padded, so the updated shards are all-gathered in place.
  auto params = [&](int64_t size) { return shard_params ? shard(size) : sharded ? pad_to(size, N) : size; };
  for (size_t u = 0; u < sizes.size(); ++u) {
    const std::string unit = m.units[u].empty() ? "root" : m.units[u];
    if (!(cfg.offload == Offload::params && shard_params)) {
      out.push_back({Category::params, params(sizes[u]) * pb, unit + " parameters"});
      if (frozen[u] > 0) out.push_back({Category::params, params(frozen[u]) * pb, unit + " frozen parameters"});
    }
    if (!offload_streams_grads(cfg, world))
      out.push_back({Category::grads, (shard_grads ? shard(sizes[u]) : sizes[u]) * gb, unit + " gradients"});
  }
  for (const auto& b : m.buffers) out.push_back({Category::params, b.numel * 4, b.name});  // fp32, replicated
  if (cfg.offload != Offload::none) return out;  // the optimizer state is on the host
  const bool master = mixed(cfg.precision);
  const bool moment1 = cfg.optimizer.kind != OptimizerKind::sgd, moment2 = cfg.optimizer.kind == OptimizerKind::adamw;
  for (size_t u = 0; u < sizes.size(); ++u) {
    const std::string unit = m.units[u].empty() ? "root" : m.units[u];
    const int64_t n = shard(sizes[u]) * 4;
    if (master) out.push_back({Category::optimizer, n, unit + " master weights"});
    if (moment1) out.push_back({Category::optimizer, n, unit + " m"});
    if (moment2) out.push_back({Category::optimizer, n, unit + " v"});
  }
  return out;
}

std::vector<StateTensor> host_state_tensors(const Model& m, int world, const TrainingConfig& cfg) {
  std::vector<StateTensor> out;
  if (cfg.offload == Offload::none) return out;
  const int64_t N = shard_world(cfg, world);
  const Sharding sh = sharding(cfg.strategy, N);
  const std::vector<int64_t> sizes = unit_trainable_counts(m), frozen = unit_frozen_counts(m);
  auto shard = [&](int64_t size) { return sh.optimizer ? pad_to(size, N) / N : size; };
  for (size_t u = 0; u < sizes.size(); ++u) {
    const std::string unit = m.units[u].empty() ? "root" : m.units[u];
    if (cfg.offload == Offload::params && sh.params) {
      out.push_back({Category::params, shard(sizes[u]) * param_bytes(cfg.precision), unit + " parameters (host)"});
      if (frozen[u] > 0)
        out.push_back({Category::params, shard(frozen[u]) * param_bytes(cfg.precision), unit + " frozen parameters (host)"});
    }
    out.push_back({Category::grads, shard(sizes[u]) * 4, unit + " gradients (host, fp32)"});
  }
  const bool moment1 = cfg.optimizer.kind != OptimizerKind::sgd, moment2 = cfg.optimizer.kind == OptimizerKind::adamw;
  for (size_t u = 0; u < sizes.size(); ++u) {
    const std::string unit = m.units[u].empty() ? "root" : m.units[u];
    const int64_t n = shard(sizes[u]) * 4;
    out.push_back({Category::optimizer, n, unit + " master weights (host)"});
    if (moment1) out.push_back({Category::optimizer, n, unit + " m (host)"});
    if (moment2) out.push_back({Category::optimizer, n, unit + " v (host)"});
  }
  return out;
}

CategoryBytes host_states(const Model& m, int world, const TrainingConfig& cfg) {
  CategoryBytes s{};
  for (const StateTensor& t : host_state_tensors(m, world, cfg)) s[static_cast<size_t>(t.category)] += t.bytes;
  return s;
}

namespace {

class Emitter {
 public:
  Emitter(const Model& m, const Cluster& cl, const TrainingConfig& cfg, bool names, StepProgram& out)
      : m_(m), cl_(cl), cfg_(cfg), names_(names), out_(out), N_(cl.world()), S_(shard_world(cfg, cl.world())),
        b_(cfg.micro_batch) {
    DeclOptions dopt;
    dopt.flash_attention = cfg.attention == AttentionImpl::flash;
    for (const auto& n : m.nodes) out_.decls.push_back(declare(m, n, dopt));
    out_.instrs.reserve(m.nodes.size() * 16 + 64);
    out_.compute.reserve(m.nodes.size() * 3 + 1);
    act_ = activation_bytes(cfg.precision);
    pbytes_ = param_bytes(cfg.precision);
    gbytes_ = grad_bytes(cfg.precision);
    unit_params_ = unit_trainable_counts(m);  // gradients and their collectives
    unit_frozen_ = unit_frozen_counts(m);
    index_units();
    index_params();
    analyze_gradients();
    lower_cpu_convolutions();
  }

  void run() {
    persistent();
    forward();
    backward();
    optimizer();
  }

 private:
  const OpDecl& decl(int i) const { return out_.decls[static_cast<size_t>(i)]; }
  const Node& node(int i) const { return m_.nodes[static_cast<size_t>(i)]; }
  bool checkpointed(int i) const { return dlplan::checkpointed(node(i), cfg_); }
  bool is_model_input(int t) const { return m_.tensor(t).producer < 0; }
  int64_t elem_bytes(Elem e) const { return dlplan::elem_bytes(e, act_); }
  int64_t tensor_bytes(int t) const {
    const auto& ti = m_.tensor(t);
    if (ti.producer >= 0 && node(ti.producer).op == OpKind::cross_entropy) return 4;  // the loss: one fp32 scalar
    return numel(ti.shape) * (ti.batched ? b_ : 1) * (ti.dtype == DType::i32 ? 4 : act_);
  }
  // The samples node i computes for: the micro-batch, or one tensor for it
  // all when its output has no batch axis (TensorInfo::batched).
  int64_t samples(int i) const { return m_.output_of(node(i)).batched ? b_ : 1; }
  int64_t own_bytes(const SavedTensor& s) const { return s.numel * (s.per_batch ? 1 : b_) * elem_bytes(s.elem); }
  int saved_tensor_id(int i, const SavedTensor& s) const {
    return s.ref == SavedTensor::Ref::input ? node(i).inputs[static_cast<size_t>(s.input)] : node(i).output;
  }
  // --fusion eager's slices, selects, reshapes and flattens are PyTorch's views
  // (their `view` attribute, ops_schema.cpp): an op that keeps one for
  // backward keeps the storage it was made from, as autograd does. The
  // tensor whose storage t shares, through views of views.
  bool is_view(int i) const {
    const Node& n = node(i);
    return (n.op == OpKind::slice || n.op == OpKind::reshape || n.op == OpKind::flatten || n.op == OpKind::select) &&
           n.attrs.has("view") && n.attrs.flag("view");
  }
  int storage_of(int t) const {
    for (int p = m_.tensor(t).producer; p >= 0 && is_view(p); p = m_.tensor(t).producer) t = node(p).inputs[0];
    return t;
  }
  // What node i's saved tensor s keeps alive until i's backward: the tensor,
  // or for a view the storage it shares (not within a checkpointed unit,
  // whose recomputation keeps what it makes until the unit's backward).
  int kept_tensor_id(int i, const SavedTensor& s) const {
    const int t = saved_tensor_id(i, s);
    return s.ref == SavedTensor::Ref::input && !checkpointed(i) ? storage_of(t) : t;
  }
  const std::string& unit_name(int u) const { return m_.units[static_cast<size_t>(u)]; }
  std::string unit_label(int u) const { return u == 0 ? std::string("root") : unit_name(u); }

  // ---- instructions -------------------------------------------------------
  // The bytes an allocation counts: the allocator's block. A GPU's caching
  // allocator (caching_allocator.hpp) rounds to 512 B and grants a request of
  // 10 MiB or more the whole 2 MiB-rounded segment when at most 1 MiB would be
  // left; a repeating step gets the same blocks back from its cache. The cpu
  // device pads to its granularity (1: exact).
  int64_t block_bytes(int64_t bytes) const {
    if (bytes <= 0) return 0;
    if (cl_.device.kind != "cpu" && cl_.device.alloc_granularity_bytes == kCudaMinBlock) return cuda_granted_fresh(bytes);
    return pad_to(bytes, std::max<int64_t>(1, cl_.device.alloc_granularity_bytes));
  }

  int alloc(Role role, Category c, int64_t bytes, When when = When::every) {
    bytes = block_bytes(bytes);
    Instr in;
    in.kind = Instr::Kind::alloc;
    in.when = when;
    in.slot = out_.slot_count++;
    in.role = role;
    in.category = c;
    in.bytes = bytes;
    out_.instrs.push_back(in);
    return in.slot;
  }
  Instr& last() { return out_.instrs.back(); }
  void name_last(std::string what, std::string holder) {
    if (!names_) return;
    out_.names.resize(static_cast<size_t>(out_.slot_count));
    out_.names[static_cast<size_t>(last().slot)] = {std::move(what), std::move(holder)};
  }
  void free_slot(int& slot, When when = When::every) {
    if (slot < 0) return;
    Instr in;
    in.kind = Instr::Kind::free;
    in.when = when;
    in.slot = slot;
    out_.instrs.push_back(in);
    slot = -1;
  }
  void mark() {
    Instr in;
    in.kind = Instr::Kind::mark;
    in.event = last_event();
    out_.instrs.push_back(in);
  }
  int compute(Instr::Kind kind, Phase ph, int i, double flops, double bytes) {
    out_.compute.push_back({i >= 0 ? node(i).name : "optimizer", ph, i, flops, bytes, {}, {}, false, 0, {}, i >= 0 ? samples(i) : 0});
    if (i >= 0) record_work(i, out_.compute.back());
    Instr in;
    in.kind = kind;
    in.node = i;
    in.event = last_event();
    if (kind == Instr::Kind::optimizer) in.when = When::last_micro;
    out_.instrs.push_back(in);
    return in.event;
  }
  int last_event() const { return static_cast<int>(out_.compute.size()) - 1; }

  // The op's GEMMs and attention core for the GPU time model (ComputeEvent),
  // from its shapes, for the whole micro-batch.
  void record_work(int i, ComputeEvent& ev) const {
    const Node& n = node(i);
    const double b = static_cast<double>(samples(i));
    auto in_shape = [&](size_t k) -> const Shape& { return m_.tensor(n.inputs[k]).shape; };
    auto d = [](int64_t v) { return static_cast<double>(v); };
    switch (n.op) {
      case OpKind::linear: {  // [rows, in] x [in, out]
        const Shape& x = in_shape(0);
        ev.gemms.push_back({b * d(numel(x) / x.back()), d(n.attrs.integer("out")), d(x.back()), 1});
        break;
      }
      case OpKind::matmul: {  // one [M, K] x [K, N] product per broadcast batch element
        const Shape& y = m_.output_of(n).shape;
        const int64_t M = y[y.size() - 2], N = y.back(), K = in_shape(0).back();
        ev.gemms.push_back({d(M), d(N), d(K), b * d(numel(y) / (M * N))});
        break;
      }
      case OpKind::conv2d: {  // implicit GEMM per group: [N OH OW, C/g kh kw] x [C/g kh kw, out/g]
        const Shape& x = in_shape(0);
        const Shape& y = m_.output_of(n).shape;
        const ConvWindow w = conv_window(x, n.attrs);
        const int64_t g = n.attrs.integer("groups");
        ev.gemms.push_back({b * d(numel(y) / y[0]), d(n.attrs.integer("out") / g), d(x[0] / g * w.kh * w.kw), d(g)});
        break;
      }
      case OpKind::conv_transpose2d: {  // per group: [N H W, C/g] x [C/g, out/g kh kw], then col2im
        const Shape& x = in_shape(0);
        const ConvWindow w = conv_window(x, n.attrs);
        const int64_t g = n.attrs.integer("groups");
        ev.gemms.push_back({b * d(numel(x) / x[0]), d(n.attrs.integer("out") / g * w.kh * w.kw), d(x[0] / g), d(g)});
        break;
      }
      case OpKind::lstm:
      case OpKind::gru:
      case OpKind::rnn: {  // x W_ih^T over the whole sequence, then T products h_{t-1} W_hh^T, one a step
        const Shape& x = in_shape(0);
        const int64_t H = n.attrs.integer("hidden"), dirs = n.attrs.flag("bidirectional") ? 2 : 1;
        const int64_t G = recurrent_gates(n.op) * H;
        ev.gemms.push_back({b * d(x[0]), d(G), d(x[1]), d(dirs)});
        ev.gemms.push_back({b, d(G), d(H), d(x[0] * dirs)});
        break;
      }
      case OpKind::attention: {  // QKV and output projections around the T x Tk core
        const AttentionShape a = attention_shape(m_, n);
        if (a.cross) {  // q from x, k and v from the memory
          ev.gemms.push_back({b * d(a.T), d(a.H * a.hd), d(a.D), 1});
          ev.gemms.push_back({b * d(a.Tk), d(2 * a.KV * a.hd), d(a.Dm), 1});
        } else {
          ev.gemms.push_back({b * d(a.T), d((a.H + 2 * a.KV) * a.hd), d(a.D), 1});
        }
        ev.gemms.push_back({b * d(a.T), d(a.D), d(a.H * a.hd), 1});
        ev.attention = {b * d(a.H), d(a.T), d(a.hd), a.causal, cfg_.attention == AttentionImpl::flash, a.dropout > 0,
                        d(a.Tk)};
        break;
      }
      case OpKind::moe_router: {  // [T, D] x [D, E]
        const Shape& x = m_.tensor(n.inputs[0]).shape;
        ev.gemms.push_back({b * d(x[0]), d(n.attrs.integer("experts")), d(x[1]), 1});
        break;
      }
      case OpKind::moe_expert: {  // on its C places: w1 and w3 [C, D] x [D, F], w2 [C, F] x [F, D]
        const int64_t C = moe_routing(m_, n).C, D = m_.tensor(n.inputs[0]).shape[1], F = n.attrs.integer("hidden");
        ev.gemms.push_back({b * d(C), d(F), d(D), 2});
        ev.gemms.push_back({b * d(C), d(D), d(F), 1});
        break;
      }
      default: break;
    }
    // Fine-tuning: a frozen weight has no weight-gradient GEMM, an input
    // without a gradient no input-gradient GEMM; LoRA's thin GEMMs x A^T
    // [rows, r] and (x A^T) B^T [rows, out] always compute their weight's.
    const bool dx = input_needs_grad(i, 0);
    for (GemmShape& g : ev.gemms) {
      g.input_grad = dx;
      g.weight_grad = base_trains_[static_cast<size_t>(i)];
    }
    for (const LoraAdapter& a : lora_adapters(m_, n)) {
      ev.gemms.push_back({b * d(a.rows), d(a.rank), d(a.in), 1, a.reads_context || dx, true});
      ev.gemms.push_back({b * d(a.rows), d(a.out), d(a.rank), 1, true, true});
    }
    ev.signature = signature(i);
  }

  // ComputeEvent::signature: what decides an op's kernel time apart from the
  // micro-batch. Equal signatures run the same kernels on the same shapes.
  std::string signature(int i) const {
    const Node& n = node(i);
    std::string shapes;
    for (int id : n.inputs) {
      shapes += shapes.empty() ? "[" : " [";
      const Shape& s = m_.tensor(id).shape;
      for (size_t k = 0; k < s.size(); ++k) shapes += (k ? "," : "") + std::to_string(s[k]);
      shapes += "]";
    }
    std::string grads;
    for (size_t k = 0; k < n.inputs.size(); ++k) grads += input_needs_grad(i, k) ? '1' : '0';
    std::string how = to_string(cfg_.precision);
    if (n.op == OpKind::attention) how += " " + to_string(cfg_.attention);
    if (decl(i).onednn_conv) how += " onednn";
    if (!lora_adapters(m_, n).empty()) how += " lora";
    // Attributes with sorted keys: a plan file's model lists them in another order.
    if (!m_.output_of(n).batched) how += " once";  // computed once per step, whatever the micro-batch
    return fmt::format("{} {} {} dx={} dw={} {}", to_string(n.op), shapes, nlohmann::json(n.attrs.values).dump(), grads,
                       base_trains_[static_cast<size_t>(i)] ? 1 : 0, how);
  }

  int issue(CommEvent ev, When when = When::every) {
    ev.issue_after = last_event();
    out_.comm.push_back(std::move(ev));
    Instr in;
    in.kind = Instr::Kind::issue;
    in.when = when;
    in.comm = static_cast<int>(out_.comm.size()) - 1;
    out_.instrs.push_back(in);
    return in.comm;
  }
  void wait(int c, When when = When::every) {
    out_.comm[static_cast<size_t>(c)].wait_before = last_event() + 1;
    Instr in;
    in.kind = Instr::Kind::wait;
    in.when = when;
    in.comm = c;
    out_.instrs.push_back(in);
  }

  // ---- indexing -----------------------------------------------------------
  void index_units() {
    const size_t U = m_.units.size();
    unit_first_.assign(U, -1);
    unit_last_.assign(U, -1);
    for (size_t i = 0; i < m_.nodes.size(); ++i) {
      auto u = static_cast<size_t>(m_.nodes[i].unit);
      if (unit_first_[u] < 0) unit_first_[u] = static_cast<int>(i);
      unit_last_[u] = static_cast<int>(i);
    }
    for (size_t u = 1; u < U; ++u)
      if (unit_first_[u] >= 0) units_fwd_.push_back(static_cast<int>(u));
    std::sort(units_fwd_.begin(), units_fwd_.end(), [&](int a, int b) { return unit_first_[a] < unit_first_[b]; });
    units_bwd_ = units_fwd_;
    std::sort(units_bwd_.begin(), units_bwd_.end(), [&](int a, int b) { return unit_last_[a] > unit_last_[b]; });
  }

  void index_params() {
    // A parameter's gradient is complete after the last of its contributors'
    // backward (the owner and any linear tied to it), i.e. the earliest in
    // forward order.
    std::vector<int> done(m_.params.size());
    for (size_t k = 0; k < m_.params.size(); ++k) done[k] = m_.params[k].node;
    for (size_t i = 0; i < m_.nodes.size(); ++i) {
      const Node& n = m_.nodes[i];
      // A linear or an embedding reading an embedding's table (`tie`), or a
      // node applying an earlier node's parameters (`shares`).
      const char* key = n.attrs.has("tie") ? "tie" : n.attrs.has("shares") ? "shares" : nullptr;
      if (!key) continue;
      int owner = m_.node_index(n.attrs.text(key));
      for (size_t k = 0; k < m_.params.size(); ++k)
        if (m_.params[k].node == owner) {
          done[k] = std::min(done[k], static_cast<int>(i));
          uses_[static_cast<int>(i)].push_back(static_cast<int>(k));
        }
    }
    for (size_t k = 0; k < m_.params.size(); ++k) uses_[m_.params[k].node].push_back(static_cast<int>(k));
    // Only trainable parameters have gradients (fine_tuning.hpp).
    for (const auto& [i, list] : uses_)
      for (int k : list)
        if (m_.params[static_cast<size_t>(k)].trainable) contributes_[i].push_back(k);
    for (size_t k = 0; k < m_.params.size(); ++k)
      if (m_.params[k].trainable) params_done_at_[done[k]].push_back(static_cast<int>(k));
    unit_params_left_.assign(m_.units.size(), 0);
    for (const auto& p : m_.params)
      if (p.trainable) unit_params_left_[static_cast<size_t>(p.unit)]++;
    unit_staging_.assign(m_.units.size(), -1);
    if (cfg_.strategy == Strategy::ddp) make_buckets(done);
  }

  // Which tensors need a gradient and which nodes a backward (fine-tuning:
  // fine_tuning.hpp). A tensor needs one when its producer has a trainable
  // parameter or an input that needs one; the declarations then lose what
  // only the skipped gradients would read (ops.hpp, restrict_to_needs).
  // Without fine-tuning every node runs its backward, as declared.
  void analyze_gradients() {
    const bool fine_tuned = cfg_.fine_tuning.active();
    tensor_grad_.assign(m_.tensors.size(), true);
    node_bwd_.assign(m_.nodes.size(), true);
    unit_bwd_.assign(m_.units.size(), true);
    base_trains_.assign(m_.nodes.size(), true);
    if (!fine_tuned) return;
    for (int t : m_.inputs) tensor_grad_[static_cast<size_t>(t)] = false;
    std::fill(unit_bwd_.begin(), unit_bwd_.end(), false);
    for (size_t i = 0; i < m_.nodes.size(); ++i) {
      const Node& n = m_.nodes[i];
      GradNeeds g;
      for (int t : n.inputs) g.inputs.push_back(tensor_grad_[static_cast<size_t>(t)] && m_.tensor(t).dtype == DType::f32);
      g.base = false;
      if (auto it = uses_.find(static_cast<int>(i)); it != uses_.end())
        for (int k : it->second) {
          const ParamInfo& p = m_.params[static_cast<size_t>(k)];
          g.base = g.base || (p.trainable && !p.adapter);
        }
      OpDecl& d = out_.decls[i];
      restrict_to_needs(m_, n, g, d);
      base_trains_[i] = g.base;
      node_bwd_[i] = needs_backward(g, d);
      tensor_grad_[static_cast<size_t>(n.output)] = node_bwd_[i];
      if (node_bwd_[i]) unit_bwd_[static_cast<size_t>(n.unit)] = true;
      if (!node_bwd_[i]) continue;
      input_grad_[static_cast<int>(i)] = g.inputs;
    }
    std::erase_if(units_bwd_, [&](int u) { return !unit_bwd_[static_cast<size_t>(u)]; });
    out_.has_backward = node_bwd_;
  }
  // The cpu device in fp32 runs a convolutional network's conv2d through
  // oneDNN over the whole micro-batch: its temporaries become oneDNN's
  // buffers, sized by oneDNN for this geometry and the rank's threads
  // (cpu_conv.hpp). Other precisions keep im2col, whose columns the engine
  // rounds to the storage dtype, and so does a model of fewer than four
  // convolutions (onednn_runs_convolutions says why).
  void lower_cpu_convolutions() {
    if (cl_.device.kind != "cpu" || cfg_.precision != Precision::fp32 || !onednn_runs_convolutions(m_)) return;
    const int threads = cpu_threads_per_rank(cl_.gpus_per_node);
    for (size_t i = 0; i < m_.nodes.size(); ++i) {
      const Node& n = m_.nodes[i];
      if (n.op != OpKind::conv2d) continue;
      const Shape& y = m_.tensor(n.output).shape;
      const ConvWindow w = conv_window(m_.tensor(n.inputs[0]).shape, n.attrs);  // a 1-D one as [C, 1, L]
      const ConvGeometry g{samples(static_cast<int>(i)), w.C,  w.H,  w.W,  y[0], w.one_d ? 1 : y[1], y.back(), w.kh, w.kw, w.sh, w.sw, w.ph, w.pw,
                           n.attrs.integer("groups"), n.attrs.flag("bias"), w.dh, w.dw};
      const bool dx = !is_model_input(n.inputs[0]) && input_needs_grad(static_cast<int>(i), 0);
      const bool dw = base_trains_[i];
      auto temps = [](const std::vector<ConvBuffer>& bufs) {
        std::vector<TempTensor> t;
        for (const ConvBuffer& b : bufs) t.push_back({b.what, (b.bytes + 3) / 4, Elem::f32, true});
        return t;
      };
      const auto fwd = onednn_conv_forward_buffers(g, threads);
      const auto bwd = node_bwd_[i] ? onednn_conv_backward_buffers(g, threads, dx, dw)
                                    : std::optional<std::vector<ConvBuffer>>(std::in_place);
      if (!fwd || !bwd) continue;  // oneDNN has no kernel for it: im2col
      OpDecl& d = out_.decls[i];
      d.onednn_conv = true;
      d.fwd_temps = temps(*fwd);
      d.bwd_temps = temps(*bwd);
    }
  }

  bool input_needs_grad(int i, size_t k) const {
    auto it = input_grad_.find(i);
    return it == input_grad_.end() || (k < it->second.size() && it->second[k]);
  }

  // DDP buckets: parameters in the order their gradients complete in
  // backward, greedily packed up to bucket_mb (a larger parameter gets its own).
  void make_buckets(const std::vector<int>& done) {
    std::vector<int> order;
    for (size_t k = 0; k < m_.params.size(); ++k)
      if (m_.params[k].trainable) order.push_back(static_cast<int>(k));
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return done[static_cast<size_t>(a)] > done[static_cast<size_t>(b)]; });
    const double cap = cfg_.bucket_mb * 1024 * 1024;
    Bucket cur;
    for (int k : order) {
      int64_t n = m_.params[static_cast<size_t>(k)].numel;
      if (cur.elements > 0 && static_cast<double>((cur.elements + n) * gbytes_) > cap) {
        out_.buckets.push_back(cur);
        cur = Bucket{};
      }
      cur.params.push_back(k);
      cur.elements += n;
      cur.ready_node = done[static_cast<size_t>(k)];  // non-increasing along `order`
    }
    if (cur.elements > 0) out_.buckets.push_back(cur);
    for (size_t i = 0; i < out_.buckets.size(); ++i) bucket_ready_at_[out_.buckets[i].ready_node].push_back(static_cast<int>(i));
  }

  // ---- gradient collectives: at most two in flight ------------------------
  void wait_oldest(When when) {
    auto [c, slot] = inflight_.front();
    inflight_.pop_front();
    wait(c, when);
    free_slot(slot, when);
    if (out_.comm[static_cast<size_t>(c)].purpose == CommPurpose::unit_reduce_scatter) all_reduce_across_groups(c);
  }
  // Hybrid sharding: once a unit's gradient shard is reduced in its group
  // (and, with accumulation, summed over the micro-batches), it is
  // all-reduced in place with the same shard of the other N/G groups: ranks
  // r, r+G, r+2G, ... (PyTorch FSDP HYBRID_SHARD; DeepSpeed MiCS). The
  // optimizer waits for all of them.
  void all_reduce_across_groups(int reduce_scatter) {
    if (!hybrid(cfg_.strategy) || N_ / S_ <= 1) return;
    const CommEvent& rs = out_.comm[static_cast<size_t>(reduce_scatter)];
    const int u = rs.unit;
    CommEvent ev{.name = unit_label(u) + " all-reduce across groups",
                 .op = Collective::AllReduce,
                 .purpose = CommPurpose::shard_all_reduce,
                 // under offload, the host's fp32 shard (all micro-batches summed there)
                 .bytes = static_cast<double>(pad_to(unit_params_[static_cast<size_t>(u)], S_) / S_ *
                                              (cfg_.offload != Offload::none ? 4 : gbytes_)),
                 .group = static_cast<int>(N_ / S_),
                 .stride = static_cast<int>(S_),
                 .unit = u};
    replica_inflight_.push_back(issue(ev, When::last_micro));
  }
  void make_room(When when) {
    while (inflight_.size() >= 2) wait_oldest(when);
  }
  void issue_grad(CommEvent ev, int slot, When when) {
    make_room(when);
    ev.slot = slot;
    int c = issue(std::move(ev), when);
    inflight_.push_back({c, slot});
  }

  // ---- phases -------------------------------------------------------------
  void persistent() {
    // Persistent: allocated once (the first micro-batch), never freed in the
    // step; one allocation per tensor the executor makes (rounded alike).
    for (const StateTensor& t : model_state_tensors(m_, static_cast<int>(N_), cfg_)) {
      alloc(Role::model_states, t.category, t.bytes, When::first_micro);
      name_last(t.what, t.category == Category::optimizer ? "optimizer" : "model");
    }
    bool gemms = false;
    for (const auto& d : out_.decls) gemms |= d.gemms > 0;
    if (gemms) {
      // The GEMM library's workspace (cuBLAS) is allocated once per handle
      // and cached for the run, as PyTorch does; 0 on the cpu device.
      alloc(Role::gemm_workspace, Category::workspace, cl_.device.gemm_workspace_bytes, When::first_micro);
      name_last("GEMM workspace", "cuBLAS");
    }
    if (sharding(cfg_.strategy, S_).params && gathered_elements(0) > 0) {
      const int64_t bytes = gathered_elements(0) * pbytes_;
      root_gathered_ = alloc(Role::gathered, Category::gathered, bytes, When::first_micro);
      last().unit = 0;
      name_last("root unit parameters", "zero3");
      CommEvent ev{.name = "root all-gather",
                   .op = Collective::AllGather,
                   .purpose = CommPurpose::root_gather,
                   .bytes = static_cast<double>(bytes),
                   .group = static_cast<int>(S_),
                   .unit = 0,
                   .slot = root_gathered_,
                   .host_copy_bytes = offloaded_shard_bytes(0)};
      int c = issue(ev, When::first_micro);
      wait(c, When::first_micro);
    }
    for (int t : m_.inputs) {
      batch_slots_.push_back(alloc(Role::batch_input, Category::workspace, tensor_bytes(t)));
      last().tensor = t;
      name_last("batch: " + m_.tensor(t).name, "data loader");
    }
  }

  // Reasons to keep each tensor after its forward consumers ran.
  void count_keeps() {
    keep_.assign(m_.tensors.size(), 0);
    holders_.assign(m_.tensors.size(), {});
    fwd_uses_.assign(m_.tensors.size(), 0);
    for (size_t i = 0; i < m_.nodes.size(); ++i) {
      for (int t : m_.nodes[i].inputs) fwd_uses_[static_cast<size_t>(t)]++;
      if (checkpointed(static_cast<int>(i))) continue;
      for (const auto& s : out_.decls[i].saved)
        if (s.ref != SavedTensor::Ref::own) {
          const int id = saved_tensor_id(static_cast<int>(i), s);
          auto t = static_cast<size_t>(kept_tensor_id(static_cast<int>(i), s));
          keep_[t]++;
          add_holder(t, m_.nodes[i].name + (static_cast<int>(t) != id ? " (a view of it)" : ""));
        }
    }
    unit_inputs_.assign(m_.units.size(), {});
    if (cfg_.checkpointing != Checkpointing::units) return;
    for (size_t i = 0; i < m_.nodes.size(); ++i) {
      int u = m_.nodes[i].unit;
      if (u == 0 || !unit_bwd_[static_cast<size_t>(u)]) continue;  // a unit without backward is never recomputed
      for (int t : m_.nodes[i].inputs) {
        int p = m_.tensor(t).producer;
        bool outside = p < 0 || node(p).unit != u;
        auto& list = unit_inputs_[static_cast<size_t>(u)];
        if (outside && std::find(list.begin(), list.end(), t) == list.end()) {
          list.push_back(t);
          keep_[static_cast<size_t>(t)]++;
          add_holder(static_cast<size_t>(t), "checkpoint of " + unit_name(u));
        }
      }
    }
  }

  void add_holder(size_t t, const std::string& who) {
    if (!names_) return;
    auto& h = holders_[t];
    h += h.empty() ? who : ", " + who;
  }

  void release(int t) {
    if (is_model_input(t)) return;
    auto& k = keep_[static_cast<size_t>(t)];
    if (--k == 0 && fwd_uses_[static_cast<size_t>(t)] == 0) free_slot(live_[static_cast<size_t>(t)]);
  }

  void op_temps(int i, const std::vector<TempTensor>& temps, std::vector<int>& slots) {
    for (const auto& t : temps) {
      slots.push_back(alloc(Role::op_temp, Category::workspace, t.numel * (t.per_batch ? 1 : b_) * elem_bytes(t.elem)));
      last().node = i;
      name_last(node(i).name + "." + t.what, node(i).name);
    }
  }

  // Node i's forward (or its recomputation): output, own saved tensors and
  // temporaries; then frees what no one needs any more. `uses` counts the
  // remaining forward consumers (the unit's own during recomputation).
  void forward_op(int i, Phase ph, std::vector<int>& uses) {
    const Node& n = node(i);
    const OpDecl& d = decl(i);
    const auto out = static_cast<size_t>(n.output);
    if (live_[out] < 0) {
      live_[out] = alloc(Role::node_output, keep_[out] > 0 ? Category::activations : Category::workspace,
                         tensor_bytes(n.output));
      last().tensor = n.output;
      name_last(n.name, holders_[out].empty() ? n.name : holders_[out]);
    }
    compute(ph == Phase::recompute ? Instr::Kind::recompute : Instr::Kind::forward, ph, i,
            d.fwd_flops * static_cast<double>(samples(i)), traffic(i));
    std::vector<int> temps;
    op_temps(i, d.fwd_temps, temps);
    // A node without backward (fine-tuning's frozen prefix) keeps nothing:
    // its own tensors are temporaries, as in a checkpointed unit's first forward.
    const bool keep = (ph == Phase::recompute || !checkpointed(i)) && node_bwd_[static_cast<size_t>(i)];
    for (size_t k = 0, own = 0; k < d.saved.size(); ++k) {
      const auto& s = d.saved[k];
      if (s.ref != SavedTensor::Ref::own) continue;
      if (!keep) {
        // The no-grad forward of a checkpointed unit (or of a node without
        // backward): the op still makes the tensor (attention's
        // probabilities, norm statistics), but nothing keeps it past the op.
        temps.push_back(alloc(Role::op_temp, Category::workspace, own_bytes(s)));
        last().node = i;
        name_last(n.name + "." + s.what + (checkpointed(i) ? " (not kept: checkpointed)" : " (not kept: no backward)"),
                  n.name);
        continue;
      }
      own_[static_cast<size_t>(i)].push_back(alloc(Role::op_saved, Category::activations, own_bytes(s)));
      last().node = i;
      last().index = static_cast<int>(own++);
      name_last(n.name + "." + s.what, n.name);
    }
    if (n.op == OpKind::batchnorm && syncbn_group() > 1) {
      const double c = static_cast<double>(m_.tensor(n.inputs[0]).shape[0]);
      CommEvent ev{.name = n.name + " syncbn stats",
                   .op = Collective::AllGather,
                   .purpose = CommPurpose::syncbn,
                   .bytes = syncbn_group() * (2 * c + 1) * 4,
                   .group = syncbn_group(),
                   .blocking = true,
                   .per_step = static_cast<int>(cfg_.grad_accum)};
      out_.comm.push_back(ev);  // inside the op: no instruction of its own
      out_.comm.back().issue_after = last_event() - 1;
      out_.comm.back().wait_before = last_event();
    }
    for (auto& s : temps) free_slot(s);
    for (int t : n.inputs) {
      if (is_model_input(t)) continue;
      if (--uses[static_cast<size_t>(t)] == 0 && keep_[static_cast<size_t>(t)] == 0) free_slot(live_[static_cast<size_t>(t)]);
    }
    if (uses[out] == 0 && keep_[out] == 0) free_slot(live_[out]);
  }

  int syncbn_group() const {
    if (!cfg_.syncbn) return 1;
    return cfg_.syncbn_group > 0 ? cfg_.syncbn_group : static_cast<int>(N_);
  }

  // Memory traffic of a forward op: inputs, output and parameters once.
  double traffic(int i) const {
    const Node& n = node(i);
    double bytes = static_cast<double>(tensor_bytes(n.output));
    for (int t : n.inputs) bytes += static_cast<double>(tensor_bytes(t));
    for (const auto& p : decl(i).params) bytes += static_cast<double>(p.numel * pbytes_);
    return bytes;
  }

  // ZeRO-3: gather the unit at `pos` of `order` and the `prefetch` after it;
  // compute waits for the one it is about to run.
  void gather_units(const std::vector<int>& order, size_t pos, const char* dir) {
    if (!sharding(cfg_.strategy, S_).params) return;
    const size_t ahead = static_cast<size_t>(std::max(cfg_.prefetch, 0));
    for (size_t k = pos; k < order.size() && k <= pos + ahead; ++k) {
      const int u = order[k];
      auto& slot = gathered_.try_emplace(u, -1).first->second;
      if (slot >= 0 || gathered_elements(u) == 0) continue;
      const int64_t bytes = gathered_elements(u) * pbytes_;
      slot = alloc(Role::gathered, Category::gathered, bytes);
      last().unit = u;
      name_last(unit_name(u) + " parameters", "zero3");
      CommEvent ev{.name = fmt::format("{} all-gather ({})", unit_name(u), dir),
                   .op = Collective::AllGather,
                   .purpose = CommPurpose::unit_gather,
                   .bytes = static_cast<double>(bytes),
                   .group = static_cast<int>(S_),
                   .unit = u,
                   .slot = slot,
                   .per_step = static_cast<int>(cfg_.grad_accum),
                   .host_copy_bytes = offloaded_shard_bytes(u)};
      pending_gather_[u] = issue(ev);
    }
    auto it = pending_gather_.find(order[pos]);
    if (it != pending_gather_.end()) {
      wait(it->second);
      pending_gather_.erase(it);
    }
  }
  void release_gathered(int u) {
    auto it = gathered_.find(u);
    if (it != gathered_.end()) free_slot(it->second);
  }

  void forward() {
    count_keeps();
    live_.assign(m_.tensors.size(), -1);
    own_.assign(m_.nodes.size(), {});
    for (int i = 0; i < static_cast<int>(m_.nodes.size()); ++i) {
      const int u = node(i).unit;
      if (u != 0 && unit_first_[static_cast<size_t>(u)] == i)
        gather_units(units_fwd_, static_cast<size_t>(std::find(units_fwd_.begin(), units_fwd_.end(), u) - units_fwd_.begin()),
                     "forward");
      forward_op(i, Phase::forward, fwd_uses_);
      if (u != 0 && unit_last_[static_cast<size_t>(u)] == i) release_gathered(u);
      mark();
    }
  }

  void recompute_unit(int u) {
    std::vector<int> uses(m_.tensors.size(), 0);
    const int first = unit_first_[static_cast<size_t>(u)], last_node = unit_last_[static_cast<size_t>(u)];
    for (int j = first; j <= last_node; ++j) {
      if (node(j).unit != u) continue;
      for (int t : node(j).inputs) uses[static_cast<size_t>(t)]++;
      for (const auto& s : decl(j).saved)
        if (s.ref != SavedTensor::Ref::own) keep_[static_cast<size_t>(saved_tensor_id(j, s))]++;
    }
    // The unit's inputs are alive already and kept by the unit.
    for (int t : unit_inputs_[static_cast<size_t>(u)]) uses[static_cast<size_t>(t)] += 1 << 20;
    for (int j = first; j <= last_node; ++j)
      if (node(j).unit == u) forward_op(j, Phase::recompute, uses);
  }

  void backward() {
    grad_.assign(m_.tensors.size(), -1);
    out_.backward_start = static_cast<int>(out_.compute.size());
    for (int i = static_cast<int>(m_.nodes.size()) - 1; i >= 0; --i) {
      const Node& n = node(i);
      const OpDecl& d = decl(i);
      const int u = n.unit;
      if (u != 0 && unit_last_[static_cast<size_t>(u)] == i && unit_bwd_[static_cast<size_t>(u)]) {
        gather_units(units_bwd_, static_cast<size_t>(std::find(units_bwd_.begin(), units_bwd_.end(), u) - units_bwd_.begin()),
                     "backward");
        if (checkpointed(i)) recompute_unit(u);
      }
      std::vector<int> cut;  // views cut again from their storage for this backward
      if (node_bwd_[static_cast<size_t>(i)]) {
        cut_views(i, cut);
        backward_op(i);
      }
      for (int t : cut) free_slot(live_[static_cast<size_t>(t)]);
      issue_ready_gradients(i);
      free_slot(grad_[static_cast<size_t>(n.output)]);
      for (auto& s : own_[static_cast<size_t>(i)]) free_slot(s);
      own_[static_cast<size_t>(i)].clear();
      for (const auto& s : d.saved)
        if (s.ref != SavedTensor::Ref::own) release(kept_tensor_id(i, s));
      if (u != 0 && unit_first_[static_cast<size_t>(u)] == i) {
        if (unit_bwd_[static_cast<size_t>(u)])
          for (int t : unit_inputs_[static_cast<size_t>(u)]) release(t);
        release_gathered(u);
      }
      mark();
    }
    after_backward();
  }

  // The views node i keeps (see storage_of) were freed after their forward
  // uses, their storage kept instead. The engines need each view's values
  // for i's backward, so each is cut again from the storage, as a
  // recomputation (a slice: a copy), into a workspace tensor freed after
  // the backward. `cut` lists the tensors made here.
  void cut_views(int i, std::vector<int>& cut) {
    for (const auto& s : decl(i).saved) {
      if (s.ref != SavedTensor::Ref::input) continue;
      const int t = saved_tensor_id(i, s);
      if (kept_tensor_id(i, s) != t) cut_view(t, cut);
    }
  }
  void cut_view(int t, std::vector<int>& cut) {
    if (live_[static_cast<size_t>(t)] >= 0) return;  // alive: another holder keeps it, or cut already
    const int p = m_.tensor(t).producer;
    const int base = node(p).inputs[0], inner = m_.tensor(base).producer;
    if (inner >= 0 && is_view(inner)) cut_view(base, cut);  // a slice of a slice: the inner one first
    if (view_uses_.empty()) view_uses_.assign(m_.tensors.size(), 1 << 20);  // nothing freed by a count
    forward_op(p, Phase::recompute, view_uses_);
    cut.push_back(t);
  }

  // Node i's backward: its gradient staging, its inputs' gradients, the op.
  void backward_op(int i) {
    const Node& n = node(i);
    const OpDecl& d = decl(i);
    stage_unit_gradients(i);
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int t = n.inputs[k];
      if (is_model_input(t) || m_.tensor(t).dtype != DType::f32 || grad_[static_cast<size_t>(t)] >= 0) continue;
      if (!input_needs_grad(i, k)) continue;
      grad_[static_cast<size_t>(t)] = alloc(Role::grad, Category::workspace, tensor_bytes(t));
      last().tensor = t;
      name_last("grad of " + m_.tensor(t).name, n.name);
    }
    compute(Instr::Kind::backward, Phase::backward, i, d.bwd_flops * static_cast<double>(samples(i)), 2 * traffic(i));
    std::vector<int> temps;
    op_temps(i, d.bwd_temps, temps);
    if (n.op == OpKind::batchnorm && syncbn_group() > 1) {
      const double c = static_cast<double>(m_.tensor(n.inputs[0]).shape[0]);
      CommEvent ev{.name = n.name + " syncbn grads",
                   .op = Collective::AllReduce,
                   .purpose = CommPurpose::syncbn,
                   .bytes = 2 * c * 4,
                   .group = syncbn_group(),
                   .blocking = true,
                   .per_step = static_cast<int>(cfg_.grad_accum)};
      out_.comm.push_back(ev);
      out_.comm.back().issue_after = last_event() - 1;
      out_.comm.back().wait_before = last_event();
    }
    for (auto& s : temps) free_slot(s);
  }

  // ZeRO-2/3: a unit's full gradient is staged in comm from its first
  // contribution (zeroed: contributions accumulate).
  void stage_unit_gradients(int i) {
    if (!stages_grads(cfg_, N_)) return;
    auto it = contributes_.find(i);
    if (it == contributes_.end()) return;
    for (int k : it->second) {
      const int u = m_.params[static_cast<size_t>(k)].unit;
      if (unit_staging_[static_cast<size_t>(u)] >= 0 || unit_staged_.count(u)) continue;
      unit_staged_.insert(u);
      unit_staging_[static_cast<size_t>(u)] =
          alloc(Role::staging, Category::comm, pad_to(unit_params_[static_cast<size_t>(u)], S_) * gbytes_);
      last().unit = u;
      name_last(unit_label(u) + " gradients", "reduce-scatter staging");
    }
  }

  // After node i's backward: DDP buckets and ZeRO-2/3 units now complete.
  void issue_ready_gradients(int i) {
    if (N_ == 1 && !stages_grads(cfg_, N_)) return;
    if (cfg_.strategy == Strategy::ddp) {
      auto it = bucket_ready_at_.find(i);
      if (it == bucket_ready_at_.end()) return;
      for (int b : it->second) {
        make_room(When::last_micro);  // before its staging exists
        const int64_t bytes = out_.buckets[static_cast<size_t>(b)].elements * gbytes_;
        int slot = alloc(Role::staging, Category::comm, bytes, When::last_micro);
        name_last(fmt::format("bucket {}", b), "ddp all-reduce");
        CommEvent ev{.name = fmt::format("bucket {} all-reduce", b),
                     .op = Collective::AllReduce,
                     .purpose = CommPurpose::bucket_all_reduce,
                     .bytes = static_cast<double>(bytes),
                     .group = static_cast<int>(N_),
                     .bucket = b,
                     .slot = slot};
        last().comm = static_cast<int>(out_.comm.size());
        issue_grad(ev, slot, When::last_micro);
      }
      return;
    }
    if (!stages_grads(cfg_, N_)) return;
    auto it = params_done_at_.find(i);
    if (it == params_done_at_.end()) return;
    for (int k : it->second) {
      const int u = m_.params[static_cast<size_t>(k)].unit;
      if (--unit_params_left_[static_cast<size_t>(u)] != 0) continue;
      const int64_t bytes = pad_to(unit_params_[static_cast<size_t>(u)], S_) * gbytes_;
      CommEvent ev{.name = unit_label(u) + " reduce-scatter",
                   .op = Collective::ReduceScatter,
                   .purpose = CommPurpose::unit_reduce_scatter,
                   .bytes = static_cast<double>(bytes),
                   .group = static_cast<int>(S_),
                   .unit = u,
                   .per_step = static_cast<int>(cfg_.grad_accum),
                   // offload: the reduced shard goes down to the host
                   .host_copy_bytes = offload_streams_grads(cfg_, N_) ? static_cast<double>(bytes / S_) : 0.0};
      issue_grad(ev, unit_staging_[static_cast<size_t>(u)], When::every);
      unit_staging_[static_cast<size_t>(u)] = -1;
    }
  }

  void after_backward() {
    if (cfg_.strategy == Strategy::zero1 && N_ > 1) {
      // After backward, one unit at a time (reverse order): a padded copy of
      // its gradient is reduce-scattered; the shard comes back into grads.
      std::vector<int> order = units_bwd_;
      order.push_back(0);
      for (int u : order) {
        if (unit_params_[static_cast<size_t>(u)] == 0) continue;
        make_room(When::last_micro);
        const int64_t bytes = pad_to(unit_params_[static_cast<size_t>(u)], N_) * gbytes_;
        int slot = alloc(Role::staging, Category::comm, bytes, When::last_micro);
        last().unit = u;
        name_last(unit_label(u) + " gradients", "zero1 reduce-scatter");
        CommEvent ev{.name = unit_label(u) + " reduce-scatter",
                     .op = Collective::ReduceScatter,
                     .purpose = CommPurpose::unit_reduce_scatter,
                     .bytes = static_cast<double>(bytes),
                     .group = static_cast<int>(N_),
                     .unit = u,
                     .slot = slot};
        last().comm = static_cast<int>(out_.comm.size());
        issue_grad(ev, slot, When::last_micro);
      }
    }
    while (!inflight_.empty()) {
      // ZeRO-2/3 reduce-scatter every micro-batch (DESIGN.md), ddp and zero1 once a step.
      wait_oldest(stages_grads(cfg_, N_) ? When::every : When::last_micro);
    }
    for (int c : replica_inflight_) wait(c, When::last_micro);
    replica_inflight_.clear();
    free_slot(root_gathered_, When::last_micro);
    for (auto& s : batch_slots_) free_slot(s);
  }

  void optimizer() {
    const Sharding sh = sharding(cfg_.strategy, S_);
    const bool sharded = sh.optimizer;
    double shard = 0;
    for (int64_t p : unit_params_) shard += sharded ? static_cast<double>(pad_to(p, S_) / S_) : static_cast<double>(p);
    // Bytes touched per parameter by a fused update: read grad, master/param
    // and moments, write them back.
    const double per_param = 2.0 * optimizer_bytes_per_param(cfg_.precision, cfg_.optimizer.kind) + gbytes_ + 2.0 * pbytes_;
    if (cfg_.offload == Offload::none) {
      compute(Instr::Kind::optimizer, Phase::optimizer, -1, 10.0 * shard, per_param * shard);
    } else {
      // On the host (host_state_tensors): read the fp32 gradient, read and
      // write the fp32 master and the moments; under --offload params, write
      // the parameter shard too. Over the host link: ZeRO-1's (or one
      // rank's) gradient shard down, unless backward streamed it; the
      // updated parameters up, unless they stay on the host.
      const double moments = static_cast<double>(optimizer_bytes_per_param(cfg_.precision, cfg_.optimizer.kind) -
                                                 (mixed(cfg_.precision) ? 4 : 0));
      const bool params_on_host = cfg_.offload == Offload::params && sh.params;
      const double host_bytes = 4.0 + 2.0 * (4.0 + moments) + (params_on_host ? pbytes_ : 0);
      const double link = (offload_streams_grads(cfg_, N_) ? 0.0 : gbytes_) + (params_on_host ? 0.0 : pbytes_);
      compute(Instr::Kind::optimizer, Phase::optimizer, -1, 10.0 * shard, host_bytes * shard);
      out_.compute.back().on_host = true;
      out_.compute.back().link_bytes = link * shard;
    }
    if (loss_scaled(cfg_.precision) && N_ > 1) {
      // GradScaler's found-inf check: one flag (a double) summed over every
      // rank before the update, which every rank then skips or takes alike.
      CommEvent ev{.name = "loss-scale overflow flag all-reduce",
                   .op = Collective::AllReduce,
                   .purpose = CommPurpose::overflow_flag,
                   .bytes = 8,
                   .group = static_cast<int>(N_),
                   .blocking = true};
      out_.comm.push_back(ev);  // inside the optimizer's step: no instruction of its own
      out_.comm.back().issue_after = last_event() - 1;
      out_.comm.back().wait_before = last_event();
    }
    if (sh.optimizer && !sh.params)  // ZeRO-1/2: the updated shards are all-gathered
      for (size_t u = 0; u < m_.units.size(); ++u)
        if (unit_params_[u] > 0) {
          CommEvent ev{.name = unit_label(static_cast<int>(u)) + " parameter all-gather",
                       .op = Collective::AllGather,
                       .purpose = CommPurpose::param_all_gather,
                       .bytes = static_cast<double>(pad_to(unit_params_[u], S_) * pbytes_),
                       .group = static_cast<int>(S_),
                       .unit = static_cast<int>(u)};
          issue(ev, When::last_micro);
        }
    mark();
  }

  // --offload params: a unit's shard, uploaded from the host before each gather.
  double offloaded_shard_bytes(int u) const {
    if (cfg_.offload != Offload::params) return 0;
    return static_cast<double>(gathered_elements(u) / S_ * pbytes_);
  }
  // ZeRO-3: a unit's gathered parameters, trainable and frozen runs each padded.
  int64_t gathered_elements(int u) const {
    return pad_to(unit_params_[static_cast<size_t>(u)], S_) + pad_to(unit_frozen_[static_cast<size_t>(u)], S_);
  }

  const Model& m_;
  const Cluster& cl_;
  const TrainingConfig& cfg_;
  const bool names_;
  StepProgram& out_;
  const int64_t N_;  // data-parallel ranks
  const int64_t S_;  // ranks the states are sharded over: N_, or hsdp's shard group
  const int64_t b_;
  int64_t act_ = 2, pbytes_ = 2, gbytes_ = 2;

  std::vector<int> unit_first_, unit_last_, units_fwd_, units_bwd_;
  std::vector<int64_t> unit_params_;  // trainable elements per unit
  std::vector<int64_t> unit_frozen_;  // frozen elements per unit
  std::map<int, std::vector<int>> uses_;         // node -> every parameter it reads (a tied weight too)
  std::map<int, std::vector<int>> contributes_;  // node -> the trainable ones: its gradient contributions
  std::map<int, std::vector<int>> params_done_at_, bucket_ready_at_;
  // analyze_gradients(): all true without fine-tuning.
  std::vector<bool> tensor_grad_, node_bwd_, unit_bwd_, base_trains_;
  std::map<int, std::vector<bool>> input_grad_;  // fine-tuning: node -> which inputs need a gradient
  std::vector<int> unit_params_left_, unit_staging_;
  std::set<int> unit_staged_;

  std::vector<int> keep_, fwd_uses_;
  std::vector<int> view_uses_;  // cut_view's forward: counts that never reach zero
  std::vector<std::string> holders_;
  std::vector<std::vector<int>> unit_inputs_;
  std::vector<int> live_, grad_, batch_slots_;
  std::vector<std::vector<int>> own_;
  std::map<int, int> gathered_, pending_gather_;
  int root_gathered_ = -1;
  std::deque<std::pair<int, int>> inflight_;  // (comm event, staging slot)
  std::vector<int> replica_inflight_;         // hsdp: all-reduces across groups, waited before the optimizer
};

}  // namespace

StepProgram build_step_program(const Model& m, const Cluster& cluster, const TrainingConfig& cfg, bool with_names) {
  if (cfg.micro_batch <= 0) throw Error(fmt::format("micro-batch must be positive, got {}", cfg.micro_batch));
  if (cfg.grad_accum <= 0) throw Error(fmt::format("gradient accumulation must be positive, got {}", cfg.grad_accum));
  StepProgram p;
  Emitter e(m, cluster, cfg, with_names, p);
  e.run();
  return p;
}

}  // namespace dlplan
