// The document library (plan_io.hpp): plans, reports and progress lines
// written and read back field for field; every field a user could get wrong
// refused with a message naming the file and the field (issue 16's plans
// "trusted" as they were: negative buckets, betas of 2, 1e10 accumulation, a
// null kind, a missing prediction); and the content hash that tells an edited
// plan from one dlplan wrote.
#include "error_of.hpp"
#include "dlplan/error.hpp"
#include "dlplan/limits.hpp"
#include "dlplan/loader.hpp"
#include "dlplan/plan_io.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <string>

namespace dlplan {
namespace {

using J = nlohmann::json;

// A plan dlplan wrote: tiny-gpt on 2 cpu ranks, zero3 forced, SyncBN off.
OrderedJson written_plan(Strategy s = Strategy::zero3) {
  PlanRequest req;
  req.model = load_model("tiny-gpt");
  req.cluster.device = find_device("cpu");
  req.cluster.gpus_per_node = 2;
  req.training.precision = Precision::fp32;
  req.training.micro_batch = 4;
  req.training.grad_accum = 2;
  req.training.optimizer.lr = 1e-3;
  req.forced = s;
  req.syncbn = SyncBnMode::off;
  const Planning p = plan(req);
  return plan_json(p, *p.chosen());
}

using testing::error_of;

// The message reading an edited `doc` gives (past the content hash, which
// PlanIntegrity tests).
std::string read_error(const OrderedJson& doc) {
  return error_of([&] { plan_from_json(doc, "plan.json", {.allow_edited = true}); });
}

// ---- round trips -------------------------------------------------------------

TEST(PlanDocument, ReadsBackWhatPlanJsonWrote) {
  const OrderedJson doc = written_plan();
  const PlanDocument p = plan_from_json(doc, "plan.json");
  EXPECT_EQ(p.path, "plan.json");
  EXPECT_FALSE(p.edited);
  EXPECT_EQ(p.model.name, "tiny-gpt");
  EXPECT_EQ(p.model.parameter_count(), doc["model"]["params"].get<int64_t>());
  EXPECT_EQ(p.cluster.world(), 2);
  EXPECT_EQ(p.training.strategy, Strategy::zero3);
  EXPECT_EQ(p.training.micro_batch, 4);
  EXPECT_EQ(p.training.grad_accum, 2);
  EXPECT_DOUBLE_EQ(p.training.optimizer.lr, 1e-3);
  EXPECT_EQ(p.predicted.memory.peak, doc["predicted"]["memory"]["peak"].get<int64_t>());
  EXPECT_EQ(p.predicted.memory.at_peak[static_cast<size_t>(Category::activations)],
            doc["predicted"]["memory"]["activations"].get<int64_t>());
  EXPECT_DOUBLE_EQ(p.predicted.step_seconds, doc["predicted"]["step_seconds"].get<double>());
  EXPECT_DOUBLE_EQ(p.predicted.comm.bytes, doc["predicted"]["comm"]["bytes"].get<double>());
  EXPECT_GT(p.predicted.comm.bytes, 0.0);
  EXPECT_EQ(p.document, doc);
  // The prediction read back is the one evaluate() makes for what was read.
  const StrategyResult again = evaluate(p.model, p.cluster, p.training);
  EXPECT_EQ(again.walk.peak, p.predicted.memory.peak);
}

TEST(PlanDocument, KeyOrderAndUnknownFieldsDoNotMatter) {
  const OrderedJson doc = written_plan();
  J sorted(doc);  // nlohmann::json sorts the keys
  EXPECT_NO_THROW(plan_from_json(sorted, "sorted.json"));
  OrderedJson grown = doc;
  grown["comment"] = "a field a newer dlplan adds";  // (and re-hashes)
  grown["content_hash"] = plan_content_hash(J(grown));
  EXPECT_NO_THROW(plan_from_json(grown, "grown.json"));
}

TEST(PlanDocument, ReadPlanFileNamesTheFile) {
  const std::string path = ::testing::TempDir() + "dlplan_documents_plan.json";
  std::ofstream(path) << written_plan().dump(1);
  EXPECT_EQ(read_plan_file(path).path, path);
  std::ofstream(path) << "{\"kind\": \"plan\", \"schema_version\": 1, \"micro_batch\": 1e400}";
  const std::string msg = error_of([&] { read_plan_file(path); });
  EXPECT_NE(msg.find(path + ": malformed JSON"), std::string::npos) << msg;
}

// ---- the content hash --------------------------------------------------------

TEST(PlanIntegrity, AnEditedPlanIsRefusedUnlessAllowed) {
  const OrderedJson doc = written_plan();
  for (const auto& [what, edit] : std::vector<std::pair<std::string, std::function<void(OrderedJson&)>>>{
           {"micro_batch", [](OrderedJson& d) { d["micro_batch"] = 8; }},
           {"strategy", [](OrderedJson& d) { d["strategy"] = "ddp"; }},
           {"node width", [](OrderedJson& d) {
              for (auto& n : d["model"]["ir"]["nodes"])
                if (n["name"] == "h.0.mlp.c_fc") n["out"] = 192;
            }},
           {"prediction", [](OrderedJson& d) { d["predicted"]["memory"]["peak"] = 1; }}}) {
    SCOPED_TRACE(what);
    OrderedJson edited = doc;
    edit(edited);
    ASSERT_NE(edited, doc) << "the edit changed nothing";
    const std::string msg = error_of([&] { plan_from_json(edited, "plan.json"); });
    EXPECT_NE(msg.find("plan.json: the plan was edited after dlplan planned it"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--allow-edited-plan"), std::string::npos) << msg;
    if (what == "node width") {  // allowed, the IR must still agree with model.params
      EXPECT_NE(read_error(edited).find("model.params = "), std::string::npos);
      continue;
    }
    const PlanDocument p = plan_from_json(edited, "plan.json", {.allow_edited = true});
    EXPECT_TRUE(p.edited);
  }
  EXPECT_FALSE(plan_from_json(doc, "plan.json").edited);  // control
}

TEST(PlanIntegrity, APlanWithoutAHashIsRefusedUnlessAllowed) {
  OrderedJson doc = written_plan();
  doc.erase("content_hash");
  const std::string msg = error_of([&] { plan_from_json(doc, "plan.json"); });
  EXPECT_NE(msg.find("plan.json: the plan has no content_hash"), std::string::npos) << msg;
  EXPECT_TRUE(plan_from_json(doc, "plan.json", {.allow_edited = true}).edited);
}

TEST(PlanIntegrity, TheHashIsOfTheContentNotItsSpelling) {
  const OrderedJson doc = written_plan();
  EXPECT_EQ(plan_content_hash(J(doc)), doc["content_hash"].get<std::string>());
  EXPECT_EQ(doc["content_hash"].get<std::string>().rfind("fnv1a64:", 0), 0u);
  EXPECT_EQ(plan_content_hash(J::parse(doc.dump(4))), doc["content_hash"].get<std::string>());  // reformatted
  OrderedJson other = doc;
  other["grad_accum"] = 3;
  EXPECT_NE(plan_content_hash(J(other)), plan_content_hash(J(doc)));  // control
}

// ---- every field checked ------------------------------------------------------

struct BadField {
  const char* name;
  std::function<void(OrderedJson&)> edit;
  const char* message;  // the whole message after "plan.json: "
};

class PlanFieldError : public ::testing::TestWithParam<BadField> {};

TEST_P(PlanFieldError, NamesTheFileAndTheField) {
  OrderedJson doc = written_plan();
  GetParam().edit(doc);
  const std::string msg = read_error(doc);
  const std::string message = GetParam().message;  // "(model.ir): ..." for what the IR loader says
  EXPECT_EQ(msg.rfind(std::string("plan.json") + (message[0] == '(' ? " " : ": ") + message, 0), 0u) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Plan, PlanFieldError,
    ::testing::Values(
        BadField{"BetaTwo", [](OrderedJson& d) { d["optimizer"]["betas"][0] = 2; }, "optimizer.betas[0] = 2 is outside [0, 1)"},
        BadField{"BetaNegative", [](OrderedJson& d) { d["optimizer"]["betas"] = {0.9, -1}; },
                 "optimizer.betas[1] = -1 is outside [0, 1)"},
        BadField{"OneBeta", [](OrderedJson& d) { d["optimizer"]["betas"] = {0.9}; },
                 "optimizer.betas = [0.9] must be an array of 2 numbers"},
        BadField{"NegativeLr", [](OrderedJson& d) { d["optimizer"]["lr"] = -1; }, "optimizer.lr = -1 must be >= 0"},
        BadField{"ZeroEps", [](OrderedJson& d) { d["optimizer"]["eps"] = 0; }, "optimizer.eps = 0 must be > 0"},
        BadField{"NegativeDecay", [](OrderedJson& d) { d["optimizer"]["weight_decay"] = -0.1; },
                 "optimizer.weight_decay = -0.1 must be >= 0"},
        BadField{"NegativeClip", [](OrderedJson& d) { d["optimizer"]["clip_norm"] = -1; }, "optimizer.clip_norm = -1 must be >= 0"},
        BadField{"NegativeWarmup", [](OrderedJson& d) { d["optimizer"]["warmup_steps"] = -5; },
                 "optimizer.warmup_steps = -5 must be an integer in [0, 2147483647]"},
        BadField{"UnknownOptimizer", [](OrderedJson& d) { d["optimizer"]["name"] = "lion"; },
                 "optimizer.name: unknown optimizer 'lion'"},
        BadField{"LrAsText", [](OrderedJson& d) { d["optimizer"]["lr"] = "fast"; }, "optimizer.lr = \"fast\" must be a number"},
        BadField{"NegativeBucket", [](OrderedJson& d) { d["bucket_mb"] = -1; }, "bucket_mb = -1 is outside (0, 1048576]"},
        BadField{"HugePrefetch", [](OrderedJson& d) { d["prefetch"] = 1e10; },
                 "prefetch = 10000000000.0 must be an integer in [0, 1024]"},
        BadField{"HugeAccumulation", [](OrderedJson& d) { d["grad_accum"] = 1e10; },
                 "grad_accum = 10000000000.0 must be an integer in [1, 65536]"},
        BadField{"ZeroMicroBatch", [](OrderedJson& d) { d["micro_batch"] = 0; }, "micro_batch = 0 must be an integer in [1, 1048576]"},
        BadField{"HugeMicroBatch", [](OrderedJson& d) { d["micro_batch"] = int64_t{1} << 62; },
                 "micro_batch = 4611686018427387904 must be an integer in [1, 1048576]"},
        BadField{"UnknownStrategy", [](OrderedJson& d) { d["strategy"] = "zero9"; }, "strategy: unknown strategy 'zero9'"},
        BadField{"SyncBnGroupNotDividing",
                 [](OrderedJson& d) { d["syncbn"] = {{"enabled", true}, {"group_size", 3}}; },
                 "syncbn.group_size = 3 must be an integer in [1, 2]"},
        BadField{"SyncBnNotBool", [](OrderedJson& d) { d["syncbn"]["enabled"] = 1; }, "syncbn.enabled = 1 must be true or false"},
        BadField{"NullKind", [](OrderedJson& d) { d["kind"] = nullptr; }, "not a plan (\"kind\" is null, expected \"plan\")"},
        BadField{"Report", [](OrderedJson& d) { d["kind"] = "report"; }, "not a plan (\"kind\" is \"report\", expected \"plan\")"},
        BadField{"NewerVersion", [](OrderedJson& d) { d["schema_version"] = 2; },
                 "schema_version 2 was written by a newer dlplan; this one reads schema_version 1"},
        BadField{"NoVersion", [](OrderedJson& d) { d.erase("schema_version"); }, "schema_version missing must be a positive integer"},
        BadField{"NoPrediction", [](OrderedJson& d) { d.erase("predicted"); }, "missing field 'predicted'"},
        BadField{"NegativePeak", [](OrderedJson& d) { d["predicted"]["memory"]["peak"] = -5; },
                 "predicted.memory.peak = -5 must be an integer in [0, 1152921504606846976]"},
        BadField{"NegativeStep", [](OrderedJson& d) { d["predicted"]["step_seconds"] = -1; },
                 "predicted.step_seconds = -1 must be >= 0"},
        BadField{"NullMfu", [](OrderedJson& d) { d["predicted"]["mfu"] = nullptr; }, "predicted.mfu = null must be a number"},
        BadField{"FitsAsText", [](OrderedJson& d) { d["predicted"]["fits"] = "yes"; },
                 "predicted.fits = \"yes\" must be true or false"},
        BadField{"ParamsDisagree", [](OrderedJson& d) { d["model"]["params"] = 5; }, "model.params = 5 but model.ir has"},
        BadField{"IrNotAnObject", [](OrderedJson& d) { d["model"]["ir"] = 3; }, "model.ir must be an object, not 3"},
        BadField{"BrokenIr", [](OrderedJson& d) { d["model"]["ir"]["nodes"][0]["op"] = "conv9"; },
                 "(model.ir): node 'wte': unknown op 'conv9'"},
        BadField{"NoCluster", [](OrderedJson& d) { d.erase("cluster"); }, "missing field 'cluster'"}),
    [](const auto& info) { return std::string(info.param.name); });

// The combination of knobs: every value in range, the global batch too large.
TEST(PlanFieldErrorCombined, GlobalBatchPastTheLimit) {
  OrderedJson doc = written_plan();
  doc["micro_batch"] = kMaxMicroBatch;
  doc["grad_accum"] = kMaxGradAccum;
  doc["cluster"]["gpus_per_node"] = 64;
  const std::string msg = read_error(doc);
  EXPECT_NE(msg.find("plan.json: the global batch micro_batch x grad_accum x 64 GPUs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("more than 2^40"), std::string::npos) << msg;
}

// ---- the run report ---------------------------------------------------------

RunReport a_report() {
  RunReport r;
  r.plan = plan_from_json(written_plan(), "plan.json");
  r.world_size = 2;
  r.seed = 7;
  r.loss = {3.5, 3.25, std::nan("")};
  r.predicted = r.plan.predicted;
  r.measured.memory = r.plan.predicted.memory;
  r.measured.max_each = r.plan.predicted.memory.at_peak;
  r.measured.rank = 1;
  r.measured.step_seconds = 0.25;
  r.measured.compute_seconds = 0.2;
  r.measured.comm = {1000, 0.1, 0.05};
  r.measured.mfu = 0.01;
  r.measured.tokens = true;
  r.measured.rate = 1234.5;
  r.measured.rss_bytes = 1 << 30;
  return r;
}

TEST(RunReportDocument, ReadsBackWhatReportJsonWrote) {
  const RunReport r = a_report();
  const OrderedJson j = report_json(r);
  EXPECT_EQ(j["kind"], "report");
  EXPECT_TRUE(j["loss"][2].is_null()) << "a NaN loss is written as null";
  const RunReport back = report_from_json(OrderedJson::parse(j.dump()), "report.json");
  EXPECT_EQ(back.plan.document, r.plan.document);
  EXPECT_EQ(back.world_size, 2);
  EXPECT_EQ(back.seed, 7u);
  ASSERT_EQ(back.loss.size(), 3u);
  EXPECT_DOUBLE_EQ(back.loss[1], 3.25);
  EXPECT_TRUE(std::isnan(back.loss[2]));
  EXPECT_EQ(back.measured.rank, 1);
  EXPECT_TRUE(back.measured.tokens);
  EXPECT_DOUBLE_EQ(back.measured.rate, 1234.5);
  EXPECT_EQ(back.measured.memory.peak, r.measured.memory.peak);
  EXPECT_EQ(back.predicted.memory.peak, r.plan.predicted.memory.peak);
  EXPECT_EQ(report_json(back), j);
}

TEST(RunReportDocument, FieldsAreChecked) {
  const OrderedJson good = report_json(a_report());
  struct Case {
    std::function<void(OrderedJson&)> edit;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {[](OrderedJson& d) { d["world_size"] = 3; }, "report.json: world_size = 3 but the plan is for 2 ranks"},
           {[](OrderedJson& d) { d["measured"]["rank"] = 2; }, "report.json: measured.rank = 2 must be an integer in [0, 1]"},
           {[](OrderedJson& d) { d["measured"]["samples_per_second"] = 1; },
            "report.json: measured must hold exactly one of tokens_per_second and samples_per_second"},
           {[](OrderedJson& d) { d["steps"] = 2; }, "report.json: loss must be an array of 2 numbers"},
           {[](OrderedJson& d) { d["loss"][0] = "low"; }, "report.json: loss[0] = \"low\" must be a number"},
           {[](OrderedJson& d) { d["measured"]["memory"]["grads"] = -1; }, "report.json: measured.memory.grads = -1"},
           {[](OrderedJson& d) { d["plan"]["micro_batch"] = 8; }, "report.json: the report's plan was edited after the run"},
           {[](OrderedJson& d) { d["plan"]["optimizer"]["eps"] = -1; },
            "report.json (plan): optimizer.eps = -1 must be > 0"},
           {[](OrderedJson& d) { d["kind"] = "plan"; }, "report.json: not a report"}}) {
    OrderedJson bad = good;
    c.edit(bad);
    const std::string msg = error_of([&] { report_from_json(bad, "report.json"); });
    EXPECT_EQ(msg.rfind(c.message, 0), 0u) << msg;
  }
}

// ---- progress lines ------------------------------------------------------------

TEST(ProgressLines, RoundTripAndOtherOutput) {
  ProgressLine l{.step = 3, .steps = 10, .loss = 2.5, .step_seconds = 0.125, .tokens = false, .rate = 64, .peak_bytes = 4096};
  const std::string text = progress_line_json(l);
  EXPECT_EQ(text, R"({"step":3,"steps":10,"loss":2.5,"step_seconds":0.125,"samples_per_second":64.0,"peak_bytes":4096})");
  const auto back = progress_line_from_json(text);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 3);
  EXPECT_EQ(back->steps, 10);
  EXPECT_DOUBLE_EQ(back->loss, 2.5);
  EXPECT_FALSE(back->tokens);
  EXPECT_EQ(back->peak_bytes, 4096);
  for (const char* other : {"", "training tiny-mlp on 2 ranks", "{}", "{\"step\": 1}", "{\"step\": 11, \"steps\": 10}",
                            "[1, 2]", "{\"step\": 1, \"steps\": 2, \"loss\": 1, \"step_seconds\": -1, \"samples_per_second\": 1, "
                                      "\"peak_bytes\": 1}"})
    EXPECT_FALSE(progress_line_from_json(other)) << other;
  EXPECT_FALSE(progress_line_from_json(std::string(100000, '{')));
}

}  // namespace
}  // namespace dlplan
