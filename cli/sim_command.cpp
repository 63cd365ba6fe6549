// `dlplan sim --plan plan.json [--timeline trace.json] [--width N] [--allow-edited-plan]`: the
// simulated step of a plan as a text Gantt chart of the compute and
// communication streams, and the memory curve.
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/output_file.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/simulator.hpp"

#include <fmt/format.h>

#include <memory>
#include <sstream>

namespace dlplan::cli {

Runner add_sim_command(CLI::App& app) {
  struct Flags {
    std::string plan, timeline;
    int width = 100;
    bool allow_edited = false;
  };
  auto f = std::make_shared<Flags>();
  app.add_option("--plan", f->plan, "A plan written by dlplan plan --out")->required();
  app.add_option("--timeline", f->timeline, "Also write a Chrome trace (open in Perfetto or chrome://tracing)");
  app.add_option("--width", f->width, "Columns of the chart")->capture_default_str()->check(CLI::Range(20, 1000));
  app.add_flag("--allow-edited-plan", f->allow_edited, "Simulate a plan edited after planning");
  return [f]() {
    const PlanDocument p = read_plan_file(f->plan, PlanReadOptions{.allow_edited = f->allow_edited});
    if (p.edited) fmt::print(stderr, "dlplan: warning: {}: edited after planning (--allow-edited-plan)\n", f->plan);
    const Simulation s = simulate_step(p.model, p.cluster, p.training);
    fmt::print("{} {} on {} x {}, micro-batch {} x grad-accum {}\n", p.model.name, to_string(p.training.strategy),
               p.cluster.world(), p.cluster.device.kind, p.training.micro_batch, p.training.grad_accum);
    fmt::print("{}", text_gantt(s, f->width));
    fmt::print("MFU {:.1f}%, {:.3f} GB sent per rank per step\n", s.mfu * 100, s.comm_bytes / 1e9);
    if (!f->timeline.empty()) {
      std::ostringstream trace;
      write_chrome_trace(s, p.model.name + " " + to_string(p.training.strategy), trace);
      write_output_file(f->timeline, trace.str());
      fmt::print("wrote {}\n", f->timeline);
    }
    return 0;
  };
}

}  // namespace dlplan::cli
