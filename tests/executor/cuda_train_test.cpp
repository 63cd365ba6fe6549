// The trainer on a GPU (--device cuda): one whole training step of every tiny
// model on the GPU ends with the parameters of the same step on the CPU
// (relative L2 < 1e-5, fp32), and the measured peak is within 3% of the
// planner's. bf16-mixed and fp16-mixed: a few steps of every tiny model on
// the GPU give the CPU's losses (within 2% relative: both store in 16 bits
// and compute in fp32, but GEMMs sum in another order, so stored values can
// land a bf16 / fp16 step apart; fp16-mixed also skips the same steps for
// overflow, with the same loss scale), and the GPU's memory follows the plan
// as in fp32 (peak, each category at the peak and after every op within 3% of
// the planned peak).
// Without a GPU (or a CUDA build) those skip, naming the reason.
//
// Always (no GPU needed): the trainer's checks for a device (a cpu plan is
// refused, a plan over the device's free memory is refused, fp32, bf16-mixed
// and fp16-mixed plans that fit are accepted), through a stand-in device whose
// memory the host may not touch; and `dlplan train --device cuda` failing
// with a clear message where there is no usable GPU.
#include "dlplan/error.hpp"
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/checkpoint.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/cuda_backend.hpp"
#include "dlplan/exec/cuda_runtime.hpp"
#include "dlplan/exec/device_ops.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

PlanDocument make_plan(const std::string& model, const std::string& device, int64_t micro_batch,
                     Precision precision = Precision::fp32, Strategy s = Strategy::ddp,
                     OptimizerKind optimizer = OptimizerKind::adamw) {
  PlanRequest req;
  req.model = load_model(model);
  req.cluster.device = find_device(device);
  req.cluster.gpus_per_node = 1;
  req.training.precision = precision;
  req.training.micro_batch = micro_batch;
  req.training.optimizer.kind = optimizer;
  req.training.optimizer.lr = 1e-2;
  if (optimizer == OptimizerKind::sgd) {  // the step is then -lr * gradient, nothing else
    req.training.optimizer.clip_norm = 0;
    req.training.optimizer.weight_decay = 0;
  }
  req.forced = s;
  req.syncbn = SyncBnMode::off;
  Planning p = plan(req);
  return plan_from_json(nlohmann::json(plan_json(p, *p.chosen())), model + "." + device + ".plan");
}

// The same plan (model, batch, strategy, optimizer, options) for the CPU executor.
PlanDocument on_cpu(const PlanDocument& gpu) {
  PlanDocument c = gpu;
  c.cluster.device = find_device("cpu");
  c.path = gpu.path + " (on cpu)";
  return c;
}

double relative_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// A stand-in device: host arithmetic, but memory the host "may not touch", so
// the trainer takes its device path (checks) without a GPU.
class StandInMemory final : public MemoryResource {
 public:
  void* allocate(int64_t bytes, int64_t& granted) override { return host_->allocate(bytes, granted); }
  void release(void* p, int64_t granted) override { host_->release(p, granted); }
  void zero(void* p, int64_t bytes) override { host_->zero(p, bytes); }
  bool host_visible() const override { return false; }

 private:
  std::unique_ptr<MemoryResource> host_ = make_host_memory();
};

class StandInOps final : public DeviceOps {
 public:
  explicit StandInOps(int64_t free_bytes) : free_(free_bytes) {}
  std::string name() const override { return "stand-in"; }
  bool host() const override { return false; }
  void copy(Span d, Span s) override { cpu_->copy(d, s); }
  void zero(Span p) override { cpu_->zero(p); }
  void scaled_copy(Span d, Span s, float k) override { cpu_->scaled_copy(d, s, k); }
  void scaled_add(Span d, Span s, float k) override { cpu_->scaled_add(d, s, k); }
  void upload_floats(Span d, const float* s) override { cpu_->upload_floats(d, s); }
  void download_floats(float* d, Span s) override { cpu_->download_floats(d, s); }
  void upload(void* d, const void* s, int64_t b) override { cpu_->upload(d, s, b); }
  void download(void* d, const void* s, int64_t b) override { cpu_->download(d, s, b); }
  double sum_of_squares(Span p, double acc) override { return cpu_->sum_of_squares(p, acc); }
  void optimizer_step(const OptimizerConfig& c, const OptimizerUpdate& u, Span p, Span g, float* master, float* m,
                      float* v) override {
    cpu_->optimizer_step(c, u, p, g, master, m, v);
  }
  void widen(float* master, Span p) override { cpu_->widen(master, p); }
  void synchronize() override {}
  int64_t device_free_bytes() const override { return free_; }
  int device_count() const override { return 1; }

