// Runs the step program with real tensors. Each instruction's meaning is in
// step_program.hpp; here it becomes an allocation, an op call, a collective or
// a wait, in exactly the order the planner counted.
#include "dlplan/exec/trainer.hpp"

#include "dlplan/conv_window.hpp"
#include "dlplan/error.hpp"
#include "dlplan/ledger.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/ops.hpp"
#include "dlplan/planner.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace dlplan::exec {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What one rank sends for a collective of S bytes over n ranks (DESIGN.md).
double ring_bytes(Collective op, double S, int n) {
  const double f = (n - 1.0) / n;
  return op == Collective::AllReduce ? 2 * f * S : f * S;
}

// [b, ...per-sample shape], or [1, ...] for a tensor computed once per step.
Shape batched(const TensorInfo& t, int64_t b) {
  Shape s{t.batched ? b : 1};
  s.insert(s.end(), t.shape.begin(), t.shape.end());
  return s;
}

// A host tensor outside any allocator (freed with std::free): where the data
// source writes a batch before it is uploaded.
Tensor host_staging(const Shape& shape, DType dtype) {
  Tensor t;
  t.storage = std::make_shared<Storage>();
  t.shape = shape;
  t.dtype = dtype;
  const int64_t bytes = t.bytes();
  t.storage->data = std::aligned_alloc(64, static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64));
  if (t.storage->data == nullptr) throw Error(fmt::format("out of host memory staging {} bytes of input", bytes));
  t.storage->bytes = bytes;
  return t;
}

}  // namespace

std::optional<std::string> engine_cannot_train(const Model& m) {
  for (const Node& n : m.nodes)
    if (n.op == OpKind::opaque)
      return fmt::format("node '{}' is an op the importer does not know{}: the plan counts its memory (output, and "
                         "every input kept for backward), but no engine can run its math",
                         n.name, n.attrs.text("source").empty() ? "" : " (ONNX '" + n.attrs.text("source") + "')");
  return std::nullopt;
}

