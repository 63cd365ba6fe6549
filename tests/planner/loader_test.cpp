// The IR loader on bad input: every class of user error ends in one
// dlplan::Error whose one-line message names the file, the node (or input /
// field) and the problem -- never a crash, another exception type, or a model
// that silently loads with a wrong number. Positive controls show the same
// base model loads when it is not broken, so each failure is the mutation's.
#include "error_of.hpp"
#include "dlplan/error.hpp"
#include "dlplan/ir.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/ops.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <string>

namespace dlplan {
namespace {

using J = nlohmann::json;

// A small valid classifier: x [8] f32 -> linear 4 -> cross_entropy with a
// scalar-per-sample label.
J base() {
  return J::parse(R"({
    "name": "base",
    "inputs": {"x": {"shape": [8], "dtype": "f32"}, "label": {"shape": [], "dtype": "i32"}},
    "nodes": [
      {"name": "fc", "op": "linear", "in": ["x"], "out": 4},
      {"name": "loss", "op": "cross_entropy", "in": ["fc", "label"]}
    ]
  })");
}

// A sequence model: x [4, 8] f32 feeding `middle`, whose last node is "mid";
// then select -> linear 3 -> loss.
J seq_model(const J& middle) {
  J ir = J::parse(R"({
    "inputs": {"x": {"shape": [4, 8], "dtype": "f32"}, "label": {"shape": [], "dtype": "i32"}},
    "nodes": []
  })");
  for (const auto& n : middle) ir["nodes"].push_back(n);
  ir["nodes"].push_back({{"name", "cls"}, {"op", "select"}, {"in", {"mid"}}});
  ir["nodes"].push_back({{"name", "head"}, {"op", "linear"}, {"in", {"cls"}}, {"out", 3}});
  ir["nodes"].push_back({{"name", "loss"}, {"op", "cross_entropy"}, {"in", {"head", "label"}}});
  return ir;
}

// A token model: tokens [5] i32 -> embedding 10 x 6 -> linear `head_out`
// (tied to the embedding when `tie`) -> loss against targets [5].
J token_model(int head_out, bool tie) {
  J ir = J::parse(R"({
    "inputs": {"tokens": {"shape": [5], "dtype": "i32"}, "targets": {"shape": [5], "dtype": "i32"}},
    "nodes": [
      {"name": "emb", "op": "embedding", "in": ["tokens"], "num": 10, "dim": 6},
      {"name": "head", "op": "linear", "in": ["emb"], "bias": false},
      {"name": "loss", "op": "cross_entropy", "in": ["head", "targets"]}
    ]
  })");
  ir["nodes"][1]["out"] = head_out;
  if (tie) ir["nodes"][1]["tie"] = "emb";
  return ir;
}

// An image model: img [3, 4, 4] -> conv2d (attributes `conv`) -> flatten ->
// linear 2 -> loss.
J image_model(const J& conv) {
  J ir = J::parse(R"({
    "inputs": {"img": {"shape": [3, 4, 4], "dtype": "f32"}, "label": {"shape": [], "dtype": "i32"}},
    "nodes": [
      {"name": "conv", "op": "conv2d", "in": ["img"]},
      {"name": "flat", "op": "flatten", "in": ["conv"]},
      {"name": "head", "op": "linear", "in": ["flat"], "out": 2},
      {"name": "loss", "op": "cross_entropy", "in": ["head", "label"]}
    ]
  })");
  for (const auto& [k, v] : conv.items()) ir["nodes"][0][k] = v;
  return ir;
}

J& node(J& ir, const std::string& name) {
  for (auto& n : ir["nodes"])
    if (n["name"] == name) return n;
  throw std::logic_error("test model has no node " + name);
}

// The message of the dlplan::Error that loading `ir` as "bad.json" throws.
// Any other exception type, or none, fails the test.
std::string load_error(const J& ir) {
  try {
    Model m = parse_model(ir, "bad.json");
    ADD_FAILURE() << "loaded without error; " << m.nodes.size() << " nodes, " << m.parameter_count() << " parameters";
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-dlplan exception: " << e.what();
  }
  return "";
}

// Loading `ir` fails with one line holding "bad.json" and every part.
void expect_error(const J& ir, std::initializer_list<std::string> parts) {
  const std::string msg = load_error(ir);
  EXPECT_NE(msg.find("bad.json"), std::string::npos) << "message does not name the file: " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
}

// ---- positive controls -------------------------------------------------------

TEST(LoaderValid, BaseModelLoads) {
  Model m = parse_model(base(), "base.json");
  ASSERT_EQ(m.nodes.size(), 2u);
  EXPECT_EQ(m.nodes[0].name, "fc");
  EXPECT_EQ(m.output_of(m.nodes[0]).shape, (Shape{4}));
  EXPECT_EQ(m.parameter_count(), 8 * 4 + 4);
  EXPECT_EQ(m.source, "base.json");
}

TEST(LoaderValid, ScalarLabelIsOneIntegerPerSample) {
  Model m = parse_model(base(), "base.json");
  int id = -1;
  for (int i : m.inputs)
    if (m.tensor(i).name == "label") id = i;
  ASSERT_GE(id, 0);
  const auto& label = m.tensor(id);
  EXPECT_EQ(label.dtype, DType::i32);
  EXPECT_TRUE(label.shape.empty());
  EXPECT_EQ(numel(label.shape), 1);
  EXPECT_EQ(m.output_of(m.nodes[1]).shape, Shape{});
}

TEST(LoaderValid, KernelAsHeightWidthPair) {
  J ir = image_model({{"out", 5}, {"kernel", {3, 1}}});
  node(ir, "conv")["padding"] = {1, 0};
  Model m = parse_model(ir, "pair.json");
  // H' = 4 + 2 - 3 + 1 = 4, W' = 4 + 0 - 1 + 1 = 4; weight 5 * 3 * 3 * 1.
  EXPECT_EQ(m.output_of(m.nodes[0]).shape, (Shape{5, 4, 4}));
  EXPECT_EQ(m.params[0].numel, 5 * 3 * 3 * 1);
  // Control: a square kernel of 3 without padding gives a different shape.
  Model sq = parse_model(image_model({{"out", 5}, {"kernel", 3}}), "sq.json");
  EXPECT_EQ(sq.output_of(sq.nodes[0]).shape, (Shape{5, 2, 2}));
}

TEST(LoaderValid, OutOfOrderNodesLoadInTopologicalOrder) {
  J ir = seq_model(J::array({{{"name", "mid"}, {"op", "gelu"}, {"in", {"x"}}}}));
  // Reverse the node list: loss, head, cls, mid.
  J rev = J::array();
  for (auto it = ir["nodes"].rbegin(); it != ir["nodes"].rend(); ++it) rev.push_back(*it);
  ir["nodes"] = rev;
  Model m = parse_model(ir, "rev.json");
  ASSERT_EQ(m.nodes.size(), 4u);
  // Every input of every node is a model input or an earlier node's output.
  for (size_t i = 0; i < m.nodes.size(); ++i)
    for (int id : m.nodes[i].inputs) {
      int producer = m.tensor(id).producer;
      EXPECT_LT(producer, static_cast<int>(i)) << m.nodes[i].name;
    }
  EXPECT_EQ(m.nodes.front().name, "mid");
  EXPECT_EQ(m.nodes.back().name, "loss");
  EXPECT_EQ(m.output_of(m.nodes[2]).shape, (Shape{3}));
}

TEST(LoaderValid, TiedHeadLoads) {
  Model m = parse_model(token_model(10, true), "tied.json");
  EXPECT_EQ(m.parameter_count(), 10 * 6);  // the head's weight is the embedding's
}

