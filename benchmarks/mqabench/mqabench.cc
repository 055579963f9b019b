// mqabench: end-to-end GPU benchmarks of GptBigCodeRunner with dummy weights made on the device.
//
//   mqabench latency --model configs/starcoder --batch-size 1 --input-len 128 --output-len 128
//       [--num-iters 3] [--num-iters-warmup 1] [--load-format dummy] [--dtype float16|bfloat16]
//       [--block-size 16] [--no-cuda-graphs] [--gemm skinny|skinny1|skinny4|cublaslt|both|all]
//       [--fast off|pdl|fuse|pdl+fuse|all] [--autotune off|on|decode|both|LIST]
//       [--small off|on|both]
//       [--async off|on|both] [--engine off|on|both] [--attn 3[,5...]] [--attn-wm 0[,1...]]
//       [--attn-splits 0[,1...]]
//       [--attn-tn 0[,32,64]]
//       [--skip none,attn,...] [--chain auto|off|on|both|LIST] [--chain-timeline L[,L...]]
//       [--kernel-trace PREFIX]
//     --gemm: also a comma-separated list of skinny, skinny1, skinny4, cublaslt, splitk (split-K
//     skinny kernel, m <= 8), tc (tensor-core weight-streaming kernel, 8 < m <= 64), splitk+tc,
//     skinnyd (skinny with the deep unroll for narrow m = 1 GEMMs: the default, as in the runner;
//     "skinny" is without it), skinnydsN (skinnyd with N KiB of each weight row staged in shared
//     memory before the PDL wait; skinnyd stages the model's default, 16), skinnydo (skinnyd with
//     more resident CTAs an SM: GptBigCodeOptions::gemm_occupancy).
//     --fast: the decode launch knobs (GptBigCodeOptions::pdl, fuse_small_kernels); "all" runs
//     off, pdl, fuse and pdl+fuse one after the other on the same runner (one row each).
//     --autotune: GptBigCodeOptions::gemm_autotune (cuBLASLt algorithm timing per GEMM shape);
//     "decode": only shapes of at most kDecodeAutotuneMaxM rows (gemm_autotune_max_m); "both"
//     runs off, then on; a comma list (e.g. off,decode,on) one row each, on the same runner (with
//     the tuning summary).
//     --small off|on|both: GptBigCodeOptions::ln_registers and greedy_cluster together (the
//     register-resident layer norm and the cluster argmax; default on, as in the runner); "both"
//     gives one row each.
//     --async off|on|both: on = GptBigCodeRunner::LaunchSample / CollectSample, step t + 1
//     launched (its tokens fed from step t's on the device) before step t's tokens are read back,
//     so the host's step preparation overlaps the GPU; "both" gives one row each.
//     --engine off|on|both: on = the workload queued into the serving engine (runtime/engine.h:
//     scheduler, block manager, device sampling, output processing) and stepped as the server
//     steps it, with a decode step's time split into the GPU's, the runner's host work and the
//     engine's own; "both" gives mqabench's own loop's row, then the engine's (same runner).
//     throughput takes it too (default off: mqabench's own loop).
//     --attn: GptBigCodeOptions::attention_variant (kernels/paged_attention_cuda.h), a comma list
//     gives one row each (3: merge kernel; 5: in-kernel merge by the last split to finish; 6: 5
//     for few short splits, else 3; 9: 6 with early KV copies and the cluster merge for grids of
//     at most one CTA per SM; 11: the wgmma kernel, 9 for shapes it does not take; 13: 11 with
//     TMA copies on short decode splits; 14, the default: 13 with the decode step's KV-cache
//     write fused into its TMA kernel).
//     --attn-wm: PagedAttentionTuning::warps_m of the model's attention (0: automatic; 1, 2, 3, 4
//     or 8 force that decode layout), a comma list gives one row each.
//     --attn-splits: PagedAttentionTuning::num_splits of the model's attention (0: automatic),
//     for every attention call of the run (prefill too); a comma list gives one row each.
//     --attn-tn: PagedAttentionTuning::hopper_tile_tokens (variant 11's KV tokens a stage; 0:
//     automatic, 32 for decode and 64 for prefill; 32 or 64 force it for every call), one row each.
//     --skip: a comma list of rows, each "none" or a '+'-joined set of ln, kvw, attn, gemm, act:
//     the ops left out of every step of that row (OpContext::skip; the outputs are garbage, the
//     time is what the rest of the step costs on the GPU, launch gaps and overlaps included).
//     --chain: GptBigCodeOptions::decode_chain (batch-1 decode: each layer after its attention as
//     one persistent weight-streaming kernel, kernels/decode_chain.h); a comma list of off / on /
//     auto (e.g. off,auto,off,auto) gives one row each, on the same runner; rows print how many
//     chains ran. auto (the default) is the model's default: on for layers of at least
//     decode_chain_min_layer_bytes; on runs it on every layer; sN is on with N SMs left to the
//     attention (GptBigCodeOptions::decode_chain_spare_sms); at is on with the attention as the
//     chain's first phase (decode_chain_attention); fN is on with at most N ring stages in flight
//     (decode_chain_max_inflight); late is auto with the chain released by the attention only once
//     it is done (decode_chain_early_release off); wN is auto with each CTA's last N ring-stage
//     chunks of a phase dealt at run time (work stealing, decode_chain_steal_chunks; w0: every row
//     fixed in advance, the default; only phases of at least 16 chunks a CTA steal); kKfN is on
//     with ring stages of K KiB (decode_chain_stage_bytes, K a multiple of 8) and at most N of them
//     requested ahead (f0: the whole ring), e.g. k16f3; ll and nl are auto with the LL boundaries
//     (decode_chain_ll_inputs) on and off; tc and cc are auto with the tiled tensor-core fold and
//     the row-run fp32 fold on the CUDA cores (decode_chain_mma_fold 1, 0), otc and occ the same
//     with the chain on every layer; hf and ohf are auto and on with the fp16-pair fold
//     (decode_chain_half_fold 1, the default), hf0 and ohf0 with the fp32 fold; fm is auto with
//     the fused MLP (decode_chain_fused_mlp: mlp.c_proj streamed from a transposed copy right
//     after c_fc, no grid barrier between them), fmN the same with N stages a CTA dealt by
//     ticket (decode_chain_fused_pool; fm: the default).
//     --chain-timeline: every chain records its timeline (GptBigCode::set_decode_chain_timeline);
//     after each row, the last decode step's chains of layers L are printed (event min / median /
//     max over the CTAs, benchmarks/chain_timeline.h) with where the previous layer's chain
//     ended: what a layer costs between its chains (the attention, the kernel handover).
//     --kernel-trace PREFIX: after a row's timed iterations, one more, untimed, with every kernel
//     traced through CUPTI (kernel_trace.h): the prefill's and the decode steps' kernels grouped by
//     name and grid, each group's time beyond the kernels before it ("exposed") and the idle gaps
//     (benchmarks/kernel_timeline.h), medians over the decode steps; every kernel position to
//     PREFIX-rowN-prefill.csv / -decode.csv. With --async off and --engine off only.
//     vLLM benchmark_latency's flags: one prefill of batch x input_len prompt tokens, then
//     output_len - 1 decode steps (output_len tokens in all), greedy on the device. Prints the
//     average latency, the prefill time, the median decode step beside the weights-bandwidth floor
//     (weight bytes / the device-to-device copy bandwidth measured in this run).
//
//   mqabench throughput --model configs/starcoder [--num-prompts 500] [--max-num-seqs 256]
//       [--max-num-batched-tokens 4096] [--seed 0] [--engine off|on|both]
//     Many requests of mixed lengths: prompt and output lengths from slices of this repository's
//     source files (bytes as token ids: code-shaped lengths), continuous batching (prefills of
//     whole prompts alongside the running decodes). Prints output tokens/s and the fraction of
//     the compute roofline (2 x params FLOP per processed token over the GEMM rate measured here).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "benchmarks/chain_timeline.h"
#include "benchmarks/mqabench/device_fill.h"
#include "benchmarks/mqabench/engine_run.h"
#include "benchmarks/mqabench/kernel_trace.h"
#include "kernels/ops.h"
#include "kernels/paged_attention_cuda.h"
#include "model/config.h"
#include "model/gpt_bigcode_runner.h"
#include "parallel/collectives.h"

