// dump_step: one training step of the CPU executor, written out for a
// framework to replay (tests/tools/torch_parity.py compares it with PyTorch).
//
//   dump_step MODEL OUTDIR [--micro-batch B] [--lr LR] [--seed S] [--attention math|flash]
//             [--seq-len T] [--init FILE] [--capacity-factor F] [--fusion engine|eager]
//
// MODEL is a zoo name, an IR file or an ONNX file (--seq-len: its symbolic
// sequence axis). --init starts from a file's weights as `dlplan train
// --init` does (safetensors, or an ONNX file exported with its weights). The plan: one rank, cpu, fp32, ddp,
// SyncBN off, plain SGD with no weight decay, no clipping and no warm-up, so
// after one step params_after = params_before - lr * grad exactly (up to the
// fp32 rounding of the update). OUTDIR receives:
//   params_before.f32, params_after.f32  every parameter, Model::params order,
//                                        float32 little-endian (the host's order)
//   input.<name>.bin                     the batch of each model input (int32 or
//                                        float32), [B, ...shape], as the trainer's
//                                        data source fills step 0
//   inputs.json                          the inputs: name, dtype, shape (batch
//                                        first), file, in Model::inputs order
//   params.json                          parameter names and sizes, in order
//   buffers_after.f32                    BatchNorm running statistics after the
//                                        step (Model::buffers order), if any
//   loss.txt                             the step's loss (%.9g)
//   model.json                           the IR as planned (defaults explicit)
//   step.json                            loss, grad norm, parameter count and the
//                                        planner's model FLOPs per sample
#include "dlplan/error.hpp"
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/checkpoint.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/data.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "dump_step: " << why << "\n"
            << "usage: dump_step MODEL OUTDIR [--micro-batch B] [--lr LR] [--seed S] [--attention math|flash] "
               "[--seq-len T] [--init FILE] [--capacity-factor F] [--fusion engine|eager]\n";
  std::exit(2);
}

void write_bytes(const std::filesystem::path& p, const void* data, size_t bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!f) throw Error("cannot write " + p.string());
}

void write_text(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p);
  f << s;
  if (!f) throw Error("cannot write " + p.string());
}

