// Command-line options of the mqaserve binary. Flag names follow vLLM's (`--max-num-seqs`,
// `--tensor-parallel-size`, ...); both `--flag value` and `--flag=value` work. Parsed once in
// main, on every rank (all ranks get the same argv from mpirun/srun).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/speculative.h"

namespace mqa {

enum class Command { kServe, kGenerate };

struct Options {
  Command command = Command::kServe;
  // Model.
  std::string model;                     // folder with config.json (+ safetensors, tokenizer.json)
  std::string tokenizer;                 // default: the model folder
  std::string device = "cpu";            // cpu | cuda
  std::string dtype = "auto";            // auto | float16 | bfloat16 | float32
  std::string load_format = "auto";      // auto | safetensors | dummy
  int tensor_parallel_size = 0;          // 0: the MPI world size
  uint64_t seed = 0;
  // KV cache and scheduling.
  int block_size = 16;
  int num_kv_blocks = 0;                 // 0: sized from --kv-cache-memory / GPU memory
  double kv_cache_memory_gib = 1.0;      // CPU backend: memory for the KV cache
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int max_model_len = 0;                 // 0: the model's n_positions
  int max_queued_requests = 1024;
  int max_prompt_logprob_rows = 256;  // prompt tokens scored per step (EngineOptions)
  // vLLM's --speculative-config (JSON; runtime/speculative.h), parsed into `speculative`.
  std::string speculative_config;
  SpeculativeConfig speculative;
  std::string scheduling_policy = "fcfs";  // vLLM's --scheduling-policy: fcfs | priority
  bool enable_prefix_caching = true;
  bool prompt_tokens_details = false;  // vLLM's --enable-prompt-tokens-details
  std::string metrics_prefix = "mqaserve_";  // /metrics names' prefix ("vllm:": vLLM's names)
  int max_stored_responses = 1024;           // the Responses API's stored responses (0: none)
  // vLLM's --enable-auto-tool-choice and --tool-call-parser (both, or neither).
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;
  bool enable_chunked_prefill = true;
  bool async_scheduling = false;  // EngineOptions::decode_lookahead
  // HTTP (rank 0).
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string ssl_certfile;  // HTTPS: the server's PEM certificate (chain) ...
  std::string ssl_keyfile;   // ... and its private key
  std::string ssl_ca_certs;  // mutual TLS: clients must show a certificate these CAs signed
  bool dev_endpoints = false;  // POST /reset_prefix_cache, /flush_cache (or VLLM_SERVER_DEV_MODE=1)
  std::string served_model_name;         // default: the model folder's name
  double shutdown_timeout = 10.0;        // seconds to finish in-flight requests on SIGTERM
  std::string chat_template;             // file or template text; default: the tokenizer's
  // vLLM's --generation-config: auto (the model folder's generation_config.json), vllm (none), or
  // a folder: request defaults (temperature, top_p, top_k, min_p, repetition_penalty,
  // max_new_tokens) and extra end-of-sequence ids.
  std::string generation_config = "auto";
  std::string allowed_origins = "*";     // CORS: comma-separated origins, "*" any, "" none
  bool log_stats = true;                 // the periodic engine-statistics line
  double log_stats_interval = 10.0;      // seconds
  bool log_requests = false;             // one line per finished request
  // A collective or plan that another rank has not answered within this many seconds means that
  // rank is gone or stuck: rank 0 fails the requests in flight and ends the job.
  double peer_timeout = 30.0;
  // Debug: every StepPlan carries a hash of rank 0's block-table mirror; workers check theirs.
  bool debug_check_mirror = false;
  // Testing: several ranks of a node share its GPUs (rank r uses GPU r % count) and talk over MPI
  // (host-staged) instead of NCCL, which refuses two ranks on one device.
  bool share_gpu = false;
  // CUDA: no decode CUDA graphs (vLLM's --enforce-eager).
  bool enforce_eager = false;
  // CUDA, one rank: capture every decode graph the engine's limits allow at start-up instead of
  // on a bucket's second use (and tune the decode GEMMs meanwhile, gemm_autotune). On since
  // 2026-12-05: StarCoder on an H100 captured its 102 graphs in 5.6 s (+2.5 s of tuning), the
  // first request's TTFT 16.8 against 21.6 ms, 32 concurrent requests 3% more output tokens/s
  // (BENCHMARKS.md, late evening).
  bool cuda_graph_warmup = true;
  // CUDA: "decode" times cuBLASLt's candidate algorithms for every decode GEMM shape while the
  // warm-up runs (--cuda-graph-warmup) and keeps the fastest (GptBigCodeOptions::gemm_autotune, up
  // to kDecodeGemmAutotuneMaxM rows), then freezes: no shape is tuned on a live request's step.
  // Without the warm-up nothing is tuned.
  std::string gemm_autotune = "decode";
  // `generate` subcommand.
  std::string prompt;
  int max_tokens = 64;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = -1;
  std::optional<uint64_t> sample_seed;
};

// Parses argv (argv[0] is the program). `mqaserve [serve] --model DIR ...` or
// `mqaserve generate --model DIR --prompt TEXT ...`. InvalidArgument names the flag.
absl::StatusOr<Options> ParseOptions(const std::vector<std::string>& args);

// The --help text.
std::string UsageText();

}  // namespace mqa
