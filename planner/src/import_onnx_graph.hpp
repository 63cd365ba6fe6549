// Private to the ONNX importer: an indexed view of an ONNX graph (producers,
// consumers, shapes after inference, constant values) and the fused patterns
// found in it (import_onnx_fuse.cpp).
#pragma once

#include "dlplan/importers.hpp"

#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dlplan::onnx_import {

using Dims = std::vector<int64_t>;  // full ONNX shape (batch first); -1 unknown

// Where the values of one IR parameter are in the file (for `--init
// model.onnx`): initializer `init`, transposed when the file stores a 2-D
// weight as [in, out] (MatMul's W, Gemm without transB) so that it reads as
// PyTorch's [out, in]; then rows [begin, end) of it (a fused QKV projection's
// q, k or v part), or all of it when end < 0.
// An LSTM's or GRU's W, R or B folded into an initializer holds its gate
// blocks in ONNX's order (LSTM: input, output, forget, cell; GRU: update,
// reset, hidden), a direction after the other (B: W's bias then R's, each
// direction): onnx_gates (the number of gates, 4, 3 or 1; 0: none) reads it as
// rows of the parameter's size, takes rows [begin, end) and reorders the gate
// blocks to PyTorch's (input, forget, cell, output; reset, update, new).
struct WeightRef {
  std::string init;
  bool transpose = false;
  int64_t begin = 0, end = -1;
  int onnx_gates = 0;
};

struct Graph {
  Graph(onnx::ModelProto& model, std::string src);
  void index();

  const onnx::NodeProto& node(int i) const;
  int producer_of(const std::string& t) const;  // -1: graph input or initializer
  const std::vector<int>& consumers_of(const std::string& t) const;
  bool is_init(const std::string& t) const;
  // An initializer or the output of Constant / ConstantOfShape.
  bool is_const(const std::string& t) const;
  std::optional<Dims> shape(const std::string& t) const;
  int32_t dtype(const std::string& t) const;
  // Values of a small constant (initializer with data, or Constant node).
  std::optional<std::vector<double>> values(const std::string& t) const;
  std::optional<double> scalar(const std::string& t) const;
  // A MatMul's right operand that is a weight: an initializer W [in, out], or
  // (torch's opset-13 export of nn.Linear) Transpose(W [out, in]). Its
  // [in, out], or nothing when `t` is an activation.
  std::optional<std::pair<int64_t, int64_t>> matmul_weight(const std::string& t) const;
  // A learned tensor: a float initializer torch named after a module (a
  // parameter or buffer); torch names its own constants "onnx::...".
  bool is_learned(const std::string& t) const;
  // A learned tensor plus a scalar constant, w + c (GemmaRMSNorm's
  // 1 + weight): the initializer's name and c, or nothing.
  std::optional<std::pair<std::string, double>> offset_weight(const std::string& t) const;
  // The same weight as a WeightRef to PyTorch's [out, in] layout.
  WeightRef matmul_weight_ref(const std::string& t) const;

  onnx::ModelProto& m;
  onnx::GraphProto& g;
  std::string src;
  std::map<std::string, const onnx::TensorProto*> inits;
  std::vector<std::string> inputs;  // graph inputs that are not initializers
  std::map<std::string, int> producer;
  std::map<std::string, std::vector<int>> consumers;
  std::map<std::string, Dims> shapes;
  std::map<std::string, int32_t> elem_type;
};

// A subgraph recognised as one IR op: nodes `nodes` read `x` and produce `out`.
struct Fusion {
  std::string kind;              // "attention", "gelu", "silu"
  std::string name;              // IR node name
  std::string unit_source;       // an ONNX node name to take the unit from
  std::string x, out;
  std::vector<int> nodes;
  nlohmann::ordered_json attrs = nlohmann::ordered_json::object();
  std::string note;              // for the model's notes, if any
  std::vector<std::pair<std::string, WeightRef>> weights;  // parameter suffix ("q.weight") -> its values
};

// Softmax nodes that did not match attention go to `unfused` with the reason.
// Under FusionMode::eager, the patterns PyTorch's eager mode runs op by op
// (tanh-GELU with a Pow, RMSNorm: both written in Python) are left unfused.
std::vector<Fusion> find_fusions(const Graph& g, dlplan::FusionMode mode, std::map<int, std::string>* unfused = nullptr);

// nn.LSTM's, nn.GRU's or nn.RNN's export (one LSTM, GRU or RNN node a layer,
// with its transposes, squeeze and gate reordering) as the IR's lstm, gru or rnn
// (import_onnx_rnn.cpp); else nothing, and `why` says what the node does
// that the IR's op does not.
std::optional<Fusion> match_recurrent(const Graph& g, int node, std::string& why);

