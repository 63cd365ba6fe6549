#include "dlplan/ledger.hpp"

#include "dlplan/error.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace dlplan {

bool MemoryLedger::allocate(Category c, int64_t bytes) {
  cur_[static_cast<size_t>(c)] += bytes;
  total_ += bytes;
  for (size_t i = 0; i < cur_.size(); ++i) max_each_[i] = std::max(max_each_[i], cur_[i]);
  const int64_t sum = total(cur_);
  if (sum <= peak_) return false;
  peak_ = sum;
  at_peak_ = cur_;
  return true;
}

void MemoryLedger::release(Category c, int64_t bytes) { cur_[static_cast<size_t>(c)] -= bytes; }

void MemoryLedger::reset_peak() {
  peak_ = total(cur_);
  at_peak_ = cur_;
  max_each_ = cur_;
}

bool applies(When w, bool first_micro, bool last_micro) {
  return w == When::every || (w == When::first_micro && first_micro) || (w == When::last_micro && last_micro);
}

ProgramRunner::ProgramRunner(const StepProgram& program)
    : prog_(program), live_(static_cast<size_t>(program.slot_count), nullptr) {}

void ProgramRunner::run_micro_batch(bool first, bool last, ProgramVisitor& v) {
  for (const Instr& in : prog_.instrs) {
    if (!applies(in.when, first, last)) continue;
    switch (in.kind) {
      case Instr::Kind::alloc: {
        // A zero-byte allocation (no GEMM workspace on the cpu device, an
        // empty unit) holds nothing and is not counted.
        if (in.bytes <= 0) break;
        const Instr*& holder = live_[static_cast<size_t>(in.slot)];
        if (holder != nullptr)
          throw Error(fmt::format("internal error: step program slot {} allocated while it still holds {} bytes "
                                  "(a new step without clear_slots()?)",
                                  in.slot, holder->bytes));
        holder = &in;
        v.on_alloc(in, ledger_.allocate(in.category, in.bytes));
        break;
      }
      case Instr::Kind::free: {
        const Instr*& a = live_[static_cast<size_t>(in.slot)];
        if (a == nullptr) break;
        const Instr& alloc = *a;
        a = nullptr;
        ledger_.release(alloc.category, alloc.bytes);
        v.on_free(alloc);
        break;
      }
      default:
        v.on_instr(in);
        break;
    }
  }
}

void ProgramRunner::run_step(int64_t grad_accum, ProgramVisitor& v) {
  for (int64_t micro = 0; micro < grad_accum; ++micro) run_micro_batch(micro == 0, micro == grad_accum - 1, v);
}

void ProgramRunner::clear_slots() {
  for (const Instr*& a : live_)
    if (a != nullptr) {
      ledger_.release(a->category, a->bytes);
      a = nullptr;
    }
}

}  // namespace dlplan