// ---- ops and attributes --------------------------------------------------------

TEST(LoaderError, UnknownOp) {
  J ir = base();
  node(ir, "fc")["op"] = "linaer";
  expect_error(ir, {"node 'fc'", "unknown op 'linaer'", "linear"});
}

TEST(LoaderError, UnknownAttribute) {
  J ir = base();
  node(ir, "fc")["outs"] = 4;
  expect_error(ir, {"node 'fc'", "unknown attribute 'outs'"});
}

TEST(LoaderError, MissingRequiredAttribute) {
  J ir = base();
  node(ir, "fc").erase("out");
  expect_error(ir, {"node 'fc'", "missing required attribute 'out'"});
}

TEST(LoaderError, StringWhereIntegerExpected) {
  J ir = base();
  node(ir, "fc")["out"] = "4";
  expect_error(ir, {"node 'fc'", "attribute 'out' must be an integer"});
}

TEST(LoaderError, FloatWhereIntegerExpected) {
  J ir = base();
  node(ir, "fc")["out"] = 4.5;
  expect_error(ir, {"node 'fc'", "attribute 'out' must be an integer"});
}

TEST(LoaderError, BoolWhereNumberExpected) {
  expect_error(seq_model(J::array({{{"name", "mid"}, {"op", "dropout"}, {"in", {"x"}}, {"p", true}}})),
               {"node 'mid'", "attribute 'p' must be a number", "true"});
}

TEST(LoaderError, NumberWhereBoolExpected) {
  J ir = base();
  node(ir, "fc")["bias"] = 1;
  expect_error(ir, {"node 'fc'", "attribute 'bias' must be true or false"});
}

TEST(LoaderError, KernelOfThreeValues) {
  expect_error(image_model({{"out", 2}, {"kernel", {1, 2, 3}}}), {"node 'conv'", "attribute 'kernel'", "[h, w]"});
}

TEST(LoaderError, MissingInput) {
  J ir = base();
  node(ir, "fc")["in"] = {"y"};
  expect_error(ir, {"node 'fc'", "input 'y' is neither a model input nor a node"});
}

TEST(LoaderError, WrongNumberOfInputs) {
  J ir = base();
  node(ir, "fc")["in"] = {"x", "x"};
  expect_error(ir, {"node 'fc'", "takes 1 input, got 2"});
  J ir2 = base();
  node(ir2, "loss")["in"] = {"fc"};
  expect_error(ir2, {"node 'loss'", "takes 2 inputs, got 1"});
}

TEST(LoaderError, InputsNotAnArray) {
  J ir = base();
  node(ir, "fc")["in"] = "x";
  expect_error(ir, {"node 'fc'", "'in' must be an array"});
}

TEST(LoaderError, NodeWithoutName) {
  J ir = base();
  node(ir, "fc").erase("name");
  expect_error(ir, {"node #0", "'name'"});
}

// ---- shapes ------------------------------------------------------------------

TEST(LoaderError, AddOfShapesThatDoNotBroadcast) {
  J ir = base();
  ir["nodes"] = J::parse(R"([
    {"name": "h", "op": "linear", "in": ["x"], "out": 4},
    {"name": "sum", "op": "add", "in": ["x", "h"]},
    {"name": "fc", "op": "linear", "in": ["sum"], "out": 4},
    {"name": "loss", "op": "cross_entropy", "in": ["fc", "label"]}
  ])");
  expect_error(ir, {"node 'sum'", "'x' [8]", "'h' [4]", "do not broadcast"});
}

TEST(LoaderError, TieToWrongShapedEmbedding) {
  expect_error(token_model(12, true), {"node 'head'", "tie to 'emb'", "[12, 6]", "[10, 6]"});
}

TEST(LoaderError, TieToNonEmbedding) {
  J ir = base();
  ir["nodes"] = J::parse(R"([
    {"name": "a", "op": "linear", "in": ["x"], "out": 8},
    {"name": "fc", "op": "linear", "in": ["a"], "out": 4, "tie": "a"},
    {"name": "loss", "op": "cross_entropy", "in": ["fc", "label"]}
  ])");
  expect_error(ir, {"node 'fc'", "tie names 'a'", "not an embedding"});
}

// `shares`: a node applying an earlier node's parameters (ALBERT's layers).
// x [8] -> a (linear 8) -> b (linear 8, shares a) -> n1 (layernorm) ->
// n2 (layernorm, shares n1) -> fc -> loss. The parameters count once and sit
// in the root unit; the node named must be earlier, the same op with the same
// attributes and parameter shapes, own its parameters and keep no buffers.
TEST(LoaderError, SharesNamesAnEarlierNodeOfTheSameOpAndShapes) {
  J ir = base();
  ir["nodes"] = J::parse(R"([
    {"name": "a", "op": "linear", "in": ["x"], "out": 8, "unit": "l0"},
    {"name": "b", "op": "linear", "in": ["a"], "out": 8, "shares": "a", "unit": "l1"},
    {"name": "n1", "op": "layernorm", "in": ["b"], "unit": "l0"},
    {"name": "n2", "op": "layernorm", "in": ["n1"], "shares": "n1", "unit": "l1"},
    {"name": "fc", "op": "linear", "in": ["n2"], "out": 4},
    {"name": "loss", "op": "cross_entropy", "in": ["fc", "label"]}
  ])");
  const Model m = parse_model(ir, "ok.json");  // control
  EXPECT_EQ(m.parameter_count(), (8 * 8 + 8) + (8 + 8) + (8 * 4 + 4));
  EXPECT_EQ(m.nodes[static_cast<size_t>(m.node_index("a"))].unit, 0);
  EXPECT_EQ(m.nodes[static_cast<size_t>(m.node_index("n1"))].unit, 0);
  for (const auto& p : m.params) EXPECT_NE(m.nodes[static_cast<size_t>(p.node)].name, "b") << p.name;
  EXPECT_EQ(parse_model(m.ir, "again.json").parameter_count(), m.parameter_count());  // the IR as planned keeps it

  J bad = ir;
  node(bad, "b")["shares"] = "fc";
  expect_error(bad, {"node 'b' (linear)", "shares names 'fc', which is not a node before this one"});
  bad = ir;
  node(bad, "b")["shares"] = 3;
  expect_error(bad, {"node 'b'", "attribute 'shares' must be the name of an earlier node"});
  bad = ir;
  node(bad, "n2")["shares"] = "a";
  expect_error(bad, {"node 'n2' (layernorm)", "which is a linear, not a layernorm"});
  bad = ir;
  node(bad, "b")["bias"] = false;
  expect_error(bad, {"node 'b'", "whose attributes differ"});
  bad = ir;
  node(bad, "a")["out"] = 6;  // b reads a's [6]: its weight [6, 6], a's [6, 8]
  node(bad, "b")["out"] = 6;
  expect_error(bad, {"node 'b'", "whose shapes differ"});
  bad = ir;
  node(bad, "n2")["shares"] = "b";
  node(bad, "n2")["op"] = "linear";
  node(bad, "n2")["out"] = 8;
  expect_error(bad, {"node 'n2'", "shares names 'b', which itself applies the parameters of 'a'; name that node"});
  bad = ir;
  bad["nodes"].insert(bad["nodes"].begin() + 2, J{{"name", "r1"}, {"op", "relu"}, {"in", {"b"}}});
  bad["nodes"].insert(bad["nodes"].begin() + 3, J{{"name", "r2"}, {"op", "relu"}, {"in", {"r1"}}, {"shares", "r1"}});
  node(bad, "n1")["in"] = {"r2"};
  expect_error(bad, {"node 'r2' (relu)", "shares parameters but has none"});
}

