#include "dlplan/exec/device.hpp"

#include "dlplan/error.hpp"

#if defined(DLPLAN_HAVE_CUDA)
#include "dlplan/exec/cuda_backend.hpp"
#include "dlplan/exec/cuda_runtime.hpp"
#endif

#include <fmt/format.h>

namespace dlplan::exec {

DeviceKind parse_device_kind(const std::string& s) {
  if (s == "cpu") return DeviceKind::cpu;
  if (s == "cuda") return DeviceKind::cuda;
  throw Error(fmt::format("unknown device '{}' (cpu or cuda)", s));
}

bool device_built([[maybe_unused]] DeviceKind kind) {
#if defined(DLPLAN_HAVE_CUDA)
  return true;
#else
  return kind == DeviceKind::cpu;
#endif
}

std::unique_ptr<Communicator> make_communicator(int* argc, char*** argv) {
#if defined(DLPLAN_HAVE_MPI)
  if (launched_by_mpi()) return make_mpi_communicator(argc, argv);
#else
  (void)argc;
  (void)argv;
#endif
  return make_single_communicator();
}

namespace {

Device make_local_device(DeviceKind kind, [[maybe_unused]] const Communicator& host) {
  Device d;
  d.kind = kind;
  if (kind == DeviceKind::cpu) {
    d.backend = make_cpu_backend();
    d.memory = make_host_memory();
    d.ops = make_cpu_device_ops();
    return d;
  }
#if defined(DLPLAN_HAVE_CUDA)
  std::string why;
  if (!cuda_available(&why)) throw Error("--device cuda: " + why);
  d.index = select_cuda_device(host);
  d.backend = make_cuda_backend(d.index);
  d.memory = make_cuda_memory(d.index, d.backend->stream());
  d.ops = make_cuda_device_ops(*d.backend);
  return d;
#else
  throw Error("--device cuda: this dlplan was built without CUDA (configure found no nvcc; see the build summary)");
#endif
}

}  // namespace

Device make_device(DeviceKind kind, Communicator& host) {
  // Some ranks may fail where others do not (a node without a GPU): every
  // rank learns how many failed, and only the failing ranks say why.
  std::string failure;
  Device d;
  try {
    d = make_local_device(kind, host);
  } catch (const Error& e) {
    failure = e.what();
  }
  double failed = failure.empty() ? 0 : 1;
  host.all_reduce_doubles(&failed, 1);
  if (failed == 0) return d;
  const bool all = failed >= host.size();
  if (failure.empty()) throw DeviceError(fmt::format("{} of {} ranks could not set up the device", failed, host.size()), false);
  if (all) throw DeviceError(failure, host.rank() == 0);
  throw DeviceError(fmt::format("rank {}: {}", host.rank(), failure), true);
}

std::unique_ptr<Communicator> make_device_communicator(Device& device, [[maybe_unused]] GpuCommKind kind,
                                                       std::unique_ptr<Communicator> host) {
  if (device.kind == DeviceKind::cpu) return host;
#if defined(DLPLAN_HAVE_CUDA)
  return make_gpu_communicator(kind, std::move(host), device.backend->stream());
#else
  throw Error("--device cuda: this dlplan was built without CUDA");
#endif
}

}  // namespace dlplan::exec
