// `dlplan train`: run a plan for real.
//   mpirun -np N dlplan train --plan plan.json [--steps K] [--seed S]
//          [--data synthetic|FILE] [--report run.json] [--progress text|json] [--log-every N]
//          [--device cpu|cuda [--comm nccl|mpi]] [--allow-edited-plan]
//          [--checkpoint-dir D [--save-every K] [--resume]] [--init W.safetensors|M.onnx]
//          [--comm-timeout SECONDS]
// Checkpoints (executor checkpoint.hpp, docs/checkpoints.md): saved every
// --save-every steps and at the end; --resume continues from the latest one
// (any world size and strategy) up to --steps, the run's total.
// SIGINT / SIGTERM (Ctrl-C, or what mpirun and Slurm send before stopping a
// job): every rank finishes its step, the ranks agree to stop, save a
// checkpoint when --checkpoint-dir is given, write the report marked
// "partial" beside --report, say so, and exit 130 / 143. A second signal
// stops at once.
// --device cuda runs a plan made for a GPU (fp32 only for now) on this node's
// GPUs: rank r uses device (node-local rank) mod (visible devices), with the
// CUDA backend, the caching device allocator, and NCCL (--comm nccl, one GPU
// per rank) or MPI through pinned host buffers (--comm mpi, GPUs may be shared).
// Errors every rank sees alike (a bad plan, the wrong number of ranks) print
// once, from rank 0, and every rank exits; a failure on one rank during
// training ends the whole job, naming that rank.
//
// Test-only fault injection: DLPLAN_FAULT="RANK:STEP:kill|error|stop|kill-in-save|full-disk"
// makes rank RANK, at the start of step STEP (1-based), either raise SIGKILL
// on itself (a rank dying without a word), throw "injected failure at step
// STEP" (a rank failing; the job ends through Communicator::abort, naming the
// rank), raise SIGSTOP (a stuck rank: the others time out naming it), or, at
// the checkpoint saved after step STEP, raise SIGKILL half-way through writing
// its shard (kill-in-save) or fail that write with ENOSPC (full-disk).
// The tests of rank failure use it (tests/executor/train_cli_test.cpp); it is
// not meant for users. An unset or empty variable injects nothing; a malformed
// one is a set-up error.
#include "commands.hpp"
#include "dlplan/error.hpp"
#include "dlplan/exec/blas_core.hpp"
#include "dlplan/exec/checkpoint.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/device.hpp"
#include "dlplan/exec/report.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/format.hpp"
#include "dlplan/limits.hpp"
#include "dlplan/output_file.hpp"
#include "dlplan/plan_io.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <unistd.h>

