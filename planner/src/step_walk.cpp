// The dry run of a step program: counts every allocation in its category and
// records the peak, its breakdown and (on request) the tensors alive then.
#include "dlplan/step_walk.hpp"

#include <algorithm>
#include <unordered_map>

namespace dlplan {

StepWalk walk_step(const Model& m, const Cluster& cluster, const TrainingConfig& cfg, const WalkOptions& opt) {
  return walk_program(build_step_program(m, cluster, cfg, opt.explain), opt, cfg.grad_accum);
}

StepWalk walk_program(const StepProgram& prog, const WalkOptions& opt, int64_t grad_accum) {
  StepWalk out;
  CategoryBytes cur{};
  std::vector<const Instr*> live_alloc(static_cast<size_t>(prog.slots), nullptr);
  std::unordered_map<int, const Instr*> live;  // for --explain only
  int event = -1;

  for (const Instr& in : prog.instrs) {
    switch (in.kind) {
      case Instr::Kind::alloc: {
        if (in.bytes <= 0) break;
        cur[static_cast<size_t>(in.category)] += in.bytes;
        live_alloc[static_cast<size_t>(in.slot)] = &in;
        if (opt.explain) live[in.slot] = &in;
        for (size_t c = 0; c < cur.size(); ++c) out.max_each[c] = std::max(out.max_each[c], cur[c]);
        if (total(cur) > out.peak) {
          out.peak = total(cur);
          out.at_peak = cur;
          out.peak_event = event;
          if (opt.explain) {
            out.peak_tensors.clear();
            for (const auto& [slot, a] : live) {
              const SlotName& n = prog.names[static_cast<size_t>(slot)];
              out.peak_tensors.push_back({n.what, n.holder, a->category, a->bytes});
            }
          }
        }
        break;
      }
      case Instr::Kind::free: {
        const Instr*& a = live_alloc[static_cast<size_t>(in.slot)];
        if (!a) break;
        cur[static_cast<size_t>(a->category)] -= a->bytes;
        if (opt.explain) live.erase(in.slot);
        a = nullptr;
        break;
      }
      case Instr::Kind::forward:
      case Instr::Kind::recompute:
      case Instr::Kind::backward:
      case Instr::Kind::optimizer:
        event = in.event;
        break;
      case Instr::Kind::mark:
        if (opt.timeline) out.timeline.push_back({in.event, cur});
        break;
      case Instr::Kind::issue:
      case Instr::Kind::wait:
        break;
    }
  }
  std::sort(out.peak_tensors.begin(), out.peak_tensors.end(),
            [](const LiveTensor& a, const LiveTensor& b) { return a.bytes > b.bytes; });
  out.compute = prog.compute;
  out.comm = prog.comm;
  out.backward_start = prog.backward_start;
  out.grad_accum = grad_accum;
  return out;
}

}  // namespace dlplan
