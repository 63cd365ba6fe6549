// Files written by torch.onnx.export itself (tests/fixtures/exports, made by
// make_exports.py with Debian's PyTorch 1.13, torchvision 0.14 and
// transformers 4.36.2), held to what PyTorch says of them in
// reference.json: the parameter count, and the bytes autograd saves for
// backward in one forward + loss (fp32, batch 1).
//
// Issue 12 (plan any model PyTorch exports) is open: one of these files does
// not import yet (Swin). kToday records what the importer does with each file now:
// the files that import, and for the rest the start of the error. A change
// that makes a file import, or stops one from importing, fails here until the
// table says so, which keeps the count in the closing notes honest. Every
// file that imports must have PyTorch's exact parameter count; its
// activations are printed beside PyTorch's (the 5 % goal is issue 12's).
#include "error_of.hpp"

#include "dlplan/error.hpp"
#include "dlplan/hardware.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/ops.hpp"
#include "dlplan/zoo.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/step_walk.hpp"
#include "dlplan/training.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>

using namespace dlplan;

namespace {

std::string exports_dir() { return DLPLAN_SOURCE_DIR "/tests/fixtures/exports/"; }

const nlohmann::json& reference() {
  static const nlohmann::json r = nlohmann::json::parse(std::ifstream(exports_dir() + "reference.json"));
  return r;
}

// What the importer does with each file today: "imports", or the start of
// the message it refuses the file with.
const std::map<std::string, std::string> kToday = {
    {"bert-base-uncased-opset17.onnx", "imports"},
    {"convnext_tiny-opset13.onnx", "imports"},
    {"convnext_tiny-opset17.onnx", "imports"},
    {"densenet121-opset17.onnx", "imports"},
    {"efficientnet_b0-opset17.onnx", "imports"},
    {"gpt2-opset17.onnx", "imports"},
    {"mnasnet0_5-opset17.onnx", "imports"},
    {"mobilenet_v2-opset17.onnx", "imports"},
    {"mobilenet_v3_small-opset13.onnx", "imports"},
    {"mobilenet_v3_small-opset17.onnx", "imports"},
    {"regnet_y_400mf-opset17.onnx", "imports"},
    {"resnet18-opset13.onnx", "imports"},
    {"resnet18-opset17.onnx", "imports"},
    {"resnet50-opset17.onnx", "imports"},
    {"resnext50_32x4d-opset17.onnx", "imports"},
    {"shufflenet_v2_x1_0-opset17.onnx", "imports"},
    {"squeezenet1_1-opset17.onnx", "imports"},
    // (its window attention plans through the generic ops: the attention
    // pattern would lose the relative position table's parameters)
    {"swin_t-opset17.onnx", "imports"},
    // ALBERT's one layer at both depths: the second applies the first's
    // parameters (`shares`), so they count once (PyTorch: 288,424; one set per
    // reader would be 486,696).
    {"tiny-albert-opset17.onnx", "imports"},
    {"tiny-bert-opset13.onnx", "imports"},
    {"tiny-gpt-neox-opset17.onnx", "imports"},
    {"tiny-opt-opset17.onnx", "imports"},
    {"tiny-bloom-opset17.onnx", "imports"},
    {"tiny-roberta-opset17.onnx", "imports"},
    {"tiny-gpt-bigcode-opset17.onnx", "imports"},
    // GPT-J: its rotary tables repeat_interleave'd by a Loop (rewritten before
    // shape inference), gathered and split at import, its rotation the IR's
    // rope with interleaved pairs on [T, H, d]
    {"tiny-gptj-opset17.onnx", "imports"},
    {"tiny-bert-opset17.onnx", "imports"},
    {"tiny-gpt2-opset17.onnx", "imports"},
    {"tiny-hf-vit-opset17.onnx", "imports"},
    {"tiny-llama-opset17.onnx", "imports"},
    {"tiny-mistral-opset17.onnx", "imports"},
    {"tiny-qwen2-opset17.onnx", "imports"},
    {"tiny-phi-opset17.onnx", "imports"},
    {"tiny-gemma-opset17.onnx", "imports"},
    {"tiny-mlp-gelu-tanh-opset17.onnx", "imports"},
    {"tiny-mlp-glu-opset17.onnx", "imports"},
    {"tiny-mlp-arith-opset17.onnx", "imports"},
    // torch.repeat_interleave(h, 2, dim=1) over the sequence (Funnel's
    // decoder): its Loop rewritten, the broadcast an upsample of a view
    {"tiny-upsample-repeat-opset17.onnx", "imports"},
    // T5's relative position bias written by a user: 16 unidirectional
    // buckets computed in the graph (a log, truncated), the table read at them
    {"tiny-relative-bias-opset17.onnx", "imports"},
    // Hugging Face's Swin with its stochastic depth (drop_path: a
    // RandomUniformLike a block), and DeiT's two learned tokens
    {"tiny-hf-swin-opset17.onnx", "imports"},
    {"tiny-hf-deit-opset17.onnx", "imports"},
    // Hugging Face's BEiT: Swin's relative index with three rows for the
    // class token, in every layer
    {"tiny-hf-beit-opset17.onnx", "imports"},
    // Hugging Face's MobileViT: attention within each patch position, the
    // positions folded into the batch, planned through the generic ops
    {"tiny-hf-mobilevit-opset17.onnx", "imports"},
    {"vgg11_bn-opset17.onnx", "imports"},
    {"vit_b_16-opset13.onnx", "imports"},
    {"vit_b_16-opset17.onnx", "imports"},
};

struct Outcome {
  std::optional<Model> model;
  std::string error;
};

Outcome import_file(const std::string& file, const nlohmann::json& ref, FusionMode fusion = FusionMode::engine) {
  ImportOptions o;
  o.micro_batch = 1;
  o.fusion = fusion;
  if (ref["options"].contains("sequence")) o.seq_len = ref["options"]["sequence"].get<int64_t>();
  try {
    return {import_onnx(exports_dir() + file, o), {}};
  } catch (const Error& e) {
    return {std::nullopt, e.what()};
  }
}

// Imported files whose activations are known to miss PyTorch's by more than
// 5 %, with the reason (docs/onnx.md).
const std::map<std::string, std::string> kKnownGaps = {
    {"vgg11_bn-opset17.onnx",
     "max-pool indices: int32 in dlplan's engine, int64 in PyTorch (-8.0 %; --fusion eager keeps PyTorch's: -0.1 %)"},
    {"shufflenet_v2_x1_0-opset17.onnx",
     "torch.chunk's halves are copies in dlplan's engine and views in PyTorch, so where a convolution keeps one half "
     "PyTorch keeps the whole tensor's storage alive (13 blocks), and max-pool indices (-8.2 %; -0.0 % under "
     "--fusion eager, which plans the halves as views and keeps PyTorch's pool indices)"},
    // Measured with make_exports.py's saved_bytes on tiny-gpt2 with each
    // block's NewGELUActivation replaced by nn.GELU(approximate="tanh"): PyTorch
    // then saves 1,709,068 bytes (with the one-byte dropout mask, buffers
    // excluded) instead of 2,495,548, and dlplan plans 1,708,544 (-0.03 %).
    // --fusion eager plans gelu_new's 8 ops: -0.0 % (the test below).
    {"gpt2-opset17.onnx",
     "GPT-2's gelu_new is 0.5 x (1 + tanh(...)) written out, which PyTorch's eager autograd runs as 8 ops keeping 4 "
     "tensors of [T, 4D]; dlplan fuses it into one gelu (tanh) keeping x, as its engine runs it (-33.0 %)"},
    {"tiny-gpt2-opset17.onnx", "as gpt2-opset17.onnx (-31.5 %; -0.03 % against PyTorch with a fused GELU)"},
    // Accounted for tiny-llama (T 64, D 128, 4 heads of 32, 2 KV heads) from
    // the tensors PyTorch's pack hook sees: each eager RMSNorm keeps x^2 (the
    // Pow's output, which mean's backward keeps in 1.13) and x * rsqrt(...)
    // (for the weight's gradient), 2 x 5 x [T, D] = 327,680 bytes; repeat_kv's
    // copies of k and v at 4 heads, 65,536; the cos and sin gathered per
    // layer, 32,768: 425,984 of the 426,004-byte gap.
    {"tiny-llama-opset17.onnx",
     "Hugging Face's RMSNorm, RoPE and repeat_kv are written out, and PyTorch's eager autograd keeps their "
     "intermediates; dlplan fuses them into rmsnorm and attention (rope, kv_heads) (-20.9 %)"},
    {"tiny-mistral-opset17.onnx", "as tiny-llama-opset17.onnx, with 1 KV head (-18.5 %)"},
    {"tiny-qwen2-opset17.onnx", "as tiny-llama-opset17.onnx; q, k and v have biases, o none (-20.9 %)"},
    {"tiny-phi-opset17.onnx", "gelu_new written out, as GPT-2's (-36.9 %)"},
    {"tiny-gemma-opset17.onnx", "RMSNorm written out, as tiny-llama's (-18.6 %)"},
    {"tiny-albert-opset17.onnx", "ALBERT's default hidden_act is gelu_new, written out as GPT-2's (-35.0 %)"},
    {"tiny-gptj-opset17.onnx", "GPT-J's activation is gelu_new, written out as GPT-2's (-37.3 %)"},
    // Accounted from PyTorch's pack hook (T 64, 4 heads of 32): v is a view of
    // the fused query_key_value output, and at batch 1 matmul's reshape of it
    // to [H, T, hd] is a view too, so bmm keeping it keeps that whole
    // [T, 3 H hd] storage (+65,536 bytes a layer). At batch 2 the reshape
    // copies, and PyTorch keeps 1,442,306 bytes a sample, which dlplan plans
    // within 0.3 % (checked below from reference.json).
    {"tiny-gpt-neox-opset17.onnx",
     "GPT-NeoX reads v as a view of its fused query_key_value output, and at batch 1 (only) matmul's reshape of v "
     "is a view too, so PyTorch's bmm keeps the whole projection's storage (-8.8 %; -0.3 % of PyTorch's bytes a "
     "sample at batch 2)"},
    {"squeezenet1_1-opset17.onnx",
     "max pooling keeps only its int32 indices in dlplan's engine; PyTorch keeps int64 indices and its input, which "
     "here is a concat output nothing else keeps (-17.9 %; --fusion eager keeps PyTorch's: -0.0 %)"},
};

// The most activation bytes the step holds at any moment, fp32, micro-batch 1:
// what autograd keeps at the end of forward + loss.
int64_t max_activations(const Model& m, AttentionImpl attention = AttentionImpl::math, int64_t micro_batch = 1) {
  Cluster c;
  c.device = find_device("h100-80g");
  c.device.alloc_granularity_bytes = 1;  // bytes as counted, not the allocator's blocks
  c.nodes = 1;
  c.gpus_per_node = 1;
  TrainingConfig t;
  t.strategy = Strategy::ddp;
  t.precision = Precision::fp32;
  t.micro_batch = micro_batch;
  t.attention = attention;
  return walk_step(m, c, t).max_each[static_cast<size_t>(Category::activations)];
}

// The IR is per sample: `file` imported with the batch bound to `batch`
// instead of 1 gives `m` again, node for node.
void expect_same_ir_at_batch(const Model& m, const std::string& file, ImportOptions o, int64_t batch) {
  o.micro_batch = batch;
  const Model other = import_onnx(exports_dir() + file, o);
  ASSERT_EQ(other.nodes.size(), m.nodes.size()) << file;
  for (size_t k = 0; k < m.nodes.size(); ++k) {
    EXPECT_EQ(other.nodes[k].attrs.values, m.nodes[k].attrs.values) << file << " " << m.nodes[k].name;
    EXPECT_EQ(other.tensor(other.nodes[k].output).shape, m.tensor(m.nodes[k].output).shape)
        << file << " " << m.nodes[k].name;
  }
}

}  // namespace

TEST(RealExports, TheFixturesAreWhatTheScriptWrote) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto& r = reference();
  EXPECT_EQ(r["torch"], "1.13.0a0");
  EXPECT_GE(r["files"].size(), 27u);
  for (const auto& [file, ref] : r["files"].items()) {
    EXPECT_TRUE(std::ifstream(exports_dir() + file).good()) << file;
    EXPECT_EQ(kToday.count(file), 1u) << file << " is missing from kToday";
  }
  for (const auto& [file, status] : kToday) EXPECT_TRUE(r["files"].contains(file)) << file << " has no reference";
}

TEST(RealExports, ImportOutcomesAreTheRecordedOnesAndCountsExact) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  int imported = 0;
  // PyTorch's figure is the one with dropout keeping a one-byte mask, as
  // PyTorch does on a GPU and dlplan's engines do; on the CPU, PyTorch 1.13
  // keeps a float32 noise tensor instead (printed beside it; make_exports.py).
  std::string table = fmt::format("{:36s} {:>12s} {:>12s} {:>12s} {:>8s} {:>12s}\n", "file", "parameters",
                                  "activations", "PyTorch", "error", "CPU dropout");
  for (const auto& [file, ref] : reference()["files"].items()) {
    const auto it = kToday.find(file);
    if (it == kToday.end()) continue;  // reported by the test above
    const Outcome o = import_file(file, ref);
    const bool expected = it->second == "imports";
    if (!o.model) {
      EXPECT_FALSE(expected) << file << " no longer imports: " << o.error;
      if (!expected) {
        EXPECT_EQ(o.error.rfind(exports_dir() + file + ": " + it->second, 0), 0u)
            << file << ": kToday says '" << it->second << "', the importer says: " << o.error;
      }
      table += fmt::format("{:36s} {}\n", file, o.error.substr(exports_dir().size()));
      continue;
    }
    EXPECT_TRUE(expected) << file << " imports now: set its kToday entry to \"imports\"";
    ++imported;
    const int64_t params = ref["parameters"].get<int64_t>();
    EXPECT_EQ(o.model->parameter_count(), params) << file;
    const int64_t act = max_activations(*o.model);
    const int64_t torch_act = ref["saved_bytes_with_loss_mask_dropout"].get<int64_t>();
    const double error = static_cast<double>(act) / static_cast<double>(torch_act) - 1;
    if (!kKnownGaps.count(file)) {
      EXPECT_LE(std::fabs(error), 0.05) << file << ": " << act << " activation bytes planned, PyTorch saves " << torch_act;
    }
    // Where batch 1 keeps a storage a larger batch copies (make_exports.py's
    // AT_BATCH_2), the plan (per sample) holds to PyTorch's bytes a sample at 2.
    if (ref.contains("saved_bytes_with_loss_mask_dropout_per_sample_at_batch_2")) {
      const auto at2 = ref["saved_bytes_with_loss_mask_dropout_per_sample_at_batch_2"].get<double>();
      EXPECT_LE(std::fabs(static_cast<double>(act) / at2 - 1), 0.05)
          << file << ": " << act << " activation bytes planned a sample, PyTorch saves " << at2 << " at batch 2";
    }
    table += fmt::format("{:36s} {:>12} {:>12} {:>12} {:>+7.1f}% {:>12}\n", file, o.model->parameter_count(), act,
                         torch_act, 100.0 * error, ref["saved_bytes_with_loss"].get<int64_t>());
  }
  std::cout << "real torch.onnx.export files: " << imported << " of " << reference()["files"].size()
            << " import\n"
            << table;
}

