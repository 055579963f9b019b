#include "runtime/http/server.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "openssl/err.h"
#include "runtime/detokenizer.h"
#include "runtime/grammar.h"
#include "runtime/guided.h"
#include "runtime/http/anthropic_job.h"
#include "runtime/http/api_types.h"
#include "runtime/http/beam_search_job.h"
#include "runtime/http/chat_job.h"
#include "runtime/http/completion_job.h"
#include "runtime/http/llamacpp_job.h"
#include "runtime/http/metrics.h"
#include "runtime/http/response_store.h"
#include "runtime/http/responses_job.h"
#include "runtime/http/tgi_job.h"
#include "runtime/http/triton_job.h"
#include "runtime/status.h"
#include "runtime/version.h"

namespace mqa {
namespace {

using json = nlohmann::json;

constexpr char kJson[] = "application/json";

// Replies with `status` in one API's error shape: Body renders it, Code picks the HTTP status.
template <std::string (*Body)(const absl::Status&),
          int (*Code)(const absl::Status&) = HttpStatusFor>
void ReplyErrorAs(httplib::Response& res, const absl::Status& status) {
  res.status = Code(status);
  res.set_content(Body(status), kJson);
}

constexpr auto ReplyError = &ReplyErrorAs<ErrorBody>;  // OpenAI's
constexpr auto ReplyTgiError = &ReplyErrorAs<TgiErrorBody, TgiHttpStatusFor>;
constexpr auto ReplyTritonError = &ReplyErrorAs<TritonErrorBody>;
constexpr auto ReplyAnthropicError = &ReplyErrorAs<AnthropicErrorBody>;

void ReplyJson(httplib::Response& res, const json& body) {
  res.status = 200;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), kJson);
}

// Compares without an early exit, so response times do not reveal how much of a key matched.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// httplib::Server (or SSLServer) with access to its listening socket: the library (Debian's build
// of 0.11) listens with a backlog of 5, and a burst of clients connecting at once overflows that
// (connections dropped or stalled for a SYN retransmit). Listening again on the bound socket
// raises it.
template <typename Base>
class Listening : public Base {
 public:
  using Base::Base;
  absl::Status RaiseBacklog(int backlog) {
    if (::listen(this->svr_sock_, backlog) != 0) {
      return absl::InternalError(
          absl::StrCat("listen(backlog ", backlog, "): ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
};

// The server the options ask for: plain HTTP, or TLS (ServerOptions::ssl_*), with its backlog
// hook.
struct ServerSocket {
  std::unique_ptr<httplib::Server> server;
  std::function<absl::Status(int)> raise_backlog;
};

ServerSocket MakeServerSocket(const ServerOptions& o) {
  ServerSocket s;
  auto keep = [&s](auto owned) {
    s.raise_backlog = [p = owned.get()](int backlog) { return p->RaiseBacklog(backlog); };
    s.server = std::move(owned);
  };
  if (o.ssl_certfile.empty() && o.ssl_keyfile.empty()) {
    keep(std::make_unique<Listening<httplib::Server>>());
  } else {
    keep(std::make_unique<Listening<httplib::SSLServer>>(
        o.ssl_certfile.c_str(), o.ssl_keyfile.c_str(),
        o.ssl_ca_certs.empty() ? nullptr : o.ssl_ca_certs.c_str()));
  }
  return s;
}

// Why the TLS settings cannot be used, naming the file; OK when `server` is valid.
absl::Status TlsProblem(const ServerOptions& o, const httplib::Server& server) {
  if (o.ssl_certfile.empty() != o.ssl_keyfile.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both a certificate (--ssl-certfile) and its private key (--ssl-keyfile)");
  }
  if (o.ssl_certfile.empty() && !o.ssl_ca_certs.empty()) {
    return absl::InvalidArgumentError(
        "--ssl-ca-certs (client certificates) needs --ssl-certfile and --ssl-keyfile");
  }
  for (const std::string* file : {&o.ssl_certfile, &o.ssl_keyfile, &o.ssl_ca_certs}) {
    if (!file->empty() && ::access(file->c_str(), R_OK) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("TLS: cannot read ", *file, ": ", std::strerror(errno)));
    }
  }
  if (server.is_valid()) return absl::OkStatus();
  char why[256] = "no OpenSSL error recorded";
  if (const unsigned long e = ERR_peek_last_error(); e != 0)
    ERR_error_string_n(e, why, sizeof(why));
  ERR_clear_error();
  return absl::InvalidArgumentError(
      absl::StrCat("TLS: cannot use the certificate ", o.ssl_certfile, " with the key ",
                   o.ssl_keyfile, " (not PEM, or the key does not match the certificate): ", why));
}

std::string NumericHost(const sockaddr_storage& addr, socklen_t len, int* port) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), serv,
                  sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "";
  }
  *port = std::atoi(serv);
  return host;
}

// The socket of the connection `req` came on, or -1. cpp-httplib 0.11 does not hand it to
// handlers, and a client that leaves while its request is queued or generating without a stream
// is only noticed on this socket. A handler runs on the thread that owns the connection and the
// socket stays open until the response has been written, so matching the request's peer and
// local addresses against this process's sockets finds it, and it cannot be reused meanwhile.
int FindConnectionSocket(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    const int fd = std::atoi(entry->d_name);
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int port = -1;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
    if (NumericHost(addr, len, &port) != req.remote_addr || port != req.remote_port) continue;
    len = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) continue;
    if (NumericHost(addr, len, &port) != req.local_addr || port != req.local_port) continue;
    found = fd;
    break;
  }
  closedir(dir);
  return found;
}

