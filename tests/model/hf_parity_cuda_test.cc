// The CUDA forward against Hugging Face on every fixture (tests/fixtures/models), in float16 and
// bfloat16: all prompts prefilled in one mixed batch (logits at every prompt position), then
// decoded together greedily (decode steps padded to a graph bucket and replayed as CUDA graphs),
// alternating host argmax of the returned logits with greedy sampling on the device. Reports the
// largest relative logit error (max |ours - HF| / max |HF| per row); a sequence's greedy tokens
// are compared until it forks from HF's at a step whose HF top-2 margin is below what this dtype
// can resolve. Also: the KV
// pool sized from free memory, and block copies on the device. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "model/gpt_bigcode_runner.h"
#include "nlohmann/json.hpp"
#include "parallel/collectives.h"
#include "runtime/engine.h"
#include "tests/model/churn_workload.h"
#include "tests/model/hf_fixture.h"
#include "tests/model/prompt_scores_util.h"

namespace mqa {
namespace {

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

using testing::FixtureModelDir;
using Reference = testing::HfReference;

// Sequence s owns blocks taken from a shuffled pool as it grows.
struct Batch {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> free;
  int block_size = 16;
  // `seqs` empty tables over a pool of `blocks` blocks handed out in a shuffled order.
  static Batch Shuffled(size_t seqs, int blocks, int block_size, unsigned seed) {
    Batch b;
    b.block_size = block_size;
    b.tables.resize(seqs);
    b.free.resize(blocks);
    std::iota(b.free.begin(), b.free.end(), 0);
    std::shuffle(b.free.begin(), b.free.end(), std::mt19937(seed));
    return b;
  }
  int32_t Slot(int s, int pos) {
    while (static_cast<int>(tables[s].size()) * block_size <= pos) {
      tables[s].push_back(free.back());
      free.pop_back();
    }
    return tables[s][pos / block_size] * block_size + pos % block_size;
  }
  // One step: seq s brings tokens[s] at positions [start[s], ...); logits for `rows`.
  StepInput Make(const std::vector<std::vector<int32_t>>& tokens, const std::vector<int>& start,
                 bool all_rows) {
    StepInput in;
    in.query_start.push_back(0);
    int max_blocks = 0;
    for (size_t s = 0; s < tokens.size(); ++s) {
      in.seq_ids.push_back(s);
      for (size_t i = 0; i < tokens[s].size(); ++i) {
        in.token_ids.push_back(tokens[s][i]);
        in.positions.push_back(start[s] + i);
        in.slot_mapping.push_back(Slot(s, start[s] + i));
        if (all_rows || i + 1 == tokens[s].size()) in.logits_rows.push_back(in.num_tokens() - 1);
      }
      in.query_start.push_back(in.num_tokens());
      in.context_lens.push_back(start[s] + tokens[s].size());
      max_blocks = std::max(max_blocks, static_cast<int>(tables[s].size()));
    }
    in.max_blocks_per_seq = max_blocks + 3;  // wider than needed, as an engine may send
    for (const auto& t : tables) {
      for (int i = 0; i < in.max_blocks_per_seq; ++i) {
        in.block_tables.push_back(i < static_cast<int>(t.size()) ? t[i] : 0);
      }
    }
    return in;
  }
};

double RowRelError(const float* got, const float* want, int64_t vocab) {
  double max_ref = 0, max_diff = 0;
  for (int64_t v = 0; v < vocab; ++v) {
    max_ref = std::max(max_ref, std::abs(double(want[v])));
    max_diff = std::max(max_diff, std::abs(double(got[v]) - want[v]));
  }
  return max_diff / max_ref;
}

int32_t Argmax(const float* row, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
}

// Params: fixture, dtype, KV block size, decode knobs (bit 0: GptBigCodeRunnerOptions::pdl,
// bit 1: fuse_small_kernels, bit 2: ln_registers and greedy_cluster, bit 3: gemm_split_k and
// gemm_stream_tc, bit 4: attention variant 5, the in-kernel split merge, bit 5: gemm_deep_unroll,
// bit 6: the runner's default attention variant (GptBigCodeRunnerOptions), bit 7: variant 8
// (cluster merge, early KV copies), bit 8: variant 7 (6 with the early KV copies), bit 9: variant
// 11 (wgmma), bit 10: variant 14 (13 with the KV write fused into its TMA kernel), bit 11:
// variant 15 (14 merging its splits in the kernel); without bits 4, 6-11, variant 3; bit 12: the
// batch-1 decode chain, every prompt prefilled and decoded alone; bit 13: with the attention as
// the chain's first phase (the runner's default; without bit 13 the attention kernel); bit 14: the
// chain's fp32 fold (decode_chain_half_fold 0; the default sums fp16 pairs first); bit 15: the
// chain's fused MLP (decode_chain_fused_mlp); bit 16: fuse_layer_norms (the layer norms folded into
// the skinny GEMMs' epilogues); bit 17: every prompt three times over (decode batches past the
// skinny kernel's 8 rows: cuBLASLt's path) with the server's decode GEMM tuning (gemm_autotune, the
// decode graphs warmed up, then frozen); bit 18: the QKV GEMM's tail attention (tail_attention),
// every prompt prefilled and decoded alone (it takes one-token steps; head_dim 128 only:
// tiny-mqa-d128 must run it, the others fall back to the attention kernels); bit 19: with bit 12,
// the chain's per-SM shares calibrated first (GptBigCodeRunner::CalibrateDecodeChainShares); bit
// 20: with bit 18, the tail's splits merged in a thread-block cluster (tail_cluster_merge); bit 21:
// with bit 18, every GEMM of a tail layer releasing the next kernel as it starts
// (tail_release_early 15; without bit 21 the runner's default); bit 22: with bit 13, the attention
// inside the chain only where the step's context bound is at most 128
// (decode_chain_attention_max_context), which the fixtures' decode steps (context bound 256, their
// graph bucket) exceed: the attention kernel runs, as for a context past the short form's bound;
// bit 23: with bit 18, attn.c_proj in the tail's launch too (tail_attention_proj; tiny-mqa-d128
// must run it). 101: the runner's defaults).
class HfParityCuda : public ::testing::TestWithParam<std::tuple<std::string, DType, int, int>> {};

TEST_P(HfParityCuda, LogitsAndGreedyNearTransformers) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const auto& [model, dtype, block_size, knobs] = GetParam();
  auto collectives = MakeLocalCollectives();
  LoadOptions load;
  load.model_dir = FixtureModelDir(model);
  load.dtype = dtype;
  GptBigCodeRunnerOptions opts;
  opts.block_size = block_size;
  opts.num_kv_blocks = 256;
  opts.device = Device::kCuda;
  opts.pdl = knobs & 1;
  opts.fuse_small_kernels = knobs & 2;
  opts.ln_registers = opts.greedy_cluster = knobs & 4;
  opts.gemm_split_k = opts.gemm_stream_tc = knobs & 8;
  opts.attention_variant = knobs & 2048   ? 15
                           : knobs & 1024 ? 14
                           : knobs & 512  ? 11
                           : knobs & 128  ? 8
                           : knobs & 256  ? 7
                           : knobs & 16   ? 5
                           : knobs & 64   ? GptBigCodeRunnerOptions().attention_variant
                                          : 3;
  opts.gemm_deep_unroll = knobs & 32;
  opts.decode_chain = knobs & 4096;
  if (knobs & 4096) opts.decode_chain_min_layer_bytes = 0;  // the fixtures' layers are tiny
  opts.decode_chain_attention = knobs & 8192;
  if (knobs & 4194304) opts.decode_chain_attention_max_context = 128;
  if (knobs & 16384) opts.decode_chain_half_fold = 0;
  opts.decode_chain_fused_mlp = knobs & 32768;
  opts.fuse_layer_norms = knobs & 65536;
  const bool tuned_x3 = knobs & 131072;
  const bool tail = knobs & 262144;
  opts.tail_attention = tail;
  opts.tail_cluster_merge = knobs & 1048576;
  if (knobs & 2097152) opts.tail_release_early = kTailReleaseAll;
  const bool tail_proj = tail && (knobs & 8388608);
  opts.tail_attention_proj = tail_proj;
  if (tuned_x3) {
    opts.gemm_autotune = true;
    opts.gemm_autotune_max_m = kDecodeGemmAutotuneMaxM;
    opts.num_kv_blocks = 1024;
  }
  auto runner = CreateGptBigCodeRunnerFromDir(load, collectives.get(), opts);
  ASSERT_TRUE(runner.ok()) << runner.status();
  GptBigCodeRunner& r = **runner;
  if (knobs & 524288) {  // 8 decode steps of block 0 (no sequence holds blocks yet)
    const absl::StatusOr<DecodeChainShareCalibration> cal = r.CalibrateDecodeChainShares(8, 64);
    ASSERT_TRUE(cal.ok()) << cal.status();
    std::printf("decode chain SM shares: %s\n", cal->Summary().c_str());
  }
  const int64_t vocab = r.vocab_size();
  auto all_refs = testing::LoadHfReferences(load.model_dir, vocab);
  ASSERT_GE(all_refs.size(), 5u);
  if (tuned_x3) {
    const size_t n = all_refs.size();
    for (int copy = 0; copy < 2; ++copy) {
      for (size_t i = 0; i < n; ++i) all_refs.push_back(all_refs[i]);
    }
    // As the server: the decode graphs of every bucket up to this batch warmed up (their GEMM
    // shapes tuned), then no more tuning (the warm-up freezes it).
    auto graphs = r.WarmUpDecodeGraphs(static_cast<int>(all_refs.size()), 512);
    ASSERT_TRUE(graphs.ok()) << graphs.status();
    const std::string summary = r.model().gemm_autotune_summary();
    EXPECT_EQ(summary.find("gemm autotune: 0 shapes"), std::string::npos) << summary;
  }
  // Bits 12 and 18 (batch 1 only): each prompt prefilled and decoded on its own.
  std::vector<std::vector<Reference>> groups;
  if (knobs & (4096 | 262144)) {
    for (const Reference& ref : all_refs) groups.push_back({ref});
  } else {
    groups.push_back(all_refs);
  }
  double worst = 0;
  int compared = 0;
  for (const std::vector<Reference>& refs : groups) {
    const size_t S = refs.size();

    Batch batch = Batch::Shuffled(S, opts.num_kv_blocks, block_size, 7);

    // Prefill every prompt in one step; logits at every position.
    std::vector<std::vector<int32_t>> tokens;
    std::vector<int> start(S, 0);
    for (const Reference& ref : refs) tokens.push_back(ref.prompt);
    auto logits = r.Execute(batch.Make(tokens, start, /*all_rows=*/true));
    ASSERT_TRUE(logits.ok()) << logits.status();
    int64_t row = 0;
    std::vector<int32_t> next(S);
    for (size_t s = 0; s < S; ++s) {
      for (size_t i = 0; i < refs[s].prompt.size(); ++i, ++row) {
        const double e = RowRelError(logits->data<float>() + row * vocab,
                                     refs[s].logits.data() + i * vocab, vocab);
        worst = std::max(worst, e);
      }
      next[s] = Argmax(logits->data<float>() + (row - 1) * vocab, vocab);
      start[s] = static_cast<int>(refs[s].prompt.size());
    }
    const double logit_tol = dtype == DType::kF16 ? 2e-2 : 6e-2;
    EXPECT_LT(worst, logit_tol) << model << " prefill";

    // Greedy decode of the whole batch; sequence s is compared until HF's margin at a step is below
    // what this dtype resolves (then its history may fork from HF's legitimately).
    const double margin_floor = dtype == DType::kF16 ? 0.05 : 0.25;
    std::vector<bool> comparing(S, true);
    size_t steps = 0;
    for (const Reference& ref : refs) steps = std::max(steps, ref.greedy.size());
    for (size_t step = 0; step < steps; ++step) {
      for (size_t s = 0; s < S; ++s) {
        if (!comparing[s]) continue;
        if (step >= refs[s].greedy.size()) {
          comparing[s] = false;
          continue;
        }
        if (refs[s].margins[step] < margin_floor) {
          // HF's top two are closer than this dtype resolves: either token is right. While ours
          // still equals HF's the histories agree and later steps stay comparable.
          if (next[s] != refs[s].greedy[step]) comparing[s] = false;
          continue;
        }
        EXPECT_EQ(next[s], refs[s].greedy[step]) << model << " seq " << s << " step " << step;
        if (next[s] != refs[s].greedy[step]) comparing[s] = false;
        ++compared;
      }
      if (step + 1 == steps) break;
      tokens.clear();
      for (size_t s = 0; s < S; ++s) tokens.push_back({next[s]});
      const StepInput in = batch.Make(tokens, start, false);
      if (step % 2 == 0) {
        auto out = r.Execute(in);
        ASSERT_TRUE(out.ok()) << out.status();
        for (size_t s = 0; s < S; ++s) next[s] = Argmax(out->data<float>() + s * vocab, vocab);
      } else if (step % 4 == 1) {
        std::vector<RowSamplingParams> greedy(S);
        auto out = r.ExecuteAndSample(in, greedy);
        ASSERT_TRUE(out.ok()) << out.status();
        next = *out;
      } else {
        // The engine's path for a batch that also has host-sampled rows: tokens and logits.
        std::vector<RowSamplingParams> greedy(S);
        auto out = r.ExecuteSampled(in, greedy, /*with_logits=*/true);
        ASSERT_TRUE(out.ok()) << out.status();
        ASSERT_EQ(out->logits.dim(0), static_cast<int64_t>(S));
        for (size_t s = 0; s < S; ++s) {
          EXPECT_EQ(out->tokens[s], Argmax(out->logits.data<float>() + s * vocab, vocab))
              << "device greedy token vs host argmax of the returned logits, seq " << s;
        }
        next = out->tokens;
      }
      for (size_t s = 0; s < S; ++s) ++start[s];
    }
  }  // groups
  std::printf(
      "%s %s block %d knobs %d: largest relative logit error %.3g, %d greedy steps "
      "equal, %d CUDA graphs, %lld decode chains (%lld with the attention), %lld tail "
      "attentions\n",
      model.c_str(), std::string(DTypeName(dtype)).c_str(), block_size, knobs, worst, compared,
      r.model().num_cuda_graphs(), static_cast<long long>(r.model().decode_chain_runs()),
      static_cast<long long>(r.model().decode_chain_attention_runs()),
      static_cast<long long>(r.model().tail_attention_runs()));
  if (knobs & 4096) EXPECT_GT(r.model().decode_chain_runs(), 0) << "the decode chain never ran";
  // The fixtures' context bound (256) fits the attention phase's short form: with bit 13 every
  // chain has it, with bit 22's lower bound none.
  EXPECT_EQ(r.model().decode_chain_attention_runs(),
            (knobs & 8192) && !(knobs & 4194304) ? r.model().decode_chain_runs() : 0);
  if (tail && model == "tiny-mqa-d128") {
    EXPECT_GT(r.model().tail_attention_runs(), 0) << "the tail attention never ran";
    if (tail_proj) {
      EXPECT_EQ(r.model().tail_attention_proj_runs(), r.model().tail_attention_runs())
          << "a tail launch ran without attn.c_proj";
    }
  }
  if (!tail_proj) EXPECT_EQ(r.model().tail_attention_proj_runs(), 0);
  if (!tail) EXPECT_EQ(r.model().tail_attention_runs(), 0);
  // fp16 resolves the fixtures' greedy paths for long stretches; bf16's 8-bit mantissa forks
  // early on these random tiny models (first GPU run: 3 to 11 steps compared before a fork).
  EXPECT_GT(compared, dtype == DType::kF16 ? 40 : 0);
  EXPECT_GT(r.model().num_cuda_graphs(), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, HfParityCuda,
    ::testing::Combine(::testing::Values("tiny-mqa-d64", "tiny-mqa-d128", "tiny-mha-d64"),
                       ::testing::Values(DType::kF16, DType::kBF16), ::testing::Values(8, 16),
                       ::testing::Values(0, 3, 5, 9, 21, 37, 101, 165, 293, 549, 1061, 2085, 4197,
                                         12389, 20581, 36965, 528485, 103, 65637, 196709, 327781,
                                         1376357, 3473509, 4206693, 9764965)),
    [](const auto& info) {
      std::string name = std::get<0>(info.param) + "_" +
                         std::string(DTypeName(std::get<1>(info.param))) + "_block" +
                         std::to_string(std::get<2>(info.param)) +
                         (std::get<3>(info.param) == 3         ? "_pdl_fuse"
                          : std::get<3>(info.param) == 5       ? "_pdl_small"
                          : std::get<3>(info.param) == 9       ? "_pdl_gemms"
                          : std::get<3>(info.param) == 21      ? "_pdl_small_attn5"
                          : std::get<3>(info.param) == 37      ? "_pdl_small_deep"
                          : std::get<3>(info.param) == 165     ? "_pdl_small_deep_attn8"
                          : std::get<3>(info.param) == 293     ? "_pdl_small_deep_attn7"
                          : std::get<3>(info.param) == 549     ? "_pdl_small_deep_attn11"
                          : std::get<3>(info.param) == 1061    ? "_pdl_small_deep_attn14"
                          : std::get<3>(info.param) == 2085    ? "_pdl_small_deep_attn15"
                          : std::get<3>(info.param) == 4197    ? "_defaults_chain"
                          : std::get<3>(info.param) == 12389   ? "_defaults_chain_attn"
                          : std::get<3>(info.param) == 4206693 ? "_defaults_chain_attn128"
                          : std::get<3>(info.param) == 20581   ? "_defaults_chain_fp32fold"
                          : std::get<3>(info.param) == 36965   ? "_defaults_chain_fusedmlp"
                          : std::get<3>(info.param) == 528485  ? "_defaults_chain_shares"
                          : std::get<3>(info.param) == 103     ? "_defaults_fuse"
                          : std::get<3>(info.param) == 65637   ? "_defaults_ln"
                          : std::get<3>(info.param) == 196709  ? "_defaults_ln_tuned_x3"
                          : std::get<3>(info.param) == 327781  ? "_defaults_ln_tail"
                          : std::get<3>(info.param) == 1376357 ? "_defaults_ln_tail_cluster"
                          : std::get<3>(info.param) == 3473509 ? "_defaults_ln_tail_release"
                          : std::get<3>(info.param) == 9764965 ? "_defaults_ln_tail_proj"
                          : std::get<3>(info.param) == 101     ? "_defaults"
                                                               : "");
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// The tiny-mqa-d128 fixture in float16 on the GPU with these options.
absl::StatusOr<std::unique_ptr<GptBigCodeRunner>> TinyCudaRunner(
    Collectives* collectives, GptBigCodeRunnerOptions opts,
    const std::string& fixture = "tiny-mqa-d128") {
  LoadOptions load;
  load.model_dir = FixtureModelDir(fixture);
  load.dtype = DType::kF16;
  opts.device = Device::kCuda;
  return CreateGptBigCodeRunnerFromDir(load, collectives, opts);
}

// An engine over TinyCudaRunner on its own local collectives (destroyed after the engine);
// `runner` is the engine's, borrowed. opts.num_kv_blocks defaults to 256 here.
struct TinyCudaEngine {
  std::unique_ptr<Collectives> collectives;
  GptBigCodeRunner* runner = nullptr;
  std::unique_ptr<Engine> engine;
};
absl::StatusOr<TinyCudaEngine> MakeTinyCudaEngine(const EngineOptions& eo,
                                                  GptBigCodeRunnerOptions opts = {},
                                                  const std::string& fixture = "tiny-mqa-d128") {
  TinyCudaEngine e;
  e.collectives = MakeLocalCollectives();
  if (opts.num_kv_blocks == GptBigCodeRunnerOptions().num_kv_blocks) opts.num_kv_blocks = 256;
  ASSIGN_OR_RETURN(std::unique_ptr<GptBigCodeRunner> runner,
                   TinyCudaRunner(e.collectives.get(), opts, fixture));
  e.runner = runner.get();
  ASSIGN_OR_RETURN(e.engine, Engine::Create(std::move(runner), eo));
  return e;
}

// Prompt log-probabilities through the engine over the CUDA runner (device sampling on, so a
// scoring step copies every prompt row's logits back beside device-sampled rows): each prompt
// token's score within what fp16 logits can resolve of HF's log-softmax, every prompt at once in
// chunks of at most 24 scored rows, some without generating.
TEST(GptBigCodeCuda, EnginePromptLogprobsNearTransformers) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  EngineOptions eo;
  eo.max_num_batched_tokens = 64;
  eo.max_num_seqs = 16;
  eo.max_model_len = 128;
  eo.max_prompt_logprob_rows = 24;
  absl::StatusOr<TinyCudaEngine> e = MakeTinyCudaEngine(eo);
  ASSERT_TRUE(e.ok()) << e.status();
  const int64_t vocab = e->runner->vocab_size();
  const auto refs = testing::LoadHfReferences(FixtureModelDir("tiny-mqa-d128"), vocab);
  ASSERT_GE(refs.size(), 5u);
  const std::vector<testing::ScoredPrompt> got = testing::ScorePrompts(*e->engine, refs, 1, 3);
  double worst = 0;
  int scored = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    ASSERT_TRUE(got[i].scores.has_value() && got[i].scores->size() + 1 == refs[i].prompt.size());
    for (size_t p = 1; p < refs[i].prompt.size(); ++p) {
      const testing::HfScore want = testing::HfPromptScore(refs[i], p, vocab);
      const double err = std::abs((*got[i].scores)[p - 1].logprob - want.logprob);
      worst = std::max(worst, err / want.scale);
      // A log-softmax moves by at most twice the largest logit error (2e-2 of the row's scale).
      EXPECT_LT(err, 2 * 2e-2 * want.scale) << "prompt " << i << " position " << p;
      ++scored;
    }
  }
  std::printf(
      "engine prompt log-probabilities on the GPU (fp16): %d positions, worst error %.3g "
      "of the row's largest |logit|\n",
      scored, worst);
  EXPECT_GT(scored, 70);  // 7 prompts of 1 to 33 tokens
}

// Each fixture prompt, greedy with n samples, through `engine`, for as many tokens as HF's greedy
// continuation keeps a top-1 margin of at least 5e-2 (what fp16 logits resolve): every sample
// must be that continuation. Returns the tokens compared a sample.
int ExpectGreedySamplesEqualHf(Engine& engine, const std::vector<testing::HfReference>& refs, int n,
                               const std::string& what) {
  std::vector<RequestOutputQueue> queues(refs.size());
  std::vector<int> lengths(refs.size());
  for (size_t i = 0; i < refs.size(); ++i) {
    while (lengths[i] < static_cast<int>(refs[i].greedy.size()) &&
           refs[i].margins[lengths[i]] >= 5e-2) {
      ++lengths[i];
    }
    if (lengths[i] == 0) continue;
    EngineRequest r;
    r.request_id = what + std::to_string(i);
    r.prompt_token_ids = refs[i].prompt;
    r.params.n = n;
    r.params.temperature = 0;
    r.params.max_tokens = lengths[i];
    r.on_output = queues[i].Callback();
    EXPECT_TRUE(engine.AddRequest(std::move(r)).ok());
  }
  while (engine.HasWork()) {
    absl::Status step = engine.Step();
    EXPECT_TRUE(step.ok()) << step;
    if (!step.ok()) return 0;
  }
  int compared = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    if (lengths[i] == 0) continue;
    std::vector<std::vector<int32_t>> samples(n);
    while (auto out = queues[i].Pop(absl::ZeroDuration())) {
      EXPECT_TRUE(out->error.ok()) << out->error;
      for (const SampleOutput& sample : out->samples) {
        samples[sample.index].insert(samples[sample.index].end(), sample.token_ids.begin(),
                                     sample.token_ids.end());
      }
    }
    const std::vector<int32_t> want(refs[i].greedy.begin(), refs[i].greedy.begin() + lengths[i]);
    for (int d = 0; d < n; ++d) {
      EXPECT_EQ(samples[d], want) << what << " prompt " << i << " sample " << d;
    }
    compared += lengths[i];
  }
  return compared;
}

// n samples drawn on the device from one prompt row repeated n times among the logits rows:
// greedy, every sample must be HF's greedy continuation (up to a step HF's fp16 margin cannot
// resolve), through the engine over the CUDA runner.
TEST(GptBigCodeCuda, EngineSeveralGreedySamplesFromOneRowEqualTransformers) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  EngineOptions eo;
  eo.max_num_seqs = 32;
  eo.max_model_len = 128;
  eo.eos_token_id = -1;
  absl::StatusOr<TinyCudaEngine> e = MakeTinyCudaEngine(eo);
  ASSERT_TRUE(e.ok()) << e.status();
  const auto refs =
      testing::LoadHfReferences(FixtureModelDir("tiny-mqa-d128"), e->runner->vocab_size());
  const int compared = ExpectGreedySamplesEqualHf(*e->engine, refs, 3, "n");
  std::printf("three greedy samples a prompt on the GPU: %d steps each equal HF's\n", compared);
  EXPECT_GT(compared, 20);
}

