// `dlplan train`: run a plan for real.
//   mpirun -np N dlplan train --plan plan.json [--steps K] [--seed S]
//          [--data synthetic|FILE] [--report run.json] [--progress text|json] [--log-every N]
//          [--device cpu|cuda [--comm nccl|mpi]] [--allow-edited-plan]
// --device cuda runs a plan made for a GPU (fp32 only for now) on this node's
// GPUs: rank r uses device (node-local rank) mod (visible devices), with the
// CUDA backend, the caching device allocator, and NCCL (--comm nccl, one GPU
// per rank) or MPI through pinned host buffers (--comm mpi, GPUs may be shared).
// Errors every rank sees alike (a bad plan, the wrong number of ranks) print
// once, from rank 0, and every rank exits; a failure on one rank during
// training ends the whole job, naming that rank.
//
// Test-only fault injection: DLPLAN_FAULT="RANK:STEP:kill|error" makes rank
// RANK, at the start of step STEP (1-based), either raise SIGKILL on itself
// (a rank dying without a word) or throw "injected failure at step STEP" (a
// rank failing; the job ends through Communicator::abort, naming the rank).
// The tests of rank failure use it (tests/executor/train_cli_test.cpp); it is
// not meant for users. An unset or empty variable injects nothing; a malformed
// one is a set-up error.
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/device.hpp"
#include "dlplan/exec/report.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/limits.hpp"
#include "dlplan/output_file.hpp"
#include "dlplan/plan_io.hpp"

#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

namespace dlplan::cli {
namespace {

struct TrainFlags {
  std::string plan, data = "synthetic", report, progress = "text";
  std::string device = "cpu", comm = "nccl";
  bool comm_given = false;
  bool allow_edited = false;
  int steps = 10;
  int log_every = 1;
  uint64_t seed = 1;
};

// DLPLAN_FAULT (test-only, see the top of this file).
struct Fault {
  int rank = 0;
  int step = 0;  // 1-based
  bool kill = false;
};

std::optional<Fault> fault_from_environment() {
  const char* raw = std::getenv("DLPLAN_FAULT");
  if (raw == nullptr || *raw == '\0') return std::nullopt;
  const std::string v = raw;
  auto bad = [&v]() {
    return Error(fmt::format("DLPLAN_FAULT='{}' is not RANK:STEP:kill|error (a test-only fault injection, e.g. 1:2:kill)", v));
  };
  const size_t a = v.find(':'), b = a == std::string::npos ? a : v.find(':', a + 1);
  if (b == std::string::npos) throw bad();
  auto number = [&](const std::string& t) {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos) throw bad();
    return std::stoi(t);
  };
  Fault f;
  f.rank = number(v.substr(0, a));
  f.step = number(v.substr(a + 1, b - a - 1));
  const std::string what = v.substr(b + 1);
  if (f.step < 1 || (what != "kill" && what != "error")) throw bad();
  f.kill = what == "kill";
  return f;
}

}  // namespace

