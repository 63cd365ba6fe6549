#include "dlplan/exec/data.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/backend.hpp"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dlplan::exec {
namespace {

// The classes of the loss's logits and, for token inputs, the vocabulary of
// the embedding that reads them.
struct ModelFacts {
  int64_t classes = 2;
  std::vector<int64_t> vocab;  // per model input, 0 when not read by an embedding
  int targets = -1, label = -1;
};

ModelFacts facts(const Model& m) {
  ModelFacts f;
  f.vocab.assign(m.inputs.size(), 0);
  for (const auto& n : m.nodes) {
    if (n.op == OpKind::cross_entropy) {
      f.classes = m.tensor(n.inputs[0]).shape.back();
      for (size_t k = 0; k < m.inputs.size(); ++k)
        if (m.inputs[k] == n.inputs[1]) (m.tensor(n.inputs[1]).shape.empty() ? f.label : f.targets) = static_cast<int>(k);
    }
    if (n.op == OpKind::embedding)
      for (size_t k = 0; k < m.inputs.size(); ++k)
        if (m.inputs[k] == n.inputs[0]) f.vocab[k] = n.attrs.integer("num");
  }
  return f;
}

// (a * b) mod m for a, b >= 0 and m > 0, without overflow: a token window's
// start for any sample index.
__extension__ typedef unsigned __int128 Wide;
int64_t mul_mod(int64_t a, int64_t b, int64_t m) {
  return static_cast<int64_t>(static_cast<Wide>(a % m) * static_cast<Wide>(b % m) % static_cast<Wide>(m));
}

uint32_t hash(uint64_t seed, int64_t sample, int64_t what) {
  uint32_t counter[4] = {static_cast<uint32_t>(what), static_cast<uint32_t>(sample),
                         static_cast<uint32_t>(sample >> 32), 0x0DA7A};
  uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint32_t out[4];
  philox4x32_10(counter, key, out);
  return out[0];
}

// hash(seed, sample, first + i) for i in [0, n).
void hashes(uint64_t seed, int64_t sample, int64_t first, int64_t n, uint32_t* out) {
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  philox_first_words(key, static_cast<uint32_t>(first), static_cast<uint32_t>(sample),
                     static_cast<uint32_t>(sample >> 32), 0x0DA7A, n, out);
}

// A hash mapped to [-1, 1].
float unit_value(uint32_t h) { return static_cast<float>(h % 2001) / 1000.0f - 1.0f; }

class Synthetic : public DataSource {
 public:
  Synthetic(const Model& m, uint64_t seed) : m_(m), seed_(seed), f_(facts(m)) {}
  std::string name() const override { return "synthetic"; }

  void fill(int input, Tensor& dst, int64_t first, int64_t count) override {
    const TensorInfo& t = m_.tensor(m_.inputs[static_cast<size_t>(input)]);
    const int64_t per = numel(t.shape);
    for (int64_t s = 0; s < count; ++s) {
      const int64_t idx = first + s;
      const int64_t label = hash(seed_, idx, 1) % f_.classes;
      if (t.dtype == DType::f32) {
        // The class prototype plus noise. Images ([C, H, W]) get a per-class
        // colour (a constant per channel, which survives global pooling) on
        // top of a fixed per-pixel pattern; vectors a fixed pattern.
        // The hashes of consecutive `what`s, computed eight at once
        // (philox_first_words: the same words as hash()).
        float* x = dst.f() + s * per;
        const int64_t plane = t.shape.size() == 3 ? t.shape[1] * t.shape[2] : 0;
        proto_.resize(static_cast<size_t>(per));
        noise_.resize(static_cast<size_t>(per));
        hashes(0xC1A55, label, 0, per, proto_.data());
        hashes(seed_, idx, 1000, per, noise_.data());
        if (plane == 0) {
          for (int64_t e = 0; e < per; ++e)
            x[e] = unit_value(proto_[static_cast<size_t>(e)]) + 0.5f * unit_value(noise_[static_cast<size_t>(e)]);
          continue;
        }
        for (int64_t c = 0; c < per / plane; ++c) {
          const float colour = unit_value(hash(0xC0102, label, c));  // the channel's
          for (int64_t e = c * plane; e < (c + 1) * plane; ++e)
            x[e] = (colour + 0.5f * unit_value(proto_[static_cast<size_t>(e)])) +
                   0.5f * unit_value(noise_[static_cast<size_t>(e)]);
        }
        continue;
      }
      int32_t* y = dst.i() + s * per;
      if (input == f_.label) {
        y[0] = static_cast<int32_t>(f_.label >= 0 && has_tokens() ? bert_label(idx) : label);
        continue;
      }
      const int64_t V = token_vocab();
      if (f_.vocab[static_cast<size_t>(input)] == 2) {  // token types: first half 0, second half 1
        for (int64_t e = 0; e < per; ++e) y[e] = e * 2 >= per ? 1 : 0;
        continue;
      }
      const bool sequence = f_.targets >= 0;
      const int64_t start = hash(seed_, idx, 2) % V;
      for (int64_t e = 0; e < per; ++e) {
        if (!sequence) y[e] = static_cast<int32_t>(hash(seed_, idx, 10 + e) % V);
        else y[e] = static_cast<int32_t>((start + e + (input == f_.targets ? 1 : 0)) % V);
      }
    }
  }

