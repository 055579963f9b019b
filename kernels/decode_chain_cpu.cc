// DecodeChainCpu: the decode chain's phases one after another through the CPU ops (the reference
// of the CUDA kernel's semantics: in-place residual phases, a phase reading an earlier one's
// output).
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/activation.h"
#include "kernels/decode_chain.h"
#include "kernels/gemm.h"
#include "kernels/layer_norm.h"
#include "runtime/status.h"

namespace mqa {

absl::Status DecodeChainCpu(const DecodeChainParams& p) {
  if (p.dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DecodeChainCpu: dtype ", std::string(DTypeName(p.dtype)), " unsupported (float32)"));
  }
  if (p.num_phases < 1 || p.num_phases > kMaxDecodeChainPhases) {
    return absl::InvalidArgumentError(absl::StrCat("DecodeChainCpu: ", p.num_phases, " phases"));
  }
  if (p.has_attention) {
    return absl::UnimplementedError(
        "DecodeChainCpu: no attention phase (the CPU path runs PagedAttentionCpu itself)");
  }
  std::vector<float> normed, product;
  for (int i = 0; i < p.num_phases; ++i) {
    const DecodeChainPhase& ph = p.phases[i];
    if (ph.n < 1 || ph.k < 1 || !ph.weight || !ph.input || !ph.output || ph.input == ph.output ||
        (ph.ln_weight == nullptr) != (ph.ln_bias == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("DecodeChainCpu phase ", i, ": n ", ph.n, " k ", ph.k,
                       ", pointers null, input aliasing the output, or half an LN"));
    }
    const void* x = ph.input;
    if (ph.ln_weight != nullptr) {
      normed.resize(ph.k);
      LayerNormParams ln;
      ln.input = ph.input;
      ln.output = normed.data();
      ln.weight = ph.ln_weight;
      ln.bias = ph.ln_bias;
      ln.rows = 1;
      ln.cols = ph.k;
      ln.epsilon = ph.ln_epsilon;
      ln.dtype = DType::kF32;
      RETURN_IF_ERROR(LayerNormCpu(ln));
      x = normed.data();
    }
    product.resize(ph.n);
    GemmParams g;
    g.a = x;
    g.lda = ph.k;
    g.b = ph.weight;
    g.ldb = ph.k;
    g.c = product.data();
    g.ldc = ph.n;
    g.m = 1;
    g.n = ph.n;
    g.k = ph.k;
    g.dtype = DType::kF32;
    RETURN_IF_ERROR(GemmCpu(g));
    BiasActivationParams post;
    post.input = product.data();
    post.bias = ph.bias;
    post.residual = ph.accumulate ? ph.output : nullptr;
    post.output = ph.output;
    post.rows = 1;
    post.cols = ph.n;
    post.activation = ph.activation;
    post.dtype = DType::kF32;
    RETURN_IF_ERROR(BiasActivationCpu(post));
  }
  return absl::OkStatus();
}

}  // namespace mqa
