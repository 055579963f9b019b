// DecodeChainCpu (kernels/decode_chain.h) against plain double-precision loops written here: a
// layer-shaped chain (in-place residual phases, a layer norm on an earlier phase's output, GELU),
// odd sizes; and the arguments it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/decode_chain.h"

namespace mqa {
namespace {

std::vector<float> Random(size_t n, std::mt19937& rng, float stddev = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// out = act(W LN?(x) + b) (+ out), in double.
void Reference(const std::vector<float>& w, const std::vector<float>& b, const float* ln_w,
               const float* ln_b, bool gelu, bool accumulate, int64_t n, int64_t k,
               const std::vector<float>& x_in, std::vector<float>& out) {
  std::vector<double> x(x_in.begin(), x_in.begin() + k);
  if (ln_w != nullptr) {
    double mean = 0, var = 0;
    for (double v : x) mean += v;
    mean /= k;
    for (double v : x) var += (v - mean) * (v - mean);
    const double rstd = 1.0 / std::sqrt(var / k + 1e-5);
    for (int64_t i = 0; i < k; ++i) x[i] = (x[i] - mean) * rstd * ln_w[i] + ln_b[i];
  }
  for (int64_t j = 0; j < n; ++j) {
    double s = b[j];
    for (int64_t i = 0; i < k; ++i) s += double(w[j * k + i]) * x[i];
    if (gelu) s = 0.5 * s * (1.0 + std::tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
    out[j] = static_cast<float>(accumulate ? out[j] + s : s);
  }
}

TEST(DecodeChainCpu, LayerShapedChainMatchesLoops) {
  std::mt19937 rng(3);
  const int64_t E = 37, I = 53, Q = 41;
  auto w0 = Random(E * E, rng, 0.2f), b0 = Random(E, rng);
  auto w1 = Random(I * E, rng, 0.2f), b1 = Random(I, rng);
  auto w2 = Random(E * I, rng, 0.2f), b2 = Random(E, rng);
  auto w3 = Random(Q * E, rng, 0.2f), b3 = Random(Q, rng);
  auto lnw = Random(E, rng, 0.1f, 1.0f), lnb = Random(E, rng, 0.1f);
  auto attn = Random(E, rng), hidden = Random(E, rng, 2.0f);
  std::vector<float> mlp(I, NAN), qkv(Q, NAN);

  std::vector<float> want_hidden = hidden, want_mlp(I), want_qkv(Q);
  Reference(w0, b0, nullptr, nullptr, false, true, E, E, attn, want_hidden);
  Reference(w1, b1, lnw.data(), lnb.data(), true, false, I, E, want_hidden, want_mlp);
  Reference(w2, b2, nullptr, nullptr, false, true, E, I, want_mlp, want_hidden);
  Reference(w3, b3, lnw.data(), lnb.data(), false, false, Q, E, want_hidden, want_qkv);

  DecodeChainParams p;
  p.dtype = DType::kF32;
  p.num_phases = 4;
  p.phases[0] = {w0.data(),     b0.data(), attn.data(),           nullptr, nullptr, 1e-5f,
                 hidden.data(), true,      Activation::kIdentity, E,       E};
  p.phases[1] = {w1.data(),  b1.data(), hidden.data(),         lnw.data(), lnb.data(), 1e-5f,
                 mlp.data(), false,     Activation::kGeluTanh, I,          E};
  p.phases[2] = {w2.data(),
                 b2.data(),
                 mlp.data(),
                 nullptr,
                 nullptr,
                 1e-5f,
                 hidden.data(),
                 true,
                 Activation::kIdentity,
                 E,
                 I};
  p.phases[3] = {w3.data(),  b3.data(), hidden.data(),         lnw.data(), lnb.data(), 1e-5f,
                 qkv.data(), false,     Activation::kIdentity, Q,          E};
  ASSERT_TRUE(DecodeChainCpu(p).ok());
  for (int64_t j = 0; j < E; ++j) EXPECT_NEAR(hidden[j], want_hidden[j], 1e-3) << j;
  for (int64_t j = 0; j < I; ++j) EXPECT_NEAR(mlp[j], want_mlp[j], 1e-3) << j;
  for (int64_t j = 0; j < Q; ++j) EXPECT_NEAR(qkv[j], want_qkv[j], 1e-3) << j;
}

TEST(DecodeChainCpu, RefusesBadArguments) {
  std::vector<float> w(16, 1.0f), x(4, 1.0f), y(4, 0.0f);
  DecodeChainParams p;
  p.dtype = DType::kF32;
  p.num_phases = 1;
  p.phases[0].weight = w.data();
  p.phases[0].input = x.data();
  p.phases[0].output = y.data();
  p.phases[0].n = 4;
  p.phases[0].k = 4;
  EXPECT_TRUE(DecodeChainCpu(p).ok());
  EXPECT_EQ(y[0], 4.0f);
  p.phases[0].input = y.data();  // its own output
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeChainCpu(p)));
  p.phases[0].input = x.data();
  p.num_phases = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeChainCpu(p)));
  p.num_phases = 1;
  p.dtype = DType::kF16;
  EXPECT_TRUE(absl::IsInvalidArgument(DecodeChainCpu(p)));
}

}  // namespace
}  // namespace mqa