// Decode lookahead (runtime/decode_lookahead.h) over the CUDA runner: each predicted next decode
// step launched, its tokens fed on the device, before the engine asks for it. Greedy, one prompt
// at a time (decode steps as CUDA graphs), the tokens are HF's up to a step HF's fp16 margin
// cannot resolve; under churn (tests/model/churn_workload.h: sampling, stop tokens, arrivals, a
// forked request) the outputs are those without lookahead, token for token, with predicted steps
// both used and dropped.
TEST(GptBigCodeCuda, EngineLookaheadGivesTheSameTokens) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  {
    EngineOptions eo;
    eo.max_num_seqs = 16;
    eo.max_model_len = 128;
    eo.eos_token_id = -1;
    eo.decode_lookahead = true;
    absl::StatusOr<TinyCudaEngine> e = MakeTinyCudaEngine(eo);
    ASSERT_TRUE(e.ok()) << e.status();
    GptBigCodeRunner* raw = e->runner;
    const auto refs =
        testing::LoadHfReferences(FixtureModelDir("tiny-mqa-d128"), raw->vocab_size());
    int compared = 0;
    for (const testing::HfReference& r : refs) {
      compared += ExpectGreedySamplesEqualHf(*e->engine, {r}, 1, "lookahead");
    }
    const LookaheadStats& st = raw->lookahead_stats();
    std::printf(
        "lookahead on the GPU, greedy alone: %d tokens equal HF's; %lld predicted steps "
        "launched, %lld used, %lld dropped; %d CUDA graphs\n",
        compared, static_cast<long long>(st.launched), static_cast<long long>(st.used),
        static_cast<long long>(st.dropped), raw->model().num_cuda_graphs());
    EXPECT_GT(compared, 20);
    EXPECT_GT(st.used, 20);
    EXPECT_GT(raw->model().num_cuda_graphs(), 0);
  }
  const std::string fixture = "tiny-mqa-d64";
  auto run = [&](bool lookahead) {
    GptBigCodeRunnerOptions opts;
    opts.block_size = 8;
    EngineOptions eo;
    eo.max_num_seqs = 16;
    eo.max_model_len = 128;
    eo.decode_lookahead = lookahead;
    eo.decode_lookahead_max_seqs = 16;  // the runner's predictions over batches too
    absl::StatusOr<TinyCudaEngine> e = MakeTinyCudaEngine(eo, opts, fixture);
    EXPECT_TRUE(e.ok()) << e.status();
    if (!e.ok()) return testing::ChurnResult();
    const auto refs = testing::LoadHfReferences(FixtureModelDir(fixture), e->runner->vocab_size());
    testing::ChurnResult result = testing::RunChurnWorkload(*e->engine, refs);
    result.lookahead = e->runner->lookahead_stats();
    EXPECT_EQ(e->engine->block_manager().NumFreeBlocks(), 256) << "blocks leaked";
    return result;
  };
  testing::ExpectLookaheadChangesNothing(run(false), run(true), "CUDA, up to 16 sequences", 20);
}

