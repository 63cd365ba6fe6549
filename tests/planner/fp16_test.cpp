// fp16-mixed (--precision fp16-mixed) against hand-derived figures:
//  - what it keeps is bf16-mixed's (ZeRO's 2 + 2 + 12 bytes per parameter
//    with Adam, Rajbhandari et al. 2020, Sec. 3.1): fp16 is another 16-bit
//    storage type, and the fp32 master copy and moments are the same;
//  - GradScaler's overflow check costs one all-reduce of a flag per step
//    (8 bytes over every rank), inside the optimizer's step, and nothing on
//    one rank;
//  - the scale follows torch.cuda.amp.GradScaler's update rule;
//  - the GPU's fp16 tensor-core peak (the catalog's fp16_flops) prices the
//    GEMMs, and a GPU without bf16 (V100) trains in fp16-mixed by default;
//  - the ZeRO-Offload paper's headline (Ren et al. 2021, abstract and Sec.
//    4.1): a 13B-parameter model trained on one 32 GB V100, fp16 parameters
//    on the GPU, gradients and fp32 optimizer state on the host.
#include "dlplan/comm_model.hpp"
#include "dlplan/explain.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/request.hpp"
#include "dlplan/simulator.hpp"
#include "dlplan/step_program.hpp"
#include "dlplan/zoo.hpp"

#include "sharding_fixtures.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

using namespace dlplan;
using sharding_fixtures::nodes_of;
using sharding_fixtures::small_gpt;

namespace {

TrainingConfig config(Strategy s, Precision p) {
  TrainingConfig t;
  t.strategy = s;
  t.precision = p;
  t.micro_batch = 2;
  return t;
}

int64_t at(const CategoryBytes& b, Category c) { return b[static_cast<size_t>(c)]; }

std::vector<const CommEvent*> flags_of(const StepProgram& p) {
  std::vector<const CommEvent*> out;
  for (const CommEvent& e : p.comm)
    if (e.purpose == CommPurpose::overflow_flag) out.push_back(&e);
  return out;
}

// A GPT-2 style decoder of 13B class: 40 layers of width 5120 (GPT-3 13B's
// depth; GPT-3's width is 5140, not a multiple of its 40 heads), GPT-2's
// vocabulary. 12 L h^2 + 13 L h + (V + T) h + 2h parameters.
Model gpt_13b() {
  zoo::GptConfig c;
  c.name = "gpt-13b";
  c.layers = 40;
  c.hidden = 5120;
  c.heads = 40;
  c.vocab = 50257;
  c.context = 1024;
  c.dropout = 0;
  return parse_model(nlohmann::json(zoo::build_gpt(c)), "gpt-13b");
}

}  // namespace

TEST(Fp16, KeepsWhatBf16MixedKeeps) {
  const Model m = small_gpt();
  const double psi = static_cast<double>(m.parameter_count());
  for (Strategy s : {Strategy::ddp, Strategy::zero1, Strategy::zero2, Strategy::zero3}) {
    const CategoryBytes fp16 = model_states(m, 4, config(s, Precision::fp16_mixed));
    EXPECT_EQ(fp16, model_states(m, 4, config(s, Precision::bf16_mixed))) << to_string(s);
    // DDP by hand: 2 (fp16 params) + 2 (fp16 grads) + 12 (fp32 master, m, v).
    if (s == Strategy::ddp) {
      EXPECT_EQ(at(fp16, Category::params), static_cast<int64_t>(2 * psi));
      EXPECT_EQ(at(fp16, Category::grads), static_cast<int64_t>(2 * psi));
      EXPECT_EQ(at(fp16, Category::optimizer), static_cast<int64_t>(12 * psi));
    }
  }
  EXPECT_EQ(storage_dtype(Precision::fp16_mixed), DType::f16);
  EXPECT_EQ(param_bytes(Precision::fp16_mixed), 2);
  EXPECT_EQ(optimizer_bytes_per_param(Precision::fp16_mixed, OptimizerKind::adamw), 12);
  EXPECT_EQ(parse_precision("fp16-mixed"), Precision::fp16_mixed);
  EXPECT_EQ(to_string(Precision::fp16_mixed), "fp16-mixed");
}

