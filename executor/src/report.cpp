#include "dlplan/exec/report.hpp"

#include "dlplan/format.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/simulator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace dlplan::exec {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : (v[h - 1] + v[h]) / 2;  // even: the mean of the middle two
}

// Steps after the first when there are any (the first pays for set-up).
std::vector<StepStats> steady(const std::vector<StepStats>& s) {
  if (s.size() <= 1) return s;
  return {s.begin() + 1, s.end()};
}

double throughput(const StepStats& s, const Trainer& t) {
  const double samples = static_cast<double>(t.samples_per_step());
  const double tokens = t.tokens_per_sample() > 0 ? samples * static_cast<double>(t.tokens_per_sample()) : samples;
  return s.seconds > 0 ? tokens / s.seconds : 0;
}

// "42 s", "3 min 12 s", "2 h 05 min": an ETA, rounded to what a person reads.
std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s < 60) return fmt::format("{} s", s);
  if (s < 3600) return fmt::format("{} min {:02} s", s / 60, s % 60);
  return fmt::format("{} h {:02} min", s / 3600, (s % 3600) / 60);
}

}  // namespace

RankMemory highest_peak_rank(Trainer& t, Communicator& comm) {
  RankMemory mine;
  mine.rank = comm.rank();
  mine.at_peak = t.allocator().at_peak();
  mine.max_each = t.allocator().max_each();
  mine.peak = t.allocator().peak();
  mine.rss_bytes = resident_peak_bytes();
  mine.runtime_bytes = t.runtime_bytes();
  mine.reserved_bytes = t.reserved_bytes();
  mine.host = t.host_allocator().max_each();
  std::vector<RankMemory> all(static_cast<size_t>(comm.size()));
  comm.all_gather_bytes(&mine, all.data(), sizeof(RankMemory));
  return *std::max_element(all.begin(), all.end(), [](const RankMemory& a, const RankMemory& b) { return a.peak < b.peak; });
}

RunReport run_report(const PlanDocument& plan, Trainer& t, const RunMeasurement& m, int world, uint64_t seed) {
  const auto s = steady(m.steps);
  std::vector<double> step, wait, bytes;
  for (const auto& x : s) {
    step.push_back(x.seconds);
    wait.push_back(x.wait_seconds);
    bytes.push_back(x.comm_bytes);
  }
  const double step_s = median(step), exposed = median(wait);
  // MFU: the model's forward + backward FLOPs for this rank's share of the
  // global batch (planner's op declarations, recomputation not counted) over
  // the step time and the device's peak (cpu: the catalog's nominal rate).
  const StrategyResult predicted = evaluate(plan.model, plan.cluster, plan.training);
  const double peak = peak_flops(plan.cluster.device, plan.training.precision);

  RunReport r;
  r.plan = plan;
  r.world_size = world;
  r.seed = seed;
  for (const auto& x : m.steps) {
    r.loss.push_back(x.loss);
    if (loss_scaled(plan.training.precision)) {
      r.loss_scale.push_back(x.loss_scale);
      if (x.skipped) r.skipped_steps.push_back(x.step + 1);
    }
  }
  r.predicted = plan.predicted;
  Measured& out = r.measured;
  out.memory = {m.memory.at_peak, m.memory.runtime_bytes, m.memory.peak};
  out.max_each = m.memory.max_each;
  out.reserved_bytes = m.memory.reserved_bytes;
  out.rank = m.memory.rank;
  out.step_seconds = step_s;
  out.compute_seconds = std::max(0.0, step_s - exposed);
  out.comm = {median(bytes), m.comm_busy_seconds, exposed};
  out.mfu = step_s > 0 && peak > 0 ? predicted.model_flops / step_s / peak : 0.0;
  const double rate = step_s > 0 ? static_cast<double>(t.samples_per_step()) / step_s : 0;
  out.tokens = t.tokens_per_sample() > 0;
  out.rate = out.tokens ? rate * static_cast<double>(t.tokens_per_sample()) : rate;
  out.rss_bytes = m.memory.rss_bytes;
  out.host = m.memory.host;
  r.predicted.host = host_states(plan.model, world, plan.training);  // the same function the plan's numbers came from
  return r;
}

std::string progress_text(const StepStats& s, int steps, const Trainer& t, double eta_seconds) {
  const bool tokens = t.tokens_per_sample() > 0;
  std::string line = fmt::format("step {:>4}/{}  loss {:.4f}  {:>9}  {:>12.1f} {}/s  peak {}", s.step + 1, steps, s.loss,
                                 format_seconds(s.seconds), throughput(s, t), tokens ? "tokens" : "samples",
                                 format_bytes(static_cast<double>(s.peak_bytes)));
  if (s.loss_scale > 0) line += fmt::format("  scale {:g}{}", s.loss_scale, s.skipped ? " (overflow: step skipped)" : "");
  if (eta_seconds >= 0) line += fmt::format("  eta {}", format_duration(eta_seconds));
  return line;
}