// True once the peer has closed or reset the connection (an HTTP client waiting for its response
// never half-closes, so a FIN means it left).
bool PeerGone(int fd) {
  if (fd < 0) return false;
  pollfd p{.fd = fd, .events = POLLRDHUP, .revents = 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

struct HttpServer::Impl {
  enum class Health { kLoading, kReady, kFailed };

  Impl(ServerOptions options_in, Engine* engine_in, const Tokenizer* tokenizer_in)
      : options(std::move(options_in)),
        engine(engine_in),
        tokenizer(tokenizer_in),
        metrics(options.served_model_name, options.metrics_prefix, options.max_model_len),
        created(absl::ToUnixSeconds(absl::Now())),
        stored_responses(std::make_shared<ResponseStore>(options.max_stored_responses,
                                                         options.max_stored_response_bytes)) {}

  void InstallRoutes();
  // The Access-Control-Allow-Origin value for `req` ("" when it has no Origin or one not allowed).
  std::string AllowedOrigin(const httplib::Request& req) const;

  absl::Status CheckAuth(const httplib::Request& req) const;
  absl::Status CheckServing() const;
  absl::Status CheckModel(const std::optional<std::string>& model) const;

  // Parses, tokenizes and submits one completion / infill call.
  absl::StatusOr<std::shared_ptr<HttpJob>> StartJob(const httplib::Request& req, bool infill,
                                                    bool* stream);
  absl::StatusOr<std::vector<PreparedPrompt>> Prepare(const CompletionRequest& request) const;
  // The fill-in-the-middle prompt of `prefix` and `suffix` (user text: special-token text in them
  // stays text); InvalidArgument naming `param` where the model has no FIM tokens.
  absl::StatusOr<std::vector<int32_t>> FimPrompt(std::string_view prefix, std::string_view suffix,
                                                 absl::string_view param) const;
  // Prepares `request`'s prompts, makes their job (model, created and n filled in here) and
  // submits its engine requests with `params`.
  absl::StatusOr<std::shared_ptr<CompletionJob>> SubmitJob(const CompletionRequest& request,
                                                           const SamplingParams& params,
                                                           CompletionJobOptions job_options);
  absl::Status Submit(CompletionJob& job, const SamplingParams& params);
  void AbortAll(const HttpJob& job);
  // params.guide compiled from params.guided_regex or guided_grammar against the tokenizer
  // (InvalidArgument naming what the pattern or grammar cannot be); the last kGuideCacheSize are
  // kept compiled (a grammar guide keeps the states texts have reached).
  absl::Status AttachGuide(SamplingParams& params);
  static constexpr size_t kGuideCacheSize = 32;
  std::mutex guide_mu;
  std::shared_ptr<const GuideVocab> guide_vocab;               // built on first use
  std::vector<std::shared_ptr<const Guide>> guide_cache;       // most recent last

  // The request log's line (ServerOptions::request_log): `job` null for a call refused before it
  // started.
  void LogRequest(const httplib::Request& req, int status, const HttpJob* job,
                  absl::string_view note) const;
  void HandleCompletion(const httplib::Request& req, httplib::Response& res, bool infill);
  // TGI's API. kRoot: POST /, streamed when the body says so, a one-element list otherwise.
  enum class TgiRoute { kGenerate, kGenerateStream, kRoot };
  void HandleTgi(const httplib::Request& req, httplib::Response& res, TgiRoute route);
  // llama.cpp's /completion and /infill.
  absl::StatusOr<std::shared_ptr<LlamaCppJob>> StartLlamaCppJob(const httplib::Request& req,
                                                                bool infill, bool* stream);
  void HandleLlamaCpp(const httplib::Request& req, httplib::Response& res, bool infill);
  absl::StatusOr<std::shared_ptr<TgiJob>> StartTgiJob(const httplib::Request& req, TgiRoute route,
                                                      bool* stream);
  void HandleTgiInfo(const httplib::Request& req, httplib::Response& res);
  // Triton's generate extension (TensorRT-LLM's models): POST /v2/models/{model}[/versions/{v}]
  // /generate and /generate_stream; the model named in the path must be served (or one of the
  // TensorRT-LLM backend's model names, kTritonModelNames).
  absl::Status CheckTritonModel(const std::string& model) const;
  absl::StatusOr<std::shared_ptr<TritonJob>> StartTritonJob(const httplib::Request& req,
                                                            bool stream_route, bool* stream);
  void HandleTriton(const httplib::Request& req, httplib::Response& res, bool stream_route);
  // POST /v1/chat/completions.
  absl::StatusOr<std::shared_ptr<ChatJob>> StartChatJob(const httplib::Request& req, bool* stream);
  absl::StatusOr<std::shared_ptr<ResponsesJob>> StartResponsesJob(const httplib::Request& req,
                                                                  bool* stream);
  absl::StatusOr<std::shared_ptr<AnthropicJob>> StartAnthropicJob(const httplib::Request& req,
                                                                  bool* stream);
  // A chat request whose tool_choice is "auto": refused without a tool-call parser (400 naming
  // tool_choice), else set to keep special tokens in its text.
  absl::Status CheckAutoToolChoice(ChatRequest& chat) const;
  // A chat-shaped request of another API (Responses, Anthropic's Messages): its rendered prompt
  // as one CompletionJob.
  absl::StatusOr<std::shared_ptr<CompletionJob>> SubmitChat(ChatRequest& chat, absl::Time arrival);
  void HandleAnthropic(const httplib::Request& req, httplib::Response& res);
  void HandleAnthropicCountTokens(const httplib::Request& req, httplib::Response& res);
  // The conversation's prompt tokens through the chat template (400 naming messages when there is
  // no template or the template refuses them).
  absl::StatusOr<std::vector<int32_t>> ChatPrompt(const ChatTemplate::Chat& chat) const;
  void HandleChat(const httplib::Request& req, httplib::Response& res);
  // SageMaker's inference route, as TGI and vLLM serve it: the body's shape picks the API.
  void HandleInvocations(const httplib::Request& req, httplib::Response& res);
  // `connection`: the client's socket (FindConnectionSocket), watched for the client leaving.
  // Serves a started job, plainly or streamed, or replies with what kept it from starting (in
  // the API's own error shape, `reply_error`); logs the call either way.
  void Respond(const httplib::Request& req, httplib::Response& res,
               absl::StatusOr<std::shared_ptr<HttpJob>> job, bool stream,
               void (*reply_error)(httplib::Response&, const absl::Status&));
  void RespondPlain(const std::shared_ptr<HttpJob>& job, int connection,
                    const httplib::Request& req, httplib::Response& res);
  void RespondStream(std::shared_ptr<HttpJob> job, int connection, const httplib::Request& req,
                     httplib::Response& res);
  void HandleTokenize(const httplib::Request& req, httplib::Response& res);
  void HandleDetokenize(const httplib::Request& req, httplib::Response& res);
  void HandleModels(const httplib::Request& req, httplib::Response& res);
  void HandleResponses(const httplib::Request& req, httplib::Response& res);
  // GET /v1/responses/{id}, its /input_items, DELETE /v1/responses/{id}: a stored response, or a
  // 404 naming the id.
  enum class StoredRoute { kGet, kInputItems, kDelete };
  void HandleStoredResponse(const httplib::Request& req, httplib::Response& res, StoredRoute route);
  void HandleModel(const httplib::Request& req, httplib::Response& res);
  void HandleLlamaCppProps(const httplib::Request& req, httplib::Response& res);
  nlohmann::json LlamaCppSettings(const LlamaCppRequest& llama) const;
  nlohmann::json ModelObject(const std::string& name) const;
  void HandleHealth(httplib::Response& res);

  const ServerOptions options;
  Engine* const engine;
  const Tokenizer* const tokenizer;
  ServerMetrics metrics;
  const int64_t created;
  const std::shared_ptr<ResponseStore> stored_responses;

  ServerSocket socket = MakeServerSocket(options);
  httplib::Server& server = *socket.server;
  std::thread listener;
  int port = -1;
  bool started = false;
  std::atomic<bool> stopping{false};
  std::atomic<bool> listen_returned{false};
  std::atomic<int64_t> next_id{0};

  mutable std::mutex health_mu;
  Health health = Health::kLoading;
  absl::Status failure;
};

std::string HttpServer::Impl::AllowedOrigin(const httplib::Request& req) const {
  const std::string origin = req.get_header_value("Origin");
  if (origin.empty()) return "";
  for (const std::string& allowed : options.allowed_origins) {
    if (allowed == "*") return "*";
    if (allowed == origin) return origin;
  }
  return "";
}

absl::Status HttpServer::Impl::CheckAuth(const httplib::Request& req) const {
  if (options.api_key.empty()) return absl::OkStatus();
  const std::string header = req.get_header_value("Authorization");
  const absl::string_view kBearer = "Bearer ";
  if (absl::StartsWith(header, kBearer) &&
      ConstantTimeEquals(absl::string_view(header).substr(kBearer.size()), options.api_key)) {
    return absl::OkStatus();
  }
  // Anthropic's clients send the key as x-api-key.
  if (req.has_header("x-api-key") &&
      ConstantTimeEquals(req.get_header_value("x-api-key"), options.api_key)) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "Missing or invalid API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')");
}

absl::Status HttpServer::Impl::CheckServing() const {
  std::lock_guard<std::mutex> lock(health_mu);
  switch (health) {
    case Health::kLoading:
      return absl::UnavailableError("The server is still loading the model");
    case Health::kReady:
      return stopping ? absl::UnavailableError("The server is shutting down") : absl::OkStatus();
    case Health::kFailed:
      return absl::UnavailableError(absl::StrCat("The server has failed: ", failure.message()));
  }
  return absl::InternalError("unreachable");
}

absl::Status HttpServer::Impl::CheckModel(const std::optional<std::string>& model) const {
  if (!model.has_value() || *model == options.served_model_name ||
      std::find(options.model_aliases.begin(), options.model_aliases.end(), *model) !=
          options.model_aliases.end()) {
    return absl::OkStatus();
  }
  return ApiError(absl::StatusCode::kNotFound, "model",
                  absl::StrCat("The model '", *model, "' does not exist; this server serves '",
                               options.served_model_name, "'"));
}

absl::StatusOr<std::vector<PreparedPrompt>> HttpServer::Impl::Prepare(
    const CompletionRequest& request) const {
  for (const auto& [id, bias] : request.params.logit_bias) {
    if (id >= tokenizer->vocab_size()) {
      return InvalidParam(
          "logit_bias", absl::StrCat("'logit_bias' token id ", id, " is outside the vocabulary of ",
                                     tokenizer->vocab_size(), " tokens"));
    }
  }
  for (int32_t id : request.params.allowed_token_ids) {
    if (id >= tokenizer->vocab_size()) {
      return InvalidParam("allowed_token_ids", absl::StrCat("'allowed_token_ids' token id ", id,
                                                            " is outside the vocabulary of ",
                                                            tokenizer->vocab_size(), " tokens"));
    }
  }
  std::vector<PreparedPrompt> prepared;
  prepared.reserve(request.prompts.size());
  for (const PromptInput& input : request.prompts) {
    PreparedPrompt prompt;
    if (input.is_text) {
      prompt.token_ids = tokenizer->Encode(input.text);
      prompt.text = input.text;
    } else {
      prompt.token_ids = input.token_ids;
    }
    RETURN_IF_ERROR(ValidatePromptTokens(prompt.token_ids, tokenizer->vocab_size(), "prompt"));
    bool truncated = false;
    if (request.truncate_prompt_tokens.has_value() &&
        static_cast<int64_t>(prompt.token_ids.size()) > *request.truncate_prompt_tokens) {
      prompt.token_ids.erase(prompt.token_ids.begin(),
                             prompt.token_ids.end() - *request.truncate_prompt_tokens);
      truncated = true;
    }
    if ((!input.is_text || truncated) && request.echo) {
      prompt.text = tokenizer->Decode(prompt.token_ids);
    }
    ASSIGN_OR_RETURN(prompt.max_tokens,
                     ResolveMaxTokens(request, static_cast<int>(prompt.token_ids.size()),
                                      options.max_model_len));
    prepared.push_back(std::move(prompt));
  }
  return prepared;
}

absl::Status HttpServer::Impl::Submit(CompletionJob& job, const SamplingParams& params) {
  for (int p = 0; p < job.num_prompts(); ++p) {
    if (!job.NeedsEngine(p)) {
      job.MarkSubmittedNone(p);
      continue;
    }
    EngineRequest request;
    request.request_id = job.EngineRequestId(p);
    request.prompt_token_ids = job.prompt(p).token_ids;
    request.params = params;
    request.params.max_tokens = job.prompt(p).max_tokens;
    if (request.params.max_tokens == 0) {
      // Only the prompt's log-probabilities: one engine sample serves all n choices.
      request.params.n = 1;
      request.params.min_tokens = 0;
    }
    request.on_output = job.Callback(p);
    const Tokenizer* tok = tokenizer;
    const bool skip_special = params.skip_special_tokens;
    request.make_detokenizer = [tok, skip_special]() -> std::unique_ptr<IncrementalDetokenizer> {
      // Stop strings are the engine's (StopStringMatcher); special tokens (EOS, FIM markers) stay
      // out of the text unless the request says otherwise (vLLM's skip_special_tokens).
      return std::make_unique<StreamingDetokenizer>(
          *tok, StreamingDetokenizerOptions{.skip_special_tokens = skip_special});
    };
    absl::Status status = engine->AddRequest(std::move(request));
    if (!status.ok()) {
      for (int q = 0; q < p; ++q) engine->Abort(job.EngineRequestId(q));
      return status;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> HttpServer::Impl::FimPrompt(std::string_view prefix,
                                                                 std::string_view suffix,
                                                                 absl::string_view param) const {
  absl::StatusOr<std::vector<int32_t>> ids =
      tokenizer->EncodeInfill(prefix, suffix, /*parse_special=*/false);
  if (!ids.ok()) {
    return ApiError(absl::StatusCode::kInvalidArgument, param,
                    absl::StrCat("This model cannot fill in the middle: ", ids.status().message()));
  }
  return ids;
}

void HttpServer::Impl::AbortAll(const HttpJob& job) {
  for (const std::string& id : job.UnfinishedEngineIds()) engine->Abort(id);
}

absl::StatusOr<std::shared_ptr<HttpJob>> HttpServer::Impl::StartJob(const httplib::Request& req,
                                                                    bool infill, bool* stream) {
  const absl::Time arrival = absl::Now();
  RETURN_IF_ERROR(CheckAuth(req));
  RETURN_IF_ERROR(CheckServing());
  CompletionRequest request;
  if (infill) {
    ASSIGN_OR_RETURN(InfillRequest fim, ParseInfillRequest(req.body, options.sampling_defaults));
    request = std::move(fim.common);
    RETURN_IF_ERROR(CheckModel(request.model));
    ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                     FimPrompt(fim.input_prefix, fim.input_suffix, "input_prefix"));
    std::vector<int32_t> extra = tokenizer->Encode(fim.prompt, /*parse_special=*/false);
    ids.insert(ids.end(), extra.begin(), extra.end());
    request.prompts.push_back({.is_text = false, .token_ids = std::move(ids)});
  } else {
    ASSIGN_OR_RETURN(request, ParseCompletionRequest(req.body, options.sampling_defaults));
    RETURN_IF_ERROR(CheckModel(request.model));
    if (request.suffix.has_value()) {  // OpenAI's insertion: each text prompt is a prefix
      for (PromptInput& prompt : request.prompts) {
        ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                         FimPrompt(prompt.text, *request.suffix, "suffix"));
        prompt = {.is_text = false, .token_ids = std::move(ids)};
      }
    }
  }
  *stream = request.stream;
  if (request.beam_search.has_value()) {
    ASSIGN_OR_RETURN(std::vector<PreparedPrompt> prompts, Prepare(request));
    auto job = std::make_shared<BeamSearchJob>(
        CompletionJobOptions{.id = absl::StrCat("cmpl-", next_id.fetch_add(1)),
                             .model = options.served_model_name,
                             .created = absl::ToUnixSeconds(arrival),
                             .n = request.params.n,
                             .include_usage = request.include_usage,
                             .return_token_ids = request.return_token_ids,
                             .arrival = arrival},
        std::move(prompts),
        BeamSearchOptions{.length_penalty = request.beam_search->length_penalty,
                          .ignore_eos = request.params.ignore_eos,
                          .eos_token_id = engine->eos_token_id()},
        tokenizer, &metrics, [this](EngineRequest r) { return engine->AddRequest(std::move(r)); },
        [this](const std::string& id) { engine->Abort(id); });
    if (absl::Status started = job->Start(); !started.ok()) {
      AbortAll(*job);
      return started;
    }
    return job;
  }
  // best_of: n = best_of samples, every token scored, the most likely `n` shown.
  SamplingParams params = request.params;
  if (request.best_of > 0) {
    params.n = request.best_of;
    params.logprobs = params.logprobs.value_or(0);
  }
  return SubmitJob(request, params,
                   {.id = absl::StrCat("cmpl-", next_id.fetch_add(1)),
                    .keep = request.best_of > 0 ? request.params.n : 0,
                    .echo = request.echo,
                    .logprobs = request.params.logprobs,
                    .prompt_logprobs = request.prompt_logprobs,
                    .include_usage = request.include_usage,
                    .continuous_usage = request.continuous_usage,
                    .return_token_ids = request.return_token_ids,
                    .prompt_tokens_details = options.prompt_tokens_details,
                    .arrival = arrival});
}

absl::StatusOr<std::shared_ptr<CompletionJob>> HttpServer::Impl::SubmitJob(
    const CompletionRequest& request, const SamplingParams& params,
    CompletionJobOptions job_options) {
  ASSIGN_OR_RETURN(std::vector<PreparedPrompt> prompts, Prepare(request));
  job_options.model = options.served_model_name;
  job_options.created = absl::ToUnixSeconds(job_options.arrival);
  job_options.n = params.n;
  SamplingParams guided = params;
  RETURN_IF_ERROR(AttachGuide(guided));
  if (!guided.ignore_eos) {  // the model's other end-of-sequence ids (generation_config.json)
    for (int32_t id : options.stop_token_ids) {
      if (std::find(guided.stop_token_ids.begin(), guided.stop_token_ids.end(), id) ==
          guided.stop_token_ids.end()) {
        guided.stop_token_ids.push_back(id);
      }
    }
  }
  // bad_words as token sequences (user text: special-token text stays text), each word as is and
  // after a space, as vLLM tokenizes them.
  for (const std::string& word : guided.bad_words) {
    for (const std::string& text : {word, " " + word}) {
      std::vector<int32_t> ids = tokenizer->Encode(text, /*parse_special=*/false);
      if (!ids.empty() && std::find(guided.bad_words_token_ids.begin(),
                                    guided.bad_words_token_ids.end(),
                                    ids) == guided.bad_words_token_ids.end()) {
        guided.bad_words_token_ids.push_back(std::move(ids));
      }
    }
  }
  auto job = std::make_shared<CompletionJob>(std::move(job_options), std::move(prompts), tokenizer,
                                             &metrics);
  RETURN_IF_ERROR(Submit(*job, guided));
  return job;
}

absl::Status HttpServer::Impl::AttachGuide(SamplingParams& params) {
  const bool grammar = !params.guided_grammar.empty();
  if ((params.guided_regex.empty() && !grammar) || params.guide != nullptr) {
    return absl::OkStatus();
  }
  const std::string& text = grammar ? params.guided_grammar : params.guided_regex;
  std::shared_ptr<const GuideVocab> vocab;
  {
    std::lock_guard<std::mutex> lock(guide_mu);
    for (auto it = guide_cache.begin(); it != guide_cache.end(); ++it) {
      const bool is_grammar = dynamic_cast<const GrammarGuide*>(it->get()) != nullptr;
      if (is_grammar == grammar && (*it)->pattern() == text) {
        params.guide = *it;
        std::rotate(it, it + 1, guide_cache.end());  // now the most recent
        return absl::OkStatus();
      }
    }
    if (guide_vocab == nullptr) {
      auto v = std::make_shared<GuideVocab>();
      v->bytes.resize(static_cast<size_t>(tokenizer->vocab_size()));
      for (size_t id = 0; id < v->bytes.size(); ++id) {
        const auto token = static_cast<int32_t>(id);
        const std::string* bytes = tokenizer->TokenBytes(token);
        if (bytes != nullptr && !tokenizer->IsSpecial(token)) v->bytes[id] = *bytes;
      }
      v->eos = engine->eos_token_id();
      guide_vocab = std::move(v);
    }
    vocab = guide_vocab;
  }
  // Compiled outside the lock (a large pattern takes a while); a pattern compiled twice at once
  // is merely cached twice.
  if (grammar) {
    absl::StatusOr<std::shared_ptr<const GrammarGuide>> compiled =
        GrammarGuide::Compile(text, vocab);
    if (!compiled.ok()) return InvalidParam("guided_grammar", compiled.status().message());
    params.guide = *std::move(compiled);
  } else {
    ASSIGN_OR_RETURN(params.guide, RegexGuide::Compile(text, vocab));
  }
  std::lock_guard<std::mutex> lock(guide_mu);
  if (guide_cache.size() >= kGuideCacheSize) guide_cache.erase(guide_cache.begin());
  guide_cache.push_back(params.guide);
  return absl::OkStatus();
}

void HttpServer::Impl::HandleCompletion(const httplib::Request& req, httplib::Response& res,
                                        bool infill) {
  bool stream = false;
  absl::StatusOr<std::shared_ptr<HttpJob>> job = StartJob(req, infill, &stream);
  Respond(req, res, std::move(job), stream, ReplyError);
}

void HttpServer::Impl::Respond(const httplib::Request& req, httplib::Response& res,
                               absl::StatusOr<std::shared_ptr<HttpJob>> job, bool stream,
                               void (*reply_error)(httplib::Response&, const absl::Status&)) {
  if (!job.ok()) {
    reply_error(res, job.status());
    return LogRequest(req, res.status, nullptr, job.status().message());
  }
  const int connection = FindConnectionSocket(req);
  if (stream) return RespondStream(*std::move(job), connection, req, res);
  RespondPlain(*job, connection, req, res);
}

absl::StatusOr<std::shared_ptr<TgiJob>> HttpServer::Impl::StartTgiJob(const httplib::Request& req,
                                                                      TgiRoute route,
                                                                      bool* stream) {
  const absl::Time arrival = absl::Now();
  RETURN_IF_ERROR(CheckAuth(req));
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(TgiRequest tgi, ParseTgiRequest(req.body));
  CompletionRequest& request = tgi.completion;
  if (route != TgiRoute::kRoot) request.stream = route == TgiRoute::kGenerateStream;
  SamplingParams& params = request.params;
  if (tgi.best_of > 1 && request.stream) {
    return InvalidParam("best_of", "'best_of' > 1 cannot be streamed");
  }
  // Every streamed token carries its log-probability (TGI's events), as do the details; best_of
  // ranks its samples by them.
  params.logprobs.reset();
  if (request.stream || tgi.details || tgi.best_of > 1) params.logprobs = tgi.top_n_tokens;
  params.n = tgi.best_of;
  if (tgi.sampling && !params.seed.has_value()) {
    // Drawn here, not by the engine, so that the details can report it as TGI does.
    std::random_device entropy;
    params.seed = (static_cast<uint64_t>(entropy()) << 32) | entropy();
  }
  ASSIGN_OR_RETURN(std::shared_ptr<CompletionJob> inner,
                   SubmitJob(request, params,
                             {.id = absl::StrCat("tgi-", next_id.fetch_add(1)),
                              .logprobs = params.logprobs,
                              .arrival = arrival}));
  *stream = request.stream;
  return std::make_shared<TgiJob>(std::move(inner),
                                  TgiJobOptions{.list_response = route == TgiRoute::kRoot,
                                                .return_full_text = tgi.return_full_text,
                                                .details = tgi.details,
                                                .decoder_input_details = tgi.decoder_input_details,
                                                .top_n_tokens = tgi.top_n_tokens,
                                                .seed = tgi.sampling ? params.seed : std::nullopt,
                                                .best_of = tgi.best_of});
}

// The TensorRT-LLM backend's model names, which its clients put in the path.
constexpr const char* kTritonModelNames[] = {"ensemble", "tensorrt_llm_bls", "tensorrt_llm"};

absl::Status HttpServer::Impl::CheckTritonModel(const std::string& model) const {
  for (const char* name : kTritonModelNames) {
    if (model == name) return absl::OkStatus();
  }
  if (CheckModel(model).ok()) return absl::OkStatus();
  return ApiError(absl::StatusCode::kNotFound, "model",
                  absl::StrCat("Request for unknown model: '", model, "' is not found"));
}

absl::StatusOr<std::shared_ptr<TritonJob>> HttpServer::Impl::StartTritonJob(
    const httplib::Request& req, bool stream_route, bool* stream) {
  const absl::Time arrival = absl::Now();
  RETURN_IF_ERROR(CheckAuth(req));
  const std::string model = req.matches.size() > 1 ? req.matches[1].str() : "";
  const std::string version =
      req.matches.size() > 2 && req.matches[2].matched ? req.matches[2].str() : "1";
  RETURN_IF_ERROR(CheckTritonModel(model));
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(TritonRequest triton, ParseTritonGenerateRequest(req.body));
  CompletionRequest& request = triton.completion;
  SamplingParams& params = request.params;
  if (triton.return_log_probs) params.logprobs = 0;  // the sampled tokens' own, no alternatives
  ASSIGN_OR_RETURN(std::shared_ptr<CompletionJob> inner,
                   SubmitJob(request, params,
                             {.id = absl::StrCat("triton-", next_id.fetch_add(1)),
                              .logprobs = params.logprobs,
                              .arrival = arrival}));
  *stream = stream_route;
  return std::make_shared<TritonJob>(std::move(inner),
                                     TritonJobOptions{.model_name = model,
                                                      .model_version = version,
                                                      .return_log_probs = triton.return_log_probs});
}

void HttpServer::Impl::HandleTriton(const httplib::Request& req, httplib::Response& res,
                                    bool stream_route) {
  bool stream = false;
  absl::StatusOr<std::shared_ptr<HttpJob>> job = StartTritonJob(req, stream_route, &stream);
  Respond(req, res, std::move(job), stream, ReplyTritonError);
}

// llama.cpp's generation_settings: what a request (or, for /props, the defaults) samples with.
nlohmann::json HttpServer::Impl::LlamaCppSettings(const LlamaCppRequest& llama) const {
  const CompletionRequest& request = llama.completion;
  const SamplingParams& p = request.params;
  return {{"n_predict", request.max_tokens_given ? p.max_tokens : -1},
          {"temperature", p.temperature},
          {"top_k", p.top_k},
          {"top_p", p.top_p},
          {"min_p", p.min_p},
          {"typical_p", p.typical_p},
          {"repeat_penalty", p.repetition_penalty},
          {"repeat_last_n", p.penalty_last_n},
          {"presence_penalty", p.presence_penalty},
          {"frequency_penalty", p.frequency_penalty},
          {"stop", p.stop},
          {"ignore_eos", p.ignore_eos},
          {"n_probs", llama.n_probs},
          {"grammar", p.guided_grammar},
          {"n_ctx", options.max_model_len},
          {"model", options.served_model_name}};
}

absl::StatusOr<std::shared_ptr<LlamaCppJob>> HttpServer::Impl::StartLlamaCppJob(
    const httplib::Request& req, bool infill, bool* stream) {
  const absl::Time arrival = absl::Now();
  RETURN_IF_ERROR(CheckAuth(req));
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(LlamaCppRequest llama,
                   ParseLlamaCppRequest(req.body, infill, options.max_model_len));
  CompletionRequest& request = llama.completion;
  std::string prompt_text;
  if (infill) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                     FimPrompt(llama.input_prefix, llama.input_suffix, "input_prefix"));
    std::vector<int32_t> extra = tokenizer->Encode(llama.infill_prompt, /*parse_special=*/false);
    ids.insert(ids.end(), extra.begin(), extra.end());
    prompt_text = tokenizer->Decode(ids);
    request.prompts.push_back({.is_text = false, .token_ids = std::move(ids)});
  } else {
    const PromptInput& prompt = request.prompts[0];
    prompt_text = prompt.is_text ? prompt.text : tokenizer->Decode(prompt.token_ids);
  }
  *stream = request.stream;
  nlohmann::json settings = LlamaCppSettings(llama);
  ASSIGN_OR_RETURN(
      std::shared_ptr<CompletionJob> inner,
      SubmitJob(request, request.params,
                {.id = absl::StrCat("llama-", next_id.fetch_add(1)), .arrival = arrival}));
  return std::make_shared<LlamaCppJob>(std::move(inner),
                                       LlamaCppJobOptions{.model = options.served_model_name,
                                                          .prompt = std::move(prompt_text),
                                                          .n_probs = llama.n_probs,
                                                          .generation_settings = settings});
}

