// Published training runs (tests/planner/data/published_runs.csv) and what
// dlplan predicts for them: the model, cluster and training knobs of each row,
// the predicted throughput per GPU, and the error against the measurement.
// Shared by the held-out validation test (gpu_model_test.cpp) and the
// validation benchmark (bench/gpu_validation.cpp), which prints the table.
#pragma once

#include "dlplan/error.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/simulator.hpp"
#include "dlplan/zoo.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace dlplan::published {

// One row of published_runs.csv (the file's header names the columns).
struct Run {
  std::string id, source, gpu, family, model;
  int layers = 0, hidden = 0, heads = 0, vocab = 0, seq_len = 0;
  int gpus = 1, gpus_per_node = 8;
  int64_t micro_batch = 1, grad_accum = 1;
  std::string strategy, checkpointing, attention, precision;
  double measured = 0;  // per GPU, in `unit`
  std::string unit;     // "tokens/s/gpu" or "samples/s/gpu"
  double measured_mfu = 0;
  int64_t params = 0;   // the source's parameter count (0: not given)
  std::string split;    // "fit" or "validation"
  std::string note;
};

// Splits one CSV line; fields may be double-quoted (no quotes inside).
inline std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (char ch : line) {
    if (ch == '"') {
      quoted = !quoted;
    } else if (ch == ',' && !quoted) {
      out.push_back(cur);
      cur.clear();
    } else if (ch != '\r') {
      cur += ch;
    }
  }
  out.push_back(cur);
  return out;
}

inline std::vector<Run> load_runs(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open");
  std::string line;
  std::vector<std::string> header;
  std::vector<Run> runs;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    auto f = csv_fields(line);
    if (header.empty()) {
      header = f;
      continue;
    }
    if (f.size() != header.size())
      throw Error(path + ": a row has " + std::to_string(f.size()) + " fields, the header " + std::to_string(header.size()));
    std::map<std::string, std::string> v;
    for (size_t i = 0; i < f.size(); ++i) v[header[i]] = f[i];
    auto num = [&](const char* k) { return v[k].empty() ? 0.0 : std::stod(v[k]); };
    Run r;
    r.id = v["id"];
    r.source = v["source"];
    r.gpu = v["gpu"];
    r.family = v["family"];
    r.model = v["model"];
    r.layers = static_cast<int>(num("layers"));
    r.hidden = static_cast<int>(num("hidden"));
    r.heads = static_cast<int>(num("heads"));
    r.vocab = static_cast<int>(num("vocab"));
    r.seq_len = static_cast<int>(num("seq_len"));
    r.gpus = static_cast<int>(num("gpus"));
    r.gpus_per_node = static_cast<int>(num("gpus_per_node"));
    r.micro_batch = static_cast<int64_t>(num("micro_batch"));
    r.grad_accum = static_cast<int64_t>(num("grad_accum"));
    r.strategy = v["strategy"];
    r.checkpointing = v["checkpointing"];
    r.attention = v["attention"];
    r.precision = v["precision"];
    r.measured = num("measured");
    r.unit = v["unit"];
    r.measured_mfu = num("measured_mfu");
    r.params = static_cast<int64_t>(num("params"));
    r.split = v["split"];
    r.note = v["note"];
    runs.push_back(r);
  }
  return runs;
}

// The model a row describes, from the zoo's builders.
inline Model run_model(const Run& r) {
  if (r.family == "gpt") {
    // MPT as llm-foundry benchmarks it: GPT-2 layout (learned positions,
    // biases, LayerNorm, GELU MLP x4, tied head), no dropout.
    zoo::GptConfig c;
    c.name = r.model;
    c.layers = r.layers;
    c.hidden = r.hidden;
    c.heads = r.heads;
    c.vocab = r.vocab;
    c.context = r.seq_len;
    c.dropout = 0;
    // llm-foundry's MPT loss is flash-attn's fused cross-entropy by default
    // (llmfoundry/models/mpt/modeling_mpt.py: om_model_config.get('loss_fn',
    // 'fused_crossentropy')): it keeps the logits and a log-sum-exp per row,
    // no fp32 probabilities.
    c.fused_loss = r.source == "llm-foundry";
    return parse_model(zoo::build_gpt(c), r.model);
  }
  if (r.family == "bert") {
    zoo::BertConfig c;
    c.name = r.model;
    c.layers = r.layers;
    c.hidden = r.hidden;
    c.heads = r.heads;
    c.intermediate = 4 * r.hidden;
    c.vocab = r.vocab;
    c.context = r.seq_len;
    return parse_model(zoo::build_bert(c), r.model);
  }
  if (r.family == "resnet") return load_model(r.model);
  throw Error(r.id + ": unknown family " + r.family);
}

