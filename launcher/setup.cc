#include "launcher/setup.h"

#include <netdb.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kernels/device_info.h"
#include "kernels/gemm.h"
#include "launcher/signals.h"
#include "model/config.h"
#include "model/generation_config.h"
#include "model/gpt_bigcode_runner.h"
#include "model/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "parallel/collectives.h"
#include "parallel/control_channel.h"
#include "parallel/distributed_runner.h"
#include "parallel/mpi_wait.h"
#include "parallel/termination_liveness.h"
#include "runtime/detokenizer.h"
#include "runtime/engine.h"
#include "runtime/http/chat_template.h"
#include "runtime/http/server.h"
#include "runtime/stats_log.h"
#include "runtime/text_file.h"

namespace mqa {
namespace {

// ---- Start-up checks and load progress ----
// A bad flag, folder or device is found by the ranks that can see it; then all ranks agree
// (AgreeAcrossRanks) so that rank 0 alone prints one line and every rank exits non-zero through
// MPI_Finalize, instead of every rank printing and MPI_Abort's banner (main: IsJobWideError).

constexpr char kJobWidePayload[] = "type.mqaserve/job-wide-error";

absl::Status MarkJobWide(absl::Status status) {
  status.SetPayload(kJobWidePayload, absl::Cord("1"));
  return status;
}

// Waits for a non-blocking MPI request with a sleeping backoff: a rank that waits for a slower one
// (still loading its shard) must not spin a core that the loader needs.
absl::Status WaitWithoutSpinning(MPI_Request* request) {
  auto pause = std::chrono::microseconds(100);
  for (;;) {
    int done = 0;
    MPI_RETURN_IF_ERROR(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return absl::OkStatus();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(50'000));
  }
}

// Collective: every rank passes its own result and all return the same one: OK when every rank
// is OK, else the error of the lowest failing rank (its text names the rank when that is not 0),
// marked job-wide.
absl::Status AgreeAcrossRanks(const World& world, const absl::Status& local) {
  if (world.size() == 1) return local.ok() ? local : MarkJobWide(local);
  const int mine = local.ok() ? world.size() : world.rank();
  int first = world.size();
  MPI_Request request;
  MPI_RETURN_IF_ERROR(
      MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, world.comm(), &request));
  RETURN_IF_ERROR(WaitWithoutSpinning(&request));
  if (first == world.size()) return absl::OkStatus();
  std::string text;
  int header[2] = {0, 0};  // status code, text length
  if (world.rank() == first) {
    text = first == 0 ? std::string(local.message())
                      : absl::StrCat(world.Describe(), ": ", local.message());
    header[0] = static_cast<int>(local.code());
    header[1] = static_cast<int>(text.size());
  }
  MPI_RETURN_IF_ERROR(MPI_Ibcast(header, 2, MPI_INT, first, world.comm(), &request));
  RETURN_IF_ERROR(WaitWithoutSpinning(&request));
  text.resize(header[1]);
  MPI_RETURN_IF_ERROR(MPI_Ibcast(text.data(), header[1], MPI_CHAR, first, world.comm(), &request));
  RETURN_IF_ERROR(WaitWithoutSpinning(&request));
  return MarkJobWide(absl::Status(static_cast<absl::StatusCode>(header[0]), text));
}

// The model folder exists, is a folder, can be listed, and has a readable config.json.
absl::Status CheckModelFolder(const std::string& model) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(model, ec);
  if (!fs::exists(st)) {
    return absl::NotFoundError(absl::StrCat("model folder ", model, " does not exist (--model)"));
  }
  if (!fs::is_directory(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model ", model, " is not a folder (it should hold config.json)"));
  }
  fs::directory_iterator list(model, ec);
  if (ec || ::access(model.c_str(), R_OK | X_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat("model folder ", model, " is not readable: ",
                                                    ec ? ec.message() : std::strerror(errno)));
  }
  const std::string config = (fs::path(model) / "config.json").string();
  if (!fs::exists(config, ec)) {
    return absl::NotFoundError(absl::StrCat("model folder ", model, " has no config.json"));
  }
  if (fs::is_directory(config, ec) || ::access(config.c_str(), R_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(config, " is not a readable file"));
  }
  return absl::OkStatus();
}

// The TLS part of the server's options (checked at start-up, before the checkpoint is loaded).
ServerOptions MakeServerTls(const Options& o) {
  ServerOptions s;
  s.ssl_certfile = o.ssl_certfile;
  s.ssl_keyfile = o.ssl_keyfile;
  s.ssl_ca_certs = o.ssl_ca_certs;
  return s;
}

// Binds (and closes) a socket on host:port, so that a port in use is a start-up error before the
// checkpoint is loaded, not after.
absl::Status CheckPortFree(const std::string& host, int port) {
  if (port == 0) return absl::OkStatus();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), std::to_string(port).c_str(),
                               &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--host ", host, ": ", ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owned(found, &::freeaddrinfo);
  const int fd = ::socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket(): ", std::strerror(errno)));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as the HTTP server does
  const int bound = ::bind(fd, found->ai_addr, found->ai_addrlen);
  const int bind_errno = errno;
  ::close(fd);
  if (bound != 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", host, ":", port, ": ", std::strerror(bind_errno),
        bind_errno == EADDRINUSE ? " (another process has this port; choose one with --port)"
                                 : ""));
  }
  return absl::OkStatus();
}

