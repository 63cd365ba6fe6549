// The step walk: see step_walk.hpp. The rules below are the executor's rules;
// DESIGN.md ("Memory categories", "Strategies") states them in prose.
//
//  - Persistent: params (+ BN buffers, fp32), grads, optimizer state, as the
//    strategy keeps them (model_states), and the batch (workspace).
//  - Forward: an op's temporaries (and the GEMM library workspace) live while it
//    runs; its output lives until its last consumer ran, or, if some op keeps it
//    for backward, until that op's backward ran (then it counts as activations,
//    else workspace). Own saved tensors (statistics, probabilities, masks) live
//    until the op's backward.
//  - Checkpointing `units`: ops inside a unit keep nothing; the unit's inputs are
//    kept instead. Backward recomputes the unit, whose saved tensors then live
//    until their op's backward.
//  - Backward: the gradient of a tensor is allocated by the first op whose
//    backward produces it and freed once its producer's backward ran.
//  - Gradient collectives go through staging buffers in `comm`: DDP buckets
//    (a flat copy, as PyTorch DDP without gradient_as_bucket_view) and ZeRO-1
//    buckets are bucket_mb; ZeRO-2 / ZeRO-3 stage one unit's full gradient
//    (FSDP's flat parameter). At most two gradient collectives are in flight;
//    compute waits for the oldest before issuing a third, and for all before
//    the optimizer. A staging buffer is freed where compute waits for it.
//  - ZeRO-3 gathers a unit's parameters (gathered) before its forward and its
//    backward, `prefetch` units ahead, and frees them after; the root unit
//    stays gathered for the whole step.
#include "dlplan/step_walk.hpp"

#include "dlplan/error.hpp"
#include "dlplan/ops.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>

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

