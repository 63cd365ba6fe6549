// GPU step-time validation: every published training run in
// tests/planner/data/published_runs.csv (llm-foundry's MPT benchmarks,
// NVIDIA DeepLearningExamples' ResNet-50 and BERT) planned and simulated by
// dlplan, the predicted throughput per GPU beside the measured one. Prints
// one line per run (with --rows) and the error per GPU kind and per source,
// for the rows the model was fitted on and for the held-out validation rows.
// Asserts nothing: tests/planner/gpu_model_test.cpp holds the bounds.
#include "published_runs.hpp"

#include <fmt/format.h>

#include "dlplan/simulator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>

using namespace dlplan;
using namespace dlplan::published;

namespace {

void table(const char* title, const std::vector<Prediction>& ps, const std::string& split) {
  std::map<std::string, std::vector<const Prediction*>> by_gpu, by_source;
  std::vector<const Prediction*> all;
  for (const auto& p : ps) {
    if (split.empty() ? p.run.split == "excluded" : p.run.split != split) continue;
    by_gpu[p.run.gpu].push_back(&p);
    by_source[p.run.source].push_back(&p);
    all.push_back(&p);
  }
  fmt::print("\n{}\n", title);
  fmt::print("{:<14} {:<12} {:>4} {:>10} {:>10} {:>10} {:>13} {:>6}\n", "group", "", "n", "median |e|", "p90 |e|", "worst |e|",
             "median signed", "fits");
  auto line = [](const std::string& kind, const std::string& name, const std::vector<const Prediction*>& v) {
    const Stats s = stats(v);
    fmt::print("{:<14} {:<12} {:>4} {:>9.1f}% {:>9.1f}% {:>9.1f}% {:>12.1f}% {:>3}/{:<3}\n", kind, name, s.n, 100 * s.median,
               100 * s.p90, 100 * s.worst, 100 * s.signed_median, s.fits, s.n);
  };
  for (const auto& [k, v] : by_gpu) line("gpu", k, v);
  for (const auto& [k, v] : by_source) line("source", k, v);
  line("all", "", all);
}

}  // namespace

// Where one run's predicted step goes: compute per op class (GEMM ops,
// attention ops, memory-bound ops, the optimizer), communication, exposure.
void breakdown(const Run& r) {
  const Model m = run_model(r);
  const Cluster c = run_cluster(r);
  const TrainingConfig t = run_training(r);
  const StepProgram prog = build_step_program(m, c, t);
  std::map<std::string, double> by;
  for (const ComputeEvent& e : prog.compute) {
    const double s = compute_event_seconds(e, c.device, t.precision) * (e.phase == Phase::optimizer ? 1.0 : static_cast<double>(t.grad_accum));
    const std::string phase = to_string(e.phase);
    const std::string cls = e.phase == Phase::optimizer ? "optimizer" : e.attention.batch > 0 ? "attention" : !e.gemms.empty() ? "gemm" : "memory";
    by[cls + " " + phase] += s;
    by["total compute"] += s;
  }
  const Simulation sim = simulate_program(prog, c, t, false);
  fmt::print("{}: step {:.1f} ms, compute busy {:.1f} ms, comm busy {:.1f} ms, exposed {:.1f} ms, MFU {:.3f} (measured {:.3f})\n", r.id,
             sim.step_seconds * 1e3, sim.compute_seconds * 1e3, sim.comm_seconds * 1e3, sim.exposed_seconds * 1e3, sim.mfu, r.measured_mfu);
  for (const auto& [k, v] : by) fmt::print("  {:<24} {:10.2f} ms\n", k, v * 1e3);
  const StrategyResult res = evaluate(m, c, t);
  fmt::print("  memory at the peak:");
  for (Category cat : kAllCategories)
    fmt::print(" {} {:.2f}", to_string(cat), static_cast<double>(res.walk.at_peak[static_cast<size_t>(cat)]) / (1u << 30));
  fmt::print(" GiB; peak {:.2f} + runtime {:.2f} + margin {:.2f} of {:.2f} GiB\n", res.walk.peak / 1073741824.0,
             res.runtime_bytes / 1073741824.0, res.margin_bytes / 1073741824.0, res.capacity_bytes / 1073741824.0);
}