// --fusion eager leaves math written out in Python op by op (gelu_new,
// LlamaRMSNorm): the generic ops pow, affine, sqrt, reciprocal, reduce_mean,
// mul and tanh, each keeping what PyTorch 1.13's autograd keeps; and its max
// pools keep what max_pool2d_with_indices keeps (the input and int64
// indices, where the engines' own rule keeps int32 indices only). Then GPT-2,
// Llama, Mistral, VGG and SqueezeNet plan PyTorch's eager bytes within 5 %,
// with the same parameters; every other file plans what it plans under the
// default fusion. Its slices are PyTorch's views (an op that keeps one keeps
// the storage it was cut from), so ShuffleNet's torch.chunk halves plan as
// PyTorch keeps them too, and so are its selects: the ViTs' head reads the
// class token x[:, 0], a view, so it keeps the last LayerNorm's whole
// output (a copy under the default fusion: 0.4 % and 2.6 % below PyTorch).
// What still differs is GPT-NeoX at batch 1, where matmul's reshape of v is
// a view as well (kKnownGaps).
TEST(RealExports, EagerFusionPlansWhatPyTorchEagerModeKeeps) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::set<std::string> written_out = {"gpt2-opset17.onnx",         "tiny-gpt2-opset17.onnx",
                                             "tiny-llama-opset17.onnx",   "tiny-mistral-opset17.onnx",
                                             "tiny-qwen2-opset17.onnx",   "tiny-phi-opset17.onnx",
                                             "tiny-gemma-opset17.onnx",   "tiny-albert-opset17.onnx",
                                             "tiny-gptj-opset17.onnx"};
  // Outside 5 % under eager too: GPT-NeoX's v, a view at batch 1 only (kKnownGaps).
  const std::set<std::string> known = {"tiny-gpt-neox-opset17.onnx"};
  // Where the default fusion's int32 pool indices alone miss PyTorch by more
  // than 5 %: the control for the max-pool rule.
  const std::set<std::string> pool_gap = {"vgg11_bn-opset17.onnx", "squeezenet1_1-opset17.onnx"};
  // Whose head keeps a view under eager: a select's (the class token), or
  // BEiT's mean over a slice of the tokens.
  const std::set<std::string> select_view = {"vit_b_16-opset17.onnx", "vit_b_16-opset13.onnx",
                                             "tiny-hf-vit-opset17.onnx", "tiny-hf-deit-opset17.onnx",
                                             "tiny-hf-beit-opset17.onnx"};
  std::string table = fmt::format("{:36s} {:>12s} {:>12s} {:>9s} {:>9s}\n", "file", "eager", "PyTorch", "eager",
                                  "engine");
  for (const auto& [file, ref] : reference()["files"].items()) {
    if (kToday.count(file) == 0 || kToday.at(file) != "imports") continue;
    const Outcome eager = import_file(file, ref, FusionMode::eager), engine = import_file(file, ref);
    ASSERT_TRUE(eager.model.has_value()) << file << ": " << eager.error;
    ASSERT_TRUE(engine.model.has_value()) << file << ": " << engine.error;
    EXPECT_EQ(eager.model->parameter_count(), ref["parameters"].get<int64_t>()) << file;
    const double torch_act = ref["saved_bytes_with_loss_mask_dropout"].get<double>();
    const int64_t act = max_activations(*eager.model), engine_act = max_activations(*engine.model);
    const double error = static_cast<double>(act) / torch_act - 1;
    if (!known.count(file)) {
      EXPECT_LE(std::fabs(error), 0.05) << file << ": " << act << " activation bytes planned, PyTorch saves " << torch_act;
    }
    const bool pools = std::any_of(eager.model->nodes.begin(), eager.model->nodes.end(),
                                   [](const Node& n) { return n.op == OpKind::maxpool2d; });
    if (written_out.count(file) || pool_gap.count(file)) {  // the control: the engine's rules miss PyTorch's bytes
      EXPECT_GT(act, engine_act) << file;
      EXPECT_GT(std::fabs(static_cast<double>(engine_act) / torch_act - 1), 0.05) << file;
    } else if (pools) {
      EXPECT_GT(act, engine_act) << file << ": the eager max pool keeps no more than the engine's";
    } else if (select_view.count(file)) {
      EXPECT_GT(act, engine_act) << file << ": the class token's view keeps no more than its copy";
    } else {
      EXPECT_EQ(act, engine_act) << file << ": nothing written out in Python, yet the fusions differ";
    }
    table += fmt::format("{:36s} {:>12} {:>12} {:>+8.1f}% {:>+8.1f}%\n", file, act, static_cast<int64_t>(torch_act),
                         100 * error, 100 * (static_cast<double>(engine_act) / torch_act - 1));
  }
  std::cout << table;
}

// The control: the activation check can fail. Planned with another
// saved-tensor rule for attention, flash attention's (one fp32 log-sum-exp a
// row kept instead of the softmax probabilities PyTorch's eager attention
// keeps), the transformers' activations leave the 5 % band.
TEST(RealExports, AWrongSavedTensorRuleFailsTheActivationCheck) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const char* file : {"vit_b_16-opset17.onnx", "bert-base-uncased-opset17.onnx", "tiny-hf-vit-opset17.onnx"}) {
    const auto& ref = reference()["files"][file];
    const Outcome o = import_file(file, ref);
    ASSERT_TRUE(o.model.has_value()) << o.error;
    const double torch_act = ref["saved_bytes_with_loss_mask_dropout"].get<double>();
    const double right = static_cast<double>(max_activations(*o.model)) / torch_act - 1;
    const double wrong = static_cast<double>(max_activations(*o.model, AttentionImpl::flash)) / torch_act - 1;
    EXPECT_LE(std::fabs(right), 0.05) << file;
    EXPECT_GT(std::fabs(wrong), 0.05) << file << ": the check cannot tell the probabilities from the log-sum-exp";
    std::cout << fmt::format("{:36s} math attention {:+.1f} %, flash attention's rule {:+.1f} %\n", file,
                             100 * right, 100 * wrong);
  }
}

// `dlplan train --init model.onnx` reads each parameter from the initializer
// the importer mapped it from (import_onnx_weights). For every file that
// imports, every parameter is traced to one, and the initializer's dims give
// exactly the parameter's elements (transposed for a MatMul's [in, out], a
// third of a fused QKV weight): the files are stripped, so this checks the
// mapping, not the values (tests/tools/onnx_parity.py checks those against
// PyTorch on three files exported with their weights).
TEST(RealExports, EveryParameterIsTracedToAnInitializerOfItsSize) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  std::string table = fmt::format("{:36s} {:>6s} {:>11s} {:>10s}\n", "file", "params", "transposed", "row blocks");
  for (const auto& [file, ref] : reference()["files"].items()) {
    if (kToday.count(file) == 0 || kToday.at(file) != "imports") continue;
    ImportOptions o;
    if (ref["options"].contains("sequence")) o.seq_len = ref["options"]["sequence"].get<int64_t>();
    const Model m = import_onnx(exports_dir() + file, o);
    std::vector<ImportedWeight> w;
    try {
      w = import_onnx_weights(exports_dir() + file, o, false);
    } catch (const Error& e) {
      ADD_FAILURE() << e.what();
      continue;
    }
    ASSERT_EQ(w.size(), m.params.size()) << file;
    for (const auto& n : m.notes) EXPECT_EQ(n.find("parts were not traced"), std::string::npos) << file << ": " << n;
    int transposed = 0, blocks = 0;
    std::set<std::string> whole;  // an initializer read whole by two parameters would be a mapping error
    for (size_t k = 0; k < w.size(); ++k) {
      EXPECT_EQ(w[k].name, m.params[k].name) << file;
      EXPECT_EQ(w[k].shape, m.params[k].shape) << file << " " << w[k].name;
      EXPECT_TRUE(w[k].values.empty());
      transposed += w[k].source.find("^T") != std::string::npos;
      const bool block = w[k].source.find('[') != std::string::npos;
      blocks += block;
      if (!block) {
        EXPECT_TRUE(whole.insert(w[k].source).second) << file << ": " << w[k].source << " read twice";
      }
    }
    table += fmt::format("{:36s} {:>6} {:>11} {:>10}\n", file, w.size(), transposed, blocks);
  }
  std::cout << table;
}

// The planning JSON states each strategy's `memory_max`, the most each
// category holds at any moment, apart from `memory` (the categories at the
// peak). Planned at fp32, micro-batch 1, its activations are PyTorch's saved
// bytes within 5 % for tiny-bert (the dropout-mask figure), and they are at
// least the activations alive at the peak, for every strategy.
TEST(RealExports, ThePlanningJsonsMemoryMaxHoldsWhatPyTorchSaves) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  PlanRequest req;
  ImportOptions o;
  o.seq_len = 64;
  req.model = import_onnx(exports_dir() + "tiny-bert-opset17.onnx", o);
  req.cluster.device = find_device("h100-80g");
  req.cluster.nodes = 1;
  req.cluster.gpus_per_node = 2;
  req.training.precision = Precision::fp32;
  req.training.micro_batch = 1;
  const auto j = planning_json(plan(req));
  const auto torch = reference()["files"]["tiny-bert-opset17.onnx"]["saved_bytes_with_loss_mask_dropout"].get<int64_t>();
  ASSERT_FALSE(j["strategies"].empty());
  for (const auto& s : j["strategies"]) {
    const auto most = s["memory_max"]["activations"].get<int64_t>();
    EXPECT_GE(most, s["memory"]["activations"].get<int64_t>()) << s["strategy"];
    EXPECT_NEAR(static_cast<double>(most) / static_cast<double>(torch), 1.0, 0.05) << s["strategy"] << " " << most;
    for (const auto& [category, bytes] : s["memory"].items())
      if (s["memory_max"].contains(category)) {
        EXPECT_GE(s["memory_max"][category].get<int64_t>(), bytes.get<int64_t>()) << s["strategy"] << " " << category;
      }
  }
}

// Hugging Face's Llama and Mistral write RMSNorm out (Pow, ReduceMean, Add
// eps, Sqrt, Div(1, .), Mul x, Cast, Mul w), RoPE as x * cos +
// rotate_half(x) * sin with cos and sin constants, and repeat_kv as Expand +
// Reshape. The importer fuses them: 5 rmsnorm (2 per layer, the final one)
// and 2 attention blocks with rope, theta 10000 (read back from the cos
// table), and kv_heads from the k projection's width: 2 for the Llama
// config, 1 for Mistral's. Mistral's sliding-window mask (Trilu, evaluated
// at import) is planned as causal.
TEST(RealExports, LlamaAndMistralFuseRMSNormRoPEAndGroupedKV) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 64;
  for (const auto& [file, kv] : std::map<std::string, int64_t>{{"tiny-llama-opset17.onnx", 2},
                                                                {"tiny-mistral-opset17.onnx", 1}}) {
    const Model m = import_onnx(exports_dir() + file, o);
    int norms = 0, attention = 0;
    for (const Node& n : m.nodes) {
      if (n.op == OpKind::rmsnorm) {
        ++norms;
        EXPECT_NEAR(n.attrs.number("eps"), 1e-6, 1e-12) << file;
      }
      if (n.op != OpKind::attention) continue;
      ++attention;
      EXPECT_TRUE(n.attrs.flag("rope")) << file;
      EXPECT_EQ(n.attrs.number("rope_theta"), 10000.0) << file;
      EXPECT_EQ(n.attrs.integer("heads"), 4) << file;
      EXPECT_EQ(n.attrs.integer("kv_heads"), kv) << file;
      EXPECT_TRUE(n.attrs.flag("causal")) << file;
    }
    EXPECT_EQ(norms, 5) << file;
    EXPECT_EQ(attention, 2) << file;
  }
}

// torchvision's ViT runs nn.MultiheadAttention, which is sequence-first:
// torch writes x.transpose(0, 1), a fused in_proj [3D, D] split three ways,
// heads as [b heads, T, d] and the inverse transpose after out_proj. The
// attention pattern takes both transposes inside the block, and the heads
// from q's width (scores are 3-D). Both files are then 12 blocks of 12 heads,
// not causal, and plan what dlplan's own vit-b16 (built from the paper's
// configuration, planner/zoo/vit.cpp) plans: the same parameters and the same
// bytes in every category at the peak and at each one's maximum.
TEST(RealExports, ViTB16sMultiheadAttentionPlansAsTheZoosViT) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const Model zoo = parse_model(zoo::zoo_model("vit-b16").value(), "vit-b16");
  Cluster c;
  c.device = find_device("h100-80g");
  TrainingConfig t;
  t.precision = Precision::fp32;
  t.micro_batch = 2;
  const StepWalk want = walk_step(zoo, c, t);
  for (const char* file : {"vit_b_16-opset13.onnx", "vit_b_16-opset17.onnx"}) {
    const Model m = import_onnx(exports_dir() + file);
    int attention = 0;
    for (const Node& n : m.nodes)
      if (n.op == OpKind::attention) {
        ++attention;
        EXPECT_EQ(n.attrs.integer("heads"), 12) << file << " " << n.name;
        EXPECT_FALSE(n.attrs.flag("causal")) << file << " " << n.name;
        EXPECT_EQ(m.tensor(n.inputs[0]).shape, (Shape{197, 768})) << file << " " << n.name;
      }
    EXPECT_EQ(attention, 12) << file;
    EXPECT_EQ(m.parameter_count(), zoo.parameter_count()) << file;
    const StepWalk got = walk_step(m, c, t);
    EXPECT_EQ(got.peak, want.peak) << file;
    for (Category cat : kAllCategories) {
      EXPECT_EQ(got.at_peak[static_cast<size_t>(cat)], want.at_peak[static_cast<size_t>(cat)]) << file << " " << to_string(cat);
      EXPECT_EQ(got.max_each[static_cast<size_t>(cat)], want.max_each[static_cast<size_t>(cat)]) << file << " " << to_string(cat);
    }
  }
}

// torchvision's ReLU6 exports as Clip(0, 6), 35 of them in MobileNetV2: each
// is a clip op keeping its input, as PyTorch's hardtanh does, no longer
// passed through with its activations unplanned.
TEST(RealExports, MobileNetV2sReLU6IsAClip) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const Model m = import_onnx(exports_dir() + "mobilenet_v2-opset17.onnx");
  int clips = 0;
  for (const Node& n : m.nodes) {
    if (n.op != OpKind::clip) continue;
    ++clips;
    EXPECT_EQ(n.attrs.number("min"), 0.0) << n.name;
    EXPECT_EQ(n.attrs.number("max"), 6.0) << n.name;
  }
  EXPECT_EQ(clips, 35);
  for (const auto& note : m.notes) EXPECT_EQ(note.find("Clip"), std::string::npos) << note;
}