// The host a client should use for --host: a wildcard bind (0.0.0.0, ::) is no use to someone
// reading a batch job's output, so it names this node instead.
std::string ConnectHost(const std::string& host) {
  if (!host.empty() && host != "0.0.0.0" && host != "::" && host != "[::]") return host;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return host;
  return name;
}

// Prints this rank's weight-loading progress (bytes, tensors, elapsed) to stderr at most once per
// interval, so that loading a large checkpoint does not leave the terminal silent. The interval
// is MQASERVE_PROGRESS_INTERVAL seconds (default 2; 0 prints every tensor). Called on the loading
// thread only (LoadOptions::progress).
class LoadProgress {
 public:
  LoadProgress(const World& world, const ModelConfig& config)
      : who_(world.Describe()),
        // GPT-BigCode: 12 tensors per layer, wte, wpe and ln_f (2); one more with an untied
        // lm_head, which `tensors` then reports.
        expected_tensors_(12 * config.n_layer + 4),
        start_(Clock::now()),
        last_(start_) {
    if (const char* env = std::getenv("MQASERVE_PROGRESS_INTERVAL")) {
      interval_ = std::chrono::duration<double>(std::atof(env));
    }
  }

  void operator()(uint64_t bytes, int64_t tensors) {
    bytes_ = bytes;
    tensors_ = tensors;
    const Clock::time_point now = Clock::now();
    if (now - last_ < interval_) return;
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "mqaserve: %s: loading weights: %.1f MiB, %lld/%lld tensors, %.1f s\n",
                 who_.c_str(), bytes / 1048576.0, static_cast<long long>(tensors),
                 static_cast<long long>(std::max(tensors, expected_tensors_)), seconds);
  }

  // "123.4 MiB in 196 tensors, 5.6 s" for the rank's "loaded" line.
  std::string Summary() const {
    const double seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    char text[96];
    std::snprintf(text, sizeof(text), "%.1f MiB in %lld tensors, %.1f s", bytes_ / 1048576.0,
                  static_cast<long long>(tensors_), seconds);
    return text;
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::string who_;
  int64_t expected_tensors_;
  Clock::time_point start_;
  Clock::time_point last_;
  std::chrono::duration<double> interval_{2.0};
  uint64_t bytes_ = 0;
  int64_t tensors_ = 0;
};