// Speculative decoding by prompt lookup over the CUDA runner: steps of a sequence's last token plus
// its drafts (prefill attention over queries that start mid-sequence, a logits row for each,
// greedy draws on the device) give HF's greedy continuation, up to a step HF's fp16 margin cannot
// resolve, on both head sizes (d64's text repeats enough for drafts to be kept): the prompts all
// at once (check steps of mixed lengths: eager), then one at a time with check steps eager and as
// CUDA graphs (GptBigCodeOptions::max_graph_query), which must then have been captured.
TEST(GptBigCodeCuda, EngineSpeculativeGreedyEqualsTransformers) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  int graphs[2] = {0, 0};             // captured with max_graph_query 1 and 6, one prompt at a time
  for (const int mode : {0, 1, 6}) {  // 0: together; 1 and 6: alone, max_graph_query
    for (const std::string fixture : {"tiny-mqa-d64", "tiny-mqa-d128"}) {
      GptBigCodeRunnerOptions opts;
      opts.max_graph_query = std::max(mode, 1);
      EngineOptions eo;
      eo.max_num_seqs = 16;
      eo.max_model_len = 128;
      eo.eos_token_id = -1;
      eo.speculative = {.num_speculative_tokens = 5, .prompt_lookup_max = 3};
      absl::StatusOr<TinyCudaEngine> e = MakeTinyCudaEngine(eo, opts, fixture);
      ASSERT_TRUE(e.ok()) << e.status();
      GptBigCodeRunner* raw = e->runner;
      Engine& engine = *e->engine;
      const auto refs = testing::LoadHfReferences(FixtureModelDir(fixture), raw->vocab_size());
      int compared = 0;
      if (mode == 0) {
        compared = ExpectGreedySamplesEqualHf(engine, refs, 1, fixture);
      } else {
        for (const testing::HfReference& r : refs) {
          compared += ExpectGreedySamplesEqualHf(engine, {r}, 1, fixture);
        }
        graphs[mode > 1] += raw->model().num_cuda_graphs();
      }
      const EngineMetrics m = engine.metrics();
      std::printf(
          "%s speculative on the GPU (%s): %d tokens equal HF's in %lld steps, %lld of %lld "
          "drafts kept, %d CUDA graphs\n",
          fixture.c_str(),
          mode == 0   ? "together"
          : mode == 1 ? "alone, check steps eager"
                      : "alone, graphed",
          compared, static_cast<long long>(m.num_steps),
          static_cast<long long>(m.spec_accepted_tokens),
          static_cast<long long>(m.spec_draft_tokens), raw->model().num_cuda_graphs());
      EXPECT_GT(compared, 20);
      EXPECT_GT(m.spec_draft_tokens, 0);
    }
  }
  EXPECT_GT(graphs[1], graphs[0]) << "no check step ran as a CUDA graph";
}