namespace mqa::bench {
namespace {

// --autotune decode: shapes of at most this many rows (the largest decode batch the throughput
// mode schedules; prefill chunks are larger).
constexpr int kDecodeAutotuneMaxM = 256;

struct Flags {
  std::string mode;
  std::string model = "configs/starcoder";
  int batch_size = 1, input_len = 128, output_len = 128, num_iters = 3, num_iters_warmup = 1;
  std::string load_format = "dummy", dtype = "float16", gemm = "skinnyd";  // the runner's default
  int block_size = 16;
  bool cuda_graphs = true;
  std::string fast = "pdl";  // the runner's default
  std::string autotune = "off";
  std::string small = "on";  // the runner's default
  std::string async = "off";
  std::string engine = "off";  // off: mqabench's own step loop; on: the serving engine; both
  std::string chain = "auto";
  std::string chain_timeline;  // comma list of layers (empty: off)
  std::string kernel_trace;    // CSV path prefix (empty: off)
  std::string attn =
      "18";  // comma list of PagedAttentionTuning variants (18: the runner's default)
  std::string skip = "none";      // comma list of op sets left out (timing only)
  std::string attn_wm = "0";      // comma list of attention warps_m (0: automatic)
  std::string attn_splits = "0";  // comma list of attention split counts (0: automatic)
  std::string attn_tn = "0";      // comma list of variant 11's KV tokens a stage (0: automatic)
  int num_prompts = 500, max_num_seqs = 256, max_num_batched_tokens = 4096;
  uint64_t seed = 0;
};

// The --chain form kKfN: K KiB ring stages (a positive multiple of 8), at most N requested ahead.
bool ParseRingForm(const std::string& row, int* kib, int* inflight) {
  const size_t f = row.find('f');
  if (row.size() < 4 || row[0] != 'k' || f == std::string::npos) return false;
  return absl::SimpleAtoi(row.substr(1, f - 1), kib) && *kib > 0 && *kib % 8 == 0 &&
         absl::SimpleAtoi(row.substr(f + 1), inflight) && *inflight >= 0;
}

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  if (argc < 2) return absl::InvalidArgumentError("usage: mqabench latency|throughput [flags]");
  f.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(a, " needs a value"));
      return std::string(argv[++i]);
    };
    auto as_int = [&](int* out) -> absl::Status {
      ASSIGN_OR_RETURN(std::string v, value());
      *out = std::atoi(v.c_str());
      return absl::OkStatus();
    };
    if (a == "--model") {
      ASSIGN_OR_RETURN(f.model, value());
    } else if (a == "--batch-size") {
      RETURN_IF_ERROR(as_int(&f.batch_size));
    } else if (a == "--input-len") {
      RETURN_IF_ERROR(as_int(&f.input_len));
    } else if (a == "--output-len") {
      RETURN_IF_ERROR(as_int(&f.output_len));
    } else if (a == "--num-iters") {
      RETURN_IF_ERROR(as_int(&f.num_iters));
    } else if (a == "--num-iters-warmup") {
      RETURN_IF_ERROR(as_int(&f.num_iters_warmup));
    } else if (a == "--load-format") {
      ASSIGN_OR_RETURN(f.load_format, value());
    } else if (a == "--dtype") {
      ASSIGN_OR_RETURN(f.dtype, value());
    } else if (a == "--gemm") {
      ASSIGN_OR_RETURN(f.gemm, value());
    } else if (a == "--fast") {
      ASSIGN_OR_RETURN(f.fast, value());
    } else if (a == "--autotune") {
      ASSIGN_OR_RETURN(f.autotune, value());
    } else if (a == "--small") {
      ASSIGN_OR_RETURN(f.small, value());
    } else if (a == "--async") {
      ASSIGN_OR_RETURN(f.async, value());
    } else if (a == "--engine") {
      ASSIGN_OR_RETURN(f.engine, value());
    } else if (a == "--chain") {
      ASSIGN_OR_RETURN(f.chain, value());
    } else if (a == "--chain-timeline") {
      ASSIGN_OR_RETURN(f.chain_timeline, value());
    } else if (a == "--kernel-trace") {
      ASSIGN_OR_RETURN(f.kernel_trace, value());
    } else if (a == "--attn") {
      ASSIGN_OR_RETURN(f.attn, value());
    } else if (a == "--attn-splits") {
      ASSIGN_OR_RETURN(f.attn_splits, value());
    } else if (a == "--attn-tn") {
      ASSIGN_OR_RETURN(f.attn_tn, value());
    } else if (a == "--attn-wm") {
      ASSIGN_OR_RETURN(f.attn_wm, value());
    } else if (a == "--skip") {
      ASSIGN_OR_RETURN(f.skip, value());
    } else if (a == "--block-size") {
      RETURN_IF_ERROR(as_int(&f.block_size));
    } else if (a == "--no-cuda-graphs") {
      f.cuda_graphs = false;
    } else if (a == "--num-prompts") {
      RETURN_IF_ERROR(as_int(&f.num_prompts));
    } else if (a == "--max-num-seqs") {
      RETURN_IF_ERROR(as_int(&f.max_num_seqs));
    } else if (a == "--max-num-batched-tokens") {
      RETURN_IF_ERROR(as_int(&f.max_num_batched_tokens));
    } else if (a == "--seed") {
      int s = 0;
      RETURN_IF_ERROR(as_int(&s));
      f.seed = s;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
    }
  }
  for (absl::string_view v : absl::StrSplit(f.autotune, ',')) {
    if (v != "off" && v != "on" && v != "decode" && v != "both") {
      return absl::InvalidArgumentError("--autotune off|on|decode|both or a comma list of them");
    }
  }
  if (f.small != "off" && f.small != "on" && f.small != "both") {
    return absl::InvalidArgumentError("--small off|on|both");
  }
  if (f.async != "off" && f.async != "on" && f.async != "both") {
    return absl::InvalidArgumentError("--async off|on|both");
  }
  if (f.engine != "off" && f.engine != "on" && f.engine != "both") {
    return absl::InvalidArgumentError("--engine off|on|both");
  }
  if (f.load_format != "dummy") {
    return absl::InvalidArgumentError("only --load-format dummy (weights made on the GPU)");
  }
  if (f.dtype != "float16" && f.dtype != "bfloat16" && f.dtype != "auto") {
    return absl::InvalidArgumentError("--dtype auto|float16|bfloat16");
  }
  return f;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The KV block bookkeeping of the benchmark's sequences (blocks never shared).