std::optional<std::string> gpu_engine_lacks(const Model& m) {
  for (const Node& n : m.nodes) {
    if (!m.output_of(n).batched ||
        std::any_of(n.inputs.begin(), n.inputs.end(), [&](int t) { return !m.tensor(t).batched; }))
      return fmt::format("node '{}' {} a tensor computed once per step from parameters (no batch axis), which the CPU "
                         "engine trains and the CUDA engine does not yet",
                         n.name, m.output_of(n).batched ? "reads" : "computes");
    if (n.op == OpKind::attention) {
      const AttentionShape a = attention_shape(m, n);
      if (a.rope && a.rotary_dim != a.hd)
        return fmt::format("node '{}' rotates {} of {} head dims (partial rotary)", n.name, a.rotary_dim, a.hd);
      if (a.cross)
        return fmt::format("node '{}' is a cross attention (T5's decoder), which the CPU engine trains and the CUDA "
                           "engine does not yet", n.name);
      if (a.bias_input >= 0)
        return fmt::format("node '{}' adds a position bias to its scores (T5), which the CPU engine trains and the CUDA "
                           "engine does not yet", n.name);
      if (n.attrs.has("scale"))
        return fmt::format("node '{}' scales its scores by {} (T5: 1), where the CUDA engine's kernels use 1/sqrt({})",
                           n.name, a.scale, a.hd);
    }
    if (n.op == OpKind::linear && n.attrs.has("scale") && n.attrs.number("scale") != 1.0)
      return fmt::format("node '{}' scales its input by {} (T5's tied head), which the CPU engine trains and the CUDA "
                         "engine does not yet", n.name, n.attrs.number("scale"));
    if (n.op == OpKind::window_position_bias || n.op == OpKind::window_mask)
      return fmt::format("node '{}' is a {} (Swin's windows), which the CPU engine trains and the CUDA engine does not "
                         "yet", n.name, to_string(n.op));
    if (n.op == OpKind::slice && n.attrs.integer("step") != 1)
      return fmt::format("node '{}' is a strided slice (Swin's patch merging), which the CPU engine trains and the CUDA "
                         "engine does not yet", n.name);
    if (n.op == OpKind::relative_position_bias)
      return fmt::format("node '{}' is a relative position bias (T5), which the CPU engine trains and the CUDA engine "
                         "does not yet", n.name);
    if (n.op == OpKind::moe_router || n.op == OpKind::moe_expert || n.op == OpKind::moe_combine)
      return fmt::format("node '{}' is part of a mixture of experts, which the CPU engine trains and the CUDA engine does "
                         "not yet", n.name);
    if (n.attrs.has("shares"))
      return fmt::format("node '{}' applies the parameters of '{}' (weights shared between layers, as ALBERT's), which "
                         "the CPU engine trains and the CUDA engine does not yet", n.name, n.attrs.text("shares"));
    if (n.op == OpKind::embedding && n.attrs.has("tie"))
      return fmt::format("node '{}' reads the table of embedding '{}' (T5's shared embedding), which the CPU engine "
                         "trains and the CUDA engine does not yet", n.name, n.attrs.text("tie"));
    if (n.op == OpKind::embedding && n.attrs.number("scale") != 1.0)
      return fmt::format("node '{}' scales its embedding by {}", n.name, n.attrs.number("scale"));
    if (n.op == OpKind::pos_embedding && n.attrs.has("sinusoidal"))
      return fmt::format("node '{}' adds fixed sinusoidal positions (XGLM's), which the CPU engine trains and the "
                         "CUDA engine does not yet", n.name);
    if (n.op == OpKind::pos_embedding && n.attrs.has("row"))
      return fmt::format("node '{}' adds one row of its table at every position (BERT's token types), which the CPU "
                         "engine trains and the CUDA engine does not yet", n.name);
    if ((n.op == OpKind::conv2d || n.op == OpKind::global_avgpool || n.op == OpKind::maxpool2d ||
         n.op == OpKind::avgpool2d) &&
        m.tensor(n.inputs[0]).shape.size() == 2)
      return fmt::format("node '{}' is a 1-D {} (over [C, L]), which the CPU engine trains and the CUDA engine does "
                         "not yet", n.name, n.op == OpKind::conv2d ? "convolution" : "pooling");
    if (n.op == OpKind::conv2d && dilated(n.attrs))
      return fmt::format("node '{}' is a dilated convolution (dilation {}), which the CPU engine trains and the CUDA "
                         "engine does not yet", n.name, n.attrs.values["dilation"].dump());
    if (n.op == OpKind::clip)
      return fmt::format("node '{}' is a clip (ReLU6, Hardtanh), which the CPU engine trains and the CUDA engine "
                         "does not yet", n.name);
    if (n.op == OpKind::avgpool2d && ((n.attrs.has("eager") && n.attrs.flag("eager")) ||
                                      (n.attrs.has("count_include_pad") && !n.attrs.flag("count_include_pad"))))
      return fmt::format("node '{}' average-pools keeping its input (--fusion eager) or without counting the padding "
                         "(count_include_pad false, PoolFormer's), which the CPU engine trains and the CUDA engine "
                         "does not yet", n.name);
    if (n.op == OpKind::maxpool2d && n.attrs.has("eager") && n.attrs.flag("eager"))
      return fmt::format("node '{}' max-pools keeping PyTorch's int64 indices and its input (--fusion eager), which the "
                         "CPU engine trains and the CUDA engine does not yet", n.name);
    if (n.op == OpKind::maxpool2d && n.attrs.has("ceil_mode") && n.attrs.flag("ceil_mode"))
      return fmt::format("node '{}' max-pools with ceil_mode (SqueezeNet), which the CPU engine trains and the CUDA "
                         "engine does not yet", n.name);
    if (n.op == OpKind::concat)
      return fmt::format("node '{}' is a concat (DenseNet, SqueezeNet), which the CPU engine trains and the CUDA engine "
                         "does not yet", n.name);
    if (n.op == OpKind::scale || n.op == OpKind::transpose || n.op == OpKind::slice)
      return fmt::format("node '{}' is a {} (ConvNeXt, ShuffleNetV2), which the CPU engine trains and the CUDA engine "
                         "does not yet", n.name, to_string(n.op));
    if (n.op == OpKind::affine || n.op == OpKind::pow || n.op == OpKind::sqrt || n.op == OpKind::reciprocal ||
        n.op == OpKind::erf || n.op == OpKind::acos ||
        n.op == OpKind::reduce_mean || n.op == OpKind::reduce_sum || n.op == OpKind::reduce_l2)
      return fmt::format("node '{}' is a {} (written-out math, imported with --fusion eager), which the CPU engine "
                         "trains and the CUDA engine does not yet", n.name, to_string(n.op));
    if (n.op == OpKind::pad)
      return fmt::format("node '{}' is a pad (Hugging Face's MobileNets' TensorFlow padding), which the CPU engine "
                         "trains and the CUDA engine does not yet", n.name);
    if (n.op == OpKind::drop_path)
      return fmt::format("node '{}' is a drop_path (stochastic depth: Swin's, SegFormer's), which the CPU engine "
                         "trains and the CUDA engine does not yet", n.name);
    if (n.op == OpKind::matmul || n.op == OpKind::softmax || n.op == OpKind::causal_mask || n.op == OpKind::alibi ||
        n.op == OpKind::rope)
      return fmt::format("node '{}' is a {} outside an attention pattern (an imported graph's own), which the CPU "
                         "engine trains and the CUDA engine does not yet", n.name, to_string(n.op));
    if (n.op == OpKind::hardsigmoid || n.op == OpKind::hardswish)
      return fmt::format("node '{}' is a {} (MobileNetV3), which the CPU engine trains and the CUDA engine does not yet",
                         n.name, to_string(n.op));
    if (n.op == OpKind::leaky_relu || n.op == OpKind::elu || n.op == OpKind::softplus || n.op == OpKind::mish ||
        n.op == OpKind::prelu || n.op == OpKind::shift || n.op == OpKind::groupnorm || n.op == OpKind::upsample ||
        n.op == OpKind::conv_transpose2d || n.op == OpKind::lstm || n.op == OpKind::gru || n.op == OpKind::rnn)
      return fmt::format("node '{}' is a {}, which the CPU engine trains and the CUDA engine does not yet", n.name,
                         to_string(n.op));
    if (n.op == OpKind::mul && m.tensor(n.inputs[0]).shape != m.tensor(n.inputs[1]).shape)
      return fmt::format("node '{}' multiplies {} by {} with broadcasting (a squeeze-and-excitation scale), which the "
                         "CPU engine trains and the CUDA engine does not yet",
                         n.name, to_string(m.tensor(n.inputs[0]).shape), to_string(m.tensor(n.inputs[1]).shape));
    if (n.op == OpKind::add && m.tensor(n.inputs[0]).shape != m.tensor(n.inputs[1]).shape)
      return fmt::format("node '{}' adds {} and {} with broadcasting, which the CPU engine trains and the CUDA engine "
                         "does not yet",
                         n.name, to_string(m.tensor(n.inputs[0]).shape), to_string(m.tensor(n.inputs[1]).shape));
    if (n.op == OpKind::rmsnorm && n.attrs.number("offset") != 0.0)
      return fmt::format("node '{}' is an RMSNorm with offset {} (Gemma's 1 + weight)", n.name, n.attrs.number("offset"));
  }
  return std::nullopt;
}

