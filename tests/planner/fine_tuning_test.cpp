// Frozen parameters and LoRA (--freeze, --lora) against hand-derived figures:
//  - LoRA's parameters: A [r, in] and B [out, r] beside each targeted weight
//    (Hu et al. 2021, Sec. 4.1), so r (in + out) per target;
//  - model states: parameters count everything, gradients and optimizer
//    state only what trains (the ZeRO paper's 2 + 2 + K bytes per parameter,
//    Rajbhandari et al. 2020, Sec. 3.1, with Psi split into trainable and
//    frozen), sharded as each strategy shards them;
//  - what backward keeps: PyTorch's autograd saves a tensor only for a
//    gradient it computes, so a frozen weight keeps no input and a frozen
//    prefix of the model keeps nothing;
//  - the gradient collectives carry only trainable parameters, ZeRO-3's
//    gathers both;
//  - the LoRA paper's anchor: GPT-3 175B, r = 4 on the query and value
//    projections, training VRAM 1.2 TB -> 350 GB (Sec. 4.2).
#include "dlplan/explain.hpp"
#include "dlplan/fine_tuning.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/ops.hpp"
#include "dlplan/plan_io.hpp"
#include "dlplan/planner.hpp"
#include "dlplan/request.hpp"
#include "dlplan/step_program.hpp"
#include "dlplan/step_walk.hpp"
#include "dlplan/zoo.hpp"

#include "sharding_fixtures.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

using namespace dlplan;
using sharding_fixtures::nodes_of;
using sharding_fixtures::small_gpt;

