// Measured op costs (op_costs.hpp) in the simulator, against hand arithmetic:
// a table with a known time for every op gives their sum; another micro-batch
// scales it; recomputation reads the forward's row; a table measured with
// other ranks per node or older kernels is set aside and said so; the profile's JSON
// round-trips and its errors name the field; signatures survive a plan file;
// the curves' fit recovers a known line, interpolates a GEMM's rate between
// the sizes it saw, and times the ops a table lacks by their kind's curve,
// else their class's ("*gemm", "*memory").
#include "dlplan/op_costs.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/simulator.hpp"
#include "dlplan/loader.hpp"

#include "cpu_host.hpp"
#include "error_of.hpp"
#include "once_per_step.hpp"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>

using namespace dlplan;
using dlplan::testing::error_of;

namespace {

Cluster host(int ranks) { return dlplan::testing::cpu_host(ranks); }

TrainingConfig fp32(int64_t micro_batch, Checkpointing ck = Checkpointing::none) {
  TrainingConfig t;
  t.precision = Precision::fp32;
  t.micro_batch = micro_batch;
  t.checkpointing = ck;
  return t;
}

// Every op of the program at `seconds_of(phase)`, measured at `micro_batch`.
template <class F>
std::shared_ptr<const OpCostTable> table_for(const StepProgram& prog, int ranks, int64_t micro_batch, F seconds_of,
                                             double optimizer_bytes_per_s = 0, double gap = 0) {
  auto t = std::make_shared<OpCostTable>();
  t->ranks_per_node = ranks;
  t->kernel_revision = kCpuKernelRevision;
  t->optimizer_bytes_per_s = optimizer_bytes_per_s;
  t->gap_per_op_s = gap;
  std::set<std::pair<std::string, Phase>> seen;
  for (const ComputeEvent& e : prog.compute)
    if (e.node >= 0 && e.phase != Phase::recompute && seen.insert({e.signature, e.phase}).second)
      t->ops.push_back({e.signature, e.phase, micro_batch, seconds_of(e.phase), 1});
  return t;
}

double optimizer_bytes(const StepProgram& prog) {
  for (const ComputeEvent& e : prog.compute)
    if (e.node < 0) return e.bytes;
  return 0;
}

TEST(OpCosts, ATableWithKnownTimesGivesTheirSum) {
  const Model m = load_model("tiny-gpt");
  Cluster c = host(1);
  const TrainingConfig t = fp32(4);
  const StepProgram prog = build_step_program(m, c, t);
  int forwards = 0, backwards = 0;
  for (const ComputeEvent& e : prog.compute) {
    if (e.node < 0) continue;
    EXPECT_FALSE(e.signature.empty()) << e.name;
    (e.phase == Phase::forward ? forwards : backwards)++;
  }
  // 1 ms per forward, 3 ms per backward, the optimizer at 1 GB/s, 10 us between ops.
  const double opt_bytes = optimizer_bytes(prog);
  ASSERT_GT(opt_bytes, 0);
  c.op_costs = table_for(prog, 1, 4, [](Phase p) { return p == Phase::forward ? 1e-3 : 3e-3; }, 1e9, 10e-6);
  const Simulation s = simulate_program(prog, c, t);
  const double events = forwards + backwards + 1;
  EXPECT_NEAR(s.compute_seconds, forwards * 1e-3 + backwards * 3e-3 + opt_bytes / 1e9 + events * 10e-6, 1e-12);
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::measured)], static_cast<int>(events));
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::roofline)], 0);
  // Doubling every row doubles the ops' share of the step.
  c.op_costs = table_for(prog, 1, 4, [](Phase p) { return p == Phase::forward ? 2e-3 : 6e-3; }, 1e9, 10e-6);
  EXPECT_NEAR(simulate_program(prog, c, t).compute_seconds - s.compute_seconds, forwards * 1e-3 + backwards * 3e-3, 1e-12);
}