absl::StatusOr<DType> ResolveDType(const Options& o, const ModelConfig& config) {
  if (o.device == "cpu") {
    if (o.dtype != "auto" && o.dtype != "float32") {
      return absl::InvalidArgumentError(
          absl::StrCat("--dtype ", o.dtype, ": the CPU backend computes in float32"));
    }
    return DType::kF32;
  }
  if (o.dtype == "float16") return DType::kF16;
  if (o.dtype == "bfloat16") return DType::kBF16;
  if (o.dtype == "float32") {
    return absl::InvalidArgumentError(
        "--dtype float32: the CUDA backend runs float16 or bfloat16 (use auto, float16 or bfloat16)");
  }
  return config.checkpoint_dtype == DType::kBF16 ? DType::kBF16 : DType::kF16;
}

absl::StatusOr<std::string> TokenizerPath(const Options& o) {
  std::filesystem::path p = o.tokenizer.empty() ? o.model : o.tokenizer;
  if (std::filesystem::is_directory(p)) p /= "tokenizer.json";
  if (!std::filesystem::exists(p)) {
    return absl::NotFoundError(absl::StrCat(
        "no tokenizer: ", p.string(), " does not exist (pass --tokenizer DIR or FILE)"));
  }
  return p.string();
}

EngineOptions MakeEngineOptions(const Options& o, const ModelConfig& config,
                                const Tokenizer& tokenizer) {
  EngineOptions e;
  e.max_num_seqs = o.max_num_seqs;
  e.max_num_batched_tokens = o.max_num_batched_tokens;
  e.max_model_len = o.max_model_len > 0 ? o.max_model_len : static_cast<int>(config.n_positions);
  e.max_queued_requests = o.max_queued_requests;
  e.max_prompt_logprob_rows = o.max_prompt_logprob_rows;
  e.speculative = o.speculative;
  e.priority_scheduling = o.scheduling_policy == "priority";
  e.enable_prefix_caching = o.enable_prefix_caching;
  e.enable_chunked_prefill = o.enable_chunked_prefill;
  e.decode_lookahead = o.async_scheduling;
  e.seed = o.seed;
  if (auto eos = tokenizer.eos_id()) {
    e.eos_token_id = *eos;
  } else if (config.eos_token_id >= 0) {
    e.eos_token_id = static_cast<int32_t>(config.eos_token_id);
  }
  return e;
}

absl::Status Generate(const Options& o, Engine& engine, const Tokenizer& tokenizer) {
  EngineRequest request;
  request.request_id = "generate";
  request.prompt_token_ids = tokenizer.Encode(o.prompt);
  request.params.max_tokens = o.max_tokens;
  request.params.temperature = o.temperature;
  request.params.top_p = o.top_p;
  request.params.top_k = o.top_k;
  request.params.seed = o.sample_seed;
  // Stop strings are the engine's job (StopStringMatcher): the detokenizer gets none.
  request.make_detokenizer = [&tokenizer] {
    return std::make_unique<StreamingDetokenizer>(tokenizer, StreamingDetokenizerOptions{});
  };
  RequestOutputQueue outputs;
  request.on_output = outputs.Callback();
  RETURN_IF_ERROR(engine.AddRequest(std::move(request)));
  std::fputs(o.prompt.c_str(), stdout);
  bool finished = false;
  while (!finished) {
    RETURN_IF_ERROR(engine.Step());
    while (auto out = outputs.Pop(absl::ZeroDuration())) {
      if (!out->error.ok()) return out->error;
      for (const auto& sample : out->samples) std::fputs(sample.text.c_str(), stdout);
      std::fflush(stdout);
      finished = finished || out->finished;
    }
  }
  std::fputs("\n", stdout);
  return absl::OkStatus();
}

