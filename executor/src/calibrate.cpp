#include "dlplan/exec/calibrate.hpp"

#include "calibrate_stats.hpp"

#include "dlplan/collective_costs.hpp"
#include "dlplan/exec/blas_core.hpp"
#include "dlplan/exec/device_ops.hpp"

#include "dlplan/loader.hpp"
#include "dlplan/ops.hpp"
#include "dlplan/simulator.hpp"
#include "dlplan/zoo.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <set>
#include <unistd.h>

namespace dlplan::exec {
namespace {

using Clock = std::chrono::steady_clock;

using detail::median;
using detail::slowest;

// A one-linear model, so the GEMM runs through the backend's own op.
Model linear_model(int64_t k, int64_t n) {
  nlohmann::json ir = {
      {"name", "calibrate"},
      {"inputs", {{"x", {{"shape", {k}}, {"dtype", "f32"}}}, {"y", {{"shape", nlohmann::json::array()}, {"dtype", "i32"}}}}},
      {"nodes",
       {{{"name", "fc"}, {"op", "linear"}, {"in", {"x"}}, {"out", n}, {"bias", false}},
        {{"name", "loss"}, {"op", "cross_entropy"}, {"in", {"fc", "y"}}}}}};
  return parse_model(ir, "calibrate");
}

// The backend's linear op on zeros-and-sevenths input, ready to run again and again.
class LinearOp {
 public:
  LinearOp(Backend& backend, int64_t m, int64_t n, int64_t k) : backend_(backend), model_(linear_model(k, n)) {
    decl_ = declare(model_, model_.nodes[0]);
    ctx_.model = &model_;
    ctx_.node = &model_.nodes[0];
    ctx_.node_index = 0;
    ctx_.decl = &decl_;
    ctx_.alloc = &alloc_;
    ctx_.batch = m;
    ctx_.in = {alloc_.zeros({m, k}, DType::f32, Category::workspace, "x")};
    ctx_.out = alloc_.zeros({m, n}, DType::f32, Category::workspace, "y");
    ctx_.params = {alloc_.zeros({n * k}, DType::f32, Category::params, "w")};
    for (int64_t i = 0; i < m * k; ++i) ctx_.in[0].f()[i] = static_cast<float>(i % 7) * 0.1f;
    run();  // warm up
  }
  void run() { backend_.forward(ctx_); }
  // The median over `reps` of `count` runs in a row, after a barrier each time.
  double time(Communicator& comm, int reps, int count = 1) {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      comm.barrier();
      const auto start = Clock::now();
      for (int i = 0; i < count; ++i) run();
      t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    return median(t);
  }