Trainer::Trainer(const LoadedPlan& plan, Communicator& comm, Backend& backend, const TrainOptions& opt,
                 std::unique_ptr<MemoryResource> memory, std::unique_ptr<DeviceOps> ops)
    : plan_(plan),
      comm_(comm),
      backend_(backend),
      opt_(opt),
      ops_(ops ? std::move(ops) : make_cpu_device_ops()),
      alloc_(memory ? std::move(memory) : make_host_memory()),
      host_alloc_(make_host_memory()),
      host_ops_(make_cpu_device_ops()) {
  const auto& c = plan.cluster;
  if (c.world() != comm.size())
    throw Error(fmt::format("{}: the plan is for {} ranks ({} node{} x {}), but {} {} launched; run mpirun -np {}", plan.path,
                            c.world(), c.nodes, c.nodes == 1 ? "" : "s", c.gpus_per_node, comm.size(),
                            comm.size() == 1 ? "was" : "were", c.world()));
  // Fine-tuning runs on the CPU engine in this version (docs/fine-tuning.md).
  if (plan.training.fine_tuning.active() && !ops_->host())
    throw Error(fmt::format("{}: the plan freezes parameters or adds LoRA adapters ({}); the CPU engine (--device cpu) "
                            "trains them in this version, the {} engine does not yet",
                            plan.path, plan.training.fine_tuning.lora_rank > 0 ? "--lora" : "--freeze", ops_->name()));
  if (auto why = engine_cannot_train(plan.model)) throw Error(fmt::format("{}: {}", plan.path, *why));
  if (!ops_->host())
    if (auto why = gpu_engine_lacks(plan.model))
      throw Error(fmt::format("{}: {}; the CPU engine (--device cpu) runs it, the {} engine does not yet", plan.path, *why,
                              ops_->name()));
  if (ops_->host() != alloc_.memory().host_visible())
    throw Error(fmt::format("the trainer's device operations ({}) and its memory ({}) disagree", ops_->name(),
                            alloc_.memory().host_visible() ? "host" : "device"));
  int64_t need = static_cast<int64_t>(static_cast<double>(plan.predicted.memory.peak) * (1 + kFragmentationMargin));
  if (plan.training.offload != Offload::none) {
    if (!ops_->host())
      throw Error(fmt::format("{}: --offload {} runs on the CPU engine (--device cpu) in this version; the {} engine "
                              "refuses it",
                              plan.path, to_string(plan.training.offload), ops_->name()));
    need += total(host_states(plan.model, c.world(), plan.training));  // the same memory, another pool
  }
  if (ops_->host()) {
    if (c.device.kind != "cpu")
      throw Error(fmt::format("{}: planned for {}; the CPU executor runs plans for the cpu device (dlplan plan --gpu cpu)",
                              plan.path, c.device.kind));
    // Does the plan fit this host? Its memory is shared by the ranks of a node.
    if (need > 0) {
      const int64_t have = host_cpu_device().memory_bytes / std::max(1, comm.local_size());
      if (need > have)
        throw Error(fmt::format("{}: the plan needs {:.2f} GiB per rank but this host offers {:.2f} GiB to each of its {} ranks",
                                plan.path, need / 1073741824.0, have / 1073741824.0, comm.local_size()));
    }
  } else {
    if (c.device.kind == "cpu")
      throw Error(fmt::format("{}: planned for the cpu device; --device {} runs plans for a GPU (dlplan plan --gpu NAME)",
                              plan.path, ops_->name()));
    // Does the plan fit the device? Its free memory (after the context and
    // cuBLAS) is shared by the ranks of this node that use it.
    const int64_t free_bytes = ops_->device_free_bytes();
    if (need > 0 && free_bytes >= 0) {
      const int devices = std::max(1, ops_->device_count());
      const int sharing = std::max(1, (comm.local_size() + devices - 1) / devices);
      const int64_t have = free_bytes / sharing;
      if (need > have)
        throw Error(fmt::format("{}: the plan needs {:.2f} GiB per rank but the GPU has {:.2f} GiB free for each of the {} "
                                "rank{} using it",
                                plan.path, need / 1073741824.0, have / 1073741824.0, sharing, sharing == 1 ? "" : "s"));
    }
  }

  // d(loss)/d(loss): one float holding 1, from the memory resource but outside
  // the accounting (as the planner counts it).
  {
    MemoryResource* mem = &alloc_.memory();
    int64_t granted = 4;
    void* p = mem->allocate(4, granted);
    if (p == nullptr) throw Error("out of memory allocating the loss gradient (4 bytes)");
    one_.storage = std::shared_ptr<Storage>(new Storage, [mem, granted](Storage* s) {
      mem->release(s->data, granted);
      s->data = nullptr;  // ~Storage frees nothing more
      delete s;
    });
    one_.storage->data = p;
    one_.storage->bytes = 4;
    const float value = 1.0f;
    ops_->upload(one_.f(), &value, sizeof value);
  }

  const TrainingConfig& t = plan.training;
  scale_.scale = t.loss_scaling.init_scale;
  program_ = build_step_program(plan.model, plan.cluster, t);
  runner_ = std::make_unique<ProgramRunner>(program_);
  slots_.resize(static_cast<size_t>(program_.slot_count));
  work_.resize(program_.comm.size());
  // The GEMM library's workspace: persistent, counted where the program
  // allocates it (workspace), held here for the trainer's life.
  for (const Instr& in : program_.instrs)
    if (in.kind == Instr::Kind::alloc && in.role == Role::gemm_workspace && in.bytes > 0) {
      gemm_workspace_ = alloc_.bytes_buffer(in.bytes, Category::workspace, "GEMM workspace (cuBLAS)");
      backend_.set_gemm_workspace(gemm_workspace_.storage->data, in.bytes);
    }
  backend_.prepare(plan.model, t.micro_batch, t.syncbn ? static_cast<int>(t.syncbn_group) : 1);
  store_ = std::make_unique<ParamStore>(plan.model, t, comm.size(), comm.rank(), alloc_, opt.seed, ops_.get(), &host_alloc_);
  // Hybrid sharding (DESIGN.md, "Strategies"): ZeRO inside contiguous groups
  // of G ranks, each gradient shard then all-reduced across the groups.
  if (const int G = store_->world(); hybrid(t.strategy) && G < comm.size()) {
    shard_group_ = comm.make_groups(G);
    replica_group_ = comm.make_strided_groups(G);
    host_shard_group_ = comm.host().make_groups(G);
    // Offload: the shards across the groups are summed where they are, on the host.
    if (store_->offloaded()) host_replica_group_ = comm.host().make_strided_groups(G);
  }
  optimizer_ = std::make_unique<Optimizer>(t.optimizer, *store_, alloc_, &host_alloc_);
  if (store_->streams_grads()) {
    int64_t largest = 0;
    for (int u = 0; u < store_->units(); ++u) largest = std::max(largest, store_->shard_size(u));
    transfer_.resize(static_cast<size_t>(largest));
  }
  data_ = make_data_source(opt.data, plan.model, opt.seed);
  if (t.syncbn && t.syncbn_group > 1) {
    syncbn_group_ = comm.make_groups(t.syncbn_group);
    syncbn_ = std::make_unique<SyncBnHooks>();
    syncbn_->group_size = t.syncbn_group;
    // The op reads the result right after: the host waits (a GPU
    // communicator's wait() would only order the compute stream).
    syncbn_->all_gather = [this](float* buf, int64_t n) {
      const int64_t all = n * syncbn_->group_size;
      syncbn_bytes_ += ring_bytes(Collective::AllGather, 4.0 * static_cast<double>(all), syncbn_->group_size);
      wait_host(comm_.all_gather(buf, all, syncbn_group_));
    };
    syncbn_->all_reduce_sum = [this](float* buf, int64_t n) {
      syncbn_bytes_ += ring_bytes(Collective::AllReduce, 4.0 * static_cast<double>(n), syncbn_->group_size);
      wait_host(comm_.all_reduce(buf, n, syncbn_group_));
    };
  }
}