void HttpServer::Impl::HandleLlamaCpp(const httplib::Request& req, httplib::Response& res,
                                      bool infill) {
  bool stream = false;
  absl::StatusOr<std::shared_ptr<HttpJob>> job = StartLlamaCppJob(req, infill, &stream);
  Respond(req, res, std::move(job), stream, ReplyError);
}

void HttpServer::Impl::HandleTgi(const httplib::Request& req, httplib::Response& res,
                                 TgiRoute route) {
  bool stream = false;
  absl::StatusOr<std::shared_ptr<HttpJob>> job = StartTgiJob(req, route, &stream);
  Respond(req, res, std::move(job), stream, ReplyTgiError);
}

absl::StatusOr<std::vector<int32_t>> HttpServer::Impl::ChatPrompt(
    const ChatTemplate::Chat& chat) const {
  if (options.chat_template == nullptr) {
    return InvalidParam("messages",
                        absl::StrCat("'", options.served_model_name,
                                     "' has no chat template (none in its tokenizer_config.json): "
                                     "start mqaserve with --chat-template FILE, or use "
                                     "/v1/completions"));
  }
  absl::StatusOr<std::string> rendered =
      options.chat_template->RenderChat(chat, options.bos_token, options.eos_token);
  if (!rendered.ok()) {
    // The template's own raise_exception (roles out of order ...) or a value it cannot use.
    return InvalidParam("messages", rendered.status().message());
  }
  // The template writes special tokens as text (<|user|>, EOS ...): they are parsed as tokens.
  return tokenizer->Encode(*rendered, /*parse_special=*/true);
}