// MobileNetV3's Hardswish exports as HardSwish at opset 14 and later, and as
// x * HardSigmoid(x) below: both files plan the same hardswish ops, and its
// squeeze-and-excitation blocks (GlobalAveragePool [C, 1, 1] -> 1x1 Conv ->
// HardSigmoid -> Mul) plan through keepdims pooling and a broadcasting mul,
// nothing passed through unplanned.
// torchvision's convnext_tiny: each of its 18 blocks permutes [C, H, W] to
// [H, W, C] for its LayerNorm and two Linears and back (2 transposes), and
// scales its branch by a learned gamma [C, 1, 1]; its four LayerNorm2d (stem,
// three downsamplings, head) permute there and back too: 46 transposes, 23
// layernorms, 18 scales, 37 linears (36 MatMuls whose weight torch transposes
// with a node, and the head's Gemm). The opset-13 export spells LayerNorm out
// (ReduceMean, Sub, Pow, Sqrt, Div, Mul, Add) and plans the same ops.
TEST(RealExports, ConvNeXtsPermutesLayerNormsAndLayerScales) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  std::map<std::string, std::map<OpKind, int>> counts;
  for (const char* file : {"convnext_tiny-opset13.onnx", "convnext_tiny-opset17.onnx"}) {
    const Model m = import_onnx(exports_dir() + file);
    for (const Node& n : m.nodes) counts[file][n.op] += 1;
    for (const auto& note : m.notes) {
      EXPECT_EQ(note.find("opaque"), std::string::npos) << file << ": " << note;
      EXPECT_EQ(note.find("not counted"), std::string::npos) << file << ": " << note;
    }
    for (const Node& n : m.nodes)
      if (n.op == OpKind::scale) {
        EXPECT_EQ(n.attrs.ints("shape").size(), 3u) << n.name;
      }
  }
  auto& c13 = counts["convnext_tiny-opset13.onnx"];
  EXPECT_EQ(c13, counts["convnext_tiny-opset17.onnx"]);
  EXPECT_EQ(c13[OpKind::transpose], 46);
  EXPECT_EQ(c13[OpKind::layernorm], 23);
  EXPECT_EQ(c13[OpKind::scale], 18);
  EXPECT_EQ(c13[OpKind::linear], 37);
  EXPECT_EQ(c13[OpKind::gelu], 18);
}

// ShuffleNetV2's channel shuffle is x.view(b, 2, C / 2, H, W).transpose(1, 2)
// .contiguous().view(b, C, H, W), whose view shapes torch writes as Shape ->
// Gather -> Unsqueeze -> Concat computations, and its channel split
// x.chunk(2, dim=1) as Slices whose ends are computed the same way. Evaluated
// at import, they are 32 reshapes, 16 transposes of the two group axes and 26
// slices (13 stride-1 blocks, two halves each); the first shuffle (stage 2,
// 116 channels at 28 x 28) views [2, 58, 28, 28].
TEST(RealExports, ShuffleNetsShapeComputationsAreEvaluatedAtImport) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const Model m = import_onnx(exports_dir() + "shufflenet_v2_x1_0-opset17.onnx");
  std::map<OpKind, int> count;
  for (const Node& n : m.nodes) count[n.op] += 1;
  EXPECT_EQ(count[OpKind::reshape], 32);
  EXPECT_EQ(count[OpKind::transpose], 16);
  EXPECT_EQ(count[OpKind::slice], 26);
  const auto first = std::find_if(m.nodes.begin(), m.nodes.end(), [](const Node& n) { return n.op == OpKind::reshape; });
  ASSERT_NE(first, m.nodes.end());
  EXPECT_EQ(first->attrs.ints("shape"), (std::vector<int64_t>{2, 58, 28, 28}));
  for (const Node& n : m.nodes)
    if (n.op == OpKind::transpose) {
      EXPECT_EQ(n.attrs.ints("perm"), (std::vector<int64_t>{1, 0, 2, 3})) << n.name;
    }
  const bool noted = std::any_of(m.notes.begin(), m.notes.end(), [](const std::string& s) {
    return s.find("computing shapes, positions or masks evaluated at import") != std::string::npos;
  });
  EXPECT_TRUE(noted);
  // The IR is per sample: evaluated with the batch bound to 4 instead of 1,
  // every node's attributes and shape come out the same.
  expect_same_ir_at_batch(m, "shufflenet_v2_x1_0-opset17.onnx", ImportOptions{}, 4);
}

// GPT-2's Conv1D is x.view(-1, D) @ W + b, viewed back to [b, T, N]: the
// batch folded into the rows and unfolded again. Each sample stays one
// contiguous block of rows, so both views are per-sample identities and the
// projection a linear over [T, D]. The head reads x @ Transpose(wte): tied to
// the token embedding, counted once (124,439,808, PyTorch's count). The IR
// is the same when the batch is bound to 3 instead of 1.
TEST(RealExports, GPT2sConv1DFoldsTheBatchIntoRowsAndTheHeadIsTied) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions one;
  one.seq_len = 64;
  const Model m = import_onnx(exports_dir() + "tiny-gpt2-opset17.onnx", one);
  std::map<OpKind, int> count;
  for (const Node& n : m.nodes) count[n.op] += 1;
  EXPECT_EQ(count[OpKind::attention], 2);
  EXPECT_EQ(count[OpKind::reshape], 0);
  EXPECT_EQ(count[OpKind::flatten], 0);
  EXPECT_EQ(count[OpKind::gelu], 2);
  EXPECT_EQ(count[OpKind::linear], 2 * 2 + 1);  // mlp c_fc, c_proj per block; the head (attention holds its own)
  const Node& head = m.nodes[m.nodes.size() - 2];
  ASSERT_EQ(head.op, OpKind::linear);
  EXPECT_EQ(head.attrs.text("tie"), m.nodes[static_cast<size_t>(m.node_index(head.attrs.text("tie")))].name);
  EXPECT_EQ(m.nodes[static_cast<size_t>(m.node_index(head.attrs.text("tie")))].op, OpKind::embedding);
  EXPECT_EQ(m.tensor(head.output).shape, (Shape{64, 1000}));
  for (const Node& n : m.nodes)
    if (n.op == OpKind::attention) {
      EXPECT_EQ(m.tensor(n.inputs[0]).shape, (Shape{64, 128})) << n.name;
      EXPECT_EQ(n.attrs.integer("heads"), 4) << n.name;
      // torch.where(bias[:, :, :T, :T], scores, finfo.min), bias the lower triangle
      EXPECT_TRUE(n.attrs.flag("causal")) << n.name;
    }
  expect_same_ir_at_batch(m, "tiny-gpt2-opset17.onnx", one, 3);
}

// The full GPT-2 export plans what dlplan's own gpt2 (built from Hugging
// Face's configuration, planner/zoo/gpt.cpp, not from the file) plans, byte
// for byte: parameters, and every category at the peak and at its maximum.
// Under --fusion eager both sides build gelu_new op by op, the file from its
// ONNX nodes and the Hugging Face config (tests/fixtures/hf/gpt2.json) from
// zoo/ir_builder.hpp's expansion; they plan the same bytes too.
TEST(RealExports, GPT2PlansAsTheZoosGPT2) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    ImportOptions o;
    o.seq_len = 256;
    o.fusion = fusion;
    const Model m = import_onnx(exports_dir() + "gpt2-opset17.onnx", o);
    const Model zoo = fusion == FusionMode::engine
                          ? with_seq_len(parse_model(zoo::zoo_model("gpt2").value(), "gpt2"), 256)
                          : with_seq_len(load_model(DLPLAN_SOURCE_DIR "/tests/fixtures/hf/gpt2.json", o), 256);
    EXPECT_EQ(m.parameter_count(), zoo.parameter_count());
    Cluster c;
    c.device = find_device("h100-80g");
    TrainingConfig t;
    t.precision = Precision::fp32;
    t.micro_batch = 2;
    const StepWalk got = walk_step(m, c, t), want = walk_step(zoo, c, t);
    EXPECT_EQ(got.peak, want.peak) << to_string(fusion);
    for (Category cat : kAllCategories) {
      EXPECT_EQ(got.at_peak[static_cast<size_t>(cat)], want.at_peak[static_cast<size_t>(cat)])
          << to_string(cat) << " " << to_string(fusion);
      EXPECT_EQ(got.max_each[static_cast<size_t>(cat)], want.max_each[static_cast<size_t>(cat)])
          << to_string(cat) << " " << to_string(fusion);
    }
  }
}

// BERT's embeddings add token_type_embeddings(token_type_ids), and with no
// token_type_ids given the ids are a buffer of zeros expanded to [b, T]:
// evaluated at import, every position reads row 0 of the [2, D] table, a
// pos_embedding with `row` 0 whose whole table is counted (PyTorch's
// parameter count). Its attention mask, (1 - ones) * finfo.min, is all zeros
// at import: the attention is not causal, where GPT-2's is.
TEST(RealExports, BERTsTokenTypesReadOneRowAndItsMaskHidesNothing) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 64;
  for (const char* file : {"tiny-bert-opset13.onnx", "tiny-bert-opset17.onnx"}) {
    const Model m = import_onnx(exports_dir() + file, o);
    int rows = 0, positions = 0, attention = 0;
    for (const Node& n : m.nodes) {
      if (n.op == OpKind::pos_embedding && n.attrs.has("row")) {
        ++rows;
        EXPECT_EQ(n.attrs.integer("row"), 0) << file;
        EXPECT_EQ(n.attrs.integer("max_len"), 2) << file;
      } else if (n.op == OpKind::pos_embedding) {
        ++positions;
        EXPECT_EQ(n.attrs.integer("max_len"), 128) << file;
      }
      if (n.op == OpKind::attention) {
        ++attention;
        EXPECT_FALSE(n.attrs.flag("causal")) << file << " " << n.name;
      }
    }
    EXPECT_EQ(rows, 1) << file;
    EXPECT_EQ(positions, 1) << file;
    EXPECT_EQ(attention, 2) << file;
  }
}

TEST(RealExports, MobileNetV3sHardswishAndSqueezeExcitation) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  std::map<std::string, std::map<OpKind, int>> counts;
  for (const char* file : {"mobilenet_v3_small-opset13.onnx", "mobilenet_v3_small-opset17.onnx"}) {
    const Model m = import_onnx(exports_dir() + file);
    for (const Node& n : m.nodes) counts[file][n.op] += 1;
    for (const auto& note : m.notes) EXPECT_EQ(note.find("opaque"), std::string::npos) << file << ": " << note;
    int se_scales = 0;
    for (const Node& n : m.nodes) {
      if (n.op == OpKind::global_avgpool && n.attrs.has("keepdims") && n.attrs.flag("keepdims")) {
        EXPECT_EQ(m.tensor(n.output).shape.size(), 3u) << n.name;
      }
      if (n.op == OpKind::mul && m.tensor(n.inputs[0]).shape != m.tensor(n.inputs[1]).shape) ++se_scales;
    }
    EXPECT_EQ(se_scales, 9) << file;  // torchvision's mobilenet_v3_small has 9 SE blocks
  }
  auto& c13 = counts["mobilenet_v3_small-opset13.onnx"];
  EXPECT_EQ(c13, counts["mobilenet_v3_small-opset17.onnx"]);
  EXPECT_EQ(c13[OpKind::hardsigmoid], 9);  // the SE gates
  EXPECT_EQ(c13[OpKind::hardswish], 19);   // the notes of the pass-through importer counted 19 HardSwish
}

// Qwen2's attention has biases on q, k and v and none on o. The attention
// pattern takes them as qkv_bias and out_bias: PyTorch's exact count, where it
// used to plan the block without biases (256 parameters a layer fewer here).
TEST(RealExports, Qwen2sBiasesAreOnQKVOnly) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 64;
  const Model m = import_onnx(exports_dir() + "tiny-qwen2-opset17.onnx", o);
  int attention = 0;
  for (const Node& n : m.nodes) {
    if (n.op != OpKind::attention) continue;
    ++attention;
    EXPECT_TRUE(n.attrs.flag("qkv_bias")) << n.name;
    EXPECT_FALSE(n.attrs.flag("out_bias")) << n.name;
    EXPECT_EQ(n.attrs.integer("kv_heads"), 2) << n.name;
  }
  EXPECT_EQ(attention, 2);
  std::set<std::string> names;
  for (const ParamInfo& p : m.params) names.insert(p.name);
  int q_bias = 0, o_bias = 0;
  for (const auto& n : names) {
    q_bias += n.size() > 7 && n.compare(n.size() - 7, 7, ".q.bias") == 0;
    o_bias += n.size() > 7 && n.compare(n.size() - 7, 7, ".o.bias") == 0;
  }
  EXPECT_EQ(q_bias, 2);
  EXPECT_EQ(o_bias, 0);
  EXPECT_EQ(m.parameter_count(), reference()["files"]["tiny-qwen2-opset17.onnx"]["parameters"].get<int64_t>());
}

// Phi rotates the first half of each head (partial_rotary_factor 0.5):
// cat(rotate(q[..., :16]), q[..., 16:]). The attention pattern follows the
// rotated part and the pass-through part back to the same projection and
// plans rotary_dim 16 of head_dim 32; before, its MatMuls and Softmax were
// opaque ops that no engine could train.
TEST(RealExports, PhisPartialRotaryIsRecognised) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 64;
  const Model m = import_onnx(exports_dir() + "tiny-phi-opset17.onnx", o);
  int attention = 0;
  for (const Node& n : m.nodes) {
    EXPECT_NE(n.op, OpKind::opaque) << n.name;
    if (n.op != OpKind::attention) continue;
    ++attention;
    EXPECT_TRUE(n.attrs.flag("rope")) << n.name;
    EXPECT_EQ(n.attrs.integer("rotary_dim"), 16) << n.name;
    EXPECT_EQ(n.attrs.integer("head_dim"), 32) << n.name;
    EXPECT_TRUE(n.attrs.flag("bias")) << n.name;
    EXPECT_TRUE(n.attrs.flag("causal")) << n.name;
    EXPECT_EQ(n.attrs.number("rope_theta"), 10000.0) << n.name;
  }
  EXPECT_EQ(attention, 2);
}

// transformers 4.38's Gemma: RMSNorm scales by 1 + w (an Add of 1 and the
// parameter), the MLP's GELU is exact (4.38's default hidden_act "gelu", one
// op in PyTorch: fused under both fusions), and RoPE's cos and sin are
// computed in the graph from the inv_freq constant (folded at import). Fused, each norm is
// an rmsnorm with offset 1; eager, a scale node with offset 1 after the
// written-out steps.
TEST(RealExports, GemmasOffsetNormTorchGeluAndComputedRope) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    ImportOptions o;
    o.seq_len = 64;
    o.fusion = fusion;
    const Model m = import_onnx(exports_dir() + "tiny-gemma-opset17.onnx", o);
    int norms = 0, scales = 0, gelus = 0, attention = 0;
    for (const Node& n : m.nodes) {
      if (n.op == OpKind::rmsnorm) norms += n.attrs.number("offset") == 1.0;
      if (n.op == OpKind::scale) scales += n.attrs.number("offset") == 1.0;
      if (n.op == OpKind::gelu) gelus += n.attrs.text("approximate") == "none";  // 4.38's hidden_act "gelu"
      if (n.op != OpKind::attention) continue;
      ++attention;
      EXPECT_TRUE(n.attrs.flag("rope")) << n.name;
      EXPECT_EQ(n.attrs.number("rope_theta"), 10000.0) << n.name;
      EXPECT_EQ(n.attrs.integer("kv_heads"), 1) << n.name;
    }
    EXPECT_EQ(attention, 2) << to_string(fusion);
    EXPECT_EQ(gelus, 2) << to_string(fusion);
    EXPECT_EQ(fusion == FusionMode::engine ? norms : scales, 5) << to_string(fusion);
    EXPECT_EQ(m.parameter_count(), reference()["files"]["tiny-gemma-opset17.onnx"]["parameters"].get<int64_t>());
  }
}