 private:
  int64_t free_;
  std::unique_ptr<DeviceOps> cpu_ = make_cpu_device_ops();
};

std::string refusal(const PlanDocument& plan, int64_t free_bytes) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  try {
    Trainer t(plan, *comm, *backend, {}, std::make_unique<StandInMemory>(), std::make_unique<StandInOps>(free_bytes));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// ---- without a GPU ------------------------------------------------------------------

TEST(DeviceTrainer, RefusesACpuPlan) {
  const std::string msg = refusal(make_plan("tiny-mlp", "cpu", 4), int64_t{1} << 40);
  EXPECT_TRUE(contains(msg, "planned for the cpu device")) << msg;
}

TEST(DeviceTrainer, AcceptsAGpuBf16MixedPlanThatFits) {
  EXPECT_EQ(refusal(make_plan("tiny-mlp", "h200-141g", 4, Precision::bf16_mixed), int64_t{1} << 40), "");
}

TEST(DeviceTrainer, AcceptsAGpuFp16MixedPlanThatFits) {
  EXPECT_EQ(refusal(make_plan("tiny-mlp", "h200-141g", 4, Precision::fp16_mixed), int64_t{1} << 40), "");
}

TEST(DeviceTrainer, RefusesAPlanOverTheFreeDeviceMemory) {
  const std::string msg = refusal(make_plan("tiny-mlp", "h200-141g", 4), 1024);
  EXPECT_TRUE(contains(msg, "GiB free")) << msg;
}

TEST(DeviceTrainer, AcceptsAGpuFp32PlanThatFits) {
  EXPECT_EQ(refusal(make_plan("tiny-mlp", "h200-141g", 4), int64_t{1} << 40), "");
}

TEST(DeviceTrainer, CliDeviceCudaFailsClearlyWithoutAGpu) {
#if defined(DLPLAN_HAVE_CUDA)
  if (std::string why; cuda_available(&why)) GTEST_SKIP() << "a GPU is present: --device cuda runs";
#endif
  const std::string dir = ::testing::TempDir() + "dlplan_cuda_cli_" + std::to_string(::getpid());
  const std::string plan = dir + ".plan.json";
  const std::string cmd = std::string("env -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u PMIX_RANK ") + DLPLAN_EXE +
                          " plan --model tiny-mlp --gpu h200-141g --precision fp32 --micro-batch 4 --out " + plan +
                          " >/dev/null 2>&1 && " + DLPLAN_EXE + " train --plan " + plan +
                          " --device cuda --steps 1 2>&1; echo \"exit $?\"";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[512];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  std::remove(plan.c_str());
  EXPECT_TRUE(contains(out, "exit 1")) << out;
#if defined(DLPLAN_HAVE_CUDA)
  EXPECT_TRUE(contains(out, "dlplan: error: --device cuda: ")) << out;
#else
  EXPECT_TRUE(contains(out, "this dlplan was built without CUDA")) << out;
#endif
}

// ---- on a GPU -------------------------------------------------------------------------

#if defined(DLPLAN_HAVE_CUDA)

namespace {

// The skip reason, or "" with device 0 made current.
std::string no_gpu() {
  std::string why;
  if (cuda_device_count(&why) == 0) return why;
  select_cuda_device(0);
  return {};
}

// A one-rank GPU trainer: the CUDA backend, its caching memory, and the
// MPI-staged GPU communicator over the single-process world.
struct GpuRun {
  std::unique_ptr<Backend> backend = make_cuda_backend(0);
  std::unique_ptr<GpuCommunicator> comm =
      make_gpu_communicator(GpuCommKind::mpi, make_single_communicator(), cuda_compute_stream(*backend));
  std::unique_ptr<Trainer> trainer;
  GpuRun(const PlanDocument& plan, const TrainOptions& opt) {
    void* stream = cuda_compute_stream(*backend);
    trainer = std::make_unique<Trainer>(plan, *comm, *backend, opt, make_cuda_memory(0, stream),
                                        make_cuda_device_ops(*backend));
  }
  ~GpuRun() { trainer.reset(); }  // before the communicator and the backend
};

struct Case {
  const char* model;
  int64_t micro_batch;
};
const Case kCases[] = {{"tiny-mlp", 16}, {"tiny-cnn", 16}, {"tiny-vit", 16}, {"tiny-gpt", 16}};

}  // namespace

#define SKIP_WITHOUT_GPU()                                                                \
  do {                                                                                    \
    if (const std::string why = no_gpu(); !why.empty()) GTEST_SKIP() << "no GPU: " << why; \
  } while (0)

// The gradients of one step, GPU against CPU, parameter by parameter. Plain
// SGD without clipping or decay makes the step -lr * gradient, so the change
// of each parameter is its gradient; AdamW's first step (about lr * sign(g))
// would turn rounding noise in near-zero gradients into lr-sized changes.
TEST(CudaTrain, OneStepOfEveryTinyModelHasTheCpuGradients) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : kCases) {
    const PlanDocument gpu_plan = make_plan(c.model, "h200-141g", c.micro_batch, Precision::fp32, Strategy::ddp,
                                          OptimizerKind::sgd);
    const PlanDocument cpu_plan = on_cpu(gpu_plan);
    TrainOptions opt;
    opt.steps = 1;
    auto comm = make_single_communicator();
    auto cpu_backend = make_cpu_backend();
    Trainer cpu(cpu_plan, *comm, *cpu_backend, opt);
    const std::vector<float> before = cpu.full_parameters();
    const double cpu_loss = cpu.step().loss;
    const std::vector<float> cpu_after = cpu.full_parameters();

    GpuRun gpu(gpu_plan, opt);
    const std::vector<float> gpu_before = gpu.trainer->full_parameters();
    ASSERT_EQ(gpu_before, before) << c.model << ": the same seed must give the same initial parameters";
    const double gpu_loss = gpu.trainer->step().loss;
    const std::vector<float> gpu_after = gpu.trainer->full_parameters();
    ASSERT_EQ(gpu_after.size(), cpu_after.size()) << c.model;
    EXPECT_NEAR(gpu_loss, cpu_loss, 1e-5 * std::abs(cpu_loss)) << c.model;

    const Model& m = gpu_plan.model;
    size_t at = 0;
    double worst = 0;
    std::string worst_name;
    for (const ParamInfo& p : m.params) {
      std::vector<float> dg, dc;
      for (int64_t e = 0; e < p.numel; ++e, ++at) {
        dg.push_back(before[at] - gpu_after[at]);
        dc.push_back(before[at] - cpu_after[at]);
      }
      const double err = relative_l2(dg, dc);
      EXPECT_LT(err, 1e-4) << c.model << ": gradient of " << p.name;
      if (err > worst) worst = err, worst_name = p.name;
    }
    std::printf("%s: loss %.6f (cpu %.6f); worst parameter gradient rel L2 %.2e (%s)\n", c.model, gpu_loss, cpu_loss,
                worst, worst_name.c_str());
    EXPECT_EQ(gpu.trainer->buffers().size(), cpu.buffers().size()) << c.model;
    EXPECT_LT(relative_l2(gpu.trainer->buffers(), cpu.buffers()), 1e-5) << c.model;
  }
}

