// --explain: the tensors at the peak, and the model states against the ZeRO
// paper's formulas and DeepSpeed's estimators.
//
// Ψ parameters, N GPUs, K optimizer bytes per parameter (12 for Adam under
// mixed precision: fp32 master, momentum and variance). Per GPU:
//   ZeRO paper (Rajbhandari et al. 2020, Figure 1), mixed precision:
//     ddp (2+2+K)Ψ,  zero1 4Ψ + KΨ/N,  zero2 2Ψ + (2+K)Ψ/N,  zero3 (2+2+K)Ψ/N
//   DeepSpeed (deepspeed/runtime/zero/stage_1_and_2.py and stage3.py), no offload:
//     estimate_zero2_model_states_mem_needs (stages 1 and 2)   4Ψ + 16Ψ/N
//     estimate_zero3_model_states_mem_needs                    4·L + 18Ψ/N, L = the largest layer's parameters
//   CPU offload, per GPU and per node of g GPUs (M nodes):
//     ZeRO-Offload paper (Ren et al. 2021, §4.1): the GPU keeps the fp16
//       parameters (2Ψ; ZeRO-3 its shard 2Ψ/N), the CPU fp32 gradients,
//       master weights, momentum and variance: 16Ψ/N per GPU, 16Ψ·g/N per node
//     DeepSpeed, cpu_offload=True, additional_buffer_factor 1.5:
//       estimate_zero2_model_states_mem_needs  GPU 2Ψ,          CPU Ψ·max(4·N, 16)·1.5
//       estimate_zero3_model_states_mem_needs  GPU 4·L + 2Ψ/N,  CPU 16Ψ/M·1.5 (zero_init)
//         with cpu_offload_params              GPU 4·L,         CPU 18Ψ/M·1.5
#include "dlplan/explain.hpp"

#include "dlplan/format.hpp"
#include "dlplan/collective_costs.hpp"
#include "dlplan/op_costs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace dlplan {
namespace {

constexpr size_t kShownTensors = 25;

std::string peak_moment(const StepWalk& w) {
  if (w.peak_event >= 0 && w.peak_event < static_cast<int>(w.compute.size()))
    return fmt::format("{} of '{}'", to_string(w.compute[static_cast<size_t>(w.peak_event)].phase),
                       w.compute[static_cast<size_t>(w.peak_event)].name);
  return "the step";
}

// The largest layer's parameters, as DeepSpeed's model_to_params counts them
// (per module; here per IR node).
std::pair<int64_t, std::string> largest_layer(const Model& m) {
  std::map<int, int64_t> per_node;
  for (const auto& p : m.params) per_node[p.node] += p.numel;
  std::pair<int64_t, std::string> best{0, ""};
  for (const auto& [node, n] : per_node)
    if (n > best.first) best = {n, m.nodes.at(static_cast<size_t>(node)).name};
  return best;
}

std::string gib(double b) { return format_bytes(b); }

}  // namespace

const StrategyResult& explained_row(const Planning& p) {
  const StrategyResult* r = p.chosen();
  return r ? *r : p.results.back();
}

