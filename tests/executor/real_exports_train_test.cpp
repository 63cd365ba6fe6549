// The real torch.onnx.export files that import (tests/fixtures/exports,
// docs/onnx.md) train on the CPU engine: the plan dlplan makes of the file runs
// two steps, the first step's loss is that of a freshly initialized
// 1000-class classifier, near ln 1000, and the engine's measured memory is the
// plan's. MobileNetV2's ReLU6 (ONNX Clip) is a
// `clip` op, MobileNetV3's activations are hardswish and hardsigmoid, and
// squeeze-and-excitation blocks (MobileNetV3, RegNetY) scale by a broadcasting
// mul; ConvNeXt permutes to channels-last and back around each LayerNorm
// (transpose) and scales each block by a learned gamma (scale); the Hugging
// Face GPT-2, BERT, Llama and Mistral files (small configs) train through
// their fused attention (causal or not, RoPE, grouped KV heads), rmsnorm and
// BERT's token-type row, their loss near ln of the vocabulary. The CUDA
// engine runs none of the CNN ops named above yet, nor BERT's token-type
// row: the trainer refuses them there, naming the node.
#include "knob_grid.hpp"

#include "dlplan/error.hpp"
#include "dlplan/exec/backend.hpp"
#include "dlplan/exec/communicator.hpp"
#include "dlplan/exec/trainer.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/step_program.hpp"
#include "dlplan/step_walk.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

using namespace dlplan;
using namespace dlplan::exec;

namespace {

std::string exported(const std::string& file) { return DLPLAN_SOURCE_DIR "/tests/fixtures/exports/" + file; }

PlanDocument fp32_plan(const std::string& path, FusionMode fusion = FusionMode::engine) {
  PlanRequest req;
  ImportOptions o;
  o.seq_len = 64;  // the transformers' symbolic sequence (make_exports.py's); the CNNs have none
  o.fusion = fusion;
  req.model = import_onnx(path, o);
  req.cluster.device = find_device("cpu");
  req.training.precision = Precision::fp32;
  req.training.micro_batch = 2;
  req.forced = Strategy::ddp;
  Planning p = plan(req);
  return plan_from_json(nlohmann::json(plan_json(p, *p.chosen())), path);
}

// "tiny-gpt2-opset17.onnx" -> tiny_gpt2 (gtest names take no '-'); "_opset13" kept.
std::string file_test_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string s = info.param;
  s = s.substr(0, s.find("-opset"));
  std::replace(s.begin(), s.end(), '-', '_');
  std::replace(s.begin(), s.end(), '/', '_');  // weights/tiny-groupnorm
  if (std::string(info.param).find("opset13") != std::string::npos) s += "_opset13";
  return s;
}

class RealExportTrains : public ::testing::TestWithParam<const char*> {};

void two_steps_as_planned(const PlanDocument& plan, const char* file) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  TrainOptions opt;
  opt.steps = 2;
  Trainer t(plan, *comm, *backend, opt);
  const double first = t.step().loss, second = t.step().loss;
  EXPECT_TRUE(std::isfinite(first) && std::isfinite(second)) << first << " " << second;
  // Cross-entropy of K classes at initialization: ln K (6.91 for
  // ImageNet's 1000) for uniform logits; an untrained network's logits
  // spread it a little.
  const Node& loss = plan.model.nodes.back();
  ASSERT_EQ(loss.op, OpKind::cross_entropy);
  const auto classes = static_cast<double>(plan.model.tensor(loss.inputs[0]).shape.back());
  EXPECT_NEAR(first, std::log(classes), 1.5) << file;
  // What the engine allocated is what the planner walked, byte for byte.
  const StepWalk w = walk_step(plan.model, plan.cluster, plan.training);
  EXPECT_EQ(t.allocator().peak(), w.peak) << file;
  for (Category cat : kAllCategories)
    EXPECT_EQ(t.allocator().at_peak()[static_cast<size_t>(cat)], w.at_peak[static_cast<size_t>(cat)])
        << file << " " << to_string(cat);
}

