// One declaration per op, read by the planner's cost models and (later) by the
// executor: attributes and their defaults, shape inference, parameters,
// FLOPs, and the tensors the op keeps from forward for backward.
//
// Everything here is per sample; the step walk multiplies by the micro-batch
// (except tensors marked per_batch, such as BatchNorm's batch statistics).
#pragma once

#include "dlplan/ir.hpp"

#include <cstdint>
#include <string>
#include <optional>
#include <vector>

namespace dlplan {

// Element types of declared tensors. `compute` is the activation dtype of the
// plan: bf16 under bf16-mixed, f32 under fp32. i64: PyTorch's indices (max
// pooling under --fusion eager).
enum class Elem { compute, f32, i32, i64, u8 };
// Bytes of one element, `compute_bytes` being the plan's activation dtype's.
inline int64_t elem_bytes(Elem e, int64_t compute_bytes) {
  switch (e) {
    case Elem::compute: return compute_bytes;
    case Elem::u8: return 1;
    case Elem::i64: return 8;
    case Elem::f32:
    case Elem::i32: return 4;
  }
  return 4;
}

// A tensor the op keeps for backward.
//   input:  the op's input `input` (shared: counted once however many ops keep it)
//   output: the op's own output (shared likewise)
//   own:    a tensor only this op creates (norm statistics, probabilities, masks)
struct SavedTensor {
  enum class Ref { input, output, own };
  Ref ref = Ref::own;
  int input = -1;          // with Ref::input
  std::string what;        // with Ref::own: "probs", "mask", "mean", ...
  int64_t numel = 0;       // with Ref::own: elements per sample (per batch if per_batch)
  Elem elem = Elem::compute;
  bool per_batch = false;
};

// A temporary that lives only while the op's forward or backward runs.
struct TempTensor {
  std::string what;
  int64_t numel = 0;             // per sample (per batch if per_batch)
  Elem elem = Elem::compute;
  bool per_batch = false;        // one buffer reused sample by sample (im2col)
};

struct ParamDecl {
  std::string suffix;  // "weight", "bias", "q.weight", ...
  int64_t numel = 0;
  bool weight_decay = false;
  Shape shape;         // PyTorch's layout (linear [out, in], conv [out, in/groups, kh, kw]); numel elements
  bool adapter = false;  // a LoRA adapter (lora_A, lora_B)
};

struct OpDecl {
  std::vector<ParamDecl> params;
  std::vector<ParamDecl> buffers;      // fp32, not trained (BN running stats)
  std::vector<SavedTensor> saved;
  std::vector<TempTensor> fwd_temps;
  std::vector<TempTensor> bwd_temps;
  double fwd_flops = 0;                // per sample
  double bwd_flops = 0;                // per sample (input and weight gradients)
  int gemms = 0;                       // GEMM calls in forward (each gets the library workspace)
  // conv2d on the cpu device in fp32: oneDNN runs it, and its temporaries are
  // oneDNN's buffers (cpu_conv.hpp) rather than im2col's columns. Set by the
  // step program, which knows the device, the micro-batch and the gradients.
  bool onednn_conv = false;
};

struct DeclOptions {
  bool flash_attention = false;  // keep log-sum-exp instead of probabilities
};

// Validates `n`'s attributes against the op's schema, fills defaults, and
// infers the output tensor. Throws dlplan::Error naming the node.
void check_and_fill_attrs(Node& n, const nlohmann::json& raw, const std::string& where);
// Derived defaults (max_len, kv_heads, head_dim, pool stride) are filled here.
TensorInfo infer_output(const Model& m, Node& n, const std::string& where);
// The number of inputs an op takes; kVariadic: one or more (concat).
constexpr int kVariadic = -1;
int op_input_count(OpKind op);
bool op_from_string(const std::string& s, OpKind& out);
std::vector<std::string> op_names();

// The declaration of `n` in model `m` (shapes already inferred).
OpDecl declare(const Model& m, const Node& n, const DeclOptions& opt = {});

// LoRA adapters (Hu et al. 2021) a node carries: beside the weight W [out, in]
// of a linear node (attribute lora_rank), or of attention's q, k, v, o
// projections named in lora_targets, A [r, in] and B [out, r] with
// y = x W^T + b + s (x A^T) B^T, s = alpha / r (attribute lora_scale). Set by
// apply_fine_tuning. Their parameters follow the node's own, A then B per
// adapter, in q, k, v, o order.
struct LoraAdapter {
  std::string prefix;   // "" for a linear node, "q." ... "o." for attention
  int64_t in = 0, out = 0, rows = 0;  // rows: of x per sample
  int64_t rank = 0;
  bool reads_context = false;  // attention's o: its input is the context, not x
  double scale = 1;            // alpha / r
};
std::vector<LoraAdapter> lora_adapters(const Model& m, const Node& n);

// What backward must produce for one node of a plan with frozen parameters:
// a gradient for each input, and for the node's own (base) parameters;
// its LoRA adapters always train.
struct GradNeeds {
  std::vector<bool> inputs;
  bool base = true;
};
// Drops from `d` what backward then needs no longer, as PyTorch's autograd
// saves a tensor only for a gradient it will compute: a linear, convolution
// or embedding with a frozen weight keeps no input (dX = dY W needs only W);
// mul keeps an operand only for the other's gradient; attention with frozen
// projections keeps neither its input nor its context (they only serve the
// weight gradients). A node whose inputs need no gradient and whose
// parameters are all frozen has no backward at all: it keeps nothing. The
// backward FLOPs lose the GEMMs that are not run.
void restrict_to_needs(const Model& m, const Node& n, const GradNeeds& g, OpDecl& d);
bool needs_backward(const GradNeeds& g, const OpDecl& d);

// An attention node's shape and options, read in one place for its
// declaration and for every backend's kernels.
struct AttentionShape {
  int64_t T = 0, D = 0;             // tokens, model width
  int64_t Tk = 0, Dm = 0;           // keys and the width they are projected from: T and D but for cross attention
  int64_t H = 0, KV = 0, hd = 0;    // query heads, key/value heads, head width
  bool causal = false, rope = false;
  bool cross = false;               // k and v from input 1, the memory [Tk, Dm]
  int bias_input = -1;              // the input holding the position bias [H, T, Tk], or -1
  double scale = 0;                 // the scores' factor (1/sqrt(hd) unless given)
  bool qkv_bias = false, out_bias = false;  // biases on q, k, v (Qwen2: these alone) and on o
  int64_t rotary_dim = 0;                   // leading dims of each head RoPE rotates (0 without rope)
  double dropout = 0, rope_theta = 10000;
  int64_t group() const { return H / KV; }  // query heads per key/value head (GQA)
  // Parameters in declaration order: the q, k, v, o weights, then the biases
  // present (q, k, v if qkv_bias, o if out_bias). The index of projection
  // p's bias (0 q, 1 k, 2 v, 3 o), or -1 without one; and how many there are.
  int bias_param(int p) const {
    if (p < 3) return qkv_bias ? 4 + p : -1;
    return out_bias ? (qkv_bias ? 7 : 4) : -1;
  }
  int own_params() const { return 4 + (qkv_bias ? 3 : 0) + (out_bias ? 1 : 0); }
};
AttentionShape attention_shape(const Model& m, const Node& n);
// A mixture of experts (Mixtral's MixtralSparseMoeBlock) is 2 + E nodes
// (ops_schema.cpp says what each computes): moe_router, x [T, D] -> the
// router's softmax [T, E] (parameter weight [E, D], Mixtral's `gate`); one
// moe_expert per expert e, (x, probabilities) -> its C places [C, D], place
// j holding the j-th token routed to it (parameters w1 [F, D], w2 [D, F],
// w3 [F, D]: Mixtral's MixtralBlockSparseTop2MLP, y = w2(silu(w1 x) * w3 x));
// and moe_combine, (probabilities, the E experts' places) -> [T, D]. Experts
// and combine find the same routing from the probabilities: top_k experts
// per token, C places per expert. Being nodes, experts can be ZeRO-3 units
// of their own (with_expert_units).
struct MoeRouting {
  int64_t T = 0, E = 0, k = 0, C = 0;
  bool normalize = true;  // moe_combine: the chosen gates are renormalised
};
MoeRouting moe_routing(const Model& m, const Node& n);  // n: a moe_expert or moe_combine node
// T5's bucket of a key's offset j - i from its query (HF T5Attention.
// _relative_position_bucket, in its float32 arithmetic): with bidirectional,
// half the buckets for later keys; offsets below half of the (remaining)
// buckets exactly, larger ones logarithmically up to max_distance, the last
// bucket beyond. Without bidirectional, later keys share bucket 0.
int64_t relative_position_bucket(int64_t offset, int64_t buckets, int64_t max_distance, bool bidirectional);
// Fixed sinusoidal positions (pos_embedding with `sinusoidal`): the value at
// column `column` of position `position` in a table `dim` wide, pair i's
// angle being position x exp(-i step). "halves" puts pair i's sine at column
// i and its cosine at dim/2 + i (fairseq's and Hugging Face XGLM's
// SinusoidalPositionalEmbedding); "interleaved" puts them at 2i and 2i + 1
// (Vaswani et al. 2017, section 3.5; PyTorch's tutorial PositionalEncoding).
// Vaswani's step is ln(10000) / (dim/2); fairseq's ln(10000) / (dim/2 - 1).
double sinusoidal_position(bool interleaved, double step, int64_t position, int64_t column, int64_t dim);
// The inverse (sinusoidal.cpp): the layout, first position and step of a
// table [T, D] (row-major) whose every value is sinusoidal_position's to fp32
// rounding, for a first position up to 64; nothing for any other table.
struct SinusoidalPositions {
  bool interleaved = false;
  int64_t offset = 0;
  double step = 0;
};
std::optional<SinusoidalPositions> match_sinusoidal_positions(const std::vector<double>& table, int64_t T, int64_t D);
// Whether `rows` [R, D] (row-major) hold sp's positions offset + first ..
// offset + first + R - 1, to fp32 rounding: the rest of a table too large to
// hand to match_sinusoidal_positions whole, checked a block of rows at a time.
bool holds_sinusoidal_positions(const std::vector<double>& rows, int64_t first, int64_t D,
                                const SinusoidalPositions& sp);
// Whether a declaration is the flash form: it keeps the log-sum-exp, not the probabilities.
bool keeps_log_sum_exp(const OpDecl& d);
// The gate blocks of a recurrent op's weights: lstm 4 (i, f, g, o), gru 3
// (r, z, n), rnn 1.
int64_t recurrent_gates(OpKind op);

}  // namespace dlplan
