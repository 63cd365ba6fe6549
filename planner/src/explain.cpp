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
#include "dlplan/explain.hpp"

#include "dlplan/format.hpp"

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

ModelStates compare_model_states(const Planning& p, const StrategyResult& r) {
  ModelStates out;
  const auto& at = r.walk.at_peak;
  auto cat = [&](Category c) { return at[static_cast<size_t>(c)]; };
  out.bytes = cat(Category::params) + cat(Category::grads) + cat(Category::optimizer) +
              (within_group(r.strategy) == Strategy::zero3 ? cat(Category::gathered) : 0);
  const auto& t = r.training;
  if (t.precision != Precision::bf16_mixed || t.optimizer.kind != OptimizerKind::adamw) return out;  // the formulas' setting

  const double psi = static_cast<double>(p.request.model.parameter_count());
  // Hybrid sharding is its ZeRO stage over the shard group: N is then G.
  const Strategy s = within_group(r.strategy);
  const double N = static_cast<double>(shard_world(t, p.request.cluster.world()));
  const double K = optimizer_bytes_per_param(t.precision, t.optimizer.kind);
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
  if (ms.estimates.size() > 1) out.push_back("  Why they differ: docs/deepspeed.md.");
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
  return j;
}

}  // namespace dlplan
