#include "benchmarks/mqabench/flags.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/ops.h"        // OpContext::skip's bits
#include "model/gpt_bigcode.h"  // TailReleaseBit
#include "runtime/status.h"

namespace mqa::bench {

absl::StatusOr<Flags> ParseFlags(int argc, const char* const* argv) {
  Flags f;
  if (argc < 2) return absl::InvalidArgumentError("usage: mqabench latency|throughput [flags]");
  f.mode = argv[1];
  if (f.mode != "latency" && f.mode != "throughput") {
    return absl::InvalidArgumentError(
        absl::StrCat("mode ", f.mode, ": usage: mqabench latency|throughput [flags]"));
  }
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> absl::StatusOr<std::string> {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(a, " needs a value"));
      return std::string(argv[++i]);
    };
    auto as_int = [&](int* out) -> absl::Status {
      ASSIGN_OR_RETURN(std::string v, value());
      if (!absl::SimpleAtoi(v, out)) {
        return absl::InvalidArgumentError(absl::StrCat(a, " ", v, ": not an integer"));
      }
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
    } else if (a == "--tail-timeline") {
      RETURN_IF_ERROR(as_int(&f.tail_timeline));
    } else if (a == "--verify-tokens") {
      RETURN_IF_ERROR(as_int(&f.verify_tokens));
    } else if (a == "--graph-query") {
      RETURN_IF_ERROR(as_int(&f.graph_query));
    } else if (a == "--speculative") {
      RETURN_IF_ERROR(as_int(&f.speculative));
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
      ASSIGN_OR_RETURN(std::string v, value());
      if (!absl::SimpleAtoi(v, &f.seed)) {
        return absl::InvalidArgumentError(absl::StrCat("--seed ", v, ": not an integer >= 0"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
    }
  }
  const std::pair<const char*, int> at_least[] = {
      {"--batch-size", f.batch_size},     {"--input-len", f.input_len},
      {"--output-len", f.output_len},     {"--num-iters", f.num_iters},
      {"--block-size", f.block_size},     {"--num-prompts", f.num_prompts},
      {"--max-num-seqs", f.max_num_seqs}, {"--max-num-batched-tokens", f.max_num_batched_tokens},
      {"--graph-query", f.graph_query}};
  for (const auto& [flag, v] : at_least) {
    if (v < 1) return absl::InvalidArgumentError(absl::StrCat(flag, " ", v, ": must be >= 1"));
  }
  if (f.num_iters_warmup < 0 || f.speculative < 0) {
    return absl::InvalidArgumentError("--num-iters-warmup and --speculative must be >= 0");
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
  if (EngineRows(f.engine).empty()) {
    return absl::InvalidArgumentError("--engine off|on|la|both or a comma list of them");
  }
  if (f.load_format != "dummy") {
    return absl::InvalidArgumentError("only --load-format dummy (weights made on the GPU)");
  }
  if (f.dtype != "float16" && f.dtype != "bfloat16" && f.dtype != "auto") {
    return absl::InvalidArgumentError("--dtype auto|float16|bfloat16");
  }
  return f;
}

bool ParseRingForm(const std::string& row, int* kib, int* inflight) {
  const size_t f = row.find('f');
  if (row.size() < 4 || row[0] != 'k' || f == std::string::npos) return false;
  return absl::SimpleAtoi(row.substr(1, f - 1), kib) && *kib > 0 && *kib % 8 == 0 &&
         absl::SimpleAtoi(row.substr(f + 1), inflight) && *inflight >= 0;
}

int TailReleaseMask(absl::string_view row) {
  int mask = -1;
  if (!absl::ConsumePrefix(&row, "tailr")) return -1;
  if (row.empty()) return kTailReleaseAttnProj;
  if (!absl::SimpleAtoi(row, &mask) || mask < 0 || mask > kTailReleaseAll) return -1;
  return mask;
}

std::vector<std::string> EngineRows(absl::string_view engine) {
  std::vector<std::string> rows;
  for (absl::string_view v : absl::StrSplit(engine, ',')) {
    if (v == "both") {
      rows.insert(rows.end(), {"off", "on"});
    } else if (v == "off" || v == "on" || v == "la") {
      rows.emplace_back(v);
    } else {
      return {};
    }
  }
  return rows;
}

bool IsAutoChainRow(absl::string_view row) {
  static constexpr absl::string_view kNamed[] = {
      "auto", "na",  "late", "rel", "tail", "tailc", "tailp", "notail", "ll",    "nl",
      "hq",   "hq0", "hq2",  "tc",  "cc",   "hf",    "hf0",   "fm",     "shares"};
  for (absl::string_view named : kNamed) {
    if (row == named) return true;
  }
  int number = 0;
  if (TailReleaseMask(row) >= 0) return true;
  if (absl::ConsumePrefix(&row, "fm")) return absl::SimpleAtoi(row, &number) && number >= 0;
  return absl::ConsumePrefix(&row, "w") && absl::SimpleAtoi(row, &number) && number >= 0;
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

// --gemm tma[B][hH]: skinnyd with the stream-TC kernel's TMA form for 8 < m <= 64, B its boxes a
// stage (1, 2, 4; none: the default), H its L2 hints (0, 1). Sets *boxes / *hints (0 / -1 when
// absent); false for any other variant.
bool ParseTmaVariant(absl::string_view v, int* boxes, int* hints) {
  *boxes = 0;
  *hints = -1;
  if (!absl::ConsumePrefix(&v, "tma")) return false;
  if (!v.empty() && v[0] >= '1' && v[0] <= '4') {
    *boxes = v[0] - '0';
    v.remove_prefix(1);
    if (*boxes == 3) return false;
  }
  if (absl::ConsumePrefix(&v, "h")) {
    if (v != "0" && v != "1") return false;
    *hints = v[0] - '0';
    v.remove_prefix(1);
  }
  return v.empty();
}
absl::StatusOr<LatencyPlan> PlanLatency(const Flags& f, int num_attention_variants) {
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
    // skinnydo, skinnyde (skinnyd with the epilogue's loads before the fold), skinnydn (skinnyd
    // with the weights' L2 priority evict_normal instead of evict_first).
    for (absl::string_view v : absl::StrSplit(f.gemm, ',')) {
      variants.push_back(v == "skinny" ? "skinny2" : std::string(v));
    }
  }
  for (const std::string& v : variants) {
    int tma_boxes = 0, tma_hints = 0;
    if (v != "skinny1" && v != "skinny2" && v != "skinny4" && v != "cublaslt" && v != "splitk" &&
        v != "tc" && !ParseTmaVariant(v, &tma_boxes, &tma_hints) && v != "splitk+tc" &&
        v != "skinnyd" && v != "skinnydh" && v != "skinnydf" && v != "skinnydo" &&
        v != "skinnyde" && v != "skinnydn" && SkinnyStageKib(v) < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--gemm: unknown variant ", v));
    }
  }
  std::vector<std::string> fasts;
  if (f.fast == "all") {
    fasts = {"off", "fuse", "pdl", "pdl+fuse"};  // PDL last: fuse measured even if it fails
  } else {
    for (absl::string_view v : absl::StrSplit(f.fast, ',')) {
      if (v != "off" && v != "pdl" && v != "fuse" && v != "pdl+fuse" && v != "pdl+ln") {
        return absl::InvalidArgumentError(
            absl::StrCat("--fast ", v, ": off|pdl|fuse|pdl+fuse|pdl+ln (a list) or all"));
      }
      fasts.emplace_back(v);
    }
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
      if (!IsAutoChainRow(row) && row != "off" && row != "on" && row != "at" && row != "otc" &&
          row != "occ" && row != "ohf" && row != "ohf0" &&
          !(row.size() > 1 && (row[0] == 's' || row[0] == 'f') &&
            absl::SimpleAtoi(row.substr(1), &number) && number >= 0) &&
          !ParseRingForm(row, &kib, &inflight)) {
        return absl::InvalidArgumentError(
            "--chain off|on|auto|both or a comma list of off / on / auto / at (on, the attention "
            "inside the chain) / na (auto with the attention a kernel of its own) / sN (on, N "
            "spare SMs) / fN (on, at most N ring stages in flight) "
            "/ late (auto, released by the attention only once it is done) / rel (auto, and "
            "every attention releases the next kernel early, chain or not) / tail, notail (auto "
            "with the QKV GEMM's tail attention on with the L2 merge, off) / tailc (on with the "
            "cluster merge) / tailp (tailc with attn.c_proj in the same launch) / tailrN (tailc, "
            "the GEMMs of mask N releasing the next kernel as "
            "they start: 1 attn.c_proj, 2 mlp.c_proj, 4 c_fc, 8 the QKV GEMM; tailr: 1) / "
            "wN (auto, each "
            "CTA's last N chunks of a phase dealt at run time; w0: none) / kKfN (on, K KiB "
            "ring stages, a multiple of 8, at most N in flight; f0: the whole ring) / ll, nl (auto "
            "with the LL boundaries on, off) / hq, hq0 (auto with head_hold 1, 0: the head CTAs' "
            "producers held until their K rows are read; 0 runs as 1; hq2: until the head is "
            "written) / tc, cc (auto with the "
            "tensor-core, CUDA-core "
            "fold) / otc, occ (on, the same) / hf, ohf (auto, on, fp16 pair sums in the fold) / "
            "hf0, ohf0 (the same with the fp32 fold) / fm, fmN (auto with the fused MLP, N stages "
            "a CTA dealt by ticket) / shares (auto with calibrated per-SM shares of the rows)");
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
  ASSIGN_OR_RETURN(
      const std::vector<int> attns,
      int_rows(f.attn, "--attn", absl::StrCat("variants 0..", num_attention_variants - 1).c_str(),
               [&](int a) { return a >= 0 && a < num_attention_variants; }));
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
  if (f.verify_tokens < 0 || f.verify_tokens > 15) {
    return absl::InvalidArgumentError("--verify-tokens must be in 0..15");
  }
  if (f.verify_tokens > 0 && (f.async != "off" || f.engine != "off")) {
    return absl::InvalidArgumentError(
        "--verify-tokens runs with --async off and --engine off only");
  }
  if (!f.kernel_trace.empty() && (f.async != "off" || f.engine != "off")) {
    return absl::InvalidArgumentError("--kernel-trace runs with --async off and --engine off only");
  }
  if (f.tail_timeline < -1) {
    return absl::InvalidArgumentError("--tail-timeline: a layer, 0 .. n_layer - 1");
  }
  if (f.tail_timeline >= 0 && f.engine != "off") {
    return absl::InvalidArgumentError("--tail-timeline runs with --engine off only");
  }
  LatencyPlan plan;
  if (!f.chain_timeline.empty()) {
    ASSIGN_OR_RETURN(plan.timeline_layers,
                     int_rows(f.chain_timeline, "--chain-timeline", "layers 1 .. n_layer - 1",
                              [](int l) { return l >= 1; }));
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
                        for (const std::string& e : EngineRows(f.engine)) {
                          plan.runs.push_back({v, k, a, m, y, c, e, t, x, w, n, tn});
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
  return plan;
}

}  // namespace mqa::bench