// GPT-J: torch.repeat_interleave of its sin and cos is a Loop in the file,
// which the importer rewrites before shape inference; the tables, gathered
// by position and split, are folded; each layer's two rotations of q and k
// (rotate_every_two on the first 16 of 32 features, [b, T, H, d]) are the
// IR's rope with interleaved pairs and the positions on axis -3, between a
// slice and a concat. Its attention stays the generic matmul and softmax
// (the attention op rotates halves, not pairs).
TEST(RealExports, GptjsInterleavedRopeThroughItsLoop) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 64;
  const Model m = import_onnx(exports_dir() + "tiny-gptj-opset17.onnx", o);
  int ropes = 0, attention = 0;
  for (const Node& n : m.nodes) {
    attention += n.op == OpKind::attention;
    if (n.op != OpKind::rope) continue;
    ++ropes;
    EXPECT_TRUE(n.attrs.flag("interleaved")) << n.name;
    EXPECT_EQ(n.attrs.integer("position_axis"), -3) << n.name;
    EXPECT_EQ(n.attrs.number("theta"), 10000.0) << n.name;
    EXPECT_EQ(m.tensor(n.inputs[0]).shape, (Shape{64, 4, 16})) << n.name;
  }
  EXPECT_EQ(ropes, 4);
  EXPECT_EQ(attention, 0);
  EXPECT_NE(std::find_if(m.notes.begin(), m.notes.end(),
                         [](const std::string& s) { return s.find("2 Loop nodes of torch.repeat_interleave") == 0; }),
            m.notes.end());
}

// torch.repeat_interleave(h, 2, dim=1) over the sequence, as Funnel's
// decoder upsamples: the Loop over positions is rewritten before shape
// inference (Unsqueeze after axis 1, Expand to 2, Reshape) and the Expand of
// the activation [16, 1, 64] per sample is one nearest upsample by [2, 1],
// PyTorch's repeat of each row in place; the head then reads 32 positions and
// the loss's targets follow the logits, not --seq-len (with_seq_len leaves an
// ONNX import's inputs as the import bound them). PyTorch's step on the same
// weights: onnx_parity.py --model tiny-upsample.
TEST(RealExports, RepeatInterleaveOverTheSequenceIsAnUpsampleOfAView) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 16;
  const Model m = with_seq_len(import_onnx(exports_dir() + "tiny-upsample-repeat-opset17.onnx", o), 16);
  int upsamples = 0;
  for (const Node& n : m.nodes) {
    EXPECT_NE(n.op, OpKind::opaque) << n.name;
    if (n.op != OpKind::upsample) continue;
    ++upsamples;
    EXPECT_EQ(m.tensor(n.inputs[0]).shape, (Shape{16, 1, 64})) << n.name;
    EXPECT_EQ(m.tensor(n.output).shape, (Shape{16, 2, 64})) << n.name;
  }
  EXPECT_EQ(upsamples, 1);
  const auto targets =
      std::find_if(m.inputs.begin(), m.inputs.end(), [&](int id) { return m.tensor(id).name == "targets"; });
  ASSERT_NE(targets, m.inputs.end());
  EXPECT_EQ(m.tensor(*targets).shape, (Shape{32}));
  EXPECT_NE(std::find_if(m.notes.begin(), m.notes.end(),
                         [](const std::string& s) { return s.find("1 Loop node of torch.repeat_interleave") == 0; }),
            m.notes.end());
}

// T5's relative position bias computed in the graph: MPNet's and T5's
// encoder's (32 buckets both ways, max_distance 128; T5's through a mask of
// zeros, computed in block 0 and read by every block) and a user's (16
// buckets on earlier keys only, max_distance 40). The buckets fold
// at import (a float32 log, truncated) and the [T, T] index they give is
// recognised as relative_position_bucket's (ops.hpp) for a geometry, checked
// here against the formula at every offset; the table is read once, by one
// relative_position_bias of the ids, and every layer adds it to its scores.
// At 16 positions max_distance 36 to 40 read the user's index alike, and the
// importer takes the smallest; 128 is in MPNet's range and is taken.
// PyTorch's step on MPNet's weights: onnx_parity.py --model tiny-mpnet.
TEST(RealExports, RelativePositionBucketsComputedInTheGraphAreT5sBias) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  struct Case {
    const char* file;
    int64_t buckets, max_distance, layers;
    bool bidirectional;
  };
  for (const Case& c : {Case{"weights/tiny-mpnet-opset17.onnx", 32, 128, 2, true},
                        Case{"weights/tiny-t5-encoder-opset17.onnx", 32, 128, 2, true},
                        Case{"tiny-relative-bias-opset17.onnx", 16, 36, 1, false}}) {
    ImportOptions o;
    o.seq_len = 16;
    const Model m = import_onnx(exports_dir() + c.file, o);
    std::vector<const Node*> biases;
    for (const Node& n : m.nodes) {
      EXPECT_NE(n.op, OpKind::opaque) << c.file << " " << n.name;
      if (n.op == OpKind::relative_position_bias) biases.push_back(&n);
    }
    ASSERT_EQ(biases.size(), 1u) << c.file;
    const Node& b = *biases[0];
    EXPECT_EQ(b.attrs.integer("buckets"), c.buckets) << c.file;
    EXPECT_EQ(b.attrs.integer("max_distance"), c.max_distance) << c.file;
    EXPECT_EQ(b.attrs.flag("bidirectional"), c.bidirectional) << c.file;
    // The user's own max_distance reads the same buckets at this length.
    for (int64_t off = -15; off <= 15; ++off)
      EXPECT_EQ(relative_position_bucket(off, c.buckets, b.attrs.integer("max_distance"), c.bidirectional),
                relative_position_bucket(off, c.buckets, c.bidirectional ? 128 : 40, c.bidirectional))
          << c.file << " offset " << off;
    int adds = 0;
    for (const Node& n : m.nodes)
      adds += n.op == OpKind::add && std::find(n.inputs.begin(), n.inputs.end(), b.output) != n.inputs.end();
    EXPECT_EQ(adds, c.layers) << c.file;
    EXPECT_EQ(m.tensor(b.output).shape, (Shape{4, 16, 16})) << c.file;
  }
}

// T5 whole (T5ForConditionalGeneration): two token inputs, the source's and
// the decoder's. The decoder's relative position bias (its own table, 32
// buckets on earlier keys only) reaches the scores through T5's causal mask,
// position_bias + finfo.min above the diagonal: each decoder layer adds the
// bias, then the IR's causal_mask. The encoder's bias is as T5's encoder's.
// Imported at micro-batch 2 the mask rows are the batch's, alike, and the IR
// is the same. PyTorch's step on these weights: onnx_parity.py --model tiny-t5.
TEST(RealExports, T5WholeAddsItsDecodersBiasThroughTheCausalMask) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  auto ops = [](const Model& m) {
    std::vector<OpKind> v;
    for (const Node& n : m.nodes) v.push_back(n.op);
    return v;
  };
  ImportOptions o;
  o.seq_len = 16;
  const Model m = import_onnx(exports_dir() + "weights/tiny-t5-opset17.onnx", o);
  EXPECT_EQ(m.parameter_count(), 44672);  // PyTorch's, the tied embedding once
  int tokens = 0;
  for (int id : m.inputs) tokens += m.tensor(id).dtype == DType::i32 && m.tensor(id).shape == Shape{16};
  EXPECT_EQ(tokens, 3);  // input_ids, decoder_input_ids and the targets
  std::vector<const Node*> biases;
  for (const Node& n : m.nodes) {
    EXPECT_NE(n.op, OpKind::opaque) << n.name;
    if (n.op == OpKind::relative_position_bias) biases.push_back(&n);
  }
  ASSERT_EQ(biases.size(), 2u);
  const Node& decoder = biases[0]->attrs.flag("bidirectional") ? *biases[1] : *biases[0];
  EXPECT_FALSE(decoder.attrs.flag("bidirectional"));
  EXPECT_EQ(decoder.attrs.integer("buckets"), 32);
  int masked = 0;
  for (const Node& n : m.nodes) {
    if (n.op != OpKind::causal_mask) continue;
    const Node& add = m.nodes[static_cast<size_t>(m.tensor(n.inputs[0]).producer)];
    EXPECT_EQ(add.op, OpKind::add) << n.name;
    EXPECT_NE(std::find(add.inputs.begin(), add.inputs.end(), decoder.output), add.inputs.end()) << n.name;
    EXPECT_LT(n.attrs.number("value"), -1e38) << n.name;  // finfo(float32).min
    ++masked;
  }
  EXPECT_EQ(masked, 2);  // the decoder's two self-attentions
  o.micro_batch = 2;
  EXPECT_EQ(ops(import_onnx(exports_dir() + "weights/tiny-t5-opset17.onnx", o)), ops(m));
}

// A decoder's positions read from their table by another path than the
// token embedding's Add: BART's learned rows from 2, cast to the embeddings'
// type (`.to(dtype)`), and Speech2Text2's fairseq sinusoids, whose padding
// row (60) is zero, gathered at the positions computed from the ids by a
// flat index and reshaped to [b, T, D]. Each is one pos_embedding; the
// sinusoidal table is read as constants, so the plan counts PyTorch's
// parameters less that frozen table. PyTorch's step on these weights:
// onnx_parity.py --model tiny-bart --model tiny-speech2text2.
TEST(RealExports, DecoderPositionsCastOrReshapedAreOnePositionEmbedding) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 16;
  auto positions = [](const Model& m) {
    std::vector<const Node*> v;
    for (const Node& n : m.nodes) {
      EXPECT_NE(n.op, OpKind::opaque) << n.name;
      if (n.op == OpKind::pos_embedding) v.push_back(&n);
    }
    return v;
  };
  const Model bart = import_onnx(exports_dir() + "weights/tiny-bart-opset17.onnx", o);
  EXPECT_EQ(bart.parameter_count(), 22336);
  const auto b = positions(bart);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0]->attrs.integer("offset"), 2);
  EXPECT_FALSE(b[0]->attrs.has("sinusoidal"));
  const Model s2t = import_onnx(exports_dir() + "weights/tiny-speech2text2-opset17.onnx", o);
  EXPECT_EQ(s2t.parameter_count(), 24320 - 130 * 32);
  const auto s = positions(s2t);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0]->attrs.integer("offset"), 61);
  EXPECT_EQ(s[0]->attrs.text("sinusoidal"), "halves");
  EXPECT_NEAR(s[0]->attrs.number("frequency_step"), std::log(10000.0) / 15, 1e-12);  // fairseq's
  EXPECT_NE(std::find_if(s2t.notes.begin(), s2t.notes.end(),
                         [](const std::string& n) { return n.find("row 60 zero: the padding position's") != std::string::npos; }),
            s2t.notes.end());
}

// Hugging Face's stochastic depth (Swin's drop_path, rate 0.1): x.div(keep) *
// floor(keep + torch.rand([b, 1, 1])), a RandomUniformLike in the file, is the
// IR's drop_path with p = 1 - keep, under both fusions (PyTorch's div keeps
// nothing and its mul only the random tensor, one float a sample, as
// drop_path keeps). Every RandomUniformLike of the file is one, and nothing
// is opaque; the plan is within 0.1 % of PyTorch's saved bytes (the table of
// ImportOutcomesAreTheRecordedOnesAndCountsExact).
TEST(RealExports, StochasticDepthIsOneDropPathABlock) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    ImportOptions o;
    o.fusion = fusion;
    const Model m = import_onnx(exports_dir() + "tiny-hf-swin-opset17.onnx", o);
    int paths = 0;
    for (const Node& n : m.nodes) {
      EXPECT_NE(n.op, OpKind::opaque) << n.name;
      if (n.op != OpKind::drop_path) continue;
      ++paths;
      EXPECT_DOUBLE_EQ(n.attrs.number("p"), 0.1) << n.name;
      EXPECT_EQ(m.tensor(n.output).shape, m.tensor(n.inputs[0]).shape) << n.name;
    }
    EXPECT_EQ(paths, 4);  // the file's four RandomUniformLike, one a block
  }
}

// Hugging Face's MobileViT unfolds each feature map into P = 4 patch
// positions of N = 16 pixels and runs its transformer over [b P, N, C], the
// positions folded into the batch: P attentions a sample, which the IR's
// attention (one sequence a sample, [T, D]) is not. The softmaxes, one a
// transformer layer (2 + 4 + 3 in the config), are planned through the
// generic ops instead of refused, each over the per-sample scores
// [P, heads, N, N]; nothing is opaque, and the parameter count is PyTorch's
// (ImportOutcomesAreTheRecordedOnesAndCountsExact).
TEST(RealExports, AttentionOverPatchesFoldedIntoTheBatchIsPlannedThroughGenericOps) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    ImportOptions o;
    o.fusion = fusion;
    const Model m = import_onnx(exports_dir() + "tiny-hf-mobilevit-opset17.onnx", o);
    int softmaxes = 0;
    for (const Node& n : m.nodes) {
      EXPECT_NE(n.op, OpKind::opaque) << n.name;
      EXPECT_NE(n.op, OpKind::attention) << n.name;
      if (n.op != OpKind::softmax) continue;
      ++softmaxes;
      const Shape& scores = m.tensor(n.inputs[0]).shape;
      ASSERT_EQ(scores.size(), 4u) << n.name;
      EXPECT_EQ(scores[0], 4) << n.name;  // the patch positions, a sample's
      EXPECT_EQ(scores[2], scores[3]) << n.name;
    }
    EXPECT_EQ(softmaxes, 2 + 4 + 3);
  }
}

