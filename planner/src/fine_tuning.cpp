#include "dlplan/fine_tuning.hpp"

#include "dlplan/format.hpp"
#include "dlplan/limits.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/planner.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fnmatch.h>

#include <algorithm>
#include <string_view>

namespace dlplan {
namespace {

bool glob_match(const std::string& pattern, const std::string& text) {
  return !text.empty() && fnmatch(pattern.c_str(), text.c_str(), 0) == 0;
}

bool is_projection(std::string_view t) { return t == "q" || t == "k" || t == "v" || t == "o"; }

// A few names of the nodes of `op`, for messages.
std::string some_names(const Model& m, OpKind op) {
  std::vector<std::string> names;
  for (const Node& n : m.nodes)
    if (n.op == op && names.size() < 4) names.push_back(n.name);
  if (names.empty()) return "none";
  return fmt::format("{}{}", fmt::join(names, ", "), names.size() == 4 ? ", ..." : "");
}

void add_lora(Model& m, const FineTuning& f) {
  const std::vector<std::string> targets = f.lora_targets.empty() ? kDefaultLoraTargets : f.lora_targets;
  std::string projections;  // in q, k, v, o order
  for (const char* p : {"q", "k", "v", "o"})
    if (std::find(targets.begin(), targets.end(), p) != targets.end()) projections += projections.empty() ? p : std::string(",") + p;
  bool has_attention = false;
  for (const Node& n : m.nodes) has_attention |= n.op == OpKind::attention;
  if (!projections.empty() && !has_attention)
    throw UsageError(fmt::format("--lora-targets: {} names attention's projections, and {} has no attention node "
                                 "(its linear nodes: {})", projections, m.name, some_names(m, OpKind::linear)));
  for (const std::string& t : targets) {
    if (is_projection(t)) continue;
    // A glob adapts the linear nodes among those it matches ('*.mlp.*').
    bool matched = false;
    const Node* other = nullptr;
    for (Node& n : m.nodes) {
      if (!glob_match(t, n.name)) continue;
      if (n.op != OpKind::linear) {
        if (!other) other = &n;
        continue;
      }
      n.attrs.values["lora_rank"] = f.lora_rank;
      n.attrs.values["lora_scale"] = f.lora_scale();
      matched = true;
    }
    if (!matched && other)
      throw UsageError(fmt::format("--lora-targets: '{}' matches no linear node, only others such as {} (attention's "
                                   "own projections are q, k, v, o)", t, node_label(*other)));
    if (!matched)
      throw UsageError(fmt::format("--lora-targets: '{}' matches no node of {} (its linear nodes: {}; attention's "
                                   "projections: q, k, v, o)", t, m.name, some_names(m, OpKind::linear)));
  }
  if (!projections.empty())
    for (Node& n : m.nodes)
      if (n.op == OpKind::attention) {
        n.attrs.values["lora_rank"] = f.lora_rank;
        n.attrs.values["lora_scale"] = f.lora_scale();
        n.attrs.values["lora_targets"] = projections;
      }
  // A rank above min(in, out) adds nothing a full update of W would not.
  for (const Node& n : m.nodes)
    for (const LoraAdapter& a : lora_adapters(m, n))
      if (a.rank > std::min(a.in, a.out))
        throw UsageError(fmt::format("--lora {}: above min(in, out) = {} of {}'s {}weight [{}, {}]", a.rank,
                                     std::min(a.in, a.out), node_label(n), a.prefix, a.out, a.in));
  collect_params(m);
  // The loader's limit holds for the adapted model too (limits.hpp).
  if (static_cast<double>(m.parameter_count()) + static_cast<double>(m.buffer_count()) > static_cast<double>(kMaxParameters))
    throw UsageError(fmt::format("--lora {}: the adapted model would have more than dlplan's limit of 2^44 parameters",
                                 f.lora_rank));
}

}  // namespace

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    const auto first = item.find_first_not_of(" \t"), last = item.find_last_not_of(" \t");
    if (first != std::string::npos) out.push_back(item.substr(first, last - first + 1));
    start = comma + 1;
  }
  return out;
}

void apply_fine_tuning(Model& m, const FineTuning& f) {
  if (!f.active()) {
    if (!f.lora_targets.empty() || f.lora_alpha != 0)
      throw UsageError("--lora-targets and --lora-alpha need --lora R (the adapters' rank)");
    return;
  }
  if (f.lora_rank < 0) throw UsageError(fmt::format("--lora: the rank must be positive, got {}", f.lora_rank));
  if (f.lora_rank == 0 && (!f.lora_targets.empty() || f.lora_alpha != 0))
    throw UsageError("--lora-targets and --lora-alpha need --lora R (the adapters' rank)");
  if (f.lora_alpha < 0) throw UsageError(fmt::format("--lora-alpha must be positive, got {}", f.lora_alpha));
  if (f.lora_rank > 0) add_lora(m, f);

  for (ParamInfo& p : m.params) p.trainable = f.lora_rank == 0 || p.adapter;
  for (const std::string& glob : f.freeze) {
    bool matched = false;
    for (size_t i = 0; i < m.nodes.size(); ++i) {
      const Node& n = m.nodes[i];
      if (!glob_match(glob, n.name) && !glob_match(glob, m.units[static_cast<size_t>(n.unit)])) continue;
      matched = true;
      for (ParamInfo& p : m.params)
        if (p.node == static_cast<int>(i)) p.trainable = false;
    }
    if (!matched)
      throw UsageError(fmt::format("--freeze: '{}' matches no node or unit of {} (nodes such as {}; units such as {})",
                                   glob, m.name, m.nodes.front().name,
                                   m.units.size() > 1 ? m.units[1] : std::string("(none)")));
  }
  if (m.trainable_parameter_count() == 0)
    throw UsageError(fmt::format("--freeze {}: every parameter of {} is frozen, nothing would train",
                                 fmt::join(f.freeze, ","), m.name));
}

std::string describe(const FineTuning& f, const Model& m) {
  std::vector<std::string> parts;
  if (f.lora_rank > 0) {
    const std::vector<std::string>& t = f.lora_targets.empty() ? kDefaultLoraTargets : f.lora_targets;
    parts.push_back(fmt::format("LoRA r={} (alpha {:g}) on {}", f.lora_rank, f.lora_scale() * static_cast<double>(f.lora_rank),
                                fmt::join(t, ", ")));
  }
  if (!f.freeze.empty()) parts.push_back(fmt::format("frozen: {}", fmt::join(f.freeze, ", ")));
  return fmt::format("{}; {} of {} parameters train", fmt::join(parts, "; "), format_count(m.trainable_parameter_count()),
                     format_count(m.parameter_count()));
}

}  // namespace dlplan