TEST(Fp16, OverflowFlagIsOneAllReducePerStepInsideTheOptimizer) {
  const Model m = small_gpt();
  const Cluster c = nodes_of(1, 4, "a100-80g");  // fp16 and bf16 peaks equal: only the flag differs
  for (Strategy s : {Strategy::ddp, Strategy::zero2, Strategy::zero3}) {
    TrainingConfig t = config(s, Precision::fp16_mixed);
    t.grad_accum = 3;  // still one flag per step
    const StepProgram p = build_step_program(m, c, t);
    const auto flags = flags_of(p);
    ASSERT_EQ(flags.size(), 1u) << to_string(s);
    EXPECT_EQ(flags[0]->op, Collective::AllReduce);
    EXPECT_EQ(flags[0]->bytes, 8);
    EXPECT_EQ(flags[0]->group, 4);
    EXPECT_TRUE(flags[0]->blocking);
    EXPECT_EQ(flags[0]->per_step, 1);
    ASSERT_GE(flags[0]->wait_before, 0);
    EXPECT_EQ(p.compute[static_cast<size_t>(flags[0]->wait_before)].phase, Phase::optimizer);
    // bf16 has no flag; one rank needs none.
    EXPECT_TRUE(flags_of(build_step_program(m, c, config(s, Precision::bf16_mixed))).empty());
    EXPECT_TRUE(flags_of(build_step_program(m, nodes_of(1, 1, "a100-80g"), t)).empty());

    // The simulator charges exactly the flag's collective on top of bf16's
    // communication, and the step waits for it.
    TrainingConfig b = t;
    b.precision = Precision::bf16_mixed;
    const Simulation f16 = simulate_step(m, c, t), bf16 = simulate_step(m, c, b);
    const double flag = collective_cost(c, Collective::AllReduce, 8, 4).seconds;
    EXPECT_GT(flag, 0);
    EXPECT_NEAR(f16.comm_seconds - bf16.comm_seconds, flag, 1e-12) << to_string(s);
    EXPECT_GE(f16.step_seconds, bf16.step_seconds) << to_string(s);
    EXPECT_NEAR(f16.compute_seconds, bf16.compute_seconds, 1e-12) << to_string(s);
  }
}

TEST(Fp16, ScaleFollowsGradScalersUpdate) {
  // torch.cuda.amp.GradScaler(init_scale=2**16, growth_factor=2,
  // backoff_factor=0.5, growth_interval=2000), interval shortened to 3.
  LossScaling cfg;
  cfg.growth_interval = 3;
  LossScaleState s{cfg.init_scale, 0};
  EXPECT_EQ(s.scale, 65536.0);
  s = next_loss_scale(cfg, s, true);  // overflow: halve, count restarts
  EXPECT_EQ(s.scale, 32768.0);
  EXPECT_EQ(s.good_steps, 0);
  s = next_loss_scale(cfg, s, false);
  s = next_loss_scale(cfg, s, false);
  EXPECT_EQ(s.scale, 32768.0);
  EXPECT_EQ(s.good_steps, 2);
  s = next_loss_scale(cfg, s, false);  // the third clean step in a row: double
  EXPECT_EQ(s.scale, 65536.0);
  EXPECT_EQ(s.good_steps, 0);
  s = next_loss_scale(cfg, s, false);
  s = next_loss_scale(cfg, s, true);  // an overflow resets the count
  EXPECT_EQ(s.scale, 32768.0);
  EXPECT_EQ(s.good_steps, 0);
  // Growth that would overflow a double is not taken (ATen keeps the scale).
  LossScaleState big{1e308, 2};
  EXPECT_EQ(next_loss_scale(cfg, big, false).scale, 1e308);
}

TEST(Fp16, TensorCorePeakPricesTheGemms) {
  const DeviceSpec v100 = find_device("v100-32g");
  EXPECT_EQ(peak_flops(v100, Precision::fp16_mixed), 125e12);  // V100 SXM2 datasheet: 125 TFLOPS tensor
  EXPECT_EQ(peak_flops(v100, Precision::fp32), 15.7e12);
  const GemmShape g{4096, 4096, 4096, 1};
  // A large GEMM is compute-bound: fp16 on tensor cores is faster than fp32
  // by at least half the ratio of the peaks (the efficiencies differ).
  EXPECT_LT(gemm_seconds(g, v100, Precision::fp16_mixed) * 125.0 / 15.7 / 2,
            gemm_seconds(g, v100, Precision::fp32));
}

