// ONNX import (fixtures from tests/fixtures/make_fixtures.py): exact parameter
// counts, BatchNorm kept (training export) or detected as folded (eval
// export), attention and GELU fused, unknown ops listed with their bytes, bad
// files as one clear message, and conformance with the same model as IR.
#include "dlplan/error.hpp"
#include "dlplan/importers.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/ops.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"

#include <gtest/gtest.h>

#include <string>

using namespace dlplan;

namespace {

std::string fx(const std::string& name) { return std::string(DLPLAN_SOURCE_DIR) + "/tests/fixtures/onnx/" + name; }

#define REQUIRE_ONNX() \
  if (!onnx_supported()) GTEST_SKIP() << "built without ONNX support"

int count_op(const Model& m, OpKind op) {
  int c = 0;
  for (const auto& n : m.nodes) c += n.op == op;
  return c;
}

const Node* find_op(const Model& m, OpKind op) {
  for (const auto& n : m.nodes)
    if (n.op == op) return &n;
  return nullptr;
}

bool has_note(const Model& m, const std::string& text) {
  for (const auto& n : m.notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

std::string notes_of(const Model& m) {
  std::string s;
  for (const auto& n : m.notes) s += n + "\n";
  return s;
}

std::string error_of(const std::string& path, ImportOptions opt = {}) {
  try {
    load_model(path, opt);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

OrderedJson planning_of(Model m) {
  PlanRequest r;
  r.model = std::move(m);
  r.cluster.device = find_device("h100-80g");
  r.cluster.nodes = 1;
  r.cluster.gpus_per_node = 8;
  r.training.micro_batch = 16;
  auto j = planning_json(plan(r));
  j["model"]["name"] = "x";
  j["model"].erase("notes");  // the importer's commentary; the numbers must agree
  return j;
}

Shape input_shape(const Model& m, const std::string& name) {
  for (int id : m.inputs)
    if (m.tensor(id).name == name) return m.tensor(id).shape;
  ADD_FAILURE() << "no input " << name;
  return {};
}

}  // namespace

TEST(ImportOnnx, BuiltWithOnnxOrSaysSo) {
  if (onnx_supported()) return;
  auto msg = error_of(fx("tiny_mlp.onnx"));
  EXPECT_NE(msg.find("built without ONNX support"), std::string::npos) << msg;
}

TEST(ImportOnnx, MlpExactCountsGemmAndMatMulAdd) {
  REQUIRE_ONNX();
  Model m = load_model(fx("tiny_mlp.onnx"), ImportOptions{4, 0});
  EXPECT_EQ(m.parameter_count(), (64 * 128 + 128) + (128 * 128 + 128) + (128 * 10 + 10));
  EXPECT_EQ(count_op(m, OpKind::linear), 3);  // Gemm, MatMul + Add fused, Gemm
  EXPECT_EQ(count_op(m, OpKind::relu), 2);
  EXPECT_EQ(input_shape(m, "x"), (Shape{64}));  // the batch dimension is stripped
  EXPECT_EQ(m.units.size(), 3u) << "root + layers.0 + layers.1";
  EXPECT_EQ(m.unaccounted_bytes, 0);
}

TEST(ImportOnnx, MlpConformsToTheSameModelWrittenAsIr) {
  REQUIRE_ONNX();
  auto a = planning_of(load_model(fx("tiny_mlp.onnx")));
  auto b = planning_of(load_model(std::string(DLPLAN_SOURCE_DIR) + "/models/tiny-mlp.json"));
  EXPECT_EQ(a, b);
  // Control: the CNN is a different model and plans differently.
  EXPECT_NE(planning_of(load_model(fx("tiny_cnn_train.onnx"))), b);
}

TEST(ImportOnnx, ExternalDataMayBeMissing) {
  REQUIRE_ONNX();
  Model a = load_model(fx("tiny_mlp_external.onnx"));
  Model b = load_model(fx("tiny_mlp.onnx"));
  EXPECT_EQ(a.parameter_count(), b.parameter_count());
}

TEST(ImportOnnx, TrainingExportKeepsBatchNormWithBuffers) {
  REQUIRE_ONNX();
  Model m = load_model(fx("tiny_cnn_train.onnx"));
  EXPECT_EQ(count_op(m, OpKind::batchnorm), 2);
  // conv 16*3*9 + BN 2*16 + conv 32*16*9 + BN 2*32 + head 32*10+10; running stats are buffers
  EXPECT_EQ(m.parameter_count(), 432 + 32 + 4608 + 64 + 330);
  EXPECT_EQ(m.buffer_count(), 2 * 16 + 2 * 32);
  EXPECT_DOUBLE_EQ(find_op(m, OpKind::batchnorm)->attrs.number("momentum"), 0.1);  // ONNX 0.9 = PyTorch 0.1
  EXPECT_FALSE(has_note(m, "folded")) << notes_of(m);
  // Same model as the zoo's tiny-cnn, written as IR.
  EXPECT_EQ(planning_of(m), planning_of(load_model(std::string(DLPLAN_SOURCE_DIR) + "/models/tiny-cnn.json")));
}

TEST(ImportOnnx, EvalExportDetectsFoldedBatchNorm) {
  REQUIRE_ONNX();
  Model m = load_model(fx("tiny_cnn_eval.onnx"));
  EXPECT_EQ(count_op(m, OpKind::batchnorm), 0);
  EXPECT_EQ(m.parameter_count(), 432 + 16 + 4608 + 32 + 330);  // conv biases in place of BN
  EXPECT_TRUE(has_note(m, "BatchNorm appears folded into 2 Conv layers")) << notes_of(m);
  EXPECT_TRUE(has_note(m, "about 48 more")) << notes_of(m);
  EXPECT_TRUE(has_note(m, "SyncBatchNorm advice does not apply")) << notes_of(m);
}

TEST(ImportOnnx, EncoderAttentionFusedWithSymbolicDims) {
  REQUIRE_ONNX();
  Model m = load_model(fx("tiny_encoder_train.onnx"), ImportOptions{2, 16});
  ASSERT_EQ(count_op(m, OpKind::attention), 2) << notes_of(m);
  const Node* a = find_op(m, OpKind::attention);
  EXPECT_EQ(a->attrs.integer("heads"), 4);
  EXPECT_FALSE(a->attrs.flag("causal"));  // the mask comes from the attention_mask input
  EXPECT_TRUE(a->attrs.flag("bias"));
  EXPECT_DOUBLE_EQ(a->attrs.number("dropout"), 0.1);
  EXPECT_EQ(count_op(m, OpKind::gelu), 2);
  EXPECT_EQ(find_op(m, OpKind::gelu)->attrs.text("approximate"), "none");
  EXPECT_EQ(count_op(m, OpKind::pos_embedding), 1);
  EXPECT_EQ(count_op(m, OpKind::select), 1);
  EXPECT_EQ(count_op(m, OpKind::dropout), 4);  // residual dropouts; attention's is inside the op
  // embeddings 100*32 + 64*32; per layer attention 4*(32*32+32), 2 LN 4*32, FFN 32*64+64 + 64*32+32; head 32*3+3
  const int64_t layer = 4 * (32 * 32 + 32) + 4 * 32 + (32 * 64 + 64) + (64 * 32 + 32);
  EXPECT_EQ(m.parameter_count(), 100 * 32 + 64 * 32 + 2 * layer + 32 * 3 + 3);
  EXPECT_EQ(input_shape(m, "input_ids"), (Shape{16}));  // sequence from --seq-len
  EXPECT_EQ(m.units.size(), 3u);
  EXPECT_TRUE(m.node_index("loss") >= 0);
}

TEST(ImportOnnx, SymbolicSequenceNeedsSeqLen) {
  REQUIRE_ONNX();
  auto msg = error_of(fx("tiny_encoder_train.onnx"));
  EXPECT_NE(msg.find("symbolic dimension 'sequence'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--seq-len"), std::string::npos) << msg;
}

// A position table read at indices the importer cannot evaluate (here they
// pass a Round) is refused, naming the node. It used to be planned as rows
// 0..T-1, which trained the wrong rows wherever they were not (OPT's start
// at 2). The control: the same decoder with plain positions imports.
TEST(ImportOnnx, PositionsTheImporterCannotEvaluateAreRefusedNotGuessed) {
  REQUIRE_ONNX();
  const auto msg = error_of(fx("tiny_decoder_rounded_positions.onnx"));
  EXPECT_NE(msg.find("node '/transformer/wpe/Gather'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("could not evaluate at import"), std::string::npos) << msg;
  EXPECT_NO_THROW(load_model(fx("tiny_decoder_train.onnx")));
}

// Positions clamped to the table (ProphetNet's Clip) are evaluated at import:
// 0..T-1 within [0, T-1], the same rows as the plain decoder's.
TEST(ImportOnnx, PositionsClampedToTheTableAreEvaluated) {
  REQUIRE_ONNX();
  const Model clipped = load_model(fx("tiny_decoder_clipped_positions.onnx"));
  const Model plain = load_model(fx("tiny_decoder_train.onnx"));
  EXPECT_EQ(clipped.parameter_count(), plain.parameter_count());
  ASSERT_NE(find_op(clipped, OpKind::pos_embedding), nullptr) << notes_of(clipped);
  EXPECT_EQ(find_op(clipped, OpKind::pos_embedding)->attrs.values, find_op(plain, OpKind::pos_embedding)->attrs.values);
  EXPECT_EQ(clipped.nodes.size(), plain.nodes.size());
}

TEST(ImportOnnx, DecoderFusedQkvCausalTanhGelu) {
  REQUIRE_ONNX();
  Model m = load_model(fx("tiny_decoder_train.onnx"));
  ASSERT_EQ(count_op(m, OpKind::attention), 2) << notes_of(m);
  const Node* a = find_op(m, OpKind::attention);
  EXPECT_EQ(a->attrs.integer("heads"), 4);
  EXPECT_TRUE(a->attrs.flag("causal"));  // constant mask
  EXPECT_EQ(find_op(m, OpKind::gelu)->attrs.text("approximate"), "tanh");
  const int64_t layer = 2 * 64 + (32 * 96 + 96) + (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32);
  EXPECT_EQ(m.parameter_count(), 100 * 32 + 16 * 32 + 2 * layer + 64 + 32 * 100);
  EXPECT_EQ(input_shape(m, "targets"), (Shape{16}));
}

// An op nobody declared is planned as the IR's `opaque` op: its output at
// the shape ONNX gives, every input kept for backward (the conservative
// choice), named in the notes with its bytes; refused, naming the node, only
// when its output shape is unknown.
TEST(ImportOnnx, UnknownOpsArePlannedAsOpaqueAndListed) {
  REQUIRE_ONNX();
  Model m = load_model(fx("unknown_op.onnx"));
  EXPECT_TRUE(has_note(m, "3 x com.example.CustomOp (unknown to dlplan: planned as opaque, its output 1.5 KiB/sample"))
      << notes_of(m);
  ASSERT_EQ(count_op(m, OpKind::opaque), 3);
  for (const Node& n : m.nodes) {
    if (n.op != OpKind::opaque) continue;
    EXPECT_EQ(n.attrs.text("source"), "com.example.CustomOp");
    EXPECT_EQ(m.tensor(n.output).shape, (Shape{128}));
    const OpDecl d = declare(m, n);
    ASSERT_EQ(d.saved.size(), 1u) << n.name;  // its one input
    EXPECT_EQ(d.saved[0].ref, SavedTensor::Ref::input);
    EXPECT_TRUE(d.params.empty());
  }
  EXPECT_EQ(m.unaccounted_bytes, 0);  // planned, not left out
  EXPECT_EQ(m.parameter_count(), load_model(fx("tiny_mlp.onnx")).parameter_count());
}

// A learned tensor added outside a projection (here x + shift, shift [128],
// after a ReLU) is the IR's shift: its 128 parameters counted, nothing kept
// (PyTorch's add keeps nothing), trained by the CPU engine. It was passed
// through as a no-op once (a model trained without it), then opaque (not
// trainable, its parameters not counted).
TEST(ImportOnnx, AnAddOfALearnedTensorOutsideAProjectionIsAShift) {
  REQUIRE_ONNX();
  Model m = load_model(fx("initializer_add.onnx"));
  const Node* add = find_op(m, OpKind::shift);
  ASSERT_NE(add, nullptr) << notes_of(m);
  EXPECT_EQ(add->attrs.ints("shape"), (Shape{128}));
  const OpDecl d = declare(m, *add);
  EXPECT_TRUE(d.saved.empty());
  ASSERT_EQ(d.params.size(), 1u);
  EXPECT_EQ(d.params[0].numel, 128);
  EXPECT_EQ(count_op(m, OpKind::opaque), 0);
  EXPECT_EQ(m.parameter_count(), load_model(fx("tiny_mlp.onnx")).parameter_count() + 128);  // the same MLP without it
}

// A tensor with the batch folded into its first axis ([b H, T, hd], OPT's
// heads) is [H, T, hd] per sample: ONNX axis 1 is the IR's axis 1, where a
// batch-major tensor's axis 1 is the IR's 0. Slice, Concat and a Gather at a
// constant index all read their axis so; before, Slice and Concat took one
// off and sliced the heads (the file was refused: "[4, 8) is not a
// non-empty range within axis 0 ... [4, 8, 4]").
TEST(ImportOnnx, AxesOfABatchFoldedWithTheHeadsArePerSampleAxes) {
  REQUIRE_ONNX();
  Model m = load_model(fx("folded_heads.onnx"));
  EXPECT_EQ(m.parameter_count(), 16 * 16 + 16 * 10);
  std::vector<const Node*> slices, concats;
  for (const auto& n : m.nodes) {
    if (n.op == OpKind::slice) slices.push_back(&n);
    if (n.op == OpKind::concat) concats.push_back(&n);
  }
  ASSERT_EQ(slices.size(), 3u) << notes_of(m);  // the two halves, then the Gather of position 0
  ASSERT_EQ(concats.size(), 1u);
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 4}, {4, 8}, {0, 1}};
  for (size_t k = 0; k < slices.size(); ++k) {
    EXPECT_EQ(slices[k]->attrs.integer("axis"), 1) << slices[k]->name;
    EXPECT_EQ(slices[k]->attrs.integer("start"), ranges[k].first) << slices[k]->name;
    EXPECT_EQ(slices[k]->attrs.integer("end"), ranges[k].second) << slices[k]->name;
    EXPECT_EQ(m.tensor(slices[k]->inputs[0]).shape, (Shape{4, 8, 4})) << slices[k]->name;
  }
  EXPECT_EQ(m.tensor(slices[0]->output).shape, (Shape{4, 4, 4}));
  EXPECT_EQ(m.tensor(slices[2]->output).shape, (Shape{4, 1, 4}));
  EXPECT_EQ(concats[0]->attrs.integer("axis"), 1);
  EXPECT_EQ(m.tensor(concats[0]->output).shape, (Shape{4, 8, 4}));
  // The concatenation puts the second half first.
  EXPECT_EQ(concats[0]->inputs[0], slices[1]->output);
}

TEST(ImportOnnx, UnknownShapeChangingOpIsPlannedAtItsInferredShape) {
  REQUIRE_ONNX();
  Model m = load_model(fx("unknown_op_reshape.onnx"));
  const Node* halve = find_op(m, OpKind::opaque);
  ASSERT_NE(halve, nullptr) << notes_of(m);
  EXPECT_EQ(m.tensor(halve->output).shape, (Shape{64}));
  EXPECT_EQ(m.tensor(halve->inputs[0]).shape, (Shape{128}));
}

namespace {
// Importing fixture `file` fails with one message naming the file, the node
// and saying `what`.
void expect_refusal(const std::string& file, const std::string& node, const std::string& what) {
  const std::string msg = error_of(fx(file));
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find(node), std::string::npos) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
}
}  // namespace

TEST(ImportOnnx, UnknownOpWithoutAnOutputShapeIsAnErrorNamingTheNode) {
  REQUIRE_ONNX();
  expect_refusal("unknown_op_noshape.onnx", "/layers.1/halve/HalveWidth", "does not give its output's shape");
}

// ONNX derives a ConvTranspose's pads from an output_shape, possibly
// unevenly; torch never writes one, and the importer refuses it rather than
// plan other pads than the file's.
TEST(ImportOnnx, ConvTransposeWithAnOutputShapeIsAnErrorNamingTheNode) {
  REQUIRE_ONNX();
  expect_refusal("conv_transpose_output_shape.onnx", "/up/ConvTranspose", "output_shape is not supported");
}

TEST(ImportOnnx, MalformedAndTruncatedFilesAreOneClearMessage) {
  REQUIRE_ONNX();
  for (const char* f : {"malformed.onnx", "truncated.onnx"}) {
    auto msg = error_of(fx(f));
    EXPECT_NE(msg.find(f), std::string::npos) << msg;
    EXPECT_TRUE(msg.find("not a valid ONNX model") != std::string::npos ||
                msg.find("truncated") != std::string::npos)
        << msg;
  }
  auto msg = error_of(fx("no-such-file.onnx"));
  EXPECT_NE(msg.find("no-such-file.onnx"), std::string::npos) << msg;
}
