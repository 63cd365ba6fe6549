// Parameters and gradients (in the plan's storage dtype: bf16 under
// bf16-mixed; the optimizer keeps the fp32 master copy) as the strategy keeps them
// (DESIGN.md, "Strategies"): one flat buffer per unit, parameters in node
// order, padded to a multiple of the world size when sharded.
//   ddp (and any strategy on one rank): full params, full grads, full state
//   zero1: full params (padded), full grads, state for this rank's shard
//   zero2: full params (padded), gradient shard, state shard
//   zero3: parameter shard (the unit is gathered when needed), gradient shard, state shard
// Ops see per-parameter views into whichever buffer currently holds the full
// unit (the params, or ZeRO-3's gathered buffer); their gradients go to the
// full grads or, under ZeRO-2/3, to the unit's staging buffer in `comm`.
// Fine-tuning (docs/fine-tuning.md): a unit's frozen parameters are a second
// run beside the trainable one, kept (and sharded, and gathered after it) as
// the strategy keeps parameters, with no gradient and no optimizer state;
// unit_size() and everything about gradients and the optimizer mean the
// trainable run. A frozen parameter's gradient view is undefined.
// Tensors live where the allocator's memory resource puts them (host or
// device); the store touches them only through DeviceOps (initialisation is
// built on the host and uploaded).
#pragma once

#include "dlplan/exec/device_ops.hpp"
#include "dlplan/exec/tensor.hpp"
#include "dlplan/training.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace dlplan::exec {

// A run of the unit's flat buffer with one weight-decay setting.
struct DecaySegment {
  int64_t begin = 0, end = 0;  // [begin, end) in the unit's flat buffer
  bool decay = false;
};

class ParamStore {
 public:
  // `ops` (not owned) must outlive the store; null: host loops (make_cpu_device_ops).
  // `world` and `rank`: the data-parallel world and this rank in it. Under
  // hybrid sharding the store shards over the shard group, so world() is the
  // group's size and rank() the rank in it; replica() is the group's index.
  // `host`: the host pool for CPU offload (required when t.offload is set):
  // the fp32 gradient shards and, under --offload params, the parameter shards.
  ParamStore(const Model& m, const TrainingConfig& t, int world, int rank, Allocator& alloc, uint64_t seed,
             DeviceOps* ops = nullptr, Allocator* host = nullptr);
  DeviceOps& ops() const { return *ops_; }

  int world() const { return world_; }    // ranks the states are sharded over
  int rank() const { return rank_; }      // in them
  int replica() const { return replica_; }  // hsdp: which shard group (0 otherwise)
  int units() const { return static_cast<int>(size_.size()); }
  int64_t unit_size(int u) const { return size_[static_cast<size_t>(u)]; }      // P_u
  int64_t unit_padded(int u) const { return padded_[static_cast<size_t>(u)]; }  // multiple of N when sharded
  int64_t shard_size(int u) const { return sharded_ ? padded_[static_cast<size_t>(u)] / world_ : size_[static_cast<size_t>(u)]; }
  int64_t shard_offset(int u) const { return sharded_ ? rank_ * shard_size(u) : 0; }
  const std::vector<DecaySegment>& segments(int u) const { return segments_[static_cast<size_t>(u)]; }
  // The frozen run (0 without fine-tuning): its size, padded size, and shard.
  int64_t frozen_size(int u) const { return frozen_size_[static_cast<size_t>(u)]; }
  int64_t frozen_padded(int u) const { return frozen_padded_[static_cast<size_t>(u)]; }
  int64_t frozen_shard(int u) const { return sharded_ ? frozen_padded(u) / world_ : frozen_size(u); }
  // ZeRO-3: the gathered unit, the trainable run then the frozen run, each padded.
  int64_t gathered_size(int u) const { return unit_padded(u) + frozen_padded(u); }
  Tensor& frozen(int u) { return frozen_[static_cast<size_t>(u)]; }  // full (or zero3: the shard)
  bool trainable(int param) const { return !frozen_param_[static_cast<size_t>(param)]; }