absl::StatusOr<std::shared_ptr<ChatJob>> HttpServer::Impl::StartChatJob(const httplib::Request& req,
                                                                        bool* stream) {
  const absl::Time arrival = absl::Now();
  RETURN_IF_ERROR(CheckAuth(req));
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(ChatRequest chat, ParseChatRequest(req.body, options.sampling_defaults));
  CompletionRequest& request = chat.common;
  RETURN_IF_ERROR(CheckModel(request.model));
  RETURN_IF_ERROR(CheckAutoToolChoice(chat));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, ChatPrompt(chat.chat));
  request.prompts.push_back({.is_text = false, .token_ids = std::move(ids)});
  // The token scores reach the choices without the completions API's logprobs object.
  ASSIGN_OR_RETURN(std::shared_ptr<CompletionJob> inner,
                   SubmitJob(request, request.params,
                             {.id = absl::StrCat("chatcmpl-", next_id.fetch_add(1)),
                              .include_usage = request.include_usage,
                              .prompt_tokens_details = options.prompt_tokens_details,
                              .arrival = arrival}));
  *stream = request.stream;
  std::string echo;
  if (chat.echo) {
    const nlohmann::json& last = chat.chat.messages.back();
    if (!chat.chat.add_generation_prompt || last["role"] == "assistant") echo = last["content"];
  }
  return std::make_shared<ChatJob>(std::move(inner), request.params.logprobs.has_value(),
                                   std::move(echo), std::move(chat.tool_choice));
}