// A mixture of experts: tokens x [6, 8], a router over 2 experts, experts
// of width 5 with 6 places each (top 2 of 2, factor 1), and the combine.
// The combine's input e + 1 must be expert e's places, of the same router,
// routed alike; each mistake is named.
TEST(LoaderError, MixtureOfExpertsCombinesItsOwnExpertsInOrder) {
  J ir = J::parse(R"({
    "name": "moe",
    "inputs": {"x": {"shape": [6, 8], "dtype": "f32"}, "label": {"shape": [6], "dtype": "i32"}},
    "nodes": [
      {"name": "gate", "op": "moe_router", "in": ["x"], "experts": 2},
      {"name": "e0", "op": "moe_expert", "in": ["x", "gate"], "expert": 0, "hidden": 5, "capacity_factor": 1.0},
      {"name": "e1", "op": "moe_expert", "in": ["x", "gate"], "expert": 1, "hidden": 5, "capacity_factor": 1.0},
      {"name": "moe", "op": "moe_combine", "in": ["gate", "e0", "e1"], "capacity_factor": 1.0},
      {"name": "fc", "op": "linear", "in": ["moe"], "out": 3},
      {"name": "loss", "op": "cross_entropy", "in": ["fc", "label"]}
    ]
  })");
  const Model m = parse_model(ir, "ok.json");  // control
  EXPECT_EQ(m.parameter_count(), 2 * 8 + 2 * 3 * 5 * 8 + (8 * 3 + 3));
  EXPECT_EQ(m.output_of(m.nodes[1]).shape, (Shape{6, 8}));  // C = min(6, ceil(1 x 6 x 2 / 2)) places
  EXPECT_EQ(with_expert_units(m).units.size(), m.units.size() + 2);  // e0 and e1

  J bad = ir;
  node(bad, "moe")["in"] = {"gate", "e1", "e0"};
  expect_error(bad, {"node 'moe' (moe_combine)", "input 1 is expert 1's places ('e1'), where expert 0's belong"});
  bad = ir;
  node(bad, "moe")["in"] = {"gate", "e0"};
  expect_error(bad, {"node 'moe'", "its 2 experts' places, got 2 inputs"});
  bad = ir;
  node(bad, "e1")["top_k"] = 1;
  node(bad, "e1")["capacity_factor"] = 2.0;  // the same 6 places, routed by its first choice only
  expect_error(bad, {"node 'moe'", "expert 'e1' has top_k 1, the combine 2"});
  bad = ir;
  node(bad, "e0")["expert"] = 2;
  expect_error(bad, {"node 'e0' (moe_expert)", "expert 2 is not one of the router's 2 experts"});
  bad = ir;
  node(bad, "e0")["capacity"] = 7;
  expect_error(bad, {"node 'e0'", "capacity 7 exceeds the 6 tokens of a sample"});
  bad = ir;
  bad["nodes"].insert(bad["nodes"].begin() + 1, J{{"name", "gate2"}, {"op", "moe_router"}, {"in", {"x"}}, {"experts", 2}});
  node(bad, "e1")["in"] = {"x", "gate2"};
  expect_error(bad, {"node 'moe'", "expert 'e1' is routed by 'gate2', the combine by 'gate'"});
}

// A conv2d over [C, L] is a 1-D convolution (PyTorch's Conv1d): its weight is
// [out, C/groups, k]; a window with a height other than 1 is refused by name.
TEST(LoaderError, OneDimensionalConvolutionTakesTheWidthsWindow) {
  J ir = base();
  ir["inputs"]["x"]["shape"] = {2, 16};
  ir["nodes"] = J::parse(R"([
    {"name": "conv", "op": "conv2d", "in": ["x"], "out": 4, "kernel": 5, "stride": 2, "padding": 2},
    {"name": "pool", "op": "global_avgpool", "in": ["conv"]},
    {"name": "fc", "op": "linear", "in": ["pool"], "out": 4},
    {"name": "loss", "op": "cross_entropy", "in": ["fc", "label"]}
  ])");
  const Model m = parse_model(ir, "ok.json");  // control
  EXPECT_EQ(m.output_of(m.nodes[0]).shape, (Shape{4, 8}));  // (16 + 2 x 2 - 5) / 2 + 1
  EXPECT_EQ(m.params[0].shape, (Shape{4, 2, 5}));
  EXPECT_EQ(m.output_of(m.nodes[1]).shape, (Shape{4}));
  J bad = ir;
  node(bad, "conv")["kernel"] = {3, 5};
  expect_error(bad, {"node 'conv' (conv2d)", "a 1-D convolution over [C, L] takes the width's kernel"});
  bad = ir;
  node(bad, "conv")["kernel"] = 21;
  expect_error(bad, {"node 'conv'", "kernel 21 does not fit the input's length of 16 with padding 2"});
}

TEST(LoaderError, CrossEntropyTargetsOfWrongShape) {
  J ir = base();
  ir["inputs"]["label"]["shape"] = {3};
  expect_error(ir, {"node 'loss'", "targets 'label'", "[3]", "expected []"});
}

TEST(LoaderError, CrossEntropyFloatTargets) {
  J ir = base();
  ir["inputs"]["label"]["dtype"] = "f32";
  expect_error(ir, {"node 'loss'", "targets 'label' must be i32"});
}

TEST(LoaderError, ConvKernelLargerThanInput) {
  expect_error(image_model({{"out", 2}, {"kernel", 5}}), {"node 'conv'", "kernel 5 does not fit", "height of 4"});
}

TEST(LoaderError, ConvOnWrongRank) {
  J ir = base();
  ir["nodes"][0] = {{"name", "fc"}, {"op", "conv2d"}, {"in", {"x"}}, {"out", 4}, {"kernel", 1}};
  expect_error(ir, {"node 'fc'", "input 'x' has shape [8]", "[C, H, W]"});
}

// rope's positions are an axis before the features' (the last).
// Fixed sinusoidal positions: a known layout, a step, an even width, no
// learned row, and an offset that cannot overflow the table's length.
TEST(LoaderError, SinusoidalPositionsAreChecked) {
  const J base = J::parse(R"({
    "inputs": {"x": {"shape": [3, 4], "dtype": "f32"}, "label": {"shape": [], "dtype": "i32"}},
    "nodes": [
      {"name": "pos", "op": "pos_embedding", "in": ["x"], "sinusoidal": "halves", "frequency_step": 0.5},
      {"name": "flat", "op": "flatten", "in": ["pos"]},
      {"name": "head", "op": "linear", "in": ["flat"], "out": 2},
      {"name": "loss", "op": "cross_entropy", "in": ["head", "label"]}
    ]
  })");
  EXPECT_NO_THROW(parse_model(base, "good.json"));
  J ir = base;
  node(ir, "pos")["sinusoidal"] = "spiral";
  expect_error(ir, {"node 'pos'", "sinusoidal must be \"halves\" or \"interleaved\""});
  ir = base;
  node(ir, "pos").erase("frequency_step");
  expect_error(ir, {"node 'pos'", "need frequency_step"});
  ir = base;
  node(ir, "pos")["offset"] = int64_t{1} << 62;
  expect_error(ir, {"node 'pos'", "is past the"});
  ir = base;
  node(ir, "pos").erase("sinusoidal");
  expect_error(ir, {"node 'pos'", "frequency_step belongs to sinusoidal positions"});
  ir = base;
  ir["inputs"]["x"]["shape"] = J::array({3, 5});
  expect_error(ir, {"node 'pos'", "even width"});
}

