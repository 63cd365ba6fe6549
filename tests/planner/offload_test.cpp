// CPU offload (--offload optimizer | params) against hand-derived formulas:
//  - device states: ZeRO-Offload keeps only the bf16 parameters on the GPU
//    (ZeRO-1 also its full gradients until the step's end; ZeRO-3 its shard,
//    none under --offload params); host states per rank: the fp32 gradient
//    shard (4 B), the fp32 master copy and Adam's m, v (12 B), the bf16
//    parameter shard under --offload params (2 B) — ZeRO-Offload's 16 (18)
//    bytes per parameter per shard;
//  - per node against DeepSpeed's estimate_zero3_model_states_mem_needs
//    (cpu_offload, zero_init: 16Ψ/M, 18Ψ/M, before its 1.5 buffer factor);
//  - the simulator's transfers and host optimizer from the catalog's host
//    figures (step_program.hpp, simulator.cpp);
//  - the host memory check, the flags, the compared strategies, the plan file.
#include "dlplan/explain.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/request.hpp"
#include "dlplan/simulator.hpp"
#include "dlplan/step_program.hpp"
#include "dlplan/zoo.hpp"

#include "sharding_fixtures.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>

using namespace dlplan;
using sharding_fixtures::nodes_of;
using sharding_fixtures::small_gpt;

namespace {

TrainingConfig offloaded(Strategy s, Offload o, Precision p = Precision::bf16_mixed) {
  TrainingConfig t;
  t.strategy = s;
  t.precision = p;
  t.offload = o;
  return t;
}

// Σ_u pad(P_u, N) / N: the parameters of one rank's shards.
double shard_params(const Model& m, int N) {
  double s = 0;
  for (int64_t p : unit_parameter_counts(m)) s += static_cast<double>(pad_to(p, N) / N);
  return s;
}

int64_t at(const CategoryBytes& b, Category c) { return b[static_cast<size_t>(c)]; }

}  // namespace

TEST(Offload, DeviceKeepsOnlyWhatZeroOffloadKeeps) {
  const Model m = small_gpt();
  const int N = 4;
  double padded = 0, full = 0;
  for (int64_t p : unit_parameter_counts(m)) {
    padded += static_cast<double>(pad_to(p, N));
    full += static_cast<double>(p);
  }
  const double S = shard_params(m, N);
  const auto dev = [&](Strategy s, Offload o) { return model_states(m, N, offloaded(s, o)); };
  // ZeRO-2: the bf16 parameters (padded), nothing else.
  EXPECT_EQ(at(dev(Strategy::zero2, Offload::optimizer), Category::params), static_cast<int64_t>(2 * padded));
  EXPECT_EQ(at(dev(Strategy::zero2, Offload::optimizer), Category::grads), 0);
  EXPECT_EQ(at(dev(Strategy::zero2, Offload::optimizer), Category::optimizer), 0);
  // ZeRO-1: its full bf16 gradients stay until the step's end.
  EXPECT_EQ(at(dev(Strategy::zero1, Offload::optimizer), Category::grads), static_cast<int64_t>(2 * full));
  EXPECT_EQ(at(dev(Strategy::zero1, Offload::optimizer), Category::optimizer), 0);
  // ZeRO-3: its parameter shard; under --offload params, nothing.
  EXPECT_EQ(at(dev(Strategy::zero3, Offload::optimizer), Category::params), static_cast<int64_t>(2 * S));
  EXPECT_EQ(total(dev(Strategy::zero3, Offload::params)), 0);  // the model has no BN buffers
  // The executor's tensors add up to the same, on each side.
  for (auto [s, o] : {std::pair{Strategy::zero1, Offload::optimizer}, std::pair{Strategy::zero3, Offload::params}}) {
    CategoryBytes d{}, h{};
    for (const StateTensor& t : model_state_tensors(m, N, offloaded(s, o))) d[static_cast<size_t>(t.category)] += t.bytes;
    for (const StateTensor& t : host_state_tensors(m, N, offloaded(s, o))) h[static_cast<size_t>(t.category)] += t.bytes;
    EXPECT_EQ(d, model_states(m, N, offloaded(s, o)));
    EXPECT_EQ(h, host_states(m, N, offloaded(s, o)));
  }
}