// TensorFlow's "same" padding written as F.pad (Hugging Face's MobileNets):
// the exporter's Pad, its pads computed by a shape subgraph torch writes for
// F.pad (a Concat, a reversed Slice, a Transpose), is the IR's pad with the
// per-sample pads, before each axis then after (F.pad lists the last axis
// first): (0, 1, 0, 1) on [3, 16, 16] adds a row and a column after; (1, 1,
// 1, 1, 1, 1) with 0.5 adds one before and after on every axis, the
// channels too. Nothing is opaque; the pad keeps nothing (constant_pad_nd).
TEST(RealExports, FPadIsThePadOpWithPerSamplePads) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const Model m = import_onnx(exports_dir() + "weights/tiny-tf-pad-opset17.onnx", ImportOptions{});
  std::vector<const Node*> pads;
  for (const Node& n : m.nodes) {
    EXPECT_NE(n.op, OpKind::opaque) << n.name;
    if (n.op == OpKind::pad) pads.push_back(&n);
  }
  ASSERT_EQ(pads.size(), 2u);
  EXPECT_EQ(pads[0]->attrs.ints("pads"), (std::vector<int64_t>{0, 0, 0, 0, 1, 1}));
  EXPECT_DOUBLE_EQ(pads[0]->attrs.number("value"), 0.0);
  EXPECT_EQ(m.tensor(pads[0]->output).shape, (Shape{3, 17, 17}));
  EXPECT_EQ(pads[1]->attrs.ints("pads"), (std::vector<int64_t>{1, 1, 1, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(pads[1]->attrs.number("value"), 0.5);
  EXPECT_EQ(m.tensor(pads[1]->output).shape, (Shape{10, 10, 10}));
}

// SwiftFormer's additive attention and ConvNeXt V2's response normalization
// (weights/tiny-normalize): F.normalize exports as ReduceL2, a Clip with only
// a minimum, an Expand to x's shape and a Div; the norm is reduce_l2 over the
// width, the clamp a clip whose maximum is the largest float, and the Expand
// is its input (the Div broadcasts, as PyTorch's expand is a view). torch.sum
// over the tokens is reduce_sum over per-sample axis 0; x.repeat(1, T, 1) of
// [b, 1, D] (an Expand to its own shape, then Tile) is one upsample by T; and
// torch.norm over the two middle axes of [b, 4, T / 4, D] is reduce_l2 over
// their product, between two reshapes. Nothing is opaque.
TEST(RealExports, NormalizeSumRepeatAndNormAreIrOps) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 16;
  const Model m = import_onnx(exports_dir() + "weights/tiny-normalize-opset17.onnx", o);
  int norms = 0, sums = 0, clips = 0, upsamples = 0;
  for (const Node& n : m.nodes) {
    EXPECT_NE(n.op, OpKind::opaque) << n.name;
    const Shape& in = m.tensor(n.inputs[0]).shape;
    const Shape& out = m.tensor(n.output).shape;
    if (n.op == OpKind::reduce_l2) {
      ++norms;
      if (norms <= 2) {  // the two F.normalize, over the width of [16, 16]
        EXPECT_EQ(in, (Shape{16, 16})) << n.name;
        EXPECT_EQ(out, (Shape{16, 1})) << n.name;
      } else {  // torch.norm over [4, 4] of [4, 4, 16], merged to [16, 16]
        EXPECT_EQ(in, (Shape{16, 16})) << n.name;
        EXPECT_EQ(n.attrs.integer("axis"), 0) << n.name;
        EXPECT_EQ(out, (Shape{1, 16})) << n.name;
      }
    }
    if (n.op == OpKind::reduce_sum) {
      ++sums;
      EXPECT_EQ(n.attrs.integer("axis"), 0) << n.name;
      EXPECT_EQ(out, (Shape{16})) << n.name;
    }
    if (n.op == OpKind::clip) {
      ++clips;
      EXPECT_DOUBLE_EQ(n.attrs.number("min"), static_cast<double>(1e-12f)) << n.name;  // F.normalize's eps, a float
      EXPECT_DOUBLE_EQ(n.attrs.number("max"), std::numeric_limits<float>::max()) << n.name;
    }
    upsamples += n.op == OpKind::upsample;
  }
  EXPECT_EQ(norms, 3);
  EXPECT_EQ(sums, 1);
  EXPECT_EQ(clips, 2);
  EXPECT_EQ(upsamples, 1);
}

// Parameters read as tensors (weights/tiny-computed-weights): MobileBERT's
// head h @ cat([E^T, W]) reads E, the embedding's table, as a `parameter`
// tied to it, and W as one of its own; their transpose and concat have no
// batch axis, and the matmul that meets the hidden states has. The [1, 4, 4]
// table's leading 1 is the batch's (its parameter is [4, 4]); tanh of a
// [4, 4] parameter viewed as [1, 1, 16] is reshaped to [1, 16] where it
// meets [T, 16]. The step keeps the tensors without the batch axis once,
// whatever the micro-batch: the concat [16, 96] the matmul keeps (6,144
// bytes), sigmoid(g) [16] (mul's operand and sigmoid's output, 64), tanh's
// output [16] (64), u [16, 4] and v [4, 1], which their matmul keeps (272),
// and sigmoid of the learned scalar, [1] (4): 6,548 bytes, and activations
// grow by the same bytes a sample.
TEST(RealExports, ParametersReadAsTensorsAreComputedOncePerStep) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 16;
  const Model m = import_onnx(exports_dir() + "weights/tiny-computed-weights-opset17.onnx", o);
  auto node = [&](const std::string& name) -> const Node& {
    const int k = m.node_index(name);
    EXPECT_GE(k, 0) << name;
    return m.nodes.at(static_cast<size_t>(std::max(k, 0)));
  };
  auto batched = [&](const std::string& name) { return m.output_of(node(name)).batched; };
  EXPECT_EQ(node("embed").op, OpKind::parameter);
  EXPECT_EQ(node("embed").attrs.text("tie"), "embed.Gather");
  EXPECT_EQ(node("extra").op, OpKind::parameter);
  EXPECT_FALSE(node("extra").attrs.has("tie"));
  EXPECT_EQ(m.output_of(node("Concat")).shape, (Shape{16, 96}));
  EXPECT_FALSE(batched("Concat"));
  EXPECT_FALSE(batched("Transpose_2"));
  EXPECT_TRUE(batched("MatMul_1"));
  EXPECT_EQ(node("MatMul_1").op, OpKind::matmul);
  EXPECT_EQ(node("table").attrs.ints("shape"), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(m.output_of(node("Tanh_1_output_0.per_sample")).shape, (Shape{1, 16}));
  for (const Node& n : m.nodes) EXPECT_NE(n.op, OpKind::opaque) << n.name;
  // Parameters: PyTorch's 1,893, the tied table counted once.
  EXPECT_EQ(m.parameter_count(), 1893);
  const int64_t a1 = max_activations(m), a2 = max_activations(m, AttentionImpl::math, 2),
                a5 = max_activations(m, AttentionImpl::math, 5);
  EXPECT_EQ(a5 - a2, 3 * (a2 - a1));
  EXPECT_EQ(2 * a1 - a2, 6548);  // the part that does not grow with the micro-batch
}

// A GELU written in Python (ESM's x * 0.5 * (1 + erf(x / sqrt 2)): 0.5 x is
// its own node) is planned op by op under --fusion eager, the IR's erf
// among them, as PyTorch's eager autograd runs it (erf keeps x / sqrt 2, the
// product both factors: three tensors of x's size where F.gelu keeps x);
// torch's own export of F.gelu (BERT's: * 0.5 last) stays one gelu, which
// is one op in PyTorch too. Under the default fusion both are gelu.
TEST(RealExports, AGeluWrittenInPythonIsOpByOpUnderEagerAndTorchsIsOneGelu) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  auto count = [](const Model& m, OpKind op) {
    return std::count_if(m.nodes.begin(), m.nodes.end(), [&](const Node& n) { return n.op == op; });
  };
  ImportOptions o;
  o.seq_len = 16;
  o.fusion = FusionMode::eager;
  const Model esm = import_onnx(exports_dir() + "weights/tiny-esm-opset17.onnx", o);
  EXPECT_EQ(count(esm, OpKind::erf), 3);  // two layers' MLPs and the head's transform
  EXPECT_EQ(count(esm, OpKind::gelu), 0);
  const Model bert = import_onnx(exports_dir() + "weights/tiny-bert-opset17.onnx", o);
  EXPECT_EQ(count(bert, OpKind::erf), 0);
  EXPECT_EQ(count(bert, OpKind::gelu), 3);
  o.fusion = FusionMode::engine;
  const Model fused = import_onnx(exports_dir() + "weights/tiny-esm-opset17.onnx", o);
  EXPECT_EQ(count(fused, OpKind::erf), 0);
  EXPECT_EQ(count(fused, OpKind::gelu), 3);
}

// DeBERTa adds its query and value biases after splitting the heads:
// transpose_for_scores(q_bias[None, None, :]), a [D] parameter unsqueezed,
// viewed as [1, 1, H, d] and permuted to [1, H, 1, d], none of it reading the
// batch. Its elements keep their order, so the Add is the IR's shift over
// [H, 1, d] per sample, with the parameter read whole from q_bias (its
// values against PyTorch's: onnx_parity.py --model tiny-deberta). XSoftmax's
// two masked fills a layer fill nothing under the default mask of ones:
// no-ops (with the embeddings' multiply by that mask, 5), no opaque op left.
TEST(RealExports, AParameterViewedPerHeadIsAShiftOfTheViewsShape) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 16;
  const std::string file = exports_dir() + "weights/tiny-deberta-opset17.onnx";
  const Model m = import_onnx(file, o);
  int shifts = 0;
  for (const Node& n : m.nodes) {
    EXPECT_NE(n.op, OpKind::opaque) << n.name;
    if (n.op != OpKind::shift || n.attrs.ints("shape").size() != 3) continue;  // (its layer norms' biases: [32])
    ++shifts;
    EXPECT_EQ(n.attrs.ints("shape"), (std::vector<int64_t>{4, 1, 8})) << n.name;
    EXPECT_EQ(m.tensor(n.inputs[0]).shape, (Shape{4, 16, 8})) << n.name;
  }
  EXPECT_EQ(shifts, 4);  // q_bias and v_bias of two layers
  EXPECT_EQ(m.parameter_count(), 23424);  // PyTorch's (make_weighted.py)
  int biases = 0;
  for (const auto& w : import_onnx_weights(file, o)) {
    if (w.source.find("q_bias") == std::string::npos && w.source.find("v_bias") == std::string::npos) continue;
    ++biases;
    EXPECT_EQ(w.values.size(), 32u) << w.name;
  }
  EXPECT_EQ(biases, 4);
  EXPECT_NE(std::find_if(m.notes.begin(), m.notes.end(),
                         [](const std::string& s) { return s.find("5 elementwise ops with constants") == 0; }),
            m.notes.end());
}

// Fixed sinusoidal positions: XGLM's table (a Constant gathered at the
// positions from row 2, fairseq's [sin | cos] halves) and PyTorch's tutorial
// PositionalEncoding (a buffer pe sliced to the sequence, Vaswani's
// interleaved pairs) are each one pos_embedding with `sinusoidal`, no
// parameter and no opaque op; the buffer is not counted (PyTorch's count,
// from weighted_models.py, excludes buffers).
TEST(RealExports, SinusoidalPositionsAreOnePosEmbeddingWithoutATable) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  struct Case {
    const char* file;
    const char* layout;
    int64_t offset;
    double step;
    int64_t parameters;
  };
  for (const Case& c : {Case{"weights/tiny-xglm-opset17.onnx", "halves", 2, std::log(10000.0) / 15, 20224},
                        Case{"weights/tiny-posenc-opset17.onnx", "interleaved", 0, std::log(10000.0) / 16, 23328}}) {
    ImportOptions o;
    o.seq_len = 16;
    const Model m = import_onnx(exports_dir() + c.file, o);
    int found = 0;
    for (const Node& n : m.nodes) {
      EXPECT_NE(n.op, OpKind::opaque) << c.file << ": " << n.name;
      if (n.op != OpKind::pos_embedding) continue;
      ++found;
      EXPECT_EQ(n.attrs.text("sinusoidal"), c.layout) << c.file;
      EXPECT_EQ(n.attrs.has("offset") ? n.attrs.integer("offset") : 0, c.offset) << c.file;
      EXPECT_NEAR(n.attrs.number("frequency_step"), c.step, 1e-12) << c.file;
      EXPECT_EQ(m.tensor(n.inputs[0]).shape, (Shape{16, 32})) << c.file;
    }
    EXPECT_EQ(found, 1) << c.file;
    EXPECT_EQ(m.parameter_count(), c.parameters) << c.file;
  }
}

// RoFormer's rotary sines and cosines are gathered from a frozen
// nn.Parameter whose values are fixed sinusoidal positions (sines then
// cosines, from row 0): the fold reads them as constants, so queries and keys
// get the IR's rope with interleaved pairs (rotate_every_two), no opaque op,
// and the plan counts PyTorch's trained parameters (22,016 less the table's
// 64 x 8, from weighted_models.py); the note names the table.
TEST(RealExports, AFrozenSinusoidalTableIsReadAsConstants) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 16;
  const Model m = import_onnx(exports_dir() + "weights/tiny-roformer-opset17.onnx", o);
  int ropes = 0;
  for (const Node& n : m.nodes) {
    EXPECT_NE(n.op, OpKind::opaque) << n.name;
    if (n.op != OpKind::rope) continue;
    ++ropes;
    EXPECT_TRUE(n.attrs.flag("interleaved")) << n.name;
    EXPECT_DOUBLE_EQ(n.attrs.number("theta"), 10000.0) << n.name;
  }
  EXPECT_EQ(ropes, 4);  // queries and keys of two layers
  EXPECT_EQ(m.parameter_count(), 22016 - 64 * 8);
  EXPECT_NE(std::find_if(m.notes.begin(), m.notes.end(),
                         [](const std::string& s) {
                           return s.find("'inner.roformer.encoder.embed_positions.weight' holds fixed sinusoidal "
                                         "positions (64 x 8") == 0;
                         }),
            m.notes.end());
}

// A --seq-len past the positions a model was exported with (128 here) reads
// its position table, or the rotary tables computed from it, past the end:
// the import stops at that Gather, naming it and the index, where it had
// stopped later at a node with no shape ("op 'Gather' is not supported").
TEST(RealExports, ASequenceLongerThanThePositionsNamesTheGather) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const auto& [file, node] : {std::pair{"tiny-gpt2-opset17.onnx", "/inner/transformer/wpe/Gather"},
                                   std::pair{"tiny-gptj-opset17.onnx", "/inner/transformer/h.0/attn/GatherElements"},
                                   std::pair{"tiny-llama-opset17.onnx", "/inner/model/layers.0/self_attn/Gather_3"}}) {
    ImportOptions o;
    o.seq_len = 256;
    const std::string msg = dlplan::testing::error_of([&] { import_onnx(exports_dir() + file, o); });
    EXPECT_EQ(msg.rfind(exports_dir() + file + ": node '" + node + "'", 0), 0u) << msg;
    EXPECT_NE(msg.find("index 128 is outside"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--seq-len"), std::string::npos) << msg;
    o.seq_len = 128;  // the longest the tables hold
    EXPECT_NO_THROW(import_onnx(exports_dir() + file, o)) << file;
  }
}

// BERT's token_type_ids are a buffer of the 128 positions, sliced to the
// sequence (Slice clamps at 128) and expanded to [b, T]: past 128 the Expand
// cannot broadcast, and the import stops there, naming both shapes, where it
// had stopped at the Gather reading them ("indices ... could not evaluate").
TEST(RealExports, ASequenceLongerThanBertsTokenTypesNamesTheExpand) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string file = exports_dir() + "tiny-bert-opset17.onnx";
  ImportOptions o;
  o.seq_len = 256;
  const std::string msg = dlplan::testing::error_of([&] { import_onnx(file, o); });
  EXPECT_EQ(msg.rfind(file + ": node '/inner/bert/Expand' (Expand): cannot expand", 0), 0u) << msg;
  EXPECT_NE(msg.find("of shape [1, 128] to [1, 256]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--seq-len"), std::string::npos) << msg;
  o.seq_len = 128;
  EXPECT_NO_THROW(import_onnx(file, o));
}

