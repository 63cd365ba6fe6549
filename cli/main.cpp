// dlplan: plan a distributed training run.
//   dlplan --model models/vit-b16.json --gpus 8     (same as `dlplan plan ...`)
//   dlplan models | dlplan gpus | dlplan model gpt --layers 24 ...
//   mpirun -np 4 dlplan train --plan plan.json
#include "commands.hpp"
#include "dlplan/error.hpp"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  // `dlplan --model ...` is `dlplan plan --model ...`.
  std::vector<std::string> args(argv + 1, argv + argc);
  const bool bare = args.empty() || (args[0].rfind("--", 0) == 0 && args[0] != "--help" && args[0] != "--version");
  if (bare) args.insert(args.begin(), "plan");

  CLI::App app{"dlplan: plan (and run) distributed training: DDP or ZeRO-1/2/3, memory, communication, SyncBN"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dlplan 0.1.0");
  auto* plan = app.add_subcommand("plan", "Plan a model on a cluster: every strategy side by side, and a recommendation");
  auto* model = app.add_subcommand("model", "Write a model's IR JSON: a zoo model, or a family at your own size");
  auto* models = app.add_subcommand("models", "List the model zoo");
  auto* gpus = app.add_subcommand("gpus", "List the GPU catalog");
  auto* calibrate = app.add_subcommand("calibrate", "Measure this machine (GEMM, memory, collectives) into a cluster profile");
  auto* sim = app.add_subcommand("sim", "Simulate a plan's step: a Gantt chart of compute and communication, the memory curve");
  auto* train = app.add_subcommand("train", "Run a plan for real (under mpirun for several ranks) and report measured vs predicted");

  dlplan::cli::Runner run_plan = dlplan::cli::add_plan_command(*plan);
  dlplan::cli::Runner run_model = dlplan::cli::add_model_command(*model);
  dlplan::cli::Runner run_lists = dlplan::cli::add_list_commands(*models, *gpus);
  dlplan::cli::Runner run_train = dlplan::cli::add_train_command(*train);
  dlplan::cli::Runner run_sim = dlplan::cli::add_sim_command(*sim);
  dlplan::cli::Runner run_calibrate = dlplan::cli::add_calibrate_command(*calibrate);

  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (plan->parsed()) return run_plan();
    if (model->parsed()) return run_model();
    if (train->parsed()) return run_train();
    if (sim->parsed()) return run_sim();
    if (calibrate->parsed()) return run_calibrate();
    return run_lists();
  } catch (const dlplan::Error& e) {
    fmt::print(stderr, "dlplan: error: {}\n", e.what());
    return 1;
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "dlplan: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dlplan: internal error: {}\n", e.what());
    return 3;
  }
}