Runner add_train_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  app.add_option("--plan", f->plan, "A plan written by dlplan plan --out")->required();
  app.add_option("--steps", f->steps, "Optimizer steps to run")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--log-every", f->log_every, "Print progress every N steps (and the first and the last)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", f->seed, "Seed for initialisation, data and dropout")->capture_default_str();
  app.add_option("--data", f->data, "synthetic, or a token file (.u16/.bin/.i32) or a DLPI image file")->capture_default_str();
  app.add_option("--report", f->report, "Write the run report (JSON) here");
  app.add_option("--progress", f->progress, "text or json (one JSON line per step)")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
  app.add_option("--device", f->device, "cpu, or cuda (a plan for a GPU, on this node's GPUs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  auto* comm_option = app.add_option("--comm", f->comm, "With --device cuda: nccl, or mpi (through host memory)")
                          ->capture_default_str()
                          ->check(CLI::IsMember({"nccl", "mpi"}));
  app.add_flag("--allow-edited-plan", f->allow_edited,
               "Run a plan edited after planning (its prediction may no longer hold; the report says so)");
  return [f, comm_option]() {
    f->comm_given = comm_option->count() > 0;
    // Declared before the communicator: a GPU communicator is ordered after
    // the backend's stream, so the device goes last.
    exec::Device device;
    std::unique_ptr<exec::Communicator> comm = exec::make_communicator(nullptr, nullptr);
    const bool root = comm->rank() == 0;
    PlanDocument plan;
    std::unique_ptr<exec::Trainer> trainer;
    exec::TrainOptions opt;
    opt.steps = f->steps;
    opt.seed = f->seed;
    opt.data = f->data;
    std::optional<Fault> fault;
    exec::DeviceKind kind = exec::DeviceKind::cpu;
    try {  // set-up errors are the same on every rank
      fault = fault_from_environment();
      kind = exec::parse_device_kind(f->device);
      if (f->comm_given && kind != exec::DeviceKind::cuda)
        throw Error(fmt::format("--comm {} applies to --device cuda only", f->comm));
      if (!exec::device_built(kind))
        throw Error("--device cuda: this dlplan was built without CUDA (configure found no nvcc: see its build summary)");
      plan = read_plan_file(f->plan, PlanReadOptions{.allow_edited = f->allow_edited});
      // Sample indices (data and dropout are keyed by them) stay within 2^62.
      const int64_t global = plan.training.micro_batch * plan.training.grad_accum * plan.cluster.world();
      if (f->steps > kMaxSampleIndex / global)
        throw Error(fmt::format("--steps {} x a global batch of {} samples would index past 2^62 samples", f->steps, global));
      if (plan.edited && root)
        fmt::print(stderr, "dlplan: warning: {}: edited after planning (--allow-edited-plan); its prediction may not "
                           "hold, and the report says plan_edited\n", f->plan);
    } catch (const Error& e) {
      if (root) fmt::print(stderr, "dlplan: error: {}\n", e.what());
      return 1;
    }
    try {  // collective: the device may fail on some ranks only
      device = exec::make_device(kind, *comm);
    } catch (const exec::DeviceError& e) {
      if (e.reported_here) fmt::print(stderr, "dlplan: error: {}\n", e.what());
      return 1;
    }
    try {  // collective: NCCL's set-up fails (or not) on every rank
      comm = exec::make_device_communicator(device, exec::parse_gpu_comm_kind(f->comm), std::move(comm));
    } catch (const Error& e) {
      if (root) fmt::print(stderr, "dlplan: error: --device {} --comm {}: {}\n", f->device, f->comm, e.what());
      return 1;
    }
    try {  // set-up errors are the same on every rank
      trainer = std::make_unique<exec::Trainer>(plan, *comm, *device.backend, opt, std::move(device.memory),
                                                std::move(device.ops));
    } catch (const Error& e) {
      if (root) fmt::print(stderr, "dlplan: error: {}\n", e.what());
      return 1;
    }
    exec::RunMeasurement run;
    try {
      if (root && f->progress == "text")
        fmt::print("training {} on {} rank{} ({}{}), {} steps, global batch {}\n", plan.model.name, comm->size(),
                   comm->size() == 1 ? "" : "s", to_string(plan.training.strategy),
                   f->device == "cpu" ? std::string() : fmt::format(", {} with {}", f->device, comm->name()), f->steps,
                   trainer->samples_per_step());
      double busy_after_first = 0;
      for (int s = 0; s < f->steps; ++s) {
        if (fault && fault->rank == comm->rank() && fault->step == s + 1) {
          if (fault->kill) {
            std::fflush(stdout);
            std::raise(SIGKILL);
          }
          throw Error(fmt::format("injected failure at step {}", fault->step));
        }
        run.steps.push_back(trainer->step());
        if (s == 0) busy_after_first = comm->busy_seconds();
        // Step 1, every --log-every steps, and the last.
        const bool log = s == 0 || (s + 1) % f->log_every == 0 || s + 1 == f->steps;
        if (root && log) {
          const auto& st = run.steps.back();
          // ETA: the remaining steps at the mean of the steps after the first
          // (the first pays for set-up).
          double eta = -1;
          if (s + 1 < f->steps && s >= 1) {
            double after_first = 0;
            for (size_t k = 1; k < run.steps.size(); ++k) after_first += run.steps[k].seconds;
            eta = after_first / static_cast<double>(s) * (f->steps - s - 1);
          }
          fmt::print("{}\n", f->progress == "json" ? exec::progress_json(st, f->steps, *trainer)
                                                   : exec::progress_text(st, f->steps, *trainer, eta));
          std::fflush(stdout);
        }
      }
      const int measured = std::max(1, f->steps - 1);
      run.comm_busy_seconds = (comm->busy_seconds() - (f->steps > 1 ? busy_after_first : 0.0)) / measured;
      run.memory = exec::highest_peak_rank(*trainer, *comm);
      auto report = exec::run_report(plan, *trainer, run, comm->size(), f->seed);
      if (root) {
        if (f->progress == "text") fmt::print("{}{}", exec::time_table(report), exec::memory_table(report));
        if (!f->report.empty()) {
          write_output_file(f->report, report_json(report).dump(1) + "\n");
          if (f->progress == "text") fmt::print("wrote {}\n", f->report);
        }
      }
    } catch (const std::exception& e) {
      comm->abort(fmt::format("error: {}", e.what()));
    }
    return 0;
  };
}

}  // namespace dlplan::cli
