// Fixed sinusoidal positions (ops.hpp): the table pos_embedding's
// `sinusoidal` adds, against values worked out by hand, and its inverse on
// tables built the way their authors build them (written out here from
// Hugging Face XGLM's get_embedding, PyTorch's tutorial PositionalEncoding,
// in float32 as both do, and RoFormer's position table), with controls that
// must not match.
#include "dlplan/ops.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

using namespace dlplan;

namespace {

// XGLMSinusoidalPositionalEmbedding.get_embedding (transformers 4.36): pair
// i's frequency exp(-i ln(10000) / (half - 1)), [sin | cos], rows from
// padding_idx + 1 = 2 (the first two rows are never read); `first` for
// another padding id.
std::vector<double> xglm_table(int64_t T, int64_t D, int64_t first = 2) {
  const int64_t half = D / 2;
  const float emb = static_cast<float>(std::log(10000.0) / static_cast<double>(half - 1));
  std::vector<double> v(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t + first) * std::exp(static_cast<float>(i) * -emb);
      v[static_cast<size_t>(t * D + i)] = std::sin(angle);
      v[static_cast<size_t>(t * D + half + i)] = std::cos(angle);
    }
  return v;
}

// PyTorch's "Language Modeling with nn.Transformer" tutorial:
// div_term = exp(arange(0, d, 2) * (-ln(10000) / d)); pe[:, 0::2] = sin,
// pe[:, 1::2] = cos; rows from 0.
std::vector<double> tutorial_table(int64_t T, int64_t D) {
  std::vector<double> v(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < D; k += 2) {
      const float div = std::exp(static_cast<float>(k) * static_cast<float>(-std::log(10000.0) / static_cast<double>(D)));
      const float angle = static_cast<float>(t) * div;
      v[static_cast<size_t>(t * D + k)] = std::sin(angle);
      v[static_cast<size_t>(t * D + k + 1)] = std::cos(angle);
    }
  return v;
}

// RoFormerSinusoidalPositionalEmbedding._init_weight (transformers 4.36), in
// numpy's float64, stored as float32: angle pos / 10000^(2 (j // 2) / dim);
// out[:, :dim/2] = sin of the even j, out[:, dim/2:] = cos of the odd j (the
// same pairs); rows from 0. Its nn.Parameter is frozen.
std::vector<double> roformer_table(int64_t T, int64_t D) {
  std::vector<double> v(static_cast<size_t>(T * D));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < D; ++j) {
      const double angle = static_cast<double>(t) / std::pow(10000.0, 2.0 * static_cast<double>(j / 2) / static_cast<double>(D));
      if (j % 2 == 0) v[static_cast<size_t>(t * D + j / 2)] = static_cast<float>(std::sin(angle));
      else v[static_cast<size_t>(t * D + D / 2 + j / 2)] = static_cast<float>(std::cos(angle));
    }
  return v;
}

}  // namespace

TEST(SinusoidalPositions, TheTableIsSinAndCosOfPositionTimesEachFrequency) {
  const double s = 0.7, p = 3;
  // halves: sin of pairs 0, 1, then cos of pairs 0, 1
  EXPECT_DOUBLE_EQ(sinusoidal_position(false, s, 3, 0, 4), std::sin(p));
  EXPECT_DOUBLE_EQ(sinusoidal_position(false, s, 3, 1, 4), std::sin(p * std::exp(-s)));
  EXPECT_DOUBLE_EQ(sinusoidal_position(false, s, 3, 2, 4), std::cos(p));
  EXPECT_DOUBLE_EQ(sinusoidal_position(false, s, 3, 3, 4), std::cos(p * std::exp(-s)));
  // interleaved: sin, cos of pair 0, then of pair 1
  EXPECT_DOUBLE_EQ(sinusoidal_position(true, s, 3, 0, 4), std::sin(p));
  EXPECT_DOUBLE_EQ(sinusoidal_position(true, s, 3, 1, 4), std::cos(p));
  EXPECT_DOUBLE_EQ(sinusoidal_position(true, s, 3, 2, 4), std::sin(p * std::exp(-s)));
  EXPECT_DOUBLE_EQ(sinusoidal_position(true, s, 3, 3, 4), std::cos(p * std::exp(-s)));
}

TEST(SinusoidalPositions, XglmsTheTutorialsAndRoformersTablesAreRecognised) {
  const auto xglm = match_sinusoidal_positions(xglm_table(64, 128), 64, 128);
  ASSERT_TRUE(xglm.has_value());
  EXPECT_FALSE(xglm->interleaved);
  EXPECT_EQ(xglm->offset, 2);
  EXPECT_DOUBLE_EQ(xglm->step, std::log(10000.0) / 63);  // fairseq's half - 1
  const auto tutorial = match_sinusoidal_positions(tutorial_table(200, 64), 200, 64);
  ASSERT_TRUE(tutorial.has_value());
  EXPECT_TRUE(tutorial->interleaved);
  EXPECT_EQ(tutorial->offset, 0);
  EXPECT_DOUBLE_EQ(tutorial->step, std::log(10000.0) / 32);  // Vaswani's half
  const auto roformer = match_sinusoidal_positions(roformer_table(128, 32), 128, 32);
  ASSERT_TRUE(roformer.has_value());
  EXPECT_FALSE(roformer->interleaved);
  EXPECT_EQ(roformer->offset, 0);
  EXPECT_DOUBLE_EQ(roformer->step, std::log(10000.0) / 16);  // Vaswani's, in halves
  std::vector<double> off = roformer_table(128, 32);
  off[5 * 32 + 3] += 1e-3;  // one value of one row: a table that was trained
  EXPECT_FALSE(match_sinusoidal_positions(off, 128, 32).has_value());
}