TEST(Offload, HostKeepsSixteenBytesPerShardParameterEighteenWithParams) {
  const Model m = small_gpt();
  for (int N : {1, 4, 8}) {
    const double S = N == 1 ? static_cast<double>(m.parameter_count()) : shard_params(m, N);
    for (Strategy s : {Strategy::zero1, Strategy::zero2, Strategy::zero3}) {
      const CategoryBytes h = host_states(m, N, offloaded(s, Offload::optimizer));
      EXPECT_EQ(at(h, Category::grads), static_cast<int64_t>(4 * S)) << to_string(s) << " N=" << N;
      EXPECT_EQ(at(h, Category::optimizer), static_cast<int64_t>(12 * S)) << to_string(s) << " N=" << N;
      EXPECT_EQ(at(h, Category::params), 0);
    }
    const CategoryBytes p = host_states(m, N, offloaded(Strategy::zero3, Offload::params));
    EXPECT_EQ(total(p), static_cast<int64_t>((N == 1 ? 16 : 18) * S)) << N;  // one rank shards no parameters
  }
  // fp32: the host still keeps an fp32 copy to update (4) beside m and v (8).
  EXPECT_EQ(at(host_states(m, 4, offloaded(Strategy::zero2, Offload::optimizer, Precision::fp32)), Category::optimizer),
            static_cast<int64_t>(12 * shard_params(m, 4)));
  // SGD without momentum: the master copy alone.
  TrainingConfig sgd = offloaded(Strategy::zero2, Offload::optimizer);
  sgd.optimizer.kind = OptimizerKind::sgd;
  EXPECT_EQ(at(host_states(m, 4, sgd), Category::optimizer), static_cast<int64_t>(4 * shard_params(m, 4)));
  // Without offload the host keeps nothing.
  EXPECT_EQ(total(host_states(m, 4, offloaded(Strategy::zero3, Offload::none))), 0);
}

TEST(Offload, PerNodeMatchesDeepSpeedsZero3Estimate) {
  // estimate_zero3_model_states_mem_needs(cpu_offload=True, zero_init=True):
  // CPU 16Ψ/M x 1.5 (18Ψ/M x 1.5 with cpu_offload_params) per node of M nodes.
  PlanRequest r;
  r.model = load_model("gpt2");
  r.cluster = nodes_of(2, 8);
  r.training = offloaded(Strategy::zero3, Offload::optimizer);
  r.forced = Strategy::zero3;
  const double psi = static_cast<double>(r.model.parameter_count());
  for (Offload o : {Offload::optimizer, Offload::params}) {
    r.training.offload = o;
    const Planning p = plan(r);
    const StrategyResult& row = *p.chosen();
    const double ds = (o == Offload::params ? 18 : 16) * psi / 2;  // before the 1.5 buffer factor
    EXPECT_NEAR(static_cast<double>(row.host.per_node), ds, 1e-4 * ds) << to_string(o);  // padding only
    EXPECT_EQ(row.host.ranks, 8);
    const ModelStates ms = compare_model_states(p, row);
    ASSERT_EQ(ms.host_estimates.size(), 2u);
    EXPECT_NEAR(ms.host_estimates[1].bytes, 1.5 * ds, 1e-9 * ds);
    EXPECT_EQ(ms.host_bytes, row.host.per_node);
  }
}