// Swin's windows (import_onnx_window.cpp). The window [Wh, Ww] whose
// relative position index (window_relative_index, row-major over [T, T])
// the constant `index` holds, reading a table of `rows` rows; nothing for any
// other index.
std::optional<std::array<int64_t, 2>> window_of_relative_index(const std::vector<double>& index, int64_t rows);
// BEiT's: the same over a class token at 0 and the window's patches, the
// table three rows longer (window_relative_index_with_cls).
std::optional<std::array<int64_t, 2>> window_of_relative_index_with_cls(const std::vector<double>& index,
                                                                        int64_t rows);
// T5's relative-position buckets (import_onnx_window.cpp): the geometry
// under which the constant `index` [T, T] holds, for query i and key j,
// relative_position_bucket(j - i, rows, max_distance, bidirectional) (ops.hpp)
// of a table of `rows` buckets; nothing for any other index. MPNet computes
// them in the graph (folded at import). At T positions every max_distance
// of a range [reads_alike_from, reads_alike_to] reads the same index: 128,
// T5's and MPNet's, is taken when in it, else its smallest.
constexpr int64_t kT5MaxDistance = 128;  // T5's and MPNet's
struct RelativeBuckets {
  int64_t buckets = 0, max_distance = 0;
  bool bidirectional = true;
  int64_t reads_alike_from = 0, reads_alike_to = 0;
};
std::optional<RelativeBuckets> relative_buckets_of_index(const std::vector<double>& index, int64_t rows);
// A shifted-window mask: the layout and values a window_mask op adds.
struct WindowMask {
  std::array<int64_t, 2> windows, window, shift;
  double value;
};
// Whether `values` of shape `mask` are the shifted-window mask of scores
// [nW, H, T, T] per sample (the mask [.., nW, 1, T, T], leading axes 1):
// one value where window_mask_hides, 0 elsewhere, for some grid of nW
// windows, window of T positions and shift. `prefer`: the window to try
// first (the table's of the same block).
std::optional<WindowMask> match_window_mask(const std::vector<double>& values, const Dims& mask, const Dims& scores,
                                            std::optional<std::array<int64_t, 2>> prefer);

// The values of a tensor stored in the file (raw or typed data), as doubles;
// nothing for external data or an element type not read here.
std::optional<std::vector<double>> tensor_values(const onnx::TensorProto& t);

// The elements at flat positions `at` of a tensor stored in the file, as
// doubles, read one by one: a Gather or Slice of a few rows of a table too
// large to read whole (XGLM's 2050 x 1024 positions). Nothing where
// tensor_values gives nothing, or a position lies outside the data.
std::optional<std::vector<double>> tensor_elements(const onnx::TensorProto& t, const std::vector<int64_t>& at);

// Evaluates at import the subgraphs that compute shapes (Shape -> Gather ->
// Unsqueeze -> Concat -> Reshape, Range, ConstantOfShape, ...), now that the
// inputs' dimensions are bound: each node whose inputs are all known becomes
// a Constant, and shape inference runs again, until nothing more folds
// (import_onnx_fold.cpp). Returns how many nodes were folded; what a fold
// assumed of the inputs (RoBERTa's ids hold no padding token) goes to
// `assumptions`, for the notes.
int fold_shape_subgraphs(onnx::ModelProto& model, const std::string& src,
                         std::vector<std::string>* assumptions = nullptr);

// Rewrites each Einsum of two tensors that is a batched matrix product as a
// MatMul and the Transposes it needs (import_onnx_einsum.cpp), before shape
// inference; returns how many.
int lower_einsum_matmuls(onnx::ModelProto& model);

// Rewrites each Loop that is torch.repeat_interleave of a constant count
// along the last axis (GPT-J's and CodeGen's rotary sin and cos) as
// Unsqueeze, Expand and Reshape (import_onnx_loops.cpp), before shape
// inference, which a subgraph stops; returns how many.
int lower_repeat_interleave_loops(onnx::ModelProto& model);

const onnx::AttributeProto* attr(const onnx::NodeProto& n, const char* name);
int64_t attr_int(const onnx::NodeProto& n, const char* name, int64_t def);
double attr_float(const onnx::NodeProto& n, const char* name, double def);
// A HardSigmoid with PyTorch's alpha 1/6 and beta 1/2 (ONNX's defaults are 0.2, 0.5).
bool is_torch_hardsigmoid(const onnx::NodeProto& n);
std::vector<int64_t> attr_ints(const onnx::NodeProto& n, const char* name);
std::string attr_text(const onnx::NodeProto& n, const char* name, const std::string& def);
std::string label(const onnx::NodeProto& n, int index);

// Our own checks before libonnx's shape inference (import_onnx_check.cpp):
// throws dlplan::Error for a malformed graph; returns why inference must not
// run on it (a subgraph, no opset), or "" when it may.
std::string check_before_inference(const onnx::ModelProto& model, const std::string& src);
// The model's opset of the default ONNX domain; -1 when it declares none.
int64_t default_opset(const onnx::ModelProto& model);
bool is_float(int32_t elem_type);

}  // namespace dlplan::onnx_import