Trainer::~Trainer() {
  // Every tensor goes back to the memory resource below; on a device nothing
  // may still be running on them (best effort: a destructor does not throw).
  try {
    for (auto& w : pending_param_gathers_) wait_host(w);
    ops_->synchronize();
    backend_.set_gemm_workspace(nullptr, 0);  // the backend outlives the workspace tensor
  } catch (...) {
  }
}

int64_t Trainer::samples_per_step() const {
  return plan_.training.micro_batch * plan_.training.grad_accum * comm_.size();
}

int64_t Trainer::tokens_per_sample() const { return dlplan::tokens_per_sample(plan_.model); }

StepStats Trainer::step() {
  StepStats stats;
  stats.step = step_;
  set_comm_context(fmt::format("step {}", step_ + 1));  // named by a collective that times out
  const auto start = Clock::now();
  const int A = static_cast<int>(plan_.training.grad_accum);
  const bool scaled = loss_scaled(plan_.training.precision);
  if (scaled) {
    // fp16-mixed: backward starts from d(loss)/d(loss) = S, so every gradient
    // it stores (activations' and parameters', in fp16) is S times the true
    // one, out of fp16's underflow range (GradScaler's scale(loss)).
    const float s = static_cast<float>(scale_.scale);
    ops_->upload(one_.f(), &s, sizeof s);
    stats.loss_scale = scale_.scale;
  }
  // Every step runs the program from its start, persistent allocations
  // included (the parameter store holds those tensors; the ledger re-counts).
  runner_->clear_slots();
  if (opt_.time_ops) op_seconds_.assign(program_.compute.size(), 0.0);
  for (int micro = 0; micro < A; ++micro) run_micro_batch(micro, micro == 0, micro == A - 1, stats);
  for (Tensor& t : slots_) t = Tensor{};  // what the program keeps for the next step is held elsewhere
  // The updated parameters' all-gathers (ZeRO-1/2) must land before the next
  // forward. On a GPU, wait() makes the compute stream wait for them, which
  // orders the next forward (and any download of the parameters) after them.
  const auto wait_start = Clock::now();
  for (auto& w : pending_param_gathers_) w->wait();
  pending_param_gathers_.clear();
  stats.wait_seconds += since(wait_start);
  store_->zero_grads();
  ops_->synchronize();  // the step's time includes its device work (CPU: nothing to wait for)
  if (scaled) scale_ = next_loss_scale(plan_.training.loss_scaling, scale_, stats.skipped);

  double loss = stats.loss;
  comm_.all_reduce_doubles(&loss, 1);
  stats.loss = loss / comm_.size();
  stats.comm_bytes += syncbn_bytes_;  // SyncBN's collectives run inside the ops
  syncbn_bytes_ = 0;
  stats.seconds = since(start);
  ++step_;
  // DESIGN.md: the set-up's and the first step's transients are not part of
  // the peak, so measurement restarts after the first step.
  if (step_ == started_at_ + 1 && opt_.steps > step_) {
    alloc_.reset_peak();
    runner_->ledger().reset_peak();
  }
  stats.peak_bytes = alloc_.peak();
  return stats;
}

