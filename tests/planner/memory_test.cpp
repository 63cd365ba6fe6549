// The memory model against independent references:
//  - model states: the ZeRO paper's per-device formulas (Rajbhandari et al. 2020);
//  - activations of a GPT layer: Korthikanti et al. 2022, sbh(34 + 5as/h) with
//    dropout, and a derivation of our own without;
//  - liveness: activations peak at the start of backward; with checkpointing
//    a layer keeps its input (2sbh) plus one layer's recomputation.
#include "dlplan/loader.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/step_walk.hpp"
#include "dlplan/zoo.hpp"

#include "once_per_step.hpp"

#include <gtest/gtest.h>

using namespace dlplan;

namespace {

constexpr size_t kParams = 0, kGrads = 1, kOptim = 2, kAct = 3;

Cluster gpus(int n, int nodes = 1, const char* kind = "h100-80g") {
  Cluster c;
  c.device = find_device(kind);
  c.device.alloc_granularity_bytes = 1;  // the formulas count bytes, not the allocator's 512 B blocks
  c.nodes = nodes;
  c.gpus_per_node = n / nodes;
  return c;
}

Model small_gpt(int layers, double dropout, int hidden = 64, int heads = 4, int T = 32, int vocab = 50) {
  zoo::GptConfig c;
  c.name = "gpt-test";
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  c.context = T;
  c.vocab = vocab;
  c.dropout = dropout;
  return parse_model(nlohmann::json(zoo::build_gpt(c)), "gpt-test");
}

TrainingConfig mixed(Strategy s, int64_t b = 1) {
  TrainingConfig t;
  t.strategy = s;
  t.precision = Precision::bf16_mixed;
  t.micro_batch = b;
  return t;
}

// Activations after the last forward op (the loss), from the walk's timeline.
int64_t activations_at_end_of_forward(const StepWalk& w) {
  for (const auto& p : w.timeline)
    if (p.event == w.backward_start - 1) return p.bytes[kAct];
  ADD_FAILURE() << "no timeline point at the end of forward";
  return -1;
}

int64_t max_activations_in_backward(const StepWalk& w) {
  int64_t m = 0;
  for (const auto& p : w.timeline)
    if (p.event >= w.backward_start) m = std::max(m, p.bytes[kAct]);
  return m;
}

StepWalk walk(const Model& m, const TrainingConfig& t, int n = 1) {
  WalkOptions o;
  o.timeline = true;
  return walk_step(m, gpus(n), t, o);
}

// ---- model states: ZeRO paper, mixed-precision Adam, K = 12 ----------------

TEST(ModelStates, ReproduceTheZeroPaperFormulas) {
  // A model whose every unit has a parameter count divisible by 8, so that
  // padding is zero and the formulas hold exactly: width 64 makes every tensor
  // a multiple of 64; vocab 64 too.
  Model m = small_gpt(3, 0.0, 64, 4, 32, 64);
  const int64_t P = m.parameter_count();
  for (int64_t N : {2, 4, 8}) {
    auto states = [&](Strategy s) {
      auto b = model_states(m, static_cast<int>(N), mixed(s));
      return b[kParams] + b[kGrads] + b[kOptim];
    };
    EXPECT_EQ(states(Strategy::ddp), 16 * P);
    EXPECT_EQ(states(Strategy::zero1), 4 * P + 12 * P / N);
    EXPECT_EQ(states(Strategy::zero2), 2 * P + 14 * P / N);
    EXPECT_EQ(states(Strategy::zero3), 16 * P / N);
    // Control: the strategies really differ.
    EXPECT_NE(states(Strategy::zero1), states(Strategy::zero2));
  }
  // The walk starts from the same states and keeps them all step long.
  StepWalk w = walk(m, mixed(Strategy::zero2), 4);
  EXPECT_EQ(w.at_peak[kParams] + w.at_peak[kGrads] + w.at_peak[kOptim], 2 * P + 14 * P / 4);
}

TEST(ModelStates, PaddingIsAtMostOneElementPerRankPerUnit) {
  Model m = load_model("tiny-vit");  // counts not multiples of 7
  const int64_t P = m.parameter_count(), N = 7;
  auto b = model_states(m, static_cast<int>(N), mixed(Strategy::zero3));
  const int64_t exact = 16 * P / N;
  const int64_t units = static_cast<int64_t>(m.units.size());
  EXPECT_GE(b[kParams] + b[kGrads] + b[kOptim], exact);
  EXPECT_LE(b[kParams] + b[kGrads] + b[kOptim], exact + 16 * units);
}

TEST(ModelStates, Fp32AndSgdBytesPerParameter) {
  Model m = small_gpt(1, 0.0);
  const int64_t P = m.parameter_count();
  TrainingConfig t = mixed(Strategy::ddp);
  t.precision = Precision::fp32;
  auto b = model_states(m, 1, t);
  EXPECT_EQ(b[kParams], 4 * P);
  EXPECT_EQ(b[kGrads], 4 * P);
  EXPECT_EQ(b[kOptim], 8 * P);  // Adam m and v, no master copy
  t.optimizer.kind = OptimizerKind::sgd_momentum;
  EXPECT_EQ(model_states(m, 1, t)[kOptim], 4 * P);
  t.precision = Precision::bf16_mixed;
  t.optimizer.kind = OptimizerKind::sgd;
  EXPECT_EQ(model_states(m, 1, t)[kOptim], 4 * P);  // the fp32 master only
}

// ---- activations of one GPT layer ------------------------------------------

struct LayerCase {
  int64_t s, b, h, a;
  double dropout;
};

int64_t one_layer_activations(const LayerCase& c, const TrainingConfig& t) {
  Model l1 = small_gpt(1, c.dropout, static_cast<int>(c.h), static_cast<int>(c.a), static_cast<int>(c.s));
  Model l2 = small_gpt(2, c.dropout, static_cast<int>(c.h), static_cast<int>(c.a), static_cast<int>(c.s));
  return activations_at_end_of_forward(walk(l2, t)) - activations_at_end_of_forward(walk(l1, t));
}

TEST(Activations, GptLayerWithDropoutMatchesKorthikanti) {
  for (LayerCase c : {LayerCase{32, 2, 64, 4, 0.1}, LayerCase{64, 3, 128, 8, 0.1}}) {
    const int64_t sbh = c.s * c.b * c.h;
    const int64_t paper = 34 * sbh + 5 * c.a * c.s * c.s * c.b;  // Korthikanti et al. 2022, eq. (1), 16-bit
    // Named difference: the paper does not count the two layer norms'
    // statistics, mean and rstd in fp32 per token: 2 x 2 x 4 bytes x sb.
    const int64_t norm_stats = 16 * c.s * c.b;
    const int64_t ours = one_layer_activations(c, mixed(Strategy::ddp, c.b));
    EXPECT_EQ(ours, paper + norm_stats) << "s=" << c.s << " h=" << c.h;
    EXPECT_LT(static_cast<double>(norm_stats) / static_cast<double>(paper), 0.01);  // the bound on the difference
  }
}

TEST(Activations, GptLayerWithoutDropoutMatchesOurDerivation) {
  LayerCase c{32, 2, 64, 4, 0.0};
  const int64_t sbh = c.s * c.b * c.h;
  // Without dropout there are no masks (attention as^2b, two residual sbh) and
  // no dropped copy of the probabilities (2as^2b): attention 2 (input) + 6
  // (q, k, v) + 2 (context) = 10sbh and probabilities 2as^2b; MLP 2 + 8 + 8 =
  // 18sbh; layer norms 4sbh; plus the norm statistics 16sb.
  const int64_t expected = 32 * sbh + 2 * c.a * c.s * c.s * c.b + 16 * c.s * c.b;
  EXPECT_EQ(one_layer_activations(c, mixed(Strategy::ddp, c.b)), expected);
  // Control: with dropout the count differs.
  EXPECT_NE(one_layer_activations({32, 2, 64, 4, 0.1}, mixed(Strategy::ddp, 2)), expected);
}

TEST(Activations, FlashAttentionKeepsLogSumExpInsteadOfProbabilities) {
  LayerCase c{64, 2, 64, 4, 0.0};
  TrainingConfig t = mixed(Strategy::ddp, c.b);
  t.attention = AttentionImpl::flash;
  const int64_t sbh = c.s * c.b * c.h;
  // 32sbh as without dropout, the probabilities replaced by an fp32
  // log-sum-exp per head and token (4asb bytes).
  EXPECT_EQ(one_layer_activations(c, t), 32 * sbh + 4 * c.a * c.s * c.b + 16 * c.s * c.b);
}

TEST(Activations, Fp32DoublesTheSixteenBitTensors) {
  LayerCase c{32, 2, 64, 4, 0.0};
  TrainingConfig t = mixed(Strategy::ddp, c.b);
  t.precision = Precision::fp32;
  const int64_t sbh = c.s * c.b * c.h;
  EXPECT_EQ(one_layer_activations(c, t), 2 * (32 * sbh + 2 * c.a * c.s * c.s * c.b) + 16 * c.s * c.b);
}

// A tensor computed once per step from parameters (TensorInfo::batched false:
// MobileBERT's head weight) is kept once, whatever the micro-batch. Here
// y = x W, W a `parameter` [4, 16]: matmul keeps x (the batch, counted in
// workspace) and W's copy, 4 x 16 fp32 = 256 B once; the loss keeps its fp32
// probabilities, 8 x 16 x 4 = 512 B a sample. So 512 b + 256 B, where
// counting the copy per sample would give 768 b.
TEST(Activations, ATensorComputedOncePerStepIsKeptOnce) {
  const Model m = dlplan::testing::once_per_step_model();
  EXPECT_FALSE(m.tensor(m.nodes[static_cast<size_t>(m.node_index("w"))].output).batched);
  EXPECT_TRUE(m.tensor(m.nodes[static_cast<size_t>(m.node_index("y"))].output).batched);
  for (int64_t b : {1, 2, 5}) {
    TrainingConfig t = mixed(Strategy::ddp, b);
    t.precision = Precision::fp32;
    const StepWalk w = walk(m, t);
    EXPECT_EQ(w.max_each[kAct], 512 * b + 256) << "micro-batch " << b;
    // FLOPs: the copy once (64), the product per sample (2 x 8 x 4 x 16).
    EXPECT_DOUBLE_EQ(w.compute[static_cast<size_t>(0)].flops, 64.0) << w.compute[0].name;
    EXPECT_DOUBLE_EQ(w.compute[static_cast<size_t>(1)].flops, 1024.0 * static_cast<double>(b));
  }
}

// ---- liveness ----------------------------------------------------------------

TEST(Liveness, ActivationsPeakAtTheStartOfBackward) {
  Model m = small_gpt(3, 0.1);
  StepWalk w = walk(m, mixed(Strategy::ddp, 2));
  const int64_t at_end = activations_at_end_of_forward(w);
  EXPECT_EQ(w.max_each[kAct], at_end);
  // ... and only fall from there.
  int64_t prev = at_end;
  for (const auto& p : w.timeline)
    if (p.event >= w.backward_start) {
      EXPECT_LE(p.bytes[kAct], prev);
      prev = p.bytes[kAct];
    }
  EXPECT_EQ(prev, 0);  // everything kept for backward is freed by its end
  // The step's total peak (activations plus backward's gradients and
  // temporaries) comes at the end of forward or in the last layer's backward.
  ASSERT_GE(w.peak_event, w.backward_start - 1);
  EXPECT_GE(w.compute[static_cast<size_t>(w.peak_event)].node, m.node_index("h.2.ln_1"));
}

TEST(Liveness, CheckpointingKeepsEachLayersInputPlusOneRecomputedLayer) {
  const LayerCase c{32, 2, 64, 4, 0.1};
  const int64_t sbh = c.s * c.b * c.h;
  TrainingConfig t = mixed(Strategy::ddp, c.b);
  const int64_t full_layer = one_layer_activations(c, t);
  t.checkpointing = Checkpointing::units;
  // Forward keeps only each layer's input, 2sbh in bf16.
  EXPECT_EQ(one_layer_activations(c, t), 2 * sbh);

  for (int L : {2, 4}) {
    Model m = small_gpt(L, c.dropout, 64, 4, 32);
    StepWalk w = walk(m, t);
    // Backward's maximum: the first recomputed layer (the last one) with every
    // layer's input still kept, and the embedding dropout's mask (sbh, root
    // unit, not checkpointed). The recomputed layer's own input is one of the
    // kept inputs, so it counts once.
    const int64_t expected = sbh + L * 2 * sbh + (full_layer - 2 * sbh);
    EXPECT_EQ(max_activations_in_backward(w), expected) << "layers " << L;
  }
}

TEST(Liveness, RecomputationAddsComputeButNotModelFlops) {
  Model m = small_gpt(2, 0.0);
  TrainingConfig t = mixed(Strategy::ddp, 2);
  StrategyResult plain = evaluate(m, gpus(1), t);
  t.checkpointing = Checkpointing::units;
  StrategyResult ckpt = evaluate(m, gpus(1), t);
  EXPECT_DOUBLE_EQ(plain.model_flops, ckpt.model_flops);
  EXPECT_GT(ckpt.compute_seconds, plain.compute_seconds);
  EXPECT_LT(ckpt.walk.max_each[kAct], plain.walk.max_each[kAct]);
}

// ---- strategies in the walk ---------------------------------------------------

TEST(Strategies, Zero3GathersPrefetchedUnitsAndKeepsTheRootGathered) {
  Model m = small_gpt(4, 0.0, 64, 4, 32, 64);
  const int N = 4;
  TrainingConfig t = mixed(Strategy::zero3, 1);
  int64_t unit_bytes = 0, root_bytes = 0;
  for (const auto& p : m.params) (p.unit == 0 ? root_bytes : unit_bytes) += p.numel * 2;
  unit_bytes /= 4;  // four equal blocks
  for (int prefetch : {0, 1, 2}) {
    t.prefetch = prefetch;
    StepWalk w = walk(m, t, N);
    // gathered: the root unit, the unit computing and `prefetch` more.
    EXPECT_EQ(w.max_each[4], root_bytes + (1 + prefetch) * unit_bytes) << "prefetch " << prefetch;
  }
}

TEST(Strategies, CommBytesFollowTheRingFormulas) {
  Model m = small_gpt(3, 0.0, 64, 4, 32, 64);  // unit sizes divisible by N: no padding
  const double P = static_cast<double>(m.parameter_count());
  double root = 0;
  for (const auto& p : m.params)
    if (p.unit == 0) root += static_cast<double>(p.numel);
  for (int N : {2, 8}) {
    const double f = (N - 1.0) / N;
    for (int A : {1, 3}) {
      auto bytes = [&](Strategy s) {
        TrainingConfig t = mixed(s);
        t.grad_accum = A;
        return evaluate(m, gpus(N), t).comm.bytes;
      };
      // bf16 gradients and parameters: 2 bytes each.
      EXPECT_DOUBLE_EQ(bytes(Strategy::ddp), 2 * f * 2 * P);                 // one all-reduce of 2P bytes
      EXPECT_DOUBLE_EQ(bytes(Strategy::zero1), f * 2 * P + f * 2 * P);        // RS + AG, once per step
      EXPECT_DOUBLE_EQ(bytes(Strategy::zero2), A * f * 2 * P + f * 2 * P);    // RS per micro-batch, AG once
      // ZeRO-3: units gather twice and reduce-scatter once per micro-batch;
      // the root unit is gathered once per step.
      EXPECT_DOUBLE_EQ(bytes(Strategy::zero3), A * f * 2 * (3 * (P - root)) + f * 2 * root + A * f * 2 * root);
    }
  }
  TrainingConfig t = mixed(Strategy::ddp);
  EXPECT_EQ(evaluate(m, gpus(1), t).comm.bytes, 0.0);  // nothing to talk to
}

TEST(Strategies, DdpBucketsBoundTheCommBuffers) {
  Model m = small_gpt(4, 0.0, 256, 4, 32, 64);
  TrainingConfig t = mixed(Strategy::ddp, 1);
  t.bucket_mb = 0.25;
  StepWalk w = walk(m, t, 8);
  // At most two buckets are in flight; a bucket holds whole parameters, so it
  // may exceed the cap by at most one parameter (the largest: 256 x 1024 x 2 B).
  EXPECT_GT(w.max_each[5], 0);
  EXPECT_LE(w.max_each[5], 2 * (256 * 1024 + 256 * 1024 * 2));
  int buckets = 0;
  for (const auto& e : w.comm) buckets += e.op == Collective::AllReduce;
  EXPECT_GT(buckets, 4);
}

TEST(Strategies, Zero2StagesOneUnitsGradientAtATime) {
  Model m = small_gpt(4, 0.0, 64, 4, 32, 64);
  StepWalk w = walk(m, mixed(Strategy::zero2, 1), 4);
  int64_t unit = 0, root = 0;
  for (const auto& p : m.params) (p.unit == 0 ? root : unit) += p.numel * 2;
  unit /= 4;
  // The root unit's gradient (the tied embedding's) is staged from the head's
  // backward to the embedding's, and at most two units' reduce-scatters are
  // in flight beside the one filling.
  EXPECT_GE(w.max_each[5], root + unit);
  EXPECT_LE(w.max_each[5], root + 3 * unit);
}

}  // namespace

namespace {

TEST(Allocator, GpuPredictionsCountTheCachingAllocatorsBlocks) {
  // On a GPU every tensor is a 512 B block (PyTorch's caching allocator), so
  // the predicted categories are multiples of 512 per allocation; on the cpu
  // device bytes are counted as requested.
  Model m = load_model("tiny-mlp");
  TrainingConfig t;
  t.micro_batch = 3;  // odd sizes: 3 x 128 x 2 B = 768 B activations per layer
  Cluster gpu;
  gpu.device = find_device("h100-80g");
  ASSERT_EQ(gpu.device.alloc_granularity_bytes, 512);
  const StepWalk w = walk_step(m, gpu, t);
  EXPECT_EQ(w.at_peak[3] % 512, 0);  // activations: a sum of 512 B multiples
  Cluster exact = gpu;
  exact.device.alloc_granularity_bytes = 1;
  const StepWalk e = walk_step(m, exact, t);
  EXPECT_GT(w.at_peak[3], e.at_peak[3]);  // control: rounding adds bytes
  EXPECT_LE(w.peak - e.peak, 512 * 64);   // ... at most a block per live allocation
}

}  // namespace
