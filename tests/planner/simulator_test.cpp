// The step simulator against answers known by hand: a three-op graph with one
// bucket, the dependency rules on every strategy's timeline, bytes against
// the plan, overlap trends, prefetch, and the trace format.
#include "dlplan/loader.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/simulator.hpp"
#include "dlplan/zoo.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

using namespace dlplan;

namespace {

// A device with round numbers: compute is FLOP-bound at 1 GFLOP/s, memory
// traffic free, links 1 GB/s with 10 us per collective and no per-hop latency.
Cluster toy_cluster(int gpus) {
  Cluster c;
  c.device.kind = "toy";
  c.device.memory_bytes = int64_t{1} << 40;
  c.device.hbm_bytes_per_s = 1e30;
  c.device.bf16_flops = 1e9;
  c.device.fp32_flops = 1e9;
  c.device.gemm_efficiency = 1.0;
  c.device.link_bytes_per_s = 1e9;
  c.device.link_efficiency = 1.0;
  c.device.net_bytes_per_s = 1e9;
  c.device.base_latency_s = 10e-6;
  c.device.link_hop_latency_s = 0;
  c.device.net_hop_latency_s = 0;
  c.gpus_per_node = gpus;
  return c;
}

Model three_ops() {
  nlohmann::json ir = {
      {"name", "three"},
      {"inputs", {{"x", {{"shape", {8}}, {"dtype", "f32"}}}, {"label", {{"shape", nlohmann::json::array()}, {"dtype", "i32"}}}}},
      {"nodes",
       {{{"name", "fc"}, {"op", "linear"}, {"in", {"x"}}, {"out", 4}},
        {{"name", "act"}, {"op", "relu"}, {"in", {"fc"}}},
        {{"name", "loss"}, {"op", "cross_entropy"}, {"in", {"act", "label"}}}}}};
  return parse_model(ir, "three");
}

TrainingConfig fp32(Strategy s, int64_t b = 2) {
  TrainingConfig t;
  t.strategy = s;
  t.precision = Precision::fp32;
  t.micro_batch = b;
  return t;
}

TEST(Simulator, ThreeOpsOneBucketByHand) {
  // fc: 8 -> 4 with bias (36 parameters), relu, loss; DDP on 2 ranks, b = 2.
  // FLOPs (ops_decl.cpp) at 1 GFLOP/s, so FLOPs are nanoseconds:
  //   forward:  fc 2*8*4*2 = 128, act 4*4*2 = 32, loss 5*4*2 = 40
  //   backward: loss 2*4*2 = 16, act 2*4*2 = 16, fc 2*128 = 256
  //   optimizer: 10 * 36 = 360
  // The single bucket (36 fp32 = 144 B) is complete after fc's backward and
  // all-reduced at once: 10 us + 2(n-1)/n * 144 B / 1 GB/s = 10.144 us.
  // Compute waits for it before the optimizer.
  Simulation s = simulate_step(three_ops(), toy_cluster(2), fp32(Strategy::ddp));
  ASSERT_EQ(s.compute.size(), 7u);
  ASSERT_EQ(s.comm.size(), 1u);
  const double ns = 1e-9;
  const double fwd_end = (128 + 32 + 40) * ns, bwd_end = fwd_end + (16 + 16 + 256) * ns;
  EXPECT_NEAR(s.compute[2].end, fwd_end, 1e-15);
  EXPECT_NEAR(s.compute[5].end, bwd_end, 1e-15);
  EXPECT_EQ(s.comm[0].name, "bucket 0 all-reduce");
  EXPECT_NEAR(s.comm[0].start, bwd_end, 1e-15);
  const double ar = 10e-6 + 144.0 / 1e9;
  EXPECT_NEAR(s.comm[0].end, bwd_end + ar, 1e-15);
  EXPECT_NEAR(s.compute[6].start, bwd_end + ar, 1e-15);  // the optimizer waited
  EXPECT_NEAR(s.step_seconds, bwd_end + ar + 360 * ns, 1e-15);
  EXPECT_NEAR(s.exposed_seconds, ar, 1e-15);
  EXPECT_NEAR(s.comm_bytes, 144.0, 1e-9);  // 2(n-1)/n * 144
  // Control: on one rank nothing is communicated and nothing waits.
  Simulation one = simulate_step(three_ops(), toy_cluster(1), fp32(Strategy::ddp));
  EXPECT_TRUE(one.comm.empty());
  EXPECT_NEAR(one.step_seconds, bwd_end + 360 * ns, 1e-15);
}

void check_dependencies(const StepProgram& prog, const Simulation& s, const std::string& label) {
  // Streams are sequential.
  for (size_t i = 1; i < s.compute.size(); ++i) EXPECT_GE(s.compute[i].start, s.compute[i - 1].end - 1e-15) << label;
  for (size_t i = 1; i < s.comm.size(); ++i) EXPECT_GE(s.comm[i].start, s.comm[i - 1].end - 1e-15) << label;
  // One micro-batch here: comm span k is program event k. A collective starts
  // after the op it follows and ends before the op that waits for it starts.
  ASSERT_EQ(s.comm.size(), prog.comm.size()) << label;
  for (size_t k = 0; k < prog.comm.size(); ++k) {
    const CommEvent& ev = prog.comm[k];
    if (ev.issue_after >= 0) {
      EXPECT_GE(s.comm[k].start, s.compute[static_cast<size_t>(ev.issue_after)].end - 1e-15) << label << " " << ev.name;
    }
    if (ev.wait_before >= 0) {  // also SyncBN: the layer runs after its collective
      EXPECT_LE(s.comm[k].end, s.compute[static_cast<size_t>(ev.wait_before)].start + 1e-15) << label << " " << ev.name;
    }
  }
}

TEST(Simulator, DependencyRulesHoldForEveryStrategy) {
  Cluster c;
  c.device = find_device("h100-80g");
  c.gpus_per_node = 4;
  for (const char* name : {"tiny-gpt", "tiny-cnn"}) {
    Model m = load_model(name);
    for (Strategy s : kAllStrategies)
      for (bool syncbn : {false, true}) {
        if (syncbn && std::string(name) != "tiny-cnn") continue;
        TrainingConfig t;
        t.strategy = s;
        t.micro_batch = 4;
        t.bucket_mb = 0.02;
        t.syncbn = syncbn;
        t.syncbn_group = syncbn ? 4 : 0;
        StepProgram prog = build_step_program(m, c, t);
        check_dependencies(prog, simulate_program(prog, c, t), std::string(name) + " " + to_string(s));
      }
  }
}

TEST(Simulator, TimelineBytesEqualThePlansCommBytes) {
  Cluster c;
  c.device = find_device("a100-80g");
  c.gpus_per_node = 8;
  Model m = load_model("tiny-vit");
  for (Strategy s : kAllStrategies)
    for (int A : {1, 3}) {
      TrainingConfig t;
      t.strategy = s;
      t.micro_batch = 2;
      t.grad_accum = A;
      Simulation sim = simulate_step(m, c, t);
      double summed = 0;
      for (const Span& sp : sim.comm) summed += sp.bytes_sent;
      // Independent: the ring formula over the spans' buffer sizes.
      double ring = 0;
      for (const Span& sp : sim.comm) ring += (sp.op == Collective::AllReduce ? 2.0 : 1.0) * 7.0 / 8.0 * sp.bytes;
      EXPECT_NEAR(summed, ring, 1e-6 * ring) << to_string(s);
      EXPECT_NEAR(evaluate(m, c, t).comm.bytes, summed, 1e-6 * summed) << to_string(s) << " A=" << A;
    }
}

TEST(Simulator, DdpExposedCommunicationShrinksAsBackwardGrows) {
  // The same gradients (same model), more backward compute to hide them
  // behind: the FLOP rate falls, communication stays.
  Model m = load_model("tiny-gpt");
  TrainingConfig t = fp32(Strategy::ddp, 4);
  t.bucket_mb = 0.05;
  double previous = 1e30;
  for (double gflops : {1000.0, 100.0, 10.0}) {
    Cluster c = toy_cluster(4);
    c.device.fp32_flops = gflops * 1e9;
    c.device.link_bytes_per_s = 1e8;
    Simulation s = simulate_step(m, c, t);
    EXPECT_LT(s.exposed_seconds, previous) << gflops;
    EXPECT_LT(s.exposed_seconds, s.comm_seconds) << "some communication overlaps at " << gflops;
    previous = s.exposed_seconds;
  }
}

TEST(Simulator, Zero3PrefetchHidesGathers) {
  Model m = load_model("tiny-gpt");
  Cluster c = toy_cluster(4);
  c.device.link_bytes_per_s = 1e8;
  TrainingConfig t = fp32(Strategy::zero3, 4);
  t.prefetch = 0;
  const double none = simulate_step(m, c, t).exposed_seconds;
  t.prefetch = 1;
  const double one = simulate_step(m, c, t).exposed_seconds;
  EXPECT_GT(none, one);
}

// The curve is drawn from the runner's ledger (ledger.hpp), whose counting
// ledger_test.cpp checks by hand; here only that the curve shows its peak.
TEST(Simulator, MemoryCurveShowsThePeak) {
  Cluster c;
  c.device = find_device("h100-80g");
  c.gpus_per_node = 2;
  for (Strategy s : kAllStrategies) {
    TrainingConfig t;
    t.strategy = s;
    t.micro_batch = 4;
    t.grad_accum = 2;
    Model m = load_model("tiny-gpt");
    Simulation sim = simulate_step(m, c, t);
    int64_t curve = 0;
    for (const auto& p : sim.memory) curve = std::max(curve, total(p.bytes));
    EXPECT_EQ(sim.peak_bytes, curve) << to_string(s);
    EXPECT_GT(curve, 0) << to_string(s);
  }
}

TEST(Simulator, ChromeTraceHasBothStreamsAndCounters) {
  Cluster c = toy_cluster(2);
  Simulation s = simulate_step(three_ops(), c, fp32(Strategy::ddp));
  std::ostringstream out;
  write_chrome_trace(s, "three", out);
  auto j = nlohmann::json::parse(out.str());
  int x1 = 0, x2 = 0, counters = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") (e["tid"] == 1 ? x1 : x2)++;
    if (e["ph"] == "C") counters++;
  }
  EXPECT_EQ(x1, 7);
  EXPECT_EQ(x2, 1);
  EXPECT_GT(counters, 0);
  EXPECT_NE(text_gantt(s).find("comm    |"), std::string::npos);
}