TEST_P(RealExportTrains, TwoStepsFromTheFilesPlan) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  two_steps_as_planned(fp32_plan(exported(GetParam())), GetParam());
}

// --fusion eager: gelu_new and RMSNorm op by op (affine, pow, tanh, mul,
// reduce_mean, sqrt, reciprocal), as PyTorch's eager autograd runs them, and
// max pools keeping PyTorch's int64 indices and their input; the same two
// steps, the loss near ln of the classes, memory as planned.
class RealExportTrainsEager : public ::testing::TestWithParam<const char*> {};

TEST_P(RealExportTrainsEager, TwoStepsFromTheFilesPlan) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const PlanDocument plan = fp32_plan(exported(GetParam()), FusionMode::eager);
  int written_out = 0;
  for (const Node& n : plan.model.nodes)
    written_out += n.op == OpKind::pow || n.op == OpKind::reduce_mean ||
                   (n.op == OpKind::maxpool2d && n.attrs.has("eager") && n.attrs.flag("eager"));
  EXPECT_GT(written_out, 0) << GetParam() << ": nothing was left unfused";
  two_steps_as_planned(plan, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Exports, RealExportTrainsEager,
                         ::testing::Values("tiny-gpt2-opset17.onnx", "tiny-llama-opset17.onnx",
                                           "tiny-mistral-opset17.onnx", "tiny-qwen2-opset17.onnx",
                                           "tiny-phi-opset17.onnx", "tiny-gemma-opset17.onnx",
                                           "squeezenet1_1-opset17.onnx", "resnet18-opset17.onnx",
                                           "tiny-albert-opset17.onnx"),
                         file_test_name);

INSTANTIATE_TEST_SUITE_P(Exports, RealExportTrains,
                         ::testing::Values("resnet18-opset17.onnx", "mobilenet_v2-opset17.onnx",
                                           "mobilenet_v3_small-opset13.onnx", "regnet_y_400mf-opset17.onnx",
                                           "squeezenet1_1-opset17.onnx", "densenet121-opset17.onnx",
                                           "mnasnet0_5-opset17.onnx", "convnext_tiny-opset13.onnx",
                                           "shufflenet_v2_x1_0-opset17.onnx", "tiny-hf-vit-opset17.onnx",
                                           "tiny-gpt2-opset17.onnx", "tiny-bert-opset13.onnx",
                                           "tiny-llama-opset17.onnx", "tiny-mistral-opset17.onnx",
                                           "resnet18-opset13.onnx", "resnet50-opset17.onnx",
                                           "resnext50_32x4d-opset17.onnx", "vgg11_bn-opset17.onnx",
                                           "mobilenet_v3_small-opset17.onnx", "efficientnet_b0-opset17.onnx",
                                           "convnext_tiny-opset17.onnx", "vit_b_16-opset17.onnx",
                                           "vit_b_16-opset13.onnx", "tiny-bert-opset17.onnx",
                                           "bert-base-uncased-opset17.onnx", "gpt2-opset17.onnx",
                                           "tiny-qwen2-opset17.onnx", "tiny-phi-opset17.onnx",
                                           "tiny-gemma-opset17.onnx", "tiny-mlp-gelu-tanh-opset17.onnx",
                                           "tiny-opt-opset17.onnx", "tiny-bloom-opset17.onnx",
                                           "tiny-gpt-neox-opset17.onnx", "tiny-roberta-opset17.onnx", "tiny-gpt-bigcode-opset17.onnx",
                                           "tiny-mlp-glu-opset17.onnx", "tiny-mlp-arith-opset17.onnx",
                                           "tiny-albert-opset17.onnx", "weights/tiny-groupnorm-opset17.onnx",
                                           "weights/tiny-unet-opset17.onnx", "weights/tiny-layernorm-chw-opset17.onnx",
                                           "weights/tiny-fpn-opset17.onnx", "weights/tiny-autoencoder-opset17.onnx",
                                           "weights/tiny-lstm-opset17.onnx", "weights/tiny-bilstm-opset17.onnx",
                                           "weights/tiny-gru-opset17.onnx", "swin_t-opset17.onnx",
                                           "weights/tiny-swin-opset17.onnx", "weights/tiny-rnn-opset17.onnx",
                                           "weights/tiny-einsum-opset17.onnx", "tiny-gptj-opset17.onnx",
                                           "weights/tiny-xglm-opset17.onnx", "weights/tiny-posenc-opset17.onnx",
                           "weights/tiny-roformer-opset17.onnx", "weights/tiny-xlm-opset17.onnx",
                           "weights/tiny-ibert-opset17.onnx", "weights/tiny-gpt-neox-japanese-opset17.onnx",
                           "weights/tiny-upsample-opset17.onnx", "tiny-upsample-repeat-opset17.onnx",
                           "weights/tiny-deberta-opset17.onnx", "weights/tiny-mpnet-opset17.onnx",
                           "tiny-relative-bias-opset17.onnx", "weights/tiny-t5-encoder-opset17.onnx",
                           "weights/tiny-esm-opset17.onnx", "weights/tiny-t5-opset17.onnx",
                           "weights/tiny-bart-opset17.onnx", "weights/tiny-speech2text2-opset17.onnx",
                           "tiny-hf-swin-opset17.onnx", "tiny-hf-deit-opset17.onnx",
                           "weights/tiny-poolformer-opset17.onnx", "tiny-hf-beit-opset17.onnx",
                           "weights/tiny-tf-pad-opset17.onnx", "tiny-hf-mobilevit-opset17.onnx",
                           "weights/tiny-dilated-opset17.onnx"),
                         file_test_name);