TEST(LoaderError, RopePositionAxisMustPrecedeTheFeatures) {
  for (int axis : {-1, 0, -4}) {
    J ir = J::parse(R"({
      "inputs": {"x": {"shape": [3, 2, 4], "dtype": "f32"}, "label": {"shape": [], "dtype": "i32"}},
      "nodes": [
        {"name": "rot", "op": "rope", "in": ["x"], "interleaved": true},
        {"name": "flat", "op": "flatten", "in": ["rot"]},
        {"name": "head", "op": "linear", "in": ["flat"], "out": 2},
        {"name": "loss", "op": "cross_entropy", "in": ["head", "label"]}
      ]
    })");
    node(ir, "rot")["position_axis"] = axis;
    expect_error(ir, {"node 'rot'", fmt::format("position_axis {} is not an axis before the last", axis)});
  }
}

// ---- graph structure ---------------------------------------------------------

TEST(LoaderError, Cycle) {
  J ir = base();
  ir["nodes"] = J::parse(R"([
    {"name": "a", "op": "gelu", "in": ["b"]},
    {"name": "b", "op": "gelu", "in": ["a"]},
    {"name": "fc", "op": "linear", "in": ["b"], "out": 4},
    {"name": "loss", "op": "cross_entropy", "in": ["fc", "label"]}
  ])");
  expect_error(ir, {"cycle", "node 'a'", "node 'b'"});
}

TEST(LoaderError, SelfLoop) {
  J ir = base();
  node(ir, "fc")["in"] = {"fc"};
  expect_error(ir, {"node 'fc'", "its own output", "cycle"});
}

TEST(LoaderError, DuplicateNodeName) {
  J ir = base();
  ir["nodes"].insert(ir["nodes"].begin(), J{{"name", "fc"}, {"op", "relu"}, {"in", {"x"}}});
  expect_error(ir, {"node 'fc'", "duplicate node name"});
}

TEST(LoaderError, NodeNamedLikeModelInput) {
  J ir = base();
  ir["nodes"].insert(ir["nodes"].begin(), J{{"name", "x"}, {"op", "relu"}, {"in", {"x"}}});
  expect_error(ir, {"node 'x'", "duplicate name", "model input"});
}

// ---- sizes -------------------------------------------------------------------

TEST(LoaderError, LinearOutZero) {
  J ir = base();
  node(ir, "fc")["out"] = 0;
  expect_error(ir, {"node 'fc'", "attribute 'out' must be positive, got 0"});
}

TEST(LoaderError, InputShapeWithZero) {
  J ir = base();
  ir["inputs"]["x"]["shape"] = {0};
  expect_error(ir, {"input 'x'", "positive integers"});
}

TEST(LoaderError, InputShapeWithMinusOne) {
  J ir = base();
  ir["inputs"]["x"]["shape"] = {8, -1};
  expect_error(ir, {"input 'x'", "positive integers"});
}

TEST(LoaderError, InputShapeOverflows) {
  J ir = base();
  ir["inputs"]["x"]["shape"] = {int64_t{1} << 40, int64_t{1} << 40};
  expect_error(ir, {"input 'x'", "too large"});
}

TEST(LoaderError, OutputShapeOverflows) {
  // Each factor is allowed; the output [2^30, 2^30] is not.
  J ir = base();
  ir["inputs"]["x"]["shape"] = {int64_t{1} << 30, 8};
  node(ir, "fc")["out"] = int64_t{1} << 30;
  expect_error(ir, {"node 'fc'", "too large"});
}

TEST(LoaderError, HugeEmbeddingTable) {
  J ir = token_model(10, false);
  node(ir, "emb")["num"] = int64_t{1} << 62;
  expect_error(ir, {"node 'emb'", "'num'", "too large"});
}

TEST(LoaderError, LinearWeightOverflows) {
  // Input [2^30] and out 2^30 are each allowed; the weight (2^60) is not.
  J ir = base();
  ir["inputs"]["x"]["shape"] = {int64_t{1} << 30};
  node(ir, "fc")["out"] = int64_t{1} << 30;
  expect_error(ir, {"node 'fc'", "weight [out, in]", "too large"});
}

TEST(LoaderError, EmbeddingWeightOverflows) {
  J ir = token_model(10, false);
  node(ir, "emb")["num"] = int64_t{1} << 40;
  node(ir, "emb")["dim"] = int64_t{1} << 20;
  expect_error(ir, {"node 'emb'", "weight [num, dim]", "too large"});
}

TEST(LoaderError, HugePadding) {
  expect_error(image_model({{"out", 2}, {"kernel", 1}, {"padding", int64_t{1} << 62}}), {"node 'conv'", "too large"});
}

// ---- dtypes ------------------------------------------------------------------

TEST(LoaderError, EmbeddingOfFloatIds) {
  J ir = token_model(10, false);
  ir["inputs"]["tokens"]["dtype"] = "f32";
  expect_error(ir, {"node 'emb'", "'tokens' must be i32 ids", "f32"});
}

TEST(LoaderError, BadDtypeString) {
  J ir = base();
  ir["inputs"]["x"]["dtype"] = "f16";
  expect_error(ir, {"input 'x'", "'dtype' must be \"f32\" or \"i32\""});
}

TEST(LoaderError, DtypeNotAString) {
  J ir = base();
  ir["inputs"]["x"]["dtype"] = 32;
  expect_error(ir, {"input 'x'", "'dtype' must be \"f32\" or \"i32\""});
}

TEST(LoaderError, LinearOnIntegerInput) {
  J ir = base();
  ir["inputs"]["x"]["dtype"] = "i32";
  expect_error(ir, {"node 'fc'", "input 'x' is i32, expected f32"});
}

// ---- op-specific limits ------------------------------------------------------

TEST(LoaderError, SelectIndexOutOfRange) {
  J ir = seq_model(J::array({{{"name", "mid"}, {"op", "gelu"}, {"in", {"x"}}}}));
  node(ir, "cls")["index"] = 4;
  expect_error(ir, {"node 'cls'", "index 4 is outside [0, 4)"});
  node(ir, "cls")["index"] = -1;
  expect_error(ir, {"node 'cls'", "index -1 is outside"});
  node(ir, "cls")["index"] = 3;  // control: the last position is fine
  EXPECT_NO_THROW(parse_model(ir, "ok.json"));
}

TEST(LoaderError, DropoutProbabilityOne) {
  J mid = J::array({{{"name", "mid"}, {"op", "dropout"}, {"in", {"x"}}, {"p", 1.0}}});
  expect_error(seq_model(mid), {"node 'mid'", "attribute 'p' must be in [0, 1)", "got 1"});
  mid[0]["p"] = 0.9;  // control
  EXPECT_NO_THROW(parse_model(seq_model(mid), "ok.json"));
}

TEST(LoaderError, ClipBoundsMustBeOrdered) {
  J mid = J::array({{{"name", "mid"}, {"op", "clip"}, {"in", {"x"}}, {"min", 6.0}, {"max", 0.0}}});
  expect_error(seq_model(mid), {"node 'mid'", "attributes 'min' 6 and 'max' 0 must be finite with min < max"});
  mid[0].erase("max");
  expect_error(seq_model(mid), {"node 'mid'", "'max'"});
  mid[0]["min"] = 0.0;  // control: ReLU6
  mid[0]["max"] = 6.0;
  EXPECT_NO_THROW(parse_model(seq_model(mid), "ok.json"));
}

