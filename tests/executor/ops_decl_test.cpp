// What each op really allocates on the CPU backend, against its declaration
// (planner/src/ops_decl.cpp), at micro-batch 3 with fp32 compute:
//  - forward: the own saved tensors, one by one (numel x batch, or x 1 when
//    per_batch, x the element size: u8 1, i32 and f32 4), plus exactly the
//    declared forward temporaries; after it returns only the saved tensors
//    are new;
//  - backward: exactly the declared backward temporaries (din and dparams are
//    the caller's), all freed when it returns.
#include "op_cases.hpp"

#include <gtest/gtest.h>

namespace dlplan::exec::testing {
namespace {

constexpr int64_t kBatch = 3;

int64_t elem_bytes(Elem e) { return dlplan::elem_bytes(e, 4); }  // fp32 compute

int64_t live(const Allocator& a) { return dlplan::total(a.current()); }

struct Measured {
  int64_t fwd_alloc = 0, fwd_live = 0, bwd_alloc = 0, bwd_live = 0;
};

Measured measure(const OpCase& c, OpRun& run, Backend& be) {
  Allocator& a = *run.alloc;
  bind(run);
  run.ctx.saved.clear();
  run.ctx.out = a.empty(run.out_shape(), DType::f32, Category::activations, "out");
  Measured m;
  int64_t total0 = a.allocated_total(), live0 = live(a);
  be.forward(run.ctx);
  m.fwd_alloc = a.allocated_total() - total0;
  m.fwd_live = live(a) - live0;

  Tensor dout = a.zeros(run.ctx.out.shape, DType::f32, Category::workspace, "dout");
  for (int64_t i = 0; i < dout.numel(); ++i) dout.f()[i] = 0.01f * static_cast<float>(i % 7);
  prepare_backward(run, dout);
  total0 = a.allocated_total();
  live0 = live(a);
  be.backward(run.ctx);
  m.bwd_alloc = a.allocated_total() - total0;
  m.bwd_live = live(a) - live0;
  (void)c;
  return m;
}

class OpAllocations : public ::testing::TestWithParam<OpCase> {};

TEST_P(OpAllocations, AllocationsMatchTheDeclaration) {
  const OpCase& c = GetParam();
  Allocator alloc;
  auto be = make_cpu_backend();
  OpRun run = make_run(c, alloc, kBatch);
  const Measured m = measure(c, run, *be);

  // Saved tensors: one per own declaration, in order, each its declared size.
  std::vector<const SavedTensor*> own;
  for (const auto& s : run.decl.saved)
    if (s.ref == SavedTensor::Ref::own) own.push_back(&s);
  ASSERT_EQ(run.ctx.saved.size(), own.size()) << c.name;
  int64_t saved_bytes = 0;
  for (size_t i = 0; i < own.size(); ++i) {
    const int64_t want = own[i]->numel * (own[i]->per_batch ? 1 : kBatch) * elem_bytes(own[i]->elem);
    EXPECT_EQ(run.ctx.saved[i].storage->bytes, want) << c.name << ": saved " << own[i]->what;
    EXPECT_NE(run.ctx.saved[i].storage->what.find(own[i]->what), std::string::npos)
        << c.name << ": saved #" << i << " is " << run.ctx.saved[i].storage->what << ", declared " << own[i]->what;
    EXPECT_EQ(run.ctx.saved[i].storage->category, Category::activations) << c.name;
    saved_bytes += run.ctx.saved[i].storage->bytes;
  }

  int64_t fwd_temps = 0, bwd_temps = 0;
  for (const auto& t : run.decl.fwd_temps) fwd_temps += t.numel * (t.per_batch ? 1 : kBatch) * elem_bytes(t.elem);
  for (const auto& t : run.decl.bwd_temps) bwd_temps += t.numel * (t.per_batch ? 1 : kBatch) * elem_bytes(t.elem);
  EXPECT_EQ(m.fwd_alloc - saved_bytes, fwd_temps) << c.name << ": forward temporaries";
  EXPECT_EQ(m.fwd_live, saved_bytes) << c.name << ": after forward only the saved tensors are new";
  EXPECT_EQ(m.bwd_alloc, bwd_temps) << c.name << ": backward temporaries";
  EXPECT_EQ(m.bwd_live, 0) << c.name << ": backward frees its temporaries";
}

INSTANTIATE_TEST_SUITE_P(Ops, OpAllocations, ::testing::ValuesIn(op_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return i.param.name; });

// Controls: the measurement sees a difference the declaration must account for.
TEST(OpDeclControl, FlashSavesLessThanMath) {
  auto be = make_cpu_backend();
  int64_t saved[2];
  for (int flash = 0; flash < 2; ++flash) {
    OpCase c = attention_case("a", Json{{"heads", 2}, {"dropout", 0.1}}, flash != 0, 12, 8);
    Allocator alloc;
    OpRun run = make_run(c, alloc, kBatch);
    measure(c, run, *be);
    saved[flash] = 0;
    for (const auto& t : run.ctx.saved) saved[flash] += t.storage->bytes;
  }
  // math: q k v context 4 x T D, probs + dropped 2 x H T^2 fp32, mask H T^2 bytes; flash: 4 T D + lse H T.
  EXPECT_EQ(saved[0], kBatch * (4 * 12 * 8 * 4 + 2 * 2 * 144 * 4 + 2 * 144));
  EXPECT_EQ(saved[1], kBatch * (4 * 12 * 8 * 4 + 2 * 12 * 4));
}

TEST(OpDeclControl, ConvIm2colIsOneSampleReused) {
  // The column buffer is one sample's [C kh kw, OH OW], reused across the
  // batch: the same bytes at batch 1 and 2 (control: the output, which is
  // allocated by the caller, is not counted here).
  auto be = make_cpu_backend();
  OpCase c = unary("conv", Json::array({2, 5, 5}), Json{{"op", "conv2d"}, {"out", 3}, {"kernel", 3}});
  int64_t fwd[2];
  for (int64_t b : {1, 2}) {
    Allocator alloc;
    OpRun run = make_run(c, alloc, b);
    fwd[b - 1] = measure(c, run, *be).fwd_alloc;
  }
  EXPECT_EQ(fwd[0], 2 * 9 * 3 * 3 * 4);  // [C kh kw, OH OW] fp32
  EXPECT_EQ(fwd[1], fwd[0]);
}

}  // namespace
}  // namespace dlplan::exec::testing