void Trainer::run_micro_batch(int micro, bool first, bool last, StepStats& stats) {
  const Model& m = plan_.model;
  const TrainingConfig& t = plan_.training;
  const int N = comm_.size(), r = comm_.rank();
  const int64_t b = t.micro_batch;
  const int64_t global_first = step_ * samples_per_step() + (static_cast<int64_t>(micro) * N + r) * b;
  const float inv_world = 1.0f / static_cast<float>(N);
  const bool staged_grads = stages_grads(t, N);
  // Float tensors are stored in the plan's storage dtype (bf16 under bf16-mixed).
  const DType act = storage_dtype(t.precision);
  auto stored = [act](DType ir) { return ir == DType::f32 ? act : ir; };

  // Slots live for the step (a slot may outlive its micro-batch: ZeRO-3's
  // root unit is gathered in the first and freed in the last); tensor ids
  // map to slots for one micro-batch.
  std::vector<Tensor>& slots = slots_;
  std::vector<int> tensor_slot(m.tensors.size(), -1), grad_slot(m.tensors.size(), -1);
  std::vector<std::vector<Tensor>> produced(m.nodes.size());  // own saved tensors, until bound to slots
  std::vector<std::vector<int>> saved_slot(m.nodes.size());
  std::vector<WorkHandle>& work = work_;

  auto tensor_of = [&](int id) { return tensor_slot[static_cast<size_t>(id)] >= 0 ? slots[static_cast<size_t>(tensor_slot[static_cast<size_t>(id)])] : Tensor{}; };
  auto grad_of = [&](int id) { return grad_slot[static_cast<size_t>(id)] >= 0 ? slots[static_cast<size_t>(grad_slot[static_cast<size_t>(id)])] : Tensor{}; };

  auto make_context = [&](int i) {
    OpContext ctx;
    ctx.model = &m;
    ctx.node = &m.nodes[static_cast<size_t>(i)];
    ctx.node_index = i;
    ctx.decl = &program_.decls[static_cast<size_t>(i)];
    ctx.alloc = &alloc_;
    ctx.batch = m.output_of(*ctx.node).batched ? b : 1;  // once per step: one "sample"
    ctx.first_sample = global_first;
    ctx.seed = opt_.seed;
    ctx.act_dtype = act;
    for (int id : ctx.node->inputs) ctx.in.push_back(tensor_of(id));
    ctx.out = tensor_of(ctx.node->output);
    ctx.params = store_->param_views(i);
    ctx.buffers = store_->buffer_views(i);
    if (ctx.node->op == OpKind::batchnorm) ctx.syncbn = syncbn_.get();
    return ctx;
  };

  auto allocate = [&](const Instr& in) {
    Tensor out;
    switch (in.role) {
      case Role::model_states:
      case Role::gemm_workspace:
      case Role::op_temp:
        return;  // held by the parameter store / the trainer (gemm_workspace_) / the op itself
      case Role::batch_input: {
        const TensorInfo& ti = m.tensor(in.tensor);
        out = alloc_.empty(batched(ti, b), stored(ti.dtype), in.category, "batch: " + ti.name);
        int input = static_cast<int>(std::find(m.inputs.begin(), m.inputs.end(), in.tensor) - m.inputs.begin());
        Tensor host = host_staging(out.shape, ti.dtype);  // filled on the host (ids, or fp32 values), then uploaded
        data_->fill(input, host, global_first, b);
        if (ti.dtype == DType::f32) ops_->upload_floats(out.span(), host.f());  // rounded to bf16 under bf16-mixed
        else ops_->upload(out.data(), host.data(), out.bytes());
        tensor_slot[static_cast<size_t>(in.tensor)] = in.slot;
        break;
      }
      case Role::node_output: {
        const TensorInfo& ti = m.tensor(in.tensor);
        const bool loss = m.nodes[static_cast<size_t>(ti.producer)].op == OpKind::cross_entropy;
        // The loss is one fp32 scalar (DESIGN.md), whatever the precision.
        out = alloc_.empty(loss ? Shape{} : batched(ti, b), loss ? DType::f32 : stored(ti.dtype), in.category, ti.name);
        tensor_slot[static_cast<size_t>(in.tensor)] = in.slot;
        break;
      }
      case Role::op_saved: {
        auto& list = produced[static_cast<size_t>(in.node)];
        out = list.at(static_cast<size_t>(in.index));
        auto& ss = saved_slot[static_cast<size_t>(in.node)];
        if (ss.size() <= static_cast<size_t>(in.index)) ss.resize(static_cast<size_t>(in.index) + 1, -1);
        ss[static_cast<size_t>(in.index)] = in.slot;
        break;
      }
      case Role::grad: {
        const TensorInfo& ti = m.tensor(in.tensor);
        out = alloc_.empty(batched(ti, b), act, Category::workspace, "grad of " + ti.name);
        ops_->zero(out.span());  // backward accumulates into it; on the rank's threads (CPU)
        grad_slot[static_cast<size_t>(in.tensor)] = in.slot;
        break;
      }
      case Role::gathered:
        out = alloc_.empty({store_->gathered_size(in.unit)}, store_->dtype(), Category::gathered, "gathered");
        store_->set_gathered(in.unit, out);
        break;
      case Role::staging: {
        if (t.strategy == Strategy::ddp) {
          const Bucket& bk = program_.buckets[static_cast<size_t>(program_.comm[static_cast<size_t>(in.comm)].bucket)];
          out = alloc_.empty({bk.elements}, store_->dtype(), Category::comm, "bucket");
          int64_t at = 0;
          for (int k : bk.params) {  // a flat copy of the bucket's gradients
            auto [u, off] = store_->locate(k);
            const int64_t n = m.params[static_cast<size_t>(k)].numel;
            ops_->copy(out.span().sub(at, n), store_->grads(u).span().sub(off, n));
            at += n;
          }
        } else if (t.strategy == Strategy::zero1) {
          // The unit's gradients, then zeros in the padding up to a multiple of the ranks.
          const int64_t size = store_->unit_size(in.unit), padded = store_->unit_padded(in.unit);
          out = alloc_.empty({padded}, store_->dtype(), Category::comm, "zero1 staging");
          ops_->copy(out.span().sub(0, size), store_->grads(in.unit).span());
          ops_->zero(out.span().sub(size, padded - size));
        } else {
          out = alloc_.empty({store_->unit_padded(in.unit)}, store_->dtype(), Category::comm, "gradient staging");
          ops_->zero(out.span());  // backward accumulates into it
          store_->set_grad_staging(in.unit, out);
        }
        break;
      }
    }
    slots[static_cast<size_t>(in.slot)] = std::move(out);
  };

  // `a`: the allocation the program's free releases (ProgramRunner knows it).
  auto release = [&](const Instr& a) {
    if (a.role == Role::gathered) store_->set_gathered(a.unit, {});
    if (a.role == Role::staging && staged_grads) store_->set_grad_staging(a.unit, {});
    if (a.role == Role::node_output || a.role == Role::batch_input) tensor_slot[static_cast<size_t>(a.tensor)] = -1;
    if (a.role == Role::grad) grad_slot[static_cast<size_t>(a.tensor)] = -1;
    slots[static_cast<size_t>(a.slot)] = Tensor{};
  };

  auto issue = [&](int c) {
    const CommEvent& ev = program_.comm[static_cast<size_t>(c)];
    stats.comm_bytes += ring_bytes(ev.op, ev.bytes, ev.group);
    switch (ev.purpose) {
      case CommPurpose::bucket_all_reduce: {
        Tensor& buf = slots[static_cast<size_t>(ev.slot)];
        work[static_cast<size_t>(c)] = comm_.all_reduce(buf.span());
        break;
      }
      case CommPurpose::unit_reduce_scatter: {
        Tensor& buf = slots[static_cast<size_t>(ev.slot)];
        work[static_cast<size_t>(c)] =
            comm_.reduce_scatter(buf.span().sub(0, store_->unit_padded(ev.unit)), t.strategy == Strategy::zero1 ? 0 : shard_group_);
        break;
      }
      case CommPurpose::shard_all_reduce:  // in place: the reduced (and accumulated) shard
        if (store_->offloaded())  // summed on the host, in fp32
          work[static_cast<size_t>(c)] = comm_.host().all_reduce(store_->host_grads(ev.unit), host_replica_group_);
        else
          work[static_cast<size_t>(c)] = comm_.all_reduce(store_->grads(ev.unit).span(), replica_group_);
        break;
      case CommPurpose::unit_gather:
      case CommPurpose::root_gather: {
        Tensor& buf = slots[static_cast<size_t>(ev.slot)];
        const int u = ev.purpose == CommPurpose::root_gather ? 0 : ev.unit;
        const int64_t shard = store_->shard_size(u);
        const Span mine = buf.span().sub(store_->shard_offset(u), shard);
        if (store_->params_on_host()) ops_->upload(mine.data, store_->params(u).data(), mine.bytes());  // --offload params
        else ops_->copy(mine, store_->params(u).span().sub(0, shard));
        work[static_cast<size_t>(c)] = comm_.all_gather(buf.span().sub(0, store_->unit_padded(u)), shard_group_);
        if (store_->frozen_size(u) > 0) {
          // Fine-tuning: the frozen run after it, gathered the same way; the
          // program's one event waits for both.
          const int64_t fs = store_->frozen_shard(u);
          const Span frozen_all = buf.span().sub(store_->unit_padded(u), store_->frozen_padded(u));
          ops_->copy(frozen_all.sub(static_cast<int64_t>(store_->rank()) * fs, fs), store_->frozen(u).span().sub(0, fs));
          frozen_gathers_[c] = comm_.all_gather(frozen_all, shard_group_);
        }
        break;
      }
      case CommPurpose::param_all_gather:
        pending_param_gathers_.push_back(
            comm_.all_gather(store_->params(ev.unit).span().sub(0, store_->unit_padded(ev.unit)), shard_group_));
        break;
      case CommPurpose::syncbn:
        break;  // issued inside the BN op
      case CommPurpose::overflow_flag:
        break;  // issued inside the optimizer's step
    }
  };

  auto finish = [&](int c) {
    const CommEvent& ev = program_.comm[static_cast<size_t>(c)];
    const auto wait_start = Clock::now();
    // CPU: the host waits. GPU: the compute stream waits (NCCL) or the host
    // does (MPI-staged); either way the copies back below, enqueued on the
    // compute stream, come after the collective.
    work[static_cast<size_t>(c)]->wait();
    if (auto it = frozen_gathers_.find(c); it != frozen_gathers_.end()) {
      it->second->wait();
      frozen_gathers_.erase(it);
    }
    stats.wait_seconds += since(wait_start);
    if (ev.purpose == CommPurpose::bucket_all_reduce) {
      const Bucket& bk = program_.buckets[static_cast<size_t>(ev.bucket)];
      const Span src = slots[static_cast<size_t>(ev.slot)].span();
      int64_t at = 0;
      for (int k : bk.params) {  // back into the gradients, averaged over ranks
        auto [u, off] = store_->locate(k);
        const int64_t n = m.params[static_cast<size_t>(k)].numel;
        ops_->scaled_copy(store_->grads(u).span().sub(off, n), src.sub(at, n), inv_world);
        at += n;
      }
    } else if (ev.purpose == CommPurpose::unit_reduce_scatter) {
      const int u = ev.unit;
      const int64_t S = store_->shard_size(u), lo = store_->shard_offset(u);
      const Span shard = slots[static_cast<size_t>(ev.slot)].span().sub(lo, S);
      if (store_->streams_grads()) {
        // Offload: the reduced shard goes down and the host sums it in fp32
        // (micro-batches accumulate there).
        ops_->download_floats(transfer_.data(), shard);
        host_ops_->scaled_add(store_->host_grads(u), Span{transfer_.data(), S, DType::f32}, inv_world);
      } else if (t.strategy == Strategy::zero1) {
        const int64_t real = std::max<int64_t>(0, std::min(S, store_->unit_size(u) - lo));  // the padding has no gradient
        ops_->scaled_copy(store_->grads(u).span().sub(lo, real), shard.sub(0, real), inv_world);
      } else {
        ops_->scaled_add(store_->grads(u).span().sub(0, S), shard, inv_world);
      }
    }
  };

  FunctionVisitor visit;
  visit.alloc = [&](const Instr& in, bool) { allocate(in); };
  visit.free = [&](const Instr& a) { release(a); };
  auto run_instr = [&](const Instr& in) {
    switch (in.kind) {
      case Instr::Kind::forward:
      case Instr::Kind::recompute: {
        OpContext ctx = make_context(in.node);
        ctx.recompute = in.kind == Instr::Kind::recompute;
        // A node without backward (fine-tuning) keeps nothing either.
        ctx.keep_saved = (ctx.recompute || !checkpointed(*ctx.node, t)) && program_.has_backward_at(in.node);
        backend_.forward(ctx);
        // Not kept (a checkpointed unit's first forward): freed here, as the
        // program frees them with the op's temporaries.
        if (ctx.keep_saved) produced[static_cast<size_t>(in.node)] = std::move(ctx.saved);
        if (ctx.node->op == OpKind::cross_entropy && !ctx.recompute) {
          float loss = 0;
          ops_->download(&loss, ctx.out.f(), sizeof loss);
          stats.loss += static_cast<double>(loss) / static_cast<double>(t.grad_accum);
        }
        break;
      }
      case Instr::Kind::backward: {
        OpContext ctx = make_context(in.node);
        for (int s : saved_slot[static_cast<size_t>(in.node)]) ctx.saved.push_back(s >= 0 ? slots[static_cast<size_t>(s)] : Tensor{});
        produced[static_cast<size_t>(in.node)].clear();
        ctx.dout = ctx.node->op == OpKind::cross_entropy ? one_ : grad_of(ctx.node->output);
        for (int id : ctx.node->inputs) ctx.din.push_back(grad_of(id));
        ctx.dparams = store_->grad_views(in.node);
        ctx.grad_scale = 1.0 / static_cast<double>(t.grad_accum);
        backend_.backward(ctx);
        break;
      }
      case Instr::Kind::issue: issue(in.comm); break;
      case Instr::Kind::wait: finish(in.comm); break;
      case Instr::Kind::optimizer: {
        const bool scaled = loss_scaled(t.precision);
        const StepOutcome o = optimizer_->step(step_, opt_.steps, comm_, scaled ? scale_.scale : 0.0);
        stats.grad_norm = o.grad_norm;
        stats.skipped = o.skipped;
        if (scaled && N > 1) stats.comm_bytes += ring_bytes(Collective::AllReduce, 8.0, N);  // the overflow flag
        break;
      }
      case Instr::Kind::mark: check_ledger(in); break;
      default: break;
    }
  };
  visit.instr = [&](const Instr& in) {
    const bool timed = opt_.time_ops && in.event >= 0 &&
                       (in.kind == Instr::Kind::forward || in.kind == Instr::Kind::recompute ||
                        in.kind == Instr::Kind::backward || in.kind == Instr::Kind::optimizer);
    if (timed) ops_->synchronize();
    const auto op_start = Clock::now();
    run_instr(in);
    if (timed) {
      ops_->synchronize();
      op_seconds_[static_cast<size_t>(in.event)] += since(op_start);
    }
  };
  runner_->run_micro_batch(first, last, visit);
}