absl::Status HttpServer::Impl::CheckAutoToolChoice(ChatRequest& chat) const {
  if (chat.tool_choice.mode != ToolChoiceMode::kAuto) return absl::OkStatus();
  if (options.tool_call_parser.empty()) {
    return InvalidParam(
        "tool_choice",
        "\"auto\" tool choice (the default when tools are given) needs the server started "
        "with --enable-auto-tool-choice --tool-call-parser hermes (a parser of the model's "
        "tool-call format); or give tool_choice \"required\" or a named function (the output is "
        "then guided to a call), or \"none\"");
  }
  // The parser reads the calls' tags, which a tokenizer may hold as special tokens.
  chat.common.params.skip_special_tokens = false;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<CompletionJob>> HttpServer::Impl::SubmitChat(ChatRequest& chat,
                                                                            absl::Time arrival) {
  CompletionRequest& request = chat.common;
  RETURN_IF_ERROR(CheckModel(request.model));
  RETURN_IF_ERROR(CheckAutoToolChoice(chat));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, ChatPrompt(chat.chat));
  request.prompts.push_back({.is_text = false, .token_ids = std::move(ids)});
  return SubmitJob(request, request.params,
                   {.id = absl::StrCat(next_id.fetch_add(1)), .arrival = arrival});
}

absl::StatusOr<std::shared_ptr<ResponsesJob>> HttpServer::Impl::StartResponsesJob(
    const httplib::Request& req, bool* stream) {
  const absl::Time arrival = absl::Now();
  RETURN_IF_ERROR(CheckAuth(req));
  RETURN_IF_ERROR(CheckServing());
  PreviousConversation previous = nullptr;
  if (stored_responses->enabled()) {
    previous = [this](const std::string& id) -> absl::StatusOr<nlohmann::ordered_json> {
      std::shared_ptr<const ResponseStore::Entry> entry = stored_responses->Get(id);
      if (entry == nullptr) {
        return ApiError(absl::StatusCode::kNotFound, "previous_response_id",
                        absl::StrCat("Previous response with id '", id, "' not found."));
      }
      return entry->conversation;
    };
  }
  ASSIGN_OR_RETURN(ResponsesRequest responses,
                   ParseResponsesRequest(req.body, options.sampling_defaults, previous));
  ASSIGN_OR_RETURN(std::shared_ptr<CompletionJob> inner, SubmitChat(responses.chat, arrival));
  const SamplingParams& params = responses.chat.common.params;
  *stream = responses.chat.common.stream;
  // Stored responses are read back by id: not a guessable counter alone.
  static thread_local absl::BitGen gen;
  std::string id = absl::StrCat("resp_", absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16),
                                inner->options().id);
  return std::make_shared<ResponsesJob>(
      std::move(inner),
      ResponsesJobOptions{
          .id = std::move(id),
          .instructions = responses.instructions,
          .max_output_tokens = responses.max_output_tokens,
          .temperature = params.temperature,
          .top_p = params.top_p,
          .text_format = responses.text_format,
          .metadata = responses.metadata,
          .previous_response_id = responses.previous_response_id,
          .store = responses.store && stored_responses->enabled() ? stored_responses : nullptr,
          .conversation = std::move(responses.conversation),
          .input_items = std::move(responses.input_items),
          .tool_choice = responses.chat.tool_choice,
          .tools = std::move(responses.tools),
          .tool_choice_given = std::move(responses.tool_choice),
          .parallel_tool_calls = responses.parallel_tool_calls});
}

