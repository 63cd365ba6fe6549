// `dlplan train`: run a plan for real.
//   mpirun -np N dlplan train --plan plan.json [--steps K] [--seed S]
//          [--data synthetic|FILE] [--report run.json] [--progress text|json]
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
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/plan_file.hpp"
#include "dlplan/exec/report.hpp"
#include "dlplan/exec/trainer.hpp"

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
  int steps = 10;
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
  app.add_option("--seed", f->seed, "Seed for initialisation, data and dropout")->capture_default_str();
  app.add_option("--data", f->data, "synthetic, or a token file (.u16/.bin/.i32) or a DLPI image file")->capture_default_str();
  app.add_option("--report", f->report, "Write the run report (JSON) here");
  app.add_option("--progress", f->progress, "text or json (one JSON line per step)")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
  return [f]() {
    auto comm = exec::make_communicator(nullptr, nullptr);
    const bool root = comm->rank() == 0;
    auto backend = exec::make_cpu_backend();
    exec::LoadedPlan plan;
    std::unique_ptr<exec::Trainer> trainer;
    exec::TrainOptions opt;
    opt.steps = f->steps;
    opt.seed = f->seed;
    opt.data = f->data;
    std::optional<Fault> fault;
    try {  // set-up errors are the same on every rank
      fault = fault_from_environment();
      plan = exec::load_plan_file(f->plan);
      trainer = std::make_unique<exec::Trainer>(plan, *comm, *backend, opt);
    } catch (const Error& e) {
      if (root) fmt::print(stderr, "dlplan: error: {}\n", e.what());
      return 1;
    }
    exec::RunMeasurement run;
    try {
      if (root && f->progress == "text")
        fmt::print("training {} on {} rank{} ({}), {} steps, global batch {}\n", plan.model.name, comm->size(),
                   comm->size() == 1 ? "" : "s", to_string(plan.training.strategy), f->steps, trainer->samples_per_step());
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
        if (root) {
          const auto& st = run.steps.back();
          fmt::print("{}\n", f->progress == "json" ? exec::progress_json(st, f->steps, *trainer)
                                                   : exec::progress_text(st, f->steps, *trainer));
          std::fflush(stdout);
        }
      }
      const int measured = std::max(1, f->steps - 1);
      run.comm_busy_seconds = (comm->busy_seconds() - (f->steps > 1 ? busy_after_first : 0.0)) / measured;
      run.memory = exec::highest_peak_rank(*trainer, *comm);
      auto report = exec::run_report(plan, *trainer, run, comm->size(), f->seed);
      if (root) {
        if (f->progress == "text") fmt::print("{}", exec::memory_table(report));
        if (!f->report.empty()) {
          write_file_atomically(f->report, report.dump(1) + "\n");
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