// --fusion eager under every single knob change a plan carries: precision,
// checkpointing's recompute, the strategies, accumulation, offload. The
// engine allocates what the plan walks in each: for tiny-llama's written-out
// RMSNorm (pow, reduce_mean, affine, sqrt, reciprocal, mul, scale), for
// SqueezeNet's max pools keeping PyTorch's input and int64 indices, and for
// the graphs that fold the batch with the heads: OPT (causal_mask added,
// one-sided clip, offset positions), BLOOM (alibi, filling causal_mask,
// slices of its fused QKV), GPT-NeoX (rope, generic matmul and softmax),
// GPT-BigCode (causal_mask over query_axis 0), ShuffleNetV2 (slices kept as
// views, cut again for backward), the MLPs whose Sub, Div and Split
// became a broadcasting add, reciprocal and mul, and slices, and ALBERT,
// whose second layer applies the first's parameters (`shares`: gradients of
// both depths summed into one set, which ZeRO shards once), and torch.nn's
// LeakyReLU, ELU, Softplus, Mish and a mean over a middle axis (tiny-acts),
// nn.GroupNorm with and without its affine parameters (tiny-groupnorm), and
// nearest upsampling between a U-Net's levels (tiny-unet), LayerNorm
// over [C, H, W] and [H, W] (tiny-layernorm-chw), bilinear and linear
// upsampling (tiny-fpn), ConvTranspose2d and ConvTranspose1d
// (tiny-autoencoder), two-layer nn.LSTMs and nn.GRUs (tiny-lstm,
// tiny-bilstm, tiny-gru, and nn.RNN's tanh and relu: tiny-rnn), the class
// token's select as a view (tiny-hf-vit),
// Swin's shifted windows: relative position bias, mask, strided slices
// and the qkv parts of a batch on axis 1 (tiny-swin), and attention written
// with torch.einsum (tiny-einsum), GPT-J's interleaved rope on [T, H, d]
// between generic slices and concats (tiny-gptj), and fixed sinusoidal
// positions, XGLM's from a folded constant and the PyTorch tutorial's from a
// sliced buffer (tiny-xglm, tiny-posenc: no table among the parameters), and
// RoFormer's rotary tables from a frozen parameter read as constants
// (tiny-roformer: interleaved rope on queries and keys), and XLM's padding
// mask folded to ones (tiny-xlm: no-op multiplies, positions broadcast over
// the batch before their Add), and learned biases added outside their
// projections, the IR's shift: I-BERT's LayerNorm written out in Python
// (op by op under eager) and GPT-NeoX-Japanese's expanded output biases
// (tiny-ibert, tiny-gpt-neox-japanese), and torch.repeat_interleave over the
// sequence, an upsample of a view (tiny-upsample), and DeBERTa's query and
// value biases, [D] parameters viewed per head and added as shifts, and its
// masked softmax's fills that fill nothing (tiny-deberta), and T5's relative
// position bias computed in the graph (tiny-mpnet, tiny-relative-bias,
// tiny-t5-encoder: T5LayerNorm written out, a ReLU feed-forward), and a
// GELU written in Python, op by op through the IR's erf (tiny-esm), and T5
// whole, two token inputs and the decoder's bias through the causal mask
// (tiny-t5), and decoders' positions cast or reshaped before their Add
// (tiny-bart, tiny-speech2text2), and Hugging Face's Swin with stochastic
// depth (drop_path) and DeiT's two learned tokens, and PoolFormer's average
// pool without the padding counted (tiny-poolformer), and BEiT's relative
// position bias with the class token's rows (tiny-hf-beit), and TensorFlow's
// "same" padding written as F.pad (tiny-tf-pad: the IR's pad), and
// F.normalize, torch.sum, repeat and torch.norm over two axes (tiny-normalize;
// not in RealExportTrains: its sum over the tokens is not normalized, as
// SwiftFormer's, so at 64 tokens dlplan's initialization starts at loss 8.2,
// not near ln 96; from the file's weights 5.0, PyTorch's own 4.8), and
// parameters read as tensors, computed on once per step and broadcast over
// the samples: MobileBERT's head h @ cat([E^T, W]) with E tied to the
// embedding, a gate sigmoid(g), a bias (u @ v)^T (tiny-computed-weights; not
// in RealExportTrains either: its randn gate and bias start it at loss 10),
// and MobileViT's attentions over patch positions folded into the batch,
// planned through the generic ops (tiny-hf-mobilevit), and dilated
// convolutions, 2-D and 1-D, through oneDNN (tiny-dilated).
TEST(RealExportEagerKnobs, MeasuresAsPlannedUnderEveryKnob) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  ImportOptions import;
  import.seq_len = 64;
  import.fusion = FusionMode::eager;
  for (const char* file : {"tiny-llama-opset17.onnx", "squeezenet1_1-opset17.onnx", "tiny-opt-opset17.onnx",
                           "tiny-bloom-opset17.onnx", "tiny-gpt-neox-opset17.onnx",
                           "shufflenet_v2_x1_0-opset17.onnx", "tiny-gpt-bigcode-opset17.onnx",
                           "tiny-mlp-arith-opset17.onnx", "tiny-mlp-glu-opset17.onnx", "tiny-albert-opset17.onnx",
                           "weights/tiny-acts-opset17.onnx", "weights/tiny-groupnorm-opset17.onnx",
                           "weights/tiny-unet-opset17.onnx", "weights/tiny-layernorm-chw-opset17.onnx",
                           "weights/tiny-fpn-opset17.onnx", "weights/tiny-autoencoder-opset17.onnx",
                           "weights/tiny-lstm-opset17.onnx", "weights/tiny-bilstm-opset17.onnx",
                           "weights/tiny-gru-opset17.onnx", "tiny-hf-vit-opset17.onnx",
                           "weights/tiny-swin-opset17.onnx", "weights/tiny-rnn-opset17.onnx",
                           "weights/tiny-einsum-opset17.onnx", "tiny-gptj-opset17.onnx",
                           "weights/tiny-xglm-opset17.onnx", "weights/tiny-posenc-opset17.onnx",
                           "weights/tiny-roformer-opset17.onnx", "weights/tiny-xlm-opset17.onnx",
                           "weights/tiny-ibert-opset17.onnx", "weights/tiny-gpt-neox-japanese-opset17.onnx",
                           "weights/tiny-upsample-opset17.onnx", "weights/tiny-deberta-opset17.onnx",
                           "weights/tiny-mpnet-opset17.onnx", "tiny-relative-bias-opset17.onnx",
                           "weights/tiny-t5-encoder-opset17.onnx", "weights/tiny-esm-opset17.onnx",
                           "weights/tiny-t5-opset17.onnx", "weights/tiny-bart-opset17.onnx",
                           "weights/tiny-speech2text2-opset17.onnx", "tiny-hf-swin-opset17.onnx",
                           "tiny-hf-deit-opset17.onnx", "weights/tiny-poolformer-opset17.onnx",
                           "tiny-hf-beit-opset17.onnx", "weights/tiny-tf-pad-opset17.onnx",
                           "weights/tiny-normalize-opset17.onnx", "weights/tiny-computed-weights-opset17.onnx",
                           "tiny-hf-mobilevit-opset17.onnx", "weights/tiny-dilated-opset17.onnx"}) {
    int runs = 0;
    for (const auto& k : knobs::single_knob_changes()) {
      if (k[knobs::kModel] != 0 || k[knobs::kSyncBn] != 0) continue;  // the model is the file; it has no BatchNorm
      const knobs::Outcome o = knobs::run_config(k, *comm, *backend, 2, 0, false, exported(file), import);
      EXPECT_TRUE(o.equal()) << file << " " << knobs::describe(k) << ": " << knobs::mismatch(o);
      EXPECT_TRUE(std::isfinite(o.loss)) << file << " " << knobs::describe(k);
      ++runs;
    }
    EXPECT_GE(runs, 15) << file;
  }
}

