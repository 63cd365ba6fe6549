// The dry run of a step program: ProgramRunner counts every allocation in its
// category (ledger.hpp); this records the peak, its breakdown and (on
// request) the tensors alive then, and the memory after every op.
#include "dlplan/step_walk.hpp"

#include "dlplan/ledger.hpp"

#include <algorithm>

namespace dlplan {
namespace {

class Walker final : public ProgramVisitor {
 public:
  Walker(ProgramRunner& runner, const WalkOptions& opt, StepWalk& out) : runner_(runner), opt_(opt), out_(out) {}

  void on_alloc(const Instr&, bool peaked) override {
    if (!peaked) return;
    out_.peak_event = event_;
    if (!opt_.explain) return;
    const StepProgram& prog = runner_.program();
    out_.peak_tensors.clear();
    for (int slot = 0; slot < prog.slot_count; ++slot)
      if (const Instr* a = runner_.holder(slot)) {
        const SlotName& n = prog.names[static_cast<size_t>(slot)];
        out_.peak_tensors.push_back({n.what, n.holder, a->category, a->bytes});
      }
  }

  void on_instr(const Instr& in) override {
    switch (in.kind) {
      case Instr::Kind::forward:
      case Instr::Kind::recompute:
      case Instr::Kind::backward:
      case Instr::Kind::optimizer: event_ = in.event; break;
      case Instr::Kind::mark:
        if (opt_.timeline) out_.timeline.push_back({in.event, runner_.ledger().current()});
        break;
      default: break;
    }
  }

 private:
  ProgramRunner& runner_;
  const WalkOptions& opt_;
  StepWalk& out_;
  int event_ = -1;
};

}  // namespace

StepWalk walk_step(const Model& m, const Cluster& cluster, const TrainingConfig& cfg, const WalkOptions& opt) {
  return walk_program(build_step_program(m, cluster, cfg, opt.explain), opt, cfg.grad_accum);
}

StepWalk walk_program(const StepProgram& prog, const WalkOptions& opt, int64_t grad_accum) {
  StepWalk out;
  ProgramRunner runner(prog);
  Walker walker(runner, opt, out);
  runner.run_step(grad_accum, walker);
  const MemoryLedger& l = runner.ledger();
  out.peak = l.peak();
  out.at_peak = l.at_peak();
  out.max_each = l.max_each();
  std::sort(out.peak_tensors.begin(), out.peak_tensors.end(),
            [](const LiveTensor& a, const LiveTensor& b) { return a.bytes > b.bytes; });
  out.compute = prog.compute;
  out.comm = prog.comm;
  out.backward_start = prog.backward_start;
  out.grad_accum = grad_accum;
  return out;
}

}  // namespace dlplan
