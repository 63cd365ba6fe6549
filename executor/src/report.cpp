#include "dlplan/exec/report.hpp"

#include "dlplan/format.hpp"
#include "dlplan/planner.hpp"

#include <fmt/format.h>

#include <algorithm>

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
  std::vector<RankMemory> all(static_cast<size_t>(comm.size()));
  comm.all_gather_bytes(&mine, all.data(), sizeof(RankMemory));
  return *std::max_element(all.begin(), all.end(), [](const RankMemory& a, const RankMemory& b) { return a.peak < b.peak; });
}

nlohmann::ordered_json run_report(const LoadedPlan& plan, Trainer& t, const RunMeasurement& m, int world, uint64_t seed) {
  using J = nlohmann::ordered_json;
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
  const double peak_flops = plan.cluster.device.fp32_flops;

  J memory = J::object();
  for (Category c : kAllCategories) memory[to_string(c)] = m.memory.at_peak[static_cast<size_t>(c)];
  memory["runtime"] = m.memory.runtime_bytes;
  memory["peak"] = m.memory.peak;
  J max_each = J::object();
  for (Category c : kAllCategories) max_each[to_string(c)] = m.memory.max_each[static_cast<size_t>(c)];

  J measured;
  measured["memory"] = memory;
  measured["reserved_bytes"] = m.memory.reserved_bytes;
  measured["memory_max_per_category"] = max_each;
  measured["rank"] = m.memory.rank;
  measured["step_seconds"] = step_s;
  measured["compute_seconds"] = step_s - exposed;
  measured["comm"] = {{"bytes", median(bytes)}, {"seconds", m.comm_busy_seconds}, {"exposed_seconds", exposed}};
  measured["mfu"] = step_s > 0 && peak_flops > 0 ? predicted.model_flops / step_s / peak_flops : 0.0;
  const double rate = step_s > 0 ? static_cast<double>(t.samples_per_step()) / step_s : 0;
  if (t.tokens_per_sample() > 0) measured["tokens_per_second"] = rate * static_cast<double>(t.tokens_per_sample());
  else measured["samples_per_second"] = rate;
  measured["rss_bytes"] = m.memory.rss_bytes;

  J report;
  report["schema_version"] = 1;
  report["kind"] = "report";
  report["plan"] = plan.document;
  report["world_size"] = world;
  report["seed"] = seed;
  report["steps"] = m.steps.size();
  report["loss"] = J::array();
  for (const auto& x : m.steps) report["loss"].push_back(x.loss);
  report["measured"] = measured;
  report["predicted"] = plan.document.contains("predicted") ? plan.document["predicted"] : J::object();
  return report;
}

std::string progress_text(const StepStats& s, int steps, const Trainer& t) {
  const bool tokens = t.tokens_per_sample() > 0;
  return fmt::format("step {:>4}/{}  loss {:.4f}  {:>9}  {:>12.1f} {}/s  peak {}", s.step + 1, steps, s.loss,
                     format_seconds(s.seconds), throughput(s, t), tokens ? "tokens" : "samples",
                     format_bytes(static_cast<double>(s.peak_bytes)));
}

std::string progress_json(const StepStats& s, int steps, const Trainer& t) {
  nlohmann::ordered_json j;
  j["step"] = s.step + 1;
  j["steps"] = steps;
  j["loss"] = s.loss;
  j["step_seconds"] = s.seconds;
  j[t.tokens_per_sample() > 0 ? "tokens_per_second" : "samples_per_second"] = throughput(s, t);
  j["peak_bytes"] = s.peak_bytes;
  return j.dump();
}

std::string memory_table(const nlohmann::ordered_json& r) {
  const auto& meas = r["measured"]["memory"];
  const auto& pred = r["predicted"]["memory"];
  std::string out = fmt::format("\nMemory at the peak, rank {} (the highest), measured against predicted:\n",
                                r["measured"]["rank"].get<int>());
  out += fmt::format("  {:<12} {:>12} {:>12} {:>8}\n", "category", "measured", "predicted", "diff");
  auto row = [&](const char* name) {
    const double a = meas.value(name, 0.0), b = pred.value(name, 0.0);
    const std::string diff = b > 0 ? fmt::format("{:+.1f}%", 100 * (a - b) / b) : (a > 0 ? "new" : "");
    out += fmt::format("  {:<12} {:>12} {:>12} {:>8}\n", name, format_bytes(a), format_bytes(b), diff);
  };
  for (Category c : kAllCategories) row(to_string(c));
  if (meas.value("runtime", 0.0) > 0 || pred.value("runtime", 0.0) > 0) row("runtime");  // a GPU's context, NCCL
  row("peak");
  if (const double reserved = r["measured"].value("reserved_bytes", 0.0); reserved > 0)
    out += fmt::format("  cached by the allocator, not in use (reserved): {}\n", format_bytes(reserved));
  out += fmt::format("  resident set (process high-water mark): {}\n",
                     format_bytes(r["measured"]["rss_bytes"].get<double>()));
  return out;
}

}  // namespace dlplan::exec
