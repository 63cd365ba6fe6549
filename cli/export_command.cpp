// `dlplan export --plan plan.json --to deepspeed|fsdp [--out FILE] [--steps N] [--allow-edited-plan]`:
// the plan as a DeepSpeed config JSON or as a PyTorch (>= 2.1) FSDP/DDP setup
// file (docs/export.md). stdout without --out; with it, the file is written
// atomically and "wrote FILE" goes to stderr, as `plan --out` does.
// `dlplan export --checkpoint D --to safetensors --out model.safetensors`: the
// latest checkpoint in D consolidated (every parameter at its PyTorch shape,
// fp32, named as in the IR; BN running statistics too), checksums verified
// (docs/checkpoints.md).
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/exec/checkpoint.hpp"
#include "dlplan/export.hpp"
#include "dlplan/output_file.hpp"
#include "dlplan/plan_io.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>

namespace dlplan::cli {

Runner add_export_command(CLI::App& app) {
  struct Flags {
    std::string plan, checkpoint, to, out;
    int64_t steps = 1000;
    bool allow_edited = false;
  };
  auto f = std::make_shared<Flags>();
  auto* plan = app.add_option("--plan", f->plan, "A plan written by dlplan plan --out (--to deepspeed or fsdp)");
  auto* checkpoint = app.add_option("--checkpoint", f->checkpoint,
                                    "A checkpoint folder written by dlplan train --checkpoint-dir (--to safetensors)");
  plan->excludes(checkpoint);
  app.add_option("--to", f->to,
                 "deepspeed: a DeepSpeed config JSON; fsdp: a PyTorch >= 2.1 setup file (FSDP or DDP); safetensors: "
                 "the checkpoint's weights, consolidated")
      ->required()
      ->check(CLI::IsMember({"deepspeed", "fsdp", "safetensors"}));
  app.add_option("--out", f->out, "Write to this file (default: stdout)");
  auto* steps = app.add_option("--steps", f->steps, "The run's optimizer steps: the LR schedule's total")
                    ->capture_default_str()
                    ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  app.add_flag("--allow-edited-plan", f->allow_edited, "Export a plan edited after planning");
  return [f, steps, plan, checkpoint]() {
    const bool weights = f->to == "safetensors";
    if (weights != (checkpoint->count() > 0) || (!weights && plan->count() == 0))
      throw UsageError(weights ? "--to safetensors exports a checkpoint: give --checkpoint D (not --plan)"
                               : fmt::format("--to {} exports a plan: give --plan FILE", f->to));
    if (weights) {
      if (f->out.empty()) throw UsageError("--to safetensors writes a binary file: give --out FILE");
      int step = 0;
      const auto tensors = exec::read_checkpoint_tensors(f->checkpoint, &step);
      exec::write_safetensors(f->out, tensors, {{"format", "pt"}, {"step", std::to_string(step)}, {"writer", "dlplan"}});
      fmt::print(stderr, "wrote {} ({} tensors from {} at step {})\n", f->out, tensors.size(), f->checkpoint, step);
      return 0;
    }
    const PlanDocument p = read_plan_file(f->plan, PlanReadOptions{.allow_edited = f->allow_edited});
    if (p.edited) fmt::print(stderr, "dlplan: warning: {}: edited after planning (--allow-edited-plan)\n", f->plan);
    ExportOptions opt;
    opt.steps = f->steps;
    opt.steps_given = steps->count() > 0;
    opt.plan_path = f->plan;
    if (!f->out.empty()) opt.script_name = f->out.substr(f->out.find_last_of('/') + 1);
    const std::string text =
        f->to == "deepspeed" ? deepspeed_config(p, opt).dump(2) + "\n" : fsdp_script(p, opt);
    if (f->out.empty()) {
      fmt::print("{}", text);
      return 0;
    }
    write_output_file(f->out, text);
    fmt::print(stderr, "wrote {}\n", f->out);
    if (f->to == "fsdp") fmt::print(stderr, "start it with: {}\n", torchrun_command(p, f->out));
    return 0;
  };
}

}  // namespace dlplan::cli
