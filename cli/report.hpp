// Printing a Planning: the strategy table, CSV, and the --explain listing.
#pragma once

#include "dlplan/planner.hpp"

namespace dlplan::cli {

void print_table(const Planning& p);
void print_csv(const Planning& p);
void print_explain(const Planning& p);

}  // namespace dlplan::cli