// The gap's byte term (calibrate without --model): each op of the model pays
// gap_per_byte_s x its ComputeEvent::bytes on top of gap_per_op_s; the
// optimizer's update, only gap_per_op_s.
TEST(OpCosts, TheGapsByteTermChargesEachOpItsBytes) {
  const Model m = load_model("tiny-cnn");
  Cluster c = host(1);
  const TrainingConfig t = fp32(4);
  const StepProgram prog = build_step_program(m, c, t);
  double op_bytes = 0, optimizer = 0;
  for (const ComputeEvent& e : prog.compute) (e.node >= 0 ? op_bytes : optimizer) += e.bytes;
  ASSERT_GT(op_bytes, 0);
  ASSERT_GT(optimizer, 0);
  auto table = std::make_shared<OpCostTable>(*table_for(prog, 1, 4, [](Phase) { return 1e-3; }, 1e9, 10e-6));
  c.op_costs = table;
  const double without = simulate_program(prog, c, t).compute_seconds;
  table->gap_per_byte_s = 1e-12;  // 1 us per MB
  c.op_costs = table;
  EXPECT_NEAR(simulate_program(prog, c, t).compute_seconds - without, op_bytes * 1e-12, 1e-12);
}

TEST(OpCosts, AnotherMicroBatchScalesTheNearestRow) {
  const Model m = load_model("tiny-mlp");
  Cluster c = host(1);
  const StepProgram at2 = build_step_program(m, c, fp32(2));
  auto t = std::make_shared<OpCostTable>(*table_for(at2, 1, 2, [](Phase) { return 1e-3; }));
  // A second, farther row at micro-batch 32 that must not be chosen for 6.
  for (OpCost row : std::vector<OpCost>(t->ops)) {
    row.micro_batch = 32;
    row.seconds = 1.0;
    t->ops.push_back(row);
  }
  c.op_costs = t;
  const TrainingConfig t6 = fp32(6);
  const StepProgram at6 = build_step_program(m, c, t6);
  const Simulation s = simulate_program(at6, c, t6);
  int ops = 0;
  for (const ComputeEvent& e : at6.compute) ops += e.node >= 0;
  const double roofline_optimizer = compute_event_seconds(at6.compute.back(), c.device, t6.precision);
  ASSERT_LT(at6.compute.back().node, 0);
  EXPECT_NEAR(s.compute_seconds, ops * 3e-3 + roofline_optimizer, 1e-12);  // 1 ms x 6 / 2
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::scaled)], ops);
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::roofline)], 1);  // the optimizer: no rate measured
}

// An op computed once per step (a `parameter`'s copy: TensorInfo::batched
// false) takes as long at any micro-batch: calibration times it as 1 sample
// (ComputeEvent::samples), and the simulator reads that row unscaled while
// it scales the per-sample ops' rows from micro-batch 2 to 6.
TEST(OpCosts, AnOpComputedOncePerStepIsNotScaledByTheMicroBatch) {
  const Model m = dlplan::testing::once_per_step_model();
  Cluster c = host(1);
  const StepProgram at2 = build_step_program(m, c, fp32(2));
  auto t = std::make_shared<OpCostTable>();
  t->ranks_per_node = 1;
  t->kernel_revision = kCpuKernelRevision;
  for (const ComputeEvent& e : at2.compute)
    if (e.node >= 0) t->ops.push_back({e.signature, e.phase, e.samples, 1e-3, 1});
  c.op_costs = t;
  const TrainingConfig t6 = fp32(6);
  const StepProgram at6 = build_step_program(m, c, t6);
  int once = 0, per_sample = 0;
  for (const ComputeEvent& e : at6.compute) {
    if (e.node < 0) continue;
    const bool w = e.name == "w";
    EXPECT_EQ(e.samples, w ? 1 : 6) << e.name;
    (w ? once : per_sample)++;
  }
  ASSERT_EQ(once, 2);  // its forward and backward
  const Simulation s = simulate_program(at6, c, t6);
  const double optimizer = compute_event_seconds(at6.compute.back(), c.device, t6.precision);
  EXPECT_NEAR(s.compute_seconds, once * 1e-3 + per_sample * 3e-3 + optimizer, 1e-12);
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::measured)], once);
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::scaled)], per_sample);
}