// Speech2Text2's positions with its padding id at 60 are the fairseq table's
// rows from 61, where pair 1's angle (61 radians at frequency 0.74) has
// wrapped and cannot give the step: the two published steps are tried, and
// Vaswani's holds as well as fairseq's. Another step so far in is not
// recognised.
TEST(SinusoidalPositions, RowsReadFarIntoTheTableAreRecognisedByThePublishedSteps) {
  const auto fairseq = match_sinusoidal_positions(xglm_table(16, 32, 61), 16, 32);
  ASSERT_TRUE(fairseq.has_value());
  EXPECT_EQ(fairseq->offset, 61);
  EXPECT_FALSE(fairseq->interleaved);
  EXPECT_DOUBLE_EQ(fairseq->step, std::log(10000.0) / 15);
  std::vector<double> vaswani(16 * 32);
  const SinusoidalPositions v{true, 40, std::log(10000.0) / 16};
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t c = 0; c < 32; ++c) vaswani[static_cast<size_t>(t * 32 + c)] = sinusoidal_position(true, v.step, 40 + t, c, 32);
  const auto found = match_sinusoidal_positions(vaswani, 16, 32);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->offset, 40);
  EXPECT_TRUE(found->interleaved);
  EXPECT_DOUBLE_EQ(found->step, v.step);
  std::vector<double> other(16 * 32);
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t c = 0; c < 32; ++c) other[static_cast<size_t>(t * 32 + c)] = sinusoidal_position(false, 0.5, 40 + t, c, 32);
  EXPECT_FALSE(match_sinusoidal_positions(other, 16, 32).has_value());
  // ... while from position 1 any step is read off the table
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t c = 0; c < 32; ++c) other[static_cast<size_t>(t * 32 + c)] = sinusoidal_position(false, 0.5, 1 + t, c, 32);
  const auto near = match_sinusoidal_positions(other, 16, 32);
  ASSERT_TRUE(near.has_value());
  EXPECT_NEAR(near->step, 0.5, 1e-6);
}

TEST(SinusoidalPositions, AnyOtherTableIsNot) {
  // one value off by 1e-3 (well above fp32 rounding)
  std::vector<double> off = xglm_table(16, 32);
  off[5 * 32 + 7] += 1e-3;
  EXPECT_FALSE(match_sinusoidal_positions(off, 16, 32).has_value());
  // cos before sin: neither layout
  std::vector<double> swapped = xglm_table(16, 32);
  for (int64_t t = 0; t < 16; ++t)
    for (int64_t i = 0; i < 16; ++i)
      std::swap(swapped[static_cast<size_t>(t * 32 + i)], swapped[static_cast<size_t>(t * 32 + 16 + i)]);
  EXPECT_FALSE(match_sinusoidal_positions(swapped, 16, 32).has_value());
  // a learned table (small random values) and a shape that does not fit
  std::vector<double> learned(16 * 32);
  for (size_t e = 0; e < learned.size(); ++e) learned[e] = 0.02 * std::sin(static_cast<double>(e * e));
  EXPECT_FALSE(match_sinusoidal_positions(learned, 16, 32).has_value());
  EXPECT_FALSE(match_sinusoidal_positions(xglm_table(16, 32), 16, 16).has_value());
  EXPECT_FALSE(match_sinusoidal_positions(xglm_table(16, 32), 8, 32).has_value());
}

// A table too large to check whole (the fold reads a block of rows at a
// time): the rows 32,000 .. 32,767 of the tutorial's 32,768 x 64 table hold
// the positions the first rows' layout and step give, to fp32 rounding at
// those angles; the same rows one position early, or with one value 1e-2
// off, do not.
TEST(SinusoidalPositions, ALateBlockOfRowsIsCheckedAgainstTheFirstRows) {
  const int64_t T = 32768, D = 64, first = 32000;
  const std::vector<double> table = tutorial_table(T, D);
  const auto sp = match_sinusoidal_positions(std::vector<double>(table.begin(), table.begin() + 64 * D), 64, D);
  ASSERT_TRUE(sp.has_value());
  std::vector<double> late(table.begin() + first * D, table.end());
  EXPECT_TRUE(holds_sinusoidal_positions(late, first, D, *sp));
  EXPECT_FALSE(holds_sinusoidal_positions(late, first - 1, D, *sp));
  late[300 * D + 9] += 1e-2;
  EXPECT_FALSE(holds_sinusoidal_positions(late, first, D, *sp));
  EXPECT_FALSE(holds_sinusoidal_positions(std::vector<double>(D + 1), 0, D, *sp));  // not whole rows
}
