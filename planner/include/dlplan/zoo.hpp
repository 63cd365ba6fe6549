// The model zoo: C++ builders for the model families dlplan ships.
// Each builder returns the model as IR JSON (DESIGN.md, "Model IR"), so the
// zoo's files in models/ and a user's own `dlplan model gpt --layers ...` come
// from the same code. Parameter counts equal the frameworks' own exactly
// (torchvision, Hugging Face); tests/planner/zoo_test.cpp asserts them.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlplan::zoo {

using Json = nlohmann::ordered_json;

// GPT-2 style decoder: learned positions, pre-LN, GELU(tanh) MLP, tied head.
struct GptConfig {
  std::string name = "gpt";
  int layers = 12;
  int hidden = 768;
  int heads = 12;
  int vocab = 50257;
  int context = 1024;      // position table length and default sequence length
  int mlp_hidden = 0;      // 0: 4 * hidden
  double dropout = 0.1;    // embedding, attention-probability and residual dropout
  bool tie_head = true;    // lm_head shares wte's weight
  bool fused_loss = false; // cross_entropy keeps logits + lse, not fp32 probabilities (flash-attn's fused loss)
  bool eager = false;      // gelu_new op by op, as PyTorch's eager mode runs HF's Python (--fusion eager)
};
Json build_gpt(const GptConfig& c);

// Llama style decoder: RMSNorm, rotary positions, SwiGLU MLP, no biases, GQA.
// Its relatives differ in a few knobs: Qwen2 has biases on q, k and v;
// Gemma a GeGLU MLP, embeddings scaled by sqrt(hidden) and RMSNorm's 1 + w.
struct LlamaConfig {
  std::string name = "llama";
  int layers = 32;
  int hidden = 4096;
  int heads = 32;
  int kv_heads = 0;        // 0: heads (no grouped-query attention)
  int head_dim = 0;        // 0: hidden / heads
  int intermediate = 11008;
  int vocab = 32000;
  int context = 4096;      // default sequence length
  double rms_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_head = false;
  bool qkv_bias = false;            // Qwen2: biases on q, k, v (not o)
  std::string mlp_act = "silu";     // the gate's activation: silu, gelu or gelu_tanh (Gemma)
  double embed_scale = 1.0;         // Gemma: sqrt(hidden)
  double norm_offset = 0.0;         // Gemma: RMSNorm scales by 1 + w
  int padding_idx = -1;             // HF's pad_token_id: its embedding row gets no gradient (-1: none)
  // Mixtral: the MLP is a mixture of `experts` SwiGLU experts of width
  // `intermediate`, top_k per token (0: a dense MLP). capacity_factor: the
  // experts', tokens over an expert's capacity are dropped (0: dropless,
  // every token fits every expert, as Mixtral trains).
  int experts = 0;
  int top_k = 2;
  double capacity_factor = 1.25;
  bool eager = false;  // RMSNorm op by op, as PyTorch's eager mode runs HF's Python (--fusion eager)
};
Json build_llama(const LlamaConfig& c);

// Phi as Hugging Face's PhiForCausalLM ("microsoft/phi-2"): one LayerNorm per
// block feeding attention and MLP side by side (their outputs are added to
// the residual together), partial rotary, biases everywhere, GELU(tanh) MLP,
// lm_head with a bias.
struct PhiConfig {
  std::string name = "phi";
  int layers = 32;
  int hidden = 2560;
  int heads = 32;
  int kv_heads = 0;              // 0: heads
  int intermediate = 10240;
  int vocab = 51200;
  int context = 2048;
  double partial_rotary = 0.4;   // rotary_dim = partial_rotary x head_dim
  double rope_theta = 10000.0;
  double ln_eps = 1e-5;
  double dropout = 0.0;          // resid_pdrop, after attention and after the MLP
  double embd_dropout = 0.0;     // embd_pdrop, after the embedding
  double attn_dropout = 0.0;     // attention_dropout, on the probabilities
  bool tie_head = false;
  bool eager = false;            // gelu_new op by op (--fusion eager)
};
Json build_phi(const PhiConfig& c);