// The chip a catalog kind belongs to: parameters fitted per chip (both A100
// memory sizes are one chip).
// The fit's bound on comm_slowdown (compute at most this much slower while
// NCCL runs beside it); GPU_VALIDATION_MAX_SLOWDOWN overrides it to study the fit.
const double kMaxCommSlowdown = std::getenv("GPU_VALIDATION_MAX_SLOWDOWN") ? std::atof(std::getenv("GPU_VALIDATION_MAX_SLOWDOWN")) : 1.0;

std::string chip(const std::string& kind) { return kind.rfind("a100", 0) == 0 ? "a100" : kind; }

// --fit: the parameters a training step adds to the kernel curves, fitted to
// the fit rows by coordinate descent on the mean |log(predicted/measured)|,
// each (source, GPU kind) group weighted equally: per chip the sustained
// share of the GEMM/attention curves and the memory-bound share of HBM
// bandwidth; one comm_slowdown; each source's flash_speed (its attention
// kernel against FlashAttention-2). Prints the values for planner/catalog
// and published_stacks.json.
void fit(const std::vector<Case>& cases, Stacks stacks) {
  std::vector<const Case*> rows;
  std::map<std::string, int> group_size;
  for (const auto& c : cases)
    if (c.run.split == "fit") {
      rows.push_back(&c);
      group_size[c.run.source + "/" + c.run.gpu]++;
    }
  std::vector<std::string> chips;
  for (const auto* c : rows)
    if (std::find(chips.begin(), chips.end(), chip(c->run.gpu)) == chips.end()) chips.push_back(chip(c->run.gpu));
  std::vector<std::string> sources;
  for (const auto& [src, v] : stacks.flash_speed) sources.push_back(src);
  // x = [sustained per chip..., memory per chip..., comm_slowdown, rank_jitter, flash_speed per source...]
  std::vector<double> x, lo, hi;
  for (size_t i = 0; i < chips.size(); ++i) x.push_back(0.8), lo.push_back(0.2), hi.push_back(1.0);
  for (size_t i = 0; i < chips.size(); ++i) x.push_back(0.7), lo.push_back(0.2), hi.push_back(1.0);
  x.push_back(0.0), lo.push_back(0.0), hi.push_back(kMaxCommSlowdown);
  x.push_back(0.0), lo.push_back(0.0), hi.push_back(0.1);
  for (size_t i = 0; i < sources.size(); ++i) x.push_back(stacks.flash_speed[sources[i]]), lo.push_back(0.2), hi.push_back(1.0);
  auto device_for = [&](const Case& c, const std::vector<double>& v) {
    DeviceSpec d = c.cluster.device;
    const size_t k = static_cast<size_t>(std::find(chips.begin(), chips.end(), chip(c.run.gpu)) - chips.begin());
    // A chip without its GEMM curve (V100: no published fp32 curve) keeps
    // the roofline, whose GEMM share is what the runs fit instead.
    if (d.has_kernel_model()) d.sustained_share = v[k];
    else d.gemm_efficiency = v[k];
    d.memory_efficiency = v[chips.size() + k];
    d.comm_slowdown = v[2 * chips.size()];
    d.rank_jitter = v[2 * chips.size() + 1];
    Stacks st;
    for (size_t i = 0; i < sources.size(); ++i) st.flash_speed[sources[i]] = v[2 * chips.size() + 2 + i];
    return stack_device(d, c.run.source, st);
  };
  auto loss = [&](const std::vector<double>& v) {
    double sum = 0;
    for (const auto* c : rows)
      sum += std::fabs(std::log1p(predict(*c, device_for(*c, v)).error)) / group_size[c->run.source + "/" + c->run.gpu];
    return sum / static_cast<double>(group_size.size());
  };
  // Steps are a share of each parameter's range, halved when no step helps.
  double best = loss(x), step = 0.125;
  while (step > 0.001) {
    bool moved = false;
    for (size_t i = 0; i < x.size(); ++i)
      for (double dir : {step, -step}) {
        std::vector<double> y = x;
        y[i] = std::clamp(y[i] + dir * (hi[i] - lo[i]), lo[i], hi[i]);
        const double l = loss(y);
        if (l < best - 1e-9) best = l, x = y, moved = true;
      }
    if (!moved) step /= 2;
  }
  fmt::print("fitted on {} fit rows, {} (source, GPU) groups: mean |log error| {:.4f}\n", rows.size(), group_size.size(), best);
  for (size_t i = 0; i < chips.size(); ++i)
    fmt::print("  {:<10} sustained_share (gemm_efficiency without a GEMM curve) {:.3f}  memory_efficiency {:.3f}\n", chips[i], x[i],
               x[chips.size() + i]);
  fmt::print("  comm_slowdown {:.3f}  rank_jitter {:.4f}\n", x[2 * chips.size()], x[2 * chips.size() + 1]);
  for (size_t i = 0; i < sources.size(); ++i) fmt::print("  {} flash_speed {:.3f}\n", sources[i], x[2 * chips.size() + 2 + i]);
}

