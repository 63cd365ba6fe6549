// Training data, keyed by global sample index (never by rank), so the same
// seed gives the same global batch on any number of ranks; each rank fills
// its own slice of every global batch.
//
// Synthetic tasks (learnable, deterministic):
//  - a class label [] i32 and a float input (image or feature vector): the
//    label is drawn from the sample index; the input is the label's fixed
//    prototype plus noise (images: a per-class colour and pattern), so a
//    classifier can learn it;
//  - token inputs [T] i32 with targets [T]: the sequence start, start + 1,
//    start + 2, ... (mod vocab) from a random start; targets are the next
//    tokens (a pattern a GPT learns within tens of steps);
//  - other token inputs (BERT): random tokens; token types 0 then 1; its label
//    is whether the first token is in the lower half of the vocabulary.
// Files (documented in docs/data.md):
//  - tokens: a flat binary of uint16 (".u16", ".bin") or int32 (".i32");
//    sample i is the window at (i * T) mod (len - T - 1), targets shifted by 1;
//  - images: "DLPI" files: magic, then uint32 count, channels, height, width,
//    classes, then per sample a uint32 label and C*H*W float32 values;
//    sample i is record i mod count.
#pragma once

#include "dlplan/exec/tensor.hpp"

#include <memory>
#include <string>

namespace dlplan::exec {

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual std::string name() const = 0;
  // Fills `dst` ([count, ...shape of model input `input`]) with samples
  // first_sample .. first_sample + count - 1.
  virtual void fill(int input, Tensor& dst, int64_t first_sample, int64_t count) = 0;
};

// "synthetic" or a file path; throws dlplan::Error naming the file.
std::unique_ptr<DataSource> make_data_source(const std::string& spec, const Model& m, uint64_t seed);

// Writes an image file in the DLPI format (tests and tools).
void write_image_file(const std::string& path, int channels, int height, int width, int classes,
                      const std::vector<int>& labels, const std::vector<float>& pixels);

}  // namespace dlplan::exec