// Trainer::full_parameters() concatenates the units' flat buffers (the root
// unit first, then each unit; within a unit, Model::params order:
// ParamStore's layout). Reordered here into Model::params order.
std::vector<float> in_model_order(const Model& m, const std::vector<float>& by_unit) {
  std::vector<int64_t> unit_size(m.units.size(), 0), offset(m.params.size(), 0);
  for (size_t k = 0; k < m.params.size(); ++k) {
    offset[k] = unit_size[static_cast<size_t>(m.params[k].unit)];
    unit_size[static_cast<size_t>(m.params[k].unit)] += m.params[k].numel;
  }
  std::vector<int64_t> unit_start(m.units.size(), 0);
  for (size_t u = 1; u < m.units.size(); ++u) unit_start[u] = unit_start[u - 1] + unit_size[u - 1];
  const int64_t total = m.units.empty() ? 0 : unit_start.back() + unit_size.back();
  if (total != static_cast<int64_t>(by_unit.size()))
    throw Error("full_parameters() returned " + std::to_string(by_unit.size()) + " floats, the units hold " +
                std::to_string(total));
  std::vector<float> out;
  out.reserve(by_unit.size());
  for (size_t k = 0; k < m.params.size(); ++k) {
    const auto begin = by_unit.begin() + unit_start[static_cast<size_t>(m.params[k].unit)] + offset[k];
    out.insert(out.end(), begin, begin + m.params[k].numel);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> pos;
  int64_t micro_batch = 4;
  double lr = 1000.0;  // large: the update dominates the parameter, so (before - after) / lr keeps ~7 digits
  uint64_t seed = 1;
  std::string attention = "math", init;
  int64_t seq_len = 0;
  double capacity_factor = 0;  // 0: the model's
  FusionMode fusion = FusionMode::engine;  // ONNX files (ImportOptions::fusion)
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--micro-batch") micro_batch = std::stoll(value());
    else if (a == "--lr") lr = std::stod(value());
    else if (a == "--seed") seed = std::stoull(value());
    else if (a == "--attention") attention = value();
    else if (a == "--seq-len") seq_len = std::stoll(value());
    else if (a == "--init") init = value();
    else if (a == "--capacity-factor") capacity_factor = std::stod(value());
    else if (a == "--fusion") {
      const auto f = fusion_from_string(value());
      if (!f) usage("--fusion must be engine or eager");
      fusion = *f;
    }
    else if (a.rfind("--", 0) == 0) usage("unknown option " + a);
    else pos.push_back(a);
  }
  if (pos.size() != 2) usage("needs MODEL and OUTDIR");
  if (micro_batch <= 0 || !(lr > 0)) usage("--micro-batch and --lr must be positive");

  try {
    const std::filesystem::path out = pos[1];
    std::filesystem::create_directories(out);

    PlanRequest req;
    ImportOptions import;
    import.seq_len = seq_len;
    import.fusion = fusion;
    req.model = load_model(pos[0], import);
    if (capacity_factor > 0) req.model = with_capacity_factor(req.model, capacity_factor);
    req.cluster.device = find_device("cpu");
    req.cluster.gpus_per_node = 1;
    req.training.precision = Precision::fp32;
    req.training.micro_batch = micro_batch;
    req.training.grad_accum = 1;
    req.training.attention = parse_attention(attention);
    req.training.checkpointing = Checkpointing::none;
    auto& o = req.training.optimizer;
    o.kind = OptimizerKind::sgd;
    o.lr = lr;
    o.weight_decay = 0.0;
    o.clip_norm = 0.0;  // the default (1.0) would rescale the gradient
    o.warmup_steps = 0;
    o.min_lr = 0.0;     // step 0 of the cosine schedule is lr exactly
    req.forced = Strategy::ddp;
    req.syncbn = SyncBnMode::off;
    Planning p = plan(req);
    PlanDocument lp = plan_from_json(nlohmann::json(plan_json(p, *p.chosen())), pos[0] + ".plan");
    const Model& m = lp.model;

    auto comm = make_single_communicator();
    auto backend = make_cpu_backend();
    TrainOptions opt;
    opt.steps = 1;
    opt.seed = seed;
    opt.data = "synthetic";
    Trainer t(lp, *comm, *backend, opt);
    if (!init.empty()) set_parameters(t, read_init_tensors(init, m), init);

    const std::vector<float> before = in_model_order(m, t.full_parameters());
    const StepStats st = t.step();
    const std::vector<float> after = in_model_order(m, t.full_parameters());
    write_bytes(out / "params_before.f32", before.data(), before.size() * sizeof(float));
    write_bytes(out / "params_after.f32", after.data(), after.size() * sizeof(float));
    const std::vector<float> buffers = t.buffers();  // BN running statistics after the step
    if (!buffers.empty()) write_bytes(out / "buffers_after.f32", buffers.data(), buffers.size() * sizeof(float));

    // The batch of step 0 on rank 0: samples 0 .. B-1 of the same data source
    // (keyed by global sample index, so this is what the trainer filled).
    auto data = make_data_source(opt.data, m, seed);
    Allocator alloc;
    nlohmann::ordered_json inputs = nlohmann::ordered_json::array();
    for (size_t k = 0; k < m.inputs.size(); ++k) {
      const TensorInfo& ti = m.tensor(m.inputs[k]);
      Shape shape = {micro_batch};
      shape.insert(shape.end(), ti.shape.begin(), ti.shape.end());
      Tensor batch = alloc.empty(shape, ti.dtype, Category::workspace, "batch: " + ti.name);
      data->fill(static_cast<int>(k), batch, 0, micro_batch);
      const std::string file = "input." + ti.name + ".bin";
      write_bytes(out / file, batch.data(), static_cast<size_t>(batch.bytes()));
      inputs.push_back({{"name", ti.name}, {"dtype", to_string(ti.dtype)}, {"shape", shape}, {"file", file}});
    }
    write_text(out / "inputs.json", inputs.dump(1) + "\n");

    nlohmann::ordered_json params = nlohmann::ordered_json::array();
    for (const auto& pi : m.params) params.push_back({{"name", pi.name}, {"numel", pi.numel}});
    write_text(out / "params.json", params.dump(1) + "\n");
    write_text(out / "model.json", m.ir.dump(1) + "\n");

    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g\n", st.loss);
    write_text(out / "loss.txt", buf);
    // The planner's model FLOPs (forward + backward, per device and step) per sample.
    const double flops_per_sample = p.chosen()->model_flops / static_cast<double>(micro_batch);
    nlohmann::ordered_json info = {{"model", m.name},
                                   {"micro_batch", micro_batch},
                                   {"lr", lr},
                                   {"seed", seed},
                                   {"attention", attention},
                                   {"loss", st.loss},
                                   {"grad_norm", st.grad_norm},
                                   {"params", m.parameter_count()},
                                   {"model_flops_per_sample", flops_per_sample}};
    write_text(out / "step.json", info.dump(1) + "\n");
    std::printf("%s: loss %.6f, %lld parameters, written to %s\n", m.name.c_str(), st.loss,
                static_cast<long long>(before.size()), out.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "dump_step: " << e.what() << "\n";
    return 1;
  }
}
