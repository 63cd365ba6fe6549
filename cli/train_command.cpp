// `dlplan train`: run a plan for real.
//   mpirun -np N dlplan train --plan plan.json [--steps K] [--seed S]
//          [--data synthetic|FILE] [--report run.json] [--progress text|json]
// Errors every rank sees alike (a bad plan, the wrong number of ranks) print
// once, from rank 0, and every rank exits; a failure on one rank during
// training ends the whole job, naming that rank.
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/plan_file.hpp"
#include "dlplan/exec/report.hpp"
#include "dlplan/exec/trainer.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <memory>

namespace dlplan::cli {
namespace {

struct TrainFlags {
  std::string plan, data = "synthetic", report, progress = "text";
  int steps = 10;
  uint64_t seed = 1;
};

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
    try {  // set-up errors are the same on every rank
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
