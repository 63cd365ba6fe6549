// The interpreter core shared by the walk, the simulator and the trainer
// (ledger.hpp), on programs written by hand: every expected byte count below
// is worked out from the instructions, not taken from the code under test.
#include "dlplan/error.hpp"
#include "dlplan/ledger.hpp"

#include <gtest/gtest.h>

using namespace dlplan;

namespace {

constexpr auto kAct = Category::activations;
constexpr auto kWs = Category::workspace;
constexpr auto kParams = Category::params;

Instr alloc(int slot, Category c, int64_t bytes, When w = When::every) {
  Instr in;
  in.kind = Instr::Kind::alloc;
  in.slot = slot;
  in.category = c;
  in.bytes = bytes;
  in.when = w;
  return in;
}
Instr free_(int slot, When w = When::every) {
  Instr in;
  in.kind = Instr::Kind::free;
  in.slot = slot;
  in.when = w;
  return in;
}
Instr mark() {
  Instr in;
  in.kind = Instr::Kind::mark;
  return in;
}

struct Recorder : ProgramVisitor {
  std::vector<int64_t> allocs, frees;
  int marks = 0, peaks = 0;
  void on_alloc(const Instr& a, bool peaked) override {
    allocs.push_back(a.bytes);
    peaks += peaked;
  }
  void on_free(const Instr& a) override { frees.push_back(a.bytes); }
  void on_instr(const Instr& in) override { marks += in.kind == Instr::Kind::mark; }
};

}  // namespace

TEST(MemoryLedger, PeakBreakdownAndMaxima) {
  MemoryLedger l;
  EXPECT_TRUE(l.allocate(kParams, 100));   // 100
  EXPECT_TRUE(l.allocate(kAct, 50));       // 150: peak {100, 50}
  l.release(kAct, 50);                     // 100
  EXPECT_FALSE(l.allocate(kWs, 30));       // 130 < 150
  EXPECT_FALSE(l.allocate(kWs, 20));       // 150: equal is not a new peak
  EXPECT_EQ(l.peak(), 150);
  EXPECT_EQ(l.at_peak()[static_cast<size_t>(kAct)], 50);
  EXPECT_EQ(l.at_peak()[static_cast<size_t>(kWs)], 0);
  EXPECT_EQ(l.max_each()[static_cast<size_t>(kWs)], 50);  // a per-category maximum, not at the peak
  EXPECT_EQ(l.allocated_total(), 200);
  l.reset_peak();
  EXPECT_EQ(l.peak(), 150);  // now: 100 params + 50 workspace
  EXPECT_EQ(l.at_peak()[static_cast<size_t>(kWs)], 50);
  EXPECT_EQ(l.max_each()[static_cast<size_t>(kAct)], 0);
}

TEST(ProgramRunner, FollowsWhenAcrossMicroBatches) {
  StepProgram p;
  p.slot_count = 4;
  p.instrs = {alloc(0, kParams, 1000, When::first_micro),  // persistent
              alloc(1, kAct, 10),  alloc(2, kWs, 5, When::first_micro), mark(),
              free_(1),            alloc(3, kWs, 7, When::last_micro), free_(3, When::last_micro),
              free_(2, When::last_micro)};
  ProgramRunner r(p);
  Recorder v;
  r.run_step(3, v);
  // micro 0: +1000 +10 +5 (peak 1015), -10; micro 1: +10 -10; micro 2: +10 -10 +7 (1012) -7 -5.
  EXPECT_EQ(v.allocs, (std::vector<int64_t>{1000, 10, 5, 10, 10, 7}));
  EXPECT_EQ(v.frees, (std::vector<int64_t>{10, 10, 10, 7, 5}));
  EXPECT_EQ(v.marks, 3);
  EXPECT_EQ(r.ledger().peak(), 1015);
  EXPECT_EQ(r.ledger().current()[static_cast<size_t>(kParams)], 1000);
  EXPECT_EQ(total(r.ledger().current()), 1000);
  EXPECT_NE(r.holder(0), nullptr);
  EXPECT_EQ(r.holder(2), nullptr);
}

TEST(ProgramRunner, FreeOfAnEmptySlotAndZeroByteAllocationsAreNotCounted) {
  StepProgram p;
  p.slot_count = 2;
  p.instrs = {alloc(0, kWs, 0), free_(0), free_(1), alloc(1, kAct, 8), free_(1), free_(1)};
  ProgramRunner r(p);
  Recorder v;
  r.run_step(1, v);
  EXPECT_EQ(v.allocs, (std::vector<int64_t>{8}));
  EXPECT_EQ(v.frees, (std::vector<int64_t>{8}));
  EXPECT_EQ(r.ledger().peak(), 8);
  EXPECT_EQ(total(r.ledger().current()), 0);
}

TEST(ProgramRunner, ClearSlotsEmptiesTheStepButKeepsThePeak) {
  StepProgram p;
  p.slot_count = 1;
  p.instrs = {alloc(0, kParams, 64, When::first_micro)};
  ProgramRunner r(p);
  Recorder v;
  r.run_step(1, v);
  r.clear_slots();
  EXPECT_EQ(total(r.ledger().current()), 0);
  EXPECT_EQ(r.holder(0), nullptr);
  r.run_step(1, v);  // a second step re-counts the persistent allocation once
  EXPECT_EQ(total(r.ledger().current()), 64);
  EXPECT_EQ(r.ledger().peak(), 64);
  // Control: without clearing, the slot would be allocated while live.
  EXPECT_THROW(r.run_step(1, v), Error);
}
