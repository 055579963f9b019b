// mqabench latency (vLLM's benchmark_latency; mqabench.cc's header comment lists its flags): one
// prefill and output_len - 1 decode steps a timed iteration, a row per combination of the knobs
// asked for, each on the same runner; optionally through the serving engine (--engine), with the
// decode chain's timeline (--chain-timeline) or a CUPTI kernel trace (--kernel-trace).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "benchmarks/chain_timeline.h"
#include "benchmarks/mqabench/common.h"
#include "benchmarks/mqabench/engine_run.h"
#include "benchmarks/mqabench/kernel_trace.h"
#include "kernels/ops.h"
#include "kernels/paged_attention_cuda.h"

namespace mqa::bench {
namespace {

// --tail-timeline: the last decode step's QKV launch with the tail attention in `layer`
// (GemmTailAttention::stamps): each event's min / median / max over the GEMM CTAs and over the
// attention CTAs, in us from the launch's first CTA start.
absl::Status PrintTailTimeline(GptBigCode& model, int layer) {
  ASSIGN_OR_RETURN(const std::vector<unsigned long long> w, model.tail_timeline());
  const int ctas = static_cast<int>(w.size() / kGemmTailStampWords);
  const auto stamps_of = [&w](int c) { return &w[static_cast<size_t>(c) * kGemmTailStampWords]; };
  unsigned long long t0 = 0;
  int counts[3] = {0, 0, 0};
  for (int c = 0; c < ctas; ++c) {
    const unsigned long long* s = stamps_of(c);
    if (s[kTailStampKind] != 1 && s[kTailStampKind] != 2) continue;
    ++counts[s[kTailStampKind]];
    if (s[kTailStampStart] != 0 && (t0 == 0 || s[kTailStampStart] < t0)) t0 = s[kTailStampStart];
  }
  if (counts[1] + counts[2] == 0) {
    std::printf("  tail timeline of layer %d: no tail attention recorded\n", layer);
    return absl::OkStatus();
  }
  std::printf(
      "  tail timeline of layer %d (last decode step; %d GEMM CTAs, %d attention CTAs): us from "
      "the launch's first CTA start, min / median / max\n",
      layer, counts[1], counts[2]);
  static const char* const kNames[kTailStampEnd + 1] = {
      "start",  "PDL wait done", "dot done",      "K / V in", "q / k / v words in",
      "scores", "warps merged",  "splits merged", "end"};
  for (int kind = 1; kind <= 2; ++kind) {
    std::string line = kind == 1 ? "    GEMM CTAs:     " : "    attention CTAs:";
    for (int e = kTailStampStart; e <= kTailStampEnd; ++e) {
      std::vector<double> us;
      for (int c = 0; c < ctas; ++c) {
        const unsigned long long* s = stamps_of(c);
        if (s[kTailStampKind] == static_cast<unsigned long long>(kind) && s[e] >= t0 && s[e] != 0) {
          us.push_back(static_cast<double>(s[e] - t0) * 1e-3);
        }
      }
      if (us.empty()) continue;
      const auto [lo, hi] = std::minmax_element(us.begin(), us.end());
      absl::StrAppend(&line, " ", kNames[e], " ",
                      absl::StrFormat("%.2f %.2f %.2f", *lo, Median(us), *hi), ";");
    }
    std::printf("%s\n", line.c_str());
  }
  // The medians above are over different CTAs each: the attention CTAs' own steps, each CTA's
  // time from one of its recorded events to its next.
  std::string line = "    attention CTAs, each from its previous event (median / max):";
  for (int e = kTailStampPdlDone + 1; e <= kTailStampEnd; ++e) {
    std::vector<double> us;
    for (int c = 0; c < ctas; ++c) {
      const unsigned long long* s = stamps_of(c);
      if (s[kTailStampKind] != 2 || s[e] == 0) continue;
      int prev = e - 1;
      while (prev > kTailStampStart && s[prev] == 0) --prev;
      if (s[prev] != 0 && s[e] >= s[prev]) us.push_back(static_cast<double>(s[e] - s[prev]) * 1e-3);
    }
    if (us.empty()) continue;
    absl::StrAppend(
        &line, " ", kNames[e], " ",
        absl::StrFormat("%.2f %.2f", Median(us), *std::max_element(us.begin(), us.end())), ";");
  }
  std::printf("%s\n", line.c_str());
  return absl::OkStatus();
}

// --chain-timeline: the last decode step's chains of `layers`, each beside where the previous
// layer's chain ended (what lies between them: the attention, or with the attention inside, the
// kernel handover alone).
absl::Status PrintModelChainTimelines(GptBigCode& model, const Setup& s,
                                      const std::vector<int>& layers, bool attention_inside) {
  ASSIGN_OR_RETURN(const std::vector<unsigned long long> words, model.decode_chain_timeline());
  const size_t stride = words.size() / s.config.n_layer;
  const int grid = static_cast<int>(stride / kDecodeChainTimelineWords);
  const ModelConfig& c = s.config;
  const int64_t e = c.n_embd, inner = c.n_inner, bytes = DTypeSize(s.dtype);
  std::vector<std::string> names = {"attn.c_proj", "ln_2 + c_fc", "mlp.c_proj", "ln_1 + c_attn"};
  std::vector<double> ideal = {static_cast<double>(e * c.n_head * c.head_dim()),
                               static_cast<double>(inner * e), static_cast<double>(e * inner),
                               static_cast<double>(c.qkv_rows() * e)};
  for (double& u : ideal) u *= bytes / s.copy_bw * 1e6;
  if (attention_inside) {
    names.insert(names.begin(), "attention");
    ideal.insert(ideal.begin(), 0.0);
  }
  for (int l : layers) {
    bench::ChainTimelineView v;
    v.call = words.data() + l * stride;
    v.previous = words.data() + (l - 1) * stride;
    v.previous_name = "layer l - 1's chain";
    v.grid = grid;
    v.phases = names;
    v.ideal_us = ideal;
    v.head_ctas = attention_inside ? static_cast<int>(c.n_head) : 0;  // one rank: every head
    if (v.call[kChainGlobalStart] == 0 || v.previous[kChainGlobalStart] == 0) {
      std::printf("  chain timeline of layer %d: no chain recorded\n", l);
      continue;
    }
    // The grid ran with the SM count less any spare SMs: CTAs past it have no stamps.
    while (v.grid > 0 &&
           v.call[(v.grid - 1) * kDecodeChainTimelineWords + kChainGlobalStart] == 0) {
      --v.grid;
    }
    bench::PrintChainTimeline(absl::StrCat("  chain timeline of layer ", l, " (last decode step)"),
                              v);
  }
  return absl::OkStatus();
}

// "  Avg latency: ..." as vLLM's benchmark_latency prints it, over the timed iterations.
void PrintAvgLatency(const std::vector<double>& latencies) {
  double avg = 0;
  for (double l : latencies) avg += l;
  avg /= latencies.size();
  std::printf("  Avg latency: %.4f seconds (min %.4f, max %.4f over %zu iters)\n", avg,
              *std::min_element(latencies.begin(), latencies.end()),
              *std::max_element(latencies.begin(), latencies.end()), latencies.size());
}

// --engine: the latency workload (batch_size prompts of input_len random tokens, output_len
// greedy tokens each, ignore_eos) queued at once into the serving engine, which runs it as the
// server would (scheduler, block manager, device sampling, output processing): the first step
// is the prefill, the rest are decode steps. Prints the same figures as the own loop's rows plus
// where a decode step's time goes: the GPU (the decode graph's events), the runner's host side
// (step checks, inputs, launch, token copy) and the engine's (everything outside the runner).
absl::Status EngineLatencyRow(const Flags& f, Setup& s, double floor_ms, bool lookahead) {
  GptBigCodeRunner& r = *s.runner;
  const LookaheadStats lookahead_before = r.lookahead_stats();
  EngineOptions options;
  options.decode_lookahead = lookahead;
  options.max_num_seqs = std::max(256, f.batch_size);
  options.max_num_batched_tokens = std::max(2048, f.batch_size * f.input_len);
  options.max_model_len = f.input_len + f.output_len;
  options.speculative.num_speculative_tokens = f.speculative;
  std::mt19937 rng(f.seed + 11);
  int64_t drafts = 0, accepted = 0, decode_steps = 0;
  std::vector<double> latencies, prefills, steps, runner_steps, gpu_steps;
  for (int iter = 0; iter < f.num_iters_warmup + f.num_iters; ++iter) {
    std::vector<EngineRequestSpec> requests(f.batch_size);
    for (EngineRequestSpec& q : requests) {
      q.prompt.resize(f.input_len);
      for (int32_t& t : q.prompt) t = rng() % s.config.vocab_size;
      q.max_tokens = f.output_len;
    }
    // (With lookahead the next step's launch records the graph's events again before this
    // step's are read: no GPU time.)
    std::function<double()> gpu_ms;
    if (!lookahead) gpu_ms = [&] { return r.model().last_graph_ms(); };
    ASSIGN_OR_RETURN(EngineRunStats st, RunThroughEngine(&r, options, requests, gpu_ms));
    if (iter < f.num_iters_warmup) continue;
    drafts += st.spec_draft_tokens;
    accepted += st.spec_accepted_tokens;
    decode_steps += static_cast<int64_t>(st.step_s.size()) - 1;
    if (f.speculative == 0 && st.step_s.size() != static_cast<size_t>(f.output_len)) {
      return absl::InternalError(absl::StrCat("the engine ran ", st.step_s.size(), " steps for ",
                                              f.output_len, " tokens: the prompts were chunked"));
    }
    latencies.push_back(st.seconds);
    prefills.push_back(st.step_s[0]);
    for (size_t i = 1; i < st.step_s.size(); ++i) {
      steps.push_back(st.step_s[i]);
      runner_steps.push_back(st.runner_s[i]);
      if (st.gpu_ms[i] >= 0) gpu_steps.push_back(st.gpu_ms[i]);
    }
  }
  const double step_ms = Median(steps) * 1e3, runner_ms = Median(runner_steps) * 1e3;
  std::printf(
      "latency %s (engine%s): batch %d, in %d, out %d, %s, the model's knobs of the row above%s\n",
      f.model.c_str(), lookahead ? ", decode lookahead" : "", f.batch_size, f.input_len,
      f.output_len, std::string(DTypeName(s.dtype)).c_str(),
      lookahead ? LookaheadSummary(lookahead_before, r.lookahead_stats()).c_str() : "");
  PrintAvgLatency(latencies);
  if (f.speculative > 0) {
    std::printf(
        "  speculative decoding, up to %d drafts a step: %lld decode steps for %lld tokens "
        "after the first, %lld of %lld drafts kept\n",
        f.speculative, static_cast<long long>(decode_steps),
        static_cast<long long>(int64_t{f.num_iters} * f.batch_size * (f.output_len - 1)),
        static_cast<long long>(accepted), static_cast<long long>(drafts));
  }
  std::printf(
      "  prefill step %.2f ms; decode step median %.3f ms (weights floor %.3f ms, %.0f%% of floor "
      "speed): inside the runner %.3f ms, the engine's own host work %.3f ms = %.1f%% of the "
      "step\n",
      Median(prefills) * 1e3, step_ms, floor_ms, 100.0 * floor_ms / step_ms, runner_ms,
      step_ms - runner_ms, 100.0 * (step_ms - runner_ms) / step_ms);
  if (!gpu_steps.empty()) {
    const double g = Median(gpu_steps);
    std::printf(
        "  decode graph on the GPU: median %.3f ms; host work the GPU waited for: %.3f ms = "
        "%.1f%% of the step (the runner's %.3f ms, the engine's %.3f ms)\n",
        g, step_ms - g, 100.0 * (step_ms - g) / step_ms, runner_ms - g, step_ms - runner_ms);
  }
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace

absl::Status Latency(const Flags& f) {
  ASSIGN_OR_RETURN(const LatencyPlan plan, PlanLatency(f, kNumPagedAttentionVariants));
  const int bs = f.block_size;
  const int per_seq = (f.input_len + f.output_len + f.verify_tokens + bs - 1) / bs;
  ASSIGN_OR_RETURN(Setup s, MakeSetup(f, f.batch_size * per_seq + 8,
                                      std::max<int64_t>(2048, int64_t(f.batch_size) * f.input_len),
                                      std::max(256, f.batch_size * (1 + f.verify_tokens))));
  GptBigCodeRunner& r = *s.runner;
  const double floor_ms = s.weight_bytes / s.copy_bw * 1e3;
  for (int l : plan.timeline_layers) {
    if (l >= s.config.n_layer) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chain-timeline ", f.chain_timeline, ": layers 1 .. n_layer - 1"));
    }
  }
  if (f.tail_timeline >= s.config.n_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tail-timeline ", f.tail_timeline, ": layers 0 .. n_layer - 1"));
  }
  const std::vector<int>& timeline_layers = plan.timeline_layers;
  std::mt19937 rng(f.seed + 1);
  absl::Status first_failure;  // returned after every row ran
  int row_index = -1;
  for (const auto& [variant, fast, autotune, small, async, chain, engine, attn, skip, wm, splits,
                    tn] : plan.runs) {
    ++row_index;
    r.model().set_attention(attn, wm, splits, tn);
    const bool attention_row = chain == "at";
    const bool shares_row = chain == "shares";  // auto with calibrated per-SM shares
    int ring_kib = 0, ring_inflight = -1;
    const bool ring_row = ParseRingForm(chain, &ring_kib, &ring_inflight);
    const int tailr_mask = TailReleaseMask(chain);  // GptBigCodeOptions::tail_release_early
    const bool tailr = tailr_mask >= 0;
    r.model().set_decode_chain(
        chain != "off",
        chain[0] == 's' && !shares_row ? std::atoi(chain.c_str() + 1)
                                       : GptBigCodeOptions().decode_chain_spare_sms,
        attention_row   ? 1
        : chain == "na" ? 0
                        : GptBigCodeOptions().decode_chain_attention,
        chain[0] == 'f' && chain.rfind("fm", 0) != 0 ? std::atoi(chain.c_str() + 1)
        : ring_row                                   ? ring_inflight
                   : GptBigCodeOptions().decode_chain_max_inflight,
        IsAutoChainRow(chain) ? GptBigCodeOptions().decode_chain_min_layer_bytes : 0);
    r.model().set_decode_chain_stage_bytes(ring_row ? ring_kib * 1024
                                                    : GptBigCodeOptions().decode_chain_stage_bytes);
    r.model().set_decode_chain_early_release(chain != "late");
    r.model().set_attention_release_early(chain == "rel");
    const bool tailp = chain == "tailp";  // tailc with attn.c_proj in the QKV launch
    r.model().set_tail_attention(chain == "tail" || chain == "tailc" || tailp || tailr ? true
                                 : chain == "notail"                                   ? false
                                                     : GptBigCodeOptions().tail_attention);
    r.model().set_tail_attention_proj(tailp ? true : GptBigCodeOptions().tail_attention_proj);
    r.model().set_tail_cluster_merge(chain == "tailc" || tailp || tailr ? true
                                     : chain == "tail"                  ? false
                                                       : GptBigCodeOptions().tail_cluster_merge);
    r.model().set_tail_release_early(tailr ? tailr_mask : GptBigCodeOptions().tail_release_early);
    r.model().set_decode_chain_ll_inputs(chain == "ll" ? 1
                                         : chain == "nl"
                                             ? 0
                                             : GptBigCodeOptions().decode_chain_ll_inputs);
    r.model().set_decode_chain_head_hold(chain == "hq"    ? 1
                                         : chain == "hq2" ? 2
                                         : chain == "hq0"
                                             ? 0
                                             : GptBigCodeOptions().decode_chain_head_hold);
    r.model().set_decode_chain_mma_fold(chain == "tc" || chain == "otc" ? 1
                                        : chain == "cc" || chain == "occ"
                                            ? 0
                                            : GptBigCodeOptions().decode_chain_mma_fold);
    r.model().set_decode_chain_half_fold(chain == "hf" || chain == "ohf" ? 1
                                         : chain == "hf0" || chain == "ohf0"
                                             ? 0
                                             : GptBigCodeOptions().decode_chain_half_fold);
    const bool fm = chain.rfind("fm", 0) == 0;
    RETURN_IF_ERROR(r.model().set_decode_chain_fused_mlp(
        fm ? true : GptBigCodeOptions().decode_chain_fused_mlp,
        fm && chain.size() > 2 ? std::atoi(chain.c_str() + 2)
                               : GptBigCodeOptions().decode_chain_fused_pool));
    r.model().set_decode_chain_steal_chunks(chain[0] == 'w'
                                                ? std::atoi(chain.c_str() + 1)
                                                : GptBigCodeOptions().decode_chain_steal_chunks);
    const int64_t chains_before = r.model().decode_chain_runs();
    const int64_t chain_attentions_before = r.model().decode_chain_attention_runs();
    const int64_t tails_before = r.model().tail_attention_runs();
    const int64_t projs_before = r.model().tail_attention_proj_runs();
    r.model().set_decode_chain_sm_shares(nullptr);
    if (shares_row) {  // 32 steps at the row's mid context, untimed
      const absl::StatusOr<DecodeChainShareCalibration> cal =
          r.CalibrateDecodeChainShares(32, f.input_len + f.output_len / 2);
      std::printf("  decode chain SM shares: %s\n",
                  cal.ok() ? cal->Summary().c_str()
                           : absl::StrCat("none (", cal.status().ToString(), ")").c_str());
    }
    if (!timeline_layers.empty()) {
      RETURN_IF_ERROR(r.model().set_decode_chain_timeline(chain != "off"));
    }
    if (f.tail_timeline >= 0) RETURN_IF_ERROR(r.model().set_tail_timeline(f.tail_timeline));
    r.model().set_skip_ops(skip.second);
    // Skipped ops leave garbage logits: keep the fed tokens valid ids.
    auto valid_ids = [&, bits = skip.second](std::vector<int32_t>& ids) {
      if (bits == 0) return;
      for (int32_t& t : ids) t = std::clamp<int32_t>(t, 0, s.config.vocab_size - 1);
    };
    const int rows = variant == "skinny1" ? 1 : variant == "skinny4" ? 4 : 2;
    r.model().set_skinny_gemm(variant != "cublaslt", rows);
    const int stage_kib = SkinnyStageKib(variant);
    int tma_boxes = 0, tma_hints = -1;
    const bool tma = ParseTmaVariant(variant, &tma_boxes, &tma_hints);
    r.model().set_gemm_kernels(variant == "splitk" || variant == "splitk+tc",
                               tma                                         ? 2
                               : variant == "tc" || variant == "splitk+tc" ? 1
                                                                           : 0,
                               variant == "skinnyd" || variant == "skinnydh" ||
                                   variant == "skinnydf" || variant == "skinnydo" ||
                                   variant == "skinnyde" || variant == "skinnydn" || tma ||
                                   stage_kib >= 0,
                               variant == "skinnydh"   ? 1
                               : variant == "skinnydf" ? 0
                                                       : -1);
    r.model().set_gemm_stream_tma_knobs(tma_boxes, tma_hints);
    r.model().set_gemm_stage_bytes(stage_kib >= 0 ? stage_kib * 1024
                                                  : GptBigCodeOptions().gemm_stage_bytes);
    r.model().set_gemm_occupancy(variant == "skinnydo" || GptBigCodeOptions().gemm_occupancy);
    r.model().set_gemm_early_epilogue(variant == "skinnyde");
    r.model().set_gemm_evict_first(variant != "skinnydn");
    RETURN_IF_ERROR(r.model().set_fast_paths(
        fast != "off" && fast != "fuse", fast == "fuse" || fast == "pdl+fuse", fast == "pdl+ln"));
    r.model().set_gemm_autotune(autotune != "off",
                                autotune == "decode" ? kDecodeGemmAutotuneMaxM : 0);
    r.model().set_small_kernels(small == "on", small == "on");
    if (autotune == "decode") {
      // As the server does (--cuda-graph-warmup, --gemm-autotune decode): the decode shapes tuned
      // while their graphs are warmed up, then no other shape.
      RETURN_IF_ERROR(r.WarmUpDecodeGraphs(f.batch_size, f.input_len + f.output_len).status());
    }
    std::vector<double> latencies, prefills, steps, graph_ms;
    absl::Status failed;
    r.model().set_time_graphs(true);
    if (engine == "on" || engine == "la") {
      const absl::Status st = EngineLatencyRow(f, s, floor_ms, engine == "la");
      if (!st.ok()) {
        std::printf("latency %s (engine): FAILED %s\n", f.model.c_str(), st.ToString().c_str());
        std::fflush(stdout);
        if (first_failure.ok()) first_failure = st;
      }
      continue;
    }
    // --kernel-trace: one more iteration, traced and not timed.
    const int timed_iters = f.num_iters_warmup + f.num_iters;
    const int all_iters = timed_iters + (f.kernel_trace.empty() ? 0 : 1);
    StepTraceRecorder tracer;
    absl::Status trace_status;  // a tracing failure ends the trace, not the row
    bool tracing = false;
    auto end_traced_step = [&] {
      if (tracing && !(trace_status = tracer.EndStep()).ok()) tracing = false;
    };
    for (int iter = 0; iter < all_iters && failed.ok(); ++iter) {
      const bool traced = iter == timed_iters;
      const bool measured = iter >= f.num_iters_warmup && !traced;
      if (traced) tracing = (trace_status = tracer.Start()).ok();
      Blocks blocks(r.num_kv_blocks(), bs);
      std::vector<Seq> seqs(f.batch_size);
      std::vector<Seq*> ptrs;
      std::vector<std::vector<int32_t>> chunk;
      for (Seq& q : seqs) {
        q.prompt.resize(f.input_len);
        for (int32_t& t : q.prompt) t = rng() % s.config.vocab_size;
        if (!blocks.Reserve(q.table, f.input_len + f.output_len + f.verify_tokens)) {
          return absl::InternalError("KV pool too small");
        }
        ptrs.push_back(&q);
        chunk.push_back(q.prompt);
      }
      std::vector<RowSamplingParams> greedy(f.batch_size);
      std::vector<double> iter_steps;
      const auto t0 = std::chrono::steady_clock::now();
      auto first = r.ExecuteAndSample(MakeStep(ptrs, chunk, bs), greedy);
      if (!first.ok()) {  // one knob failing must not hide the other rows
        failed = first.status();
        break;
      }
      std::vector<int32_t> next = *std::move(first);
      valid_ids(next);
      const auto t1 = std::chrono::steady_clock::now();
      end_traced_step();
      for (Seq& q : seqs) q.context = f.input_len;
      if (async == "on") {
        // Step t + 1 is launched (tokens fed on the device) before step t's tokens are read:
        // a step's time is the interval between two collections.
        auto a = std::chrono::steady_clock::now();
        for (int step = 1; step <= f.output_len && failed.ok(); ++step) {
          if (step < f.output_len) {
            for (int i = 0; i < f.batch_size; ++i) chunk[i] = {step == 1 ? next[i] : 0};
            failed =
                r.LaunchSample(MakeStep(ptrs, chunk, bs), greedy, step == 1 ? 0 : f.batch_size);
            for (Seq& q : seqs) ++q.context;
          }
          if (step > 1 && failed.ok()) {
            auto out = r.CollectSample();
            if (!out.ok()) {
              failed = out.status();
              break;
            }
            next = *std::move(out);
            const auto b = std::chrono::steady_clock::now();
            if (step > 2) iter_steps.push_back(Seconds(a, b));
            a = b;
          }
        }
        while (r.model().CollectSample().ok()) {  // drain after a failure
        }
      } else {
        // --verify-tokens K: each step also brings K draft tokens (greedy: the model's own token
        // at each, so that they are valid ids) with K + 1 logits rows a sequence; the sequence
        // advances by one, as when every draft is rejected.
        const int rows_per_seq = 1 + f.verify_tokens;
        std::vector<RowSamplingParams> step_params(static_cast<size_t>(f.batch_size) *
                                                   rows_per_seq);
        std::vector<int32_t> drafts(step_params.size(), 0);
        for (int step = 1; step < f.output_len; ++step) {
          for (int i = 0; i < f.batch_size; ++i) {
            chunk[i] = {next[i]};
            for (int d = 1; d <= f.verify_tokens; ++d)
              chunk[i].push_back(drafts[i * rows_per_seq + d - 1]);
          }
          const auto a = std::chrono::steady_clock::now();
          auto out = r.ExecuteAndSample(MakeStep(ptrs, chunk, bs, f.verify_tokens > 0),
                                        f.verify_tokens > 0 ? step_params : greedy);
          if (!out.ok()) {
            failed = out.status();
            break;
          }
          if (f.verify_tokens > 0) {
            drafts = *out;
            next.resize(f.batch_size);
            for (int i = 0; i < f.batch_size; ++i) next[i] = drafts[i * rows_per_seq];
          } else {
            next = *std::move(out);
          }
          valid_ids(next);
          iter_steps.push_back(Seconds(a, std::chrono::steady_clock::now()));
          if (const double g = r.model().last_graph_ms(); g >= 0 && measured) {
            graph_ms.push_back(g);
          }
          end_traced_step();
          for (Seq& q : seqs) ++q.context;
        }
      }
      if (!failed.ok()) break;
      const auto t2 = std::chrono::steady_clock::now();
      if (measured) {
        latencies.push_back(Seconds(t0, t2));
        prefills.push_back(Seconds(t0, t1));
        steps.insert(steps.end(), iter_steps.begin(), iter_steps.end());
      }
    }
    if (!failed.ok()) {
      std::printf("latency %s: batch %d, gemm %s, fast %s, autotune %s: FAILED %s\n",
                  f.model.c_str(), f.batch_size, variant.c_str(), fast.c_str(), autotune.c_str(),
                  failed.ToString().c_str());
      std::fflush(stdout);
      if (first_failure.ok()) first_failure = failed;
      continue;
    }
    const double step_ms = Median(steps) * 1e3;
    std::printf(
        "latency %s: batch %d, in %d, out %d%s, %s, gemm %s, fast %s, autotune %s, small "
        "%s, async %s, attention variant %d (warps_m %d, splits %d, tile tokens %d), skip "
        "%s, cuda graphs %s\n",
        f.model.c_str(), f.batch_size, f.input_len, f.output_len,
        f.verify_tokens > 0
            ? absl::StrCat(", check steps of 1 + ", f.verify_tokens, " tokens").c_str()
            : "",
        std::string(DTypeName(s.dtype)).c_str(), variant.c_str(), fast.c_str(), autotune.c_str(),
        small.c_str(), async.c_str(), attn, wm, splits, tn, skip.first.c_str(),
        f.cuda_graphs ? "on" : "off");
    PrintAvgLatency(latencies);
    std::printf(
        "  prefill %.2f ms; decode step median %.3f ms (weights floor %.3f ms = %.2f GB / "
        "%.2f TB/s copy; %.0f%% of floor speed; effective %.2f TB/s)\n",
        Median(prefills) * 1e3, step_ms, floor_ms, s.weight_bytes / 1e9, s.copy_bw / 1e12,
        100.0 * floor_ms / step_ms, s.weight_bytes / (step_ms * 1e-3) / 1e12);
    if (!graph_ms.empty()) {
      // What the host adds to a step: preparing and staging the next step's indices, the launch,
      // the sampling kernel and the token copy back, all while the GPU waits.
      const double g = Median(graph_ms);
      std::printf(
          "  decode graph on the GPU: median %.3f ms (%zu launches timed by events); the "
          "rest of the step (host preparation, launch, sampling, token copy) %.3f ms = "
          "%.1f%% of the step\n",
          g, graph_ms.size(), step_ms - g, 100.0 * (step_ms - g) / step_ms);
    }
    std::printf(
        "  CUDA graphs captured: %d; decode chain %s (%lld chain kernels launched or "
        "captured, %lld with the attention inside); %lld QKV GEMMs with the tail attention "
        "(%lld with attn.c_proj too)\n",
        r.model().num_cuda_graphs(), chain.c_str(),
        static_cast<long long>(r.model().decode_chain_runs() - chains_before),
        static_cast<long long>(r.model().decode_chain_attention_runs() - chain_attentions_before),
        static_cast<long long>(r.model().tail_attention_runs() - tails_before),
        static_cast<long long>(r.model().tail_attention_proj_runs() - projs_before));
    if (autotune != "off") std::printf("  %s\n", r.model().gemm_autotune_summary().c_str());
    if (!timeline_layers.empty() && chain != "off") {
      RETURN_IF_ERROR(PrintModelChainTimelines(r.model(), s, timeline_layers,
                                               r.model().last_decode_chain_had_attention()));
    }
    if (f.tail_timeline >= 0) RETURN_IF_ERROR(PrintTailTimeline(r.model(), f.tail_timeline));
    if (!f.kernel_trace.empty()) {
      if (tracing) {
        trace_status = tracer.Finish(absl::StrCat(f.kernel_trace, "-row", row_index),
                                     graph_ms.empty() ? -1.0 : Median(graph_ms));
      }
      if (!trace_status.ok()) {
        std::printf("  kernel trace: FAILED %s\n", trace_status.ToString().c_str());
        if (first_failure.ok()) first_failure = trace_status;
      }
    }
  }
  return first_failure;
}

}  // namespace mqa::bench
