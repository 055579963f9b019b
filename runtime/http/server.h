// The OpenAI-compatible HTTP endpoint of rank 0:
//   POST /v1/completions, POST /v1/infill, POST /v1/chat/completions, POST /v1/responses (and its
//   stored responses: GET / DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items), POST
//   /v1/messages, GET /v1/models, POST /tokenize, POST /detokenize, GET /health, GET /metrics,
//   and TGI's and llama.cpp's native routes.
//
// Threads: Start() runs cpp-httplib's accept loop on a thread of its own; each connection is
// served by one thread of a pool (ServerOptions::num_threads), which parses, validates and
// tokenizes the request, hands it to the Engine (AddRequest; the engine runs on its own thread,
// driven by the caller), and then drains the request's outputs, which the engine's callback pushes
// into a per-request queue. A streaming client that goes away (a failed write, found at the latest
// by the keep-alive comment sent every `stream_keepalive`) has its requests aborted at once.
//
// Ownership: the server borrows the Engine and the Tokenizer, which must outlive it. All public
// methods are safe from any thread.
//
// Typical use (the launcher):
//   HttpServer server(options, engine.get(), &tokenizer);
//   RETURN_IF_ERROR(server.Start());       // listening when it returns
//   server.SetReady();                      // /health turns 200
//   absl::Status run = engine->Run();       // engine thread (here: the caller's)
//   if (!run.ok()) server.SetFailed(run);   // /health 503, new requests 503
//   server.Stop();
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "model/tokenizer/tokenizer.h"
#include "runtime/engine.h"
#include "runtime/http/chat_template.h"

namespace mqa {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (HttpServer::port() tells which)
  // `model` of /v1/models; requests naming another model get 404. (vLLM's --served-model-name;
  // the launcher defaults it to the model folder's name.)
  std::string served_model_name = "model";
  // Further names requests may give as their model (vLLM's --served-model-name with several);
  // /v1/models lists them after served_model_name, which answers carry.
  std::vector<std::string> model_aliases;
  // Non-empty: every route but /health and /metrics needs `Authorization: Bearer <api_key>`.
  std::string api_key;
  // Must equal the engine's EngineOptions::max_model_len (checked here for a clear 400).
  int max_model_len = 2048;
  // Bodies above this get 413.
  size_t max_body_bytes = 8 << 20;
  // Connections served at once; a streaming response holds one thread for its whole length.
  int num_threads = 256;
  // Connections the kernel queues before they are accepted (a burst of clients).
  int listen_backlog = 1024;
  // A streaming response with nothing to send writes an SSE comment this often, which is how a
  // client that disconnected while its request waits is noticed.
  absl::Duration stream_keepalive = absl::Milliseconds(200);
  // /v1/chat/completions renders messages with this template (null: the endpoint answers 400
  // saying how to give one), with these as its bos_token / eos_token.
  std::shared_ptr<const ChatTemplate> chat_template;
  std::string bos_token;
  std::string eos_token;
  // The model's generation_config.json (the launcher's --generation-config), as vLLM applies it:
  // API field -> value defaults for /v1/completions, /v1/infill and /v1/chat/completions requests
  // that leave the field unset, and end-of-sequence ids (besides the engine's EOS) that stop every
  // request, on every API, unless it sets ignore_eos.
  nlohmann::json sampling_defaults = nlohmann::json::object();
  std::vector<int32_t> stop_token_ids;
  // CORS, for browser clients (vLLM's --allowed-origins, whose default also allows every origin):
  // responses to a request with an Origin header in this list ("*": any) carry
  // Access-Control-Allow-Origin, and OPTIONS preflights are answered (without the API key, which
  // browsers do not send on a preflight). Empty: no CORS headers.
  std::vector<std::string> allowed_origins = {"*"};
  // One line per finished completion / generation call (and per refused one) to `request_log`:
  // method, path, status, the call's id, token counts, finish reasons and duration; never the
  // prompt or output text. Null: no request log.
  std::function<void(const std::string&)> request_log;
  // vLLM's --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens, the prompt
  // tokens found in the prefix cache (OpenAI's field), on /v1/completions, /v1/infill and chat.
  bool prompt_tokens_details = false;
  // The /metrics names' prefix (a Prometheus name's start): "vllm:" gives vLLM's names.
  std::string metrics_prefix = "mqaserve_";
  // vLLM's --enable-auto-tool-choice --tool-call-parser: the parser that reads the calls of a
  // chat request whose tool_choice is "auto" (the default when tools are given), one of
  // kToolCallParsers ("hermes"); empty: such requests are refused (400 naming tool_choice).
  std::string tool_call_parser;
  // The Responses API's stored responses (ResponseStore; `store` is true unless a request says
  // false): at most this many, the oldest forgotten first; 0 stores none (every response says
  // "store": false, and previous_response_id is refused).
  size_t max_stored_responses = 1024;
  size_t max_stored_response_bytes = size_t{256} << 20;
  // HTTPS (vLLM's --ssl-certfile / --ssl-keyfile / --ssl-ca-certs): with both PEM files set the
  // server speaks TLS only; with ssl_ca_certs too, every client must present a certificate those
  // CAs signed (mutual TLS). Empty: plain HTTP.
  std::string ssl_certfile;
  std::string ssl_keyfile;
  std::string ssl_ca_certs;
  // Development routes, as vLLM's VLLM_SERVER_DEV_MODE mounts them: POST /reset_prefix_cache
  // (and SGLang's name for it, /flush_cache), which benchmark harnesses (AIPerf, vLLM's) call
  // between runs. Off: those routes do not exist (404).
  bool dev_endpoints = false;
};

// The TLS settings of `options` as Start() will use them: OK for plain HTTP; InvalidArgument
// naming the file (unreadable, not PEM, a key that does not match its certificate) otherwise.
// The launcher calls it before loading a checkpoint.
absl::Status CheckServerTls(const ServerOptions& options);

class HttpServer {
 public:
  HttpServer(ServerOptions options, Engine* engine, const Tokenizer* tokenizer);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port and serves on a background thread. Unavailable when the address cannot be
  // bound; FailedPrecondition when already started.
  absl::Status Start();
  // The bound port (after Start).
  int port() const;
  // Stops accepting, ends open streams (their requests are aborted), joins the threads.
  // Idempotent.
  void Stop();

  // /health: 503 until SetReady, 200 after, 503 again (for good) after SetFailed, which also
  // makes every later generation request fail with 503 and `why`'s message.
  void SetReady();
  void SetFailed(absl::Status why);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mqa