// mul broadcasts as NumPy does (x [4, 8] by a [4, 1] gate or an [8] scale); a
// pair of shapes that does not broadcast names both.
TEST(LoaderError, MulOperandsMustBroadcast) {
  J mid = J::array({{{"name", "gate"}, {"op", "linear"}, {"in", {"x"}}, {"out", 3}},
                    {{"name", "mid"}, {"op", "mul"}, {"in", {"x", "gate"}}}});
  expect_error(seq_model(mid), {"node 'mid'", "inputs 'x' [4, 8] and 'gate' [4, 3] do not broadcast"});
  mid[0]["out"] = 1;  // control: [4, 8] * [4, 1]
  const Model m = parse_model(seq_model(mid), "ok.json");
  EXPECT_EQ(m.tensor(m.nodes[static_cast<size_t>(m.node_index("mid"))].output).shape, (Shape{4, 8}));
  EXPECT_EQ(broadcast_shape({2, 1, 3}, {4, 1}), (Shape{2, 4, 3}));  // each side repeats along the other's
  EXPECT_EQ(broadcast_shape({3}, {}), (Shape{3}));
  EXPECT_FALSE(broadcast_shape({2, 3}, {3, 2}).has_value());
}

// concat: every dimension but the axis equal; one input at least.
TEST(LoaderError, ConcatShapesMustAgree) {
  J mid = J::array({{{"name", "a"}, {"op", "linear"}, {"in", {"x"}}, {"out", 3}},
                    {{"name", "mid"}, {"op", "concat"}, {"in", {"x", "a"}}, {"axis", 0}}});
  expect_error(seq_model(mid), {"node 'mid'", "input 'a' [4, 3] must match 'x' [4, 8] in every dimension but axis 0"});
  mid[1]["axis"] = 2;
  expect_error(seq_model(mid), {"node 'mid'", "axis 2 is outside the per-sample dimensions of 'x' [4, 8]"});
  mid[1]["in"] = J::array();
  expect_error(seq_model(mid), {"node 'mid'", "takes one or more inputs, got none"});
  mid[1]["in"] = {"x", "a", "x"};  // control: [4, 8 + 3 + 8]
  mid[1]["axis"] = 1;
  const Model m = parse_model(seq_model(mid), "ok.json");
  EXPECT_EQ(m.tensor(m.nodes[static_cast<size_t>(m.node_index("mid"))].output).shape, (Shape{4, 19}));
}

// transpose: perm names each per-sample axis once; the output is permuted.
// pos_embedding's `row` reads one row of the table at every position, so the
// sequence may be longer than the table; the row must be in it.
TEST(LoaderError, PosEmbeddingRowMustBeInTheTable) {
  J mid = J::array({{{"name", "a"}, {"op", "linear"}, {"in", {"x"}}, {"out", 3}},
                    {{"name", "mid"}, {"op", "pos_embedding"}, {"in", {"a"}}, {"max_len", 2}, {"row", 2}}});
  expect_error(seq_model(mid), {"node 'mid'", "row 2 is outside the table's [0, 2)"});
  mid[1]["row"] = -1;
  expect_error(seq_model(mid), {"node 'mid'", "row -1 is outside"});
  mid[1].erase("row");  // control: positions 0..3 of a 2-row table
  expect_error(seq_model(mid), {"node 'mid'", "sequence length 4 exceeds the position table's max_len 2"});
  mid[1]["row"] = 1;
  const Model m = parse_model(seq_model(mid), "ok.json");
  const auto w = std::find_if(m.params.begin(), m.params.end(), [](const ParamInfo& p) { return p.name == "mid.weight"; });
  ASSERT_NE(w, m.params.end());
  EXPECT_EQ(w->numel, 2 * 3);  // the whole [2, D] table
}

TEST(LoaderError, TransposePermMustBeAPermutation) {
  J mid = J::array({{{"name", "a"}, {"op", "linear"}, {"in", {"x"}}, {"out", 3}},
                    {{"name", "mid"}, {"op", "transpose"}, {"in", {"a"}}, {"perm", {1, 1}}}});
  expect_error(seq_model(mid), {"node 'mid'", "perm [1, 1] must name each of the 2 per-sample axes of 'a' [4, 3] once"});
  mid[1]["perm"] = {1, 0, 2};
  expect_error(seq_model(mid), {"node 'mid'", "perm [1, 0, 2] must name each of the 2 per-sample axes"});
  mid[1]["perm"] = {0, -1};
  expect_error(seq_model(mid), {"node 'mid'", "perm [0, -1]"});
  mid[1]["perm"] = "1,0";
  expect_error(seq_model(mid), {"node 'mid'", "attribute 'perm' must be a list of integers"});
  mid[1]["perm"] = {1, 0};  // control: [4, 3] -> [3, 4]
  const Model m = parse_model(seq_model(mid), "ok.json");
  EXPECT_EQ(m.tensor(m.nodes[static_cast<size_t>(m.node_index("mid"))].output).shape, (Shape{3, 4}));
}

// reshape: the same number of elements, every dimension positive.
TEST(LoaderError, ReshapeMustKeepTheElementCount) {
  J mid = J::array({{{"name", "mid"}, {"op", "reshape"}, {"in", {"x"}}, {"shape", {4, 4, 3}}}});
  expect_error(seq_model(mid), {"node 'mid'", "cannot reshape 'x' [4, 8] (32 elements) to [4, 4, 3] (48 elements)"});
  mid[0]["shape"] = {-1, 8};
  expect_error(seq_model(mid), {"node 'mid'", "attribute 'shape' [-1, 8] has a non-positive dimension"});
  mid[0]["shape"] = {2, 16};  // control
  const Model m = parse_model(seq_model(mid), "ok.json");
  EXPECT_EQ(m.tensor(m.nodes[static_cast<size_t>(m.node_index("mid"))].output).shape, (Shape{2, 16}));
}

// scale: the learned tensor broadcasts to the input without growing it, and
// is a parameter of that shape.
TEST(LoaderError, ScaleShapeMustBroadcastToItsInput) {
  J mid = J::array({{{"name", "mid"}, {"op", "scale"}, {"in", {"x"}}, {"shape", {3, 1}}}});
  expect_error(seq_model(mid), {"node 'mid'", "its learned tensor's shape [3, 1] does not broadcast to input 'x' [4, 8]"});
  mid[0]["shape"] = {2, 4, 8};
  expect_error(seq_model(mid), {"node 'mid'", "does not broadcast to input 'x' [4, 8]"});
  mid[0]["shape"] = {0, 8};
  expect_error(seq_model(mid), {"node 'mid'", "attribute 'shape' [0, 8] has a non-positive dimension"});
  mid[0].erase("shape");
  expect_error(seq_model(mid), {"node 'mid'", "missing required attribute 'shape'"});
  mid[0]["shape"] = {4, 1};  // control: a gain per row, 4 parameters
  const Model m = parse_model(seq_model(mid), "ok.json");
  EXPECT_EQ(m.tensor(m.nodes[static_cast<size_t>(m.node_index("mid"))].output).shape, (Shape{4, 8}));
  int64_t gamma = 0;
  for (const auto& p : m.params)
    if (p.name == "mid.weight") gamma = p.numel;
  EXPECT_EQ(gamma, 4);
}