TEST(Offload, TransfersAndHostOptimizerAreCharged) {
  const Model m = small_gpt();
  Cluster c = nodes_of(1, 4);
  c.device.comm_slowdown = 0;  // compute then takes the same time beside a longer collective
  const int N = 4;
  const double S = shard_params(m, N);
  TrainingConfig t = offloaded(Strategy::zero2, Offload::optimizer);
  const StepProgram prog = build_step_program(m, c, t);
  // Each reduce-scatter carries its bf16 shard down.
  double down = 0;
  for (const CommEvent& ev : prog.comm)
    if (ev.purpose == CommPurpose::unit_reduce_scatter) {
      EXPECT_DOUBLE_EQ(ev.host_copy_bytes, ev.bytes / N);
      down += ev.host_copy_bytes;
    }
  EXPECT_DOUBLE_EQ(down, 2 * S);
  // The optimizer: on the host, 4 (grad) + 2 x (4 master + 8 m, v) bytes per
  // shard parameter; the updated bf16 shard goes up (2 B).
  const ComputeEvent& opt = prog.compute.back();
  ASSERT_EQ(opt.phase, Phase::optimizer);
  EXPECT_TRUE(opt.on_host);
  EXPECT_DOUBLE_EQ(opt.bytes, 28 * S);
  EXPECT_DOUBLE_EQ(opt.link_bytes, 2 * S);
  // Its time: the node's host bandwidth x 0.85 shared by 4 ranks, plus the link.
  const DeviceSpec& d = c.device;
  const double host_s = 28 * S / (d.host_bytes_per_s * 0.85 / 4) + 2 * S / d.host_link_bytes_per_s;
  const double without = simulate_program(build_step_program(m, c, offloaded(Strategy::zero2, Offload::none)), c,
                                          offloaded(Strategy::zero2, Offload::none))
                             .compute_seconds;
  const Simulation with = simulate_program(prog, c, t);
  const double device_opt = compute_event_seconds(
      build_step_program(m, c, offloaded(Strategy::zero2, Offload::none)).compute.back(), d, Precision::bf16_mixed);
  EXPECT_NEAR(with.compute_seconds, without - device_opt + host_s, 1e-9 + 1e-6 * without);
  // ZeRO-1 sends its gradient shard down at the optimizer instead.
  const StepProgram z1 = build_step_program(m, c, offloaded(Strategy::zero1, Offload::optimizer));
  EXPECT_DOUBLE_EQ(z1.compute.back().link_bytes, 4 * S);
  // --offload params: each gather uploads its shard first; nothing goes up after the optimizer.
  const StepProgram z3 = build_step_program(m, c, offloaded(Strategy::zero3, Offload::params));
  int gathers = 0;
  for (const CommEvent& ev : z3.comm)
    if (ev.purpose == CommPurpose::unit_gather || ev.purpose == CommPurpose::root_gather) {
      EXPECT_DOUBLE_EQ(ev.host_copy_bytes, ev.bytes / N);
      ++gathers;
    }
  EXPECT_GT(gathers, 0);
  EXPECT_DOUBLE_EQ(z3.compute.back().link_bytes, 0);
  EXPECT_DOUBLE_EQ(z3.compute.back().bytes, 30 * S);  // + the bf16 shard written on the host
}

TEST(Offload, HostMemoryIsCheckedPerNode) {
  PlanRequest r;
  r.model = load_model("gpt2");
  r.cluster = nodes_of(1, 8);
  r.training = offloaded(Strategy::zero2, Offload::optimizer);
  r.forced = Strategy::zero2;
  const Planning ok = plan(r);
  EXPECT_TRUE(ok.chosen()->fits);
  EXPECT_EQ(ok.chosen()->host.capacity, r.cluster.device.host_memory_bytes);
  // A node with less host memory than its 8 ranks' 16 bytes per shard parameter.
  r.cluster.device.host_memory_bytes = ok.chosen()->host.per_node - 1;
  const Planning tight = plan(r);
  EXPECT_FALSE(tight.chosen()->fits);
  const std::string reasons = fmt::format("{}", fmt::join(tight.recommendation.reasons, "\n"));
  EXPECT_NE(reasons.find("host memory per node"), std::string::npos) << reasons;
  // Not given: not checked.
  r.cluster.device.host_memory_bytes = 0;
  EXPECT_TRUE(plan(r).chosen()->fits);
}

