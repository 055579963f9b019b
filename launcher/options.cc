#include "launcher/options.h"

#include <functional>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/http/metrics.h"

namespace mqa {
namespace {

using Setter = std::function<absl::Status(Options&, const std::string&)>;

struct Flag {
  std::string help;
  Setter set;
  bool takes_value = true;
};

template <typename T>
Setter Number(T Options::*field) {
  return [field](Options& o, const std::string& v) -> absl::Status {
    if constexpr (std::is_same_v<T, double>) {
      if (!absl::SimpleAtod(v, &(o.*field))) return absl::InvalidArgumentError("not a number");
    } else if constexpr (std::is_same_v<T, float>) {
      if (!absl::SimpleAtof(v, &(o.*field))) return absl::InvalidArgumentError("not a number");
    } else {
      if (!absl::SimpleAtoi(v, &(o.*field))) return absl::InvalidArgumentError("not an integer");
    }
    return absl::OkStatus();
  };
}

Setter Text(std::string Options::*field) {
  return [field](Options& o, const std::string& v) {
    o.*field = v;
    return absl::OkStatus();
  };
}

Setter OneOf(std::string Options::*field, std::vector<std::string> allowed) {
  return [field, allowed](Options& o, const std::string& v) -> absl::Status {
    for (const auto& a : allowed) {
      if (v == a) {
        o.*field = v;
        return absl::OkStatus();
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("must be one of ", absl::StrJoin(allowed, ", ")));
  };
}

Flag Switch(bool Options::*field, bool value, std::string help) {
  return Flag{std::move(help),
              [field, value](Options& o, const std::string&) {
                o.*field = value;
                return absl::OkStatus();
              },
              false};
}

const std::map<std::string, Flag>& Flags() {
  static const auto* flags = new std::map<std::string, Flag>{
      {"model", {"model folder (config.json, safetensors, tokenizer.json)", Text(&Options::model)}},
      {"tokenizer",
       {"tokenizer folder or tokenizer.json (default: the model's)", Text(&Options::tokenizer)}},
      {"device", {"cpu | cuda", OneOf(&Options::device, {"cpu", "cuda"})}},
      {"dtype",
       {"auto | float16 | bfloat16 | float32",
        OneOf(&Options::dtype, {"auto", "float16", "bfloat16", "float32"})}},
      {"load-format",
       {"auto | safetensors | dummy (random weights of the config's shapes)",
        OneOf(&Options::load_format, {"auto", "safetensors", "dummy"})}},
      {"tensor-parallel-size",
       {"must equal the number of MPI ranks (default: that number)",
        Number(&Options::tensor_parallel_size)}},
      {"seed", {"engine seed (requests without a seed draw from it)", Number(&Options::seed)}},
      {"block-size", {"KV cache block size in tokens: 8, 16 or 32", Number(&Options::block_size)}},
      {"num-kv-blocks",
       {"KV cache blocks (default: from --kv-cache-memory or GPU memory)",
        Number(&Options::num_kv_blocks)}},
      {"kv-cache-memory",
       {"CPU backend: GiB for the KV cache", Number(&Options::kv_cache_memory_gib)}},
      {"gpu-memory-utilization",
       {"fraction of GPU memory for weights, activations and KV cache",
        Number(&Options::gpu_memory_utilization)}},
      {"max-num-seqs", {"most sequences in one step", Number(&Options::max_num_seqs)}},
      {"max-num-batched-tokens",
       {"most tokens in one step", Number(&Options::max_num_batched_tokens)}},
      {"max-model-len",
       {"longest prompt + output (default: the model's n_positions)",
        Number(&Options::max_model_len)}},
      {"max-queued-requests",
       {"waiting requests beyond which new ones get 429", Number(&Options::max_queued_requests)}},
      {"max-prompt-logprob-rows",
       {"prompt tokens a step may score for prompt log-probabilities (echo + logprobs); 0 refuses "
        "such requests",
        Number(&Options::max_prompt_logprob_rows)}},
      {"speculative-config",
       {"speculative decoding by prompt lookup, as JSON: {\"method\": \"ngram\", "
        "\"num_speculative_tokens\": 5, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 1} "
        "(every request; default off)",
        Text(&Options::speculative_config)}},
      {"scheduling-policy",
       {"fcfs (arrival order) or priority (a request's \"priority\", lower first, then arrival: "
        "admission, the step's order and whom preemption evicts)",
        Text(&Options::scheduling_policy)}},
      {"enable-prefix-caching",
       Switch(&Options::enable_prefix_caching, true, "reuse prompt blocks")},
      {"no-enable-prefix-caching", Switch(&Options::enable_prefix_caching, false, "")},
      {"enable-prompt-tokens-details",
       Switch(&Options::prompt_tokens_details, true,
              "usage.prompt_tokens_details.cached_tokens: prompt tokens found in the prefix "
              "cache")},
      {"metrics-prefix",
       {"prefix of the /metrics names (default mqaserve_; vllm: gives vLLM's names, which "
        "dashboards made for vLLM read)",
        Text(&Options::metrics_prefix)}},
      {"enable-auto-tool-choice",
       Switch(&Options::enable_auto_tool_choice, true,
              "chat: tool_choice \"auto\" (the default with tools), the calls read from the "
              "model's text by --tool-call-parser")},
      {"tool-call-parser",
       {"the model's tool-call format for --enable-auto-tool-choice: hermes (<tool_call>{\"name\": "
        "..., \"arguments\": {...}}</tool_call>)",
        OneOf(&Options::tool_call_parser, {"hermes"})}},
      {"max-stored-responses",
       {"Responses API: responses kept for GET /v1/responses/{id} and previous_response_id "
        "(the oldest forgotten first; at most 256 MiB; 0 keeps none)",
        Number(&Options::max_stored_responses)}},
      {"async-scheduling",
       Switch(&Options::async_scheduling, true,
              "decode lookahead: while a lone sequence decodes, the runner launches the "
              "predicted next step before this step's token is back, overlapping the host's work "
              "with the GPU (CUDA, tensor-parallel size 1; outputs unchanged; a failed "
              "prediction, on a stop or an abort, drops a step, and an arrival meanwhile waits "
              "up to one more step)")},
      {"enable-chunked-prefill",
       Switch(&Options::enable_chunked_prefill, true, "split long prompts")},
      {"no-enable-chunked-prefill", Switch(&Options::enable_chunked_prefill, false, "")},
      {"host", {"address to listen on", Text(&Options::host)}},
      {"port", {"port to listen on", Number(&Options::port)}},
      {"api-key", {"require `Authorization: Bearer KEY` on /v1/*", Text(&Options::api_key)}},
      {"ssl-certfile",
       {"HTTPS: the server's certificate (PEM, with its chain); needs --ssl-keyfile",
        Text(&Options::ssl_certfile)}},
      {"ssl-keyfile", {"HTTPS: the certificate's private key (PEM)", Text(&Options::ssl_keyfile)}},
      {"enable-dev-endpoints",
       Switch(&Options::dev_endpoints, true,
              "POST /reset_prefix_cache (and /flush_cache): forget the prefix cache's unused "
              "blocks, as vLLM does with VLLM_SERVER_DEV_MODE=1 (which turns this on too)")},
      {"ssl-ca-certs",
       {"HTTPS: require client certificates signed by these CAs (PEM; mutual TLS)",
        Text(&Options::ssl_ca_certs)}},
      {"served-model-name",
       {"model id in the API (default: the model folder's name); NAME,ALIAS,... also accepts "
        "the aliases as a request's model",
        Text(&Options::served_model_name)}},
      {"chat-template",
       {"chat template for /v1/chat/completions: a file, or the template text "
        "(default: the tokenizer folder's chat_template.jinja or "
        "tokenizer_config.json)",
        Text(&Options::chat_template)}},
      {"generation-config",
       {"auto: the model folder's generation_config.json sets the defaults of requests that "
        "leave temperature, top_p, top_k, min_p, repetition_penalty or max_tokens unset, and its "
        "eos_token_id ids stop every request; vllm: ignore it; or a folder holding one",
        Text(&Options::generation_config)}},
      {"allowed-origins",
       {"CORS: comma-separated browser origins allowed to call the API "
        "(default *: any; empty: none)",
        Text(&Options::allowed_origins)}},
      {"disable-log-stats",
       Switch(&Options::log_stats, false, "no periodic throughput / queue / cache line on stderr")},
      {"log-stats-interval",
       {"seconds between statistics lines (default 10)", Number(&Options::log_stats_interval)}},
      {"log-requests", Switch(&Options::log_requests, true,
                              "one stderr line per finished request (no prompt text)")},
      {"shutdown-timeout",
       {"seconds to finish in-flight requests after SIGTERM", Number(&Options::shutdown_timeout)}},
      {"peer-timeout",
       {"seconds without an answer from another rank before the job is ended",
        Number(&Options::peer_timeout)}},
      {"debug-check-mirror", Switch(&Options::debug_check_mirror, true,
                                    "workers check their block tables against rank 0's each step")},
      {"enforce-eager", Switch(&Options::enforce_eager, true, "CUDA: no decode CUDA graphs")},
      {"cuda-graph-warmup",
       Switch(&Options::cuda_graph_warmup, true,
              "CUDA, one rank: capture every decode graph at start-up, not on first use (the "
              "default)")},
      {"no-cuda-graph-warmup", Switch(&Options::cuda_graph_warmup, false, "")},
      {"gemm-autotune",
       {"off | decode (default): with --cuda-graph-warmup, time cuBLASLt's algorithms for each "
        "decode GEMM shape during the warm-up and keep the fastest",
        OneOf(&Options::gemm_autotune, {"off", "decode"})}},
      {"share-gpu", Switch(&Options::share_gpu, true,
                           "testing: ranks share the node's GPUs, collectives over MPI")},
      {"prompt", {"generate: the prompt text", Text(&Options::prompt)}},
      {"max-tokens", {"generate: tokens to generate", Number(&Options::max_tokens)}},
      {"temperature", {"generate: 0 is greedy", Number(&Options::temperature)}},
      {"top-p", {"generate: nucleus sampling mass", Number(&Options::top_p)}},
      {"top-k", {"generate: keep the k most likely tokens (-1: all)", Number(&Options::top_k)}},
      {"sample-seed",
       {"generate: sampling seed",
        [](Options& o, const std::string& v) -> absl::Status {
          uint64_t s = 0;
          if (!absl::SimpleAtoi(v, &s)) return absl::InvalidArgumentError("not an integer");
          o.sample_seed = s;
          return absl::OkStatus();
        }}},
  };
  return *flags;
}

}  // namespace

absl::StatusOr<Options> ParseOptions(const std::vector<std::string>& args) {
  Options o;
  size_t i = 1;
  if (i < args.size() && args[i] == "generate") {
    o.command = Command::kGenerate;
    ++i;
  } else if (i < args.size() && args[i] == "serve") {
    ++i;
  }
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "' (see --help)"));
    }
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = Flags().find(name);
    if (it == Flags().end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " (see --help)"));
    }
    if (it->second.takes_value && !has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    if (absl::Status s = it->second.set(o, value); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " '", value, "': ", s.message()));
    }
  }
  if (o.model.empty()) return absl::InvalidArgumentError("--model is required");
  if (o.block_size != 8 && o.block_size != 16 && o.block_size != 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size ", o.block_size, ": supported sizes are 8, 16 and 32"));
  }
  if (o.command == Command::kGenerate && o.prompt.empty()) {
    return absl::InvalidArgumentError("generate needs --prompt");
  }
  if (o.port < 0 || o.port > 65535) return absl::InvalidArgumentError("--port out of range");
  if (o.peer_timeout <= 0) return absl::InvalidArgumentError("--peer-timeout must be positive");
  if (!(o.log_stats_interval > 0)) {
    return absl::InvalidArgumentError("--log-stats-interval must be positive");
  }
  if (o.enable_auto_tool_choice != !o.tool_call_parser.empty()) {
    return absl::InvalidArgumentError(
        "--enable-auto-tool-choice and --tool-call-parser go together (e.g. "
        "--enable-auto-tool-choice --tool-call-parser hermes)");
  }
  if (o.max_stored_responses < 0) {
    return absl::InvalidArgumentError("--max-stored-responses must be >= 0");
  }
  if (o.max_prompt_logprob_rows < 0) {
    return absl::InvalidArgumentError("--max-prompt-logprob-rows must be >= 0");
  }
  if (o.scheduling_policy != "fcfs" && o.scheduling_policy != "priority") {
    return absl::InvalidArgumentError(absl::StrCat("--scheduling-policy must be fcfs or priority, got ",
                                                   o.scheduling_policy));
  }
  if (o.metrics_prefix.empty() || !IsMetricNamePrefix(o.metrics_prefix)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-prefix must start a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*), "
        "got '",
        o.metrics_prefix, "'"));
  }
  absl::StatusOr<SpeculativeConfig> speculative = ParseSpeculativeConfig(o.speculative_config);
  if (!speculative.ok()) return speculative.status();
  o.speculative = *speculative;
  return o;
}

std::string UsageText() {
  std::string s =
      "usage: mpirun -np T mqaserve [serve] --model DIR [flags]\n"
      "       mqaserve generate --model DIR --prompt TEXT [flags]\n\nflags:\n";
  for (const auto& [name, flag] : Flags()) {
    if (flag.help.empty()) continue;
    absl::StrAppend(&s, "  --", name, flag.takes_value ? " VALUE" : "", "\n      ", flag.help,
                    "\n");
  }
  return s;
}

}  // namespace mqa