TEST(OpCosts, RecomputationReadsTheForwardRow) {
  const Model m = load_model("tiny-gpt");
  Cluster c = host(1);
  const TrainingConfig t = fp32(4, Checkpointing::units);
  const StepProgram prog = build_step_program(m, c, t);
  int recomputes = 0, others = 0;
  for (const ComputeEvent& e : prog.compute)
    if (e.node >= 0) (e.phase == Phase::recompute ? recomputes : others)++;
  ASSERT_GT(recomputes, 0);
  c.op_costs = table_for(prog, 1, 4, [](Phase p) { return p == Phase::forward ? 1e-3 : 2e-3; }, 1e9);
  const Simulation s = simulate_program(prog, c, t);
  int forwards = 0;
  for (const ComputeEvent& e : prog.compute) forwards += e.node >= 0 && e.phase == Phase::forward;
  EXPECT_NEAR(s.compute_seconds, (forwards + recomputes) * 1e-3 + (others - forwards) * 2e-3 + optimizer_bytes(prog) / 1e9,
              1e-12);
}

TEST(OpCosts, ATableFromOtherRanksPerNodeIsSetAsideAndSaid) {
  const Model m = load_model("tiny-mlp");
  Cluster c = host(1);
  const TrainingConfig t = fp32(4);
  const StepProgram prog = build_step_program(m, c, t);
  const double plain = simulate_program(prog, c, t).compute_seconds;
  c.op_costs = table_for(prog, 2, 4, [](Phase) { return 1.0; });  // measured with 2 ranks sharing the cores
  const Simulation s = simulate_program(prog, c, t);
  EXPECT_DOUBLE_EQ(s.compute_seconds, plain);
  EXPECT_NE(s.cost_table_unused.find("2 rank(s) per node"), std::string::npos) << s.cost_table_unused;
  // The planner carries the reason to --explain.
  PlanRequest req;
  req.model = m;
  req.cluster = c;
  req.training = t;
  req.forced = Strategy::ddp;
  const Planning p = plan(req);
  ASSERT_TRUE(p.chosen());
  EXPECT_EQ(p.chosen()->cost_table_unused, s.cost_table_unused);
}

TEST(OpCosts, ATableOfOlderKernelsIsSetAsideAndSaid) {
  const Model m = load_model("tiny-mlp");
  Cluster c = host(1);
  const TrainingConfig t = fp32(4);
  const StepProgram prog = build_step_program(m, c, t);
  const double plain = simulate_program(prog, c, t).compute_seconds;
  auto old = std::make_shared<OpCostTable>(*table_for(prog, 1, 4, [](Phase) { return 1.0; }));
  old->kernel_revision = kCpuKernelRevision - 1;
  c.op_costs = old;
  const Simulation s = simulate_program(prog, c, t);
  EXPECT_DOUBLE_EQ(s.compute_seconds, plain);
  EXPECT_NE(s.cost_table_unused.find("calibrate --model"), std::string::npos) << s.cost_table_unused;
}

TEST(OpCosts, SignaturesSurviveAPlanFile) {
  // A plan file's model lists attributes in another order; the calibration
  // that reads it must key its ops as the planner does.
  PlanRequest req;
  req.model = load_model("tiny-gpt");
  req.cluster = host(1);
  req.training = fp32(4);
  req.forced = Strategy::ddp;
  const Planning p = plan(req);
  const PlanDocument doc = plan_from_json(nlohmann::json(plan_json(p, *p.chosen())), "tiny-gpt.plan");
  const StepProgram a = build_step_program(req.model, req.cluster, req.training);
  const StepProgram b = build_step_program(doc.model, doc.cluster, doc.training);
  ASSERT_EQ(a.compute.size(), b.compute.size());
  for (size_t e = 0; e < a.compute.size(); ++e) EXPECT_EQ(a.compute[e].signature, b.compute[e].signature) << a.compute[e].name;
}

