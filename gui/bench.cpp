// dlplan-gui-bench: the GUI's recompute latency after an input change (the
// micro-batch alternates 1 <-> 2, so nothing is cached but the model): the
// planner (every strategy) + the shown strategy's tensors at the peak and its
// simulation + the adapters filling the table models. Then the GPU-count sweep, separately.
// For llama2-7b and a Llama-2-70B-sized graph. Goal: < 50 ms.
#include "engine.hpp"
#include "table_models.hpp"

#include "dlplan/loader.hpp"
#include "dlplan/zoo.hpp"

#include <QCoreApplication>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

using namespace dlplan;
using namespace dlplan::gui;
using Clock = std::chrono::steady_clock;

namespace {

double ms(Clock::time_point a) { return std::chrono::duration<double, std::milli>(Clock::now() - a).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run(const char* label, const Inputs& base, int reps) {
  Engine engine;
  StrategyTableModel table;
  TimelineModel timeline;
  PeakTensorModel tensors;
  SweepModel sweepModel;
  auto t = Clock::now();
  engine.model(base);
  const double load = ms(t);
  std::vector<double> total, planning, simulating, sweep;
  for (int i = 0; i < reps; ++i) {
    Inputs in = base;
    in.micro_batch = 1 + (i % 2);
    t = Clock::now();
    auto r = std::make_shared<const Results>(engine.compute(in));
    table.setResults(r);
    timeline.setSimulation(r);
    tensors.setResults(r);
    total.push_back(ms(t));
    planning.push_back(r->plan_ms);
    simulating.push_back(r->simulate_ms);
    if (i < 3) {
      t = Clock::now();
      sweepModel.setSweep(std::make_shared<const Sweep>(engine.sweep(in)));
      sweep.push_back(ms(t));
    }
  }
  std::printf("%-34s %9.1f %10.1f %8.1f %11.1f %9.1f\n", label, load, median(total), median(planning),
              median(simulating), median(sweep));
}

}  // namespace

int main(int argc, char** argv) {
  QCoreApplication app(argc, argv);
  const int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  std::printf("dlplan-gui recompute latency, median of %d input changes (ms)\n", reps);
  std::printf("%-34s %9s %10s %8s %11s %9s\n", "model / cluster", "load", "recompute", "plan", "simulation", "sweep");

  Inputs a;
  a.model = "llama2-7b";
  a.nodes = 1;
  a.gpus_per_node = 8;
  run("llama2-7b, 8 x h100-80g", a, reps);

  Inputs b;
  b.model = "llama2-70b";  // the zoo's 70B-sized graph
  b.nodes = 16;
  b.gpus_per_node = 8;
  b.checkpointing = "units";
  run("llama2-70b-sized, 128 x h100-80g", b, reps);
  std::printf("recompute = plan (4 strategies) + the shown strategy's peak tensors and simulation + table/timeline/tensor models; "
              "sweep = 11 GPU counts x 4 strategies, reported apart\n");
  return 0;
}
