// The one interpreter core of a step program (DESIGN.md, "The step
// program"), shared by the planner's memory walk, the simulator and the
// executor's trainer, as ggml's graph allocator serves both its dry run and
// its real run:
//
//  - MemoryLedger counts bytes per category: what is allocated now, the peak
//    of the sum with its breakdown, per-category maxima. The walk and the
//    simulator count the program's predicted bytes in one; the executor's
//    Allocator counts the bytes it really hands out in another.
//  - ProgramRunner walks a program one micro-batch at a time: it filters each
//    instruction by its When, knows which allocation holds each slot (a
//    `free` of an empty slot is dropped), counts the program's bytes in its
//    ledger, and hands every instruction that applies to a visitor.
#pragma once

#include "dlplan/step_program.hpp"

#include <cstdint>
#include <functional>
#include <vector>

namespace dlplan {

class MemoryLedger {
 public:
  // Counts an allocation; true when it sets a new peak of the sum.
  bool allocate(Category c, int64_t bytes);
  void release(Category c, int64_t bytes);
  // Starts a new peak measurement from what is allocated now (DESIGN.md: the
  // set-up's and the first step's transients are not part of the peak).
  void reset_peak();

  const CategoryBytes& current() const { return cur_; }
  const CategoryBytes& at_peak() const { return at_peak_; }    // categories when their sum peaked
  const CategoryBytes& max_each() const { return max_each_; }  // per-category maxima (label them as such)
  int64_t peak() const { return peak_; }
  int64_t allocated_total() const { return total_; }  // every byte ever counted

 private:
  CategoryBytes cur_{}, at_peak_{}, max_each_{};
  int64_t peak_ = 0, total_ = 0;
};

// When an instruction runs under gradient accumulation (When, DESIGN.md).
bool applies(When w, bool first_micro, bool last_micro);

class ProgramVisitor {
 public:
  virtual ~ProgramVisitor() = default;
  // `peaked`: this allocation set the ledger's new peak.
  virtual void on_alloc(const Instr& /*alloc*/, bool /*peaked*/) {}
  // The allocation the `free` releases (already taken off the ledger).
  virtual void on_free(const Instr& /*alloc*/) {}
  // forward, recompute, backward, optimizer, issue, wait, mark.
  virtual void on_instr(const Instr& /*in*/) {}
};

// A visitor made of callables (each may be left empty).
struct FunctionVisitor final : ProgramVisitor {
  std::function<void(const Instr&, bool)> alloc;
  std::function<void(const Instr&)> free, instr;
  void on_alloc(const Instr& a, bool peaked) override {
    if (alloc) alloc(a, peaked);
  }
  void on_free(const Instr& a) override {
    if (free) free(a);
  }
  void on_instr(const Instr& in) override {
    if (instr) instr(in);
  }
};

class ProgramRunner {
 public:
  explicit ProgramRunner(const StepProgram& program);
  const StepProgram& program() const { return prog_; }
  MemoryLedger& ledger() { return ledger_; }
  const MemoryLedger& ledger() const { return ledger_; }

  // One micro-batch (`first`/`last` of the step select When instructions).
  void run_micro_batch(bool first, bool last, ProgramVisitor& v);
  // A whole step: grad_accum micro-batches.
  void run_step(int64_t grad_accum, ProgramVisitor& v);
  // The allocation holding `slot` now, or null.
  const Instr* holder(int slot) const { return live_[static_cast<size_t>(slot)]; }
  // Forgets every live slot and empties the ledger's current bytes (its peak
  // is kept): a new step starts from nothing allocated, as the program does.
  void clear_slots();

 private:
  const StepProgram& prog_;
  MemoryLedger ledger_;
  std::vector<const Instr*> live_;
};

}  // namespace dlplan