absl::StatusOr<std::shared_ptr<AnthropicJob>> HttpServer::Impl::StartAnthropicJob(
    const httplib::Request& req, bool* stream) {
  const absl::Time arrival = absl::Now();
  RETURN_IF_ERROR(CheckAuth(req));
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(ChatRequest chat, ParseAnthropicRequest(req.body, options.sampling_defaults));
  ASSIGN_OR_RETURN(std::shared_ptr<CompletionJob> inner, SubmitChat(chat, arrival));
  *stream = chat.common.stream;
  return std::make_shared<AnthropicJob>(std::move(inner), chat.tool_choice);
}

void HttpServer::Impl::HandleAnthropic(const httplib::Request& req, httplib::Response& res) {
  bool stream = false;
  absl::StatusOr<std::shared_ptr<HttpJob>> job = StartAnthropicJob(req, &stream);
  Respond(req, res, std::move(job), stream, ReplyAnthropicError);
}

// Anthropic's POST /v1/messages/count_tokens: the rendered prompt's length.
void HttpServer::Impl::HandleAnthropicCountTokens(const httplib::Request& req,
                                                  httplib::Response& res) {
  absl::Status status = CheckAuth(req);
  if (!status.ok()) return ReplyAnthropicError(res, status);
  absl::StatusOr<ChatRequest> chat =
      ParseAnthropicRequest(req.body, options.sampling_defaults, /*count_only=*/true);
  if (!chat.ok()) return ReplyAnthropicError(res, chat.status());
  status = CheckModel(chat->common.model);
  if (!status.ok()) return ReplyAnthropicError(res, status);
  absl::StatusOr<std::vector<int32_t>> ids = ChatPrompt(chat->chat);
  if (!ids.ok()) return ReplyAnthropicError(res, ids.status());
  ReplyJson(res, {{"input_tokens", ids->size()}});
}

void HttpServer::Impl::HandleResponses(const httplib::Request& req, httplib::Response& res) {
  bool stream = false;
  absl::StatusOr<std::shared_ptr<HttpJob>> job = StartResponsesJob(req, &stream);
  Respond(req, res, std::move(job), stream, ReplyError);
}

void HttpServer::Impl::HandleStoredResponse(const httplib::Request& req, httplib::Response& res,
                                            StoredRoute route) {
  absl::Status status = CheckAuth(req);
  if (!status.ok()) return ReplyError(res, status);
  const std::string id = req.matches.size() > 1 ? req.matches[1].str() : "";
  std::shared_ptr<const ResponseStore::Entry> entry = stored_responses->Get(id);
  if (entry == nullptr || (route == StoredRoute::kDelete && !stored_responses->Erase(id))) {
    return ReplyError(res, ApiError(absl::StatusCode::kNotFound, "response_id",
                                    absl::StrCat("Response with id '", id, "' not found.")));
  }
  if (route == StoredRoute::kGet) return ReplyJson(res, entry->response);
  if (route == StoredRoute::kDelete) {
    return ReplyJson(res, {{"id", id}, {"object", "response"}, {"deleted", true}});
  }
  // OpenAI's list: newest first unless order=asc, `limit` (1-100, 20) items after `after`.
  const std::string order = req.has_param("order") ? req.get_param_value("order") : "desc";
  int limit = 20;
  if (req.has_param("limit") &&
      (!absl::SimpleAtoi(req.get_param_value("limit"), &limit) || limit < 1 || limit > 100)) {
    return ReplyError(res, InvalidParam("limit", "'limit' must be an integer from 1 to 100"));
  }
  if (order != "asc" && order != "desc") {
    return ReplyError(res, InvalidParam("order", "'order' must be 'asc' or 'desc'"));
  }
  json items = entry->input_items;
  if (order == "desc") std::reverse(items.begin(), items.end());
  size_t start = 0;
  if (req.has_param("after")) {
    const std::string after = req.get_param_value("after");
    while (start < items.size() && items[start]["id"] != after) ++start;
    if (start == items.size()) {
      return ReplyError(res, InvalidParam("after", absl::StrCat("no input item '", after, "'")));
    }
    ++start;
  }
  json data = json::array();
  for (size_t i = start; i < items.size() && data.size() < static_cast<size_t>(limit); ++i) {
    data.push_back(items[i]);
  }
  const bool has_more = start + data.size() < items.size();
  json first = data.empty() ? json(nullptr) : data.front()["id"];
  json last = data.empty() ? json(nullptr) : data.back()["id"];
  ReplyJson(res, {{"object", "list"},
                  {"data", std::move(data)},
                  {"first_id", std::move(first)},
                  {"last_id", std::move(last)},
                  {"has_more", has_more}});
}

void HttpServer::Impl::HandleChat(const httplib::Request& req, httplib::Response& res) {
  bool stream = false;
  absl::StatusOr<std::shared_ptr<HttpJob>> job = StartChatJob(req, &stream);
  Respond(req, res, std::move(job), stream, ReplyError);
}

void HttpServer::Impl::HandleTgiInfo(const httplib::Request& req, httplib::Response& res) {
  absl::Status status = CheckAuth(req);
  if (!status.ok()) return ReplyTgiError(res, status);
  ReplyJson(res, {{"model_id", options.served_model_name},
                  {"model_pipeline_tag", "text-generation"},
                  {"max_best_of", kTgiMaxBestOf},
                  {"max_input_tokens", options.max_model_len - 1},
                  {"max_total_tokens", options.max_model_len},
                  {"max_top_n_tokens", kTgiMaxTopNTokens},
                  {"max_concurrent_requests", options.num_threads},
                  {"router", "mqaserve"},
                  {"version", kMqaserveVersion}});
}

void HttpServer::Impl::LogRequest(const httplib::Request& req, int status, const HttpJob* job,
                                  absl::string_view note) const {
  if (!options.request_log) return;
  std::string line = absl::StrCat(req.method, " ", req.path, " ", status);
  if (job != nullptr) absl::StrAppend(&line, " ", job->Summary());
  if (!note.empty()) absl::StrAppend(&line, job != nullptr ? " (" : ": ", note, job ? ")" : "");
  options.request_log(line);
}

void HttpServer::Impl::RespondPlain(const std::shared_ptr<HttpJob>& job, int connection,
                                    const httplib::Request& req, httplib::Response& res) {
  auto fail = [&](const absl::Status& status) {
    res.status = job->ErrorHttpStatus(status);
    res.set_content(job->ErrorBody(status), kJson);
    LogRequest(req, res.status, job.get(), status.message());
  };
  while (!job->finished()) {
    if (stopping) {
      AbortAll(*job);
      return fail(absl::UnavailableError("The server is shutting down"));
    }
    if (PeerGone(connection)) {
      AbortAll(*job);
      return fail(absl::CancelledError("The client closed the connection"));
    }
    job->Drain(options.stream_keepalive, nullptr);
  }
  if (!job->error().ok()) return fail(job->error());
  res.status = 200;
  res.set_content(job->ResponseBody(), kJson);
  LogRequest(req, res.status, job.get(), "");
}