// LaunchSample / CollectSample with tokens fed on the device give the same greedy tokens as
// one synchronous ExecuteAndSample per step (two runners over the same weights, same blocks).
TEST(GptBigCodeCuda, AsyncLaunchEqualsSynchronousSteps) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto collectives = MakeLocalCollectives();
  GptBigCodeRunnerOptions opts;
  opts.num_kv_blocks = 256;
  auto sync_runner = TinyCudaRunner(collectives.get(), opts);
  auto async_runner = TinyCudaRunner(collectives.get(), opts);
  ASSERT_TRUE(sync_runner.ok()) << sync_runner.status();
  ASSERT_TRUE(async_runner.ok()) << async_runner.status();
  const auto refs =
      testing::LoadHfReferences(FixtureModelDir("tiny-mqa-d128"), (*sync_runner)->vocab_size());
  const size_t S = refs.size();
  constexpr int kSteps = 24;
  std::vector<RowSamplingParams> params(S);
  for (size_t s = 0; s < S; ++s) {  // greedy and seeded sampling rows
    if (s % 2 == 1) {
      params[s].temperature = 0.9f;
      params[s].top_k = 20;
      params[s].seed = 100 + s;
    }
  }
  auto run = [&](GptBigCodeRunner& r, bool async) -> std::vector<std::vector<int32_t>> {
    Batch batch = Batch::Shuffled(S, opts.num_kv_blocks, opts.block_size, 11);
    std::vector<std::vector<int32_t>> tokens;
    std::vector<int> start(S, 0);
    for (const Reference& ref : refs) tokens.push_back(ref.prompt);
    std::vector<std::vector<int32_t>> out(S);
    auto first = r.ExecuteAndSample(batch.Make(tokens, start, false), params);
    EXPECT_TRUE(first.ok()) << first.status();
    if (!first.ok()) return out;
    std::vector<int32_t> next = *first;
    for (size_t s = 0; s < S; ++s) {
      out[s].push_back(next[s]);
      start[s] = static_cast<int>(refs[s].prompt.size());
    }
    auto offsets = [&](int step) {
      std::vector<RowSamplingParams> p = params;
      for (auto& row : p) row.offset = step;
      return p;
    };
    for (int step = 1; step <= kSteps + (async ? 1 : 0); ++step) {
      if (step <= kSteps) {
        tokens.clear();
        for (size_t s = 0; s < S; ++s) tokens.push_back({async && step > 1 ? 0 : next[s]});
        const StepInput in = batch.Make(tokens, start, false);
        if (async) {
          const absl::Status launched =
              r.LaunchSample(in, offsets(step), step > 1 ? static_cast<int>(S) : 0);
          EXPECT_TRUE(launched.ok()) << launched;
          if (!launched.ok()) return out;
        } else {
          auto got = r.ExecuteAndSample(in, offsets(step));
          EXPECT_TRUE(got.ok()) << got.status();
          if (!got.ok()) return out;
          next = *got;
          for (size_t s = 0; s < S; ++s) out[s].push_back(next[s]);
        }
        for (size_t s = 0; s < S; ++s) ++start[s];
      }
      if (async && step > 1) {  // the previous launch's tokens, while this one runs
        auto got = r.CollectSample();
        EXPECT_TRUE(got.ok()) << got.status();
        if (!got.ok()) return out;
        for (size_t s = 0; s < S; ++s) out[s].push_back((*got)[s]);
      }
    }
    return out;
  };
  const auto want = run(**sync_runner, false);
  const auto got = run(**async_runner, true);
  ASSERT_EQ(want[0].size(), static_cast<size_t>(kSteps + 1));
  EXPECT_EQ(got, want);
  // Collecting with nothing outstanding is refused.
  EXPECT_FALSE((*async_runner)->CollectSample().ok());
}