  Strategy strategy() const { return strategy_; }
  bool sharded() const { return sharded_; }  // any ZeRO stage on more than one rank
  // CPU offload (step_program.hpp): the optimizer reads host_grads(u), fp32
  // and shard_size(u) long. They arrive as backward reduce-scatters each
  // shard (streams_grads()), or at the optimizer from device_owned_grads(u).
  bool offloaded() const { return offload_ != Offload::none; }
  bool params_on_host() const { return offload_ == Offload::params && sharding(strategy_, world_).params; }
  bool streams_grads() const { return streams_grads_; }
  Span host_grads(int u) const { return host_grads_[static_cast<size_t>(u)].span(); }
  Span device_owned_grads(int u) const;

  Tensor& params(int u) { return params_[static_cast<size_t>(u)]; }  // full (or zero3: the shard)
  Tensor& grads(int u) { return grads_[static_cast<size_t>(u)]; }    // full (or zero2/3: the shard)
  void set_gathered(int u, Tensor t) { gathered_[static_cast<size_t>(u)] = std::move(t); }
  void set_grad_staging(int u, Tensor t) { staging_[static_cast<size_t>(u)] = std::move(t); }
  const Tensor& grad_staging(int u) const { return staging_[static_cast<size_t>(u)]; }

  // Views for node i's ParamDecl list (a tied linear gets the embedding's weight first).
  std::vector<Tensor> param_views(int node) const;
  std::vector<Tensor> grad_views(int node) const;
  std::vector<Tensor> buffer_views(int node) const;

  // This rank's slice of unit u: parameters and gradients the optimizer
  // updates (in the storage dtype: bf16 under bf16-mixed; under offload the
  // gradients are the host's fp32 shard).
  Span owned_params(int u);
  Span owned_grads(int u) const;
  DType dtype() const { return dtype_; }  // of parameters and gradients
  int64_t owned_begin(int u) const;  // flat offset of the owned slice
  int64_t owned_size(int u) const;   // clipped to the unit's real size

  // Where param k lives: (unit, offset in its run: the unit's flat buffer, or
  // for a frozen parameter the frozen run).
  std::pair<int, int64_t> locate(int param) const { return where_[static_cast<size_t>(param)]; }

  void zero_grads();
  // The full parameters of every unit, its trainable run then its frozen run
  // (tests, reports), on the host: this
  // rank's part is downloaded, and `gather` all-gathers a HOST buffer in place.
  std::vector<float> snapshot_full_params(const std::function<void(float*, int64_t)>& gather) const;

 private:
  const Tensor& full_unit(int u) const;   // where ops read unit u's parameters
  Tensor frozen_view(int u, int64_t off, int64_t n) const;  // a frozen parameter, where ops read it
  const Tensor& grad_target(int u) const; // where ops write unit u's gradients
  void initialize(const Model& m, uint64_t seed);

  const Model& m_;
  std::unique_ptr<DeviceOps> own_ops_;  // when none was given
  DeviceOps* ops_ = nullptr;
  Strategy strategy_;
  DType dtype_;
  int world_, rank_, replica_;
  bool sharded_;
  Offload offload_;
  bool streams_grads_;
  bool stages_grads_;  // backward writes each unit's gradient into its staging buffer
  std::vector<int64_t> size_, padded_;
  std::vector<int64_t> frozen_size_, frozen_padded_;
  std::vector<std::pair<int, int64_t>> where_;
  std::vector<char> frozen_param_;
  std::vector<std::vector<DecaySegment>> segments_;
  std::vector<Tensor> params_, grads_, gathered_, staging_;
  std::vector<Tensor> frozen_;                // the frozen runs
  std::vector<Tensor> host_grads_;            // CPU offload: fp32 shards in the host pool
  std::vector<std::vector<Tensor>> buffers_;  // per node
  std::vector<std::vector<int>> node_params_; // per node: Model::params indices (tied weight first)
};

}  // namespace dlplan::exec