TEST(OpCosts, TheProfileRoundTripsAndItsErrorsNameTheField) {
  Cluster c = host(2);
  auto t = std::make_shared<OpCostTable>();
  t->source = "hand-made";
  t->ranks_per_node = 2;
  t->kernel_revision = kCpuKernelRevision;
  t->optimizer_bytes_per_s = 3e9;
  t->gap_per_op_s = 4e-6;
  t->gap_per_byte_s = 2e-12;
  t->ops.push_back({"relu [8] {} dx=1 dw=0 fp32", Phase::backward, 16, 2.5e-5, 10});
  c.op_costs = t;
  const nlohmann::json j = cluster_to_json(c);
  const Cluster back = cluster_from_json(j, "host.json");
  ASSERT_TRUE(back.op_costs);
  EXPECT_EQ(back.op_costs->source, "hand-made");
  EXPECT_EQ(back.op_costs->ranks_per_node, 2);
  EXPECT_DOUBLE_EQ(back.op_costs->optimizer_bytes_per_s, 3e9);
  EXPECT_DOUBLE_EQ(back.op_costs->gap_per_op_s, 4e-6);
  EXPECT_DOUBLE_EQ(back.op_costs->gap_per_byte_s, 2e-12);
  ASSERT_EQ(back.op_costs->ops.size(), 1u);
  EXPECT_EQ(back.op_costs->ops[0].signature, t->ops[0].signature);
  EXPECT_EQ(back.op_costs->ops[0].phase, Phase::backward);
  EXPECT_EQ(back.op_costs->ops[0].micro_batch, 16);
  EXPECT_DOUBLE_EQ(back.op_costs->ops[0].seconds, 2.5e-5);

  auto broken = [&](auto edit) {
    nlohmann::json k = j;
    edit(k["op_costs"]);
    return error_of([&] { cluster_from_json(k, "host.json"); });
  };
  EXPECT_NE(broken([](auto& o) { o["ops"][0]["seconds"] = -1; }).find("host.json: op_costs.ops[0].seconds"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["ops"][0]["phase"] = "sideways"; }).find("op_costs.ops[0].phase"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["ops"][0].erase("signature"); }).find("op_costs.ops[0].signature"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o.erase("kernel_revision"); }).find("op_costs.kernel_revision"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["ranks_per_node"] = 0; }).find("op_costs.ranks_per_node"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["speed"] = 1; }).find("unknown field 'op_costs.speed'"), std::string::npos);
}

TEST(OpCosts, TheCurveFitRecoversAKnownLine) {
  // t = 2 us + flops / 50 GFLOP/s + bytes / 10 GB/s, at work that is not
  // collinear (GEMMs and elementwise ops of many sizes).
  auto line = [](double f, double b) { return 2e-6 + f / 50e9 + b / 10e9; };
  std::vector<CurveSample> samples;
  for (double f : {0.0, 1e4, 3e6, 2e8})
    for (double b : {1e3, 5e5, 4e7}) samples.push_back({f, b, line(f, b)});
  const OpCostCurve c = fit_op_curve("linear", Phase::forward, samples);
  EXPECT_EQ(c.kind, "linear");
  EXPECT_EQ(c.samples, 12);
  EXPECT_NEAR(c.overhead_s / 2e-6, 1, 1e-6);
  EXPECT_NEAR(c.seconds_per_flop * 50e9, 1, 1e-6);
  EXPECT_NEAR(c.seconds_per_byte * 10e9, 1, 1e-6);
  EXPECT_LT(c.worst_error, 1e-6);
  // Times that fall with the work cannot make a coefficient negative: the
  // fit keeps the best line without one (here the flat one, their mean in
  // relative terms).
  const OpCostCurve flat = fit_op_curve("relu", Phase::backward, {{0, 1e3, 3e-6}, {0, 1e6, 2e-6}, {0, 1e7, 1e-6}});
  EXPECT_GT(flat.overhead_s, 1e-6);
  EXPECT_LT(flat.overhead_s, 3e-6);
  EXPECT_EQ(flat.seconds_per_byte, 0);
  EXPECT_EQ(flat.seconds_per_flop, 0);
}