TEST(CudaTrain, MeasuredPeakWithinThreePercentOfThePlanner) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : kCases) {
    const PlanDocument plan = make_plan(c.model, "h200-141g", c.micro_batch);
    TrainOptions opt;
    opt.steps = 3;
    GpuRun gpu(plan, opt);
    for (int s = 0; s < opt.steps; ++s) gpu.trainer->step();
    const StepWalk w = walk_step(plan.model, plan.cluster, plan.training);
    const double got = static_cast<double>(gpu.trainer->allocator().peak()), want = static_cast<double>(w.peak);
    const CategoryBytes at = gpu.trainer->allocator().at_peak();
    std::printf("%s: peak measured %.0f B, predicted %.0f B (%+.3f%%); at the peak, measured / predicted:", c.model, got,
                want, (got - want) / want * 100);
    for (size_t k = 0; k < at.size(); ++k)
      std::printf(" %s %lld/%lld", to_string(static_cast<Category>(k)), static_cast<long long>(at[k]),
                  static_cast<long long>(w.at_peak[k]));
    std::printf("; reserved %lld B\n", static_cast<long long>(gpu.trainer->reserved_bytes()));
    EXPECT_NEAR(got, want, 0.03 * want) << c.model << " (the caching allocator rounds requests to 512 B)";
    EXPECT_GE(gpu.trainer->runtime_bytes(), 0) << c.model;
    EXPECT_EQ(gpu.backend->scratch_grows(), 0) << c.model << ": the scratch grew mid-step (Backend::prepare)";
  }
}