// torch writes its own nn.GELU(approximate="tanh") out at opset 17 (no Gelu op
// before opset 20), with the cube as x * (x * x); Hugging Face's gelu_new
// writes torch.pow(x, 3.0). PyTorch runs the first as one op, so it is one
// gelu under both fusions, where gelu_new is op by op under --fusion eager.
// GPT-NeoX's attention is not the pattern: its scores come from baddbmm over
// the batch folded with the heads ([b H, T, hd]) and pass a causal
// torch.where, and its RoPE multiplies by cos and sin tables the importer
// evaluates. Both products (q k^T and probabilities times values) plan as the
// generic matmul (keeping both operands), the softmax as softmax (keeping its
// output), the torch.where as a causal_mask that fills with finfo.min
// (keeping nothing), and its rotate-half RoPE by those tables, once every
// value is checked, as the IR's rope on the rotary quarter of each head
// (keeping nothing: the tables are constants). Nothing opaque is left, so it
// trains (RealExportTrains; its step equals PyTorch's: tools.onnx_parity,
// tiny-gpt-neox). The mask's zeros are the only constants passed through.
// Parameters exact; activations a known gap (kKnownGaps).
TEST(RealExports, GPTNeoXsAttentionPlansThroughGenericMatmulAndSoftmax) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto& ref = reference()["files"]["tiny-gpt-neox-opset17.onnx"];
  const Outcome o = import_file("tiny-gpt-neox-opset17.onnx", ref);
  ASSERT_TRUE(o.model.has_value()) << o.error;
  std::map<OpKind, int> ops;
  for (const Node& n : o.model->nodes) {
    ops[n.op] += 1;
    if (n.op == OpKind::rope) {
      EXPECT_EQ(n.attrs.number("theta"), 10000.0) << n.name;
      EXPECT_EQ(o.model->tensor(n.output).shape.back(), 8) << n.name;  // rotary_pct 0.25 of 32
    }
  }
  EXPECT_EQ(ops[OpKind::softmax], 2);
  EXPECT_EQ(ops[OpKind::matmul], 4);
  EXPECT_EQ(ops[OpKind::causal_mask], 2);
  EXPECT_EQ(ops[OpKind::rope], 4);  // q and k, two layers
  EXPECT_EQ(ops[OpKind::opaque], 0);
  EXPECT_EQ(ops[OpKind::attention], 0);
  EXPECT_EQ(o.model->parameter_count(), ref["parameters"].get<int64_t>());
  bool neutral_noted = false;
  for (const auto& note : o.model->notes)
    neutral_noted = neutral_noted || note.find("2 elementwise ops with constants") != std::string::npos;
  EXPECT_TRUE(neutral_noted);
}

// OPT folds the batch with the heads ([b H, T, hd]) for both bmm's, adds a
// causal mask of finfo.min it builds from the sequence length, clamps the
// scores at finfo.min with torch.max, and reads its learned positions from
// row 2 (a cumulative sum of its all-ones attention mask, plus 2). All of it
// plans through generic ops with no opaque one left, and per sample: bound to
// a batch of 3 at import, the file gives the same IR, so the fold is followed,
// not fixed at import. (Its step equals PyTorch's: tools.onnx_parity, tiny-opt.)
TEST(RealExports, OPTsFoldedHeadsCausalMaskAndOffsetPositionsPlanPerSample) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto& ref = reference()["files"]["tiny-opt-opset17.onnx"];
  const Outcome o = import_file("tiny-opt-opset17.onnx", ref);
  ASSERT_TRUE(o.model.has_value()) << o.error;
  std::map<OpKind, int> ops;
  for (const Node& n : o.model->nodes) {
    ops[n.op] += 1;
    if (n.op == OpKind::causal_mask) {
      EXPECT_FALSE(n.attrs.flag("fill")) << n.name;
      EXPECT_EQ(n.attrs.number("value"), static_cast<double>(std::numeric_limits<float>::lowest())) << n.name;
    }
    if (n.op == OpKind::clip) {
      EXPECT_EQ(n.attrs.number("min"), static_cast<double>(std::numeric_limits<float>::lowest())) << n.name;
    }
    if (n.op == OpKind::pos_embedding) {
      EXPECT_EQ(n.attrs.integer("offset"), 2) << n.name;
    }
  }
  EXPECT_EQ(ops[OpKind::opaque], 0);
  EXPECT_EQ(ops[OpKind::attention], 0);
  EXPECT_EQ(ops[OpKind::matmul], 4);
  EXPECT_EQ(ops[OpKind::softmax], 2);
  EXPECT_EQ(ops[OpKind::causal_mask], 2);
  EXPECT_EQ(ops[OpKind::clip], 2);
  EXPECT_EQ(ops[OpKind::pos_embedding], 1);
  EXPECT_EQ(o.model->parameter_count(), ref["parameters"].get<int64_t>());
  ImportOptions one;
  one.seq_len = ref["options"]["sequence"].get<int64_t>();
  expect_same_ir_at_batch(*o.model, "tiny-opt-opset17.onnx", one, 3);
}

// nn.GLU exports as Split, Sigmoid and Mul. A Split of an activation is one
// slice per part (it was not mapped, and the Sigmoid after it refused the
// file); PyTorch's glu keeps its input, which the two parts kept as copies
// match to the byte, under both fusions.
TEST(RealExports, GLUsSplitIsASlicePerPart) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto& ref = reference()["files"]["tiny-mlp-glu-opset17.onnx"];
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    const Outcome o = import_file("tiny-mlp-glu-opset17.onnx", ref, fusion);
    ASSERT_TRUE(o.model.has_value()) << o.error;
    std::vector<std::pair<int64_t, int64_t>> parts;
    for (const Node& n : o.model->nodes) {
      EXPECT_NE(n.op, OpKind::opaque) << n.name;
      if (n.op != OpKind::slice) continue;
      EXPECT_EQ(n.attrs.integer("axis"), 0) << n.name;
      EXPECT_FALSE(n.attrs.has("view")) << n.name;
      parts.emplace_back(n.attrs.integer("start"), n.attrs.integer("end"));
    }
    EXPECT_EQ(parts, (std::vector<std::pair<int64_t, int64_t>>{{0, 128}, {128, 256}}));
    EXPECT_EQ(o.model->parameter_count(), ref["parameters"].get<int64_t>());
    const auto torch_act = ref["saved_bytes_with_loss_mask_dropout"].get<int64_t>();
    EXPECT_NEAR(static_cast<double>(max_activations(*o.model)), static_cast<double>(torch_act), 0.05 * torch_act);
  }
}

// GPT-BigCode's multi-query attention reshapes its scores to [b, T, H, T]
// and masks them with a causal torch.where over a [1, T, 1, T] mask: the
// queries' axis is not the second to last. The where is the IR's
// causal_mask with query_axis 0 (it was opaque: planned, not trainable).
// (Its step equals PyTorch's: tools.onnx_parity, tiny-gpt-bigcode.)
TEST(RealExports, GPTBigCodesMultiQueryScoresTakeACausalMaskOverTheirQueryAxis) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto& ref = reference()["files"]["tiny-gpt-bigcode-opset17.onnx"];
  const Outcome o = import_file("tiny-gpt-bigcode-opset17.onnx", ref);
  ASSERT_TRUE(o.model.has_value()) << o.error;
  int masks = 0;
  for (const Node& n : o.model->nodes) {
    EXPECT_NE(n.op, OpKind::opaque) << n.name;
    if (n.op != OpKind::causal_mask) continue;
    ++masks;
    EXPECT_EQ(n.attrs.integer("query_axis"), 0) << n.name;
    EXPECT_TRUE(n.attrs.flag("fill")) << n.name;
    EXPECT_EQ(o.model->tensor(n.inputs[0]).shape, (Shape{64, 4, 64})) << n.name;
  }
  EXPECT_EQ(masks, 2);
  EXPECT_EQ(o.model->parameter_count(), ref["parameters"].get<int64_t>());
}

// h - h.mean(-1, keepdim=True) and a division by another activation: Sub
// and Div of two activations were opaque (planned, not trainable). They are
// a + (-1 b), a broadcasting add ([128] + [1]), and a (1 / b): the bytes
// PyTorch keeps (sub keeps nothing, div its two operands), with the
// parameters exact.
TEST(RealExports, SubAndDivOfActivationsAreAddAndMul) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto& ref = reference()["files"]["tiny-mlp-arith-opset17.onnx"];
  const Outcome o = import_file("tiny-mlp-arith-opset17.onnx", ref);
  ASSERT_TRUE(o.model.has_value()) << o.error;
  std::map<OpKind, int> ops;
  bool broadcast_add = false;
  for (const Node& n : o.model->nodes) {
    ops[n.op] += 1;
    if (n.op == OpKind::add)
      broadcast_add = broadcast_add || (o.model->tensor(n.inputs[0]).shape == Shape{128} &&
                                        o.model->tensor(n.inputs[1]).shape == Shape{1});
  }
  EXPECT_EQ(ops[OpKind::opaque], 0);
  EXPECT_TRUE(broadcast_add);
  EXPECT_EQ(ops[OpKind::reciprocal], 1);
  EXPECT_EQ(ops[OpKind::reduce_mean], 1);
  EXPECT_EQ(o.model->parameter_count(), ref["parameters"].get<int64_t>());
  const auto torch_act = ref["saved_bytes_with_loss_mask_dropout"].get<int64_t>();
  EXPECT_NEAR(static_cast<double>(max_activations(*o.model)), static_cast<double>(torch_act), 0.05 * torch_act);
}

// RoBERTa computes its positions from the ids (transformers'
// create_position_ids_from_input_ids: cumsum of ids != pad, times the mask,
// plus pad). The importer evaluates them assuming no token is the padding id
// 1, which makes them rows 2 ... T + 1 of the table: a pos_embedding at
// offset 2, as PyTorch reads it for an unpadded batch, and the assumption is
// in the notes. Before, the file was refused at the Equal.
TEST(RealExports, RoBERTasPositionsFromTheIdsAssumeNoPadding) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto& ref = reference()["files"]["tiny-roberta-opset17.onnx"];
  const Outcome o = import_file("tiny-roberta-opset17.onnx", ref);
  ASSERT_TRUE(o.model.has_value()) << o.error;
  std::map<OpKind, int> ops;
  for (const Node& n : o.model->nodes) {
    ops[n.op] += 1;
    if (n.op == OpKind::pos_embedding && n.attrs.integer("max_len") == 130) {  // the positions' table
      EXPECT_EQ(n.attrs.integer("offset"), 2) << n.name;
    }
  }
  EXPECT_EQ(ops[OpKind::pos_embedding], 2);  // positions, and the token type's row 0
  EXPECT_EQ(ops[OpKind::attention], 2);
  EXPECT_EQ(ops[OpKind::opaque], 0);
  EXPECT_EQ(o.model->parameter_count(), ref["parameters"].get<int64_t>());
  const bool noted = std::any_of(o.model->notes.begin(), o.model->notes.end(), [](const std::string& s) {
    return s.find("assume no token equals the padding id 1, so they are 2 ... 65") != std::string::npos;
  });
  EXPECT_TRUE(noted) << fmt::format("{}", fmt::join(o.model->notes, "\n"));
}

// XLM computes its lengths and padding mask from the ids ((ids != pad)
// summed, then arange < length), multiplies the hidden states by the mask
// after every block and fills the scores where it is 0; its positions are
// broadcast over the batch (expand_as) before their Add. The importer folds
// the mask assuming no token is the padding id 60 (the note says so): the
// multiplies are no-ops, the attention is the IR's, nothing is opaque, and
// the parameters are PyTorch's (30,688, weighted_models.py; one step equals
// PyTorch's on a batch without the padding id: onnx_parity.py, tiny-xlm).
TEST(RealExports, XLMsPaddingMaskAssumesNoPadding) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 16;
  const Model m = import_onnx(exports_dir() + "weights/tiny-xlm-opset17.onnx", o);
  std::map<OpKind, int> ops;
  for (const Node& n : m.nodes) ops[n.op] += 1;
  EXPECT_EQ(ops[OpKind::opaque], 0);
  EXPECT_EQ(ops[OpKind::attention], 2);
  EXPECT_EQ(ops[OpKind::pos_embedding], 1);
  EXPECT_EQ(m.parameter_count(), 30688);
  const bool noted = std::any_of(m.notes.begin(), m.notes.end(), [](const std::string& s) {
    return s.find("that are not 60 (a padding mask, as XLM's) assumes no token equals the padding id 60") !=
           std::string::npos;
  });
  EXPECT_TRUE(noted) << fmt::format("{}", fmt::join(m.notes, "\n"));
}

// I-BERT (float mode) writes its LayerNorm out in Python: mean, x - mean,
// the mean of its square, / sqrt(var + eps), x * weight + bias. At opset 17,
// where torch writes nn.LayerNorm as LayerNormalization, such ops are
// Python's math: under --fusion eager they are planned one by one, the
// bias the IR's shift (a learned tensor added, keeping nothing), and under
// the default fusion they are one layernorm. Both count PyTorch's
// parameters (weighted_models.py); one step equals PyTorch's under each
// (onnx_parity.py, tiny-ibert).
TEST(RealExports, IBertsWrittenOutLayerNormIsOpByOpUnderEager) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string file = exports_dir() + "weights/tiny-ibert-opset17.onnx";
  ImportOptions o;
  o.seq_len = 16;
  const Model engine = import_onnx(file, o);
  o.fusion = FusionMode::eager;
  const Model eager = import_onnx(file, o);
  std::map<OpKind, int> e, g;
  for (const Node& n : engine.nodes) g[n.op] += 1;
  for (const Node& n : eager.nodes) e[n.op] += 1;
  // Five written out (the embeddings', two a layer) and the head's
  // nn.LayerNorm, a LayerNormalization under either fusion.
  EXPECT_EQ(g[OpKind::layernorm], 6);
  EXPECT_EQ(g[OpKind::shift], 0);
  EXPECT_EQ(e[OpKind::layernorm], 1);
  EXPECT_EQ(e[OpKind::shift], 5);
  EXPECT_EQ(e[OpKind::scale], 5);
  EXPECT_EQ(e[OpKind::opaque], 0);
  EXPECT_EQ(g[OpKind::opaque], 0);
  EXPECT_EQ(engine.parameter_count(), eager.parameter_count());
}