namespace dlplan::cli {
namespace {

struct TrainFlags {
  std::string plan, data = "synthetic", report, progress = "text";
  std::string device = "cpu", comm = "nccl";
  std::string checkpoint_dir, init;
  bool comm_given = false;
  bool allow_edited = false;
  bool resume = false;
  int steps = 10;
  int save_every = 0;  // 0: at the end only
  int log_every = 1;
  double comm_timeout = exec::kDefaultCommTimeoutSeconds;
  uint64_t seed = 1;
};

// ---- signals ----------------------------------------------------------------------
// The first SIGINT / SIGTERM is noted and acted on between steps; a second
// one ends the process at once (async-signal-safe: write and _exit).
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_stop_signal(int sig) {
  if (g_signal != 0) {
    const char msg[] = "dlplan: second signal: stopping now, without saving\n";
    ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    ::_exit(128 + sig);
  }
  g_signal = sig;
}

// Progress output is best effort: once a stop is pending it is skipped, and
// a write that fails (interrupted, a closed pipe) is dropped.
void print_progress(const std::string& line) {
  if (g_signal != 0) return;
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);
  std::clearerr(stdout);
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  // No SA_RESTART: a write blocked on a full stdout pipe (mpiexec stops
  // reading its ranks' output once it is signalled) returns, so the rank
  // reaches the end of its step instead of waiting there until killed.
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // A write past RLIMIT_FSIZE fails with EFBIG (a message) instead of killing.
  std::signal(SIGXFSZ, SIG_IGN);
}

// The signal every rank agrees on after a step (0: none): the largest number
// any rank received, so that all stop at the same step.
int agreed_signal(exec::Communicator& comm) {
  int mine = static_cast<int>(g_signal);
  if (comm.size() == 1) return mine;
  std::vector<int> all(static_cast<size_t>(comm.size()));
  comm.host().all_gather_bytes(&mine, all.data(), sizeof mine);
  return *std::max_element(all.begin(), all.end());
}

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

// The partial report goes beside the complete one: run.json -> run.partial.json.
std::string partial_path(const std::string& report) {
  std::filesystem::path p(report);
  const std::string ext = p.extension().string();
  p.replace_extension();
  return p.string() + ".partial" + (ext.empty() ? ".json" : ext);
}

// DLPLAN_FAULT (test-only, see the top of this file).
struct Fault {
  enum class Kind { kill, error, stop, kill_in_save, full_disk };
  int rank = 0;
  int step = 0;  // 1-based
  Kind kind = Kind::error;
};

std::optional<Fault> fault_from_environment() {
  const char* raw = std::getenv("DLPLAN_FAULT");
  if (raw == nullptr || *raw == '\0') return std::nullopt;
  const std::string v = raw;
  auto bad = [&v]() {
    return Error(fmt::format("DLPLAN_FAULT='{}' is not RANK:STEP:kill|error|stop|kill-in-save|full-disk (a test-only fault injection, "
                             "e.g. 1:2:kill)", v));
  };
  const size_t a = v.find(':'), b = a == std::string::npos ? a : v.find(':', a + 1);
  if (b == std::string::npos) throw bad();
  auto number = [&](const std::string& t) {
    if (t.empty() || t.size() > 9 || t.find_first_not_of("0123456789") != std::string::npos) throw bad();
    return std::stoi(t);
  };
  Fault f;
  f.rank = number(v.substr(0, a));
  f.step = number(v.substr(a + 1, b - a - 1));
  const std::string what = v.substr(b + 1);
  if (f.step < 1) throw bad();
  if (what == "kill") f.kind = Fault::Kind::kill;
  else if (what == "error") f.kind = Fault::Kind::error;
  else if (what == "stop") f.kind = Fault::Kind::stop;
  else if (what == "kill-in-save") f.kind = Fault::Kind::kill_in_save;
  else if (what == "full-disk") f.kind = Fault::Kind::full_disk;
  else throw bad();
  return f;
}

}  // namespace

