// Frozen parameters and LoRA (docs/fine-tuning.md):
// the model a fine-tuning plan trains. The IR stays the user's model; a plan
// carries its FineTuning (training.hpp) and every reader applies it the same
// way, so planner, plan file and engines see the same adapters and flags.
#pragma once

#include "dlplan/ir.hpp"
#include "dlplan/training.hpp"

#include <string>
#include <vector>

namespace dlplan {

// Adds the LoRA adapters to the targeted nodes (their parameters follow the
// node's own, in Model::params) and marks what is frozen: with LoRA every
// parameter but the adapters; with --freeze every parameter of a node whose
// name, or whose unit's name, matches one of the globs. Throws UsageError,
// naming the flag, for a glob or target that matches nothing, a rank out of
// range, or a model left with nothing to train.
void apply_fine_tuning(Model& m, const FineTuning& f);

// "--freeze 'wte,wpe,h.0.*'", "--lora-targets q,v": comma-separated, spaces trimmed, empties dropped.
std::vector<std::string> split_list(const std::string& text);

// One line for tables and reports: "LoRA r=4 (alpha 4) on q, v; frozen: wte, wpe -- 1.2 M of 124 M parameters train".
std::string describe(const FineTuning& f, const Model& m);

}  // namespace dlplan