// BLOOM adds ALiBi's bias (a constant [b H, 1, T] the importer evaluates and
// checks against the slopes of Press et al. for 4 heads) to scores on the
// batch folded with the heads, reads its fused query_key_value at 0, 1 and 2
// of an axis (a width-1 slice each, where the Gather was opaque and kept the
// whole projection three times), masks with masked_fill (a filling
// causal_mask) and writes the tanh GELU its own way, which PyTorch runs as a
// custom Function keeping only its input: one gelu under both fusions.
// Nothing opaque is left, the IR is the same at batch 3, and the
// activations are within 5 % (the outcomes test; its step equals PyTorch's:
// tools.onnx_parity, tiny-bloom).
TEST(RealExports, BLOOMsAlibiFusedQkvAndGeluPlanWithoutOpaqueOps) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto& ref = reference()["files"]["tiny-bloom-opset17.onnx"];
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    const Outcome o = import_file("tiny-bloom-opset17.onnx", ref, fusion);
    ASSERT_TRUE(o.model.has_value()) << o.error;
    std::map<OpKind, int> ops;
    for (const Node& n : o.model->nodes) {
      ops[n.op] += 1;
      if (n.op == OpKind::causal_mask) {
        EXPECT_TRUE(n.attrs.flag("fill")) << n.name;
      }
    }
    EXPECT_EQ(ops[OpKind::opaque], 0) << to_string(fusion);
    EXPECT_EQ(ops[OpKind::alibi], 2) << to_string(fusion);
    EXPECT_EQ(ops[OpKind::causal_mask], 2) << to_string(fusion);
    EXPECT_EQ(ops[OpKind::slice], 6) << to_string(fusion);
    EXPECT_EQ(ops[OpKind::gelu], 2) << to_string(fusion);
    EXPECT_EQ(ops[OpKind::tanh], 0) << to_string(fusion);
    EXPECT_EQ(o.model->parameter_count(), ref["parameters"].get<int64_t>());
  }
  ImportOptions one;
  one.seq_len = ref["options"]["sequence"].get<int64_t>();
  expect_same_ir_at_batch(*import_file("tiny-bloom-opset17.onnx", ref).model, "tiny-bloom-opset17.onnx", one, 3);
}

// ALiBi's slopes for a power-of-two head count are 2^(-8/n), its square, ...
// (Press et al. 2022, Sec. 3: 1/2, 1/4, ..., 1/256 for 8 heads); for 6 heads,
// those of 4 and then the odd powers of 2^(-4/4) = 1/2 (BLOOM's rule).
TEST(Alibi, SlopesFollowThePaperAndBloomsRuleForOtherHeadCounts) {
  const auto eight = alibi_slopes(8);
  ASSERT_EQ(eight.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_DOUBLE_EQ(eight[static_cast<size_t>(h)], std::pow(0.5, h + 1));
  const auto six = alibi_slopes(6);
  const std::vector<double> want = {std::pow(2.0, -2), std::pow(2.0, -4), std::pow(2.0, -6), std::pow(2.0, -8),
                                    0.5, 0.125};
  ASSERT_EQ(six.size(), want.size());
  for (size_t h = 0; h < want.size(); ++h) EXPECT_DOUBLE_EQ(six[h], want[h]) << h;
}

// Swin's window geometry, worked by hand from torchvision 0.14's code. The
// relative index of a 2 x 2 window reads a 3 x 3 table at (dy + 1) * 3 +
// (dx + 1) for the query's offset from the key; a 7 x 7 window's first entry
// is (6, 6): 84, its largest 12 * 13 + 12 = 168. The mask of a 4 x 4 map in
// 2 x 2 windows rolled by 1: rows (and columns) 0-1, 2 and 3 are regions 0, 1
// and 2 (slices (0, -2), (-2, -1), (-1, None)), so the top-left window
// hides nothing, the bottom-right one every pair of different positions,
// and the top-right one keeps (0, 2) and (1, 3) apart from the others.
TEST(SwinWindows, RelativeIndexAndShiftedMaskAreTorchvisions) {
  EXPECT_EQ(window_relative_index(0, 0, 2, 2), 4);
  EXPECT_EQ(window_relative_index(0, 3, 2, 2), 0);
  EXPECT_EQ(window_relative_index(3, 0, 2, 2), 8);
  EXPECT_EQ(window_relative_index(1, 2, 2, 2), 2);
  EXPECT_EQ(window_relative_index(0, 0, 7, 7), 84);
  EXPECT_EQ(window_relative_index(48, 0, 7, 7), 168);
  const std::array<int64_t, 2> grid{2, 2}, win{2, 2}, shift{1, 1};
  for (int64_t p = 0; p < 4; ++p)
    for (int64_t q = 0; q < 4; ++q) {
      EXPECT_FALSE(window_mask_hides(0, p, q, grid, win, shift)) << p << " " << q;
      EXPECT_EQ(window_mask_hides(3, p, q, grid, win, shift), p != q) << p << " " << q;
      EXPECT_EQ(window_mask_hides(1, p, q, grid, win, shift), p % 2 != q % 2) << p << " " << q;
    }
}

// BEiT's index (transformers 4.38's BeitRelativePositionBias, by hand): a
// 2 x 2 window and a class token at 0 read a 3 x 3 + 3 = 12-row table; the
// patches (p, q >= 1) read Swin's index of p - 1, q - 1; the class token's
// row to the patches is 9, the patches' column to it 10, itself 11.
TEST(SwinWindows, BeitsIndexAddsThreeRowsForTheClassToken) {
  EXPECT_EQ(window_relative_index_with_cls(0, 0, 2, 2), 11);
  EXPECT_EQ(window_relative_index_with_cls(0, 3, 2, 2), 9);
  EXPECT_EQ(window_relative_index_with_cls(4, 0, 2, 2), 10);
  EXPECT_EQ(window_relative_index_with_cls(1, 4, 2, 2), 0);  // Swin's (0, 3)
  EXPECT_EQ(window_relative_index_with_cls(4, 1, 2, 2), 8);  // Swin's (3, 0)
  EXPECT_EQ(window_relative_index_with_cls(1, 1, 2, 2), 4);
}

// Hugging Face's BEiT (relative position bias in every layer, stochastic
// depth 0.1, layer scale, mean pooling): each layer's table, [(2 Wh - 1)
// (2 Ww - 1) + 3, H] for 8 x 8 patches and the class token, is the IR's
// window_position_bias with cls (the file's index equal to
// window_relative_index_with_cls at every entry); nothing opaque.
TEST(RealExports, BeitsRelativePositionBiasHasTheClassTokensRows) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const Model m = import_onnx(exports_dir() + "tiny-hf-beit-opset17.onnx", ImportOptions{});
  int biases = 0, paths = 0;
  for (const Node& n : m.nodes) {
    EXPECT_NE(n.op, OpKind::opaque) << n.name;
    paths += n.op == OpKind::drop_path;
    if (n.op != OpKind::window_position_bias) continue;
    ++biases;
    EXPECT_EQ(n.attrs.pair("window"), (std::array<int64_t, 2>{8, 8})) << n.name;
    EXPECT_TRUE(n.attrs.flag("cls")) << n.name;
    EXPECT_EQ(m.tensor(n.inputs[0]).shape, (Shape{4, 65, 65})) << n.name;
  }
  EXPECT_EQ(biases, 2);  // one table a layer
  EXPECT_GT(paths, 0);
  int64_t tables = 0;
  for (const ParamInfo& p : m.params)
    if (p.shape == Shape{15 * 15 + 3, 4}) tables += p.numel;
  EXPECT_EQ(tables, 2 * (15 * 15 + 3) * 4);
}

TEST(RealExports, TorchsOwnTanhGeluIsOneOpUnderBothFusions) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    ImportOptions o;
    o.fusion = fusion;
    const Model m = import_onnx(exports_dir() + "tiny-mlp-gelu-tanh-opset17.onnx", o);
    int gelus = 0, written_out = 0;
    for (const Node& n : m.nodes) {
      gelus += n.op == OpKind::gelu && n.attrs.text("approximate") == "tanh";
      written_out += n.op == OpKind::pow || n.op == OpKind::affine || n.op == OpKind::tanh || n.op == OpKind::mul;
    }
    EXPECT_EQ(gelus, 1) << to_string(fusion);
    EXPECT_EQ(written_out, 0) << to_string(fusion);
  }
}

// A file of tests/fixtures/exports/weights imported under `fusion`, held to
// PyTorch's figures for its model (make_exports.saved_bytes, batch 1): the
// parameter count exactly, and the planned activations within 5 % of
// `torch_bytes` less `known_gap` (a gap the fusion is known to leave).
Model expect_pytorchs_figures(const std::string& file, FusionMode fusion, int64_t params, double torch_bytes,
                              double known_gap = 0, int64_t sequence = 0) {
  nlohmann::json options = nlohmann::json::object();
  if (sequence > 0) options["sequence"] = sequence;  // a token model's symbolic sequence axis
  const Outcome o = import_file("weights/" + file, {{"options", options}}, fusion);
  if (!o.model) {
    ADD_FAILURE() << file << ": " << o.error;
    return Model{};
  }
  EXPECT_EQ(o.model->parameter_count(), params) << file;
  const double planned = static_cast<double>(max_activations(*o.model));
  EXPECT_NEAR(planned, torch_bytes - known_gap, 0.05 * torch_bytes) << file;
  std::cout << fmt::format("{} ({}): {} bytes planned, PyTorch {} ({:+.1f} %)\n", file, to_string(fusion), planned,
                           torch_bytes, 100 * (planned / torch_bytes - 1));
  for (const Node& n : o.model->nodes) EXPECT_NE(n.op, OpKind::opaque) << file << " " << n.name;
  return *o.model;
}

// nn.GroupNorm as torch writes it: Reshape to [b, G, -1], an
// InstanceNormalization with unit scales, Reshape back, Mul and Add of the
// unsqueezed weight and bias (affine=False: * 1 and + 0). Each is one
// groupnorm under both fusions (PyTorch runs native_group_norm), keeping its
// input and a mean and rstd per group, as derivatives.yaml's
// native_group_norm_backward reads them. PyTorch's figures for this file's
// model (weighted_models.py's TinyGroupNorm, batch 1): 6,570 parameters and
// 82,396 bytes saved with the loss (make_exports.saved_bytes). By hand: the
// three normalised inputs (16x16x16, 32x8x8, 32x8x8 floats: 16,384 + 8,192 +
// 8,192 bytes), their statistics (2 x 4 x (4 + 32 + 1) = 296), SiLU's input
// and output (2 x 16,384; the output is conv2's input), the two ReLUs'
// outputs (2 x 8,192) and the head's input (128): 82,344, plus the loss's 52.
// (Its step equals PyTorch's: tools.onnx_parity, tiny-groupnorm.)
TEST(RealExports, GroupNormsReshapeInstanceNormReshapeIsOneGroupnorm) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    const Model m = expect_pytorchs_figures("tiny-groupnorm-opset17.onnx", fusion, 6570, 82396);
    std::vector<std::tuple<int64_t, bool, Shape>> norms;
    for (const Node& n : m.nodes) {
      EXPECT_NE(n.op, OpKind::reshape) << n.name;
      EXPECT_NE(n.op, OpKind::scale) << n.name;
      if (n.op == OpKind::groupnorm)
        norms.emplace_back(n.attrs.integer("groups"), n.attrs.flag("affine"), m.tensor(n.inputs[0]).shape);
    }
    EXPECT_EQ(norms, (std::vector<std::tuple<int64_t, bool, Shape>>{
                         {4, true, {16, 16, 16}}, {32, true, {32, 8, 8}}, {1, false, {32, 8, 8}}}));
  }
}

// nn.Upsample(scale_factor=2) and F.interpolate(scale_factor=(1, 3)) export
// as ONNX Resize (nearest, asymmetric, floor; scales from a folded Concat):
// each is one upsample by whole factors, which keeps nothing
// (upsample_nearest2d_backward needs only the sizes). PyTorch's figures for
// weighted_models.py's TinyUNet (GroupNorm and SiLU blocks, a max pool down,
// the skip concatenated after the upsample), batch 1: 3,282 parameters and
// 104,644 bytes saved with the loss. By hand: each block keeps its
// convolution's input, the GroupNorm's input and statistics and the SiLU's
// input; the max pool its input and int64 indices; the mean its input
// [8, 16, 48]; nothing keeps the upsamples' outputs but the concatenation's
// consumer: 104,592, plus the loss's 52.
TEST(RealExports, ResizeByWholeFactorsIsANearestUpsample) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    // The default fusion's max pool keeps only its int32 indices (docs/onnx.md):
    // not PyTorch's input [8, 16, 16] nor the indices' other 4 bytes, 10,240 bytes.
    const double gap = fusion == FusionMode::engine ? 8192 + 2048 : 0;
    const Model m = expect_pytorchs_figures("tiny-unet-opset17.onnx", fusion, 3282, 104644, gap);
    std::vector<std::pair<Shape, Shape>> ups;  // (input, output) of each upsample
    int norms = 0;
    for (const Node& n : m.nodes) {
      norms += n.op == OpKind::groupnorm;
      if (n.op == OpKind::upsample) ups.emplace_back(m.tensor(n.inputs[0]).shape, m.tensor(n.output).shape);
    }
    EXPECT_EQ(norms, 3);
    EXPECT_EQ(ups, (std::vector<std::pair<Shape, Shape>>{{{16, 8, 8}, {16, 16, 16}}, {{8, 16, 16}, {8, 16, 48}}}));
  }
}

// F.interpolate(mode="bilinear"), nn.Upsample(mode="bilinear",
// align_corners=True) and F.interpolate(mode="linear") export as ONNX Resize,
// mode linear, with half_pixel and align_corners coordinates: each is one
// upsample in mode linear by whole factors, which keeps nothing
// (upsample_bilinear2d_backward and upsample_linear1d_backward need only the
// sizes). PyTorch's figures for weighted_models.py's TinyFPN, batch 1: 4,498
// parameters and 38,548 bytes saved with the loss. By hand: the two ReLUs
// of the way down keep their outputs ([8, 8, 8] and [16, 4, 4]: 2,048 +
// 1,024; the first is also the lateral's and c2's input), the top
// convolution its input, the bilinear upsample's output, and the last ReLU
// its output (2 x 16,384, the latter also the means' input), the Conv1d its
// input [16, 16] (1,024), the mean over the linear upsample's output
// [8, 48] its input (1,536; PyTorch 1.13's mean.dim keeps self), the head
// its [24]: 38,496, plus the loss's 52. dlplan plans 38,536 (its loss
// keeps 40 bytes); `dlplan plan`'s memory_max, in the allocator's 512-byte
// blocks, 39,424.
TEST(RealExports, LinearResizeIsALinearUpsample) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    const Model m = expect_pytorchs_figures("tiny-fpn-opset17.onnx", fusion, 4498, 38548);
    std::vector<std::tuple<Shape, Shape, bool>> ups;  // (input, output, align_corners) of each upsample
    for (const Node& n : m.nodes)
      if (n.op == OpKind::upsample) {
        EXPECT_EQ(n.attrs.text("mode"), "linear") << n.name;
        ups.emplace_back(m.tensor(n.inputs[0]).shape, m.tensor(n.output).shape, n.attrs.flag("align_corners"));
      }
    EXPECT_EQ(ups, (std::vector<std::tuple<Shape, Shape, bool>>{{{16, 4, 4}, {16, 8, 8}, false},
                                                                  {{16, 8, 8}, {16, 16, 16}, true},
                                                                  {{8, 16}, {8, 48}, false}}));
  }
}