// T5 as Hugging Face's T5ForConditionalGeneration: an encoder and a decoder
// of pre-norm blocks (RMSNorm, T5LayerNorm), attention without biases and
// without the 1/sqrt(d_kv) factor (T5 folds it into initialisation), one
// relative position bias per stack computed in its first block and added in
// every block (bidirectional in the encoder, to earlier keys only in the
// decoder), cross attention from every decoder block to the encoder's
// output, and a feed-forward of ReLU (T5 v1.0) or gated GELU(tanh) (v1.1,
// flan-t5). Inputs input_ids [enc_len], decoder_input_ids [dec_len] and
// labels [dec_len]. A tied head (v1.0) reads the shared table and scales the
// decoder's output by d_model^-1/2 first; v1.1's is untied.
struct T5Config {
  std::string name = "t5";
  int layers = 8;            // num_layers (encoder)
  int decoder_layers = 8;    // num_decoder_layers
  int d_model = 512;
  int d_kv = 64;             // head width; heads x d_kv is the attention's inner width
  int heads = 6;
  int d_ff = 1024;
  int vocab = 32128;
  int enc_len = 512;         // encoder sequence length
  int dec_len = 512;         // decoder sequence length
  int buckets = 32;          // relative_attention_num_buckets
  int max_distance = 128;    // relative_attention_max_distance
  bool gated = true;         // feed_forward_proj "gated-ACT" (v1.1: gated-gelu) or "ACT" (v1.0: relu)
  std::string act = "gelu_tanh";  // relu, gelu, gelu_tanh (HF gelu_new) or silu
  bool tie_head = false;     // tie_word_embeddings
  double dropout = 0.1;      // dropout_rate: embeddings, attention probabilities, every residual branch
  double eps = 1e-6;         // layer_norm_epsilon
  bool eager = false;        // T5LayerNorm and gelu_new op by op (--fusion eager)
};
Json build_t5(const T5Config& c);

// BERT encoder (post-LN) with token types and pooler, plus a classifier head.
struct BertConfig {
  std::string name = "bert";
  int layers = 12;
  int hidden = 768;
  int heads = 12;
  int intermediate = 3072;
  int vocab = 30522;
  int max_positions = 512;
  int type_vocab = 2;
  int context = 512;       // default sequence length
  int classes = 2;         // classifier head on the pooled output; must be > 0 (the loss needs logits)
  double dropout = 0.1;
  double ln_eps = 1e-12;
  int padding_idx = -1;    // HF's pad_token_id: its word-embedding row gets no gradient (-1: none)
};
Json build_bert(const BertConfig& c);

// Vision Transformer as torchvision's vit_b_16: conv patchify, class token,
// learned positions, pre-LN encoder, head on the class token.
struct VitConfig {
  std::string name = "vit";
  int image = 224;
  int channels = 3;
  int patch = 16;
  int layers = 12;
  int hidden = 768;
  int heads = 12;
  int mlp_hidden = 3072;
  int classes = 1000;
  double dropout = 0.0;
  double ln_eps = 1e-6;
};
Json build_vit(const VitConfig& c);

// ResNet as torchvision: basic blocks (resnet18/34) or bottlenecks (50/101/152).
struct ResnetConfig {
  std::string name = "resnet";
  std::vector<int> blocks = {2, 2, 2, 2};
  bool bottleneck = false;
  int width = 64;          // stem channels; stage s has width * 2^s (x4 for bottleneck outputs)
  int classes = 1000;
  int image = 224;
  int channels = 3;
};
Json build_resnet(const ResnetConfig& c);

// Small fully connected classifier on a feature vector.
struct MlpConfig {
  std::string name = "mlp";
  int features = 64;
  std::vector<int> hidden = {128, 128};
  int classes = 10;
};
Json build_mlp(const MlpConfig& c);

// Small convolutional classifier with batchnorm.
struct CnnConfig {
  std::string name = "cnn";
  int image = 16;
  int channels = 3;
  std::vector<int> widths = {16, 32};
  int classes = 10;
  // Before each block's convolution but the first's, MobileNetV2's
  // separable pair: a depthwise convolution (groups = channels; 3x3, 5x5,
  // 7x7 in turn; the first with stride 2, in place of the pooling before
  // it), batchnorm, ReLU6 and a pointwise 1x1 convolution.
  bool depthwise = false;
};
Json build_cnn(const CnnConfig& c);

// The named zoo ("vit-b16", "gpt2", "tiny-gpt", ...): names in a stable order,
// and the IR of one by name (nullopt when unknown).
struct ZooEntry {
  std::string name;
  std::string family;      // gpt, llama, bert, vit, resnet, mlp, cnn
  std::string source;      // where its numbers come from
};
const std::vector<ZooEntry>& zoo_entries();
std::optional<Json> zoo_model(std::string_view name);

}  // namespace dlplan::zoo