class Blocks {
 public:
  Blocks(int num_blocks, int block_size) : block_size_(block_size) {
    for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
  }
  bool Reserve(std::vector<int32_t>& table, int tokens) {
    while (static_cast<int>(table.size()) * block_size_ < tokens) {
      if (free_.empty()) return false;
      table.push_back(free_.back());
      free_.pop_back();
    }
    return true;
  }
  void Release(std::vector<int32_t>& table) {
    for (int32_t b : table) free_.push_back(b);
    table.clear();
  }
  int free() const { return static_cast<int>(free_.size()); }
  int block_size() const { return block_size_; }

 private:
  int block_size_;
  std::vector<int32_t> free_;
};

struct Seq {
  std::vector<int32_t> prompt;
  int output_len = 0;
  int generated = 0;
  int context = 0;  // tokens in the cache
  int32_t last = 0;
  std::vector<int32_t> table;
};

// One step over `seqs`: seq i brings chunk[i] tokens; logits for each one's last row.
StepInput MakeStep(const std::vector<Seq*>& seqs, const std::vector<std::vector<int32_t>>& chunk,
                   int block_size) {
  StepInput in;
  in.query_start.push_back(0);
  size_t width = 0;
  for (const Seq* s : seqs) width = std::max(width, s->table.size());
  in.max_blocks_per_seq = static_cast<int>(width);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Seq& s = *seqs[i];
    in.seq_ids.push_back(i);
    const int start = s.context;
    for (size_t j = 0; j < chunk[i].size(); ++j) {
      const int p = start + static_cast<int>(j);
      in.token_ids.push_back(chunk[i][j]);
      in.positions.push_back(p);
      in.slot_mapping.push_back(s.table[p / block_size] * block_size + p % block_size);
    }
    in.query_start.push_back(in.num_tokens());
    in.context_lens.push_back(start + static_cast<int>(chunk[i].size()));
    in.logits_rows.push_back(in.num_tokens() - 1);
    for (size_t b = 0; b < width; ++b)
      in.block_tables.push_back(b < s.table.size() ? s.table[b] : 0);
  }
  return in;
}