void HttpServer::Impl::RespondStream(std::shared_ptr<HttpJob> job, int connection,
                                     const httplib::Request& req, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto opened = std::make_shared<bool>(false);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job, opened, connection](size_t /*offset*/, httplib::DataSink& sink) {
        std::string chunks;
        if (!*opened) {
          chunks = job->OpeningChunks();
          *opened = true;
        }
        if (!job->finished()) job->Drain(options.stream_keepalive, &chunks);
        if (job->finished()) {
          absl::StrAppend(&chunks, job->ClosingChunks(job->error()));
          if (!sink.write(chunks.data(), chunks.size())) return false;
          sink.done();
          return true;
        }
        if (stopping || PeerGone(connection)) return false;
        if (chunks.empty()) {
          if (connection >= 0) return true;
          // Without the socket, an SSE comment (which clients ignore) tells whether the client
          // is still there: writing to a closed connection fails.
          chunks = ": keep-alive\n\n";
        }
        return sink.write(chunks.data(), chunks.size());
      },
      // Runs when the response ends, however it ends: a stream cut short (client gone, server
      // stopping) leaves requests unfinished, and their KV blocks are released now.
      [this, job, method = req.method, path = req.path](bool /*success*/) {
        AbortAll(*job);
        if (!options.request_log) return;
        httplib::Request logged;  // the request itself is gone by now
        logged.method = method;
        logged.path = path;
        const absl::Status& error = job->error();
        LogRequest(logged, 200, job.get(),
                   !job->finished() ? "stream cut short: client gone or server stopping"
                   : !error.ok()    ? absl::StrCat("failed in the stream: ", error.message())
                                    : "");
      });
}

void HttpServer::Impl::HandleTokenize(const httplib::Request& req, httplib::Response& res) {
  absl::Status status = CheckAuth(req);
  if (!status.ok()) return ReplyError(res, status);
  absl::StatusOr<TokenizeRequest> request = ParseTokenizeRequest(req.body);
  if (!request.ok()) return ReplyError(res, request.status());
  status = CheckModel(request->model);
  if (!status.ok()) return ReplyError(res, status);
  std::vector<int32_t> ids;
  if (request->chat.has_value()) {
    absl::StatusOr<std::vector<int32_t>> chat = ChatPrompt(*request->chat);
    if (!chat.ok()) return ReplyError(res, chat.status());
    ids = *std::move(chat);
  } else {
    ids = tokenizer->Encode(request->prompt);
  }
  ReplyJson(res,
            {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", options.max_model_len}});
}

void HttpServer::Impl::HandleDetokenize(const httplib::Request& req, httplib::Response& res) {
  absl::Status status = CheckAuth(req);
  if (!status.ok()) return ReplyError(res, status);
  absl::StatusOr<DetokenizeRequest> request = ParseDetokenizeRequest(req.body);
  if (!request.ok()) return ReplyError(res, request.status());
  status = CheckModel(request->model);
  if (status.ok() && !request->tokens.empty()) {
    status = ValidatePromptTokens(request->tokens, tokenizer->vocab_size(), "tokens");
  }
  if (!status.ok()) return ReplyError(res, status);
  // vLLM's "prompt" and llama.cpp's "content".
  const std::string text = tokenizer->Decode(request->tokens);
  ReplyJson(res, {{"prompt", text}, {"content", text}});
}

nlohmann::json HttpServer::Impl::ModelObject(const std::string& name) const {
  return {{"id", name},
          {"object", "model"},
          {"created", created},
          {"owned_by", "mqaserve"},
          {"root", options.served_model_name},
          {"max_model_len", options.max_model_len}};
}

void HttpServer::Impl::HandleModels(const httplib::Request& req, httplib::Response& res) {
  absl::Status status = CheckAuth(req);
  if (!status.ok()) return ReplyError(res, status);
  json models = json::array();
  models.push_back(ModelObject(options.served_model_name));
  for (const std::string& alias : options.model_aliases) models.push_back(ModelObject(alias));
  ReplyJson(res, {{"object", "list"}, {"data", std::move(models)}});
}

// OpenAI's "retrieve model" (GET /v1/models/{model}, client.models.retrieve): one of the served
// names, or a 404 in OpenAI's shape.
void HttpServer::Impl::HandleModel(const httplib::Request& req, httplib::Response& res) {
  absl::Status status = CheckAuth(req);
  if (!status.ok()) return ReplyError(res, status);
  const std::string name = req.matches.size() > 1 ? req.matches[1].str() : "";
  status = CheckModel(name);
  if (!status.ok()) return ReplyError(res, status);
  ReplyJson(res, ModelObject(name));
}

// llama.cpp's GET /props: what its clients read to learn the server's defaults and limits.
void HttpServer::Impl::HandleLlamaCppProps(const httplib::Request& req, httplib::Response& res) {
  absl::Status status = CheckAuth(req);
  if (!status.ok()) return ReplyError(res, status);
  absl::StatusOr<LlamaCppRequest> defaults =
      ParseLlamaCppRequest("{}", /*infill=*/true, options.max_model_len);
  if (!defaults.ok()) return ReplyError(res, defaults.status());
  json settings = LlamaCppSettings(*defaults);
  // Older clients read the settings flat, newer ones under "params".
  settings["params"] = settings;
  ReplyJson(res, {{"default_generation_settings", std::move(settings)},
                  {"total_slots", engine->scheduler().options().max_num_seqs},
                  {"model_alias", options.served_model_name},
                  {"bos_token", options.bos_token},
                  {"eos_token", options.eos_token},
                  {"chat_template",
                   options.chat_template != nullptr ? options.chat_template->source() : ""},
                  {"modalities", {{"vision", false}, {"audio", false}}},
                  {"build_info", absl::StrCat("mqaserve ", kMqaserveVersion)}});
}

void HttpServer::Impl::HandleInvocations(const httplib::Request& req, httplib::Response& res) {
  // "messages": a chat completion (OpenAI's body), "prompt": a completion, "inputs": TGI's
  // generate (streamed when the body says "stream": true, as TGI's own route does).
  const json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_object() && body.contains("messages")) return HandleChat(req, res);
  if (body.is_object() && body.contains("prompt")) return HandleCompletion(req, res, false);
  if (body.is_object() && body.contains("inputs")) return HandleTgi(req, res, TgiRoute::kRoot);
  if (absl::Status auth = CheckAuth(req); !auth.ok()) return ReplyError(res, auth);
  ReplyError(res, absl::InvalidArgumentError(
                      body.is_object() ? "/invocations: the body needs \"messages\" (a chat "
                                         "completion), \"prompt\" (a completion) or \"inputs\" "
                                         "(TGI's generate)"
                                       : "/invocations: the body must be a JSON object"));
}

void HttpServer::Impl::HandleHealth(httplib::Response& res) {
  absl::Status status = CheckServing();
  if (!status.ok()) return ReplyError(res, status);
  res.status = 200;
  res.set_content("", "text/plain");
}

void HttpServer::Impl::InstallRoutes() {
  server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(req, res, /*infill=*/false);
  });
  server.Post("/v1/infill", [this](const httplib::Request& req, httplib::Response& res) {
    HandleCompletion(req, res, /*infill=*/true);
  });
  server.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleChat(req, res);
  });
  server.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
    HandleResponses(req, res);
  });
  server.Get(R"(/v1/responses/([^/]+))",
             [this](const httplib::Request& req, httplib::Response& res) {
               HandleStoredResponse(req, res, StoredRoute::kGet);
             });
  server.Get(R"(/v1/responses/([^/]+)/input_items)",
             [this](const httplib::Request& req, httplib::Response& res) {
               HandleStoredResponse(req, res, StoredRoute::kInputItems);
             });
  server.Delete(R"(/v1/responses/([^/]+))",
                [this](const httplib::Request& req, httplib::Response& res) {
                  HandleStoredResponse(req, res, StoredRoute::kDelete);
                });
  // Anthropic's Messages API.
  server.Post("/v1/messages", [this](const httplib::Request& req, httplib::Response& res) {
    HandleAnthropic(req, res);
  });
  server.Post("/v1/messages/count_tokens",
              [this](const httplib::Request& req, httplib::Response& res) {
                HandleAnthropicCountTokens(req, res);
              });
  // Text-generation-inference's native API (its clients, and the code-completion plugins that
  // speak it).
  server.Post("/generate", [this](const httplib::Request& req, httplib::Response& res) {
    HandleTgi(req, res, TgiRoute::kGenerate);
  });
  server.Post("/generate_stream", [this](const httplib::Request& req, httplib::Response& res) {
    HandleTgi(req, res, TgiRoute::kGenerateStream);
  });
  server.Post("/", [this](const httplib::Request& req, httplib::Response& res) {
    HandleTgi(req, res, TgiRoute::kRoot);
  });
  server.Post("/invocations", [this](const httplib::Request& req, httplib::Response& res) {
    HandleInvocations(req, res);
  });
  if (options.dev_endpoints) {
    for (const char* path : {"/reset_prefix_cache", "/flush_cache"}) {
      server.Post(path, [this](const httplib::Request& req, httplib::Response& res) {
        if (absl::Status auth = CheckAuth(req); !auth.ok()) return ReplyError(res, auth);
        absl::StatusOr<int64_t> dropped = engine->ResetPrefixCache();
        if (!dropped.ok()) return ReplyError(res, dropped.status());
        ReplyJson(res, {{"dropped_blocks", *dropped}});
      });
    }
  }
  // llama.cpp server's native API (its clients; llama.vim and llama.vscode's code completion).
  for (const char* path : {"/completion", "/completions"}) {
    server.Post(path, [this](const httplib::Request& req, httplib::Response& res) {
      HandleLlamaCpp(req, res, /*infill=*/false);
    });
  }
  server.Post("/infill", [this](const httplib::Request& req, httplib::Response& res) {
    HandleLlamaCpp(req, res, /*infill=*/true);
  });
  // Triton's generate extension, as the TensorRT-LLM backend serves it, and its health checks.
  constexpr char kTritonModel[] = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";
  server.Post(absl::StrCat(kTritonModel, "/generate"),
              [this](const httplib::Request& req, httplib::Response& res) {
                HandleTriton(req, res, /*stream_route=*/false);
              });
  server.Post(absl::StrCat(kTritonModel, "/generate_stream"),
              [this](const httplib::Request& req, httplib::Response& res) {
                HandleTriton(req, res, /*stream_route=*/true);
              });
  server.Get(absl::StrCat(kTritonModel, "/ready"),
             [this](const httplib::Request& req, httplib::Response& res) {
               absl::Status status = CheckTritonModel(req.matches[1].str());
               if (status.ok()) status = CheckServing();
               if (!status.ok()) return ReplyTritonError(res, status);
               res.status = 200;
             });
  server.Get("/v2/health/ready", [this](const httplib::Request&, httplib::Response& res) {
    absl::Status status = CheckServing();
    if (!status.ok()) return ReplyTritonError(res, status);
    res.status = 200;
  });
  server.Get("/v2/health/live",
             [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  server.Get("/info", [this](const httplib::Request& req, httplib::Response& res) {
    HandleTgiInfo(req, res);
  });
  server.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    HandleModels(req, res);
  });
  server.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    HandleModel(req, res);
  });
  server.Get("/props", [this](const httplib::Request& req, httplib::Response& res) {
    HandleLlamaCppProps(req, res);
  });
  // vLLM's GET /version.
  server.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    ReplyJson(res, {{"version", kMqaserveVersion}});
  });
  server.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    HandleTokenize(req, res);
  });
  server.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    HandleDetokenize(req, res);
  });
  server.Get("/health",
             [this](const httplib::Request&, httplib::Response& res) { HandleHealth(res); });
  // vLLM's /ping (SageMaker's health check), GET or POST: /health's answer.
  server.Get("/ping",
             [this](const httplib::Request&, httplib::Response& res) { HandleHealth(res); });
  server.Post("/ping",
              [this](const httplib::Request&, httplib::Response& res) { HandleHealth(res); });
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.status = 200;
    res.set_content(metrics.Render(engine->metrics()), "text/plain; version=0.0.4; charset=utf-8");
  });
  // CORS: the allowed origin on every response, and preflights answered.
  server.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const std::string origin = AllowedOrigin(req);
    if (origin.empty()) return;
    res.set_header("Access-Control-Allow-Origin", origin);
    if (origin != "*") res.set_header("Vary", "Origin");
  });
  server.Options(".*", [this](const httplib::Request& req, httplib::Response& res) {
    res.status = 204;
    if (AllowedOrigin(req).empty()) return;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    const std::string asked = req.get_header_value("Access-Control-Request-Headers");
    res.set_header("Access-Control-Allow-Headers",
                   asked.empty() ? "Authorization, Content-Type" : asked);
    res.set_header("Access-Control-Max-Age", "600");
  });
  // httplib's own errors (no route, body over the limit, unreadable request) get OpenAI's shape
  // too; our handlers' errors already carry a body and pass through.
  server.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message;
    if (res.status == 404) {
      message = absl::StrCat("No route for ", req.method, " ", req.path);
    } else if (res.status == 413) {
      message = absl::StrCat("The request body is larger than ", options.max_body_bytes, " bytes");
    } else {
      message = absl::StrCat("HTTP ", res.status);
    }
    res.set_content(ErrorBodyForHttpStatus(res.status, message), kJson);
    return httplib::Server::HandlerResponse::Handled;
  }));
  server.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr error) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        ReplyError(res, absl::InternalError(absl::StrCat("Internal error: ", what)));
      });
  server.set_payload_max_length(options.max_body_bytes);
  // Streamed chunks are small writes in quick succession (the headers, then the first token a few
  // ms later): with Nagle's algorithm each waits for the ACK of the one before, which the client
  // delays by up to 40 ms. Set on the listening socket, the option is inherited by every accepted
  // connection (Linux copies it at accept).
  server.set_tcp_nodelay(true);
  const size_t threads = static_cast<size_t>(std::max(1, options.num_threads));
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
}

