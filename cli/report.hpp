// Printing a Planning: the strategy table (with the recommendation) and CSV.
// --explain's text and JSON come from the planner (dlplan/explain.hpp).
#pragma once

#include "dlplan/planner.hpp"

namespace dlplan::cli {

void print_table(const Planning& p);
void print_csv(const Planning& p);

}  // namespace dlplan::cli
