// mqabench: end-to-end GPU benchmarks of GptBigCodeRunner with dummy weights made on the device.
//
//   mqabench latency --model configs/starcoder --batch-size 1 --input-len 128 --output-len 128
//       [--num-iters 3] [--num-iters-warmup 1] [--load-format dummy] [--dtype float16|bfloat16]
//       [--block-size 16] [--no-cuda-graphs] [--gemm skinny|skinny1|skinny4|cublaslt|both|all]
//       [--fast off|pdl|fuse|pdl+fuse|pdl+ln|LIST|all] [--autotune off|on|decode|both|LIST]
//       [--small off|on|both]
//       [--async off|on|both] [--engine off|on|la|both] [--attn 3[,5...]] [--attn-wm 0[,1...]]
//       [--attn-splits 0[,1...]]
//       [--attn-tn 0[,32,64]]
//       [--skip none,attn,...] [--chain auto|off|on|both|LIST] [--chain-timeline L[,L...]]
//       [--tail-timeline L]
//       [--kernel-trace PREFIX] [--verify-tokens K] [--graph-query Q] [--speculative K]
//     --gemm: also a comma-separated list of skinny, skinny1, skinny4, cublaslt, splitk (split-K
//     skinny kernel, m <= 8), tc (tensor-core weight-streaming kernel, 8 < m <= 64), tma (skinnyd
//     with tc in its Hopper form: TMA copies and wgmma, StreamTcTuning::tma; tmaB / tmaBhH / tmahH
//     set its boxes a stage, B = 1, 2, 4, and its L2 hints, H = 0, 1), splitk+tc,
//     skinnyd (skinny with the deep unroll for narrow m = 1 GEMMs: the default, as in the runner;
//     "skinny" is without it), skinnydsN (skinnyd with N KiB of each weight row staged in shared
//     memory before the PDL wait; skinnyd stages the model's default, 16), skinnydo (skinnyd with
//     more resident CTAs an SM: GptBigCodeOptions::gemm_occupancy), skinnyde (skinnyd with the
//     epilogue's bias / residual loads before the fold: CudaGemm::Options::skinny_early_epilogue),
//     skinnydn (skinnyd with the weights' L2 priority evict_normal, not evict_first:
//     CudaGemm::Options::skinny_evict_first).
//     --fast: the decode launch knobs (GptBigCodeOptions::pdl, fuse_small_kernels; pdl+ln: pdl
//     with fuse_layer_norms), a comma list one row each on the same runner; "all" runs off,
//     fuse, pdl and pdl+fuse.
//     --autotune: GptBigCodeOptions::gemm_autotune (cuBLASLt algorithm timing per GEMM shape);
//     "decode" (the default, as the server's defaults --cuda-graph-warmup --gemm-autotune decode):
//     the decode shapes (kDecodeGemmAutotuneMaxM rows at most) tuned while their graphs are
//     warmed up, then frozen;
//     "both" runs off, then on; a comma list (e.g. off,decode,on) one row each, on the same runner
//     (with the tuning summary).
//     --small off|on|both: GptBigCodeOptions::ln_registers and greedy_cluster together (the
//     register-resident layer norm and the cluster argmax; default on, as in the runner); "both"
//     gives one row each.
//     --async off|on|both: on = GptBigCodeRunner::LaunchSample / CollectSample, step t + 1
//     launched (its tokens fed from step t's on the device) before step t's tokens are read back,
//     so the host's step preparation overlaps the GPU; "both" gives one row each.
//     --engine off|on|la|both or a comma list of them: on = the workload queued into the serving
//     engine (runtime/engine.h: scheduler, block manager, device sampling, output processing) and
//     stepped as the server steps it, with a decode step's time split into the GPU's, the
//     runner's host work and the engine's own; la = the same with decode lookahead
//     (EngineOptions::decode_lookahead, the server's --async-scheduling: the predicted next step
//     launched before this step's tokens are back; its counts printed); "both" gives mqabench's
//     own loop's row, then the engine's (same runner). throughput takes it too (default off:
//     mqabench's own loop).
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
//     chain's first phase (decode_chain_attention, the default where the context fits the
//     phase's short form) and na auto with the attention a kernel of its own; fN is on with at most
//     N ring stages in flight (decode_chain_max_inflight); late is auto with the chain released by
//     the attention only once it is done (decode_chain_early_release off); rel is auto with every
//     attention releasing the next kernel early, chain or not
//     (GptBigCode::set_attention_release_early); tail and notail are auto with the QKV GEMM's tail
//     attention (GptBigCodeOptions::tail_attention) on (its splits merged through L2) and off,
//     tailc the tail with its splits merged in a cluster (tail_cluster_merge, the default), tailp
//     tailc with attn.c_proj in the same launch (tail_attention_proj), tailrN
//     tailc with the GEMMs of mask N releasing the next kernel as they start (tail_release_early: 1
//     attn.c_proj, the default, 2 mlp.c_proj, 4 c_fc, 8 the QKV GEMM's CTAs; tailr is tailr1,
//     tailr0 none); wN is auto with each CTA's last N ring-stage chunks of a phase dealt at run
//     time (work stealing, decode_chain_steal_chunks; w0: every row fixed in advance, the default;
//     only phases of at least 16 chunks a CTA steal); kKfN is on with ring stages of K KiB
//     (decode_chain_stage_bytes, K a multiple of 8) and at most N of them requested ahead (f0: the
//     whole ring), e.g. k16f3; ll and nl are auto with the LL boundaries (decode_chain_ll_inputs)
//     on and off; hq and hq0 are auto with decode_chain_head_hold 1 (the default: the head CTAs'
//     producers held until their K rows are read) and 0 (run as 1 since the K rows are in the
//     ring), hq2 held until the head is written; tc
//     and cc are auto with the tiled tensor-core fold and the row-run fp32 fold on the CUDA cores
//     (decode_chain_mma_fold 1, 0), otc and occ the same with the chain on every layer; hf and ohf
//     are auto and on with the fp16-pair fold (decode_chain_half_fold 1, the default), hf0 and ohf0
//     with the fp32 fold; fm is auto with the fused MLP (decode_chain_fused_mlp: mlp.c_proj
//     streamed from a transposed copy right after c_fc, no grid barrier between them), fmN the same
//     with N stages a CTA dealt by ticket (decode_chain_fused_pool; fm: the default); shares is
//     auto with per-SM shares of the chains' rows (GptBigCode::set_decode_chain_sm_shares) from a
//     calibration of 32 untimed decode steps (GptBigCodeRunner::CalibrateDecodeChainShares; its
//     summary is printed).
//     --chain-timeline: every chain records its timeline (GptBigCode::set_decode_chain_timeline);
//     after each row, the last decode step's chains of layers L are printed (event min / median /
//     max over the CTAs, benchmarks/chain_timeline.h) with where the previous layer's chain
//     ended: what a layer costs between its chains (the attention, the kernel handover).
//     --tail-timeline L: layer L's QKV launch with the tail attention (SantaCoder b1) records when
//     its CTAs start, pass the PDL wait, have their dot products (GEMM) or their cached K / V
//     (attention), have their LL words of q and the newest k / v, their scores, merge their warps
//     and their head's splits, and end (GemmTailAttention::stamps); printed after each row for
//     the last decode step (min / median / max over the GEMM CTAs and the attention CTAs, then
//     each attention CTA's time from one of its events to the next, median / max).
//     --kernel-trace PREFIX: after a row's timed iterations, one more, untimed, with every kernel
//     traced through CUPTI (kernel_trace.h): the prefill's and the decode steps' kernels grouped by
//     name and grid, each group's time beyond the kernels before it ("exposed") and the idle gaps
//     (benchmarks/kernel_timeline.h), medians over the decode steps; every kernel position to
//     PREFIX-rowN-prefill.csv / -decode.csv. With --async off and --engine off only.
//     --verify-tokens K: each decode step also brings K draft tokens a sequence with a logits
//     row for each (speculative decoding's check step, runtime/speculative.h), the sequence
//     advancing by one token: the step's cost beside a plain decode step's (another run).
//     --graph-query Q: such steps of up to Q tokens a sequence run as CUDA graphs too
//     (GptBigCodeOptions::max_graph_query; 1, the default: decode steps only).
//     --speculative K: the --engine rows with speculative decoding by prompt lookup, K drafts a
//     step at most (dummy weights: the text is only as repetitive as random weights make it; the
//     row prints how many drafts were kept).
//     vLLM benchmark_latency's flags: one prefill of batch x input_len prompt tokens, then
//     output_len - 1 decode steps (output_len tokens in all), greedy on the device. Prints the
//     average latency, the prefill time, the median decode step beside the weights-bandwidth floor
//     (weight bytes / the device-to-device copy bandwidth measured in this run).
//
//   mqabench throughput --model configs/starcoder [--num-prompts 500] [--max-num-seqs 256]
//       [--max-num-batched-tokens 4096] [--seed 0] [--engine off|on|la|both]
//     Many requests of mixed lengths: prompt and output lengths from slices of this repository's
//     source files (bytes as token ids: code-shaped lengths), continuous batching (prefills of
//     whole prompts alongside the running decodes). Prints output tokens/s and the fraction of
//     the compute roofline (2 x params FLOP per processed token over the GEMM rate measured here).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "benchmarks/mqabench/common.h"
#include "runtime/status.h"

int main(int argc, char** argv) {
  auto flags = mqa::bench::ParseFlags(argc, const_cast<const char* const*>(argv));
  if (!flags.ok()) {
    std::fprintf(stderr, "mqabench: %s\n", flags.status().ToString().c_str());
    return 2;
  }
  // ParseFlags took latency or throughput only.
  const absl::Status st =
      flags->mode == "latency" ? mqa::bench::Latency(*flags) : mqa::bench::Throughput(*flags);
  if (!st.ok()) {
    std::fprintf(stderr, "mqabench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