// A tokenizer_config.json token field: "text" or {"content": "text"}.
std::string ConfigToken(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

// The chat template for /v1/chat/completions and its bos / eos token texts: --chat-template (a
// file, or the template itself), else the tokenizer folder's chat_template.jinja, else its
// tokenizer_config.json's chat_template ("default" of a named list). A --chat-template that does
// not parse fails start-up; a bundled one that does not is reported and chat stays off.
struct ServeSetup {
  std::shared_ptr<const ChatTemplate> chat_template;
  std::string bos_token, eos_token;
  // --generation-config: request defaults, and the end-of-sequence ids besides the engine's EOS.
  GenerationDefaults generation;
};

// --generation-config auto (the model folder's generation_config.json), vllm (none: the server's
// own defaults, as vLLM names it) or a folder holding one. Its end-of-sequence ids other than the
// engine's EOS stop requests as stop_token_ids; each must be in the vocabulary.
absl::Status LoadGenerationDefaults(const Options& o, const EngineOptions& engine,
                                    int64_t vocab_size, ServeSetup& setup) {
  if (o.generation_config == "vllm") return absl::OkStatus();
  const std::filesystem::path dir = o.generation_config == "auto" ? o.model : o.generation_config;
  if (o.generation_config != "auto" && !std::filesystem::is_directory(dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--generation-config ", o.generation_config, ": not auto, vllm or a folder"));
  }
  const std::string path = (dir / "generation_config.json").string();
  ASSIGN_OR_RETURN(GenerationDefaults defaults, ReadGenerationConfig(path));
  std::vector<int32_t> stops;
  for (int32_t id : defaults.eos_token_ids) {
    if (id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": \"eos_token_id\" ", id, " is outside the vocabulary (", vocab_size, " tokens)"));
    }
    if (id != engine.eos_token_id) stops.push_back(id);
  }
  defaults.eos_token_ids = std::move(stops);
  if (!defaults.sampling.empty() || !defaults.eos_token_ids.empty()) {
    std::fprintf(stderr, "mqaserve: from %s: request defaults %s, stop token ids %s\n",
                 path.c_str(), defaults.sampling.dump().c_str(),
                 nlohmann::json(defaults.eos_token_ids).dump().c_str());
  }
  setup.generation = std::move(defaults);
  return absl::OkStatus();
}

absl::Status LoadChatTemplate(const Options& o, const Tokenizer& tokenizer, ServeSetup& chat) {
  ASSIGN_OR_RETURN(const std::string tokenizer_path, TokenizerPath(o));
  const std::filesystem::path dir = std::filesystem::path(tokenizer_path).parent_path();
  nlohmann::json config = nlohmann::json::object();
  if (absl::StatusOr<std::string> text = ReadTextFile(dir / "tokenizer_config.json"); text.ok()) {
    config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!config.is_object()) {
      std::fprintf(stderr, "mqaserve: %s/tokenizer_config.json is not a JSON object: ignored\n",
                   dir.string().c_str());
      config = nlohmann::json::object();
    }
  }
  chat.bos_token = ConfigToken(config, "bos_token");
  chat.eos_token = ConfigToken(config, "eos_token");
  if (chat.eos_token.empty()) {
    if (auto eos = tokenizer.eos_id()) chat.eos_token = tokenizer.Decode({*eos});
  }

  std::string source, origin;
  if (!o.chat_template.empty()) {
    origin = o.chat_template;
    if (std::filesystem::is_regular_file(o.chat_template)) {
      ASSIGN_OR_RETURN(source, ReadTextFile(o.chat_template));
    } else {
      source = o.chat_template;
      origin = "--chat-template";
    }
  } else if (absl::StatusOr<std::string> jinja = ReadTextFile(dir / "chat_template.jinja");
             jinja.ok()) {
    source = *jinja;
    origin = (dir / "chat_template.jinja").string();
  } else if (auto it = config.find("chat_template"); it != config.end()) {
    origin = (dir / "tokenizer_config.json").string() + ": chat_template";
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      for (const auto& named : *it) {
        if (named.is_object() && named.value("name", "") == "default" &&
            named.contains("template") && named["template"].is_string()) {
          source = named["template"].get<std::string>();
        }
      }
    }
  }
  if (source.empty()) return absl::OkStatus();
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
  if (!parsed.ok()) {
    const absl::Status status = absl::InvalidArgumentError(
        absl::StrCat("the chat template of ", origin, ": ", parsed.status().message()));
    if (!o.chat_template.empty()) return status;
    std::fprintf(stderr, "mqaserve: %s; /v1/chat/completions is off (give --chat-template)\n",
                 std::string(status.message()).c_str());
    return absl::OkStatus();
  }
  chat.chat_template = std::make_shared<const ChatTemplate>(*std::move(parsed));
  std::fprintf(stderr, "mqaserve: chat template from %s\n", origin.c_str());
  return absl::OkStatus();
}