// nn.ConvTranspose2d and nn.ConvTranspose1d export as ONNX ConvTranspose
// (weight [C, out/group, kh, kw], pads, strides, output_padding): each is
// one conv_transpose2d, which keeps its input as derivatives.yaml's
// convolution_backward(grad, input, weight, ...) reads it. PyTorch's figures
// for weighted_models.py's TinyAutoencoder, batch 1: 4,994 parameters and
// 23,700 bytes saved with the loss. By hand: the two ReLUs keep their
// outputs ([8, 8, 8], [16, 4, 4]: 2,048 + 1,024), up1 its input (the
// second ReLU's output) and SiLU up1's output and up2 SiLU's output (2 x
// 4,096), the mean up2's output [16, 16, 8] (8,192), the 1-D branch its
// input, a view [8, 64] of the first ReLU's output (nothing more), and the
// mean its output [8, 128] (4,096), the head its [24]: 23,648, plus the
// loss's 52. --fusion eager plans the flatten as that view (23,688 with
// the loss's 40 bytes); the default fusion copies it, 2,048 bytes more.
TEST(RealExports, ConvTransposeIsOneConvTranspose2d) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    const double copy = fusion == FusionMode::engine ? -2048 : 0;  // the flatten's copy
    const Model m = expect_pytorchs_figures("tiny-autoencoder-opset17.onnx", fusion, 4994, 23700, copy);
    int views = 0;
    for (const Node& n : m.nodes) views += n.op == OpKind::reshape && n.attrs.has("view") && n.attrs.flag("view");
    EXPECT_EQ(views, fusion == FusionMode::eager ? 1 : 0);
    std::vector<std::pair<Shape, Shape>> ups;  // (input, output) of each transposed convolution
    std::vector<Shape> weights;
    for (const Node& n : m.nodes)
      if (n.op == OpKind::conv_transpose2d) {
        ups.emplace_back(m.tensor(n.inputs[0]).shape, m.tensor(n.output).shape);
        weights.push_back(declare(m, n).params[0].shape);
      }
    EXPECT_EQ(ups, (std::vector<std::pair<Shape, Shape>>{
                       {{16, 4, 4}, {16, 8, 8}}, {{16, 8, 8}, {16, 16, 8}}, {{8, 64}, {8, 128}}}));
    EXPECT_EQ(weights, (std::vector<Shape>{{16, 16, 3, 3}, {16, 8, 2, 3}, {8, 8, 4}}));
  }
}

// nn.LSTM (two layers, batch_first) exports as one ONNX LSTM a layer, its
// input transposed to sequence-first and back, each weight reordered from
// PyTorch's gates (i, f, g, o) to ONNX's (i, o, f, c) by Slice and Concat
// (or, with constant folding on, into new initializers): each layer is one
// lstm, nothing else of that plumbing is planned. PyTorch's figures for
// weighted_models.py's TinyLSTM (sequence 16, batch 1): 12,768 parameters and
// 31,748 bytes saved with the loss. By hand, from ATen's CPU LSTMCell (see
// ops_decl.cpp): each layer keeps, a step, h_{t-1}, the activated gates,
// c_{t-1} and tanh(c_t), 7 x 24 floats (2 x 10,752), and its input for
// weight_ih's gradient ([16, 16] and [16, 24]: 1,024 + 1,536); the head its
// input (1,536): 25,600, plus the loss's 6,148 (log-softmax over 96 tokens).
// TinyBiLSTM, two bidirectional layers 12 wide (Y transposed and reshaped
// to [T, b, 24], both directions' weights concatenated), keeps the same:
// 10,464 parameters and 31,748 bytes, a direction keeping 7 x 12 floats a
// step and both reading the one input.
TEST(RealExports, EachLstmLayerIsOneLstm) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  struct File {
    const char* name;
    int64_t params;
    bool bidirectional;
  };
  for (const File& f : {File{"tiny-lstm-opset17.onnx", 12768, false}, File{"tiny-lstm-folded-opset17.onnx", 12768, false},
                        File{"tiny-bilstm-opset17.onnx", 10464, true},
                        File{"tiny-bilstm-folded-opset17.onnx", 10464, true}})
    for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
      const Model m = expect_pytorchs_figures(f.name, fusion, f.params, 31748, 0, 16);
      std::vector<std::tuple<Shape, Shape, bool>> layers;  // (input, output, bidirectional) of each lstm
      for (const Node& n : m.nodes) {
        EXPECT_NE(n.op, OpKind::transpose) << f.name << " " << n.name;
        EXPECT_NE(n.op, OpKind::reshape) << f.name << " " << n.name;
        if (n.op == OpKind::lstm)
          layers.emplace_back(m.tensor(n.inputs[0]).shape, m.tensor(n.output).shape, n.attrs.flag("bidirectional"));
      }
      const bool bi = f.bidirectional;
      EXPECT_EQ(layers, (std::vector<std::tuple<Shape, Shape, bool>>{{{16, 16}, {16, 24}, bi}, {{16, 24}, {16, 24}, bi}}))
          << f.name;
    }
}

// nn.GRU exports as ONNX GRU (linear_before_reset 1), its gates reordered
// from PyTorch's r, z, n to ONNX's z, r, h: each layer is one gru. PyTorch's
// figures for weighted_models.py's TinyGRU (a bidirectional layer 12 wide,
// then one 20 wide; sequence 16, batch 1): 8,472 parameters and 29,700
// bytes saved with the loss. By hand, from ATen's CPU GRUCell (see
// ops_decl.cpp): a step and direction keeps 7 hidden (2 x 7 x 12 and 7 x 20
// floats a step: 10,752 + 8,960), each layer its input (1,024 + 1,536), the
// head its input (1,280): 23,552, plus the loss's 6,148. The folded export
// (tiny-gru-folded) the same.
TEST(RealExports, EachGruLayerIsOneGru) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const char* file : {"tiny-gru-opset17.onnx", "tiny-gru-folded-opset17.onnx"})
    for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
      const Model m = expect_pytorchs_figures(file, fusion, 8472, 29700, 0, 16);
      std::vector<std::tuple<Shape, Shape, bool>> layers;  // (input, output, bidirectional) of each gru
      for (const Node& n : m.nodes) {
        EXPECT_NE(n.op, OpKind::transpose) << file << " " << n.name;
        if (n.op == OpKind::gru)
          layers.emplace_back(m.tensor(n.inputs[0]).shape, m.tensor(n.output).shape, n.attrs.flag("bidirectional"));
      }
      EXPECT_EQ(layers, (std::vector<std::tuple<Shape, Shape, bool>>{{{16, 16}, {16, 24}, true},
                                                                      {{16, 24}, {16, 20}, false}}))
          << file;
    }
}

// torchvision's Swin Transformer: windows partitioned by reshapes and a
// permute that fold the batch into the windows ([b nW, T, C]), the fused qkv
// permuted so that the batch lands on axis 1 and read back in three parts,
// the relative position bias table read at relative_position_index (the
// IR's window_position_bias, its table counted), torch.roll as slices and a
// concat, the shifted blocks' mask built in the graph (ScatterND, folded at
// import: the IR's window_mask), and the patch merging's strided slices.
// weighted_models.py's tiny-swin (windows 4 x 2, two stages): PyTorch counts
// 35,030 parameters and saves 228,820 bytes with the loss
// (make_exports.saved_bytes, batch 1). Its first stage shifts by (2, 1);
// its second, whose map is as tall as a window, by (0, 1), which exports
// an empty slice (torch.roll by 0) and a mask with an empty region.
// (Its step equals PyTorch's: tools.onnx_parity, tiny-swin.)
TEST(RealExports, SwinsShiftedWindowsPlanPerSample) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    const Model m = expect_pytorchs_figures("tiny-swin-opset17.onnx", fusion, 35030, 228820);
    std::vector<std::string> tables, masks;
    int strided = 0;
    for (const Node& n : m.nodes) {
      if (n.op == OpKind::window_position_bias)
        tables.push_back(fmt::format("{} {}", to_string(m.tensor(n.inputs[0]).shape), n.attrs.values["window"].dump()));
      if (n.op == OpKind::window_mask)
        masks.push_back(fmt::format("{} {} {}", n.attrs.values["windows"].dump(), n.attrs.values["window"].dump(),
                                    n.attrs.values["shift"].dump()));
      strided += n.op == OpKind::slice && n.attrs.integer("step") == 2;
    }
    // Stage 1: an 8 x 8 map in 2 x 4 windows of 4 x 2, heads 2; stage 2: 4 x 4 in 1 x 2, heads 4.
    EXPECT_EQ(tables, (std::vector<std::string>{"[8, 2, 8, 8] [4,2]", "[8, 2, 8, 8] [4,2]", "[2, 4, 8, 8] [4,2]",
                                                "[2, 4, 8, 8] [4,2]"}));
    EXPECT_EQ(masks, (std::vector<std::string>{"[2,4] [4,2] [2,1]", "[1,2] [4,2] [0,1]"}));
    // x[:, a::2, b::2, :] for the four (a, b) of the one patch merging: the
    // exporter shares the two rows' slices, so 2 + 4
    EXPECT_EQ(strided, 6);
  }
}

// nn.RNN exports as ONNX RNN (activations Tanh or Relu), its weights only
// Unsqueezed (one block, nothing to reorder): each layer is one rnn.
// PyTorch's figures for weighted_models.py's TinyRNN (a two-layer
// bidirectional tanh RNN 12 wide, then a relu one 20 wide; sequence 16,
// batch 1): 6,104 parameters and 16,148 bytes saved with the loss. By hand,
// from ATen's CPU SimpleCell (see ops_decl.cpp): a direction keeps h_0 and
// every step's h_t, 17 hidden (2 x 17 x 12 floats twice, 17 x 20 once:
// 3,264 + 3,264 + 1,360 bytes), each layer its input (1,024 + 1,536 +
// 1,536), the head its input (1,280): 10,000, plus the loss's 6,148. The
// folded export (tiny-rnn-folded) the same.
TEST(RealExports, EachRnnLayerIsOneRnn) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const char* file : {"tiny-rnn-opset17.onnx", "tiny-rnn-folded-opset17.onnx"})
    for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
      const Model m = expect_pytorchs_figures(file, fusion, 6104, 16148, 0, 16);
      std::vector<std::tuple<Shape, Shape, bool, std::string>> layers;  // (input, output, bidirectional, nonlinearity)
      for (const Node& n : m.nodes) {
        EXPECT_NE(n.op, OpKind::transpose) << file << " " << n.name;
        if (n.op == OpKind::rnn)
          layers.emplace_back(m.tensor(n.inputs[0]).shape, m.tensor(n.output).shape, n.attrs.flag("bidirectional"),
                              n.attrs.text("nonlinearity"));
      }
      EXPECT_EQ(layers, (std::vector<std::tuple<Shape, Shape, bool, std::string>>{
                            {{16, 16}, {16, 24}, true, "tanh"},
                            {{16, 24}, {16, 24}, true, "tanh"},
                            {{16, 24}, {16, 20}, false, "relu"}}))
          << file;
    }
}

// torch.einsum exports as ONNX Einsum, whose output shape ONNX 1.12's
// shape inference leaves unknown; MaxViT's attention stopped there. An
// Einsum of two tensors that is a batched matrix product is now a MatMul,
// with a Transpose where an operand's last two axes are the other way round.
// weighted_models.py's tiny-einsum: q k^T ("b h i d, b h j d -> b h i j",
// k transposed), p v, and p v with its operands the other way round ("b h j
// d, b h i j -> b h i d": p is the left operand). PyTorch: 7,104 parameters
// and 17,420 bytes saved with the loss (make_exports.saved_bytes, sequence
// 16, batch 1). (Its step equals PyTorch's: tools.onnx_parity, tiny-einsum.)
TEST(RealExports, EinsumsThatAreBatchedMatrixProductsAreMatmuls) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    const Model m = expect_pytorchs_figures("tiny-einsum-opset17.onnx", fusion, 7104, 17420, 0, 16);
    std::vector<std::string> products;  // each matmul's operand shapes, from the einsums
    for (const Node& n : m.nodes)
      if (n.op == OpKind::matmul)
        products.push_back(to_string(m.tensor(n.inputs[0]).shape) + " x " + to_string(m.tensor(n.inputs[1]).shape));
    EXPECT_EQ(products, (std::vector<std::string>{"[2, 16, 12] x [2, 12, 16]", "[2, 16, 16] x [2, 16, 12]",
                                                  "[2, 16, 16] x [2, 16, 12]"}))
        << to_string(fusion);
  }
}

// What an LSTM node can say that dlplan's lstm (one layer from zero
// states, giving the output sequence) does not run is refused, naming the
// node and the reason: a learned initial state, and a head on h_n.
TEST(RealExports, AnLstmFromAGivenStateOrReadForItsFinalStateIsRefusedNamingTheNode) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const nlohmann::json sequence = {{"options", {{"sequence", 8}}}};
  const Outcome given = import_file("refused/lstm-learned-state-opset17.onnx", sequence);
  EXPECT_FALSE(given.model.has_value());
  EXPECT_NE(given.error.find("lstm-learned-state-opset17.onnx: node '/rnn/LSTM' (LSTM): an nn.LSTM dlplan cannot "
                             "plan: its initial state (h_0, c_0) is given"),
            std::string::npos)
      << given.error;
  const Outcome last = import_file("refused/lstm-final-state-opset17.onnx", sequence);
  EXPECT_FALSE(last.model.has_value());
  EXPECT_NE(last.error.find("node '/rnn/LSTM' (LSTM): an nn.LSTM dlplan cannot plan: its final hidden (h_n) state"),
            std::string::npos)
      << last.error;
}

// nn.LayerNorm([C, H, W]) and nn.LayerNorm([H, W]) export as
// LayerNormalization with axis -3 and -2; the importer refused any axis but
// the last. Each is a layernorm over its trailing axes (dims 3 and 2) with a
// weight and bias of their shape. PyTorch's figures for weighted_models.py's
// TinyLayerNormCHW (batch 1): 6,146 parameters and 30,884 bytes saved with
// the loss. By hand: each LayerNorm keeps its input and a mean and rstd a row
// (1, 8 and 1 rows), GELU its input and conv2 GELU's output, the ReLU its
// output (the last LayerNorm's input), the mean its input, the head its
// [8]: 30,832, plus the loss's 52.
TEST(RealExports, LayerNormOverTrailingAxesIsOneLayernorm) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  for (const FusionMode fusion : {FusionMode::engine, FusionMode::eager}) {
    const Model m = expect_pytorchs_figures("tiny-layernorm-chw-opset17.onnx", fusion, 6146, 30884);
    std::vector<std::pair<int64_t, Shape>> norms;  // (dims, weight shape)
    for (const Node& n : m.nodes)
      if (n.op == OpKind::layernorm) norms.emplace_back(n.attrs.integer("dims"), declare(m, n).params[0].shape);
    EXPECT_EQ(norms, (std::vector<std::pair<int64_t, Shape>>{{3, {8, 16, 16}}, {2, {8, 8}}, {3, {8, 8, 8}}}));
  }
}