// The start-up warm-up captures one graph for each (batch bucket, context bucket) a decode step
// within the limits can land in; steps of those shapes then capture nothing more and sample what
// a runner without the warm-up samples (the warm-up's garbage in block 0 is overwritten before
// anything reads it).
TEST(GptBigCodeCuda, WarmUpCapturesEveryDecodeGraphAndChangesNoOutput) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto collectives = MakeLocalCollectives();
  GptBigCodeRunnerOptions opts;
  opts.num_kv_blocks = 256;
  auto cold = TinyCudaRunner(collectives.get(), opts);
  auto warm = TinyCudaRunner(collectives.get(), opts);
  ASSERT_TRUE(cold.ok()) << cold.status();
  ASSERT_TRUE(warm.ok()) << warm.status();
  // A bound off the bucket edges: batch buckets 1, 2, 4, 8, 16, 24, ..., 64, 96, 128 (up to 100
  // sequences), context buckets 256, 512, 1024 (up to 1000 tokens).
  const auto shapes = (*warm)->model().DecodeGraphShapes(100, 1000);
  ASSERT_EQ(shapes.size(), 13u * 3u);
  EXPECT_EQ(shapes.front(), std::make_pair(1, 256));
  EXPECT_EQ(shapes[12], std::make_pair(100, 256));
  EXPECT_EQ(shapes.back(), std::make_pair(100, 1000));
  // The fixture has 128 positions: one context bucket; 16 sequences: 5 batch buckets.
  auto warmed = (*warm)->WarmUpDecodeGraphs(16, 4096);
  ASSERT_TRUE(warmed.ok()) << warmed.status();
  EXPECT_EQ(*warmed, 5);
  EXPECT_EQ((*warm)->model().num_cuda_graphs(), 5);

  const auto refs =
      testing::LoadHfReferences(FixtureModelDir("tiny-mqa-d128"), (*cold)->vocab_size());
  const size_t S = refs.size();
  ASSERT_LE(S, 16u);
  const std::vector<RowSamplingParams> greedy(S);
  auto run = [&](GptBigCodeRunner& r) {
    Batch batch = Batch::Shuffled(S, opts.num_kv_blocks, opts.block_size, 13);
    std::vector<std::vector<int32_t>> tokens, out(S);
    std::vector<int> start(S, 0);
    for (const Reference& ref : refs) tokens.push_back(ref.prompt);
    for (int step = 0; step <= 24; ++step) {
      auto got = r.ExecuteAndSample(batch.Make(tokens, start, false), greedy);
      EXPECT_TRUE(got.ok()) << got.status();
      if (!got.ok()) break;
      for (size_t s = 0; s < S; ++s) {
        start[s] += static_cast<int>(tokens[s].size());
        tokens[s] = {(*got)[s]};
        out[s].push_back((*got)[s]);
      }
    }
    return out;
  };
  const auto want = run(**cold);
  EXPECT_GT((*cold)->model().num_cuda_graphs(), 0);  // it captured during its run
  EXPECT_EQ(run(**warm), want);
  EXPECT_EQ((*warm)->model().num_cuda_graphs(), 5) << "a decode step captured after the warm-up";
}

