// Checkpoint folders and safetensors files (`train --resume`, `train --init`,
// `export --checkpoint`, docs/checkpoints.md): the first byte picks the
// reader. Even: the rest is a safetensors file (read_safetensors). Odd: the
// rest is a checkpoint's manifest.json, in a folder whose `latest` names it
// and whose two shard files hold 64 zero bytes each (read_checkpoint_tensors:
// the layout validated, file sizes and CRC-32 checked before use).
#include "common.hpp"
#include "dlplan/exec/checkpoint.hpp"

#include <filesystem>
#include <fstream>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto text = dlplan::fuzz::bytes(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    const std::string path = dlplan::fuzz::scratch_file(text, ".safetensors");
    dlplan::fuzz::expect_answer([&] { dlplan::exec::read_safetensors(path); });
    return 0;
  }
  static const std::string dir = [] {
    const std::string d = dlplan::fuzz::scratch_file("", ".ckpt");
    std::filesystem::remove(d);
    std::filesystem::create_directories(d + "/step-00000001");
    std::ofstream(d + "/latest") << "step-00000001\n";
    for (const char* shard : {"/step-00000001/shard-00000.bin", "/step-00000001/shard-00001.bin"})
      std::ofstream(d + shard, std::ios::binary) << std::string(64, '\0');
    return d;
  }();
  {
    std::ofstream f(dir + "/step-00000001/manifest.json", std::ios::binary);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  dlplan::fuzz::expect_answer([&] { dlplan::exec::read_checkpoint_tensors(dir); });
  return 0;
}