namespace {

int64_t at(const CategoryBytes& b, Category c) { return b[static_cast<size_t>(c)]; }

Model adapted(Model m, const FineTuning& f) {
  apply_fine_tuning(m, f);
  return m;
}

FineTuning lora(int64_t r, std::vector<std::string> targets = {}, double alpha = 0) {
  FineTuning f;
  f.lora_rank = r;
  f.lora_targets = std::move(targets);
  f.lora_alpha = alpha;
  return f;
}

FineTuning frozen(std::vector<std::string> globs) {
  FineTuning f;
  f.freeze = std::move(globs);
  return f;
}

TrainingConfig config(Strategy s, const FineTuning& f, Precision p = Precision::bf16_mixed) {
  TrainingConfig t;
  t.strategy = s;
  t.precision = p;
  t.micro_batch = 2;
  t.fine_tuning = f;
  return t;
}

const Node& node_named(const Model& m, const std::string& name) {
  const int i = m.node_index(name);
  EXPECT_GE(i, 0) << name;
  return m.nodes.at(static_cast<size_t>(i));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(FineTuning, LoraAddsRTimesInPlusOutPerTargetAndFreezesTheBase) {
  // small_gpt: 3 layers of width 64; q and v are [64, 64].
  const Model base = small_gpt();
  const Model m = adapted(base, lora(8));
  const int64_t per_layer = 2 * 8 * (64 + 64);  // q and v: r (in + out) each
  EXPECT_EQ(m.parameter_count(), base.parameter_count() + 3 * per_layer);
  EXPECT_EQ(m.trainable_parameter_count(), 3 * per_layer);
  EXPECT_EQ(m.base_parameter_count(), base.parameter_count());
  for (const ParamInfo& p : m.params) EXPECT_EQ(p.trainable, p.adapter) << p.name;
  auto it = std::find_if(m.params.begin(), m.params.end(), [](const ParamInfo& p) { return p.name == "h.0.attn.q.lora_A"; });
  ASSERT_NE(it, m.params.end());
  EXPECT_EQ(it->shape, (Shape{8, 64}));
  EXPECT_EQ(std::next(it)->name, "h.0.attn.q.lora_B");
  EXPECT_EQ(std::next(it)->shape, (Shape{64, 8}));
  // Adapters follow their node's own parameters, in node order.
  EXPECT_EQ(std::prev(it)->node, it->node);
}

TEST(FineTuning, LoraOnLinearNodesByGlob) {
  // The MLP's two linear nodes per layer: c_fc [256, 64] and c_proj [64, 256].
  const Model m = adapted(small_gpt(), lora(4, {"*.mlp.*"}));
  EXPECT_EQ(m.trainable_parameter_count(), 3 * 2 * 4 * (64 + 256));
}

TEST(FineTuning, FreezeByNodeAndUnitGlobs) {
  const Model base = small_gpt();
  const Model m = adapted(base, frozen({"wte", "wpe", "h.0"}));  // h.0 is a unit's name
  int64_t frozen_count = 0;
  for (const ParamInfo& p : base.params) {
    const std::string& node = base.nodes[static_cast<size_t>(p.node)].name;
    if (node == "wte" || node == "wpe" || base.units[static_cast<size_t>(p.unit)] == "h.0") frozen_count += p.numel;
  }
  EXPECT_GT(frozen_count, 0);
  EXPECT_EQ(m.trainable_parameter_count(), base.parameter_count() - frozen_count);
  EXPECT_EQ(adapted(base, frozen({"h.0.*"})).trainable_parameter_count(),
            adapted(base, frozen({"h.0"})).trainable_parameter_count());
}

TEST(FineTuning, ModelStatesCountGradientsAndOptimizerOnlyForWhatTrains) {
  const Model m = adapted(small_gpt(), frozen({"wte", "wpe", "h.0.*"}));
  std::vector<int64_t> T(m.units.size()), F(m.units.size());
  for (const ParamInfo& p : m.params) (p.trainable ? T : F)[static_cast<size_t>(p.unit)] += p.numel;
  const int64_t N = 4;
  int64_t all = 0, train = 0, padded = 0, shard = 0, train_shard = 0;
  for (size_t u = 0; u < T.size(); ++u) {
    all += T[u] + F[u];
    train += T[u];
    padded += pad_to(T[u], N) + pad_to(F[u], N);
    shard += (pad_to(T[u], N) + pad_to(F[u], N)) / N;
    train_shard += pad_to(T[u], N) / N;
  }
  ASSERT_LT(train, all);
  struct Row {
    Strategy s;
    int64_t params, grads, optimizer;  // elements; bf16-mixed AdamW: 2, 2, 12 bytes each
  };
  for (const Row& r : {Row{Strategy::ddp, all, train, train}, Row{Strategy::zero1, padded, train, train_shard},
                       Row{Strategy::zero2, padded, train_shard, train_shard},
                       Row{Strategy::zero3, shard, train_shard, train_shard}}) {
    const CategoryBytes s = model_states(m, static_cast<int>(N), config(r.s, frozen({"wte", "wpe", "h.0.*"})));
    EXPECT_EQ(at(s, Category::params), 2 * r.params) << to_string(r.s);
    EXPECT_EQ(at(s, Category::grads), 2 * r.grads) << to_string(r.s);
    EXPECT_EQ(at(s, Category::optimizer), 12 * r.optimizer) << to_string(r.s);
    // The executor's tensor-by-tensor list sums to the same.
    CategoryBytes sum{};
    for (const StateTensor& t : model_state_tensors(m, static_cast<int>(N), config(r.s, frozen({"wte", "wpe", "h.0.*"}))))
      sum[static_cast<size_t>(t.category)] += t.bytes;
    EXPECT_EQ(sum, s) << to_string(r.s);
  }
}

TEST(FineTuning, AFrozenWeightKeepsNoInputAndBackwardOnlyTheInputGradient) {
  const Model m = adapted(small_gpt(), frozen({"h.1.mlp.c_fc"}));
  const Node& fc = node_named(m, "h.1.mlp.c_fc");
  OpDecl d = declare(m, fc);
  const double fwd = d.fwd_flops;
  ASSERT_EQ(d.saved.size(), 1u);  // as declared: its input, for dW = dY^T X
  restrict_to_needs(m, fc, GradNeeds{{true}, false}, d);
  EXPECT_TRUE(d.saved.empty());
  EXPECT_DOUBLE_EQ(d.bwd_flops, fwd);  // dX = dY W only: one GEMM of the forward's size
}

TEST(FineTuning, LoraAttentionKeepsItsInputAndTheThinProductsButNotTheContext) {
  const Model m = adapted(small_gpt(), lora(8));
  const Node& attn = node_named(m, "h.1.attn");
  OpDecl d = declare(m, attn);
  restrict_to_needs(m, attn, GradNeeds{{true}, false}, d);
  auto kept = [&](const std::string& what) {
    return std::any_of(d.saved.begin(), d.saved.end(), [&](const SavedTensor& s) { return s.ref == SavedTensor::Ref::own && s.what == what; });
  };
  EXPECT_TRUE(std::any_of(d.saved.begin(), d.saved.end(), [](const SavedTensor& s) { return s.ref == SavedTensor::Ref::input; }))
      << "x, for dA of the q and v adapters";
  EXPECT_FALSE(kept("context")) << "only dW_o reads it, and W_o is frozen";
  EXPECT_TRUE(kept("q.lora_xa"));
  EXPECT_TRUE(kept("v.lora_xa"));
  EXPECT_FALSE(kept("k.lora_xa"));
  for (const SavedTensor& s : d.saved)
    if (s.what == "q.lora_xa") {
      EXPECT_EQ(s.numel, 32 * 8);  // T x r
    }
  // FLOPs (per sample, T = 32, D = 64): forward adds the adapters' x A^T,
  // (x A^T) B^T and the scaled add, 2 T r (D + D) + 2 T D each; backward
  // loses the projections' weight GEMMs (2 T D 4D) and gains the adapters'
  // dB, d(xA), dA, dX: 2 T r (2 D + 2 D) each.
  const double T = 32, D = 64, r = 8;
  const OpDecl plain = declare(small_gpt(), node_named(small_gpt(), "h.1.attn"));
  EXPECT_DOUBLE_EQ(d.fwd_flops, plain.fwd_flops + 2 * (2 * T * r * (D + D) + 2 * T * D));
  EXPECT_DOUBLE_EQ(d.bwd_flops, plain.bwd_flops - 2 * T * D * 4 * D + 2 * (2 * T * r * (2 * D + 2 * D)));
}

TEST(FineTuning, AFrozenPrefixKeepsNothingForBackward) {
  // wte, wpe and layer 0 frozen: nothing before layer 1 needs a gradient, so
  // no op of layer 0 runs a backward or keeps a tensor (PyTorch builds no
  // graph for them).
  const Model m = adapted(small_gpt(), frozen({"wte", "wpe", "h.0.*"}));
  const StepProgram p = build_step_program(m, nodes_of(1, 1), config(Strategy::ddp, frozen({"wte", "wpe", "h.0.*"})));
  auto in_prefix = [&](int node) {
    const Node& n = m.nodes[static_cast<size_t>(node)];
    return n.name == "wte" || n.name == "wpe" || n.name == "drop" || m.units[static_cast<size_t>(n.unit)] == "h.0";
  };
  int prefix_nodes = 0;
  for (size_t i = 0; i < m.nodes.size(); ++i) {
    if (!in_prefix(static_cast<int>(i))) continue;
    ++prefix_nodes;
    EXPECT_FALSE(p.has_backward_at(static_cast<int>(i))) << m.nodes[i].name;
    for (const SavedTensor& s : p.decls[i].saved)  // own tensors are still made, as temporaries
      EXPECT_EQ(s.ref, SavedTensor::Ref::own) << m.nodes[i].name;
  }
  EXPECT_GT(prefix_nodes, 5);
  for (const ComputeEvent& e : p.compute)
    if (e.phase == Phase::backward) {
      EXPECT_FALSE(in_prefix(e.node)) << e.name;
    }
  for (const Instr& in : p.instrs) {
    if (in.kind != Instr::Kind::alloc) continue;
    if (in.role == Role::op_saved) {
      EXPECT_FALSE(in_prefix(in.node));
    }
    // No gradient of a prefix tensor either, except layer 0's output, which
    // layer 1 differentiates against.
    const int producer = in.role == Role::grad ? m.tensor(in.tensor).producer : -1;
    if (producer >= 0 && m.tensor(in.tensor).name != "h.0.add_2") {
      EXPECT_FALSE(in_prefix(producer)) << "grad of " << m.tensor(in.tensor).name;
    }
  }
  // And the peak's activations fall against full training.
  const Model full = small_gpt();
  const StepWalk a = walk_step(m, nodes_of(1, 1), config(Strategy::ddp, frozen({"wte", "wpe", "h.0.*"})));
  const StepWalk b = walk_step(full, nodes_of(1, 1), config(Strategy::ddp, FineTuning{}));
  EXPECT_LT(at(a.max_each, Category::activations), at(b.max_each, Category::activations));
}

TEST(FineTuning, CollectivesCarryTrainableGradientsAndGathersCarryBoth) {
  const FineTuning f = lora(8);
  const Model m = adapted(small_gpt(), f);
  const std::vector<int64_t> T = unit_trainable_counts(m), F = unit_frozen_counts(m);
  const int64_t S = 2;
  {  // DDP: the buckets all-reduce the adapters' bf16 gradients, nothing else
    const StepProgram p = build_step_program(m, nodes_of(1, 2), config(Strategy::ddp, f));
    double bytes = 0;
    for (const CommEvent& e : p.comm)
      if (e.purpose == CommPurpose::bucket_all_reduce) bytes += e.bytes;
    EXPECT_DOUBLE_EQ(bytes, 2.0 * static_cast<double>(m.trainable_parameter_count()));
  }
  {  // ZeRO-3: a unit's gather holds both runs; its reduce-scatter the trainable run
    const StepProgram p = build_step_program(m, nodes_of(1, 2), config(Strategy::zero3, f));
    int gathers = 0, scatters = 0;
    for (const CommEvent& e : p.comm) {
      const auto u = static_cast<size_t>(e.unit);
      if (e.purpose == CommPurpose::unit_gather || e.purpose == CommPurpose::root_gather) {
        EXPECT_DOUBLE_EQ(e.bytes, 2.0 * static_cast<double>(pad_to(T[u], S) + pad_to(F[u], S))) << e.name;
        ++gathers;
      }
      if (e.purpose == CommPurpose::unit_reduce_scatter) {
        EXPECT_DOUBLE_EQ(e.bytes, 2.0 * static_cast<double>(pad_to(T[u], S))) << e.name;
        EXPECT_GT(T[u], 0) << e.name << ": a unit with nothing to train reduces nothing";
        ++scatters;
      }
    }
    EXPECT_GT(gathers, 0);
    EXPECT_EQ(scatters, 3);  // the three layers' adapters; the root unit has none
  }
  {  // ZeRO-2: the updated shards all-gathered are the trainable ones only
    const StepProgram p = build_step_program(m, nodes_of(1, 2), config(Strategy::zero2, f));
    for (const CommEvent& e : p.comm)
      if (e.purpose == CommPurpose::param_all_gather) {
        EXPECT_DOUBLE_EQ(e.bytes, 2.0 * static_cast<double>(pad_to(T[static_cast<size_t>(e.unit)], S))) << e.name;
      }
  }
}

TEST(FineTuning, BadFlagsNameTheFlag) {
  const Model gpt = small_gpt();
  EXPECT_NE(error_of([&] { adapted(gpt, frozen({"nothing.*"})); }).find("--freeze: 'nothing.*' matches no node"),
            std::string::npos);
  EXPECT_NE(error_of([&] { adapted(gpt, frozen({"*"})); }).find("nothing would train"), std::string::npos);
  EXPECT_NE(error_of([&] { adapted(gpt, lora(8, {"h.*.ln_1"})); }).find("matches no linear node"), std::string::npos);
  EXPECT_NE(error_of([&] { adapted(gpt, lora(65)); }).find("above min(in, out) = 64"), std::string::npos);
  const Model mlp = load_model("tiny-mlp");
  EXPECT_NE(error_of([&] { adapted(mlp, lora(4)); }).find("has no attention node"), std::string::npos);
  FineTuning alpha_alone;
  alpha_alone.lora_alpha = 16;
  EXPECT_NE(error_of([&] { adapted(gpt, alpha_alone); }).find("need --lora R"), std::string::npos);
  RequestFlags f;
  f.model = "gpt2";
  f.gpus = 8;
  f.lora = 0;
  EXPECT_NE(error_of([&] { build_request(f); }).find("--lora"), std::string::npos);
}

TEST(FineTuning, PlanFilesCarryTheAdaptationAndCheckIt) {
  RequestFlags f;
  f.model = "tiny-gpt";
  f.gpus = 2;
  f.gpu = "cpu";
  f.lora = 4;
  f.lora_targets = "q,v,*.mlp.*";
  f.lora_alpha = 8;
  const Planning p = plan(build_request(f));
  ASSERT_NE(p.chosen(), nullptr);
  const OrderedJson j = plan_json(p, *p.chosen());
  const PlanDocument back = plan_from_json(j, "lora.json");
  EXPECT_EQ(back.training.fine_tuning.lora_rank, 4);
  EXPECT_DOUBLE_EQ(back.training.fine_tuning.lora_scale(), 2.0);
  EXPECT_EQ(back.model.trainable_parameter_count(), p.request.model.trainable_parameter_count());
  EXPECT_EQ(back.model.parameter_count(), p.request.model.parameter_count());
  OrderedJson edited = j;
  edited["fine_tuning"]["trainable_params"] = 1;
  PlanReadOptions allow;
  allow.allow_edited = true;
  EXPECT_NE(error_of([&] { plan_from_json(edited, "lora.json", allow); }).find("trainable_params = 1"), std::string::npos);
}

// Hu et al. 2021, Sec. 4.2: "On GPT-3 175B, we reduce the VRAM consumption
// during training from 1.2TB to 350GB. With r = 4 and only the query and value
// projection matrices being adapted, the checkpoint size is reduced by roughly
// 10,000x (from 350GB to 35MB)". GPT-3 175B (Brown et al. 2020, Table 2.1):
// 96 layers, d_model 12288, 96 heads, context 2048. Planned here on one
// device of unlimited memory, micro-batch 1, fp16-mixed, checkpointing of
// each layer (the paper states neither batch nor checkpointing).
TEST(FineTuning, LoraPaperGpt3Anchor) {
  zoo::GptConfig c;
  c.name = "gpt3-175b";
  c.layers = 96;
  c.hidden = 12288;
  c.heads = 96;
  c.context = 2048;
  c.dropout = 0;
  const Model base = parse_model(nlohmann::json(zoo::build_gpt(c)), "gpt3-175b");
  const FineTuning f = lora(4, {"q", "v"});
  const Model m = adapted(base, f);
  // Trainable: 2 targets x 96 layers x r (12288 + 12288).
  EXPECT_EQ(m.trainable_parameter_count(), int64_t{2} * 96 * 4 * (12288 + 12288));
  // The checkpoint: the adapters in fp16, 37.7 MB against the paper's "35MB".
  const double adapter_bytes = 2.0 * static_cast<double>(m.trainable_parameter_count());
  EXPECT_NEAR(adapter_bytes / 35e6, 1.0, 0.10);
  // The base in fp16: the paper's 350 GB checkpoint.
  EXPECT_NEAR(2.0 * static_cast<double>(base.parameter_count()) / 350e9, 1.0, 0.01);

  Cluster one = nodes_of(1, 1);
  TrainingConfig t = config(Strategy::ddp, f, Precision::fp16_mixed);
  t.micro_batch = 1;
  t.checkpointing = Checkpointing::units;
  const StepWalk lora_walk = walk_step(m, one, t);
  // VRAM with LoRA: the frozen fp16 weights, the adapters' states and one
  // layer's activations at a time: within 5% of the paper's 350 GB.
  EXPECT_NEAR(static_cast<double>(lora_walk.peak) / 350e9, 1.0, 0.05) << lora_walk.peak;

  // Full fine-tuning under the same settings keeps 16 bytes per parameter
  // (fp16 weights and gradients, fp32 master and Adam moments): 2.8 TB, not
  // the paper's 1.2 TB, which at 6.9 bytes per parameter cannot hold an fp32
  // master copy and fp32 moments (the paper does not say what it keeps).
  // Its claim "we reduce that VRAM usage by up to 2/3" holds here as well:
  // LoRA keeps at most a third of full fine-tuning.
  TrainingConfig full = t;
  full.fine_tuning = {};
  const StepWalk full_walk = walk_step(base, one, full);
  EXPECT_NEAR(static_cast<double>(full_walk.peak) / 2.8e12, 1.0, 0.05) << full_walk.peak;
  EXPECT_LT(static_cast<double>(lora_walk.peak), full_walk.peak / 3.0);
}

TEST(FineTuning, ExplainComparesWithTheZeroFormulasOverTrainableParameters) {
  // --explain's ZeRO formulas with Ψt of Ψ trainable. On GPT-2 over 8 GPUs
  // dlplan's model states exceed them only by the GPU allocator's rounding
  // (2 MiB segments for each unit's 14 MB frozen run: under 3.5%), and
  // ZeRO-3's gathered units, which the formula omits.
  RequestFlags f;
  f.model = "gpt2";
  f.gpus = 8;
  f.lora = 8;
  const Planning p = plan(build_request(f));
  for (const StrategyResult& r : p.results) {
    const ModelStates ms = compare_model_states(p, r);
    ASSERT_EQ(ms.estimates.size(), 1u) << to_string(r.strategy);
    EXPECT_NE(ms.estimates[0].formula.find("Ψt"), std::string::npos);
    const double gathered = r.strategy == Strategy::zero3 ? static_cast<double>(at(r.walk.at_peak, Category::gathered)) : 0;
    const double ratio = (static_cast<double>(ms.bytes) - gathered) / ms.estimates[0].bytes;
    EXPECT_GE(ratio, 1.0) << to_string(r.strategy);
    EXPECT_LT(ratio, 1.035) << to_string(r.strategy);
  }
}
