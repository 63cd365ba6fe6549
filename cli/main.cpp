// dlplan: plan a distributed training run.
//   dlplan --model models/vit-b16.json --gpus 8     (same as `dlplan plan ...`)
//   dlplan models | dlplan gpus | dlplan model gpt --layers 24 ...
//   mpirun -np 4 dlplan train --plan plan.json
//   dlplan help [COMMAND] | dlplan completion bash|zsh | dlplan man
//
// Conventions (DESIGN.md): stdout holds only what was asked for; messages go
// to stderr and start with "dlplan:". Exit codes: 0 success, 1 a user's error
// (a bad file, a plan that does not fit where that is an error, a rank
// failed), 2 a usage error (unknown flag, bad value), 3 an internal error.
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/exec/blas_core.hpp"
#include "dlplan/planner.hpp"
#include "shell_docs.hpp"

#include <fmt/format.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr int kUsageError = 2;

bool is_help_or_version(const std::string& a) {
  return a == "--help" || a == "-h" || a == "--help-all" || a == "--version";
}

// The subcommand the arguments name, for "see 'dlplan plan --help'".
std::string command_named(const CLI::App& app, const std::vector<std::string>& args) {
  for (const auto& a : args)
    for (const CLI::App* sub : app.get_subcommands({}))
      if (sub->get_name() == a) return "dlplan " + a;
  return "dlplan";
}

}  // namespace

int main(int argc, char** argv) {
  // The commands that run the CPU engine's GEMMs first make sure OpenBLAS
  // runs the kernels this CPU has (blas_core.hpp); this may restart dlplan.
  if (argc > 1 && (std::strcmp(argv[1], "train") == 0 || std::strcmp(argv[1], "calibrate") == 0))
    dlplan::exec::restart_with_better_blas_core(argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  // `dlplan --model ...` is `dlplan plan --model ...`.
  if (!args.empty() && args[0].rfind('-', 0) == 0 && !is_help_or_version(args[0])) args.insert(args.begin(), "plan");

  CLI::App app{"dlplan: plan (and run) distributed training: DDP or ZeRO-1/2/3, memory, communication, SyncBN"};
  app.name("dlplan");
  app.require_subcommand(1);
  app.set_version_flag("--version", "dlplan " DLPLAN_VERSION);
  app.footer("`dlplan --model M ...` is `dlplan plan --model M ...`; `dlplan help COMMAND` (or COMMAND --help) lists a "
             "command's options.\nExit codes: 0 success, 1 a user's error (bad file, does not fit), 2 a usage error "
             "(unknown flag, bad value), 3 an internal error.");
  auto* plan = app.add_subcommand("plan", "Plan a model on a cluster: every strategy side by side, and a recommendation");
  auto* model = app.add_subcommand("model", "Write a model's IR JSON: a zoo model, or a family at your own size");
  auto* models = app.add_subcommand("models", "List the model zoo");
  auto* gpus = app.add_subcommand("gpus", "List the GPU catalog");
  auto* calibrate = app.add_subcommand("calibrate", "Measure this machine (GEMM, memory, collectives) into a cluster profile");
  auto* sim = app.add_subcommand("sim", "Simulate a plan's step: a Gantt chart of compute and communication, the memory curve");
  auto* exporter = app.add_subcommand("export", "Write a plan as a DeepSpeed config or a PyTorch FSDP/DDP setup file");
  auto* train = app.add_subcommand("train", "Run a plan for real (under mpirun for several ranks) and report measured vs predicted");
  auto* help = app.add_subcommand("help", "Print the help of dlplan or of one command");
  std::string help_topic;
  help->add_option("command", help_topic, "A command (plan, train, ...)");
  auto* completion = app.add_subcommand("completion", "Print a shell completion script: bash or zsh");
  std::string shell;
  completion->add_option("shell", shell, "bash or zsh")->required()->check(CLI::IsMember({"bash", "zsh"}));
  auto* man = app.add_subcommand("man", "Print the man page dlplan.1 (roff; `dlplan man | man -l -`)");

  dlplan::cli::Runner run_plan = dlplan::cli::add_plan_command(*plan);
  dlplan::cli::Runner run_model = dlplan::cli::add_model_command(*model);
  dlplan::cli::Runner run_lists = dlplan::cli::add_list_commands(*models, *gpus);
  dlplan::cli::Runner run_train = dlplan::cli::add_train_command(*train);
  dlplan::cli::Runner run_sim = dlplan::cli::add_sim_command(*sim);
  dlplan::cli::Runner run_calibrate = dlplan::cli::add_calibrate_command(*calibrate);
  dlplan::cli::Runner run_export = dlplan::cli::add_export_command(*exporter);

  if (args.empty()) {  // bare `dlplan`: what it can do
    fmt::print("{}", app.help());
    return 0;
  }
  if (args[0].rfind('-', 0) != 0 && command_named(app, {args[0]}) == "dlplan") {
    fmt::print(stderr, "dlplan: error: no command '{}' (see 'dlplan help')\n", args[0]);
    return kUsageError;
  }
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());
    app.parse(reversed);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    const std::string where = command_named(app, args);
    fmt::print(stderr, "dlplan: error: {} (see '{} --help')\n", e.what(), where);
    return kUsageError;
  }
  try {
    if (help->parsed()) {
      if (help_topic.empty()) {
        fmt::print("{}", app.help());
        return 0;
      }
      for (const CLI::App* sub : app.get_subcommands({}))
        if (sub->get_name() == help_topic) {
          fmt::print("{}", sub->help("dlplan"));
          return 0;
        }
      throw dlplan::UsageError(fmt::format("help: no command '{}' (see 'dlplan help')", help_topic));
    }
    if (completion->parsed()) {
      fmt::print("{}", shell == "bash" ? dlplan::cli::bash_completion(app) : dlplan::cli::zsh_completion(app));
      return 0;
    }
    if (man->parsed()) {
      fmt::print("{}", dlplan::cli::man_page(app));
      return 0;
    }
    if (plan->parsed()) return run_plan();
    if (model->parsed()) return run_model();
    if (train->parsed()) return run_train();
    if (sim->parsed()) return run_sim();
    if (exporter->parsed()) return run_export();
    if (calibrate->parsed()) return run_calibrate();
    return run_lists();
  } catch (const dlplan::UsageError& e) {
    fmt::print(stderr, "dlplan: error: {}\n", e.what());
    return kUsageError;
  } catch (const dlplan::Error& e) {
    fmt::print(stderr, "dlplan: error: {}\n", e.what());
    return 1;
  } catch (const std::invalid_argument& e) {
    fmt::print(stderr, "dlplan: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dlplan: internal error (a bug: please report it): {}\n", e.what());
    return 3;
  }
}