Runner add_train_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  app.add_option("--plan", f->plan, "A plan written by dlplan plan --out")->required();
  app.add_option("--steps", f->steps, "Optimizer steps to run")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--log-every", f->log_every, "Print progress every N steps (and the first and the last)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", f->seed, "Seed for initialisation, data and dropout")->capture_default_str();
  app.add_option("--data", f->data, "synthetic, or a token file (.u16/.bin/.i32) or a DLPI image file")->capture_default_str();
  app.add_option("--report", f->report, "Write the run report (JSON) here");
  app.add_option("--progress", f->progress, "text or json (one JSON line per step)")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "json"}));
  app.add_option("--device", f->device, "cpu, or cuda (a plan for a GPU, on this node's GPUs)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  auto* comm_option = app.add_option("--comm", f->comm, "With --device cuda: nccl, or mpi (through host memory)")
                          ->capture_default_str()
                          ->check(CLI::IsMember({"nccl", "mpi"}));
  app.add_flag("--allow-edited-plan", f->allow_edited,
               "Run a plan edited after planning (its prediction may no longer hold; the report says so)");
  auto* dir_option =
      app.add_option("--checkpoint-dir", f->checkpoint_dir,
                     "Save training checkpoints here (one shard file per rank and a manifest, every --save-every steps "
                     "and at the end); a folder every rank can reach. Not the plan's --checkpointing, which is "
                     "activation recomputation");
  app.add_option("--save-every", f->save_every, "With --checkpoint-dir: save every K steps (default: at the end only)")
      ->check(CLI::PositiveNumber)
      ->needs(dir_option);
  app.add_flag("--resume", f->resume,
               "Continue from the latest checkpoint in --checkpoint-dir (saved by any world size and strategy) up to "
               "--steps, the run's total; starts at step 0 when the folder holds none yet")
      ->needs(dir_option);
  app.add_option("--init", f->init,
                 "Start from these weights: a safetensors file with every parameter at its PyTorch shape (e.g. from "
                 "dlplan export --checkpoint D --to safetensors), or the .onnx file the plan's model was imported "
                 "from, exported with its weights; --resume wins when a checkpoint exists")
      ->check(CLI::ExistingFile);
  app.add_option("--comm-timeout", f->comm_timeout,
                 "Seconds a collective may wait for its peers before the job ends naming the ranks that did not "
                 "arrive (MPI and NCCL)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  return [f, comm_option]() {
    f->comm_given = comm_option->count() > 0;
    exec::set_comm_timeout_seconds(f->comm_timeout);
    // Declared before the communicator: a GPU communicator is ordered after
    // the backend's stream, so the device goes last.
    exec::Device device;
    std::unique_ptr<exec::Communicator> comm = exec::make_communicator(nullptr, nullptr);
    const bool root = comm->rank() == 0;
    PlanDocument plan;
    std::unique_ptr<exec::Trainer> trainer;
    exec::TrainOptions opt;
    opt.steps = f->steps;
    opt.seed = f->seed;
    opt.data = f->data;
    std::optional<Fault> fault;
    exec::DeviceKind kind = exec::DeviceKind::cpu;
    try {  // set-up errors are the same on every rank
      fault = fault_from_environment();
      kind = exec::parse_device_kind(f->device);
      if (f->comm_given && kind != exec::DeviceKind::cuda)
        throw Error(fmt::format("--comm {} applies to --device cuda only", f->comm));
      if (!exec::device_built(kind))
        throw Error("--device cuda: this dlplan was built without CUDA (configure found no nvcc: see its build summary)");
      plan = read_plan_file(f->plan, PlanReadOptions{.allow_edited = f->allow_edited});
      if (plan.training.offload != Offload::none && !f->checkpoint_dir.empty())
        throw Error(fmt::format("{}: --checkpoint-dir does not save CPU-offloaded state (--offload {}) in this version; "
                                "plan without --offload to checkpoint",
                                f->plan, to_string(plan.training.offload)));
      // Sample indices (data and dropout are keyed by them) stay within 2^62.
      const int64_t global = plan.training.micro_batch * plan.training.grad_accum * plan.cluster.world();
      if (f->steps > kMaxSampleIndex / global)
        throw Error(fmt::format("--steps {} x a global batch of {} samples would index past 2^62 samples", f->steps, global));
      if (plan.edited && root)
        fmt::print(stderr, "dlplan: warning: {}: edited after planning (--allow-edited-plan); its prediction may not "
                           "hold, and the report says plan_edited\n", f->plan);
    } catch (const Error& e) {
      if (root) fmt::print(stderr, "dlplan: error: {}\n", e.what());
      return 1;
    }
    try {  // collective: the device may fail on some ranks only
      device = exec::make_device(kind, *comm);
    } catch (const exec::DeviceError& e) {
      if (e.reported_here) fmt::print(stderr, "dlplan: error: {}\n", e.what());
      return 1;
    }
    try {  // collective: NCCL's set-up fails (or not) on every rank
      comm = exec::make_device_communicator(device, exec::parse_gpu_comm_kind(f->comm), std::move(comm));
    } catch (const Error& e) {
      if (root) fmt::print(stderr, "dlplan: error: --device {} --comm {}: {}\n", f->device, f->comm, e.what());
      return 1;
    }
    try {  // set-up errors are the same on every rank
      trainer = std::make_unique<exec::Trainer>(plan, *comm, *device.backend, opt, std::move(device.memory),
                                                std::move(device.ops));
    } catch (const Error& e) {
      if (root) fmt::print(stderr, "dlplan: error: {}\n", e.what());
      return 1;
    }
    install_stop_handlers();
    // What the run says besides its progress: stdout for people, stderr under
    // --progress json (whose stdout is one JSON line per step).
    const auto info = [json = f->progress == "json"](const std::string& line) {
      if (json) fmt::print(stderr, "{}\n", line);
      else print_progress(line + "\n");
    };
    exec::CheckpointRun ckpt;
    ckpt.seed = f->seed;
    ckpt.total_steps = f->steps;
    ckpt.init = f->init;
    // Fine-tuning: the checkpoint has no frozen base; --init rebuilds it
    // before the checkpoint's trainable parameters and state are read.
    const bool init_first = plan.training.fine_tuning.active() && !f->init.empty();
    // A checkpoint failure every rank learns alike: the rank where it happened
    // says why; the job ends cleanly (exit 1), the previous checkpoint intact.
    auto checkpoint_failed = [&](const exec::CheckpointError& e) {
      if (comm->rank() == e.rank()) fmt::print(stderr, "dlplan: error: {}: {}\n", e.what(), e.detail());
      std::fflush(stderr);
      return 1;
    };
    int first = 0;
    try {
      if (init_first) {
        exec::set_parameters(*trainer, exec::read_init_tensors(f->init, plan.model), f->init);
        if (root) info(fmt::format("initialised from {}", f->init));
      }
      if (f->resume) {
        const int at = exec::load_checkpoint(f->checkpoint_dir, *trainer, *comm, ckpt);
        if (at < 0 && root) info(fmt::format("{}: no checkpoint yet: starting at step 0", f->checkpoint_dir));
        first = std::max(at, 0);
        if (at >= 0 && root)
          info(fmt::format("resumed from {}/step-{:08d} at step {} of {}", f->checkpoint_dir, at, at, f->steps));
      }
      if (first == 0 && !f->init.empty() && !init_first) {
        exec::set_parameters(*trainer, exec::read_init_tensors(f->init, plan.model), f->init);
        if (root) info(fmt::format("initialised from {}", f->init));
      }
    } catch (const exec::CheckpointError& e) {
      return checkpoint_failed(e);
    } catch (const Error& e) {  // --init: the same file and error on every rank
      if (root) fmt::print(stderr, "dlplan: error: {}\n", e.what());
      return 1;
    }
    if (first == f->steps) {
      if (root) fmt::print("the checkpoint is at step {}, the run's last (--steps {}): nothing to train\n", first, f->steps);
      return 0;
    }
    exec::RunMeasurement run;
    int stop_signal = 0;
    std::string saved;  // the last checkpoint's folder
    try {
      if (root && f->progress == "text")
        fmt::print("training {} on {} rank{} ({}{}), {} steps{}, global batch {}\n", plan.model.name, comm->size(),
                   comm->size() == 1 ? "" : "s", to_string(plan.training.strategy),
                   f->device == "cpu" ? std::string() : fmt::format(", {} with {}", f->device, comm->name()), f->steps,
                   first > 0 ? fmt::format(" (from step {})", first) : std::string(), trainer->samples_per_step());
      if (root && f->progress == "text" && f->device == "cpu") {
        const std::string blas = exec::describe(exec::blas_core());
        if (!blas.empty()) fmt::print("GEMMs on {}\n", blas);
      }
      double busy_after_first = 0;
      for (int s = first; s < f->steps; ++s) {
        if (fault && fault->rank == comm->rank() && fault->step == s + 1) {
          if (fault->kind == Fault::Kind::kill || fault->kind == Fault::Kind::stop) {
            std::fflush(stdout);
            std::raise(fault->kind == Fault::Kind::kill ? SIGKILL : SIGSTOP);
          } else if (fault->kind == Fault::Kind::error) {
            throw Error(fmt::format("injected failure at step {}", fault->step));
          }
        }
        run.steps.push_back(trainer->step());
        if (s == first) busy_after_first = comm->busy_seconds();
        // The first step, every --log-every steps, and the last.
        const bool log = s == first || (s + 1) % f->log_every == 0 || s + 1 == f->steps;
        if (root && log) {
          const auto& st = run.steps.back();
          // ETA: the remaining steps at the mean of the steps after the first
          // (the first pays for set-up).
          double eta = -1;
          const int done = s - first;
          if (s + 1 < f->steps && done >= 1) {
            double after_first = 0;
            for (size_t k = 1; k < run.steps.size(); ++k) after_first += run.steps[k].seconds;
            eta = after_first / static_cast<double>(done) * (f->steps - s - 1);
          }
          print_progress((f->progress == "json" ? exec::progress_json(st, f->steps, *trainer)
                                                 : exec::progress_text(st, f->steps, *trainer, eta)) +
                         "\n");
        }
        stop_signal = agreed_signal(*comm);
        const bool last = s + 1 == f->steps;
        const bool due = f->save_every > 0 && (s + 1) % f->save_every == 0;
        if (!f->checkpoint_dir.empty() && (last || due || stop_signal)) {
          exec::set_comm_context(fmt::format("saving the checkpoint of step {}", s + 1));
          const bool here = fault && fault->rank == comm->rank() && fault->step == s + 1;
          ckpt.kill_mid_save = here && fault->kind == Fault::Kind::kill_in_save;
          ckpt.fail_write = here && fault->kind == Fault::Kind::full_disk;
          const auto t0 = std::chrono::steady_clock::now();
          saved = exec::save_checkpoint(f->checkpoint_dir, *trainer, *comm, ckpt);
          const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (root) info(fmt::format("saved {} in {}", saved, format_seconds(took)));
        }
        if (stop_signal) break;
      }
      const int ran = static_cast<int>(run.steps.size());
      const int measured = std::max(1, ran - 1);
      run.comm_busy_seconds = (comm->busy_seconds() - (ran > 1 ? busy_after_first : 0.0)) / measured;
      run.memory = exec::highest_peak_rank(*trainer, *comm);
      auto report = exec::run_report(plan, *trainer, run, comm->size(), f->seed);
      report.first_step = first;
      report.partial = stop_signal != 0;
      if (root) {
        if (f->progress == "text") print_progress(exec::time_table(report) + exec::memory_table(report));
        if (!f->report.empty()) {
          const std::string path = report.partial ? partial_path(f->report) : f->report;
          write_output_file(path, report_json(report).dump(1) + "\n");
          if (report.partial) fmt::print(stderr, "dlplan: wrote {}\n", path);
          else if (f->progress == "text") print_progress(fmt::format("wrote {}\n", path));
        }
        if (stop_signal) {
          const int done = first + ran;
          fmt::print(stderr, "dlplan: stopped by {} after step {} of {}{}\n", signal_name(stop_signal), done, f->steps,
                     saved.empty() ? "; nothing saved (no --checkpoint-dir)"
                                   : fmt::format("; checkpoint {} (continue with --resume)", saved));
        }
      }
    } catch (const exec::CheckpointError& e) {
      return checkpoint_failed(e);
    } catch (const std::exception& e) {
      comm->abort(fmt::format("error: {}", e.what()));
    }
    std::fflush(stdout);
    std::fflush(stderr);
    return stop_signal ? 128 + stop_signal : 0;
  };
}

}  // namespace dlplan::cli