TEST(Simulator, OverlapNeverMakesAStepSlowerThanSerial) {
  Cluster c;
  c.device = find_device("h100-80g");
  c.gpus_per_node = 8;
  Model m = load_model("gpt2");
  for (Strategy s : kAllStrategies) {
    TrainingConfig t;
    t.strategy = s;
    t.micro_batch = 4;
    Simulation sim = simulate_step(m, c, t);
    EXPECT_LE(sim.step_seconds, sim.compute_seconds + sim.comm_seconds + 1e-12) << to_string(s);
    EXPECT_GE(sim.step_seconds, std::max(sim.compute_seconds, sim.comm_seconds) - 1e-12) << to_string(s);
  }
}

// tiny-gpt under DDP with small buckets on a slow link: every bucket's
// all-reduce overlaps backward (the contention tests' case).
TrainingConfig overlapping_ddp() {
  TrainingConfig t = fp32(Strategy::ddp, 4);
  t.bucket_mb = 0.05;
  return t;
}
Cluster slow_link_cluster(int ranks) {
  Cluster c = toy_cluster(ranks);
  c.device.link_bytes_per_s = 1e8;
  return c;
}

TEST(Simulator, CollectivesSlowTheComputeTheyOverlap) {
  // DDP on 4 ranks, tiny-gpt: every bucket's all-reduce overlaps backward.
  // With comm_slowdown s, compute that runs beside a collective takes 1 + s
  // times as long: the compute stream's busy time grows by at most s times
  // the communication time, and not at all on one rank.
  const Model m = load_model("tiny-gpt");
  TrainingConfig t = overlapping_ddp();
  Cluster c = slow_link_cluster(4);
  const Simulation base = simulate_step(m, c, t);
  c.device.comm_slowdown = 0.5;
  const Simulation slowed = simulate_step(m, c, t);
  EXPECT_GT(slowed.compute_seconds, base.compute_seconds);
  EXPECT_LE(slowed.compute_seconds - base.compute_seconds, 0.5 * base.comm_seconds + 1e-12);
  Cluster one = toy_cluster(1);
  const double alone = simulate_step(m, one, t).compute_seconds;
  one.device.comm_slowdown = 0.5;
  EXPECT_DOUBLE_EQ(simulate_step(m, one, t).compute_seconds, alone);  // control: nothing to overlap
}