 private:
  Backend& backend_;
  Model model_;
  OpDecl decl_;
  Allocator alloc_;
  OpContext ctx_;
};

GemmSample time_gemm(Communicator& comm, Backend& backend, int64_t m, int64_t n, int64_t k) {
  LinearOp op(backend, m, n, k);
  const int reps = m * n * k > (int64_t{1} << 27) ? 3 : 7;
  GemmSample s{m, n, k, slowest(comm, op.time(comm, reps)), 0};
  s.flops_per_s = 2.0 * static_cast<double>(m * n * k) / s.seconds;
  return s;
}

// A collective's ladder: buffers of 4^k floats (rounded up to a multiple of
// the ranks, which reduce-scatter and all-gather shard; a rung rounded onto
// the one before it is left out), 4 B to 16 MiB, each
// after a warm-up, timed after a barrier 21 times up to 256 KiB (tens of
// microseconds each, where one preempted repetition moves a median of five)
// and 5 times above; the slowest rank's median. Then each rung is at most
// the next one's: fewer bytes never take longer (they could be sent padded),
// so a rung above its successor was a disturbance, not the collective.
std::vector<CollectiveSample> time_ladder(Communicator& comm, Collective op) {
  auto run = [&](float* data, int64_t elems) {
    switch (op) {
      case Collective::AllReduce: return comm.all_reduce(data, elems);
      case Collective::ReduceScatter: return comm.reduce_scatter(data, elems);
      case Collective::AllGather: return comm.all_gather(data, elems);
      case Collective::Broadcast: return comm.broadcast(data, elems, 0);
    }
    return comm.all_reduce(data, elems);
  };
  const int64_t n = comm.size();
  std::vector<CollectiveSample> ladder;
  for (int64_t rung = 1; rung <= (int64_t{1} << 22); rung *= 4) {
    const int64_t elems = op == Collective::AllReduce ? rung : (rung + n - 1) / n * n;
    if (!ladder.empty() && 4.0 * static_cast<double>(elems) <= ladder.back().bytes) continue;  // rounded onto the last
    std::vector<float> buf(static_cast<size_t>(elems), 1.0f);
    run(buf.data(), elems)->wait();  // warm up
    std::vector<double> t;
    const int reps = elems <= (int64_t{1} << 16) ? 21 : 5;
    for (int r = 0; r < reps; ++r) {
      comm.barrier();
      const auto start = Clock::now();
      run(buf.data(), elems)->wait();
      t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    ladder.push_back({4.0 * static_cast<double>(elems), slowest(comm, median(t))});
  }
  for (size_t i = ladder.size(); i-- > 1;) ladder[i - 1].seconds = std::min(ladder[i - 1].seconds, ladder[i].seconds);
  return ladder;
}

// Contention (Calibration::comm_slowdown, comm_stall): a run of GEMMs about
// as long as the ladder's 4 MiB all-reduce, timed alone and then started
// together with that all-reduce on this rank's communication thread, every
// rank at once, and the time until the all-reduce is done; the slowest
// rank's medians. Runs after the ladder.
void time_contention(Communicator& comm, Backend& backend, Calibration& cal) {
  // The all-reduce alone is the ladder's sample of that size (4^10 elements).
  const int64_t elems = int64_t{1} << 20;
  const auto alone = std::find_if(cal.all_reduce.begin(), cal.all_reduce.end(),
                                  [&](const CollectiveSample& s) { return s.bytes == 4.0 * static_cast<double>(elems); });
  if (alone == cal.all_reduce.end()) return;  // no such rung: contention stays unmeasured (0)
  cal.collective_s = alone->seconds;
  std::vector<float> buf(static_cast<size_t>(elems), 1.0f);
  LinearOp gemm(backend, 256, 256, 256);
  const double one = slowest(comm, gemm.time(comm, 5));
  const int count = std::max(1, static_cast<int>(std::ceil(cal.collective_s / one)));
  cal.gemms_alone_s = slowest(comm, gemm.time(comm, 5, count));
  std::vector<double> beside_t, both_t;
  for (int r = 0; r < 5; ++r) {
    comm.barrier();
    const auto start = Clock::now();
    WorkHandle beside = comm.all_reduce(buf.data(), elems);
    for (int i = 0; i < count; ++i) gemm.run();
    beside_t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    beside->wait();
    both_t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  cal.gemms_beside_s = slowest(comm, median(beside_t));
  cal.collective_beside_s = slowest(comm, median(both_t));
  const Contention c = contention_from(cal.gemms_alone_s, cal.gemms_beside_s, cal.collective_s, cal.collective_beside_s);
  cal.comm_slowdown = c.slowdown;
  cal.comm_stall = c.stall;
}

double time_copy(Communicator& comm) {
  const size_t bytes = size_t{64} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 0);
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    comm.barrier();
    const auto start = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    a[static_cast<size_t>(r)] = b[static_cast<size_t>(r) + 1];  // keep the copies observable
  }
  return 2.0 * static_cast<double>(bytes) / slowest(comm, median(t));  // read + write
}

double time_op_overhead(Communicator& comm, Backend& backend) {
  nlohmann::json ir = {
      {"name", "overhead"},
      {"inputs", {{"x", {{"shape", {4}}, {"dtype", "f32"}}}, {"y", {{"shape", nlohmann::json::array()}, {"dtype", "i32"}}}}},
      {"nodes", {{{"name", "act"}, {"op", "relu"}, {"in", {"x"}}}, {{"name", "loss"}, {"op", "cross_entropy"}, {"in", {"act", "y"}}}}}};
  Model model = parse_model(ir, "overhead");
  Allocator alloc;
  OpDecl decl = declare(model, model.nodes[0]);
  Tensor x = alloc.zeros({1, 4}, DType::f32, Category::workspace, "x");
  const int reps = 2000;
  comm.barrier();
  const auto start = Clock::now();
  for (int r = 0; r < reps; ++r) {
    OpContext ctx;
    ctx.model = &model;
    ctx.node = &model.nodes[0];
    ctx.node_index = 0;
    ctx.decl = &decl;
    ctx.alloc = &alloc;
    ctx.in = {x};
    ctx.out = alloc.empty({1, 4}, DType::f32, Category::workspace, "out");
    backend.forward(ctx);
  }
  return slowest(comm, std::chrono::duration<double>(Clock::now() - start).count() / reps);
}

// The optimizer step on the host, as CPU offload runs it (fp32 AdamW over a
// shard: read the gradient, read and write parameter, m and v = 28 bytes per
// element, the planner's count for it), every rank at once: the node's rate.
double time_host_optimizer(Communicator& comm) {
  const int64_t n = int64_t{1} << 22;
  std::vector<float> p(static_cast<size_t>(n), 0.5f), g(static_cast<size_t>(n), 1e-3f), m(static_cast<size_t>(n), 0.0f),
      v(static_cast<size_t>(n), 0.0f);
  auto ops = make_cpu_device_ops();
  OptimizerConfig cfg;  // AdamW
  OptimizerUpdate up;
  up.lr = 1e-4;
  up.decay = true;
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) {
    up.t = r + 1;
    comm.barrier();
    const auto start = Clock::now();
    ops->optimizer_step(cfg, up, {p.data(), n, DType::f32}, {g.data(), n, DType::f32}, nullptr, m.data(), v.data());
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return 28.0 * static_cast<double>(n) * comm.local_size() / slowest(comm, median(t));
}

// The sweep's own CNNs (calibrate.hpp): two sizes of one design, so that
// either, held back, is predicted from the other's depthwise, ReLU6 and 1x1
// curves rather than from class curves alone.
Model sweep_model(const std::string& name) {
  zoo::CnnConfig c;
  c.name = name;
  c.depthwise = true;
  if (name == "sweep-cnn") {
    c.image = 32;
    c.widths = {16, 32, 64, 64};
  } else if (name == "sweep-cnn-wide") {
    c.image = 56;
    c.widths = {32, 64, 128, 128};
  } else {
    return load_model(name);
  }
  return parse_model(zoo::build_cnn(c), name);
}

// Without --model: the sweep models' ops timed at each sweep micro-batch and
// fitted into curves (fit_op_curves); each model's step then predicted by the
// simulator from `profile` and what was measured without it (`checks`, the
// profile's band).
OpCostTable sweep_curves(Communicator& comm, Backend& backend, const Cluster& profile, std::vector<CurveCheck>& checks) {
  struct Run {
    std::string model;
    int64_t micro_batch = 0;
    StepTiming step;
    double gap_per_op_s = 0;
  };
  std::vector<Run> runs;
  for (const char* name : kCurveSweepModels)
    for (int64_t b : kCurveSweepMicroBatches) {
      Run r{name, b, {}, 0};
      const OpCostTable t = measure_op_costs(comm, backend, sweep_model(name), b, 5, kCurveSeconds, nullptr, &r.step);
      r.gap_per_op_s = t.gap_per_op_s;
      runs.push_back(std::move(r));
    }
  // The table from the runs `use` picks: curves over their ops, their gaps
  // fitted against bytes per op (a CNN's gradients, zeroed as each is
  // allocated, make its gap per op 10-30x an MLP's), the median of their
  // optimizers' rates.
  auto table_of = [&](auto use) {
    OpCostTable t;
    t.ranks_per_node = comm.local_size();
    t.kernel_revision = kCpuKernelRevision;
    std::vector<OpSample> ops;
    std::vector<double> optimizer;
    std::vector<CurveSample> gaps;  // per run: gap / op against bytes / op (the flops column unused)
    for (const Run& r : runs) {
      if (!use(r)) continue;
      ops.insert(ops.end(), r.step.ops.begin(), r.step.ops.end());
      if (r.step.optimizer_s > 0) optimizer.push_back(r.step.optimizer_bytes / r.step.optimizer_s);
      if (r.gap_per_op_s > 0 && r.step.events > 0) gaps.push_back({0, r.step.op_bytes / r.step.events, r.gap_per_op_s});
    }
    t.curves = fit_op_curves(ops);
    t.optimizer_bytes_per_s = optimizer.empty() ? 0 : median(optimizer);
    if (!gaps.empty()) {
      const OpCostCurve gap = fit_op_curve("gap", Phase::forward, gaps);
      t.gap_per_op_s = gap.overhead_s;
      t.gap_per_byte_s = gap.seconds_per_byte;
    }
    return std::pair{t, ops.size()};
  };
  for (const char* name : kCurveSweepModels) {
    const OpCostTable without = table_of([&](const Run& r) { return r.model != name; }).first;
    for (const Run& r : runs) {
      if (r.model != name) continue;
      // The simulator's own prediction of the step that ran, from the
      // profile as it stands (collectives, contention, skew) with this table.
      Cluster cluster = profile;
      cluster.op_costs = std::make_shared<const OpCostTable>(without);
      const Simulation sim = simulate_program(r.step.program, cluster, r.step.training, /*timeline=*/false);
      checks.push_back({name, r.micro_batch, sim.step_seconds, r.step.step_s});
    }
  }
  auto [table, ops] = table_of([](const Run&) { return true; });
  table.source = fmt::format("dlplan calibrate: curves over {} ops of {} at micro-batches {}, {} rank(s) per node", ops,
                             fmt::join(kCurveSweepModels, ", "), fmt::join(kCurveSweepMicroBatches, ", "),
                             table.ranks_per_node);
  return table;
}

}  // namespace

Contention contention_from(double alone, double beside, double collective, double both) {
  Contention c;
  if (!(alone > 0) || !(beside > 0) || !(collective > 0)) return c;
  // The collective's work left when the compute ended ran at full speed.
  const double left = std::clamp(both - beside, 0.0, collective);
  if (left > 0) c.stall = std::clamp(1 - (collective - left) / beside, 0.0, 1.0);
  // The collective was in flight through all of the compute when work was
  // left at its end; else for as long as it takes alone.
  const double overlap = left > 0 ? both : collective;
  const double extra = beside - alone;
  if (extra <= 0) return c;
  if (beside <= overlap) c.slowdown = extra / alone;
  else if (extra >= overlap) c.slowdown = kMaxCommSlowdown;
  else c.slowdown = extra / (overlap - extra);
  c.slowdown = std::min(c.slowdown, kMaxCommSlowdown);
  return c;
}

AllReduceFit fit_all_reduce(const std::vector<CollectiveSample>& samples, int ranks) {
  // t = a + b x, x = 2(n-1)/n S: op_costs.hpp's curve with x as its one
  // variable, fitted the same way (weights 1 / t^2, a and b >= 0).
  std::vector<CurveSample> points;
  for (const auto& p : samples)
    if (p.seconds > 0) points.push_back({2.0 * (ranks - 1) / ranks * p.bytes, 0, p.seconds});
  const OpCostCurve line = fit_op_curve("all_reduce", Phase::forward, points);
  AllReduceFit fit;
  fit.latency_s = line.overhead_s;
  fit.bus_bytes_per_s = line.seconds_per_flop > 0 ? 1.0 / line.seconds_per_flop : 1e12;
  return fit;
}

double time_band(const std::vector<double>& errors) {
  double worst = 0.01;
  for (double e : errors) worst = std::max(worst, std::fabs(e));
  return std::min(std::ceil(worst * 100) / 100, kMaxTimeUncertainty);
}

Calibration calibrate(Communicator& comm, Backend& backend, const Model* model, int64_t micro_batch) {
  Calibration cal;
  // GEMM shapes: the model's linears (rows = micro-batch x tokens), or a default ladder.
  std::set<std::tuple<int64_t, int64_t, int64_t>> shapes;
  if (model) {
    for (const auto& n : model->nodes)
      if (n.op == OpKind::linear) {
        const Shape& x = model->tensor(n.inputs[0]).shape;
        const int64_t rows = numel(x) / x.back() * micro_batch;
        shapes.insert({std::min<int64_t>(rows, 4096), n.attrs.integer("out"), x.back()});
      }
  }
  if (shapes.empty()) shapes = {{256, 256, 256}, {512, 512, 512}, {1024, 1024, 1024}};
  double flops = 0, seconds = 0;
  for (auto [m, n, k] : shapes) {
    cal.gemms.push_back(time_gemm(comm, backend, m, n, k));
    flops += 2.0 * static_cast<double>(m * n * k);
    seconds += cal.gemms.back().seconds;
  }
  cal.copy_bytes_per_s = time_copy(comm);
  cal.op_overhead_s = time_op_overhead(comm, backend);
  cal.host_optimizer_bytes_per_s = time_host_optimizer(comm);

  // The collectives' ladders; the all-reduce's fitted to t = a + x / B with
  // x = 2(n-1)/n * S (the model for other group sizes).
  const int n = comm.size();
  if (n > 1) {
    cal.all_reduce = time_ladder(comm, Collective::AllReduce);
    cal.reduce_scatter = time_ladder(comm, Collective::ReduceScatter);
    cal.all_gather = time_ladder(comm, Collective::AllGather);
    const AllReduceFit fit = fit_all_reduce(cal.all_reduce, n);
    cal.latency_s = fit.latency_s;
    cal.bus_bytes_per_s = fit.bus_bytes_per_s;
    time_contention(comm, backend, cal);
  }

  DeviceSpec d = host_cpu_device();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string blas = describe(blas_core());
  d.description = fmt::format("{} ({} ranks, calibrated{}{})", host, n, blas.empty() ? "" : "; ", blas);
  d.fp32_flops = flops / seconds;  // per rank, with the other ranks busy too
  // The CPU engine's bf16-mixed and fp16-mixed GEMMs are the same fp32 GEMMs
  // on widened copies (docs/precision.md): the measured rate is theirs too.
  d.bf16_flops = d.fp16_flops = d.fp32_flops;
  d.gemm_efficiency = 1.0;         // the measured rate is what GEMMs achieve
  d.hbm_bytes_per_s = cal.copy_bytes_per_s / 0.85;  // the simulator applies its 0.85 streaming share
  d.op_overhead_s = cal.op_overhead_s;
  // CPU offload's optimizer (the simulator applies the same streaming share)
  // and its copies (host to host here: the copy rate).
  d.host_bytes_per_s = cal.host_optimizer_bytes_per_s / 0.85;
  d.host_link_bytes_per_s = cal.copy_bytes_per_s;
  if (n > 1) {
    d.base_latency_s = cal.latency_s;
    d.link_hop_latency_s = 0;
    d.link_bytes_per_s = cal.bus_bytes_per_s;
    d.link_efficiency = 1.0;
    d.comm_slowdown = cal.comm_slowdown;
    d.comm_stall = cal.comm_stall;
    const std::string how = fmt::format(
        "dlplan calibrate on {} ranks: {:.3f} ms of GEMMs took {:.3f} ms beside a {:.3f} ms all-reduce of 4 MiB, which "
        "was done {:.3f} ms after both started",
        n, cal.gemms_alone_s * 1e3, cal.gemms_beside_s * 1e3, cal.collective_s * 1e3, cal.collective_beside_s * 1e3);
    d.sources["comm_slowdown"] = how;
    d.sources["comm_stall"] = how;
  }
  d.source = fmt::format(
      "dlplan calibrate on {} with {} rank(s): GEMM {:.1f} GFLOP/s per rank over {} shapes, copy {:.1f} GB/s, "
      "op overhead {:.2f} us, all-reduce latency {:.1f} us and bus bandwidth {:.2f} GB/s, host optimizer {:.1f} GB/s per node",
      host, n, d.fp32_flops / 1e9, shapes.size(), cal.copy_bytes_per_s / 1e9, cal.op_overhead_s * 1e6, cal.latency_s * 1e6,
      cal.bus_bytes_per_s / 1e9, cal.host_optimizer_bytes_per_s / 1e9);
  cal.cluster.device = d;
  cal.cluster.nodes = 1;
  cal.cluster.gpus_per_node = n;
  if (n > 1) {
    auto table = std::make_shared<CollectiveCostTable>();
    table->source = fmt::format("dlplan calibrate on {} with {} rank(s)", host, n);
    table->ranks = n;
    for (const auto& [op, samples] : {std::pair{Collective::AllReduce, &cal.all_reduce},
                                      std::pair{Collective::ReduceScatter, &cal.reduce_scatter},
                                      std::pair{Collective::AllGather, &cal.all_gather}}) {
      CollectiveLadder ladder{op, {}};
      for (const CollectiveSample& x : *samples) ladder.rungs.push_back({x.bytes, x.seconds});
      table->ladders.push_back(std::move(ladder));
    }
    cal.cluster.collective_costs = std::move(table);
  }
  if (!model) {
    cal.cluster.op_costs = std::make_shared<const OpCostTable>(sweep_curves(comm, backend, cal.cluster, cal.curve_checks));
    // The band: the worst held-back model's error (time_band).
    std::vector<double> errors;
    std::string runs;
    for (const CurveCheck& c : cal.curve_checks) {
      errors.push_back(c.error());
      runs += fmt::format("{}{} at {} {:+.1f} %", runs.empty() ? "" : ", ", c.model, c.micro_batch, c.error() * 100);
    }
    cal.cluster.device.time_uncertainty = time_band(errors);
    cal.cluster.device.sources["time_uncertainty"] = fmt::format(
        "dlplan calibrate without --model on {} rank(s): the worst error of the step the simulator predicts for a sweep "
        "model from the curves, gaps and optimizer rate measured without it ({}), rounded up to the percent (at most {:.0f} %)",
        n, runs, kMaxTimeUncertainty * 100);
  }
  if (model) {
    // The op table, then the held-back check of the profile it makes. A
    // check off by more than kCalibrationRetryAbove says the machine's speed moved
    // between the two (a shared VM's neighbours): measure once more and keep
    // the attempt whose check is closer.
    const Cluster base = cal.cluster;
    for (int attempt = 1; attempt <= 2; ++attempt) {
      cal.attempts = attempt;
      Cluster c = base;
      double jitter = 0;
      StepTiming step;
      OpCostTable table = measure_op_costs(comm, backend, *model, micro_batch, 5, kOpTableSeconds, &jitter, &step);
      // Its own ops' curves time the model's ops at shapes the table lacks
      // (another --seq-len), before the roofline would.
      table.curves = fit_op_curves(step.ops);
      c.op_costs = std::make_shared<const OpCostTable>(std::move(table));
      // Within the catalog field's range (hardware.cpp: at most 1 s^0.5).
      c.device.rank_jitter = std::min(jitter, 1.0);
      std::vector<HeldBackRun> held = check_held_back(comm, backend, *model, micro_batch, c, 3, kHeldBackSeconds);
      // The band: the worst strategy's held-back error (time_band).
      std::vector<double> errors;
      std::string runs;
      for (const HeldBackRun& h : held) {
        errors.push_back(h.error());
        runs += fmt::format("{}{} {:+.1f} % over {} steps", runs.empty() ? "" : ", ", to_string(h.strategy), h.error() * 100,
                            h.steps);
      }
      const double band = time_band(errors);
      if (attempt > 1 && band >= cal.cluster.device.time_uncertainty) break;
      c.device.time_uncertainty = band;
      c.device.sources["time_uncertainty"] = fmt::format(
          "dlplan calibrate --model {} --micro-batch {}: the worst held-back error of {} rank(s) ({}), "
          "rounded up to the percent (at most {:.0f} %){}",
          model->name, micro_batch, n, runs, kMaxTimeUncertainty * 100, attempt > 1 ? " (second attempt: the first was further off)" : "");
      cal.cluster = c;
      cal.held_back = held;
      if (band <= kCalibrationRetryAbove) break;
    }
  }
  return cal;
}

}  // namespace dlplan::exec