namespace {

// CPU offload (the formulas at the top of this file).
ModelStates offload_model_states(const Planning& p, const StrategyResult& r, ModelStates out) {
  const auto& t = r.training;
  const auto& c = p.request.cluster;
  out.host_bytes = r.host.per_node;
  const double psi = static_cast<double>(p.request.model.parameter_count());
  const Strategy s = within_group(r.strategy);
  const double N = static_cast<double>(shard_world(t, c.world()));
  const double g = r.host.ranks, M = c.nodes;
  const bool params = t.offload == Offload::params;
  const double gathered = static_cast<double>(r.walk.at_peak[static_cast<size_t>(Category::gathered)]);
  const std::string n_is = hybrid(r.strategy) ? fmt::format(", N = the shard group, {}", N) : "";

  StateEstimate paper{"ZeRO-Offload paper (Ren et al. 2021, §4.1)", "", 0, {}};
  if (s == Strategy::zero3) {
    paper.formula = params ? "0 (parameters, gradients and optimizer on the CPU)" : "2Ψ/N (the parameter shard)";
    paper.bytes = params ? 0 : 2 * psi / N;
    paper.differences.push_back(fmt::format("dlplan adds the units gathered at the peak ({})", gib(gathered)));
  } else {
    paper.formula = "2Ψ (the fp16 parameters)";
    paper.bytes = 2 * psi;
    if (s == Strategy::zero1)
      paper.differences.push_back(fmt::format(
          "ZeRO-1 keeps the full bf16 gradients on the GPU until the step's end, where its shard goes down: +{}",
          gib(2 * psi)));
  }
  paper.formula += n_is;
  out.estimates.push_back(paper);
  StateEstimate ds;
  if (s == Strategy::zero3) {
    const auto [layer, name] = largest_layer(p.request.model);
    ds.source = fmt::format("DeepSpeed estimate_zero3_model_states_mem_needs (cpu_offload{})", params ? ", cpu_offload_params" : "");
    ds.formula = fmt::format("4·L{}, L = {} parameters ('{}')", params ? "" : " + 2Ψ/N", format_count(layer), name);
    ds.bytes = 4.0 * static_cast<double>(layer) + (params ? 0 : 2 * psi / N);
    ds.differences.push_back(fmt::format("4 bytes for each parameter of the largest layer ({}) where dlplan counts the "
                                         "bf16 units really gathered ({})",
                                         gib(4.0 * static_cast<double>(layer)), gib(gathered)));
  } else {
    ds.source = "DeepSpeed estimate_zero2_model_states_mem_needs (cpu_offload; stages 1 and 2)";
    ds.formula = "2Ψ";
    ds.bytes = 2 * psi;
  }
  out.estimates.push_back(ds);

  // Host, per node.
  const double per_param = params ? 18 : 16;
  StateEstimate hp{"ZeRO-Offload paper (Ren et al. 2021, §4.1)", fmt::format("{}Ψ·g/N, g = {} GPUs per node{}", per_param, g, n_is),
                   per_param * psi * g / N, {}};
  if (params) hp.differences.push_back("the paper keeps the parameters on the GPU; +2Ψ/N per GPU for their shard on the host");
  out.host_estimates.push_back(hp);
  StateEstimate hd;
  if (s == Strategy::zero3) {
    hd.source = fmt::format("DeepSpeed estimate_zero3_model_states_mem_needs (cpu_offload{}, zero_init)",
                            params ? ", cpu_offload_params" : "");
    hd.formula = fmt::format("{}Ψ/M·1.5, M = {} node{}", per_param, c.nodes, c.nodes == 1 ? "" : "s");
    hd.bytes = per_param * psi / M * 1.5;
  } else {
    hd.source = "DeepSpeed estimate_zero2_model_states_mem_needs (cpu_offload)";
    hd.formula = fmt::format("Ψ·max(4·N, 16)·1.5, N = {} GPUs", c.world());
    hd.bytes = psi * std::max(4.0 * c.world(), 16.0) * 1.5;
    hd.differences.push_back("it counts 16 bytes per parameter on every node, not divided among the nodes' shards, "
                             "and 4 per parameter per GPU for the fp32 copies each process makes while loading");
  }
  hd.differences.push_back("its additional_buffer_factor 1.5 (pinned transfer buffers, allocator slack) is not in dlplan's count");
  out.host_estimates.push_back(hd);
  return out;
}

// Where the step's op times come from (op_costs.hpp, docs/simulator.md).
std::string op_times_line(const Planning& p, const StrategyResult& r) {
  const auto& n = r.cost_sources;
  const auto& table = p.request.cluster.op_costs;
  std::string line = fmt::format("Op times of {}: {} measured by calibrate, {} scaled from another micro-batch, {} from "
                                 "calibrate's curves of their op kind, {} from the roofline of the device's figures",
                                 to_string(r.strategy), n[static_cast<size_t>(CostSource::measured)],
                                 n[static_cast<size_t>(CostSource::scaled)], n[static_cast<size_t>(CostSource::curve)],
                                 n[static_cast<size_t>(CostSource::roofline)]);
  if (table && r.cost_table_unused.empty()) line += fmt::format(" (table: {})", table->source);
  if (r.comm_measured + r.comm_modeled > 0) {
    line += fmt::format("; collectives: {} from calibrate's measured ladders, {} from the alpha-beta model", r.comm_measured,
                        r.comm_modeled);
    if (const auto& ladders = p.request.cluster.collective_costs; ladders && r.comm_measured > 0)
      line += fmt::format(" (ladders: {})", ladders->source);
  }
  return line;
}

}  // namespace