// bf16-mixed and fp16-mixed: the same plan (plain SGD, as above, so that
// rounding noise in near-zero gradients is not turned into lr-sized steps)
// trained a few steps on the GPU and on the CPU. Both start from the same
// parameters and see the same batches; each step's loss must agree within 2%
// relative (bf16 keeps 8 bits: a stored value may land one step, 2^-8
// relative, apart when the fp32 sums that produce it run in another order;
// fp16's 11 bits are held to the same bound). fp16-mixed: both run with the
// same dynamic loss scale and skip the same steps (a gradient overflowed).
// The GPU's memory follows the plan with the fp32 test's rule (3% of the
// planned peak, the caching allocator's 512 B rounding): the peak, each
// category at the peak, and the largest gap after any op
// (Trainer::ledger_check).
namespace {

void mixed_trains_like_the_cpu_and_follows_the_plan(Precision precision) {
  constexpr int kSteps = 3;
  constexpr double kLossTol = 2e-2;
  const std::string prec = to_string(precision);
  const char* name = prec.c_str();
  for (const Case& c : kCases) {
    const PlanDocument gpu_plan = make_plan(c.model, "h200-141g", c.micro_batch, precision, Strategy::ddp,
                                          OptimizerKind::sgd);
    ASSERT_EQ(gpu_plan.training.precision, precision) << c.model;
    const PlanDocument cpu_plan = on_cpu(gpu_plan);
    TrainOptions opt;
    opt.steps = kSteps;
    auto comm = make_single_communicator();
    auto cpu_backend = make_cpu_backend();
    Trainer cpu(cpu_plan, *comm, *cpu_backend, opt);
    GpuRun gpu(gpu_plan, opt);
    ASSERT_EQ(gpu.trainer->full_parameters(), cpu.full_parameters())
        << c.model << ": the same seed must give the same initial parameters";
    for (int s = 0; s < kSteps; ++s) {
      const StepStats cs = cpu.step(), gs = gpu.trainer->step();
      const double cpu_loss = cs.loss, gpu_loss = gs.loss;
      std::printf("%s %s step %d: loss %.6f (cpu %.6f); loss scale %g (cpu %g)%s%s\n", c.model, name, s + 1, gpu_loss,
                  cpu_loss, gs.loss_scale, cs.loss_scale, gs.skipped ? "; gpu skipped" : "",
                  cs.skipped ? "; cpu skipped" : "");
      EXPECT_TRUE(std::isfinite(gpu_loss)) << c.model << " step " << s + 1;
      EXPECT_NEAR(gpu_loss, cpu_loss, kLossTol * std::abs(cpu_loss)) << c.model << " step " << s + 1;
      EXPECT_EQ(gs.loss_scale, cs.loss_scale) << c.model << " step " << s + 1;
      EXPECT_EQ(gs.skipped, cs.skipped) << c.model << " step " << s + 1 << ": one side found a gradient overflow";
    }
    // Control: the run really stored 16-bit values (the fp32 plan of the same model predicts more).
    const StepWalk w = walk_step(gpu_plan.model, gpu_plan.cluster, gpu_plan.training);
    const PlanDocument fp32_plan = make_plan(c.model, "h200-141g", c.micro_batch, Precision::fp32, Strategy::ddp,
                                           OptimizerKind::sgd);
    EXPECT_LT(w.peak, walk_step(fp32_plan.model, fp32_plan.cluster, fp32_plan.training).peak) << c.model;

    const double got = static_cast<double>(gpu.trainer->allocator().peak()), want = static_cast<double>(w.peak);
    const CategoryBytes at = gpu.trainer->allocator().at_peak();
    std::printf("%s %s: peak measured %.0f B, predicted %.0f B (%+.3f%%); at the peak, measured / predicted:", c.model,
                name, got, want, (got - want) / want * 100);
    for (size_t k = 0; k < at.size(); ++k) {
      std::printf(" %s %lld/%lld", to_string(static_cast<Category>(k)), static_cast<long long>(at[k]),
                  static_cast<long long>(w.at_peak[k]));
      EXPECT_NEAR(static_cast<double>(at[k]), static_cast<double>(w.at_peak[k]), 0.03 * want)
          << c.model << ": category " << to_string(static_cast<Category>(k)) << " at the peak";
    }
    std::printf("\n");
    EXPECT_NEAR(got, want, 0.03 * want) << c.model << " (the caching allocator rounds requests to 512 B)";
    const LedgerCheck& lc = gpu.trainer->ledger_check();
    EXPECT_LE(static_cast<double>(lc.worst_bytes), 0.03 * want)
        << c.model << ": measured and planned bytes " << lc.worst_bytes << " B apart " << lc.where;
    EXPECT_GE(gpu.trainer->runtime_bytes(), 0) << c.model;
    EXPECT_EQ(gpu.backend->scratch_grows(), 0) << c.model << ": the scratch grew mid-step (Backend::prepare)";
  }
}

}  // namespace