// Coordinate descent on `loss` over x within [lo, hi]: steps a share of each
// range, halved when no step helps.
std::vector<double> descend(std::vector<double> x, const std::vector<double>& lo, const std::vector<double>& hi,
                            const std::function<double(const std::vector<double>&)>& loss) {
  double best = loss(x), step = 0.125;
  while (step > 1e-4) {
    bool moved = false;
    for (size_t i = 0; i < x.size(); ++i)
      for (double dir : {step, -step}) {
        std::vector<double> y = x;
        y[i] = std::clamp(y[i] + dir * (hi[i] - lo[i]), lo[i], hi[i]);
        const double l = loss(y);
        if (l < best - 1e-12) best = l, x = y, moved = true;
      }
    if (!moved) step /= 2;
  }
  return x;
}

std::vector<std::vector<std::string>> data_rows(const std::string& name) {
  std::ifstream in(std::string(DLPLAN_SOURCE_DIR) + "/tests/planner/data/" + name);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (!header) rows.push_back(csv_fields(line));
    header = false;
  }
  return rows;
}

// --fit-kernels: the H100 kernel curves from their published measurements:
// the GEMM curve (ceiling, k_half, launch) on OpenXLA's table with 128-tiles
// and split-K slices of at least 128, and FlashAttention-2's figures on the
// FlashAttention-3 paper's bars; least mean |log error|.
void fit_kernels() {
  DeviceSpec d = find_device("h100-80g");
  d.sustained_share = 0;
  d.memory_efficiency = 0.90;  // a copy kernel's share (one H200, REFERENCES.md)
  const auto gemms = data_rows("gemm_h100_xla.csv");
  auto gemm_loss = [&](const std::vector<double>& x) {
    DeviceSpec e = d;
    e.gemm_efficiency = x[0], e.gemm_k_half = x[1], e.op_overhead_s = x[2] * 1e-6;
    double sum = 0;
    for (const auto& f : gemms) {
      const GemmShape g{std::stod(f[2]), std::stod(f[3]), std::stod(f[4]), std::stod(f[1])};
      const double flops = 2 * g.m * g.n * g.k * g.batch;
      sum += std::fabs(std::log(flops / (e.op_overhead_s + gemm_seconds(g, e, Precision::bf16_mixed)) / 1e12 / std::stod(f[5])));
    }
    return sum / static_cast<double>(gemms.size());
  };
  const auto g = descend({0.85, 128, 5}, {0.5, 0, 0}, {1, 512, 20}, gemm_loss);
  fmt::print("GEMM (H100, tile {}, split-K >= {}): gemm_efficiency {:.4f}  gemm_k_half {:.1f}  op_overhead_s {:.2f} us  (mean |log e| {:.4f})\n",
             d.gemm_tile, d.gemm_split_k_min, g[0], g[1], g[2], gemm_loss(g));
  const auto points = data_rows("flash_attention.csv");
  auto flash_loss = [&](const std::vector<double>& x) {
    DeviceSpec e = d;
    e.flash_fwd_efficiency = x[0], e.flash_bwd_efficiency = x[1], e.flash_fwd_seq_half = x[2];
    e.flash_bwd_seq_half = x[3], e.flash_causal_seq_half = x[4], e.flash_head_dim_half = x[5];
    double sum = 0;
    int n = 0;
    for (const auto& f : points) {
      if (f[1] != "fa2") continue;
      AttentionCore a;
      a.seq = std::stod(f[5]);
      a.head_dim = std::stod(f[3]);
      a.batch = 16384 / a.seq * (2048 / a.head_dim);
      a.causal = f[4] == "1";
      a.flash = true;
      const bool bwd = f[2] == "bwd";
      const double flops = 4 * a.batch * a.seq * a.seq * a.head_dim * (a.causal ? 0.5 : 1) * (bwd ? 2.5 : 1);
      sum += std::fabs(std::log(flops / attention_core_seconds(a, bwd ? Phase::backward : Phase::forward, e, Precision::bf16_mixed) / 1e12 /
                                std::stod(f[6])));
      ++n;
    }
    return sum / n;
  };
  const auto a = descend({0.4, 0.35, 100, 300, 400, 20}, {0.05, 0.05, 0, 0, 0, 0}, {1, 1, 2000, 2000, 4000, 200}, flash_loss);
  fmt::print("FlashAttention-2 (H100): flash_fwd_efficiency {:.4f}  flash_bwd_efficiency {:.4f}  flash_fwd_seq_half {:.1f}  "
             "flash_bwd_seq_half {:.1f}  flash_causal_seq_half {:.1f}  flash_head_dim_half {:.1f}  (mean |log e| {:.4f})\n",
             a[0], a[1], a[2], a[3], a[4], a[5], flash_loss(a));
}

