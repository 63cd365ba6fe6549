// Checkpoints of a training run (DESIGN.md, "Checkpoints"; docs/checkpoints.md).
//
// A checkpoint is a folder D/step-NNNNNNNN holding one shard file per rank
// (shard-RRRRR.bin: raw little-endian fp32) and manifest.json, which describes
// every tensor logically: each parameter's name, PyTorch shape and place in
// its unit's flat buffer, and for every shard which flat range of each unit
// it holds, of which states (the fp32 parameters, Adam's exp_avg and
// exp_avg_sq), at which byte offset, with the file's size and CRC-32. D/latest
// names the newest complete checkpoint. Because ranges are logical (a unit's
// unpadded flat buffer), a checkpoint loads into any world size and strategy.
//
// Rank r of N saves the range [r S, (r + 1) S) of each unit of P elements,
// S = ceil(P / N): exactly what it owns under ZeRO, and a 1/N share of what
// every rank holds under DDP, so each rank writes a like share.
//
// Saving is atomic: every rank writes and fsyncs its shard into
// D/.tmp-step-NNNNNNNN, rank 0 writes the manifest, fsyncs the folder, renames
// it to step-NNNNNNNN and replaces D/latest (written beside and renamed). A
// save that fails (or is interrupted) anywhere leaves the previous checkpoint
// and `latest` as they were.
//
// Data and dropout are keyed by the global sample index and the learning rate
// by the step, so the step is all a resumed run needs besides the tensors; it
// must use the same --seed and --steps (the schedule's total), which the
// manifest records and resume checks.
#pragma once

#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/trainer.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dlplan::exec {

// A failure of a collective save or load: every rank throws it alike; the
// rank where it happened has `detail` (the others an empty one).
class CheckpointError : public Error {
 public:
  CheckpointError(const std::string& what, int rank, std::string detail)
      : Error(what), rank_(rank), detail_(std::move(detail)) {}
  int rank() const { return rank_; }                     // where it happened
  const std::string& detail() const { return detail_; }  // that rank's own message
 private:
  int rank_;
  std::string detail_;
};

struct CheckpointRun {
  uint64_t seed = 1;
  int total_steps = 0;  // --steps: the learning-rate schedule's total
  // --init: the weights the run started from. A fine-tuning plan's
  // checkpoint holds what trains (LoRA's adapters) and its optimizer state,
  // not the frozen base: a resumed run rebuilds the base from the same
  // --init (or, without one, from the same seed), and the manifest says which.
  std::string init;
  // Test hook (DLPLAN_FAULT=R:S:kill-in-save): this rank dies (SIGKILL)
  // half-way through writing its shard.
  bool kill_mid_save = false;
  // Test hook (DLPLAN_FAULT=R:S:full-disk): this rank's shard write fails
  // half-way with ENOSPC.
  bool fail_write = false;
};

// Collective (every rank, after trainer.steps_done() steps): saves into dir
// and moves dir/latest to it. Returns the checkpoint's folder. Throws
// CheckpointError on every rank when any rank fails; nothing is left half
// written.
std::string save_checkpoint(const std::string& dir, Trainer& trainer, Communicator& comm, const CheckpointRun& run);

// Collective: the latest checkpoint in dir loaded into the trainer (any world
// size and strategy), which then continues from its step. Returns that step,
// or -1 (the trainer untouched) when dir holds no checkpoint yet. Throws
// CheckpointError on every rank for a checkpoint that cannot be used (another
// model, a truncated or corrupted shard, another seed), naming the file.
int load_checkpoint(const std::string& dir, Trainer& trainer, Communicator& comm, const CheckpointRun& run);

// One parameter or buffer at its full shape, consolidated from the shards.
struct NamedTensor {
  std::string name;
  Shape shape;
  std::vector<float> values;
};
// Reads the latest checkpoint in dir (checksums verified): every parameter
// (fp32) and BN buffer (rank 0's), in the model's order. Throws Error naming
// the file for a bad one. `step` receives the checkpoint's step.
std::vector<NamedTensor> read_checkpoint_tensors(const std::string& dir, int* step = nullptr);

// safetensors (https://github.com/huggingface/safetensors, "Format"): an
// 8-byte little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets}} (plus string "__metadata__"), then the raw little-endian data.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata);
std::vector<NamedTensor> read_safetensors(const std::string& path);  // F32, BF16 and F16 read as fp32

// --init FILE: a safetensors file, or an ONNX file exported with its weights
// (the parameters the ONNX importer maps from its initializers, under
// dlplan's names: re-imported with the model's sequence length). Throws
// Error naming the file.
std::vector<NamedTensor> read_init_tensors(const std::string& path, const Model& model);

// --init: the parameters of the trainer's model set from named tensors (a
// safetensors file), every parameter present at its shape; extra tensors are
// an error too (another model). LoRA adapters may be absent (a base model's
// weights): they keep their initial values. Collective only in that every
// rank calls it.
void set_parameters(Trainer& trainer, const std::vector<NamedTensor>& tensors, const std::string& source);

}  // namespace dlplan::exec