std::string time_table(const RunReport& r) {
  const Measured& m = r.measured;
  const Predicted& p = r.predicted;
  std::string out = fmt::format("\nStep (median of the steps after the first), measured against predicted:\n");
  out += fmt::format("  {:<22} {:>12} {:>12} {:>8}\n", "", "measured", "predicted", "diff");
  auto row = [&](const char* name, const std::string& a, const std::string& b, double x, double y) {
    const std::string diff = y > 0 && x > 0 ? fmt::format("{:+.1f}%", 100 * (x - y) / y) : "";
    out += fmt::format("  {:<22} {:>12} {:>12} {:>8}\n", name, a, b, diff);
  };
  auto secs = [](double s) { return format_seconds(s); };
  row("step time", secs(m.step_seconds), secs(p.step_seconds), m.step_seconds, p.step_seconds);
  row("compute", secs(m.compute_seconds), secs(p.compute_seconds), m.compute_seconds, p.compute_seconds);
  row("communication (busy)", secs(m.comm.seconds), secs(p.comm.seconds), m.comm.seconds, p.comm.seconds);
  row("  exposed", secs(m.comm.exposed_seconds), secs(p.comm.exposed_seconds), m.comm.exposed_seconds,
      p.comm.exposed_seconds);
  // The same global batch runs in either step time: the predicted rate is the
  // measured one scaled by the ratio of the step times.
  const double predicted_rate = p.step_seconds > 0 ? m.rate * m.step_seconds / p.step_seconds : 0;
  const std::string unit = m.tokens ? "tokens/s" : "samples/s";
  row(unit.c_str(), fmt::format("{:.1f}", m.rate), fmt::format("{:.1f}", predicted_rate), m.rate, predicted_rate);
  row("MFU", fmt::format("{:.1f}%", 100 * m.mfu), fmt::format("{:.1f}%", 100 * p.mfu), m.mfu, p.mfu);
  return out;
}

std::string progress_json(const StepStats& s, int steps, const Trainer& t) {
  ProgressLine l;
  l.step = s.step + 1;
  l.steps = steps;
  l.loss = s.loss;
  l.step_seconds = s.seconds;
  l.tokens = t.tokens_per_sample() > 0;
  l.rate = throughput(s, t);
  l.peak_bytes = s.peak_bytes;
  return progress_line_json(l);
}

std::string memory_table(const RunReport& r) {
  const MemoryNumbers& meas = r.measured.memory;
  const MemoryNumbers& pred = r.predicted.memory;
  std::string out = fmt::format("\nMemory at the peak, rank {} (the highest), measured against predicted:\n", r.measured.rank);
  out += fmt::format("  {:<12} {:>12} {:>12} {:>8}\n", "category", "measured", "predicted", "diff");
  auto row = [&](const char* name, int64_t measured, int64_t predicted) {
    const double a = static_cast<double>(measured), b = static_cast<double>(predicted);
    const std::string diff = b > 0 ? fmt::format("{:+.1f}%", 100 * (a - b) / b) : (a > 0 ? "new" : "");
    out += fmt::format("  {:<12} {:>12} {:>12} {:>8}\n", name, format_bytes(a), format_bytes(b), diff);
  };
  for (Category c : kAllCategories)
    row(to_string(c), meas.at_peak[static_cast<size_t>(c)], pred.at_peak[static_cast<size_t>(c)]);
  if (meas.runtime > 0 || pred.runtime > 0) row("runtime", meas.runtime, pred.runtime);  // a GPU's context, NCCL
  row("peak", meas.peak, pred.peak);
  if (r.measured.reserved_bytes > 0)
    out += fmt::format("  cached by the allocator, not in use (reserved): {}\n",
                       format_bytes(static_cast<double>(r.measured.reserved_bytes)));
  out += fmt::format("  resident set (process high-water mark): {}\n", format_bytes(static_cast<double>(r.measured.rss_bytes)));
  if (total(r.measured.host) > 0 || total(r.predicted.host) > 0) {
    out += "Host memory (CPU offload), measured against predicted:\n";
    for (Category c : {Category::params, Category::grads, Category::optimizer})
      row(to_string(c), r.measured.host[static_cast<size_t>(c)], r.predicted.host[static_cast<size_t>(c)]);
  }
  return out;
}

}  // namespace dlplan::exec