ModelStates compare_model_states(const Planning& p, const StrategyResult& r) {
  ModelStates out;
  const auto& at = r.walk.at_peak;
  auto cat = [&](Category c) { return at[static_cast<size_t>(c)]; };
  out.bytes = cat(Category::params) + cat(Category::grads) + cat(Category::optimizer) +
              (within_group(r.strategy) == Strategy::zero3 ? cat(Category::gathered) : 0);
  const auto& t = r.training;
  out.host_bytes = r.host.per_node;
  if (!mixed(t.precision) || t.optimizer.kind != OptimizerKind::adamw) return out;  // the formulas' setting
  if (t.offload != Offload::none) return offload_model_states(p, r, out);

  const double psi = static_cast<double>(p.request.model.parameter_count());
  // Hybrid sharding is its ZeRO stage over the shard group: N is then G.
  const Strategy s = within_group(r.strategy);
  const double N = static_cast<double>(shard_world(t, p.request.cluster.world()));
  const double K = optimizer_bytes_per_param(t.precision, t.optimizer.kind);
  if (t.fine_tuning.active()) {
    // The formulas assume every parameter trains; with Ψt of Ψ training,
    // gradients and optimizer state cover Ψt only (docs/fine-tuning.md).
    const double pt = static_cast<double>(p.request.model.trainable_parameter_count());
    StateEstimate ft{"ZeRO paper's formulas (Rajbhandari et al. 2020, Fig. 1) with Ψt of Ψ trainable", "", 0, {}};
    switch (s) {
      case Strategy::ddp: ft.formula = "2Ψ + (2+K)Ψt"; ft.bytes = 2 * psi + (2 + K) * pt; break;
      case Strategy::zero1: ft.formula = "2Ψ + 2Ψt + KΨt/N"; ft.bytes = 2 * psi + 2 * pt + K * pt / N; break;
      case Strategy::zero2: ft.formula = "2Ψ + (2+K)Ψt/N"; ft.bytes = 2 * psi + (2 + K) * pt / N; break;
      case Strategy::zero3: ft.formula = "2Ψ/N + (2+K)Ψt/N"; ft.bytes = (2 * psi + (2 + K) * pt) / N; break;
      case Strategy::hsdp2:
      case Strategy::hsdp3: break;  // not reached
    }
    ft.formula += fmt::format(" with K = {}, Ψt = {}", K, format_count(static_cast<int64_t>(pt)));
    if (s == Strategy::zero3)
      ft.differences.push_back(fmt::format("dlplan adds the units gathered at the peak ({})",
                                           gib(static_cast<double>(cat(Category::gathered)))));
    out.estimates.push_back(std::move(ft));
    return out;  // DeepSpeed's estimators know no frozen parameters
  }
  StateEstimate paper{"ZeRO paper (Rajbhandari et al. 2020, Fig. 1)", "", 0, {}};
  switch (s) {
    case Strategy::ddp: paper.formula = "(2+2+K)Ψ"; paper.bytes = (4 + K) * psi; break;
    case Strategy::zero1: paper.formula = "4Ψ + KΨ/N"; paper.bytes = 4 * psi + K * psi / N; break;
    case Strategy::zero2: paper.formula = "2Ψ + (2+K)Ψ/N"; paper.bytes = 2 * psi + (2 + K) * psi / N; break;
    case Strategy::zero3: paper.formula = "(2+2+K)Ψ/N"; paper.bytes = (4 + K) * psi / N; break;
    case Strategy::hsdp2:
    case Strategy::hsdp3: break;  // not reached: within_group() maps them to zero2 / zero3
  }
  paper.formula += fmt::format(" with K = {}", K);
  if (hybrid(r.strategy)) paper.formula += fmt::format(" and N = the shard group, {}", N);
  if (s == Strategy::zero3)
    paper.differences.push_back(fmt::format(
        "dlplan adds the units gathered at the peak ({}: the unit computing, {} prefetched, and the root unit kept "
        "whole), which the formula leaves out",
        gib(static_cast<double>(cat(Category::gathered))), t.prefetch));
  out.estimates.push_back(std::move(paper));
  if (s == Strategy::ddp) return out;

  StateEstimate ds;
  if (s == Strategy::zero3) {
    const auto [layer, name] = largest_layer(p.request.model);
    ds.source = "DeepSpeed estimate_zero3_model_states_mem_needs (no offload)";
    ds.formula = fmt::format("4·L + 18Ψ/N, L = {} parameters ('{}')", format_count(layer), name);
    ds.bytes = 4.0 * static_cast<double>(layer) + 18 * psi / N;
    ds.differences.push_back(fmt::format(
        "18 bytes per parameter per shard where the ZeRO paper and dlplan count 16 (2 + 2 + K): +{}",
        gib(2 * psi / N)));
    ds.differences.push_back(fmt::format(
        "4 bytes for each parameter of the largest layer ({}) where dlplan counts the bf16 units really gathered "
        "({})",
        gib(4.0 * static_cast<double>(layer)), gib(static_cast<double>(cat(Category::gathered)))));
  } else {
    ds.source = "DeepSpeed estimate_zero2_model_states_mem_needs (no offload; stages 1 and 2)";
    ds.formula = "4Ψ + 16Ψ/N";
    ds.bytes = 4 * psi + 16 * psi / N;
    if (s == Strategy::zero2)
      ds.differences.push_back(fmt::format(
          "it counts the fp16 gradients at full size on every GPU (2Ψ) where ZeRO-2 keeps only its shard (2Ψ/N; the "
          "buckets in flight are in 'comm'): +{}",
          gib(2 * psi * (1 - 1 / N))));
    ds.differences.push_back(fmt::format(
        "it counts an fp32 copy of the gradient shard that DeepSpeed's optimizer step makes (4Ψ/N), where dlplan's "
        "optimizer reads the {} gradients in place: +{}",
        s == Strategy::zero2 ? "sharded" : "reduced", gib(4 * psi / N)));
  }
  out.estimates.push_back(std::move(ds));
  return out;
}