HttpServer::HttpServer(ServerOptions options, Engine* engine, const Tokenizer* tokenizer)
    : impl_(std::make_unique<Impl>(std::move(options), engine, tokenizer)) {
  MQA_CHECK(engine != nullptr && tokenizer != nullptr);
}

HttpServer::~HttpServer() { Stop(); }

absl::Status HttpServer::Start() {
  Impl& impl = *impl_;
  if (impl.started) return absl::FailedPreconditionError("HttpServer already started");
  RETURN_IF_ERROR(TlsProblem(impl.options, impl.server));
  impl.InstallRoutes();
  const std::string& host = impl.options.host;
  if (impl.options.port == 0) {
    impl.port = impl.server.bind_to_any_port(host);
  } else {
    impl.port = impl.server.bind_to_port(host, impl.options.port) ? impl.options.port : -1;
  }
  if (impl.port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", impl.options.port,
                     " (address in use, or not an address of this host?)"));
  }
  if (absl::Status raised = impl.socket.raise_backlog(impl.options.listen_backlog); !raised.ok()) {
    return raised;
  }
  impl.started = true;
  impl.listener = std::thread([&impl] {
    impl.server.listen_after_bind();
    impl.listen_returned = true;
  });
  // Stop() must not race the accept loop's start (httplib's stop() is a no-op before it runs).
  while (!impl.server.is_running() && !impl.listen_returned) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (impl.listen_returned) {
    Stop();
    return absl::UnavailableError(
        absl::StrCat("the HTTP accept loop on ", host, ":", impl.port, " ended at once"));
  }
  return absl::OkStatus();
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::Stop() {
  Impl& impl = *impl_;
  if (!impl.started) return;
  impl.stopping = true;
  impl.server.stop();
  if (impl.listener.joinable()) impl.listener.join();
  impl.started = false;
}

void HttpServer::SetReady() {
  std::lock_guard<std::mutex> lock(impl_->health_mu);
  if (impl_->health == Impl::Health::kLoading) impl_->health = Impl::Health::kReady;
}

void HttpServer::SetFailed(absl::Status why) {
  std::lock_guard<std::mutex> lock(impl_->health_mu);
  impl_->health = Impl::Health::kFailed;
  impl_->failure = std::move(why);
}

absl::Status CheckServerTls(const ServerOptions& options) {
  if (options.ssl_certfile.empty() && options.ssl_keyfile.empty() && options.ssl_ca_certs.empty()) {
    return absl::OkStatus();
  }
  const ServerSocket socket = MakeServerSocket(options);
  return TlsProblem(options, *socket.server);
}

}  // namespace mqa
