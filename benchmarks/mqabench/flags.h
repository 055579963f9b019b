// mqabench's flags (mqabench.cc's header comment lists them) and the rows a latency run asks
// for, checked on the host before anything touches the GPU: a mistyped flag or row fails at once
// instead of after the model is made on the device. Host-only; tested in
// tests/benchmarks/mqabench_flags_test.cc.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mqa::bench {

struct Flags {
  std::string mode;
  std::string model = "configs/starcoder";
  int batch_size = 1, input_len = 128, output_len = 128, num_iters = 3, num_iters_warmup = 1;
  std::string load_format = "dummy", dtype = "float16", gemm = "skinnyd";  // the runner's default
  int block_size = 16;
  bool cuda_graphs = true;
  std::string fast = "pdl+ln";      // the runner's default
  std::string autotune = "decode";  // as the server: tuned during the decode-graph warm-up
  std::string small = "on";         // the runner's default
  std::string async = "off";
  // off: mqabench's own step loop; on: the serving engine; la: the engine with decode lookahead
  // (EngineOptions::decode_lookahead); both: off and on; or a comma list of these (EngineRows).
  std::string engine = "off";
  std::string chain = "auto";
  std::string chain_timeline;  // comma list of layers (empty: off)
  int tail_timeline = -1;  // a layer whose QKV launch with the tail attention is timed (-1: off)
  std::string kernel_trace;    // CSV path prefix (empty: off)
  std::string attn =
      "18";  // comma list of PagedAttentionTuning variants (18: the runner's default)
  std::string skip = "none";      // comma list of op sets left out (timing only)
  std::string attn_wm = "0";      // comma list of attention warps_m (0: automatic)
  std::string attn_splits = "0";  // comma list of attention split counts (0: automatic)
  std::string attn_tn = "0";      // comma list of variant 11's KV tokens a stage (0: automatic)
  int num_prompts = 500, max_num_seqs = 256, max_num_batched_tokens = 4096;
  // Speculative decoding's check step: each decode step brings the last token and this many
  // draft tokens a sequence, with a logits row for each (0: plain decode steps).
  int verify_tokens = 0;
  int graph_query = 1;  // GptBigCodeOptions::max_graph_query (--graph-query)
  int speculative = 0;  // --engine rows: EngineOptions::speculative's drafts a step (--speculative)
  uint64_t seed = 0;
};

// argv as mqabench takes it (argv[1] the mode, latency or throughput): InvalidArgument naming the
// flag for an unknown flag, a missing value, a number that is not one, or a value outside what
// the flag takes.
absl::StatusOr<Flags> ParseFlags(int argc, const char* const* argv);

// The --chain form kKfN: K KiB ring stages (a positive multiple of 8), at most N requested ahead.
bool ParseRingForm(const std::string& row, int* kib, int* inflight);
// The --chain forms tailr / tailrN: the release mask (GptBigCodeOptions::tail_release_early; tailr
// is 1, N in 0..15); -1 for any other row.
int TailReleaseMask(absl::string_view row);
// The --chain rows that are `auto` with one knob changed (the chain on for layers of at least
// GptBigCodeOptions::decode_chain_min_layer_bytes): auto, na, late, rel, tail, tailc, tailr /
// tailrN, notail, wN, ll, nl, hq, hq0, hq2, tc, cc, hf, hf0, fm / fmN and shares. (The other rows
// PlanLatency takes: off, on, at, otc, occ, ohf, ohf0, sN, fN and kKfN.)
bool IsAutoChainRow(absl::string_view row);

// --engine's rows in order, each off, on or la ("both" gives off and on); empty when an item is
// none of off, on, la, both.
std::vector<std::string> EngineRows(absl::string_view engine);
// --gemm skinnydsN: N (0..64) KiB of each weight row staged before the wait; -1 for any other.
int SkinnyStageKib(absl::string_view v);
// --gemm tma[B][hH]: sets *boxes (1, 2, 4; 0 when absent) and *hints (0, 1; -1 when absent);
// false for any other variant.
bool ParseTmaVariant(absl::string_view v, int* boxes, int* hints);

// One latency row: a combination of the knobs asked for.
struct LatencyRun {
  std::string variant, fast, autotune, small, async, chain, engine;
  int attn = 3;
  std::pair<std::string, uint32_t> skip;  // the row's text and its OpContext::skip bits
  int wm = 0;
  int splits = 0;
  int tn = 0;
};
struct LatencyPlan {
  std::vector<LatencyRun> runs;      // every combination, in the order the lists give
  std::vector<int> timeline_layers;  // --chain-timeline (each >= 1; the caller checks < n_layer)
};
// The rows of `f` (InvalidArgument naming the flag for a value it does not take);
// num_attention_variants: kNumPagedAttentionVariants (--attn takes 0 .. it - 1).
absl::StatusOr<LatencyPlan> PlanLatency(const Flags& f, int num_attention_variants);

}  // namespace mqa::bench