std::vector<std::string> explain_lines(const Planning& p) {
  const StrategyResult& r = explained_row(p);
  const auto& w = r.walk;
  std::vector<std::string> out;
  out.push_back(fmt::format("Peak of {}: {} during {}. Tensors alive then, largest first:", to_string(r.strategy),
                            format_bytes(static_cast<double>(w.peak)), peak_moment(w)));
  out.push_back(fmt::format("  {:>11}  {:<12} {:<44} {}", "bytes", "category", "tensor", "held by"));
  int64_t rest = 0;
  for (size_t i = 0; i < w.peak_tensors.size(); ++i) {
    const auto& t = w.peak_tensors[i];
    if (i < kShownTensors)
      out.push_back(fmt::format("  {:>11}  {:<12} {:<44} {}", format_bytes(static_cast<double>(t.bytes)),
                                to_string(t.category), t.what, t.holder));
    else
      rest += t.bytes;
  }
  if (w.peak_tensors.size() > kShownTensors)
    out.push_back(fmt::format("  ... and {} smaller tensors, {} in all", w.peak_tensors.size() - kShownTensors,
                              format_bytes(static_cast<double>(rest))));

  const ModelStates ms = compare_model_states(p, r);
  out.emplace_back();
  out.push_back(fmt::format("Model states of {} per GPU (params + grads + optimizer{} at the peak): {}",
                            to_string(r.strategy), within_group(r.strategy) == Strategy::zero3 ? " + gathered" : "",
                            format_bytes(static_cast<double>(ms.bytes))));
  if (ms.estimates.empty())
    out.push_back("  (the ZeRO paper's and DeepSpeed's formulas assume bf16/fp16 mixed precision with Adam)");
  for (const auto& e : ms.estimates) {
    out.push_back(fmt::format("  {}: {} = {}", e.source, e.formula, format_bytes(e.bytes)));
    for (const auto& d : e.differences) out.push_back("    - " + d);
  }
  if (r.training.offload != Offload::none) {
    out.push_back(fmt::format("Host memory per node under --offload {} ({} ranks' params + grads + optimizer): {}",
                              to_string(r.training.offload), r.host.ranks, format_bytes(static_cast<double>(ms.host_bytes))));
    for (const auto& e : ms.host_estimates) {
      out.push_back(fmt::format("  {}: {} = {}", e.source, e.formula, format_bytes(e.bytes)));
      for (const auto& d : e.differences) out.push_back("    - " + d);
    }
  }
  if (ms.estimates.size() > 1) out.push_back("  Why they differ: docs/deepspeed.md.");
  out.push_back(op_times_line(p, r));
  if (!r.cost_table_unused.empty()) out.push_back("  " + r.cost_table_unused);
  return out;
}

