// RoPE angles (model_internal.h rope_angles) against the formulas written
// out independently in double precision: plain RoPE (Su et al. 2021),
// linear scaling, and YaRN as ggml applies it (Peng et al. 2023; ggml
// rope_yarn / ggml_rope_yarn_corr_dims).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model/config.h"
#include "model/model_internal.h"

namespace bonsai::model {
namespace {

ModelConfig rope_config(int64_t n_rot, float base) {
  ModelConfig c;
  c.n_rot = n_rot;
  c.head_dim_k = n_rot;
  c.rope_freq_base = base;
  return c;
}

// Expected (cos, sin) of pair i at `pos`, double precision.
struct Angle {
  double cos, sin;
};

Angle expected_angle(const ModelConfig& c, int32_t pos, int64_t i) {
  const double theta_extrap = pos * std::pow(double(c.rope_freq_base), -2.0 * double(i) / double(c.n_rot));
  if (c.rope_scaling == RopeScaling::kNone) return {std::cos(theta_extrap), std::sin(theta_extrap)};
  const double s = c.rope_scaling_factor;
  const double theta_interp = theta_extrap / s;
  if (c.rope_scaling == RopeScaling::kLinear) return {std::cos(theta_interp), std::sin(theta_interp)};
  // YaRN: dims whose wavelength makes more than beta_fast rotations over the
  // original context keep extrapolated angles, fewer than beta_slow use the
  // interpolated ones, a linear ramp between; magnitudes scaled by
  // 1 + 0.1 ln(s).
  auto corr = [&](double rot) {
    return c.n_rot * std::log(c.rope_orig_ctx / (rot * 2 * M_PI)) / (2 * std::log(double(c.rope_freq_base)));
  };
  const double low = std::max(0.0, std::floor(corr(c.yarn_beta_fast)));
  const double high = std::min(double(c.n_rot - 1), std::ceil(corr(c.yarn_beta_slow)));
  const double y = (double(i) - low) / std::max(0.001, high - low);
  const double ramp = 1.0 - std::min(1.0, std::max(0.0, y));
  const double theta = theta_interp * (1 - ramp) + theta_extrap * ramp;
  const double m = 1.0 + 0.1 * std::log(s);
  return {std::cos(theta) * m, std::sin(theta) * m};
}

void expect_angles(const ModelConfig& c, int32_t pos, double tol) {
  float dims[2] = {0, 0};
  if (c.yarn_ext_factor != 0.0f) yarn_corr_dims(c, dims);
  std::vector<float> out(static_cast<size_t>(c.n_rot));
  rope_angles(c, dims, pos, out.data());
  const int64_t half = c.n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const Angle a = expected_angle(c, pos, i);
    EXPECT_NEAR(out[i], a.cos, tol) << "pos " << pos << " pair " << i;
    EXPECT_NEAR(out[half + i], a.sin, tol) << "pos " << pos << " pair " << i;
  }
}

TEST(Rope, PlainAnglesMatchFormula) {
  const ModelConfig c = rope_config(128, 1e6f);
  for (int32_t pos : {0, 1, 7, 100, 1000}) expect_angles(c, pos, pos < 200 ? 2e-4 : 2e-3);
  const ModelConfig s = rope_config(8, 10000.0f);  // stories260K: n_rot 8
  for (int32_t pos : {0, 1, 5, 255}) expect_angles(s, pos, 1e-4);
}

TEST(Rope, LinearScaling) {
  ModelConfig c = rope_config(64, 10000.0f);
  c.rope_scaling = RopeScaling::kLinear;
  c.rope_scaling_factor = 2.0f;
  for (int32_t pos : {0, 3, 50}) expect_angles(c, pos, 1e-4);
}

TEST(Rope, YarnAsBonsai8B) {
  // Bonsai-8B: YaRN factor 4 over an original context of 16384, base 1e6, head_dim 128.
  ModelConfig c = rope_config(128, 1e6f);
  c.rope_scaling = RopeScaling::kYarn;
  c.rope_scaling_factor = 4.0f;
  c.rope_orig_ctx = 16384;
  c.yarn_ext_factor = 1.0f;
  float dims[2];
  yarn_corr_dims(c, dims);
  EXPECT_GT(dims[1], dims[0]);
  EXPECT_GE(dims[0], 0.0f);
  EXPECT_LE(dims[1], 127.0f);
  // Applied at every position, including ones inside the original context.
  for (int32_t pos : {1, 10, 100, 1000}) expect_angles(c, pos, pos < 200 ? 2e-4 : 2e-3);
  // Magnitude: mscale = 1 + 0.1 ln 4.
  std::vector<float> out(128);
  rope_angles(c, dims, 0, out.data());
  EXPECT_NEAR(out[0], 1.0 + 0.1 * std::log(4.0), 1e-6);
}

}  // namespace
}  // namespace bonsai::model