inline Cluster run_cluster(const Run& r) {
  Cluster c;
  c.device = find_device(r.gpu);
  c.gpus_per_node = std::min(r.gpus, r.gpus_per_node);
  c.nodes = r.gpus / c.gpus_per_node;
  return c;
}

inline TrainingConfig run_training(const Run& r) {
  TrainingConfig t;
  t.strategy = parse_strategy(r.strategy);
  t.precision = parse_precision(r.precision);
  t.checkpointing = parse_checkpointing(r.checkpointing);
  t.attention = parse_attention(r.attention);
  t.micro_batch = r.micro_batch;
  t.grad_accum = r.grad_accum;
  t.optimizer.kind = r.family == "resnet" ? OptimizerKind::sgd_momentum : OptimizerKind::adamw;
  return t;
}

// Per-source differences of the software stack (published_stacks.json):
// flash_speed scales the FlashAttention efficiencies for that source's runs.
struct Stacks {
  std::map<std::string, double> flash_speed;
};

inline Stacks load_stacks(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open");
  const nlohmann::json j = nlohmann::json::parse(in);
  Stacks s;
  for (const auto& [source, v] : j.items())
    if (v.is_object() && v.contains("flash_speed")) s.flash_speed[source] = v.at("flash_speed").get<double>();
  return s;
}

// The device a run's stack had: the catalog's, with the source's differences.
inline DeviceSpec stack_device(const DeviceSpec& d, const std::string& source, const Stacks& s) {
  DeviceSpec out = d;
  if (auto it = s.flash_speed.find(source); it != s.flash_speed.end()) {
    out.flash_fwd_efficiency *= it->second;
    out.flash_bwd_efficiency *= it->second;
  }
  return out;
}

// One run made ready to simulate: its model, cluster, knobs and step
// program, built once; the memory verdict does not depend on the time model.
struct Case {
  Run run;
  Cluster cluster;
  TrainingConfig training;
  StepProgram program;
  bool fits = false;
  double peak_gib = 0;   // peak + runtime + margin
};

inline Case make_case(const Run& r) {
  Case c;
  c.run = r;
  const Model m = run_model(r);
  c.cluster = run_cluster(r);
  c.training = run_training(r);
  c.program = build_step_program(m, c.cluster, c.training);
  const StrategyResult s = evaluate(m, c.cluster, c.training);
  c.fits = s.fits;
  c.peak_gib = static_cast<double>(s.walk.peak + s.runtime_bytes + s.margin_bytes) / (1u << 30);
  return c;
}

struct Prediction {
  Run run;
  double predicted = 0;  // per GPU, in run.unit
  double error = 0;      // predicted / measured - 1
  bool fits = false;
  double peak_gib = 0;
  double step_seconds = 0;
  double mfu = 0;
};

// The run simulated on `device` (the case's own, or one with other figures).
inline Prediction predict(const Case& c, const DeviceSpec& device) {
  Prediction p;
  p.run = c.run;
  Cluster cl = c.cluster;
  cl.device = device;
  const Simulation sim = simulate_program(c.program, cl, c.training, false);
  const double samples = static_cast<double>(c.run.micro_batch * c.run.grad_accum);
  const double per_sample = c.run.unit == "tokens/s/gpu" ? static_cast<double>(c.run.seq_len) : 1.0;
  p.step_seconds = sim.step_seconds;
  p.predicted = samples * per_sample / sim.step_seconds;
  p.error = p.predicted / c.run.measured - 1;
  p.fits = c.fits;
  p.peak_gib = c.peak_gib;
  p.mfu = sim.mfu;
  return p;
}
inline Prediction predict(const Case& c) { return predict(c, c.cluster.device); }
inline Prediction predict(const Run& r) { return predict(make_case(r)); }

struct Stats {
  int n = 0, fits = 0;
  double median = 0, worst = 0;  // of |error|
  double p90 = 0;                // |error| 90 % of the runs stay within (nearest rank): the catalog's time_uncertainty
  double signed_median = 0;
};

inline Stats stats(const std::vector<const Prediction*>& ps) {
  Stats s;
  std::vector<double> a, e;
  for (const auto* p : ps) {
    a.push_back(std::fabs(p->error));
    e.push_back(p->error);
    s.fits += p->fits;
  }
  s.n = static_cast<int>(a.size());
  if (a.empty()) return s;
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t k = v.size();
    return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
  };
  s.median = med(a);
  s.signed_median = med(e);
  s.worst = *std::max_element(a.begin(), a.end());
  std::sort(a.begin(), a.end());
  s.p90 = a[static_cast<size_t>(std::ceil(0.9 * static_cast<double>(a.size()))) - 1];
  return s;
}

}  // namespace dlplan::published