TEST(Simulator, CollectivesThatStallBesideComputeRunInItsWaits) {
  // comm_stall 1 (a CPU rank whose communication thread yields its one core
  // to the compute thread): no collective progresses while compute runs, so
  // every second of communication is a second the step waits — the step is
  // compute + communication exactly. 0 overlaps (the control); in between
  // lies in between. The compute itself is untouched (comm_slowdown 0).
  const Model m = load_model("tiny-gpt");
  TrainingConfig t = overlapping_ddp();
  Cluster c = slow_link_cluster(4);
  const Simulation overlapped = simulate_step(m, c, t);
  ASSERT_LT(overlapped.step_seconds, overlapped.compute_seconds + overlapped.comm_seconds - 1e-6);
  c.device.comm_stall = 1;
  const Simulation stalled = simulate_step(m, c, t);
  EXPECT_NEAR(stalled.step_seconds, stalled.compute_seconds + stalled.comm_seconds, 1e-12);
  EXPECT_DOUBLE_EQ(stalled.compute_seconds, overlapped.compute_seconds);
  EXPECT_DOUBLE_EQ(stalled.comm_seconds, overlapped.comm_seconds);
  c.device.comm_stall = 0.5;
  const Simulation half = simulate_step(m, c, t);
  EXPECT_GT(half.step_seconds, overlapped.step_seconds);
  EXPECT_LT(half.step_seconds, stalled.step_seconds);
  for (Strategy s : kAllStrategies) {  // every strategy: nothing overlaps, nothing is lost
    t.strategy = s;
    c.device.comm_stall = 1;
    const Simulation st = simulate_step(m, c, t);
    EXPECT_NEAR(st.step_seconds, st.compute_seconds + st.comm_seconds, 1e-12) << to_string(s);
  }
}