int64_t WeightBytes(const GptBigCodeWeights& w) {
  int64_t bytes = w.lm_head.nbytes() + w.ln_f_w.nbytes() + w.ln_f_b.nbytes();
  for (const LayerWeights& L : w.layers) {
    for (const Tensor* t :
         {&L.ln_1_w, &L.ln_1_b, &L.c_attn_w, &L.c_attn_b, &L.c_proj_w, &L.c_proj_b, &L.ln_2_w,
          &L.ln_2_b, &L.c_fc_w, &L.c_fc_b, &L.mlp_proj_w, &L.mlp_proj_b}) {
      bytes += t->nbytes();
    }
  }
  return bytes;  // what a decode step reads (wte rows and wpe rows are negligible)
}

struct Setup {
  ModelConfig config;
  DType dtype = DType::kF16;
  std::unique_ptr<Collectives> collectives;
  std::unique_ptr<GptBigCodeRunner> runner;
  int64_t weight_bytes = 0;
  double copy_bw = 0;
};

absl::StatusOr<Setup> MakeSetup(const Flags& f, int num_blocks, int64_t max_tokens,
                                int64_t max_rows) {
  Setup s;
  ASSIGN_OR_RETURN(s.config, LoadModelConfig(f.model));
  s.dtype = f.dtype == "bfloat16" ? DType::kBF16 : DType::kF16;
  if (f.dtype == "auto" && s.config.checkpoint_dtype == DType::kBF16) s.dtype = DType::kBF16;
  ASSIGN_OR_RETURN(s.copy_bw, MeasureCopyBandwidth(size_t{4} << 30));
  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(GptBigCodeWeights w, MakeDeviceDummyWeights(s.config, s.dtype, f.seed));
  s.weight_bytes = WeightBytes(w);
  std::printf(
      "# %s: %lld layers, E %lld, %lld heads, vocab %lld; %s weights %.2f GB made on the "
      "GPU in %.1f s; copy bandwidth %.2f TB/s (read + write)\n",
      f.model.c_str(), (long long)s.config.n_layer, (long long)s.config.n_embd,
      (long long)s.config.n_head, (long long)s.config.vocab_size,
      std::string(DTypeName(s.dtype)).c_str(), s.weight_bytes / 1e9,
      Seconds(t0, std::chrono::steady_clock::now()), s.copy_bw / 1e12);
  s.collectives = MakeLocalCollectives();
  GptBigCodeRunnerOptions o;
  o.device = Device::kCuda;
  o.block_size = f.block_size;
  o.num_kv_blocks = num_blocks;
  o.max_batched_tokens = max_tokens;
  o.max_logits_rows = max_rows;
  o.cuda_graphs = f.cuda_graphs;
  o.skinny_gemm = f.gemm != "cublaslt";
  o.gemm_autotune = f.autotune == "on" || f.autotune == "decode";
  o.gemm_autotune_max_m = f.autotune == "decode" ? kDecodeAutotuneMaxM : 0;
  ASSIGN_OR_RETURN(s.runner, GptBigCodeRunner::Create(std::move(w), s.collectives.get(), o));
  std::printf("# KV bytes per token %lld (%.1f KiB), %d blocks of %d\n",
              (long long)s.runner->kv_bytes_per_token(), s.runner->kv_bytes_per_token() / 1024.0,
              s.runner->num_kv_blocks(), s.runner->block_size());
  return s;
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
absl::Status EngineLatencyRow(const Flags& f, Setup& s, double floor_ms) {
  GptBigCodeRunner& r = *s.runner;
  EngineOptions options;
  options.max_num_seqs = std::max(256, f.batch_size);
  options.max_num_batched_tokens = std::max(2048, f.batch_size * f.input_len);
  options.max_model_len = f.input_len + f.output_len;
  std::mt19937 rng(f.seed + 11);
  std::vector<double> latencies, prefills, steps, runner_steps, gpu_steps;
  for (int iter = 0; iter < f.num_iters_warmup + f.num_iters; ++iter) {
    std::vector<EngineRequestSpec> requests(f.batch_size);
    for (EngineRequestSpec& q : requests) {
      q.prompt.resize(f.input_len);
      for (int32_t& t : q.prompt) t = rng() % s.config.vocab_size;
      q.max_tokens = f.output_len;
    }
    ASSIGN_OR_RETURN(EngineRunStats st, RunThroughEngine(&r, options, requests, [&] {
                       return r.model().last_graph_ms();
                     }));
    if (iter < f.num_iters_warmup) continue;
    if (st.step_s.size() != static_cast<size_t>(f.output_len)) {
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
      "latency %s (engine): batch %d, in %d, out %d, %s, the model's knobs of the row above\n",
      f.model.c_str(), f.batch_size, f.input_len, f.output_len,
      std::string(DTypeName(s.dtype)).c_str());
  PrintAvgLatency(latencies);
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

// --gemm skinnydsN: skinnyd with N KiB of each weight row staged in shared memory before the
// wait (GptBigCodeOptions::gemm_stage_bytes); N, or -1 for any other variant.
int SkinnyStageKib(absl::string_view v) {
  int kib = -1;
  if (!absl::ConsumePrefix(&v, "skinnyds") || !absl::SimpleAtoi(v, &kib) || kib < 0 || kib > 64) {
    return -1;
  }
  return kib;
}

absl::Status Latency(const Flags& f) {
  const int bs = f.block_size;
  const int per_seq = (f.input_len + f.output_len + bs - 1) / bs;
  ASSIGN_OR_RETURN(Setup s, MakeSetup(f, f.batch_size * per_seq + 8,
                                      std::max<int64_t>(2048, int64_t(f.batch_size) * f.input_len),
                                      std::max(256, f.batch_size)));
  GptBigCodeRunner& r = *s.runner;
  const double floor_ms = s.weight_bytes / s.copy_bw * 1e3;
  // skinny = skinny2 (two weight rows per warp); "both": skinny2 and cuBLASLt; "all": every one.
  std::vector<std::string> variants;
  if (f.gemm == "both") {
    variants = {"skinny2", "cublaslt"};
  } else if (f.gemm == "all") {
    variants = {"skinny1", "skinny2", "skinny4", "cublaslt"};
  } else {
    // A comma-separated list: skinny (= skinny2), skinny1, skinny4, cublaslt, splitk (the split-K
    // skinny kernel), tc (the tensor-core streaming GEMM above m = 8), splitk+tc, skinnyd (skinny
    // with CudaGemm::Options::skinny_deep_unroll), skinnydh / skinnydf (skinnyd with
    // skinny_half_fold on / off; skinnyd leaves it at the model's default, on), skinnydsN,
    // skinnydo.
    for (absl::string_view v : absl::StrSplit(f.gemm, ',')) {
      variants.push_back(v == "skinny" ? "skinny2" : std::string(v));
    }
  }
  for (const std::string& v : variants) {
    if (v != "skinny1" && v != "skinny2" && v != "skinny4" && v != "cublaslt" && v != "splitk" &&
        v != "tc" && v != "splitk+tc" && v != "skinnyd" && v != "skinnydh" && v != "skinnydf" &&
        v != "skinnydo" && SkinnyStageKib(v) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--gemm: unknown variant ", v));
    }
  }
  std::vector<std::string> fasts;
  if (f.fast == "all") {
    fasts = {"off", "fuse", "pdl", "pdl+fuse"};  // PDL last: fuse measured even if it fails
  } else if (f.fast == "off" || f.fast == "pdl" || f.fast == "fuse" || f.fast == "pdl+fuse") {
    fasts = {f.fast};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--fast ", f.fast, ": off|pdl|fuse|pdl+fuse|all"));
  }
  // An off|on|both flag as the rows it asks for.
  auto rows_of = [](const std::string& flag) {
    return flag == "both" ? std::vector<std::string>{"off", "on"} : std::vector<std::string>{flag};
  };
  std::vector<std::string> tunes;
  for (absl::string_view v : absl::StrSplit(f.autotune, ',')) {
    for (const std::string& row : rows_of(std::string(v))) tunes.push_back(row);
  }
  const std::vector<std::string> smalls = rows_of(f.small), asyncs = rows_of(f.async);
  std::vector<std::string> chains;
  for (absl::string_view v : absl::StrSplit(f.chain, ',')) {
    for (const std::string& row : rows_of(std::string(v))) {
      int number = 0, kib = 0, inflight = 0;
      if (row != "off" && row != "on" && row != "auto" && row != "at" && row != "late" &&
          row != "ll" && row != "nl" && row != "tc" && row != "cc" && row != "otc" &&
          row != "occ" && row != "hf" && row != "ohf" && row != "hf0" && row != "ohf0" &&
          row != "fm" &&
          !(row.size() > 2 && row.rfind("fm", 0) == 0 && absl::SimpleAtoi(row.substr(2), &number) &&
            number >= 0) &&
          !(row.size() > 1 && (row[0] == 's' || row[0] == 'f' || row[0] == 'w') &&
            absl::SimpleAtoi(row.substr(1), &number) && number >= 0) &&
          !ParseRingForm(row, &kib, &inflight)) {
        return absl::InvalidArgumentError(
            "--chain off|on|auto|both or a comma list of off / on / auto / at (on, the attention "
            "inside the chain) / sN (on, N spare SMs) / fN (on, at most N ring stages in flight) "
            "/ late (auto, released by the attention only once it is done) / wN (auto, each "
            "CTA's last N chunks of a phase dealt at run time; w0: none) / kKfN (on, K KiB "
            "ring stages, a multiple of 8, at most N in flight; f0: the whole ring) / ll, nl (auto "
            "with the LL boundaries on, off) / tc, cc (auto with the tensor-core, CUDA-core "
            "fold) / otc, occ (on, the same) / hf, ohf (auto, on, fp16 pair sums in the fold) / "
            "hf0, ohf0 (the same with the fp32 fold) / fm, fmN (auto with the fused MLP, N stages "
            "a CTA dealt by ticket)");
      }
      chains.push_back(row);
    }
  }
  // A comma list of integers as rows; `ok` says which values the flag takes.
  auto int_rows = [](const std::string& list, const char* flag, const char* allowed,
                     auto ok) -> absl::StatusOr<std::vector<int>> {
    std::vector<int> rows;
    for (absl::string_view v : absl::StrSplit(list, ',')) {
      int x = 0;
      if (!absl::SimpleAtoi(v, &x) || !ok(x)) {
        return absl::InvalidArgumentError(absl::StrCat(flag, " ", list, ": ", allowed));
      }
      rows.push_back(x);
    }
    return rows;
  };
  ASSIGN_OR_RETURN(const std::vector<int> attns,
                   int_rows(f.attn, "--attn",
                            absl::StrCat("variants 0..", kNumPagedAttentionVariants - 1).c_str(),
                            [](int a) { return a >= 0 && a < kNumPagedAttentionVariants; }));
  std::vector<std::pair<std::string, uint32_t>> skips;
  for (absl::string_view row : absl::StrSplit(f.skip, ',')) {
    uint32_t bits = 0;
    if (row != "none") {
      for (absl::string_view op : absl::StrSplit(row, '+')) {
        if (op == "ln") {
          bits |= kSkipLayerNorm;
        } else if (op == "kvw") {
          bits |= kSkipKvWrite;
        } else if (op == "attn") {
          bits |= kSkipAttention;
        } else if (op == "gemm") {
          bits |= kSkipGemm;
        } else if (op == "act") {
          bits |= kSkipActivation;
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("--skip ", f.skip, ": none or ln, kvw, attn, gemm, act joined by +"));
        }
      }
    }
    skips.emplace_back(std::string(row), bits);
  }
  if (f.skip != "none" && f.async != "off") {
    return absl::InvalidArgumentError("--skip runs with --async off only");
  }
  if (!f.kernel_trace.empty() && (f.async != "off" || f.engine != "off")) {
    return absl::InvalidArgumentError("--kernel-trace runs with --async off and --engine off only");
  }
  std::vector<int> timeline_layers;
  if (!f.chain_timeline.empty()) {
    ASSIGN_OR_RETURN(timeline_layers,
                     int_rows(f.chain_timeline, "--chain-timeline", "layers 1 .. n_layer - 1",
                              [&](int l) { return l >= 1 && l < s.config.n_layer; }));
  }
  ASSIGN_OR_RETURN(const std::vector<int> wms,
                   int_rows(f.attn_wm, "--attn-wm", "0, 1, 2, 3, 4, 8", [](int w) {
                     return w == 0 || w == 1 || w == 2 || w == 3 || w == 4 || w == 8;
                   }));
  ASSIGN_OR_RETURN(
      const std::vector<int> split_rows,
      int_rows(f.attn_splits, "--attn-splits", "counts >= 0", [](int n) { return n >= 0; }));
  ASSIGN_OR_RETURN(const std::vector<int> tn_rows,
                   int_rows(f.attn_tn, "--attn-tn", "0, 32, 64",
                            [](int n) { return n == 0 || n == 32 || n == 64; }));
  struct Run {
    std::string variant, fast, autotune, small, async, chain, engine;
    int attn = 3;
    std::pair<std::string, uint32_t> skip;
    int wm = 0;
    int splits = 0;
    int tn = 0;
  };
  std::vector<Run> runs;
  for (const std::string& v : variants) {
    for (const std::string& k : fasts) {
      for (const std::string& a : tunes) {
        for (const std::string& m : smalls) {
          for (const std::string& y : asyncs) {
            for (int t : attns) {
              for (const auto& x : skips) {
                for (int w : wms) {
                  for (int n : split_rows) {
                    for (int tn : tn_rows) {
                      for (const std::string& c : chains) {
                        for (const std::string& e : rows_of(f.engine)) {
                          runs.push_back({v, k, a, m, y, c, e, t, x, w, n, tn});
                        }
                      }
                    }
                  }
                }
              }
            }
          }
        }
      }
    }
  }
  std::mt19937 rng(f.seed + 1);
  absl::Status first_failure;  // returned after every row ran
  int row_index = -1;
  for (const auto& [variant, fast, autotune, small, async, chain, engine, attn, skip, wm, splits,
                    tn] : runs) {
    ++row_index;
    r.model().set_attention(attn, wm, splits, tn);
    const bool attention_row = chain == "at";
    int ring_kib = 0, ring_inflight = -1;
    const bool ring_row = ParseRingForm(chain, &ring_kib, &ring_inflight);
    r.model().set_decode_chain(
        chain != "off",
        chain[0] == 's' ? std::atoi(chain.c_str() + 1) : GptBigCodeOptions().decode_chain_spare_sms,
        attention_row ? 1 : GptBigCodeOptions().decode_chain_attention,
        chain[0] == 'f' ? std::atoi(chain.c_str() + 1)
        : ring_row      ? ring_inflight
                        : GptBigCodeOptions().decode_chain_max_inflight,
        chain == "auto" || chain == "late" || chain[0] == 'w' || chain == "ll" || chain == "nl" ||
                chain == "tc" || chain == "cc" || chain == "hf" || chain == "hf0" ||
                chain.rfind("fm", 0) == 0
            ? GptBigCodeOptions().decode_chain_min_layer_bytes
            : 0);
    r.model().set_decode_chain_stage_bytes(ring_row ? ring_kib * 1024
                                                    : GptBigCodeOptions().decode_chain_stage_bytes);
    r.model().set_decode_chain_early_release(chain != "late");
    r.model().set_decode_chain_ll_inputs(chain == "ll" ? 1
                                         : chain == "nl"
                                             ? 0
                                             : GptBigCodeOptions().decode_chain_ll_inputs);
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
    if (!timeline_layers.empty()) {
      RETURN_IF_ERROR(r.model().set_decode_chain_timeline(chain != "off"));
    }
    r.model().set_skip_ops(skip.second);
    // Skipped ops leave garbage logits: keep the fed tokens valid ids.
    auto valid_ids = [&, bits = skip.second](std::vector<int32_t>& ids) {
      if (bits == 0) return;
      for (int32_t& t : ids) t = std::clamp<int32_t>(t, 0, s.config.vocab_size - 1);
    };
    const int rows = variant == "skinny1" ? 1 : variant == "skinny4" ? 4 : 2;
    r.model().set_skinny_gemm(variant != "cublaslt", rows);
    const int stage_kib = SkinnyStageKib(variant);
    r.model().set_gemm_kernels(variant == "splitk" || variant == "splitk+tc",
                               variant == "tc" || variant == "splitk+tc",
                               variant == "skinnyd" || variant == "skinnydh" ||
                                   variant == "skinnydf" || variant == "skinnydo" || stage_kib >= 0,
                               variant == "skinnydh"   ? 1
                               : variant == "skinnydf" ? 0
                                                       : -1);
    r.model().set_gemm_stage_bytes(stage_kib >= 0 ? stage_kib * 1024
                                                  : GptBigCodeOptions().gemm_stage_bytes);
    r.model().set_gemm_occupancy(variant == "skinnydo" || GptBigCodeOptions().gemm_occupancy);
    r.model().set_fast_paths(fast == "pdl" || fast == "pdl+fuse",
                             fast == "fuse" || fast == "pdl+fuse");
    r.model().set_gemm_autotune(autotune != "off", autotune == "decode" ? kDecodeAutotuneMaxM : 0);
    r.model().set_small_kernels(small == "on", small == "on");
    std::vector<double> latencies, prefills, steps, graph_ms;
    absl::Status failed;
    r.model().set_time_graphs(true);
    if (engine == "on") {
      const absl::Status st = EngineLatencyRow(f, s, floor_ms);
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
        if (!blocks.Reserve(q.table, f.input_len + f.output_len)) {
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
        for (int step = 1; step < f.output_len; ++step) {
          for (int i = 0; i < f.batch_size; ++i) chunk[i] = {next[i]};
          const auto a = std::chrono::steady_clock::now();
          auto out = r.ExecuteAndSample(MakeStep(ptrs, chunk, bs), greedy);
          if (!out.ok()) {
            failed = out.status();
            break;
          }
          next = *std::move(out);
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
        "latency %s: batch %d, in %d, out %d, %s, gemm %s, fast %s, autotune %s, small "
        "%s, async %s, attention variant %d (warps_m %d, splits %d, tile tokens %d), skip "
        "%s, cuda graphs %s\n",
        f.model.c_str(), f.batch_size, f.input_len, f.output_len,
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
        "captured)\n",
        r.model().num_cuda_graphs(), chain.c_str(),
        static_cast<long long>(r.model().decode_chain_runs() - chains_before));
    if (autotune != "off") std::printf("  %s\n", r.model().gemm_autotune_summary().c_str());
    if (!timeline_layers.empty() && chain != "off") {
      RETURN_IF_ERROR(PrintModelChainTimelines(r.model(), s, timeline_layers, attention_row));
    }
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
  // One GEMM variant for the whole run: --gemm splitk, tc or splitk+tc switch those kernels on.
  r.model().set_gemm_kernels(absl::StrContains(f.gemm, "splitk"),
                             f.gemm == "tc" || absl::StrContains(f.gemm, "+tc"),
                             f.gemm == "skinnyd");
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
  if (f.engine != "on")
    RETURN_IF_ERROR(ThroughputOwnLoop(f, s, std::move(waiting), params, gemm_rate));
  if (f.engine == "off") return absl::OkStatus();
  // The same requests through the serving engine (chunked prefill, its scheduler and sampling).
  EngineOptions options;
  options.max_num_seqs = f.max_num_seqs;
  options.max_num_batched_tokens = f.max_num_batched_tokens;
  options.max_model_len = 1024 + 256;
  ASSIGN_OR_RETURN(EngineRunStats st, RunThroughEngine(&r, options, specs));
  double runner_s = 0;
  for (double x : st.runner_s) runner_s += x;
  // Every request's last output token is never fed back.
  const int64_t processed = st.prompt_tokens + st.output_tokens - f.num_prompts;
  PrintThroughputRow(
      "engine", st.seconds, static_cast<int64_t>(st.step_s.size()), st.output_tokens, processed,
      params, gemm_rate,
      absl::StrFormat("; %.1f%% of the time inside the runner", 100.0 * runner_s / st.seconds));
  return absl::OkStatus();
}

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

int main(int argc, char** argv) {
  auto flags = mqa::bench::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "mqabench: %s\n", flags.status().ToString().c_str());
    return 2;
  }
  absl::Status st;
  if (flags->mode == "latency") {
    st = mqa::bench::Latency(*flags);
  } else if (flags->mode == "throughput") {
    st = mqa::bench::Throughput(*flags);
  } else {
    st = absl::InvalidArgumentError("mode must be latency or throughput");
  }
  if (!st.ok()) {
    std::fprintf(stderr, "mqabench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