// Serves HTTP until SIGTERM / SIGINT (or an engine failure). The engine runs on this thread, the
// one that started MPI; cpp-httplib's threads parse and tokenize; the watcher thread drains.
absl::Status Serve(const Options& o, Engine& engine, const Tokenizer& tokenizer, int max_model_len,
                   const ServeSetup& chat) {
  ServerOptions server_options = MakeServerTls(o);
  server_options.host = o.host;
  server_options.port = o.port;
  server_options.api_key = o.api_key;
  const char* dev_mode = std::getenv("VLLM_SERVER_DEV_MODE");
  server_options.dev_endpoints =
      o.dev_endpoints || (dev_mode != nullptr && std::string_view(dev_mode) == "1");
  server_options.max_model_len = max_model_len;
  std::vector<std::string> names = absl::StrSplit(o.served_model_name, ',', absl::SkipEmpty());
  server_options.served_model_name =
      names.empty() ? std::filesystem::path(o.model).lexically_normal().filename().string()
                    : names[0];
  if (names.size() > 1) server_options.model_aliases.assign(names.begin() + 1, names.end());
  if (server_options.served_model_name.empty()) server_options.served_model_name = o.model;
  server_options.allowed_origins.clear();
  for (absl::string_view origin : absl::StrSplit(o.allowed_origins, ',', absl::SkipWhitespace())) {
    server_options.allowed_origins.emplace_back(absl::StripAsciiWhitespace(origin));
  }
  if (o.log_requests) {
    server_options.request_log = [](const std::string& line) {
      std::fprintf(stderr, "mqaserve: %s\n", line.c_str());
    };
  }
  server_options.sampling_defaults = chat.generation.sampling;
  server_options.prompt_tokens_details = o.prompt_tokens_details;
  server_options.metrics_prefix = o.metrics_prefix;
  server_options.max_stored_responses = static_cast<size_t>(o.max_stored_responses);
  server_options.tool_call_parser = o.tool_call_parser;
  server_options.stop_token_ids = chat.generation.eos_token_ids;
  server_options.chat_template = chat.chat_template;
  server_options.bos_token = chat.bos_token;
  server_options.eos_token = chat.eos_token;
  HttpServer server(server_options, &engine, &tokenizer);
  if (absl::Status started = server.Start(); !started.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o.host, ":", o.port, ": ",
                                               started.message()));
  }
  std::fprintf(stderr, "mqaserve: serving %s on %s://%s:%d (OpenAI API at /v1)%s\n",
               server_options.served_model_name.c_str(), o.ssl_certfile.empty() ? "http" : "https",
               ConnectHost(o.host).c_str(), server.port(),
               o.ssl_ca_certs.empty() ? "" : ", client certificates required");
  server.SetReady();
  std::optional<StatsLogger> stats;
  if (o.log_stats) {
    stats.emplace(&engine, absl::Seconds(o.log_stats_interval), [](const std::string& line) {
      std::fprintf(stderr, "mqaserve: %s\n", line.c_str());
    });
  }

  // First signal: refuse new requests, let the ones in flight finish for up to
  // --shutdown-timeout, then stop the engine (what is left is aborted). Second signal: stop now.
  TerminationWatcher watcher(
      [&] {
        std::fprintf(stderr, "mqaserve: shutting down: no new requests, finishing those in flight "
                             "(up to %.0f s)\n", o.shutdown_timeout);
        server.SetFailed(absl::UnavailableError("the server is shutting down"));
        // The launcher SIGTERMs us too when another rank died: a step stuck waiting for it
        // then fails at once, so that its requests get an error before the SIGKILL.
        AbandonStuckWaits();
        const absl::Time deadline = absl::Now() + absl::Seconds(o.shutdown_timeout);
        while (absl::Now() < deadline) {
          const EngineMetrics m = engine.metrics();
          if (m.num_running == 0 && m.num_waiting == 0) break;
          absl::SleepFor(absl::Milliseconds(20));
        }
        engine.Stop();
      },
      [&] { engine.Stop(); });
  absl::Status run = engine.Run();
  if (!run.ok()) {
    server.SetFailed(run);
    absl::SleepFor(absl::Milliseconds(200));  // let the failed requests' errors reach clients
  }
  server.Stop();
  return run;
}