TEST(OpCosts, CurvesInterpolateAGemmsRate) {
  // A GEMM at R x F / (F + F_half) of its peak R takes (F + F_half) / R: a
  // line in F. Fitted at 10^5 and 10^9 FLOPs, it gives the rate between.
  const double R = 100e9, F_half = 2e6;
  auto seconds = [&](double f) { return (f + F_half) / R; };
  const OpCostCurve c = fit_op_curve("linear", Phase::forward, {{1e5, 0, seconds(1e5)}, {1e9, 0, seconds(1e9)}});
  for (double f : {1e6, 2e6, 1e7, 1e8}) {
    const double rate = f / c.seconds(f, 0);
    EXPECT_NEAR(rate / (R * f / (f + F_half)), 1, 1e-6) << f;
  }
  // At F_half the GEMM runs at half its peak.
  EXPECT_NEAR(F_half / c.seconds(F_half, 0), R / 2, R * 1e-6);
}

TEST(OpCosts, AnOpTheTableLacksTakesItsKindsCurveThenItsClasss) {
  const Model m = load_model("tiny-gpt");
  Cluster c = host(1);
  const TrainingConfig t = fp32(4, Checkpointing::units);
  const StepProgram prog = build_step_program(m, c, t);
  auto table = std::make_shared<OpCostTable>();
  table->ranks_per_node = 1;
  table->kernel_revision = kCpuKernelRevision;
  table->optimizer_bytes_per_s = 1e9;
  // linear: 5 us + flops at 20 GFLOP/s; other ops with GEMMs (attention):
  // 7 us + flops at 10 GFLOP/s; every other op: 1 us + bytes at 2 GB/s;
  // forward, twice that backward.
  for (Phase ph : {Phase::forward, Phase::backward}) {
    const double k = ph == Phase::forward ? 1 : 2;
    table->curves.push_back({"linear", ph, 5e-6 * k, k / 20e9, 0, 10, 0});
    table->curves.push_back({"*gemm", ph, 7e-6 * k, k / 10e9, 0, 10, 0});
    table->curves.push_back({"*memory", ph, 1e-6 * k, 0, k / 2e9, 50, 0});
  }
  c.op_costs = table;
  double want = 0;
  int ops = 0, linears = 0, others_with_gemms = 0, recomputes = 0;
  for (const ComputeEvent& e : prog.compute) {
    if (e.node < 0) {
      want += e.bytes / 1e9;
      continue;
    }
    ++ops;
    const bool linear = m.nodes[static_cast<size_t>(e.node)].op == OpKind::linear;
    linears += linear;
    recomputes += e.phase == Phase::recompute;
    const double k = e.phase == Phase::backward ? 2 : 1;  // a recompute reads forward's curve
    const bool gemms = !linear && (!e.gemms.empty() || e.attention.batch > 0);
    others_with_gemms += gemms;
    want += linear ? 5e-6 * k + e.flops * k / 20e9 : gemms ? 7e-6 * k + e.flops * k / 10e9 : 1e-6 * k + e.bytes * k / 2e9;
  }
  ASSERT_GT(linears, 0);
  ASSERT_GT(others_with_gemms, 0);  // the attention ops
  ASSERT_GT(recomputes, 0);
  const Simulation s = simulate_program(prog, c, t);
  EXPECT_NEAR(s.compute_seconds / want, 1, 1e-12);
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::curve)], ops);
  EXPECT_EQ(s.cost_sources[static_cast<size_t>(CostSource::measured)], 1);  // the optimizer's rate
  // A measured row still comes first.
  auto with_row = std::make_shared<OpCostTable>(*table);
  const ComputeEvent& first = prog.compute.front();
  with_row->ops.push_back({first.signature, first.phase, 4, 1.0, 1});
  c.op_costs = with_row;
  const Simulation r = simulate_program(prog, c, t);
  EXPECT_GT(r.compute_seconds, s.compute_seconds + 0.9);
  EXPECT_GE(r.cost_sources[static_cast<size_t>(CostSource::measured)], 2);
  // Curves are fp32 steps': a bf16 plan's ops go to the roofline.
  c.op_costs = table;
  TrainingConfig bf16 = t;
  bf16.precision = Precision::bf16_mixed;
  const StepProgram prog16 = build_step_program(m, c, bf16);
  const Simulation b = simulate_program(prog16, c, bf16);
  EXPECT_EQ(b.cost_sources[static_cast<size_t>(CostSource::curve)], 0);
}

