// A ModelRunner for engine tests: a simulated paged KV cache and logits that are a function of
// the whole token history.
//
// Each KV slot holds (position, hash of tokens 0..position), computed from the slot of the
// previous position read through the block table, as a real model's KV depends on its prefix.
// So a wrong block table, a missed copy-on-write or a wrongly reused prefix block changes the
// logits, and the test's oracle (ReferenceLogits over the true history) disagrees.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/sampling.h"
#include "runtime/model_runner.h"

namespace mqa::testing {

inline uint64_t FakeMix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline constexpr uint64_t kFakeEmptyHash = 0x1234567ull;

inline uint64_t FakeExtend(uint64_t prefix_hash, int32_t token) {
  return FakeMix(prefix_hash * 31 + static_cast<uint64_t>(token) + 1);
}

inline uint64_t FakeHistoryHash(absl::Span<const int32_t> tokens) {
  uint64_t h = kFakeEmptyHash;
  for (int32_t t : tokens) h = FakeExtend(h, t);
  return h;
}

// Logits of the next token after a history with this hash. Token 0 (the tests' EOS) is made less
// likely so that samples have some length.
inline void FakeLogits(uint64_t history_hash, int vocab, float* out) {
  for (int v = 0; v < vocab; ++v) {
    const uint64_t r = FakeMix(history_hash ^ (static_cast<uint64_t>(v) * 0x9E3779B97F4A7C15ull));
    out[v] = static_cast<float>(r % 100000) / 100000.0f * 6.0f - 3.0f;
  }
  out[0] -= 2.0f;
}

// The token a cycle boost favours after `token`: tokens 1..30 in cycles of five (1 -> 2 -> ... ->
// 5 -> 1, 6 -> ... -> 10 -> 6, ...), anything else to 1; never 0 (EOS).
inline int32_t FakeCycleNext(int32_t token) {
  if (token < 1 || token > 30) return 1;
  const int32_t group = (token - 1) / 5;
  return 1 + 5 * group + ((token - 1) % 5 + 1) % 5;
}

// With cycle_boost > 0 (speculative decoding's tests) the token FakeCycleNext(last token) gains
// that much: above ~6 it is always the argmax, below that usually, so that greedy text repeats
// itself (prompt lookup finds drafts) yet still depends on the whole history (the KV).
inline void FakeBoost(int32_t last_token, float cycle_boost, int vocab, float* out) {
  const int32_t next = FakeCycleNext(last_token);
  if (cycle_boost > 0 && next < vocab) out[next] += cycle_boost;
}

inline std::vector<float> ReferenceLogits(absl::Span<const int32_t> tokens, int vocab,
                                          float cycle_boost = 0) {
  std::vector<float> logits(vocab);
  FakeLogits(FakeHistoryHash(tokens), vocab, logits.data());
  if (!tokens.empty()) FakeBoost(tokens.back(), cycle_boost, vocab, logits.data());
  return logits;
}

struct FakeRunnerOptions {
  int vocab_size = 32;
  int num_blocks = 64;
  int block_size = 8;
  int fail_at_step = -1;  // Execute returns an error on this step (0-based)
  // samples_on_device(): ExecuteSampled draws with SampleTokensCpu, the CPU reference of the
  // CUDA sampling kernel, standing in for the GPU.
  bool device_sampling = false;
  float cycle_boost = 0;  // FakeBoost
};

class FakeRunner : public ModelRunner {
 public:
  explicit FakeRunner(FakeRunnerOptions options)
      : options_(options), slots_(static_cast<size_t>(options.num_blocks) * options.block_size) {}

  // Called with every step's input before it runs.
  std::function<void(const StepInput&)> on_step;