namespace {

int64_t pad_to(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// Live-byte accounting with peak detection.
class Pool {
 public:
  Pool(StepWalk& out, const WalkOptions& opt) : out_(out), opt_(opt) {}

  int64_t alloc(Category c, int64_t bytes, std::string what, std::string holder) {
    if (bytes <= 0) return -1;
    int64_t id = next_id_++;
    cur_[static_cast<size_t>(c)] += bytes;
    if (opt_.explain) live_.emplace(id, LiveTensor{std::move(what), std::move(holder), c, bytes});
    else live_.emplace(id, LiveTensor{{}, {}, c, bytes});
    check_peak();
    return id;
  }

  void free(int64_t& id) {
    if (id < 0) return;
    auto it = live_.find(id);
    cur_[static_cast<size_t>(it->second.category)] -= it->second.bytes;
    live_.erase(it);
    id = -1;
  }

  void set_event(int e) { event_ = e; }
  void snapshot() {
    if (opt_.timeline) out_.timeline.push_back({event_, cur_});
  }

 private:
  void check_peak() {
    for (size_t c = 0; c < cur_.size(); ++c) out_.max_each[c] = std::max(out_.max_each[c], cur_[c]);
    int64_t t = total(cur_);
    if (t <= out_.peak) return;
    out_.peak = t;
    out_.at_peak = cur_;
    out_.peak_event = event_;
    if (opt_.explain) {
      out_.peak_tensors.clear();
      for (const auto& [id, lt] : live_) out_.peak_tensors.push_back(lt);
    }
  }

  StepWalk& out_;
  const WalkOptions& opt_;
  CategoryBytes cur_{};
  std::unordered_map<int64_t, LiveTensor> live_;
  int64_t next_id_ = 0;
  int event_ = -1;
};

// A gradient (or parameter) collective whose buffer compute frees on waiting.
struct InFlight {
  int comm_index;
  int64_t pool_id;
};

class Walker {
 public:
  Walker(const Model& m, const Cluster& cl, const TrainingConfig& cfg, const WalkOptions& opt, StepWalk& out)
      : m_(m), cl_(cl), cfg_(cfg), out_(out), pool_(out, opt), N_(cl.world()), b_(cfg.micro_batch), explain_(opt.explain) {
    DeclOptions dopt;
    dopt.flash_attention = cfg.attention == AttentionImpl::flash;
    for (const auto& n : m.nodes) decls_.push_back(declare(m, n, dopt));
    act_ = activation_bytes(cfg.precision);
    pbytes_ = param_bytes(cfg.precision);
    gbytes_ = grad_bytes(cfg.precision);
    index_units();
    index_params();
  }

  void run() {
    persistent();
    forward();
    backward();
    optimizer();
    out_.grad_accum = cfg_.grad_accum;
    if (!out_.peak_tensors.empty())
      std::sort(out_.peak_tensors.begin(), out_.peak_tensors.end(),
                [](const LiveTensor& a, const LiveTensor& b) { return a.bytes > b.bytes; });
  }

 private:
  // ---- indexing -----------------------------------------------------------
  bool checkpointed(int node) const {
    return cfg_.checkpointing == Checkpointing::units && m_.nodes[static_cast<size_t>(node)].unit != 0;
  }
  bool is_model_input(int t) const { return m_.tensor(t).producer < 0; }
  int64_t elem_bytes(Elem e) const {
    switch (e) {
      case Elem::compute: return act_;
      case Elem::f32: return 4;
      case Elem::i32: return 4;
      case Elem::u8: return 1;
    }
    return 4;
  }
  int64_t tensor_bytes(int t) const {
    const auto& ti = m_.tensor(t);
    return numel(ti.shape) * b_ * (ti.dtype == DType::i32 ? 4 : act_);
  }
  int64_t own_bytes(const SavedTensor& s) const { return s.numel * (s.per_batch ? 1 : b_) * elem_bytes(s.elem); }
  int saved_tensor_id(int node, const SavedTensor& s) const {
    const Node& n = m_.nodes[static_cast<size_t>(node)];
    return s.ref == SavedTensor::Ref::input ? n.inputs[static_cast<size_t>(s.input)] : n.output;
  }

  void index_units() {
    const size_t U = m_.units.size();
    unit_first_.assign(U, -1);
    unit_last_.assign(U, -1);
    for (size_t i = 0; i < m_.nodes.size(); ++i) {
      int u = m_.nodes[i].unit;
      if (unit_first_[static_cast<size_t>(u)] < 0) unit_first_[static_cast<size_t>(u)] = static_cast<int>(i);
      unit_last_[static_cast<size_t>(u)] = static_cast<int>(i);
    }
    for (size_t u = 1; u < U; ++u)
      if (unit_first_[u] >= 0) units_fwd_.push_back(static_cast<int>(u));
    std::sort(units_fwd_.begin(), units_fwd_.end(), [&](int a, int b) { return unit_first_[a] < unit_first_[b]; });
    units_bwd_ = units_fwd_;
    std::sort(units_bwd_.begin(), units_bwd_.end(), [&](int a, int b) { return unit_last_[a] > unit_last_[b]; });
  }

  void index_params() {
    unit_params_.assign(m_.units.size(), 0);
    for (const auto& p : m_.params) unit_params_[static_cast<size_t>(p.unit)] += p.numel;
    // Contributors of each parameter's gradient: its owner and tying linears.
    param_first_bwd_.resize(m_.params.size());
    param_done_bwd_.resize(m_.params.size());
    for (size_t k = 0; k < m_.params.size(); ++k) param_first_bwd_[k] = param_done_bwd_[k] = m_.params[k].node;
    for (size_t i = 0; i < m_.nodes.size(); ++i) {
      const Node& n = m_.nodes[i];
      if (n.op != OpKind::linear || !n.attrs.has("tie")) continue;
      int owner = m_.node_index(n.attrs.text("tie"));
      for (size_t k = 0; k < m_.params.size(); ++k)
        if (m_.params[k].node == owner) {
          param_first_bwd_[k] = std::max(param_first_bwd_[k], static_cast<int>(i));
          param_done_bwd_[k] = std::min(param_done_bwd_[k], static_cast<int>(i));
          tie_contrib_[static_cast<int>(i)].push_back(static_cast<int>(k));
        }
    }
    for (size_t k = 0; k < m_.params.size(); ++k) {
      params_of_node_[m_.params[k].node].push_back(static_cast<int>(k));
      params_done_at_[param_done_bwd_[k]].push_back(static_cast<int>(k));
    }
    if (cfg_.strategy == Strategy::ddp || cfg_.strategy == Strategy::zero1) make_buckets();
    if (cfg_.strategy == Strategy::zero2 || cfg_.strategy == Strategy::zero3) {
      unit_params_left_.assign(m_.units.size(), 0);
      for (const auto& p : m_.params) unit_params_left_[static_cast<size_t>(p.unit)]++;
      unit_grad_buf_.assign(m_.units.size(), -1);
    }
  }

  // DDP / ZeRO-1 buckets: parameters in the order their gradients complete in
  // backward, greedily packed up to bucket_mb (a larger parameter gets its own).
  void make_buckets() {
    std::vector<int> order(m_.params.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return param_done_bwd_[a] > param_done_bwd_[b]; });
    const double cap = cfg_.bucket_mb * 1024 * 1024;
    Bucket cur;
    for (int k : order) {
      int64_t bytes = m_.params[static_cast<size_t>(k)].numel * gbytes_;
      if (cur.bytes > 0 && static_cast<double>(cur.bytes + bytes) > cap) {
        buckets_.push_back(cur);
        cur = Bucket{};
      }
      cur.bytes += bytes;
      cur.ready_node = param_done_bwd_[k];  // non-increasing along `order`
      ++cur.params;
    }
    if (cur.bytes > 0) buckets_.push_back(cur);
    for (size_t i = 0; i < buckets_.size(); ++i) bucket_ready_at_[buckets_[i].ready_node].push_back(static_cast<int>(i));
  }

  // ---- events -------------------------------------------------------------
  int compute_event(const std::string& name, Phase ph, int node, double flops, double bytes) {
    out_.compute.push_back({name, ph, node, flops, bytes});
    int e = static_cast<int>(out_.compute.size()) - 1;
    pool_.set_event(e);
    return e;
  }
  int last_event() const { return static_cast<int>(out_.compute.size()) - 1; }

  int comm_event(std::string name, Collective op, double bytes, int group, int per_step, bool blocking = false) {
    CommEvent ev;
    ev.name = std::move(name);
    ev.op = op;
    ev.bytes = bytes;
    ev.group = group;
    ev.issue_after = last_event();
    ev.wait_before = blocking ? last_event() + 1 : -1;
    ev.blocking = blocking;
    ev.per_step = per_step;
    out_.comm.push_back(ev);
    return static_cast<int>(out_.comm.size()) - 1;
  }

  // Compute waits for the oldest gradient collective: its staging is freed.
  void wait_oldest() {
    InFlight f = inflight_.front();
    inflight_.pop_front();
    out_.comm[static_cast<size_t>(f.comm_index)].wait_before = last_event() + 1;
    pool_.free(f.pool_id);
  }
  void issue_grad_collective(std::string name, Collective op, int64_t bytes, int64_t staging_id, int per_step) {
    while (inflight_.size() >= 2) wait_oldest();
    int c = comm_event(std::move(name), op, static_cast<double>(bytes), N_, per_step);
    inflight_.push_back({c, staging_id});
  }
  void wait_all() {
    while (!inflight_.empty()) wait_oldest();
  }

  // ---- phases -------------------------------------------------------------
  void persistent() {
    CategoryBytes st = model_states(m_, N_, cfg_);
    pool_.alloc(Category::params, st[0], "parameters and buffers", "model");
    pool_.alloc(Category::grads, st[1], "gradients", "model");
    pool_.alloc(Category::optimizer, st[2], "optimizer state", "optimizer");
    for (int t : m_.inputs)
      pool_.alloc(Category::workspace, tensor_bytes(t), "batch: " + m_.tensor(t).name, "data loader");
    // The GEMM library's workspace (cuBLAS) is allocated once per handle and
    // cached for the run, as PyTorch does; 0 on the cpu device.
    bool gemms = false;
    for (const auto& d : decls_) gemms |= d.gemms > 0;
    if (gemms) pool_.alloc(Category::workspace, cl_.device.gemm_workspace_bytes, "GEMM workspace", "cuBLAS");
    if (cfg_.strategy == Strategy::zero3 && unit_params_[0] > 0 && N_ > 1) {
      int64_t bytes = pad_to(unit_params_[0], N_) * pbytes_;
      root_gathered_ = pool_.alloc(Category::gathered, bytes, "root unit parameters", "zero3");
      comm_event("root all-gather", Collective::AllGather, static_cast<double>(bytes), N_, 1);
      out_.comm.back().wait_before = 0;
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
      for (const auto& s : decls_[i].saved)
        if (s.ref != SavedTensor::Ref::own) {
          auto t = static_cast<size_t>(saved_tensor_id(static_cast<int>(i), s));
          keep_[t]++;
          add_holder(t, m_.nodes[i].name);
        }
    }
    if (cfg_.checkpointing != Checkpointing::units) return;
    unit_inputs_.assign(m_.units.size(), {});
    for (size_t i = 0; i < m_.nodes.size(); ++i) {
      int u = m_.nodes[i].unit;
      if (u == 0) continue;
      for (int t : m_.nodes[i].inputs) {
        int p = m_.tensor(t).producer;
        bool outside = p < 0 || m_.nodes[static_cast<size_t>(p)].unit != u;
        auto& list = unit_inputs_[static_cast<size_t>(u)];
        if (outside && std::find(list.begin(), list.end(), t) == list.end()) {
          list.push_back(t);
          keep_[static_cast<size_t>(t)]++;
          add_holder(static_cast<size_t>(t), "checkpoint of " + m_.units[static_cast<size_t>(u)]);
        }
      }
    }
  }

  void add_holder(size_t t, const std::string& who) {
    if (!explain_) return;
    auto& h = holders_[t];
    h += h.empty() ? who : ", " + who;
  }

  void release(int t) {
    if (is_model_input(t)) return;
    auto& k = keep_[static_cast<size_t>(t)];
    if (--k == 0 && fwd_uses_[static_cast<size_t>(t)] == 0) pool_.free(live_[static_cast<size_t>(t)]);
  }

  void op_temps(const std::vector<TempTensor>& temps, const std::string& holder,
                std::vector<int64_t>& ids) {
    for (const auto& t : temps)
      ids.push_back(pool_.alloc(Category::workspace, t.numel * b_ * elem_bytes(t.elem), holder + "." + t.what, holder));
  }

  // Runs node i's forward (or its recomputation): output, own saved tensors,
  // frees what no one needs any more.
  void run_forward_op(int i, Phase ph, std::vector<int>* uses) {
    const Node& n = m_.nodes[static_cast<size_t>(i)];
    const OpDecl& d = decls_[static_cast<size_t>(i)];
    const size_t out = static_cast<size_t>(n.output);
    std::vector<int64_t> temps;
    op_temps(d.fwd_temps, n.name, temps);
    if (live_[out] < 0) {
      Category c = keep_[out] > 0 ? Category::activations : Category::workspace;
      live_[out] = pool_.alloc(c, tensor_bytes(n.output), n.name, holders_[out].empty() ? n.name : holders_[out]);
    }
    const bool keeps = ph == Phase::recompute || !checkpointed(i);
    if (keeps)
      for (const auto& s : d.saved)
        if (s.ref == SavedTensor::Ref::own)
          own_[static_cast<size_t>(i)].push_back(pool_.alloc(Category::activations, own_bytes(s), n.name + "." + s.what, n.name));
    if (n.op == OpKind::batchnorm && syncbn_group() > 1) {
      int64_t c = m_.tensor(n.inputs[0]).shape[0];
      comm_event(n.name + " syncbn stats", Collective::AllGather, static_cast<double>(syncbn_group() * (2 * c + 1) * 4),
                 syncbn_group(), static_cast<int>(cfg_.grad_accum), true);
    }
    for (auto& id : temps) pool_.free(id);
    auto& remaining = uses ? *uses : fwd_uses_;
    for (int t : n.inputs) {
      if (is_model_input(t)) continue;
      if (--remaining[static_cast<size_t>(t)] == 0 && keep_[static_cast<size_t>(t)] == 0)
        pool_.free(live_[static_cast<size_t>(t)]);
    }
    if (remaining[out] == 0 && keep_[out] == 0) pool_.free(live_[out]);
  }

  int syncbn_group() const {
    if (!cfg_.syncbn) return 1;
    return cfg_.syncbn_group > 0 ? cfg_.syncbn_group : N_;
  }

  // ZeRO-3: gather `u` and the next `prefetch` units of `order`, starting at pos.
  void gather_units(const std::vector<int>& order, size_t pos, const char* dir) {
    if (cfg_.strategy != Strategy::zero3 || N_ == 1) return;
    for (size_t k = pos; k < order.size() && k <= pos + static_cast<size_t>(std::max(cfg_.prefetch, 0)); ++k) {
      int u = order[k];
      auto& g = gathered_.try_emplace(u, -1).first->second;
      if (g >= 0 || unit_params_[static_cast<size_t>(u)] == 0) continue;
      int64_t bytes = pad_to(unit_params_[static_cast<size_t>(u)], N_) * pbytes_;
      g = pool_.alloc(Category::gathered, bytes, m_.units[static_cast<size_t>(u)] + " parameters", "zero3");
      int c = comm_event(fmt::format("{} all-gather ({})", m_.units[static_cast<size_t>(u)], dir), Collective::AllGather,
                         static_cast<double>(bytes), N_, static_cast<int>(cfg_.grad_accum));
      gather_event_[u] = c;
    }
    // Compute waits for the unit it is about to run.
    auto it = gather_event_.find(order[pos]);
    if (it != gather_event_.end() && it->second >= 0) {
      out_.comm[static_cast<size_t>(it->second)].wait_before = last_event() + 1;
      it->second = -1;
    }
  }
  void release_gathered(int u) {
    auto it = gathered_.find(u);
    if (it != gathered_.end()) pool_.free(it->second);
  }

  void forward() {
    count_keeps();
    live_.assign(m_.tensors.size(), -1);
    own_.assign(m_.nodes.size(), {});
    for (size_t i = 0; i < m_.nodes.size(); ++i) {
      const Node& n = m_.nodes[i];
      const OpDecl& d = decls_[i];
      if (n.unit != 0 && unit_first_[static_cast<size_t>(n.unit)] == static_cast<int>(i)) {
        auto pos = std::find(units_fwd_.begin(), units_fwd_.end(), n.unit) - units_fwd_.begin();
        gather_units(units_fwd_, static_cast<size_t>(pos), "forward");
      }
      compute_event(n.name, Phase::forward, static_cast<int>(i), d.fwd_flops * static_cast<double>(b_),
                    op_traffic(static_cast<int>(i)));
      run_forward_op(static_cast<int>(i), Phase::forward, nullptr);
      if (n.unit != 0 && unit_last_[static_cast<size_t>(n.unit)] == static_cast<int>(i)) release_gathered(n.unit);
      pool_.snapshot();
    }
  }

  // Memory traffic of a forward op: inputs, output and parameters once.
  double op_traffic(int i) const {
    const Node& n = m_.nodes[static_cast<size_t>(i)];
    double bytes = static_cast<double>(tensor_bytes(n.output));
    for (int t : n.inputs) bytes += static_cast<double>(tensor_bytes(t));
    for (const auto& p : decls_[static_cast<size_t>(i)].params) bytes += static_cast<double>(p.numel * pbytes_);
    return bytes;
  }

  void recompute_unit(int u) {
    std::vector<int> uses(m_.tensors.size(), 0);
    const int first = unit_first_[static_cast<size_t>(u)], last = unit_last_[static_cast<size_t>(u)];
    for (int j = first; j <= last; ++j) {
      if (m_.nodes[static_cast<size_t>(j)].unit != u) continue;
      for (int t : m_.nodes[static_cast<size_t>(j)].inputs) uses[static_cast<size_t>(t)]++;
      for (const auto& s : decls_[static_cast<size_t>(j)].saved)
        if (s.ref != SavedTensor::Ref::own) keep_[static_cast<size_t>(saved_tensor_id(j, s))]++;
    }
    // Unit inputs are alive already and kept by the unit: their uses here must
    // not free them.
    for (int t : unit_inputs_[static_cast<size_t>(u)]) uses[static_cast<size_t>(t)] += 1 << 20;
    for (int j = first; j <= last; ++j) {
      if (m_.nodes[static_cast<size_t>(j)].unit != u) continue;
      compute_event(m_.nodes[static_cast<size_t>(j)].name, Phase::recompute, j,
                    decls_[static_cast<size_t>(j)].fwd_flops * static_cast<double>(b_), op_traffic(j));
      run_forward_op(j, Phase::recompute, &uses);
    }
  }

  void backward() {
    grad_.assign(m_.tensors.size(), -1);
    out_.backward_start = static_cast<int>(out_.compute.size());
    for (int i = static_cast<int>(m_.nodes.size()) - 1; i >= 0; --i) {
      const Node& n = m_.nodes[static_cast<size_t>(i)];
      const OpDecl& d = decls_[static_cast<size_t>(i)];
      const bool unit_entry = n.unit != 0 && unit_last_[static_cast<size_t>(n.unit)] == i;
      if (unit_entry) {
        auto pos = std::find(units_bwd_.begin(), units_bwd_.end(), n.unit) - units_bwd_.begin();
        gather_units(units_bwd_, static_cast<size_t>(pos), "backward");
        if (checkpointed(i)) recompute_unit(n.unit);
      }
      compute_event(n.name, Phase::backward, i, d.bwd_flops * static_cast<double>(b_), 2 * op_traffic(i));
      std::vector<int64_t> temps;
      op_temps(d.bwd_temps, n.name, temps);
      for (int t : n.inputs) {
        if (is_model_input(t) || m_.tensor(t).dtype != DType::f32 || grad_[static_cast<size_t>(t)] >= 0) continue;
        grad_[static_cast<size_t>(t)] = pool_.alloc(Category::workspace, tensor_bytes(t), "grad of " + m_.tensor(t).name, n.name);
      }
      param_grads(i);
      if (n.op == OpKind::batchnorm && syncbn_group() > 1) {
        int64_t c = m_.tensor(n.inputs[0]).shape[0];
        comm_event(n.name + " syncbn grads", Collective::AllReduce, static_cast<double>(2 * c * 4), syncbn_group(),
                   static_cast<int>(cfg_.grad_accum), true);
      }
      for (auto& id : temps) pool_.free(id);
      pool_.free(grad_[static_cast<size_t>(n.output)]);
      for (auto& id : own_[static_cast<size_t>(i)]) pool_.free(id);
      own_[static_cast<size_t>(i)].clear();
      for (const auto& s : d.saved)
        if (s.ref != SavedTensor::Ref::own) release(saved_tensor_id(i, s));
      if (n.unit != 0 && unit_first_[static_cast<size_t>(n.unit)] == i) {
        if (cfg_.checkpointing == Checkpointing::units)
          for (int t : unit_inputs_[static_cast<size_t>(n.unit)]) release(t);
        release_gathered(n.unit);
      }
      pool_.snapshot();
    }
    after_backward();
  }

  // Gradient production of node i's parameters, per strategy.
  void param_grads(int i) {
    std::vector<int> produced = params_of_node_[i];
    auto tie = tie_contrib_.find(i);
    if (tie != tie_contrib_.end()) produced.insert(produced.end(), tie->second.begin(), tie->second.end());
    const bool sharded_grads = cfg_.strategy == Strategy::zero2 || cfg_.strategy == Strategy::zero3;
    if (sharded_grads) {
      // The unit's full gradient is staged in comm from its first contribution.
      for (int k : produced) {
        int u = m_.params[static_cast<size_t>(k)].unit;
        if (!unit_grad_started_.count(u) && N_ > 1) {
          unit_grad_started_.insert(u);
          unit_grad_buf_[static_cast<size_t>(u)] =
              pool_.alloc(Category::comm, pad_to(unit_params_[static_cast<size_t>(u)], N_) * gbytes_,
                          m_.units[static_cast<size_t>(u)].empty() ? "root unit gradients" : m_.units[static_cast<size_t>(u)] + " gradients",
                          "reduce-scatter staging");
        }
      }
      for (int k : params_done_at_[i]) {
        int u = m_.params[static_cast<size_t>(k)].unit;
        if (--unit_params_left_[static_cast<size_t>(u)] == 0 && N_ > 1) {
          auto name = (m_.units[static_cast<size_t>(u)].empty() ? std::string("root") : m_.units[static_cast<size_t>(u)]) + " reduce-scatter";
          issue_grad_collective(name, Collective::ReduceScatter, pad_to(unit_params_[static_cast<size_t>(u)], N_) * gbytes_,
                                unit_grad_buf_[static_cast<size_t>(u)], static_cast<int>(cfg_.grad_accum));
        }
      }
      return;
    }
    if (cfg_.strategy == Strategy::ddp && N_ > 1) {
      auto it = bucket_ready_at_.find(i);
      if (it == bucket_ready_at_.end()) return;
      for (int bidx : it->second) {
        int64_t bytes = buckets_[static_cast<size_t>(bidx)].bytes;
        while (inflight_.size() >= 2) wait_oldest();  // before its staging exists
        int64_t id = pool_.alloc(Category::comm, bytes, fmt::format("bucket {}", bidx), "ddp all-reduce");
        issue_grad_collective(fmt::format("bucket {} all-reduce", bidx), Collective::AllReduce, bytes, id, 1);
      }
    }
  }

  void after_backward() {
    if (cfg_.strategy == Strategy::zero1 && N_ > 1) {
      for (size_t bidx = 0; bidx < buckets_.size(); ++bidx) {
        int64_t bytes = pad_to(buckets_[bidx].bytes / gbytes_, N_) * gbytes_;
        while (inflight_.size() >= 2) wait_oldest();
        int64_t id = pool_.alloc(Category::comm, bytes, fmt::format("bucket {}", bidx), "zero1 reduce-scatter");
        issue_grad_collective(fmt::format("bucket {} reduce-scatter", bidx), Collective::ReduceScatter, bytes, id, 1);
      }
    }
    wait_all();
    if (root_gathered_ >= 0) pool_.free(root_gathered_);
  }

  void optimizer() {
    const bool sharded = cfg_.strategy != Strategy::ddp;
    double shard = 0;
    for (size_t u = 0; u < m_.units.size(); ++u)
      shard += sharded ? static_cast<double>(pad_to(unit_params_[u], N_) / N_) : static_cast<double>(unit_params_[u]);
    // Bytes touched per parameter by the update: read grad, master/param and
    // moments, write them back (fused kernel).
    double per_param = 2.0 * optimizer_bytes_per_param(cfg_.precision, cfg_.optimizer.kind) + gbytes_ + 2.0 * pbytes_;
    compute_event("optimizer", Phase::optimizer, -1, 10.0 * shard, per_param * shard);
    if ((cfg_.strategy == Strategy::zero1 || cfg_.strategy == Strategy::zero2) && N_ > 1)
      for (size_t u = 0; u < m_.units.size(); ++u)
        if (unit_params_[u] > 0)
          comm_event((m_.units[u].empty() ? std::string("root") : m_.units[u]) + " parameter all-gather",
                     Collective::AllGather, static_cast<double>(pad_to(unit_params_[u], N_) * pbytes_), N_, 1);
    pool_.snapshot();
  }

  struct Bucket {
    int64_t bytes = 0;
    int ready_node = -1;
    int params = 0;
  };

  const Model& m_;
  const Cluster& cl_;
  const TrainingConfig& cfg_;
  StepWalk& out_;
  Pool pool_;
  const int64_t N_;
  const int64_t b_;
  int64_t act_ = 2, pbytes_ = 2, gbytes_ = 2;
  std::vector<OpDecl> decls_;

  std::vector<int> unit_first_, unit_last_, units_fwd_, units_bwd_;
  std::vector<int64_t> unit_params_;
  std::vector<int> param_first_bwd_, param_done_bwd_;
  std::map<int, std::vector<int>> tie_contrib_, params_of_node_, params_done_at_, bucket_ready_at_;
  std::vector<Bucket> buckets_;
  std::vector<int> unit_params_left_;
  std::vector<int64_t> unit_grad_buf_;
  std::set<int> unit_grad_started_;

  std::vector<int> keep_, fwd_uses_;
  std::vector<std::string> holders_;  // with explain: the ops keeping each tensor
  const bool explain_;
  std::vector<std::vector<int>> unit_inputs_;
  std::vector<int64_t> live_, grad_;
  std::vector<std::vector<int64_t>> own_;
  std::map<int, int64_t> gathered_;
  std::map<int, int> gather_event_;
  int64_t root_gathered_ = -1;
  std::deque<InFlight> inflight_;
};

}  // namespace