// After every op (the program's marks) the allocator's bytes per category
// must equal the program's: on the CPU exactly, on a GPU up to the caching
// allocator's block rounding. The largest difference is kept, with where.
void Trainer::check_ledger(const Instr& mark) {
  const CategoryBytes real = alloc_.current(), want = runner_->ledger().current();
  int64_t diff = 0;
  for (size_t c = 0; c < real.size(); ++c) diff += std::abs(real[c] - want[c]);
  if (diff <= ledger_check_.worst_bytes) return;
  ledger_check_.worst_bytes = diff;
  ledger_check_.measured = real;
  ledger_check_.predicted = want;
  ledger_check_.step = step_;
  const ComputeEvent* ev = mark.event >= 0 ? &program_.compute[static_cast<size_t>(mark.event)] : nullptr;
  ledger_check_.where = ev ? fmt::format("after {} ({})", ev->name, to_string(ev->phase)) : "at the step's start";
}

std::vector<float> Trainer::full_parameters() {
  // The snapshot is on the host: gathered through the host communicator.
  Communicator& host = comm_.host();  // the snapshot is on the host
  const int group = host_shard_group_;  // ZeRO-3 shards: over the shard group
  return store_->snapshot_full_params([&host, group](float* p, int64_t n) { host.all_gather(p, n, group)->wait(); });
}

std::vector<float> Trainer::buffers() const {
  std::vector<float> out;
  for (size_t i = 0; i < plan_.model.nodes.size(); ++i)
    for (const Tensor& t : store_->buffer_views(static_cast<int>(i))) {
      const size_t at = out.size();
      out.resize(at + static_cast<size_t>(t.numel()));
      ops_->download(out.data() + at, t.f(), t.bytes());
    }
  return out;
}

}  // namespace dlplan::exec