// Three steps of `file` under --fusion eager, whose views the step program
// makes again for the backward that keeps one, and under the default
// fusion, whose copies are kept as they are.
struct ViewedAndCopied {
  knobs::Outcome viewed, copied;
};
ViewedAndCopied train_viewed_and_copied(const std::string& file) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  ImportOptions eager, engine;
  eager.fusion = FusionMode::eager;
  return {knobs::run_config(knobs::Config{}, *comm, *backend, 3, 0, false, file, eager),
          knobs::run_config(knobs::Config{}, *comm, *backend, 3, 0, false, file, engine)};
}

// The eager plan of `file` (one rank, the default knobs).
PlanDocument eager_plan(const std::string& file) {
  ImportOptions eager;
  eager.fusion = FusionMode::eager;
  return knobs::plan_of(knobs::Config{}, 1, 0, false, file, eager);
}

// The default fusion's plan of `file` (one rank, the default knobs).
PlanDocument default_plan(const std::string& file) { return knobs::plan_of(knobs::Config{}, 1, 0, false, file, ImportOptions{}); }

// The most activation bytes the plan's step keeps at any moment.
int64_t most_kept(const PlanDocument& p) {
  return walk_step(p.model, p.cluster, p.training).max_each[static_cast<size_t>(Category::activations)];
}

