// mqabench throughput (mqabench.cc's header comment lists its flags): many requests of
// code-shaped lengths, continuous batching, output tokens/s beside the compute roofline; through
// mqabench's own step loop or the serving engine (--engine).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "benchmarks/mqabench/common.h"
#include "benchmarks/mqabench/device_fill.h"
#include "benchmarks/mqabench/engine_run.h"

namespace mqa::bench {
namespace {

// Lengths cut from real code: slices of this repository's sources (the MQA_SOURCE_DIR or the
// working directory), one byte per token.
std::vector<std::string> CodeCorpus() {
  std::vector<std::string> files;
  const char* root = std::getenv("MQA_SOURCE_DIR");
  const std::filesystem::path base(root ? root : ".");
  for (const char* dir : {"kernels", "model", "runtime", "parallel", "launcher"}) {
    std::error_code ec;
    for (const auto& e : std::filesystem::recursive_directory_iterator(base / dir, ec)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cc" && ext != ".h" && ext != ".cu") continue;
      std::ifstream in(e.path());
      files.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  }
  return files;
}

absl::Status ThroughputOwnLoop(const Flags& f, Setup& s, std::deque<Seq> waiting, double params,
                               double gemm_rate);

// One throughput row: `processed` tokens went through the model (prompts and every decode
// input), `generated` came out; GEMM work is 2 x params FLOP a processed token.
void PrintThroughputRow(const char* label, double secs, int64_t steps, int64_t generated,
                        int64_t processed, double params, double gemm_rate,
                        const std::string& tail = "") {
  const double flops = 2.0 * params * processed;
  std::printf(
      "  %s: %.2f s, %lld steps: %.1f output tokens/s, %.1f total tokens/s; %.1f TFLOP/s of "
      "GEMM work = %.1f%% of the measured %.0f TFLOP/s (8192^3 GEMM)%s\n",
      label, secs, static_cast<long long>(steps), generated / secs, processed / secs,
      flops / secs / 1e12, 100.0 * flops / secs / gemm_rate, gemm_rate / 1e12, tail.c_str());
}

}  // namespace

absl::Status Throughput(const Flags& f) {
  const std::vector<std::string> corpus = CodeCorpus();
  if (corpus.empty()) return absl::NotFoundError("no source files found for prompts");
  std::mt19937 rng(f.seed + 7);
  std::deque<Seq> waiting;
  int64_t total_prompt = 0, total_output = 0;
  for (int i = 0; i < f.num_prompts; ++i) {
    const std::string& file = corpus[rng() % corpus.size()];
    // A prompt is a file's slice of 3.5 characters per token (code's usual ratio); the completion
    // is the next function-sized piece.
    const int len = std::uniform_int_distribution<int>(32, 1024)(rng);
    const size_t chars = std::min<size_t>(file.size(), len * 7 / 2);
    const size_t at = file.size() > chars ? rng() % (file.size() - chars) : 0;
    Seq q;
    for (size_t c = at; c < at + chars && q.prompt.size() < static_cast<size_t>(len); c += 3) {
      q.prompt.push_back(static_cast<unsigned char>(file[c]) + 1);
    }
    if (q.prompt.empty()) q.prompt.push_back(1);
    q.output_len = std::uniform_int_distribution<int>(16, 256)(rng);
    total_prompt += q.prompt.size();
    total_output += q.output_len;
    waiting.push_back(std::move(q));
  }
  // KV pool: room for max_num_seqs sequences of the longest kind.
  const int bs = f.block_size;
  const int pool = f.max_num_seqs * ((1024 + 256 + bs - 1) / bs) / 2 + 64;
  ASSIGN_OR_RETURN(Setup s,
                   MakeSetup(f, pool, f.max_num_batched_tokens + f.max_num_seqs, f.max_num_seqs));
  ASSIGN_OR_RETURN(const double gemm_rate, MeasureGemmRate(8192, s.dtype));
  GptBigCodeRunner& r = *s.runner;
  if (f.small == "on") r.model().set_small_kernels(true, true);
  if (f.autotune == "decode") {  // as the server does (latency.cc)
    RETURN_IF_ERROR(r.WarmUpDecodeGraphs(f.max_num_seqs, 1024 + 256).status());
  }
  // One GEMM variant for the whole run: --gemm splitk, tc, tma (tc's TMA form, with skinnyd) or
  // splitk+tc switch those kernels on.
  r.model().set_gemm_kernels(absl::StrContains(f.gemm, "splitk"),
                             f.gemm == "tma"                                      ? 2
                             : f.gemm == "tc" || absl::StrContains(f.gemm, "+tc") ? 1
                                                                                  : 0,
                             f.gemm == "skinnyd" || f.gemm == "tma");
  const double params = static_cast<double>(s.weight_bytes) / DTypeSize(s.dtype);
  std::printf(
      "throughput %s: %d requests (prompts %lld tokens, outputs %lld tokens, lengths cut "
      "from this repository's code), %s, max %d seqs, %d batched tokens\n",
      f.model.c_str(), f.num_prompts, (long long)total_prompt, (long long)total_output,
      std::string(DTypeName(s.dtype)).c_str(), f.max_num_seqs, f.max_num_batched_tokens);
  std::vector<EngineRequestSpec> specs;
  for (size_t i = 0; i < waiting.size(); ++i) {
    specs.push_back({waiting[i].prompt, waiting[i].output_len, 0.8f, 0.95f, i});
  }
  for (const std::string& row : EngineRows(f.engine)) {
    if (row == "off") {
      RETURN_IF_ERROR(ThroughputOwnLoop(f, s, waiting, params, gemm_rate));
      continue;
    }
    // The same requests through the serving engine (chunked prefill, its scheduler and
    // sampling), with decode lookahead on the la row.
    EngineOptions options;
    options.max_num_seqs = f.max_num_seqs;
    options.max_num_batched_tokens = f.max_num_batched_tokens;
    options.max_model_len = 1024 + 256;
    options.decode_lookahead = row == "la";
    const LookaheadStats before = r.lookahead_stats();
    ASSIGN_OR_RETURN(EngineRunStats st, RunThroughEngine(&r, options, specs));
    double runner_s = 0;
    for (double x : st.runner_s) runner_s += x;
    // Every request's last output token is never fed back.
    const int64_t processed = st.prompt_tokens + st.output_tokens - f.num_prompts;
    PrintThroughputRow(
        row == "la" ? "engine, lookahead" : "engine", st.seconds,
        static_cast<int64_t>(st.step_s.size()), st.output_tokens, processed, params, gemm_rate,
        absl::StrCat(absl::StrFormat("; %.1f%% of the time inside the runner",
                                     100.0 * runner_s / st.seconds),
                     row == "la" ? LookaheadSummary(before, r.lookahead_stats()) : ""));
  }
  return absl::OkStatus();
}

namespace {

absl::Status ThroughputOwnLoop(const Flags& f, Setup& s, std::deque<Seq> waiting, double params,
                               double gemm_rate) {
  GptBigCodeRunner& r = *s.runner;
  const int bs = f.block_size;
  Blocks blocks(r.num_kv_blocks(), bs);
  std::vector<Seq> running;
  running.reserve(f.num_prompts);
  std::vector<Seq*> active;
  int64_t processed = 0, generated = 0;
  int steps = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (!waiting.empty() || !active.empty()) {
    std::vector<Seq*> batch;
    std::vector<std::vector<int32_t>> chunk;
    int64_t budget = f.max_num_batched_tokens;
    for (Seq* q : active) {  // decodes first
      if (!blocks.Reserve(q->table, q->context + 1)) return absl::InternalError("pool too small");
      batch.push_back(q);
      chunk.push_back({q->last});
      --budget;
    }
    while (!waiting.empty() && static_cast<int>(batch.size()) < f.max_num_seqs &&
           static_cast<int64_t>(waiting.front().prompt.size()) <= budget &&
           blocks.free() * bs >=
               static_cast<int>(waiting.front().prompt.size()) + waiting.front().output_len) {
      running.push_back(std::move(waiting.front()));
      waiting.pop_front();
      Seq* q = &running.back();
      blocks.Reserve(q->table, q->prompt.size() + q->output_len);
      budget -= q->prompt.size();
      batch.push_back(q);
      chunk.push_back(q->prompt);
    }
    if (batch.empty()) return absl::InternalError("throughput: nothing schedulable");
    std::vector<RowSamplingParams> params(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      params[i].temperature = 0.8f;
      params[i].top_p = 0.95f;
      params[i].seed = i;
      params[i].offset = batch[i]->generated;
    }
    ASSIGN_OR_RETURN(std::vector<int32_t> next,
                     r.ExecuteAndSample(MakeStep(batch, chunk, bs), params));
    ++steps;
    std::vector<Seq*> still;
    for (size_t i = 0; i < batch.size(); ++i) {
      Seq* q = batch[i];
      processed += chunk[i].size();
      q->context += chunk[i].size();
      q->last = next[i];
      ++q->generated;
      ++generated;
      if (q->generated < q->output_len) {
        still.push_back(q);
      } else {
        blocks.Release(q->table);
      }
    }
    active = std::move(still);
  }
  const double secs = Seconds(t0, std::chrono::steady_clock::now());
  PrintThroughputRow("own loop", secs, steps, generated, processed, params, gemm_rate);
  return absl::OkStatus();
}

}  // namespace
}  // namespace mqa::bench
