// The named zoo: each entry's configuration and where its numbers come from
// (models/README.md lists the same with parameter counts).
#include "dlplan/zoo.hpp"

#include <cmath>
#include <functional>
#include <utility>

namespace dlplan::zoo {
namespace {

struct Model {
  ZooEntry entry;
  std::function<Json()> build;
};

Json gpt2(const char* name, int layers, int hidden, int heads) {
  GptConfig c;
  c.name = name;
  c.layers = layers;
  c.hidden = hidden;
  c.heads = heads;
  return build_gpt(c);
}

Json resnet(const char* name, std::vector<int> blocks, bool bottleneck) {
  ResnetConfig c;
  c.name = name;
  c.blocks = std::move(blocks);
  c.bottleneck = bottleneck;
  return build_resnet(c);
}

Json vit_b16() {
  VitConfig c;
  c.name = "vit-b16";
  return build_vit(c);
}

Json bert_base() {
  BertConfig c;
  c.name = "bert-base";
  return build_bert(c);
}

Json llama2_7b() {
  LlamaConfig c;
  c.name = "llama2-7b";
  return build_llama(c);
}

// Llama-2-70B: 80 layers, hidden 8192, 64 heads with 8 key/value heads (GQA),
// SwiGLU 28672, vocab 32000. Also the size the planning benchmarks use.
Json llama2_70b() {
  LlamaConfig c;
  c.name = "llama2-70b";
  c.layers = 80;
  c.hidden = 8192;
  c.heads = 64;
  c.kv_heads = 8;
  c.intermediate = 28672;
  return build_llama(c);
}

Json tiny_mlp() {
  MlpConfig c;
  c.name = "tiny-mlp";
  return build_mlp(c);
}

Json tiny_cnn() {
  CnnConfig c;
  c.name = "tiny-cnn";
  return build_cnn(c);
}

Json tiny_vit() {
  VitConfig c;
  c.name = "tiny-vit";
  c.image = 16;
  c.patch = 4;
  c.layers = 2;
  c.hidden = 64;
  c.heads = 4;
  c.mlp_hidden = 128;
  c.classes = 10;
  return build_vit(c);
}

Json tiny_gpt() {
  GptConfig c;
  c.name = "tiny-gpt";
  c.layers = 2;
  c.hidden = 64;
  c.heads = 4;
  c.vocab = 256;
  c.context = 64;
  c.dropout = 0.0;  // deterministic, so executor parity tests compare exactly
  return build_gpt(c);
}

// T5 v1.1 small (google/t5-v1_1-small): 8 + 8 blocks, d_model 512, 6 heads
// of 64, gated-GELU feed-forward 1024, vocab 32128, 32 buckets up to 128,
// dropout 0.1, untied head; encoder and decoder sequences of 512.
Json t5_v1_1_small() {
  T5Config c;
  c.name = "t5-v1_1-small";
  return build_t5(c);
}

// A T5 small enough for the executor's parity tests: 2 + 2 blocks, d_model
// 64, 4 heads of 16, v1.0's ReLU feed-forward of 128 and tied head, vocab
// 256, 16 buckets up to 32; encoder 24 and decoder 16 tokens, no dropout.
Json tiny_t5() {
  T5Config c;
  c.name = "tiny-t5";
  c.layers = 2;
  c.decoder_layers = 2;
  c.d_model = 64;
  c.d_kv = 16;
  c.heads = 4;
  c.d_ff = 128;
  c.vocab = 256;
  c.enc_len = 24;
  c.dec_len = 16;
  c.buckets = 16;
  c.max_distance = 32;
  c.gated = false;
  c.act = "relu";
  c.tie_head = true;  // v1.0's: the shared table, the decoder's output scaled by 64^-1/2
  c.dropout = 0.0;
  return build_t5(c);
}

// Qwen2-7B (Qwen/Qwen2-7B): 28 layers, hidden 3584, 28 heads with 4
// key/value heads, biases on q, k, v; SwiGLU 18944, vocab 152064, rope_theta
// 1e6, untied head. Sequence length 4096 (its config allows 131072).
Json qwen2_7b() {
  LlamaConfig c;
  c.name = "qwen2-7b";
  c.layers = 28;
  c.hidden = 3584;
  c.heads = 28;
  c.kv_heads = 4;
  c.intermediate = 18944;
  c.vocab = 152064;
  c.rms_eps = 1e-6;
  c.rope_theta = 1e6;
  c.qkv_bias = true;
  return build_llama(c);
}

// Mixtral-8x7B (mistralai/Mixtral-8x7B-v0.1): the Mistral-7B layout (32
// layers, hidden 4096, 32 heads with 8 key/value heads, vocab 32000,
// rope_theta 1e6, untied head) with each MLP a mixture of 8 SwiGLU experts of
// width 14336, top-2 per token; the moe op's capacity factor 1.25 (its
// config trains dropless: --capacity-factor 4). Sequence length 4096 (its
// config allows 32768).
Json mixtral_8x7b() {
  LlamaConfig c;
  c.name = "mixtral-8x7b";
  c.layers = 32;
  c.hidden = 4096;
  c.heads = 32;
  c.kv_heads = 8;
  c.intermediate = 14336;
  c.vocab = 32000;
  c.rms_eps = 1e-5;
  c.rope_theta = 1e6;
  c.experts = 8;
  c.top_k = 2;
  return build_llama(c);
}

// gemma-7b (google/gemma-7b): 28 layers, hidden 3072, 16 heads of 256
// (4096 wide), GeGLU 24576 (hidden_act gelu), vocab 256000, embeddings
// scaled by sqrt(3072), RMSNorm x (1 + w), tied head, pad token 0; sequence
// length 8192.
Json gemma_7b() {
  LlamaConfig c;
  c.name = "gemma-7b";
  c.layers = 28;
  c.hidden = 3072;
  c.heads = 16;
  c.head_dim = 256;
  c.intermediate = 24576;
  c.vocab = 256000;
  c.context = 8192;
  c.rms_eps = 1e-6;
  c.tie_head = true;
  c.mlp_act = "gelu";
  c.embed_scale = std::sqrt(3072.0);
  c.norm_offset = 1.0;
  c.padding_idx = 0;
  return build_llama(c);
}

// phi-2 (microsoft/phi-2): 32 parallel blocks, hidden 2560, 32 heads,
// partial rotary 0.4 (32 of 80 dims), GELU(tanh) MLP 10240, vocab 51200,
// resid_pdrop 0.1, lm_head with a bias; sequence length 2048.
Json phi_2() {
  PhiConfig c;
  c.name = "phi-2";
  c.dropout = 0.1;
  return build_phi(c);
}

const std::vector<Model>& models() {
  static const std::vector<Model> all = {
      {{"vit-b16", "vit", "torchvision.models.vit_b_16 (patch 16, 12 layers, hidden 768, 12 heads, mlp 3072)"},
       vit_b16},
      {{"resnet18", "resnet", "torchvision.models.resnet18 (BasicBlock, layers [2, 2, 2, 2])"},
       [] { return resnet("resnet18", {2, 2, 2, 2}, false); }},
      {{"resnet50", "resnet", "torchvision.models.resnet50 (Bottleneck, layers [3, 4, 6, 3])"},
       [] { return resnet("resnet50", {3, 4, 6, 3}, true); }},
      {{"gpt2", "gpt", "Hugging Face gpt2 (GPT2LMHeadModel: n_layer 12, n_embd 768, n_head 12, vocab 50257, n_positions 1024)"},
       [] { return gpt2("gpt2", 12, 768, 12); }},
      {{"gpt2-medium", "gpt", "Hugging Face gpt2-medium (GPT2LMHeadModel: n_layer 24, n_embd 1024, n_head 16, vocab 50257, n_positions 1024)"},
       [] { return gpt2("gpt2-medium", 24, 1024, 16); }},
      {{"bert-base", "bert", "Hugging Face bert-base-uncased (BertModel + pooler) with a 2-class BertForSequenceClassification head"},
       bert_base},
      {{"llama2-7b", "llama", "Hugging Face meta-llama/Llama-2-7b-hf (LlamaForCausalLM: 32 layers, hidden 4096, 32 heads, intermediate 11008, vocab 32000)"},
       llama2_7b},
      {{"llama2-70b", "llama", "Hugging Face meta-llama/Llama-2-70b-hf (LlamaForCausalLM: 80 layers, hidden 8192, 64 heads, 8 key/value heads, intermediate 28672, vocab 32000)"},
       llama2_70b},
      {{"qwen2-7b", "llama", "Hugging Face Qwen/Qwen2-7B (Qwen2ForCausalLM: 28 layers, hidden 3584, 28 heads, 4 key/value heads, q/k/v biases, intermediate 18944, vocab 152064)"},
       qwen2_7b},
      {{"mixtral-8x7b", "llama", "Hugging Face mistralai/Mixtral-8x7B-v0.1 (MixtralForCausalLM: 32 layers, hidden 4096, 32 heads, 8 key/value heads, 8 experts of 14336, top-2, vocab 32000)"},
       mixtral_8x7b},
      {{"gemma-7b", "llama", "Hugging Face google/gemma-7b (GemmaForCausalLM: 28 layers, hidden 3072, 16 heads of 256, GeGLU 24576, vocab 256000, tied)"},
       gemma_7b},
      {{"phi-2", "phi", "Hugging Face microsoft/phi-2 (PhiForCausalLM: 32 parallel blocks, hidden 2560, 32 heads, partial rotary 0.4, intermediate 10240, vocab 51200)"},
       phi_2},
      {{"t5-v1_1-small", "t5", "Hugging Face google/t5-v1_1-small (T5ForConditionalGeneration: 8 + 8 blocks, d_model 512, 6 heads of 64, gated-GELU 1024, vocab 32128, untied head)"},
       t5_v1_1_small},
      {{"tiny-mlp", "mlp", "dlplan test model: 64 -> 128 -> 128 -> 10"}, tiny_mlp},
      {{"tiny-cnn", "cnn", "dlplan test model: 3x16x16, conv widths 16, 32, 10 classes"}, tiny_cnn},
      {{"tiny-vit", "vit", "dlplan test model: vit_b_16 layout at 16x16, patch 4, 2 layers, hidden 64, 4 heads"},
       tiny_vit},
      {{"tiny-gpt", "gpt", "dlplan test model: GPT-2 layout, 2 layers, hidden 64, 4 heads, vocab 256, context 64"},
       tiny_gpt},
      {{"tiny-t5", "t5", "dlplan test model: T5 layout, 2 + 2 blocks, d_model 64, 4 heads, ReLU 128, vocab 256, 24 -> 16 tokens"},
       tiny_t5},
  };
  return all;
}

}  // namespace

const std::vector<ZooEntry>& zoo_entries() {
  static const std::vector<ZooEntry> entries = [] {
    std::vector<ZooEntry> out;
    for (const auto& m : models()) out.push_back(m.entry);
    return out;
  }();
  return entries;
}

std::optional<Json> zoo_model(std::string_view name) {
  for (const auto& m : models())
    if (m.entry.name == name) return m.build();
  return std::nullopt;
}

}  // namespace dlplan::zoo