// How many `op` nodes the plan's step program runs again before a backward.
int made_again(const PlanDocument& plan, OpKind op) {
  const StepProgram program = build_step_program(plan.model, plan.cluster, plan.training);
  int n = 0;
  for (const auto& ev : program.compute)
    n += ev.phase == Phase::recompute && ev.node >= 0 && plan.model.nodes[static_cast<size_t>(ev.node)].op == op;
  return n;
}

// --fusion eager plans ShuffleNetV2's torch.chunk halves as PyTorch's views:
// a convolution that keeps one keeps the whole storage, and the step program
// cuts the half again (a recomputed slice) for that convolution's backward.
// Trained so, the model must take the same steps as under the default
// fusion, whose halves are copies kept as they are: the same losses, to the
// bit, since the same kernels run on the same values. The plan must hold the
// cut slices (or the test would compare two copies).
TEST(RealExportEagerKnobs, ViewsCutAgainForBackwardTrainAsCopiesDo) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string file = exported("shufflenet_v2_x1_0-opset17.onnx");
  const auto [viewed, copied] = train_viewed_and_copied(file);
  EXPECT_TRUE(viewed.equal()) << knobs::mismatch(viewed);
  EXPECT_EQ(viewed.loss, copied.loss);
  // Whole storages kept instead of halves: more activations under eager.
  EXPECT_GT(viewed.predicted[static_cast<size_t>(Category::activations)],
            copied.predicted[static_cast<size_t>(Category::activations)]);
  EXPECT_EQ(made_again(eager_plan(file), OpKind::slice), 13);  // one per block that splits its input: 3 + 7 + 3
}

