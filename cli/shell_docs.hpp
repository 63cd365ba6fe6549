// Documents generated from the CLI's own definition (the same CLI11 app that
// parses the flags and prints --help), so they never drift from it:
// bash and zsh completion scripts and the man page dlplan.1. `cmake --install`
// installs what the build generated with them.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace dlplan::cli {

std::string bash_completion(const CLI::App& app);
std::string zsh_completion(const CLI::App& app);
std::string man_page(const CLI::App& app);

}  // namespace dlplan::cli