// Cross attention and a position bias (T5): the inputs each flag asks for,
// in order, with the shapes they must have; the controls load with k and v
// read from the memory's width and rows.
TEST(LoaderError, CrossAttentionAndPositionBiasInputs) {
  J ir = seq_model(J::array({{{"name", "mid"}, {"op", "attention"}, {"in", {"x", "mem"}}, {"heads", 2}}}));
  ir["inputs"]["mem"] = {{"shape", {6, 5}}, {"dtype", "f32"}};
  expect_error(ir, {"node 'mid'", "takes 1 input (x), got 2"});
  node(ir, "mid")["cross"] = true;
  node(ir, "mid")["causal"] = true;
  expect_error(ir, {"node 'mid'", "cross attention cannot be causal"});
  node(ir, "mid")["causal"] = false;
  node(ir, "mid")["position_bias"] = true;
  expect_error(ir, {"node 'mid'", "takes 3 inputs (x, memory, position bias), got 2"});
  ir["inputs"]["pb"] = {{"shape", {2, 4, 4}}, {"dtype", "f32"}};
  node(ir, "mid")["in"] = {"x", "mem", "pb"};
  expect_error(ir, {"node 'mid'", "position bias 'pb' has shape [2, 4, 4], expected [2, 4, 6]"});
  ir["inputs"]["pb"]["shape"] = {2, 4, 6};
  node(ir, "mid")["scale"] = 0.0;
  expect_error(ir, {"node 'mid'", "attribute 'scale' must be positive and finite"});
  node(ir, "mid")["scale"] = 1.0;  // control
  const Model m = parse_model(ir, "ok.json");
  const AttentionShape a = attention_shape(m, m.nodes[static_cast<size_t>(m.node_index("mid"))]);
  EXPECT_EQ(a.T, 4);
  EXPECT_EQ(a.Tk, 6);
  EXPECT_EQ(a.Dm, 5);
  EXPECT_EQ(a.bias_input, 2);
  EXPECT_EQ(a.scale, 1.0);
  int64_t kv = 0;
  for (const auto& p : m.params)
    if (p.name == "mid.k.weight" || p.name == "mid.v.weight") kv += p.numel;
  EXPECT_EQ(kv, 2 * 8 * 5);  // [KV hd, Dm] each
}

TEST(LoaderError, RelativePositionBiasReadsIdsAndBucketsThem) {
  J ir = token_model(10, false);  // tokens [5] -> emb [5, 6] -> attention with the bias -> head
  ir["inputs"]["x"] = {{"shape", {5, 6}}, {"dtype", "f32"}};
  ir["nodes"].insert(ir["nodes"].begin() + 1,
                     J{{"name", "rpb"}, {"op", "relative_position_bias"}, {"in", {"x"}}, {"heads", 2}});
  ir["nodes"].insert(ir["nodes"].begin() + 2, J{{"name", "att"}, {"op", "attention"}, {"in", {"emb", "rpb"}},
                                                {"heads", 2}, {"position_bias", true}});
  node(ir, "head")["in"] = {"att"};
  expect_error(ir, {"node 'rpb'", "input 'x' has shape [5, 6], expected [T] ids"});
  ir["inputs"]["x"] = {{"shape", {5}}, {"dtype", "f32"}};
  expect_error(ir, {"node 'rpb'", "input 'x' must be i32 ids"});
  node(ir, "rpb")["in"] = {"tokens"};
  ir["inputs"].erase("x");
  node(ir, "rpb")["buckets"] = 2;
  expect_error(ir, {"node 'rpb'", "buckets 2 leaves no exact bucket"});
  node(ir, "rpb")["buckets"] = 8;
  node(ir, "rpb")["max_distance"] = 2;
  expect_error(ir, {"node 'rpb'", "max_distance 2 must exceed the 2 exactly bucketed offsets"});
  node(ir, "rpb")["max_distance"] = 16;  // control: a [2, 5, 5] bias from an [8, 2] table
  const Model m = parse_model(ir, "ok.json");
  EXPECT_EQ(m.tensor(m.nodes[static_cast<size_t>(m.node_index("rpb"))].output).shape, (Shape{2, 5, 5}));
  int64_t table = 0;
  for (const auto& p : m.params)
    if (p.name == "rpb.weight") table = p.numel;
  EXPECT_EQ(table, 8 * 2);
}

// An embedding tied to another reads its table: one parameter, in the root
// unit; the target must be an embedding with a table of the same size.
TEST(LoaderError, EmbeddingTieNamesAnEmbeddingOfTheSameSize) {
  J ir = token_model(10, false);  // tokens -> emb -> head; a second lookup of `more` added to it
  ir["inputs"]["more"] = {{"shape", {5}}, {"dtype", "i32"}};
  ir["nodes"].insert(ir["nodes"].begin() + 1, J{{"name", "emb2"}, {"op", "embedding"}, {"in", {"more"}}, {"num", 10},
                                                {"dim", 6}, {"tie", "head"}, {"unit", "block"}});
  ir["nodes"].insert(ir["nodes"].begin() + 2, J{{"name", "sum"}, {"op", "add"}, {"in", {"emb", "emb2"}}});
  node(ir, "head")["in"] = {"sum"};
  expect_error(ir, {"node 'emb2'", "tie names 'head', which is not a node before this one"});
  node(ir, "emb2")["tie"] = "emb";
  node(ir, "emb2")["num"] = 12;
  expect_error(ir, {"node 'emb2'", "tie to 'emb' needs [num, dim] = [12, 6] to equal its [10, 6]"});
  node(ir, "emb2")["num"] = 10;  // control
  node(ir, "emb")["unit"] = "block";
  const Model m = parse_model(ir, "ok.json");
  EXPECT_EQ(m.parameter_count(), 10 * 6 + 10 * 6);  // one table, and the head's weight
  EXPECT_EQ(m.nodes[static_cast<size_t>(m.node_index("emb"))].unit, 0);  // the root unit: both lookups read it
}

// T5's buckets (HF T5Attention._relative_position_bucket), worked by hand for
// its defaults, 32 buckets and max_distance 128. Encoder (bidirectional): 16
// buckets a side, offsets below 8 exact, then 8 + floor(log(d / 8) / log(16) * 8),
// at most 15, later keys 16 up. Decoder: 32 buckets for earlier keys, below 16
// exact, then 16 + floor(log(d / 16) / log(8) * 16), at most 31; later keys 0.
TEST(LoaderShapes, RelativePositionBucketsAsT5) {
  EXPECT_EQ(relative_position_bucket(0, 32, 128, true), 0);
  EXPECT_EQ(relative_position_bucket(-3, 32, 128, true), 3);
  EXPECT_EQ(relative_position_bucket(3, 32, 128, true), 19);
  EXPECT_EQ(relative_position_bucket(-8, 32, 128, true), 8);     // log 1 = 0
  EXPECT_EQ(relative_position_bucket(-20, 32, 128, true), 10);   // 8 + floor(2.64)
  EXPECT_EQ(relative_position_bucket(20, 32, 128, true), 26);
  EXPECT_EQ(relative_position_bucket(-127, 32, 128, true), 15);  // 8 + floor(7.977)
  EXPECT_EQ(relative_position_bucket(-500, 32, 128, true), 15);  // past max_distance
  EXPECT_EQ(relative_position_bucket(500, 32, 128, true), 31);
  EXPECT_EQ(relative_position_bucket(5, 32, 128, false), 0);
  EXPECT_EQ(relative_position_bucket(-5, 32, 128, false), 5);
  EXPECT_EQ(relative_position_bucket(-16, 32, 128, false), 16);
  EXPECT_EQ(relative_position_bucket(-40, 32, 128, false), 23);   // 16 + floor(7.05)
  EXPECT_EQ(relative_position_bucket(-127, 32, 128, false), 31);  // 16 + floor(15.94)
  EXPECT_EQ(relative_position_bucket(-1000, 32, 128, false), 31);
}