TEST(Offload, OffloadLetsAModelFitThatDoesNot) {
  // Llama-2 7B, bf16 Adam, on one 80 GB H100: 16 bytes per parameter do not
  // fit (112 GB); with the optimizer and gradients on the host (2 TB), the
  // 13.5 GB of bf16 parameters and the activations do.
  PlanRequest r;
  r.model = load_model("llama2-7b");
  r.cluster = nodes_of(1, 1);
  r.training = offloaded(Strategy::zero2, Offload::none);
  r.training.checkpointing = Checkpointing::units;
  r.forced = Strategy::zero2;
  EXPECT_FALSE(plan(r).chosen()->fits);
  r.training.offload = Offload::optimizer;
  const Planning p = plan(r);
  EXPECT_TRUE(p.chosen()->fits);
  EXPECT_EQ(at(p.chosen()->walk.at_peak, Category::optimizer), 0);
}

TEST(Offload, FlagsAndComparedStrategies) {
  RequestFlags f;
  f.model = "tiny-gpt";
  f.gpus = 4;
  f.offload = "params";
  f.strategy = "zero2";
  EXPECT_THROW(build_request(f), UsageError);  // parameters offload needs zero3 / hsdp3
  f.strategy = "ddp";
  f.offload = "optimizer";
  EXPECT_THROW(build_request(f), UsageError);  // the optimizer runs on a shard
  f.offload = "params";
  f.strategy = "zero3";
  f.gpus = 1;
  EXPECT_THROW(build_request(f), UsageError);  // one rank has no parameter shards to move
  f.gpus = 4;
  f.offload = "disk";
  f.strategy = "zero2";
  EXPECT_THROW(build_request(f), UsageError);
  f.offload = "optimizer";
  EXPECT_EQ(build_request(f).training.offload, Offload::optimizer);
  f.strategy.clear();
  const Planning p = plan(build_request(f));
  for (const auto& row : p.results) EXPECT_NE(row.strategy, Strategy::ddp);
  f.offload = "params";
  const Planning q = plan(build_request(f));
  ASSERT_EQ(q.results.size(), 1u);
  EXPECT_EQ(q.results[0].strategy, Strategy::zero3);
}

TEST(Offload, PlanFileCarriesIt) {
  RequestFlags f;
  f.model = "tiny-gpt";
  f.gpus = 4;
  f.strategy = "zero3";
  f.offload = "params";
  const Planning p = plan(build_request(f));
  const auto j = plan_json(p, *p.chosen());
  EXPECT_EQ(j.at("offload"), "params");
  EXPECT_EQ(j.at("host").at("per_node"), p.chosen()->host.per_node);
  const PlanDocument back = plan_from_json(j, "offload plan");
  EXPECT_EQ(back.training.offload, Offload::params);
  EXPECT_EQ(back.predicted.host, p.chosen()->host.per_rank);
  // The planning document: host per node, per strategy.
  const auto doc = planning_json(p);
  EXPECT_EQ(doc.at("strategies").at(0).at("host").at("per_node"), p.chosen()->host.per_node);
  // A plan without offload carries none (older files read alike).
  f.offload = "none";
  const Planning z = plan(build_request(f));
  EXPECT_FALSE(plan_json(z, *z.chosen()).contains("offload"));
  // An edited plan that pairs offload with a strategy it cannot go with is refused.
  auto bad = j;
  bad["strategy"] = "zero2";
  bad.erase("content_hash");
  EXPECT_THROW(plan_from_json(bad, "edited plan", PlanReadOptions{.allow_edited = true}), Error);
}