 private:
  bool has_tokens() const {
    for (int64_t v : f_.vocab)
      if (v > 2) return true;
    return false;
  }
  int64_t token_vocab() const {
    int64_t v = 0;
    for (int64_t x : f_.vocab) v = std::max(v, x);
    return std::max<int64_t>(v, f_.classes);
  }
  int64_t bert_label(int64_t idx) const {
    const int64_t V = token_vocab();
    return static_cast<int64_t>(hash(seed_, idx, 10) % V) < V / 2 ? 0 : 1;
  }

  const Model& m_;
  uint64_t seed_;
  std::vector<uint32_t> proto_, noise_;  // one sample's hashes (reused)
  ModelFacts f_;
};

class TokenFile : public DataSource {
 public:
  TokenFile(const std::string& path, const Model& m) : path_(path), m_(m), f_(facts(m)) {
    const auto ext = std::filesystem::path(path).extension().string();
    const bool u16 = ext == ".u16" || ext == ".bin";
    if (!u16 && ext != ".i32")
      throw Error(fmt::format("{}: token files end in .u16 / .bin (uint16) or .i32 (int32)", path));
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(fmt::format("{}: cannot open data file", path));
    std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t width = u16 ? 2 : 4;
    if (raw.size() % width != 0) throw Error(fmt::format("{}: size {} is not a multiple of {} bytes", path, raw.size(), width));
    tokens_.resize(raw.size() / width);
    for (size_t i = 0; i < tokens_.size(); ++i) {
      if (u16) {
        uint16_t v;
        std::memcpy(&v, raw.data() + 2 * i, 2);
        tokens_[i] = v;
      } else {
        std::memcpy(&tokens_[i], raw.data() + 4 * i, 4);
      }
    }
    for (size_t k = 0; k < m.inputs.size(); ++k)
      if (f_.vocab[k] > 0)
        for (int32_t t : tokens_)
          if (t < 0 || t >= f_.vocab[k]) throw Error(fmt::format("{}: token {} is outside the vocabulary of {}", path, t, f_.vocab[k]));
  }
  std::string name() const override { return path_; }
  void fill(int input, Tensor& dst, int64_t first, int64_t count) override {
    const TensorInfo& t = m_.tensor(m_.inputs[static_cast<size_t>(input)]);
    if (t.dtype != DType::i32 || t.shape.size() != 1)
      throw Error(fmt::format("{}: a token file feeds token inputs only; model input '{}' is not one", path_, t.name));
    const int64_t T = t.shape[0], len = static_cast<int64_t>(tokens_.size());
    if (len < T + 2) throw Error(fmt::format("{}: {} tokens are fewer than one sequence of {} + 1", path_, len, T));
    const int64_t shift = input == f_.targets ? 1 : 0;
    for (int64_t s = 0; s < count; ++s) {
      const int64_t at = mul_mod(first + s, T, len - T - 1);
      for (int64_t e = 0; e < T; ++e) dst.i()[s * T + e] = tokens_[static_cast<size_t>(at + e + shift)];
    }
  }