TEST(Simulator, RankSkewGrowsWithTheLogOfTheWorld) {
  // rank_jitter j: the step ends j sqrt(2 ln N x compute) later (the expected
  // maximum of N Gaussian drifts); nothing on one rank.
  Model m = load_model("tiny-gpt");
  TrainingConfig t = fp32(Strategy::ddp, 4);
  for (int n : {1, 2, 8}) {
    Cluster c = toy_cluster(n);
    const Simulation base = simulate_step(m, c, t);
    c.device.rank_jitter = 0.01;
    const Simulation skewed = simulate_step(m, c, t);
    const double want = n == 1 ? 0.0 : 0.01 * std::sqrt(2 * std::log(static_cast<double>(n)) * base.compute_seconds);
    EXPECT_NEAR(skewed.step_seconds - base.step_seconds, want, 1e-12) << n;
    EXPECT_NEAR(skewed.comm_seconds - base.comm_seconds, want, 1e-12) << n;  // waiting for the slowest rank
  }
}

TEST(Simulator, KernelModelCostsGemmsAttentionAndMemoryOpsApart) {
  // gpt2 on one H100: the step program records each op's GEMMs and attention
  // core; the per-op-class model costs a linear by its GEMM curve (slower per
  // FLOP than the large-GEMM ceiling), a layernorm by its bytes, and the
  // causal flash core at its published throughput.
  Cluster c;
  c.device = find_device("h100-80g");
  TrainingConfig t;
  t.micro_batch = 8;
  t.attention = AttentionImpl::flash;
  const StepProgram prog = build_step_program(load_model("gpt2"), c, t);
  int linears = 0, attentions = 0;
  for (const ComputeEvent& e : prog.compute) {
    if (e.phase != Phase::forward || e.node < 0) continue;
    const double s = compute_event_seconds(e, c.device, t.precision);
    if (e.name == "h.0.mlp.c_fc") {  // [8 x 1024, 768] x [768, 3072]
      ++linears;
      ASSERT_EQ(e.gemms.size(), 1u);
      EXPECT_EQ(e.gemms[0].m, 8 * 1024);
      EXPECT_EQ(e.gemms[0].n, 3072);
      EXPECT_EQ(e.gemms[0].k, 768);
      EXPECT_GT(s, e.flops / (c.device.bf16_flops * c.device.gemm_efficiency));
    }
    if (e.name == "h.0.attn") {
      ++attentions;
      EXPECT_EQ(e.attention.batch, 8 * 12);
      EXPECT_EQ(e.attention.seq, 1024);
      EXPECT_EQ(e.attention.head_dim, 64);
      EXPECT_TRUE(e.attention.causal);
      EXPECT_TRUE(e.attention.flash);
      EXPECT_EQ(e.gemms.size(), 2u);  // QKV and output projections
    }
    if (e.name == "h.0.ln_1") {  // memory-bound: its bytes at the memory rate
      EXPECT_TRUE(e.gemms.empty());
      EXPECT_NEAR(s, c.device.op_overhead_s + e.bytes / (c.device.hbm_bytes_per_s * c.device.memory_efficiency), 1e-12);
    }
  }
  EXPECT_EQ(linears, 1);
  EXPECT_EQ(attentions, 1);
}

}  // namespace
