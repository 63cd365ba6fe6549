// The per-op-class GPU time model (docs/gpu-time-model.md) against what it
// was fitted to and checked on: each kernel curve reproduces its published
// source within the error the docs state, and the whole step reproduces the
// held-out published training runs (tests/planner/data/published_runs.csv,
// split = validation) within median 10 % and worst 25 % per GPU kind and per
// source, every run that ran predicted to fit. Each bound has a control that
// must break it.
#include "published_runs.hpp"

#include "dlplan/simulator.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

namespace dlplan {
namespace {

const std::string kData = std::string(DLPLAN_SOURCE_DIR) + "/tests/planner/data/";

// Rows of a small CSV (after '#' comments and the header), as fields.
std::vector<std::vector<std::string>> csv_rows(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  std::vector<std::vector<std::string>> rows;
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (header) {
      header = false;
      continue;
    }
    rows.push_back(published::csv_fields(line));
  }
  return rows;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The kernel-level device: the curves as a kernel benchmark measures them,
// without what a training step adds (sustained share, framework memory
// share). Memory-bound passes at 0.90 of HBM: one H200 measured a copy at
// ~4.3 of 4.8 TB/s (REFERENCES.md Hardware).
DeviceSpec kernel_level(const std::string& kind) {
  DeviceSpec d = find_device(kind);
  d.sustained_share = 0;
  d.memory_efficiency = 0.90;
  return d;
}

// ---- GEMM ---------------------------------------------------------------------

// Errors of the GEMM curve against OpenXLA's measured H100 table: TFLOP/s of
// one call, which XLA times with its launch (op_overhead_s, fitted with it).
std::vector<std::pair<double, double>> gemm_errors(const DeviceSpec& d) {
  std::vector<std::pair<double, double>> out;  // (GFLOP, relative error)
  for (const auto& f : csv_rows(kData + "gemm_h100_xla.csv")) {
    const GemmShape g{std::stod(f[2]), std::stod(f[3]), std::stod(f[4]), std::stod(f[1])};
    const double flops = 2 * g.m * g.n * g.k * g.batch;
    const double predicted = flops / (d.op_overhead_s + gemm_seconds(g, d, Precision::bf16_mixed)) / 1e12;
    out.emplace_back(flops / 1e9, predicted / std::stod(f[5]) - 1);
  }
  return out;
}

TEST(GemmCurve, ReproducesOpenXlaH100Table) {
  // docs/gpu-time-model.md: median error 2.9 % over 69 shapes; every shape
  // of at least 8 GFLOP (the GEMMs of a transformer layer) within 15 % (the
  // worst, 256 x 4096 x 4096, is 14 % fast: its split-K reduction is free here).
  const auto errs = gemm_errors(kernel_level("h100-80g"));
  ASSERT_EQ(errs.size(), 69u);
  std::vector<double> all;
  for (const auto& [gflop, e] : errs) {
    all.push_back(std::fabs(e));
    if (gflop >= 8) {
      EXPECT_LT(std::fabs(e), 0.15) << gflop << " GFLOP";
    }
  }
  EXPECT_LT(median(all), 0.035);
  // One published point: 4096^3 at 783.3 TFLOP/s, within 3 %.
  const DeviceSpec h100 = kernel_level("h100-80g");
  const GemmShape cube{4096, 4096, 4096, 1};
  const double tflops = 2 * 4096.0 * 4096 * 4096 / (h100.op_overhead_s + gemm_seconds(cube, h100, Precision::bf16_mixed)) / 1e12;
  EXPECT_NEAR(tflops, 783.3, 0.03 * 783.3);
  // Control: one large-GEMM share for every shape (no curve) misses the
  // table by more than twice as much.
  DeviceSpec flat = h100;
  flat.sm_count = 0;  // no kernel model: the roofline with gemm_efficiency
  std::vector<double> flat_errs;
  for (const auto& [gflop, e] : gemm_errors(flat)) flat_errs.push_back(std::fabs(e));
  EXPECT_GT(median(flat_errs), 2 * median(all));
}

TEST(GemmCurve, MeetsPublishedLargeGemmRates) {
  const GemmShape big{8192, 8192, 8192, 1};
  auto share = [&](const std::string& kind) {
    const DeviceSpec d = kernel_level(kind);
    return 2 * 8192.0 * 8192 * 8192 / gemm_seconds(big, d, Precision::bf16_mixed) / d.bf16_flops;
  };
  // stas00/ml-engineering MAMF (REFERENCES.md): A100 86.9 %, B200 77.6 %,
  // MI300X 51.4 % of peak at their best shapes; the curve at 8192^3 within 2 %.
  EXPECT_NEAR(share("a100-80g"), 0.869, 0.02);
  EXPECT_NEAR(share("b200"), 0.776, 0.02);
  EXPECT_NEAR(share("mi300x"), 0.514, 0.02);
  // One H200 ran bf16 8192^3 at 769-798 TFLOP/s (REFERENCES.md); the H100
  // curve (the same GH100 die) within 5 % of that band.
  const double h200 = share("h200-141g") * 989e12;
  EXPECT_GT(h200, 0.95 * 769e12);
  EXPECT_LT(h200, 1.05 * 798e12);
  EXPECT_GT(share("h100-80g"), share("b200"));  // control: the figures differ by row
}

TEST(GemmCurve, SmallerProblemsRunSlowerPerFlop) {
  const DeviceSpec d = kernel_level("a100-80g");
  auto rate = [&](double m, double n, double k) { return 2 * m * n * k / gemm_seconds({m, n, k, 1}, d, Precision::bf16_mixed); };
  EXPECT_GT(rate(8192, 8192, 8192), rate(8192, 8192, 256));  // short reduction
  EXPECT_GT(rate(8192, 8192, 4096), rate(256, 256, 4096));   // few tiles
  EXPECT_GT(rate(16384, 3 * 768, 768), rate(512, 3 * 768, 768));
}

// ---- Attention ----------------------------------------------------------------

struct AttentionPoint {
  std::string kernel, phase;
  double head_dim, seq, tflops;
  bool causal;
};

std::vector<AttentionPoint> attention_points() {
  std::vector<AttentionPoint> out;
  for (const auto& f : csv_rows(kData + "flash_attention.csv"))
    out.push_back({f[1], f[2], std::stod(f[3]), std::stod(f[5]), std::stod(f[6]), f[4] == "1"});
  return out;
}

// TFLOP/s the model gives for a FlashAttention-3-paper benchmark point:
// batch x seq = 16k tokens, hidden 2048, causal FLOPs counted as half,
// backward as 2.5 forwards (the papers' conventions).
double model_tflops(const AttentionPoint& p, const DeviceSpec& d) {
  AttentionCore a;
  a.batch = 16384 / p.seq * (2048 / p.head_dim);
  a.seq = p.seq;
  a.head_dim = p.head_dim;
  a.causal = p.causal;
  a.flash = p.kernel != "standard";
  const Phase ph = p.phase == "bwd" ? Phase::backward : Phase::forward;
  const double flops = 4 * a.batch * p.seq * p.seq * p.head_dim * (p.causal ? 0.5 : 1.0) * (ph == Phase::backward ? 2.5 : 1.0);
  return flops / attention_core_seconds(a, ph, d, Precision::bf16_mixed) / 1e12;
}

TEST(AttentionCurve, FlashReproducesFlashAttention2OnH100) {
  // FA3 paper Fig. 5-6, FlashAttention-2 bars: every point within 7 %
  // (docs/gpu-time-model.md: worst 6.1 %).
  const DeviceSpec h100 = kernel_level("h100-80g");
  int n = 0;
  for (const auto& p : attention_points()) {
    if (p.kernel != "fa2") continue;
    ++n;
    EXPECT_NEAR(model_tflops(p, h100) / p.tflops, 1.0, 0.07) << p.phase << " hd " << p.head_dim << " T " << p.seq << (p.causal ? " causal" : "");
  }
  EXPECT_EQ(n, 33);
  // Control: FlashAttention-3's bars are far above what the catalog row says.
  for (const auto& p : attention_points()) {
    if (p.kernel == "fa3" && p.seq >= 2048) {
      EXPECT_LT(model_tflops(p, h100), 0.75 * p.tflops) << p.phase << " " << p.seq;
    }
  }
}

TEST(AttentionCurve, MathAttentionFromItsGemmsAndSoftmaxMatchesStandardAttention) {
  // The unfused form costed from its batched GEMMs and the softmax's passes
  // over T x T at the memory rate, against the paper's standard-attention
  // bars (hd 128, not causal). docs/gpu-time-model.md: the forward within
  // 20 % from 1k tokens (49 % fast at 512); the backward is 1.5-2.1x faster
  // than PyTorch's unfused backward measured (a stated gap, held here so that
  // it cannot grow unnoticed).
  const DeviceSpec h100 = kernel_level("h100-80g");
  int n = 0;
  for (const auto& p : attention_points()) {
    if (p.kernel != "standard") continue;
    ++n;
    const double r = model_tflops(p, h100) / p.tflops;
    if (p.phase == "fwd") EXPECT_NEAR(r, 1.0, p.seq >= 1024 ? 0.20 : 0.50) << "fwd T " << p.seq;
    else EXPECT_TRUE(r > 1.4 && r < 2.2) << "bwd T " << p.seq << ": " << r;
    // Control: the fused forward is well above the unfused one at the same shape.
    if (p.phase == "fwd") {
      AttentionPoint flash = p;
      flash.kernel = "fa2";
      EXPECT_GT(model_tflops(flash, h100), 2 * model_tflops(p, h100));
    }
  }
  EXPECT_EQ(n, 10);
}

TEST(AttentionCurve, A100FlashMatchesTheFlashAttention2Paper) {
  // FA2 paper (arXiv 2307.08691): forward up to 73 % of the A100's peak
  // (16k tokens, head dim 128, not causal); the paper's range is 50-73 %.
  const DeviceSpec a100 = kernel_level("a100-80g");
  const AttentionPoint fwd{"fa2", "fwd", 128, 16384, 0, false};
  EXPECT_NEAR(model_tflops(fwd, a100) / 312, 0.73, 0.01);
  const AttentionPoint bwd{"fa2", "bwd", 128, 16384, 0, false};
  const double b = model_tflops(bwd, a100) / 312;
  EXPECT_GE(b, 0.50);
  EXPECT_LE(b, 0.73);
}

// ---- Published training runs --------------------------------------------------

struct Validation {
  std::vector<published::Prediction> predictions;
  published::Stacks stacks;
};

const Validation& validation() {
  static const Validation v = [] {
    Validation out;
    out.stacks = published::load_stacks(kData + "published_stacks.json");
    for (const auto& r : published::load_runs(kData + "published_runs.csv")) {
      if (r.split == "excluded") continue;
      const published::Case c = published::make_case(r);
      out.predictions.push_back(published::predict(c, published::stack_device(c.cluster.device, r.source, out.stacks)));
    }
    return out;
  }();
  return v;
}

std::map<std::string, std::vector<const published::Prediction*>> groups(const std::string& split) {
  std::map<std::string, std::vector<const published::Prediction*>> g;
  for (const auto& p : validation().predictions) {
    if (p.run.split != split) continue;
    g["gpu " + p.run.gpu].push_back(&p);
    g["source " + p.run.source].push_back(&p);
  }
  return g;
}

TEST(PublishedRuns, TheDataAreWhatTheSourcesSay) {
  // The MPT rows' models have the parameter counts llm-foundry printed
  // (NumParams), so the runs simulated are the runs measured.
  int checked = 0;
  for (const auto& r : published::load_runs(kData + "published_runs.csv"))
    if (r.params > 0) {
      EXPECT_EQ(published::run_model(r).parameter_count(), r.params) << r.id;
      ++checked;
    }
  EXPECT_GT(checked, 200);
  // Held-out rows exist for every GPU kind and every source.
  const auto g = groups("validation");
  for (const char* k : {"gpu a100-40g", "gpu a100-80g", "gpu h100-80g", "gpu v100-32g", "source llm-foundry", "source dle-bert",
                        "source dle-resnet50"})
    EXPECT_TRUE(g.count(k)) << k;
}

TEST(PublishedRuns, HeldOutThroughputWithinTenPercentMedianTwentyFiveWorst) {
  for (const auto& [name, ps] : groups("validation")) {
    const published::Stats s = published::stats(ps);
    EXPECT_LE(s.median, 0.10) << name << " (n " << s.n << ")";
    EXPECT_LE(s.worst, 0.25) << name << " (n " << s.n << ")";
  }
}

TEST(PublishedRuns, CatalogTimeBandsAreTheHeldOutErrors) {
  // A GPU kind with ten or more held-out runs states the 90th percentile of
  // their |error|, rounded up to the percent, as its time_uncertainty (the
  // recommendation's tie rule); a change to the time model that moves the
  // errors shows here. The H200 takes the H100's (the same chip and stack).
  int checked = 0;
  for (const auto& [name, ps] : groups("validation")) {
    if (name.rfind("gpu ", 0) != 0 || ps.size() < 10) continue;
    const published::Stats s = published::stats(ps);
    EXPECT_DOUBLE_EQ(find_device(name.substr(4)).time_uncertainty, std::ceil(s.p90 * 100 - 1e-9) / 100) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 3);
  EXPECT_EQ(find_device("h200-141g").time_uncertainty, find_device("h100-80g").time_uncertainty);
  // Kinds without enough runs state none and take the default, which covers
  // the worst held-out run of any kind.
  EXPECT_EQ(find_device("v100-32g").time_uncertainty, 0);
  std::vector<const published::Prediction*> all;
  for (const auto& p : validation().predictions)
    if (p.run.split == "validation") all.push_back(&p);
  EXPECT_GE(kDefaultTimeUncertainty, published::stats(all).worst);
}

TEST(PublishedRuns, ControlTheRooflineMissesThem) {
  // The same held-out runs on the devices without their kernel model (the
  // old single gemm_efficiency roofline) are far outside the bounds.
  std::vector<double> errs;
  for (const auto& r : published::load_runs(kData + "published_runs.csv")) {
    if (r.split != "validation" || r.source != "llm-foundry") continue;
    const published::Case c = published::make_case(r);
    DeviceSpec d = c.cluster.device;
    d.sm_count = 0;
    d.comm_slowdown = 0;
    d.rank_jitter = 0;
    errs.push_back(std::fabs(published::predict(c, d).error));
  }
  EXPECT_GT(median(errs), 0.25);
}

TEST(PublishedRuns, EveryRunThatRanIsPredictedToFit) {
  for (const auto& p : validation().predictions) EXPECT_TRUE(p.fits) << p.run.id << " needs " << p.peak_gib << " GiB";
}

TEST(PublishedRuns, TheFusedLossIsWhatLetsTheTightestRunsFit) {
  // Control: the 350M runs on A100 40 GB at micro-batch 18 x 2048 tokens ran
  // with flash-attn's fused cross-entropy (llm-foundry's default loss_fn). With
  // dlplan's unfused loss, which keeps fp32 probabilities (18 x 2048 x 50,368 x
  // 4 B = 6.9 GiB) instead of the bf16 logits (3.5 GiB), they would not fit.
  int tight = 0;
  for (const published::Run& r : published::load_runs(kData + "published_runs.csv")) {
    if (r.gpu != "a100-40g" || r.model != "mpt-350m" || r.micro_batch != 18) continue;
    ++tight;
    const Model fused = published::run_model(r);
    const StrategyResult with = evaluate(fused, published::run_cluster(r), published::run_training(r));
    published::Run unfused_run = r;
    unfused_run.source = "unfused";  // run_model fuses the loss for llm-foundry's runs only
    const StrategyResult without = evaluate(published::run_model(unfused_run), published::run_cluster(r), published::run_training(r));
    EXPECT_TRUE(with.fits) << r.id;
    EXPECT_FALSE(without.fits) << r.id;
    // The difference at the peak: the fp32 probabilities less the logits, which
    // the fused loss keeps (bf16) with one fp32 log-sum-exp per row.
    const double rows = 18.0 * 2048, logits = rows * 50368;
    EXPECT_NEAR(static_cast<double>(without.walk.peak - with.walk.peak), logits * 4 - logits * 2 - rows * 4, 1 << 20) << r.id;
  }
  EXPECT_EQ(tight, 4);
}

TEST(PublishedRuns, FittedStackDifferencesAgreeWithTheirSources) {
  // llm-foundry's Triton FlashAttention against FlashAttention-2: the FA2
  // paper says FA2 is 1.3-2.5x faster.
  const double speed = validation().stacks.flash_speed.at("llm-foundry");
  EXPECT_GE(speed, 1 / 2.5);
  EXPECT_LE(speed, 1 / 1.3);
}

TEST(PublishedRuns, ResNet50ScalesFromOneToEightA100sAsPublished) {
  // NVIDIA DeepLearningExamples: 2470 img/s on one A100, 16621 on eight,
  // 6.72x = 84 % scaling. The prediction's scaling within 10 points.
  double one = 0, eight = 0;
  for (const auto& p : validation().predictions) {
    if (p.run.id == "dle-resnet50-a100-80g-amp-g1") one = p.predicted;
    if (p.run.id == "dle-resnet50-a100-80g-amp-g8") eight = p.predicted;
  }
  ASSERT_GT(one, 0);
  ASSERT_GT(eight, 0);
  EXPECT_NEAR(eight / one, 0.84, 0.10);
  EXPECT_LT(eight / one, 0.99);  // control: not the old 99 %
}

}  // namespace
}  // namespace dlplan