// ceil_mode rounds the pooled size up as PyTorch does, except that no window
// may start in the right padding. The expected sizes are PyTorch 1.13's.
TEST(LoaderShapes, MaxPoolCeilMode) {
  auto pooled = [](int64_t h, int64_t k, int64_t s, int64_t p, bool ceil) {
    J ir = J::parse(R"({"inputs": {"x": {"shape": [2, 1, 1], "dtype": "f32"}, "label": {"shape": [], "dtype": "i32"}},
                        "nodes": []})");
    ir["inputs"]["x"]["shape"] = {2, h, h};
    J pool = {{"name", "pool"}, {"op", "maxpool2d"}, {"in", {"x"}}, {"kernel", k}, {"stride", s}, {"padding", p}};
    if (ceil) pool["ceil_mode"] = true;
    ir["nodes"].push_back(pool);
    ir["nodes"].push_back({{"name", "flat"}, {"op", "flatten"}, {"in", {"pool"}}});
    ir["nodes"].push_back({{"name", "head"}, {"op", "linear"}, {"in", {"flat"}}, {"out", 3}});
    ir["nodes"].push_back({{"name", "loss"}, {"op", "cross_entropy"}, {"in", {"head", "label"}}});
    const Model m = parse_model(ir, "pool.json");
    return m.tensor(m.nodes[0].output).shape[1];
  };
  // torch.nn.functional.max_pool2d(torch.zeros(1, 1, h, h), k, s, p, ceil_mode=True).shape[-1]:
  EXPECT_EQ(pooled(111, 3, 2, 0, true), 55);
  EXPECT_EQ(pooled(112, 3, 2, 0, true), 56);  // floor gives 55
  EXPECT_EQ(pooled(112, 3, 2, 0, false), 55);
  EXPECT_EQ(pooled(5, 2, 2, 1, true), 3);  // rounded up to 4, but the 4th window would start in the padding
  EXPECT_EQ(pooled(5, 2, 2, 0, true), 3);
}

TEST(LoaderError, DropoutProbabilityRequired) {
  expect_error(seq_model(J::array({{{"name", "mid"}, {"op", "dropout"}, {"in", {"x"}}}})),
               {"node 'mid'", "missing required attribute 'p'"});
}

TEST(LoaderError, PosEmbeddingLongerThanTable) {
  J mid = J::array({{{"name", "mid"}, {"op", "pos_embedding"}, {"in", {"x"}}, {"max_len", 2}}});
  expect_error(seq_model(mid), {"node 'mid'", "sequence length 4 exceeds", "max_len 2"});
  mid[0]["max_len"] = 4;  // control
  EXPECT_NO_THROW(parse_model(seq_model(mid), "ok.json"));
}

TEST(LoaderError, AttentionHeadsNotDividingWidth) {
  J mid = J::array({{{"name", "mid"}, {"op", "attention"}, {"in", {"x"}}, {"heads", 3}}});
  expect_error(seq_model(mid), {"node 'mid'", "width 8 is not divisible by heads 3"});
  mid[0]["heads"] = 2;  // control
  EXPECT_NO_THROW(parse_model(seq_model(mid), "ok.json"));
}

TEST(LoaderError, GeluApproximateUnknown) {
  expect_error(seq_model(J::array({{{"name", "mid"}, {"op", "gelu"}, {"in", {"x"}}, {"approximate", "fast"}}})),
               {"node 'mid'", "'approximate'", "fast"});
}

// ---- top level ---------------------------------------------------------------

TEST(LoaderError, MissingNodes) {
  J ir = base();
  ir.erase("nodes");
  expect_error(ir, {"'nodes' must be a non-empty array"});
}

TEST(LoaderError, MissingInputs) {
  J ir = base();
  ir.erase("inputs");
  expect_error(ir, {"'inputs' must be a non-empty object"});
}

TEST(LoaderError, UnknownTopLevelField) {
  J ir = base();
  ir["layers"] = 3;
  expect_error(ir, {"unknown top-level field 'layers'"});
}

TEST(LoaderError, UnknownInputField) {
  J ir = base();
  ir["inputs"]["x"]["layout"] = "nchw";
  expect_error(ir, {"input 'x'", "unknown field 'layout'"});
}

TEST(LoaderError, NotAnObject) { expect_error(J::array({1, 2}), {"JSON object"}); }

TEST(LoaderError, NoLossNode) {
  J ir = base();
  ir["nodes"].erase(1);
  expect_error(ir, {"exactly one cross_entropy loss node, found 0"});
}

TEST(LoaderError, TwoLossNodes) {
  J ir = base();
  ir["nodes"].push_back({{"name", "loss2"}, {"op", "cross_entropy"}, {"in", {"fc", "label"}}});
  expect_error(ir, {"exactly one cross_entropy loss node, found 2", "'loss'", "'loss2'"});
}

// ---- files and the zoo -------------------------------------------------------

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream out(path, std::ios::binary);
  out << text;
  return path;
}

using testing::error_of;

TEST(LoaderFile, ValidFileLoads) {
  const auto path = write_temp("dlplan_loader_ok.json", base().dump());
  Model m = load_model_file(path);
  EXPECT_EQ(m.name, "base");
  EXPECT_EQ(m.source, path);
}

