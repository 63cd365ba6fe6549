// The executor's one place that knows which backends were built: a device
// (backend, memory, device ops and the communicator ordered after them) for
// `--device cpu|cuda`, and the process's communicator (MPI when launched by
// mpirun, else one process). Callers (the CLI, the GUI's local run, tools)
// hold no #if for CUDA or MPI; a kind this build lacks is a dlplan::Error.
#pragma once

#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/device_ops.hpp"
#include "dlplan/exec/tensor.hpp"

#include <memory>
#include <string>

namespace dlplan::exec {

enum class DeviceKind { cpu, cuda };
DeviceKind parse_device_kind(const std::string& s);  // "cpu" or "cuda", else dlplan::Error

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = -1;  // the GPU this rank uses (cuda), -1 on the CPU
  // Declared in this order so that they are destroyed backwards: the
  // communicator (ordered after the backend's stream) before the backend.
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MemoryResource> memory;  // for the trainer's Allocator
  std::unique_ptr<DeviceOps> ops;
};

// Was this dlplan built with the backend for `kind`?
bool device_built(DeviceKind kind);

// The process's communicator: MPI when mpirun (or srun) launched it and MPI
// was built, else a single process. argc/argv may be null.
std::unique_ptr<Communicator> make_communicator(int* argc, char*** argv);

// Builds this rank's device. cuda: picks the GPU from the node-local rank
// (host.local_rank()), then backend, caching memory and device ops on one
// compute stream. Collective over `host`: when some ranks fail (a node
// without a GPU), every rank throws DeviceError, and `reported_here` says
// whether this rank should print it (the failing ranks, naming themselves;
// rank 0 when all failed), so the message is printed once per cause.
struct DeviceError : Error {
  DeviceError(const std::string& what, bool reported_here) : Error(what), reported_here(reported_here) {}
  bool reported_here;
};
Device make_device(DeviceKind kind, Communicator& host);

// The communicator a trainer on `device` uses (GpuCommKind: communicator.hpp): the host communicator itself
// on the CPU; on a GPU, NCCL (or MPI staging) ordered after the backend's
// stream, wrapping `host`. Collective (NCCL's set-up succeeds or fails on
// every rank): throws dlplan::Error on every rank on failure.
std::unique_ptr<Communicator> make_device_communicator(Device& device, GpuCommKind kind,
                                                       std::unique_ptr<Communicator> host);

}  // namespace dlplan::exec