TEST(Fp16, V100TrainsInFp16MixedAndBf16IsRefusedNamingIt) {
  RequestFlags f;
  f.model = "tiny-gpt";
  f.gpus = 8;
  f.gpu = "v100-32g";
  EXPECT_EQ(build_request(f).training.precision, Precision::fp16_mixed);
  f.precision = "bf16-mixed";
  try {
    build_request(f);
    FAIL() << "bf16-mixed on a V100 was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("fp16-mixed"), std::string::npos) << e.what();
  }
  // A device description without an fp16 rate cannot plan fp16-mixed.
  PlanRequest r;
  r.model = small_gpt();
  r.cluster = nodes_of(1, 2, "a100-80g");
  r.cluster.device.fp16_flops = 0;
  r.training = config(Strategy::ddp, Precision::fp16_mixed);
  EXPECT_THROW(plan(r), UsageError);
}

TEST(Fp16, PlanFileCarriesTheLossScaling) {
  PlanRequest r;
  r.model = small_gpt();
  r.cluster = nodes_of(1, 2, "v100-32g");
  r.training = config(Strategy::zero2, Precision::fp16_mixed);
  r.training.loss_scaling.init_scale = 1024;
  r.training.loss_scaling.growth_interval = 50;
  r.forced = Strategy::zero2;
  const Planning p = plan(r);
  const OrderedJson j = plan_json(p, *p.chosen());
  ASSERT_TRUE(j.contains("loss_scale"));
  const PlanDocument back = plan_from_json(j, "fp16.plan.json");
  EXPECT_EQ(back.training.precision, Precision::fp16_mixed);
  EXPECT_EQ(back.training.loss_scaling.init_scale, 1024);
  EXPECT_EQ(back.training.loss_scaling.growth_interval, 50);
  EXPECT_EQ(back.training.loss_scaling.growth, 2);
  EXPECT_EQ(back.training.loss_scaling.backoff, 0.5);
  // bf16 plans carry none; a backoff outside (0, 1) is refused naming the field.
  OrderedJson bad = j;
  bad["loss_scale"]["backoff"] = 1.5;
  try {
    plan_from_json(bad, "bad.plan.json", PlanReadOptions{.allow_edited = true});
    FAIL() << "a backoff of 1.5 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("backoff"), std::string::npos) << e.what();
  }
}

TEST(Fp16, ZeroOffloadTrains13BOnOne32GBV100) {
  const Model m = gpt_13b();
  const double psi = static_cast<double>(m.parameter_count());
  const double L = 40, h = 5120, V = 50257, T = 1024;
  ASSERT_EQ(psi, 12 * L * h * h + 13 * L * h + (V + T) * h + 2 * h);  // 12.85e9
  PlanRequest r;
  r.model = m;
  r.cluster = nodes_of(1, 1, "v100-32g");
  r.cluster.device.alloc_granularity_bytes = find_device("v100-32g").alloc_granularity_bytes;
  r.training = config(Strategy::zero2, Precision::fp16_mixed);
  r.training.micro_batch = 1;
  r.training.checkpointing = Checkpointing::units;  // as the paper's Megatron GPT-2 runs
  r.training.offload = Offload::optimizer;
  r.forced = Strategy::zero2;
  const Planning p = plan(r);
  const StrategyResult& row = *p.chosen();
  EXPECT_TRUE(row.fits) << "peak " << row.walk.peak / 1073741824.0 << " GiB";
  // The GPU keeps the fp16 parameters (2 bytes each) and no gradient or
  // optimizer state: each unit's gradient streams down as backward completes it.
  const CategoryBytes dev = model_states(m, 1, row.training);
  EXPECT_EQ(at(dev, Category::params), static_cast<int64_t>(2 * psi));
  EXPECT_EQ(at(dev, Category::grads), 0);
  EXPECT_EQ(at(dev, Category::optimizer), 0);
  // The host: fp32 gradients (4) + fp32 master, m, v (12) = 16 bytes each.
  EXPECT_EQ(row.host.per_node, static_cast<int64_t>(16 * psi));
  EXPECT_TRUE(row.host.fits);
  // The explanation's paper formula for the GPU is 2Ψ, and dlplan's figure
  // is that exactly (one rank: nothing padded).
  const ModelStates ms = compare_model_states(p, row);
  ASSERT_FALSE(ms.estimates.empty());
  EXPECT_NEAR(ms.estimates[0].bytes, 2 * psi, 1e-6 * psi);

  // Without the offload the same model needs 16 bytes per parameter on the
  // GPU (205 GB): it does not fit, which is the paper's point.
  r.training.offload = Offload::none;
  const Planning without = plan(r);
  EXPECT_FALSE(without.chosen()->fits);
}
