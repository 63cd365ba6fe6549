// The dlplan subcommands. Each registers its flags on a CLI11 app and returns
// the function that runs it (after parsing). Errors are dlplan::Error.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace dlplan::cli {

using Runner = std::function<int()>;

Runner add_plan_command(CLI::App& app);
Runner add_model_command(CLI::App& app);
Runner add_train_command(CLI::App& app);
Runner add_sim_command(CLI::App& app);
Runner add_calibrate_command(CLI::App& app);
Runner add_export_command(CLI::App& app);
Runner add_list_commands(CLI::App& models, CLI::App& gpus);

// Writes `text` to `path` through a temporary file and a rename, so a failure
// never leaves a half-written file or destroys the previous one.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace dlplan::cli