int main(int argc, char** argv) {
  bool rows = false, fitting = false;
  std::vector<std::string> explain;
  std::string path = std::string(DLPLAN_SOURCE_DIR) + "/tests/planner/data/published_runs.csv";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rows") == 0) rows = true;
    else if (std::strcmp(argv[i], "--breakdown") == 0 && i + 1 < argc) explain.push_back(argv[++i]);
    else if (std::strcmp(argv[i], "--fit") == 0) fitting = true;
    else if (std::strcmp(argv[i], "--fit-kernels") == 0) {
      fit_kernels();
      return 0;
    }
    else path = argv[i];
  }
  if (!explain.empty()) {
    for (const Run& r : load_runs(path))
      for (const auto& id : explain)
        if (r.id == id) breakdown(r);
    return 0;
  }
  const Stacks stacks = load_stacks(std::string(DLPLAN_SOURCE_DIR) + "/tests/planner/data/published_stacks.json");
  std::vector<Case> cases;
  for (const Run& r : load_runs(path)) cases.push_back(make_case(r));
  if (fitting) {
    fit(cases, stacks);
    return 0;
  }
  std::vector<Prediction> ps;
  for (const Case& c : cases) ps.push_back(predict(c, stack_device(c.cluster.device, c.run.source, stacks)));
  if (rows) {
    fmt::print("{:<48} {:<10} {:>12} {:>12} {:>8} {:>6} {:>6} {:>8}\n", "run", "split", "measured", "predicted", "error", "MFU", "pred", "fits");
    for (const auto& p : ps)
      fmt::print("{:<48} {:<10} {:>12.1f} {:>12.1f} {:>7.1f}% {:>6.3f} {:>6.3f} {:>4} {:.1f}\n", p.run.id, p.run.split, p.run.measured,
                 p.predicted, 100 * p.error, p.run.measured_mfu, p.mfu, p.fits ? "yes" : "NO", p.peak_gib);
  }
  fmt::print("dlplan GPU step-time validation: {} published runs ({})\n", ps.size(), path);
  table("held-out validation rows", ps, "validation");
  table("fit rows", ps, "fit");
  table("all rows but the excluded", ps, "");
  table("excluded rows (published_runs.csv says why)", ps, "excluded");
  return 0;
}