TEST(LoaderFile, MissingFile) {
  const std::string path = ::testing::TempDir() + "dlplan_no_such_model.json";
  std::remove(path.c_str());
  const auto msg = error_of([&] { load_model_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

TEST(LoaderFile, DirectoryIsNotAModel) {
  const std::string dir = ::testing::TempDir();
  const auto msg = error_of([&] { load_model(dir); });
  EXPECT_NE(msg.find(dir), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a model file"), std::string::npos) << msg;
}

TEST(LoaderFile, EmptyFile) {
  const auto path = write_temp("dlplan_loader_empty.json", "");
  const auto msg = error_of([&] { load_model_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
}

TEST(LoaderFile, MalformedJson) {
  const auto path = write_temp("dlplan_loader_malformed.json", "{\"name\": \"m\", \"inputs\": {,}}");
  const auto msg = error_of([&] { load_model_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
}

TEST(LoaderFile, TruncatedJson) {
  std::string text = base().dump();
  const auto path = write_temp("dlplan_loader_truncated.json", text.substr(0, text.size() / 2));
  const auto msg = error_of([&] { load_model_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
}

TEST(LoaderFile, SemanticErrorNamesThePath) {
  J ir = base();
  node(ir, "fc")["out"] = -3;
  const auto path = write_temp("dlplan_loader_bad_out.json", ir.dump());
  const auto msg = error_of([&] { load_model_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 'fc'"), std::string::npos) << msg;
}

TEST(LoaderZoo, UnknownNameListsTheZoo) {
  const auto msg = error_of([] { load_model("no-such-model"); });
  EXPECT_NE(msg.find("no-such-model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("zoo"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gpt2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tiny-gpt"), std::string::npos) << msg;
}

TEST(LoaderZoo, ZooNameAndFileAgree) {
  Model by_name = load_model("tiny-gpt");
  Model by_file = load_model(std::string(DLPLAN_SOURCE_DIR) + "/models/tiny-gpt.json");
  EXPECT_EQ(by_name.parameter_count(), by_file.parameter_count());
  EXPECT_EQ(by_name.ir, by_file.ir);
}

// ---- with_seq_len ------------------------------------------------------------

TEST(SeqLen, GptShorterSequenceLoads) {
  Model m = load_model("tiny-gpt");
  const int64_t before = tokens_per_sample(m);
  ASSERT_GT(before, 32);
  Model s = with_seq_len(m, 32);
  EXPECT_EQ(tokens_per_sample(s), 32);
  for (int id : s.inputs) {
    const auto& t = s.tensor(id);
    if (t.dtype == DType::i32) {
      EXPECT_EQ(t.shape, (Shape{32})) << t.name;
    }
  }
  EXPECT_EQ(s.parameter_count(), m.parameter_count());  // the position table keeps its size
  EXPECT_EQ(tokens_per_sample(m), before);              // the original is untouched
}

TEST(SeqLen, LongerThanPositionTable) {
  Model m = load_model("tiny-gpt");
  const auto msg = error_of([&] { with_seq_len(m, 10000); });
  EXPECT_NE(msg.find("tiny-gpt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 'wpe'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sequence length 10000"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_len"), std::string::npos) << msg;
}

TEST(SeqLen, NonPositive) {
  Model m = load_model("tiny-gpt");
  const auto msg = error_of([&] { with_seq_len(m, 0); });
  EXPECT_NE(msg.find("must be positive"), std::string::npos) << msg;
}

TEST(SeqLen, VisionModelHasNoTokenInputs) {
  Model m = load_model("tiny-cnn");
  EXPECT_EQ(tokens_per_sample(m), 0);
  const auto msg = error_of([&] { with_seq_len(m, 32); });
  EXPECT_NE(msg.find("tiny-cnn"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no token inputs"), std::string::npos) << msg;
}

// ---- issue 16: inputs that crashed or overflowed ------------------------------

// A node whose output nothing uses on the way to the loss: `plan` accepted
// it and `train` dereferenced its missing gradient (SIGSEGV in relu_backward).
// It is refused, naming the node; a model whose every node leads to the loss
// is the control.
TEST(LoaderError, NodeThatDoesNotLeadToTheLoss) {
  J ir = token_model(10, false);
  ir["nodes"].insert(ir["nodes"].begin() + 1, J{{"name", "unused"}, {"op", "relu"}, {"in", {"emb"}}});
  expect_error(ir, {"node 'unused' (relu) does not lead to the loss", "no gradient"});
  EXPECT_NO_THROW(parse_model(token_model(10, false), "good.json"));
}

TEST(LoaderError, SeveralNodesThatDoNotLeadToTheLoss) {
  J ir = base();
  ir["nodes"].push_back({{"name", "a"}, {"op", "relu"}, {"in", {"x"}}});
  ir["nodes"].push_back({{"name", "b"}, {"op", "relu"}, {"in", {"a"}}});
  ir["nodes"].push_back({{"name", "after"}, {"op", "relu"}, {"in", {"fc"}}});
  expect_error(ir, {"node 'a' (relu)", "3 such nodes", "'b' (relu)", "'after' (relu)"});
}

// A tensor computed once per step (a `parameter` and what is computed from
// it alone) has no batch axis: add, mul and matmul broadcast it over the
// samples; any other op beside per-sample inputs, BatchNorm and the loss
// refuse it, naming the node and the tensor.
TEST(LoaderError, ATensorWithoutTheBatchAxisWhereSamplesAreNeeded) {
  J ir = base();
  ir["nodes"].insert(ir["nodes"].begin(), J{{"name", "w"}, {"op", "parameter"}, {"in", J::array()}, {"shape", {8}}});
  ir["nodes"].insert(ir["nodes"].begin() + 1, J{{"name", "cat"}, {"op", "concat"}, {"in", {"x", "w"}}});
  ir["nodes"][2]["in"] = {"cat"};
  expect_error(ir, {"node 'cat' (concat)", "input 'w' has no batch axis", "only add, mul and matmul"});
  ir["nodes"][1] = J{{"name", "cat"}, {"op", "add"}, {"in", {"x", "w"}}};  // broadcast: fine
  const Model m = parse_model(ir, "good.json");
  EXPECT_FALSE(m.tensor(m.nodes[0].output).batched);
  EXPECT_TRUE(m.tensor(m.nodes[1].output).batched);
  ir["nodes"][1] = J{{"name", "cat"}, {"op", "relu"}, {"in", {"w"}}};  // once per step, then the loss
  expect_error(ir, {"node 'loss' (cross_entropy)", "input 'fc' has no batch axis", "cannot read"});
  ir["nodes"][0]["shape"] = {8, 0};
  expect_error(ir, {"node 'w' (parameter)", "non-positive dimension"});
}

// Attention over a sequence of 2^25 tokens: heads x T x T = 2^51 scores per
// sample overflowed the 64-bit products of the declaration (UBSan in
// ops_decl.cpp and the step program). Refused where attention's shape is read.
TEST(LoaderError, AttentionScoresPastTheLimit) {
  J ir = J::parse(R"({
    "inputs": {"x": {"shape": [33554432, 8], "dtype": "f32"}, "label": {"shape": [], "dtype": "i32"}},
    "nodes": [
      {"name": "mid", "op": "attention", "in": ["x"], "heads": 2},
      {"name": "cls", "op": "select", "in": ["mid"]},
      {"name": "head", "op": "linear", "in": ["cls"], "out": 3},
      {"name": "loss", "op": "cross_entropy", "in": ["head", "label"]}
    ]
  })");
  expect_error(ir, {"node 'mid' (attention)", "heads x T x T", "more than 2^48"});
  ir["inputs"]["x"]["shape"][0] = 64;  // control
  EXPECT_NO_THROW(parse_model(ir, "good.json"));
}

// Every tensor of a sample together: 64 linear layers of 2^43 elements each
// pass the per-tensor limit but not the per-sample one.
TEST(LoaderError, SampleElementsPastTheLimit) {
  J ir = J::parse(R"({"inputs": {"x": {"shape": [1048576, 8], "dtype": "f32"}, "label": {"shape": [], "dtype": "i32"}},
                      "nodes": []})");
  std::string prev = "x";
  for (int i = 0; i < 64; ++i) {
    const std::string name = "l" + std::to_string(i);
    ir["nodes"].push_back({{"name", name}, {"op", "linear"}, {"in", {prev}}, {"out", 8388608}});
    ir["nodes"].push_back({{"name", name + "r"}, {"op", "linear"}, {"in", {name}}, {"out", 8}});
    prev = name + "r";
  }
  ir["nodes"].push_back({{"name", "cls"}, {"op", "select"}, {"in", {prev}}});
  ir["nodes"].push_back({{"name", "loss"}, {"op", "cross_entropy"}, {"in", {"cls", "label"}}});
  expect_error(ir, {"one sample's tensors hold", "more than dlplan's limit of 2^48"});
}

// JSON nested 100,000 deep overflowed the stack (exit 139, no message);
// it is refused before parsing, for model files and Hugging Face configs alike.
TEST(LoaderFile, DeepNestingIsRefusedBeforeParsing) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const auto path = write_temp("dlplan_loader_deep.json", deep);
  const auto msg = error_of([&] { load_model(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("JSON nested deeper than 64 levels at byte 65"), std::string::npos) << msg;
  const auto hf = write_temp("dlplan_loader_deep_hf.json", "{\"model_type\": \"gpt2\", \"x\": " + deep + "}");
  EXPECT_NE(error_of([&] { load_model(hf); }).find("nested deeper than 64"), std::string::npos);
  // Brackets inside strings do not count (the control loads).
  J ir = base();
  ir["name"] = std::string(1000, '[');
  EXPECT_NO_THROW(load_model_file(write_temp("dlplan_loader_brackets.json", ir.dump())));
}

TEST(LoaderFile, NumberPastDoubleIsAMessageNotAnInternalError) {
  std::string text = base().dump();
  text.replace(text.find("\"out\":4"), 9, "\"out\":1e400");
  const auto path = write_temp("dlplan_loader_1e400.json", text);
  const auto msg = error_of([&] { load_model_file(path); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1e400"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dlplan