// The same for a reshape: --fusion eager plans tiny-autoencoder's
// f1.flatten(2) as PyTorch's view of f1, which the ReLU keeps anyway, so the
// ConvTranspose1d after it keeps nothing more (the default fusion copies
// it); the step program makes the view again, once, for that backward. The
// steps equal the copies' to the bit, with 2,048 bytes less kept a sample.
TEST(RealExportEagerKnobs, ReshapeViewsCutAgainForBackwardTrainAsCopiesDo) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string file = exported("weights/tiny-autoencoder-opset17.onnx");
  const auto [viewed, copied] = train_viewed_and_copied(file);
  EXPECT_TRUE(viewed.equal()) << knobs::mismatch(viewed);
  EXPECT_TRUE(copied.equal()) << knobs::mismatch(copied);
  EXPECT_EQ(viewed.loss, copied.loss);
  const PlanDocument plan = eager_plan(file);
  EXPECT_EQ(most_kept(default_plan(file)) - most_kept(plan), 2048 * plan.training.micro_batch);
  EXPECT_EQ(made_again(plan, OpKind::reshape), 1);
}

// And for a select: the Hugging Face ViT's head reads the class token
// x[:, 0], a view in PyTorch, so under --fusion eager the pooler keeps the
// last LayerNorm's whole output and the step program cuts the row again,
// once, for its backward. The steps equal the copy's to the bit, with the
// other tokens' rows kept besides.
TEST(RealExportEagerKnobs, SelectViewsCutAgainForBackwardTrainAsCopiesDo) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string file = exported("tiny-hf-vit-opset17.onnx");
  const auto [viewed, copied] = train_viewed_and_copied(file);
  EXPECT_TRUE(viewed.equal()) << knobs::mismatch(viewed);
  EXPECT_TRUE(copied.equal()) << knobs::mismatch(copied);
  EXPECT_EQ(viewed.loss, copied.loss);
  const PlanDocument plan = eager_plan(file);
  EXPECT_GT(most_kept(plan), most_kept(default_plan(file)));
  EXPECT_EQ(made_again(plan, OpKind::select), 1);
}

// The CPU trainer's refusal of `plan` before the first step ("" if it
// accepts the plan).
std::string cpu_trainer_refusal(const PlanDocument& plan) {
  auto comm = make_single_communicator();
  auto backend = make_cpu_backend();
  try {
    Trainer t(plan, *comm, *backend, TrainOptions{});
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// An op the importer does not know is planned as `opaque` (its memory
// counted); no engine can run its math, so the trainer refuses the plan on
// any engine before the first step, naming the node and the ONNX op.
TEST(RealExportRefusal, NoEngineTrainsAnOpaqueOpAndTheTrainerNamesIt) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const std::string msg = cpu_trainer_refusal(fp32_plan(DLPLAN_SOURCE_DIR "/tests/fixtures/onnx/unknown_op.onnx"));
  EXPECT_NE(msg.find("is an op the importer does not know (ONNX 'com.example.CustomOp')"), std::string::npos) << msg;
  EXPECT_NE(msg.find("custom_a"), std::string::npos) << msg;
}

// A learned tensor added outside a projection is the IR's shift, which the
// CPU engine trains (op cases, tiny-ibert) and the CUDA engine refuses,
// naming the node.
TEST(RealExportRefusal, TheGpuEngineNamesTheShift) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto why = gpu_engine_lacks(import_onnx(DLPLAN_SOURCE_DIR "/tests/fixtures/onnx/initializer_add.onnx"));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("is a shift, which the CPU engine trains and the CUDA engine does not yet"), std::string::npos)
      << *why;
}