OrderedJson explain_json(const Planning& p) {
  const StrategyResult& r = explained_row(p);
  const auto& w = r.walk;
  OrderedJson j;
  j["strategy"] = to_string(r.strategy);
  j["peak_bytes"] = w.peak;
  j["during"] = peak_moment(w);
  j["tensors"] = OrderedJson::array();
  for (const auto& t : w.peak_tensors)
    j["tensors"].push_back({{"bytes", t.bytes}, {"category", to_string(t.category)}, {"tensor", t.what}, {"held_by", t.holder}});
  const ModelStates ms = compare_model_states(p, r);
  j["model_states"] = {{"bytes", ms.bytes}, {"estimates", OrderedJson::array()}};
  for (const auto& e : ms.estimates)
    j["model_states"]["estimates"].push_back(
        {{"source", e.source}, {"formula", e.formula}, {"bytes", e.bytes}, {"differences", e.differences}});
  j["op_times"] = {{"measured", r.cost_sources[static_cast<size_t>(CostSource::measured)]},
                   {"scaled", r.cost_sources[static_cast<size_t>(CostSource::scaled)]},
                   {"curve", r.cost_sources[static_cast<size_t>(CostSource::curve)]},
                   {"roofline", r.cost_sources[static_cast<size_t>(CostSource::roofline)]}};
  if (p.request.cluster.op_costs) j["op_times"]["table"] = p.request.cluster.op_costs->source;
  if (!r.cost_table_unused.empty()) j["op_times"]["unused"] = r.cost_table_unused;
  j["collective_times"] = {{"measured", r.comm_measured}, {"modeled", r.comm_modeled}};
  if (const auto& ladders = p.request.cluster.collective_costs)
    j["collective_times"]["ladders"] = fmt::format("{}, {} ranks", ladders->source, ladders->ranks);
  if (r.training.offload != Offload::none) {
    j["host_states"] = {{"bytes_per_node", ms.host_bytes}, {"estimates", OrderedJson::array()}};
    for (const auto& e : ms.host_estimates)
      j["host_states"]["estimates"].push_back(
          {{"source", e.source}, {"formula", e.formula}, {"bytes", e.bytes}, {"differences", e.differences}});
  }
  return j;
}

}  // namespace dlplan