TEST(CudaTrain, Bf16MixedTrainsLikeTheCpuAndFollowsThePlan) {
  SKIP_WITHOUT_GPU();
  mixed_trains_like_the_cpu_and_follows_the_plan(Precision::bf16_mixed);
}

TEST(CudaTrain, Fp16MixedTrainsLikeTheCpuAndFollowsThePlan) {
  SKIP_WITHOUT_GPU();
  mixed_trains_like_the_cpu_and_follows_the_plan(Precision::fp16_mixed);
}

// A checkpoint saved from device memory and loaded back into another GPU
// trainer (executor checkpoint.hpp): 4 steps straight against 2, save, a new
// trainer resumed from it, 2 more; the same losses and parameters, bit for
// bit, under fp32, bf16-mixed and fp16-mixed (master weights, moments and
// fp16's loss scale travel too).
TEST(CudaTrain, CheckpointResumeIsBitExact) {
  SKIP_WITHOUT_GPU();
  for (Precision precision : {Precision::fp32, Precision::bf16_mixed, Precision::fp16_mixed}) {
    const PlanDocument plan = make_plan("tiny-gpt", "h200-141g", 8, precision, Strategy::ddp, OptimizerKind::adamw);
    TrainOptions opt;
    opt.steps = 4;
    CheckpointRun run;
    run.total_steps = opt.steps;
    const std::string dir = ::testing::TempDir() + "dlplan_cuda_ckpt_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir);
    std::vector<double> straight;
    std::vector<float> want;
    {
      GpuRun a(plan, opt);
      for (int s = 0; s < 4; ++s) {
        straight.push_back(a.trainer->step().loss);
        if (s == 1) save_checkpoint(dir, *a.trainer, *a.comm, run);
      }
      want = a.trainer->full_parameters();
    }
    GpuRun b(plan, opt);
    ASSERT_EQ(load_checkpoint(dir, *b.trainer, *b.comm, run), 2);
    for (int s = 2; s < 4; ++s) EXPECT_EQ(b.trainer->step().loss, straight[static_cast<size_t>(s)]) << "step " << s + 1;
    EXPECT_TRUE(b.trainer->full_parameters() == want) << to_string(precision);
    std::filesystem::remove_all(dir);
  }
}

#else

TEST(CudaTrain, NeedsACudaBuild) { GTEST_SKIP() << "built without CUDA (DLPLAN_HAVE_CUDA unset)"; }

#endif  // DLPLAN_HAVE_CUDA