TEST(GptBigCodeCuda, KvPoolSizedFromFreeMemoryAndBlockCopy) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto collectives = MakeLocalCollectives();
  GptBigCodeRunnerOptions opts;
  opts.gpu_memory_utilization = 0.02;
  auto runner = TinyCudaRunner(collectives.get(), opts);
  ASSERT_TRUE(runner.ok()) << runner.status();
  GptBigCodeRunner& r = **runner;
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  const int64_t per_block = r.kv_bytes_per_token() * r.block_size();
  EXPECT_EQ(r.kv_bytes_per_token(), 2 * 1 * 128 * 2);  // K and V, 1 layer, D 128, fp16
  EXPECT_GT(r.num_kv_blocks(), 0);
  EXPECT_LE(r.num_kv_blocks() * per_block, 0.02 * total);

  // Block copy on the device: fill two blocks through a step, copy one onto a third.
  PagedKvCache& cache = r.kv_cache();
  const int64_t block_bytes = cache.key(0).nbytes() / cache.num_blocks();
  std::vector<uint8_t> pattern(block_bytes);
  std::mt19937 rng(3);
  for (auto& b : pattern) b = rng();
  ASSERT_EQ(cudaMemcpy(static_cast<char*>(cache.value(0).raw()) + 1 * block_bytes, pattern.data(),
                       block_bytes, cudaMemcpyHostToDevice),
            cudaSuccess);
  const BlockCopy copy{1, 5};
  ASSERT_TRUE(cache.CopyBlocks(absl::MakeConstSpan(&copy, 1), r.model().cuda_stream()).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> got(block_bytes);
  ASSERT_EQ(cudaMemcpy(got.data(), static_cast<char*>(cache.value(0).raw()) + 5 * block_bytes,
                       block_bytes, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, pattern);
}

}  // namespace
}  // namespace mqa