TEST(RealExportRefusal, TheGpuEngineNamesTheClip) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto why = gpu_engine_lacks(import_onnx(exported("mobilenet_v2-opset17.onnx")));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("is a clip (ReLU6, Hardtanh)"), std::string::npos) << *why;
  EXPECT_FALSE(gpu_engine_lacks(import_onnx(exported("resnet18-opset17.onnx"))).has_value());
}

// An SE block's scale multiplies [C, H, W] by [C, 1, 1]: the CUDA engine's
// mul is same-shape only, so the trainer refuses the plan, naming the node.
TEST(RealExportRefusal, TheGpuEngineNamesTheBroadcastingMul) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto why = gpu_engine_lacks(import_onnx(exported("regnet_y_400mf-opset17.onnx")));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("with broadcasting (a squeeze-and-excitation scale)"), std::string::npos) << *why;
  const auto v3 = gpu_engine_lacks(import_onnx(exported("mobilenet_v3_small-opset17.onnx")));
  ASSERT_TRUE(v3.has_value());
  EXPECT_NE(v3->find("(MobileNetV3)"), std::string::npos) << *v3;
}

// ConvNeXt's permutes and layer scales: refused on CUDA by name, and the
// opset-13 export (LayerNorm decomposed, nn.Linear's weight transposed by a
// node) plans the same ops as the opset-17 one.
TEST(RealExportRefusal, TheGpuEngineNamesBERTsTokenTypeRow) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 64;
  const auto why = gpu_engine_lacks(import_onnx(exported("tiny-bert-opset17.onnx"), o));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("adds one row of its table at every position (BERT's token types)"), std::string::npos) << *why;
}

TEST(RealExportRefusal, TheGpuEngineNamesTheWrittenOutMath) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  ImportOptions o;
  o.seq_len = 64;
  o.fusion = FusionMode::eager;
  const auto why = gpu_engine_lacks(import_onnx(exported("tiny-gpt2-opset17.onnx"), o));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("(written-out math, imported with --fusion eager)"), std::string::npos) << *why;
}

TEST(RealExportRefusal, TheGpuEngineNamesConvNeXtsTranspose) {
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support";
  const auto why = gpu_engine_lacks(import_onnx(exported("convnext_tiny-opset17.onnx")));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("is a transpose (ConvNeXt"), std::string::npos) << *why;
}

}  // namespace

namespace {

// ALBERT's second layer applies the first's parameters (`shares`): the CPU
// engine trains it (RealExportTrains, onnx_parity against PyTorch); the CUDA
// engine, which no GPU here can check, refuses it by name. Asked of a model
// whose only unusual node is the shared one, so no earlier refusal hides it.
TEST(RealExportRefusal, TheGpuEngineNamesSharedWeights) {
  const nlohmann::json ir = nlohmann::json::parse(R"({
    "inputs": {"x": {"shape": [8], "dtype": "f32"}, "label": {"shape": [], "dtype": "i32"}},
    "nodes": [
      {"name": "a", "op": "linear", "in": ["x"], "out": 8},
      {"name": "b", "op": "linear", "in": ["a"], "out": 8, "shares": "a"},
      {"name": "fc", "op": "linear", "in": ["b"], "out": 4},
      {"name": "loss", "op": "cross_entropy", "in": ["fc", "label"]}
    ]})");
  const auto why = gpu_engine_lacks(parse_model(ir, "shared.json"));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("node 'b' applies the parameters of 'a'"), std::string::npos) << *why;
  nlohmann::json control = ir;
  control["nodes"][1].erase("shares");
  EXPECT_FALSE(gpu_engine_lacks(parse_model(control, "unshared.json")).has_value());
}

}  // namespace
