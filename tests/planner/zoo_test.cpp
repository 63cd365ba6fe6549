// The zoo's parameter counts equal the frameworks' own exactly (published
// figures: torchvision and Hugging Face, REFERENCES.md), and the files in
// models/ are what the builders produce.
#include "dlplan/loader.hpp"
#include "dlplan/zoo.hpp"

#include <gtest/gtest.h>

#include <fstream>

using namespace dlplan;

namespace {

struct Published {
  const char* name;
  int64_t params;
};

class ZooCount : public ::testing::TestWithParam<Published> {};

TEST_P(ZooCount, EqualsTheFrameworkCount) {
  Model m = load_model(GetParam().name);
  EXPECT_EQ(m.parameter_count(), GetParam().params) << GetParam().name;
}

INSTANTIATE_TEST_SUITE_P(Published, ZooCount,
                         ::testing::Values(Published{"vit-b16", 86'567'656},      // torchvision vit_b_16
                                           Published{"resnet18", 11'689'512},     // torchvision resnet18
                                           Published{"resnet50", 25'557'032},     // torchvision resnet50
                                           Published{"gpt2", 124'439'808},        // HF gpt2, tied lm_head
                                           Published{"gpt2-medium", 354'823'168}, // HF gpt2-medium
                                           // HF BertModel with pooler 109,482,240 + a 768x2+2 classifier
                                           Published{"bert-base", 109'482'240 + 768 * 2 + 2},
                                           Published{"llama2-7b", 6'738'415'616},   // HF Llama-2-7b modules
                                           Published{"llama2-70b", 68'976'648'192},  // HF Llama-2-70b modules
                                           // transformers 4.38.2 (tests/fixtures/hf/transformers_counts.json)
                                           Published{"qwen2-7b", 7'615'616'512}, Published{"gemma-7b", 8'537'680'896},
                                           Published{"phi-2", 2'779'683'840},
                                           // transformers 4.38.2; the model card's 46.7B
                                           Published{"mixtral-8x7b", 46'702'792'704},
                                           // transformers 4.38.2 T5ForConditionalGeneration(T5Config(d_model 512,
                                           // d_kv 64, d_ff 1024, 8 + 8 layers, 6 heads, vocab 32128, gated-gelu,
                                           // untied)): 16,449,536 shared + 18,883,264 encoder + 25,178,816
                                           // decoder + 16,449,536 lm_head
                                           Published{"t5-v1_1-small", 76'961'152}),
                         [](const auto& info) {
                           std::string s = info.param.name;
                           for (auto& c : s)
                             if (c == '-') c = '_';
                           return s;
                         });

TEST(Zoo, TinyModelsAreSmall) {
  for (const char* name : {"tiny-mlp", "tiny-cnn", "tiny-vit", "tiny-gpt", "tiny-t5"}) {
    Model m = load_model(name);
    EXPECT_GT(m.parameter_count(), 1000) << name;
    EXPECT_LT(m.parameter_count(), 1'000'000) << name;
  }
}

TEST(Zoo, TiedHeadIsCountedOnceAndBelongsToTheRootUnit) {
  Model m = load_model("gpt2");
  zoo::GptConfig untied;
  untied.tie_head = false;
  untied.name = "gpt2-untied";
  Model u = parse_model(nlohmann::json(zoo::build_gpt(untied)), "untied");
  EXPECT_EQ(u.parameter_count() - m.parameter_count(), 50257LL * 768);  // the extra head
  for (const auto& p : m.params)
    if (p.name == "wte.weight") {
      EXPECT_EQ(p.unit, 0);
    }
}

TEST(Zoo, BatchNormStatisticsAreBuffersNotParameters) {
  Model m = load_model("resnet18");
  EXPECT_EQ(m.parameter_count(), 11'689'512);
  EXPECT_GT(m.buffer_count(), 0);
  int64_t bn_params = 0;
  for (const auto& p : m.params)
    if (m.nodes[static_cast<size_t>(p.node)].op == OpKind::batchnorm) bn_params += p.numel;
  EXPECT_EQ(m.buffer_count(), bn_params);  // running mean + var = 2C, as weight + bias
}

TEST(Zoo, FilesInModelsEqualTheBuilders) {
  for (const auto& e : zoo::zoo_entries()) {
    std::ifstream f(std::string(DLPLAN_SOURCE_DIR) + "/models/" + e.name + ".json");
    ASSERT_TRUE(f) << "models/" << e.name << ".json is missing; run dlplan model --zoo " << e.name;
    nlohmann::json file = nlohmann::json::parse(f);
    EXPECT_EQ(file, nlohmann::json(*zoo::zoo_model(e.name))) << "models/" << e.name << ".json is stale";
  }
}

TEST(Zoo, OwnSizesBuildThroughTheSameBuilders) {
  zoo::GptConfig c;
  c.name = "gpt-own";
  c.layers = 2;
  c.hidden = 128;
  c.heads = 4;
  c.vocab = 1000;
  c.context = 64;
  Model m = parse_model(nlohmann::json(zoo::build_gpt(c)), "own");
  // Hand count: wte 1000*128 + wpe 64*128 + per layer (2 LN 4*128 + attn
  // 4*128^2+4*128 + MLP 2*4*128^2 + 4*128 + 128) + ln_f 2*128.
  const int64_t h = 128, per_layer = 4 * h + 4 * h * h + 4 * h + 8 * h * h + 4 * h + h;
  EXPECT_EQ(m.parameter_count(), 1000 * h + 64 * h + 2 * per_layer + 2 * h);
  EXPECT_EQ(m.units.size(), 3u);  // root + two blocks
}

}  // namespace