CategoryBytes model_states(const Model& m, int world, const TrainingConfig& cfg) {
  const int64_t N = world;
  std::vector<int64_t> unit_params(m.units.size(), 0);
  for (const auto& p : m.params) unit_params[static_cast<size_t>(p.unit)] += p.numel;
  int64_t full = 0, shard = 0;
  for (int64_t p : unit_params) {
    full += p;
    shard += pad_to(p, N) / N;
  }
  const int64_t pb = param_bytes(cfg.precision), gb = grad_bytes(cfg.precision);
  const int64_t ob = optimizer_bytes_per_param(cfg.precision, cfg.optimizer.kind);
  CategoryBytes s{};
  const int64_t buffers = m.buffer_count() * 4;  // fp32 running statistics, replicated
  switch (cfg.strategy) {
    case Strategy::ddp: s[0] = full * pb; s[1] = full * gb; s[2] = full * ob; break;
    case Strategy::zero1: s[0] = full * pb; s[1] = full * gb; s[2] = shard * ob; break;
    case Strategy::zero2: s[0] = full * pb; s[1] = shard * gb; s[2] = shard * ob; break;
    case Strategy::zero3: s[0] = shard * pb; s[1] = shard * gb; s[2] = shard * ob; break;
  }
  if (N == 1) s[0] = full * pb, s[1] = full * gb, s[2] = full * ob;
  s[0] += buffers;
  return s;
}

StepWalk walk_step(const Model& m, const Cluster& cluster, const TrainingConfig& cfg, const WalkOptions& opt) {
  if (cfg.micro_batch <= 0) throw Error(fmt::format("micro-batch must be positive, got {}", cfg.micro_batch));
  if (cfg.grad_accum <= 0) throw Error(fmt::format("gradient accumulation must be positive, got {}", cfg.grad_accum));
  StepWalk out;
  Walker w(m, cluster, cfg, opt, out);
  w.run();
  return out;
}

}  // namespace dlplan
