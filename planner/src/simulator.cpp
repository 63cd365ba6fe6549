// The step simulator (simulator.hpp). Two clocks, one per stream:
//   compute: each op takes compute_event_seconds (gpu_time.cpp: the
//            per-op-class GPU model, or the roofline), slowed by
//            1 + comm_slowdown while a collective runs beside it (NCCL's
//            kernels share the SMs and the memory);
//   skew:    the step ends rank_jitter x sqrt(2 ln N x compute) later, when
//            the slowest of N ranks reaches the gradient synchronization;
//   comm:    each collective takes comm_model's time and starts when it is
//            issued and the stream is free (one NCCL stream: in order);
//            CPU offload's copies of a shard ride with their collective.
// CPU offload's optimizer runs on the host (host_optimizer_seconds).
// A wait moves the compute clock to the collective's end; SyncBN's
// collectives block inside their layer. With gradient accumulation the
// program runs once per micro-batch, with its first- and last-micro-batch
// instructions where they belong.
#include "dlplan/simulator.hpp"

#include "dlplan/ledger.hpp"
#include "dlplan/op_costs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <ostream>

namespace dlplan {
namespace {

// An op of `seconds` starting at `start` while the communication stream is
// busy until `comm_busy_until` runs 1 + s times slower for the overlap.
double with_contention(double seconds, double start, double comm_busy_until, double s) {
  const double overlap = comm_busy_until - start;
  if (s <= 0 || overlap <= 0) return seconds;
  if (seconds * (1 + s) <= overlap) return seconds * (1 + s);
  return overlap + (seconds - overlap / (1 + s));
}

// The ranks' skew at the step's gradient synchronization: each rank's step
// drifts like a random walk (variance rank_jitter^2 per second of compute),
// and the collective ends when the slowest of N arrives, E[max of N] ~
// sqrt(2 ln N) standard deviations late.
double rank_skew_seconds(const DeviceSpec& d, int world, double compute_seconds) {
  if (world <= 1 || d.rank_jitter <= 0 || compute_seconds <= 0) return 0;
  return d.rank_jitter * std::sqrt(2.0 * std::log(static_cast<double>(world))) * std::sqrt(compute_seconds);
}

// CPU offload (docs/memory.md, "Offload"): copies between host and device at
// the host link's rate, per GPU; the host's optimizer at the node's memory
// bandwidth shared by its ranks, with the same streaming share the device's
// memory-bound ops get. Not given in a cluster file: PCIe 3.0 x16 (16 GB/s)
// and 100 GB/s, below any two-socket server of the catalog's systems.
constexpr double kDefaultHostLinkBytesPerS = 16e9;
constexpr double kDefaultHostBytesPerS = 100e9;
constexpr double kHostStreamingShare = 0.85;

double host_link_rate(const DeviceSpec& d) {
  return d.host_link_bytes_per_s > 0 ? d.host_link_bytes_per_s : kDefaultHostLinkBytesPerS;
}

double host_optimizer_seconds(const ComputeEvent& e, const Cluster& c) {
  const double node = c.device.host_bytes_per_s > 0 ? c.device.host_bytes_per_s : kDefaultHostBytesPerS;
  const int ranks = std::max(1, std::min(c.gpus_per_node, c.world()));
  return e.bytes / (node * kHostStreamingShare / ranks) + e.link_bytes / host_link_rate(c.device);
}

// A cluster's measured op costs apply when they time this build's kernels
// and the run has the ranks per node they were measured with (each rank's
// threads follow from that); `why` says otherwise.
const OpCostTable* usable_cost_table(const Cluster& c, std::string& why) {
  if (!c.op_costs) return nullptr;
  if (c.op_costs->kernel_revision != kCpuKernelRevision) {
    why = fmt::format("the cluster's op costs were measured with the engine's kernels of revision {} and this dlplan's "
                      "are revision {}: ops are timed by the roofline until `dlplan calibrate --model` measures them again",
                      c.op_costs->kernel_revision, kCpuKernelRevision);
    return nullptr;
  }
  const int ranks = std::max(1, std::min(c.gpus_per_node, c.world()));
  if (c.op_costs->ranks_per_node != ranks) {
    why = fmt::format("the cluster's op costs were measured with {} rank(s) per node and this plan runs {}: ops are timed "
                      "by the roofline",
                      c.op_costs->ranks_per_node, ranks);
    return nullptr;
  }
  return c.op_costs.get();
}

}  // namespace

static_assert(std::tuple_size_v<decltype(Simulation::cost_sources)> == kCostSources);

Simulation simulate_program(const StepProgram& prog, const Cluster& c, const TrainingConfig& t, bool timeline) {
  Simulation s;
  // SyncBN's collectives run inside the op whose compute event waits for them.
  std::map<int, std::vector<int>> blocking_at;
  for (size_t k = 0; k < prog.comm.size(); ++k)
    if (prog.comm[k].blocking) blocking_at[prog.comm[k].wait_before].push_back(static_cast<int>(k));
  std::vector<double> cost(prog.comm.size()), sent(prog.comm.size());
  for (size_t k = 0; k < prog.comm.size(); ++k) {
    const CommEvent& ev = prog.comm[k];
    const CollectiveCost cc = collective_cost(c, ev.op, ev.bytes, ev.group, ev.stride);
    cost[k] = cc.seconds + ev.host_copy_bytes / host_link_rate(c.device);
    sent[k] = cc.bytes_sent;
    if (!cc.algorithm.empty() && cc.algorithm != "none") (cc.algorithm == "measured" ? s.comm_measured : s.comm_modeled)++;
  }
  std::vector<double> seconds(prog.compute.size());
  const OpCostTable* table = usable_cost_table(c, s.cost_table_unused);
  for (size_t e = 0; e < prog.compute.size(); ++e) {
    const ComputeEvent& ev = prog.compute[e];
    if (ev.on_host) {
      seconds[e] = host_optimizer_seconds(ev, c);
      continue;
    }
    CostSource source = CostSource::roofline;
    std::optional<OpCostLookup> hit;
    if (table && ev.node >= 0) hit = table->find(ev.signature, ev.phase, ev.samples);
    // Curves are fitted to fp32 steps (calibration's precision).
    if (!hit && table && ev.node >= 0 && t.precision == Precision::fp32)
      hit = table->from_curve(curve_kind(ev.signature), runs_gemms(ev), ev.phase, ev.flops, ev.bytes);
    if (hit) {
      seconds[e] = hit->seconds;
      source = hit->source;
    } else if (table && ev.node < 0 && table->optimizer_bytes_per_s > 0) {
      seconds[e] = ev.bytes / table->optimizer_bytes_per_s;
      source = CostSource::measured;
    } else {
      seconds[e] = compute_event_seconds(ev, c.device, t.precision);
    }
    if (table) seconds[e] += table->gap_per_op_s + (ev.node >= 0 ? table->gap_per_byte_s * ev.bytes : 0.0);
    s.cost_sources[static_cast<size_t>(source)]++;
  }

  // The communication stream: collectives in issue order, each with the work
  // (seconds at full speed) it has left. It runs at full speed while the
  // compute stream waits, and at 1 - comm_stall of it while compute runs
  // beside it (0 on GPUs: NCCL has SMs of its own; a CPU rank's communication
  // thread that yields its core to the compute thread, calibrate measures).
  // `tm` is how far the stream's progress has been worked out.
  double tc = 0, tm = 0;
  std::vector<double> done(prog.comm.size(), -1);
  struct InFlight {
    int k;
    double left;
    double started = -1;
  };
  std::deque<InFlight> queue;
  const double beside_rate = 1.0 - std::clamp(c.device.comm_stall, 0.0, 1.0);
  int micro = 0;

  auto finish = [&](const InFlight& f, double at) {
    const CommEvent& ev = prog.comm[static_cast<size_t>(f.k)];
    done[static_cast<size_t>(f.k)] = at;
    if (!timeline) return;
    Span sp;
    sp.name = ev.name;
    sp.start = f.started;
    sp.end = at;
    sp.op = ev.op;
    sp.bytes = ev.bytes;
    sp.bytes_sent = sent[static_cast<size_t>(f.k)];
    sp.micro_batch = micro;
    s.comm.push_back(std::move(sp));
  };
  // Works the stream out from tm to `until` at `rate`; with `until_done` >= 0,
  // stops as soon as that collective is done (a wait). Returns the time.
  auto advance = [&](double until, double rate, int until_done = -1) {
    while (!queue.empty() && (until_done >= 0 || tm < until)) {
      InFlight& f = queue.front();
      if (f.started < 0) f.started = tm;
      const double need = rate > 0 ? f.left / rate : std::numeric_limits<double>::infinity();
      if (until_done < 0 && tm + need > until) {
        f.left -= (until - tm) * rate;
        tm = until;
        break;
      }
      tm += need;
      const int k = f.k;
      finish(f, tm);
      queue.pop_front();
      if (k == until_done) return tm;
    }
    if (until_done < 0) tm = std::max(tm, until);
    return tm;
  };
  // When the stream would be done with what it holds at `rate` (contention's overlap).
  auto busy_until = [&](double rate) {
    double left = 0;
    for (const InFlight& f : queue) left += f.left;
    if (left <= 0) return tm;
    return rate > 0 ? tm + left / rate : std::numeric_limits<double>::infinity();
  };
  auto issue = [&](int k) {
    s.comm_seconds += cost[static_cast<size_t>(k)];
    s.comm_bytes += sent[static_cast<size_t>(k)];
    if (queue.empty()) tm = tc;  // an idle stream starts with the issue
    done[static_cast<size_t>(k)] = -1;  // again in every micro-batch
    queue.push_back({k, cost[static_cast<size_t>(k)]});
  };
  // The compute stream waits for collective k: the stream runs at full speed.
  auto wait_for = [&](int k) {
    if (done[static_cast<size_t>(k)] < 0) tc = std::max(tc, advance(tc, 1.0, k));
    tc = std::max(tc, done[static_cast<size_t>(k)]);
  };

  // The program's memory comes from the shared runner's ledger; the visitor
  // only advances the clocks and draws the curve.
  ProgramRunner runner(prog);
  FunctionVisitor clocks;
  auto memory_point = [&] {
    if (timeline) s.memory.push_back({tc, runner.ledger().current()});
  };
  clocks.alloc = [&](const Instr&, bool) { memory_point(); };
  clocks.free = [&](const Instr&) { memory_point(); };
  clocks.instr = [&](const Instr& in) {
        switch (in.kind) {
          case Instr::Kind::forward:
          case Instr::Kind::recompute:
          case Instr::Kind::backward:
          case Instr::Kind::optimizer: {
            const ComputeEvent& ev = prog.compute[static_cast<size_t>(in.event)];
            if (auto it = blocking_at.find(in.event); it != blocking_at.end())
              for (int k : it->second) {  // SyncBN: the layer waits for its collective
                issue(k);
                wait_for(k);
              }
            const double start = tc;
            const double busy = with_contention(seconds[static_cast<size_t>(in.event)], start, busy_until(beside_rate),
                                                c.device.comm_slowdown);
            tc += busy;
            advance(tc, beside_rate);
            s.compute_seconds += busy;
            if (ev.phase != Phase::recompute && ev.phase != Phase::optimizer) s.model_flops += ev.flops;
            if (timeline) {
              Span sp;
              sp.name = ev.name;
              sp.phase = ev.phase;
              sp.start = start;
              sp.end = tc;
              sp.micro_batch = micro;
              s.compute.push_back(std::move(sp));
            }
            break;
          }
          case Instr::Kind::issue: issue(in.comm); break;
          case Instr::Kind::wait: wait_for(in.comm); break;
          default: break;
        }
  };
  const int A = static_cast<int>(t.grad_accum);
  for (micro = 0; micro < A; ++micro) runner.run_micro_batch(micro == 0, micro == A - 1, clocks);
  s.peak_bytes = runner.ledger().peak();
  // The next step's forward waits for the last all-gathers (ZeRO-1/2's).
  if (!queue.empty()) advance(tc, 1.0, queue.back().k);
  s.step_seconds = std::max(tc, tm);
  // The gradient synchronization lasts until the slowest rank arrives: the
  // skew is communication time that nothing hides.
  const double skew = rank_skew_seconds(c.device, c.world(), s.compute_seconds);
  s.step_seconds += skew;
  s.comm_seconds += skew;
  s.exposed_seconds = s.step_seconds - s.compute_seconds;
  const double peak = peak_flops(c.device, t.precision);
  s.mfu = s.step_seconds > 0 && peak > 0 ? s.model_flops / s.step_seconds / peak : 0;
  return s;
}

Simulation simulate_step(const Model& m, const Cluster& c, const TrainingConfig& t) {
  return simulate_program(build_step_program(m, c, t), c, t);
}

void write_chrome_trace(const Simulation& s, const std::string& title, std::ostream& out) {
  // Trace Event Format (the JSON Array / Object format of chrome://tracing):
  // "X" complete events with ts and dur in microseconds; "C" counters.
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  events.push_back({{"ph", "M"}, {"pid", 1}, {"name", "process_name"}, {"args", {{"name", title}}}});
  events.push_back({{"ph", "M"}, {"pid", 1}, {"tid", 1}, {"name", "thread_name"}, {"args", {{"name", "compute"}}}});
  events.push_back({{"ph", "M"}, {"pid", 1}, {"tid", 2}, {"name", "thread_name"}, {"args", {{"name", "communication"}}}});
  for (const Span& sp : s.compute)
    events.push_back({{"ph", "X"}, {"pid", 1}, {"tid", 1}, {"name", sp.name}, {"cat", to_string(sp.phase)},
                      {"ts", sp.start * 1e6}, {"dur", (sp.end - sp.start) * 1e6}, {"args", {{"micro_batch", sp.micro_batch}}}});
  for (const Span& sp : s.comm)
    events.push_back({{"ph", "X"}, {"pid", 1}, {"tid", 2}, {"name", sp.name}, {"cat", to_string(sp.op)},
                      {"ts", sp.start * 1e6}, {"dur", (sp.end - sp.start) * 1e6},
                      {"args", {{"bytes", sp.bytes}, {"bytes_sent", sp.bytes_sent}, {"micro_batch", sp.micro_batch}}}});
  for (const MemorySample& m : s.memory) {
    nlohmann::ordered_json args = nlohmann::ordered_json::object();
    for (Category c : kAllCategories) args[to_string(c)] = m.bytes[static_cast<size_t>(c)];
    events.push_back({{"ph", "C"}, {"pid", 1}, {"name", "memory (bytes)"}, {"ts", m.time * 1e6}, {"args", args}});
  }
  nlohmann::ordered_json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  out << doc.dump() << "\n";
}

std::string text_gantt(const Simulation& s, int width) {
  width = std::max(width, 20);
  const double T = s.step_seconds > 0 ? s.step_seconds : 1;
  auto lane = [&](const std::vector<Span>& spans, bool compute) {
    std::string row(static_cast<size_t>(width), ' ');
    for (const Span& sp : spans) {
      char mark = '#';
      if (compute) mark = sp.phase == Phase::forward ? 'F' : sp.phase == Phase::backward ? 'B' : sp.phase == Phase::recompute ? 'r' : 'O';
      else mark = sp.op == Collective::AllReduce ? 'A' : sp.op == Collective::ReduceScatter ? 'R' : sp.op == Collective::AllGather ? 'G' : 'b';
      const auto a = static_cast<size_t>(std::clamp(sp.start / T * width, 0.0, width - 1.0));
      const auto b = static_cast<size_t>(std::clamp(sp.end / T * width, 0.0, static_cast<double>(width)));
      for (size_t i = a; i < std::max(b, a + 1) && i < row.size(); ++i) row[i] = mark;
    }
    return row;
  };
  std::string out = fmt::format("step {:.3f} ms: compute {:.3f} ms busy, communication {:.3f} ms busy, {:.3f} ms exposed\n",
                                s.step_seconds * 1e3, s.compute_seconds * 1e3, s.comm_seconds * 1e3, s.exposed_seconds * 1e3);
  out += fmt::format("compute |{}|\n", lane(s.compute, true));
  out += fmt::format("comm    |{}|\n", lane(s.comm, false));
  out += fmt::format("         0{:>{}}\n", fmt::format("{:.3f} ms", T * 1e3), width);
  out += "         F forward  B backward  r recompute  O optimizer | A all-reduce  R reduce-scatter  G all-gather\n";
  // The memory curve: total bytes over the step, 8 rows high.
  int64_t peak = 1;
  for (const auto& m : s.memory) peak = std::max(peak, total(m.bytes));
  std::vector<int64_t> col(static_cast<size_t>(width), 0);
  for (const auto& m : s.memory) {
    const auto i = static_cast<size_t>(std::clamp(m.time / T * width, 0.0, width - 1.0));
    col[i] = std::max(col[i], total(m.bytes));
  }
  for (size_t i = 1; i < col.size(); ++i)
    if (col[i] == 0) col[i] = col[i - 1];  // hold the level between samples
  out += fmt::format("\nmemory (peak {:.2f} MiB, curve peak {:.2f} MiB)\n", static_cast<double>(s.peak_bytes) / 1048576.0,
                     static_cast<double>(peak) / 1048576.0);
  for (int r = 8; r >= 1; --r) {
    std::string row;
    for (int64_t v : col) row += static_cast<double>(v) / static_cast<double>(peak) * 8 >= r - 0.5 ? '#' : ' ';
    out += fmt::format("{:>7} |{}|\n", r == 8 ? "peak" : "", row);
  }
  return out;
}

}  // namespace dlplan