TEST(OpCosts, ACurvesKindSaysWhichKernelRunsTheOp) {
  EXPECT_EQ(curve_kind("linear [16,64] {\"out\":64} dx=1 dw=1 fp32"), "linear");
  EXPECT_EQ(curve_kind("linear [16,64] {\"out\":64} dx=1 dw=0 fp32 lora"), "linear");
  EXPECT_EQ(curve_kind("conv2d [16,8,8] {\"bias\":false,\"kernel\":3,\"out\":32} dx=0 dw=1 fp32 onednn"), "conv2d/onednn");
  EXPECT_EQ(curve_kind("conv2d [16,8,8] {\"bias\":false,\"groups\":16,\"kernel\":3} dx=1 dw=1 fp32 onednn"),
            "conv2d/grouped/onednn");
  EXPECT_EQ(curve_kind("conv2d [16,8,8] {\"groups\":1,\"kernel\":3} dx=1 dw=1 fp32"), "conv2d");
  EXPECT_EQ(curve_kind("groupnorm [16,8,8] {\"eps\":1e-05,\"groups\":4} dx=1 dw=1 fp32"), "groupnorm");
  // The planner's own signatures: attention carries its mode.
  const Model m = load_model("tiny-gpt");
  const Cluster c = host(1);
  const StepProgram prog = build_step_program(m, c, fp32(2));
  int attention = 0;
  for (const ComputeEvent& e : prog.compute)
    if (e.node >= 0 && m.nodes[static_cast<size_t>(e.node)].op == OpKind::attention) {
      ++attention;
      EXPECT_EQ(curve_kind(e.signature).rfind("attention/", 0), 0u) << e.signature;
    }
  EXPECT_GT(attention, 0);
}

TEST(OpCosts, CurvesRoundTripAndTheirErrorsNameTheField) {
  Cluster c = host(1);
  auto t = std::make_shared<OpCostTable>();
  t->ranks_per_node = 1;
  t->kernel_revision = kCpuKernelRevision;
  t->curves.push_back({"linear", Phase::backward, 3e-6, 1e-11, 2e-10, 24, 0.08});
  c.op_costs = t;
  const nlohmann::json j = cluster_to_json(c);
  const Cluster back = cluster_from_json(j, "host.json");
  ASSERT_TRUE(back.op_costs);
  ASSERT_EQ(back.op_costs->curves.size(), 1u);
  const OpCostCurve& k = back.op_costs->curves[0];
  EXPECT_EQ(k.kind, "linear");
  EXPECT_EQ(k.phase, Phase::backward);
  EXPECT_DOUBLE_EQ(k.overhead_s, 3e-6);
  EXPECT_DOUBLE_EQ(k.seconds_per_flop, 1e-11);
  EXPECT_DOUBLE_EQ(k.seconds_per_byte, 2e-10);
  EXPECT_EQ(k.samples, 24);
  EXPECT_DOUBLE_EQ(k.worst_error, 0.08);
  auto broken = [&](auto edit) {
    nlohmann::json x = j;
    edit(x["op_costs"]);
    return error_of([&] { cluster_from_json(x, "host.json"); });
  };
  EXPECT_NE(broken([](auto& o) { o["curves"][0]["seconds_per_flop"] = -1; }).find("host.json: op_costs.curves[0].seconds_per_flop"),
            std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["curves"][0].erase("kind"); }).find("op_costs.curves[0].kind"), std::string::npos);
  EXPECT_NE(broken([](auto& o) { o["curves"] = 3; }).find("op_costs.curves"), std::string::npos);
  EXPECT_NE(broken([](auto& o) {
              o["curves"][0]["overhead_s"] = 0;
              o["curves"][0]["seconds_per_flop"] = 0;
              o["curves"][0]["seconds_per_byte"] = 0;
            }).find("op_costs.curves[0].overhead_s"),
            std::string::npos);
}

}  // namespace