  absl::StatusOr<Tensor> Execute(const StepInput& in) override {
    if (on_step) on_step(in);
    if (steps_++ == options_.fail_at_step) return absl::InternalError("injected runner failure");
    const int bs = options_.block_size;
    if (in.query_start.size() != static_cast<size_t>(in.num_seqs()) + 1 ||
        in.query_start.back() != in.num_tokens() || in.positions.size() != in.token_ids.size() ||
        in.slot_mapping.size() != in.token_ids.size() ||
        in.context_lens.size() != static_cast<size_t>(in.num_seqs()) ||
        in.block_tables.size() != static_cast<size_t>(in.num_seqs()) * in.max_blocks_per_seq) {
      return absl::InvalidArgumentError("inconsistent StepInput sizes");
    }
    for (const BlockCopy& copy : in.block_copies) {
      for (int o = 0; o < bs; ++o) slots_[copy.dst * bs + o] = slots_[copy.src * bs + o];
    }
    std::vector<uint64_t> row_hash(in.num_tokens());
    for (int s = 0; s < in.num_seqs(); ++s) {
      // What the model's ValidateStepInput refuses too.
      if (in.query_start[s + 1] <= in.query_start[s]) {
        return absl::InvalidArgumentError(absl::StrCat("seq ", in.seq_ids[s], " has no tokens"));
      }
      const int32_t* table = in.block_tables.data() + s * in.max_blocks_per_seq;
      auto slot_of = [&](int p) -> int64_t {
        if (p / bs >= in.max_blocks_per_seq) return -1;
        return static_cast<int64_t>(table[p / bs]) * bs + p % bs;
      };
      for (int i = in.query_start[s]; i < in.query_start[s + 1]; ++i) {
        const int p = in.positions[i];
        if (slot_of(p) != in.slot_mapping[i]) {
          return absl::InternalError(
              absl::StrCat("slot_mapping disagrees with the block table at "
                           "seq ",
                           in.seq_ids[s], " position ", p));
        }
        uint64_t prefix = kFakeEmptyHash;
        if (p > 0) {
          const int64_t prev = slot_of(p - 1);
          if (prev < 0 || slots_[prev].position != p - 1) {
            return absl::InternalError(absl::StrCat("seq ", in.seq_ids[s], " position ", p,
                                                    ": the KV of position ", p - 1, " is missing"));
          }
          prefix = slots_[prev].hash;
        }
        slots_[in.slot_mapping[i]] = {p, FakeExtend(prefix, in.token_ids[i])};
        row_hash[i] = slots_[in.slot_mapping[i]].hash;
      }
      if (in.context_lens[s] != in.positions[in.query_start[s + 1] - 1] + 1) {
        return absl::InternalError("context_lens disagrees with positions");
      }
    }
    Tensor logits = Tensor::Cpu({static_cast<int64_t>(in.logits_rows.size()), vocab_size()});
    for (size_t r = 0; r < in.logits_rows.size(); ++r) {
      float* out = logits.data<float>() + r * options_.vocab_size;
      FakeLogits(row_hash[in.logits_rows[r]], options_.vocab_size, out);
      FakeBoost(in.token_ids[in.logits_rows[r]], options_.cycle_boost, options_.vocab_size, out);
    }
    return logits;
  }
  bool samples_on_device() const override { return options_.device_sampling; }
  absl::StatusOr<SampledStep> ExecuteSampled(const StepInput& in,
                                             absl::Span<const RowSamplingParams> params,
                                             bool with_logits) override {
    if (!options_.device_sampling) return ModelRunner::ExecuteSampled(in, params, with_logits);
    if (params.size() != in.logits_rows.size()) {
      return absl::InvalidArgumentError("one RowSamplingParams per logits row");
    }
    absl::StatusOr<Tensor> logits = Execute(in);
    if (!logits.ok()) return logits.status();
    SampledStep out;
    out.tokens.resize(params.size());
    SampleTokensParams sp;
    sp.logits = logits->data<float>();
    sp.rows = static_cast<int64_t>(params.size());
    sp.vocab = sp.ld = options_.vocab_size;
    sp.params = params.data();
    sp.tokens = out.tokens.data();
    if (!params.empty()) {
      if (absl::Status s = SampleTokensCpu(sp); !s.ok()) return s;
    }
    if (with_logits) {
      out.logits = *std::move(logits);
      ++sampled_steps_with_logits;
    } else {
      ++sampled_steps_without_logits;
    }
    return out;
  }
  int sampled_steps_with_logits = 0;
  int sampled_steps_without_logits = 0;

  absl::Status KeepAlive() override {
    ++keep_alives;
    return keep_alive_status;
  }
  std::atomic<int> keep_alives{0};
  absl::Status keep_alive_status;  // set before Run() starts

  int64_t vocab_size() const override { return options_.vocab_size; }
  int num_kv_blocks() const override { return options_.num_blocks; }
  int block_size() const override { return options_.block_size; }

 private:
  struct Slot {
    int position = -1;
    uint64_t hash = 0;
  };
  FakeRunnerOptions options_;
  std::vector<Slot> slots_;
  int steps_ = 0;
};

}  // namespace mqa::testing
