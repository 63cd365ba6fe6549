// `mpirun -np N dlplan calibrate --device cpu --out cluster.json [--model M]`:
// measures this machine through the executor and writes a cluster profile
// for `dlplan plan --cluster`.
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/exec/device.hpp"
#include "dlplan/exec/calibrate.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/op_costs.hpp"
#include "dlplan/request.hpp"

#include <fmt/format.h>

#include <memory>

namespace dlplan::cli {

Runner add_calibrate_command(CLI::App& app) {
  struct Flags {
    std::string device = "cpu", out, model, fusion;
    int64_t micro_batch = 1, seq_len = 0, decoder_seq_len = 0;
  };
  auto f = std::make_shared<Flags>();
  app.add_option("--device", f->device, "cpu (the CUDA backend's calibration runs with --device cuda once GPUs are built)")
      ->capture_default_str();
  app.add_option("--out", f->out, "Write the cluster profile here")->required();
  app.add_option("--model", f->model,
                 "Also time every op of this model (zoo name or file) in a few DDP steps, into the profile's op_costs, "
                 "and measure GEMMs at its shapes");
  app.add_option("--micro-batch", f->micro_batch, "The micro-batch the model's ops are timed at (other micro-batches scale)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seq-len", f->seq_len, "Tokens per sample of the model's ops, as `dlplan plan --seq-len` (default: its context)")
      ->check(CLI::PositiveNumber);
  app.add_option("--decoder-seq-len", f->decoder_seq_len,
                 "Encoder-decoder models (T5): the decoder's tokens per sample, as `dlplan plan --decoder-seq-len` "
                 "(default: --seq-len, else the model's)")
      ->check(CLI::PositiveNumber);
  app.add_option("--fusion", f->fusion,
                 "ONNX files and Hugging Face configs: engine (default) or eager, as `dlplan plan --fusion` imports them");
  return [f]() {
    auto comm = exec::make_communicator(nullptr, nullptr);
    const bool root = comm->rank() == 0;
    if (f->device != "cpu") {
      if (root) fmt::print(stderr, "dlplan: error: --device {}: calibration runs on cpu in this build\n", f->device);
      return 1;
    }
    std::unique_ptr<Model> model;
    try {
      if (!f->model.empty()) {
        ImportOptions import{f->micro_batch, f->seq_len};
        import.fusion = parse_fusion(f->fusion, f->model);
        model = std::make_unique<Model>(load_model(f->model, import));
        if (f->seq_len > 0) *model = with_seq_len(*model, f->seq_len);
        if (f->decoder_seq_len > 0) *model = with_decoder_seq_len(*model, f->decoder_seq_len);
      }
    } catch (const UsageError& e) {  // a flag's value, as plan's usage errors
      if (root) fmt::print(stderr, "dlplan: error: {}\n", e.what());
      return 2;
    } catch (const Error& e) {
      if (root) fmt::print(stderr, "dlplan: error: {}\n", e.what());
      return 1;
    }
    auto backend = exec::make_cpu_backend();
    exec::Calibration cal;
    try {  // collective: the model fits (or not) on every rank alike
      cal = exec::calibrate(*comm, *backend, model.get(), f->micro_batch);
    } catch (const Error& e) {
      if (root) fmt::print(stderr, "dlplan: error: {}\n", e.what());
      return 1;
    }
    if (!root) return 0;
    fmt::print("{:>6} {:>6} {:>6} {:>10} {:>12}\n", "m", "n", "k", "ms", "GFLOP/s");
    for (const auto& g : cal.gemms)
      fmt::print("{:>6} {:>6} {:>6} {:>10.3f} {:>12.1f}\n", g.m, g.n, g.k, g.seconds * 1e3, g.flops_per_s / 1e9);
    fmt::print("copy {:.1f} GB/s, op overhead {:.2f} us\n", cal.copy_bytes_per_s / 1e9, cal.op_overhead_s * 1e6);
    if (!cal.all_reduce.empty()) {
      fmt::print("{:>12} {:>14} {:>14} {:>14}   us over {} ranks (the profile's collective_costs; reduce-scatter and "
                 "all-gather at the bytes rounded up to a multiple of {})\n",
                 "bytes", "all-reduce", "reduce-scatter", "all-gather", comm->size(), 4 * comm->size());
      // The rung of a sharded collective at these bytes, or the next larger.
      auto at = [](const std::vector<exec::CollectiveSample>& l, double bytes) {
        for (const auto& x : l)
          if (x.bytes >= bytes) return x.seconds * 1e6;
        return 0.0;
      };
      for (const auto& s : cal.all_reduce)
        fmt::print("{:>12.0f} {:>14.1f} {:>14.1f} {:>14.1f}\n", s.bytes, s.seconds * 1e6, at(cal.reduce_scatter, s.bytes),
                   at(cal.all_gather, s.bytes));
      fmt::print("fit: latency {:.1f} us, bus bandwidth {:.2f} GB/s\n", cal.latency_s * 1e6, cal.bus_bytes_per_s / 1e9);
      fmt::print("contention: GEMMs of {:.3f} ms alone took {:.3f} ms beside a {:.3f} ms all-reduce, done after {:.3f} ms: "
                 "comm_slowdown {:.2f}, comm_stall {:.2f}\n",
                 cal.gemms_alone_s * 1e3, cal.gemms_beside_s * 1e3, cal.collective_s * 1e3, cal.collective_beside_s * 1e3,
                 cal.comm_slowdown, cal.comm_stall);
    }
    if (const auto& t = cal.cluster.op_costs; t && !model) {
      fmt::print("op curves ({}); optimizer {:.2f} GB/s; between ops {:.2f} us + {:.2f} us per MB the op moves\n",
                 t->source, t->optimizer_bytes_per_s / 1e9, t->gap_per_op_s * 1e6, t->gap_per_byte_s * 1e12);
      fmt::print("{:<22} {:<9} {:>5} {:>12} {:>10} {:>10} {:>6}\n", "kind", "phase", "ops", "overhead us", "GFLOP/s",
                 "GB/s", "worst");
      // The rates are the curve's asymptotes (1 / seconds per flop or byte).
      auto rate = [](double seconds_per) {
        return seconds_per > 0 ? fmt::format("{:.1f}", 1e-9 / seconds_per) : std::string("-");
      };
      for (const OpCostCurve& c : t->curves)
        fmt::print("{:<22} {:<9} {:>5} {:>12.2f} {:>10} {:>10} {:>5.0f}%\n", c.kind, to_string(c.phase), c.samples,
                   c.overhead_s * 1e6, rate(c.seconds_per_flop), rate(c.seconds_per_byte), c.worst_error * 100);
      fmt::print("{:<14} {:>5} {:>12} {:>12} {:>8}   each sweep model's step, simulated with the curves, gaps and "
                 "optimizer rate measured without it\n",
                 "model", "batch", "predicted ms", "measured ms", "error");
      for (const auto& c : cal.curve_checks)
        fmt::print("{:<14} {:>5} {:>12.3f} {:>12.3f} {:>7.1f}%\n", c.model, c.micro_batch, c.predicted_s * 1e3,
                   c.measured_s * 1e3, c.error() * 100);
      fmt::print("time uncertainty: +-{:.0f}% (the worst held-back model; plans made with this profile prefer the simpler "
                 "strategy unless another is faster by more)\n",
                 cal.cluster.device.time_uncertainty * 100);
    }
    if (const auto& t = cal.cluster.op_costs; t && model) {
      fmt::print("op costs: {} distinct ops of {} at micro-batch {}; optimizer {:.2f} GB/s; {:.1f} us between ops\n",
                 t->ops.size(), model->name, f->micro_batch, t->optimizer_bytes_per_s / 1e9, t->gap_per_op_s * 1e6);
      fmt::print("{:<9} {:>12} {:>12} {:>8} {:>6}   held-back steps the op table did not see\n", "strategy",
                 "predicted ms", "measured ms", "error", "steps");
      for (const auto& h : cal.held_back)
        fmt::print("{:<9} {:>12.2f} {:>12.2f} {:>7.1f}% {:>6}\n", to_string(h.strategy), h.predicted_s * 1e3,
                   h.measured_s * 1e3, h.error() * 100, h.steps);
      fmt::print("time uncertainty: +-{:.0f}% (the worst held-back error; plans made with this profile prefer the simpler "
                 "strategy unless another is faster by more)\n",
                 cal.cluster.device.time_uncertainty * 100);
      if (cal.cluster.device.time_uncertainty > exec::kCalibrationRetryAbove)
        fmt::print(stderr,
                   "dlplan: warning: the profile's held-back steps are {:.0f}% off its own op table even after {} "
                   "attempt(s): this machine's speed is moving (other jobs?); plans made with it say so in their "
                   "band. Calibrate again when it is quiet.\n",
                   cal.cluster.device.time_uncertainty * 100, cal.attempts);
    }
    write_file_atomically(f->out, cluster_to_json(cal.cluster).dump(1) + "\n");
    fmt::print("wrote {}\n", f->out);
    return 0;
  };
}

}  // namespace dlplan::cli