 private:
  std::string path_;
  const Model& m_;
  ModelFacts f_;
  std::vector<int32_t> tokens_;
};

struct ImageHeader {
  uint32_t count, channels, height, width, classes;
};

class ImageFile : public DataSource {
 public:
  ImageFile(const std::string& path, const Model& m) : path_(path), m_(m), f_(facts(m)) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(fmt::format("{}: cannot open data file", path));
    char magic[4];
    in.read(magic, 4);
    if (!in || std::memcmp(magic, "DLPI", 4) != 0) throw Error(fmt::format("{}: not a DLPI image file (bad magic)", path));
    in.read(reinterpret_cast<char*>(&h_), sizeof h_);
    if (!in || h_.count == 0) throw Error(fmt::format("{}: truncated header", path));
    // The header against the model and the file's size, before allocating
    // anything it claims: [C, H, W] must be the model's image input (so its
    // size is within the loader's limits), and every record must be there.
    const TensorInfo* image = nullptr;
    for (int id : m.inputs)
      if (m.tensor(id).dtype == DType::f32) image = &m.tensor(id);
    if (image == nullptr || image->shape != Shape{h_.channels, h_.height, h_.width})
      throw Error(fmt::format("{}: images are [{}, {}, {}] but the model's image input is {}", path, h_.channels, h_.height,
                              h_.width, image ? fmt::format("'{}' {}", image->name, to_string(image->shape)) : "missing"));
    if (h_.classes != f_.classes)
      throw Error(fmt::format("{}: {} classes, but the model's logits have {}", path, h_.classes, f_.classes));
    const int64_t per = numel(image->shape);
    const int64_t record = 4 + 4 * per, body = static_cast<int64_t>(std::filesystem::file_size(path)) - 24;
    if (h_.count > body / record)
      throw Error(fmt::format("{}: the header promises {} records of {} bytes, but the file holds {} bytes after it "
                              "(truncated, or not a DLPI file)", path, h_.count, record, body));
    labels_.resize(h_.count);
    pixels_.resize(static_cast<size_t>(per) * h_.count);
    for (uint32_t i = 0; i < h_.count; ++i) {
      in.read(reinterpret_cast<char*>(&labels_[i]), 4);
      in.read(reinterpret_cast<char*>(pixels_.data() + per * i), static_cast<std::streamsize>(per * 4));
      if (!in) throw Error(fmt::format("{}: truncated at record {} of {}", path, i, h_.count));
      if (labels_[i] >= h_.classes) throw Error(fmt::format("{}: record {} has label {} of {} classes", path, i, labels_[i], h_.classes));
    }
  }
  std::string name() const override { return path_; }
  void fill(int input, Tensor& dst, int64_t first, int64_t count) override {
    const TensorInfo& t = m_.tensor(m_.inputs[static_cast<size_t>(input)]);
    const int64_t per = numel(t.shape);
    for (int64_t s = 0; s < count; ++s) {
      const size_t rec = static_cast<size_t>((first + s) % h_.count);
      if (t.dtype == DType::f32) std::memcpy(dst.f() + s * per, pixels_.data() + rec * static_cast<size_t>(per), static_cast<size_t>(per) * 4);
      else dst.i()[s] = static_cast<int32_t>(labels_[rec]);
    }
  }

 private:
  std::string path_;
  const Model& m_;
  ModelFacts f_;
  ImageHeader h_{};
  std::vector<uint32_t> labels_;
  std::vector<float> pixels_;
};

}  // namespace

std::unique_ptr<DataSource> make_data_source(const std::string& spec, const Model& m, uint64_t seed) {
  if (spec.empty() || spec == "synthetic") return std::make_unique<Synthetic>(m, seed);
  std::error_code ec;
  if (!std::filesystem::exists(spec, ec)) throw Error(fmt::format("{}: no such data file", spec));
  if (!std::filesystem::is_regular_file(spec, ec)) throw Error(fmt::format("{}: not a regular file", spec));
  std::ifstream in(spec, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  if (std::memcmp(magic, "DLPI", 4) == 0) return std::make_unique<ImageFile>(spec, m);
  return std::make_unique<TokenFile>(spec, m);
}

void write_image_file(const std::string& path, int channels, int height, int width, int classes,
                      const std::vector<int>& labels, const std::vector<float>& pixels) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error(fmt::format("{}: cannot write", path));
  out.write("DLPI", 4);
  ImageHeader h{static_cast<uint32_t>(labels.size()), static_cast<uint32_t>(channels), static_cast<uint32_t>(height),
                static_cast<uint32_t>(width), static_cast<uint32_t>(classes)};
  out.write(reinterpret_cast<const char*>(&h), sizeof h);
  const size_t per = static_cast<size_t>(channels) * height * width;
  for (size_t i = 0; i < labels.size(); ++i) {
    uint32_t l = static_cast<uint32_t>(labels[i]);
    out.write(reinterpret_cast<const char*>(&l), 4);
    out.write(reinterpret_cast<const char*>(pixels.data() + per * i), static_cast<std::streamsize>(per * 4));
  }
}

}  // namespace dlplan::exec