absl::Status RunRoot(const Options& o, Engine& engine, const Tokenizer& tokenizer,
                     int max_model_len, const ServeSetup& chat) {
  switch (o.command) {
    case Command::kGenerate:
      return Generate(o, engine, tokenizer);
    case Command::kServe:
      return Serve(o, engine, tokenizer, max_model_len, chat);
  }
  return absl::OkStatus();
}

}  // namespace

DecodeWarmUpPlan PlanDecodeWarmUp(const Options& options, bool cuda, int world_size) {
  DecodeWarmUpPlan plan;
  plan.warm_up = cuda && world_size == 1 && !options.enforce_eager && options.cuda_graph_warmup;
  plan.tune_gemms = plan.warm_up && options.gemm_autotune == "decode";
  return plan;
}

bool IsJobWideError(const absl::Status& status) {
  return status.GetPayload(kJobWidePayload).has_value();
}

absl::Status RunRank(const Options& o, const World& world) {
  // Start-up checks on every rank (rank 0 also reads the tokenizer and tries the port), then one
  // collective verdict: a problem is one line from rank 0, never a hang of the others.
  ModelConfig config;
  std::optional<Tokenizer> tokenizer;
  ServeSetup chat;  // rank 0, serving
  LoadOptions load;
  int cuda_device = -1;  // --device cuda: this rank's GPU (its node-local rank)
  auto check = [&]() -> absl::Status {
    if (o.tensor_parallel_size > 0 && o.tensor_parallel_size != world.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tensor-parallel-size ", o.tensor_parallel_size,
                       " differs from the number of MPI ranks (", world.size(),
                       "): start one rank per shard, e.g. mpirun -np ", o.tensor_parallel_size));
    }
    RETURN_IF_ERROR(CheckModelFolder(o.model));
    ASSIGN_OR_RETURN(config, LoadModelConfig(o.model));
    if (absl::StatusOr<ShardInfo> shard = MakeShardInfo(config, world.rank(), world.size());
        !shard.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel-size ", world.size(),
                                                     " does not fit ", o.model, ": ",
                                                     shard.status().message()));
    }
    if (o.device == "cuda") {
      const int devices = CudaDeviceCount();
      if (devices == 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--device cuda: no CUDA device on ", world.hostname(), " for rank ", world.rank(),
            " (none visible to the driver, or mqaserve was built without CUDA); "
            "use --device cpu or run where GPUs are"));
      }
      if (o.share_gpu) {
        cuda_device = world.local_rank() % devices;
      } else {
        ASSIGN_OR_RETURN(cuda_device, DeviceForRank(world, devices));
      }
      RETURN_IF_ERROR(SetCudaDevice(cuda_device));
    }
    ASSIGN_OR_RETURN(load.dtype, ResolveDType(o, config));
    if (world.is_root()) {
      ASSIGN_OR_RETURN(const std::string tokenizer_path, TokenizerPath(o));
      ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromFile(tokenizer_path));
      if (o.command == Command::kServe) {
        RETURN_IF_ERROR(CheckPortFree(o.host, o.port));
        RETURN_IF_ERROR(CheckServerTls(MakeServerTls(o)));
        RETURN_IF_ERROR(LoadChatTemplate(o, *tokenizer, chat));
        RETURN_IF_ERROR(LoadGenerationDefaults(o, MakeEngineOptions(o, config, *tokenizer),
                                               config.vocab_size, chat));
      }
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(AgreeAcrossRanks(world, check()));

  load.model_dir = o.model;
  load.load_format = o.load_format;
  load.seed = o.seed;
  LoadProgress progress(world, config);
  load.progress = [&progress](uint64_t bytes, int64_t tensors) { progress(bytes, tensors); };
  const bool cuda = o.device == "cuda";
  if (!cuda && std::getenv("OPENBLAS_NUM_THREADS") == nullptr &&
      std::getenv("OMP_NUM_THREADS") == nullptr) {
    // This rank's share of the cores it may run on (OpenBLAS would take them all on every rank).
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    const int usable = sched_getaffinity(0, sizeof(cpus), &cpus) == 0
                           ? CPU_COUNT(&cpus)
                           : static_cast<int>(std::thread::hardware_concurrency());
    SetCpuGemmThreads(std::max(1, usable / std::max(1, world.local_size())));
  }
  std::unique_ptr<Collectives> collectives;
  CollectivesOptions collectives_options;
  collectives_options.timeout = absl::Seconds(o.peer_timeout);
  if (world.size() == 1) {
    collectives = MakeLocalCollectives();
  } else if (cuda && !o.share_gpu) {
    ASSIGN_OR_RETURN(collectives, MakeNcclCollectives(world, cuda_device, collectives_options));
  } else {
    ASSIGN_OR_RETURN(collectives, MakeMpiCollectives(world, collectives_options));
  }
  GptBigCodeRunnerOptions runner_options;
  runner_options.block_size = o.block_size;
  runner_options.num_kv_blocks = o.num_kv_blocks;
  if (cuda) {
    runner_options.device = Device::kCuda;
    // The pool is sized from free memory after a profiling forward unless --num-kv-blocks says.
    // Ranks that share a GPU (--share-gpu) share its memory too.
    runner_options.gpu_memory_utilization =
        o.gpu_memory_utilization / (o.share_gpu ? world.local_size() : 1);
  } else {
    runner_options.kv_cache_bytes = static_cast<int64_t>(o.kv_cache_memory_gib * (1LL << 30));
  }
  runner_options.max_batched_tokens = o.max_num_batched_tokens;
  // A step's logits rows: one per sequence, plus the prompt rows the engine allows for prompt
  // log-probabilities (--max-prompt-logprob-rows), preallocated before the KV pool
  // is sized so that a scoring request never grows the workspace later.
  runner_options.max_logits_rows = int64_t{o.max_num_seqs} + o.max_prompt_logprob_rows;
  runner_options.cuda_graphs = !o.enforce_eager;
  // Speculative decoding's check steps (1 + k tokens a sequence) run as CUDA graphs too: on the
  // H200 a SantaCoder b1 check step of 1 + 5 tokens took 1.331 ms graphed against 1.399 eager,
  // StarCoder's 8.636 against 8.746 (BENCHMARKS.md, 2026-12-05 04:13 UTC).
  runner_options.max_graph_query = 1 + o.speculative.num_speculative_tokens;
  // Decode GEMM shapes are tuned during the decode-graph warm-up only (frozen right after it):
  // a StarCoder b32 step 0.9-2.0% faster on H100s (BENCHMARKS.md, 2026-12-05 late evening).
  const DecodeWarmUpPlan warm_up_plan = PlanDecodeWarmUp(o, cuda, world.size());
  const bool warm_up = warm_up_plan.warm_up;
  runner_options.gemm_autotune = warm_up_plan.tune_gemms;
  runner_options.gemm_autotune_max_m = kDecodeGemmAutotuneMaxM;
  // A checkpoint that fails on one rank (truncated file, wrong shapes) ends the job on all.
  auto created = CreateGptBigCodeRunnerFromDir(load, collectives.get(), runner_options);
  RETURN_IF_ERROR(AgreeAcrossRanks(world, created.status()));
  GptBigCodeRunner* const local = created->get();
  std::unique_ptr<ModelRunner> runner = std::move(*created);
  std::fprintf(stderr,
               "mqaserve: %s: loaded %s (%lld layers, %lld heads of %lld, %lld KV head%s, vocab "
               "%lld) on %s (%s); %d KV blocks of %d tokens\n",
               world.Describe().c_str(), o.model.c_str(), static_cast<long long>(config.n_layer),
               static_cast<long long>(config.n_head), static_cast<long long>(config.head_dim()),
               static_cast<long long>(config.num_kv_heads), config.num_kv_heads == 1 ? "" : "s",
               static_cast<long long>(config.vocab_size), o.device.c_str(),
               progress.Summary().c_str(), runner->num_kv_blocks(), runner->block_size());

  std::unique_ptr<ControlChannel> channel;
  DistributedRunner* distributed = nullptr;
  PlanCodecOptions codec;
  codec.block_size = o.block_size;
  codec.send_mirror_hash = o.debug_check_mirror;
  std::unique_ptr<TerminationLiveness> liveness;
  if (world.size() > 1) {
    ControlChannelOptions channel_options;
    channel_options.send_timeout = absl::Seconds(o.peer_timeout);
    ASSIGN_OR_RETURN(channel, ControlChannel::Create(world, channel_options));
    // On SIGTERM a worker tells rank 0 it is alive, so that rank 0's drain waits out a slow step
    // instead of taking the worker for dead (parallel/termination_liveness.h).
    ASSIGN_OR_RETURN(liveness, TerminationLiveness::Create(world));
    if (!world.is_root()) {
      WorkerOptions worker;
      worker.codec = codec;
      // Rank 0 sends a keep-alive plan every second while idle.
      worker.receive_timeout = absl::Seconds(std::max(o.peer_timeout, 5.0));
      TerminationWatcher watcher([] { TerminationLiveness::NoteTerminating(); }, [] {});
      return RunWorker(*channel, *runner, worker);
    }
    auto wrapped = std::make_unique<DistributedRunner>(std::move(runner), channel.get(), codec);
    distributed = wrapped.get();
    runner = std::move(wrapped);
  }
  const EngineOptions engine_options = MakeEngineOptions(o, config, *tokenizer);
  if (warm_up) {
    // Every decode graph the engine's limits allow, now rather than on a live request's step
    // (one rank: graphs are off at T > 1).
    const absl::Time start = absl::Now();
    const absl::StatusOr<int> graphs =
        local->WarmUpDecodeGraphs(engine_options.max_num_seqs, engine_options.max_model_len);
    if (!graphs.ok()) {
      return absl::Status(
          graphs.status().code(),
          absl::StrCat(graphs.status().message(), " (--enforce-eager runs without CUDA graphs)"));
    }
    std::fprintf(
        stderr,
        "mqaserve: captured %d decode CUDA graphs (up to %d sequences, %d tokens) in "
        "%.1f s%s%s\n",
        *graphs, engine_options.max_num_seqs, engine_options.max_model_len,
        absl::ToDoubleSeconds(absl::Now() - start), runner_options.gemm_autotune ? "; " : "",
        runner_options.gemm_autotune ? local->model().gemm_autotune_summary().c_str() : "");
  }
  if (engine_options.decode_lookahead && (!runner->samples_on_device() || world.size() > 1)) {
    std::fprintf(stderr,
                 "mqaserve: --async-scheduling has no effect here: decode lookahead needs "
                 "--device cuda and one rank\n");
  }
  ASSIGN_OR_RETURN(auto engine, Engine::Create(std::move(runner), engine_options));
  absl::Status result = RunRoot(o, *engine, *tokenizer, engine_options.max_model_len, chat);
  // Workers leave their loop only on the shutdown plan (or their timeout).
  // (Not after a peer failure: a shutdown plan would only wait for the rank that is gone.)
  const bool peer_failed =
      absl::IsDeadlineExceeded(result) || absl::IsInternal(result) || absl::IsAborted(result);
  bool workers_done = !peer_failed;
  if (distributed != nullptr && !peer_failed) {
    absl::Status shutdown = distributed->Shutdown();
    workers_done = shutdown.ok();
    if (result.ok()) result = shutdown;
  }
  // With the workers out of their loop, rank 0's error (a port taken after all, a failed
  // request loop) needs no MPI_Abort: rank 0 prints it and the job exits non-zero.
  if (!result.ok() && workers_done) result = MarkJobWide(result);
  return result;
}

}  // namespace mqa
