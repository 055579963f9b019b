// The OpenAI-compatible HTTP API's request and error shapes, parsed at the edge into native types.
//
// Parsing checks JSON syntax, UTF-8, field types and ranges; checks that need the tokenizer or the
// model's limits (empty prompt after tokenization, ids outside the vocabulary, prompt + max_tokens
// over max_model_len) are the separate functions below, called by the server once it has token
// ids. Every error is an absl::Status carrying the offending field's name (ErrorParam) and maps to
// an HTTP status (HttpStatusFor) and an OpenAI-shaped body (ErrorBody).
//
// Thread safety: free functions over values; safe from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"
#include "runtime/http/chat_template.h"
#include "runtime/http/tool_calls.h"
#include "runtime/sampling_params.h"

namespace mqa {

// ---- Errors ------------------------------------------------------------------------------------

// A status of `code` whose OpenAI error names `param` (empty: no particular field).
absl::Status ApiError(absl::StatusCode code, absl::string_view param, absl::string_view message);
// InvalidArgument (HTTP 400) naming `param`.
absl::Status InvalidParam(absl::string_view param, absl::string_view message);
// HTTP 413: the body is over the server's size limit.
absl::Status PayloadTooLarge(absl::string_view message);

// The field an error names ("" when none).
std::string ErrorParam(const absl::Status& status);
// InvalidArgument / FailedPrecondition / OutOfRange 400, Unauthenticated 401, PermissionDenied 403,
// NotFound 404, PayloadTooLarge 413, ResourceExhausted 429, Unimplemented 501, Unavailable 503,
// anything else 500.
int HttpStatusFor(const absl::Status& status);
// {"error": {"message", "type", "param", "code"}} for a non-OK status.
std::string ErrorBody(const absl::Status& status);
// A response's JSON as sent: compact, any invalid UTF-8 replaced rather than thrown on.
std::string DumpJson(const nlohmann::json& value);
// One OpenAI server-sent event: `data: <json>` and a blank line.
std::string SseEvent(const nlohmann::json& value);
// OpenAI's usage object: {"prompt_tokens", "completion_tokens", "total_tokens"}.
nlohmann::json UsageObject(int64_t prompt_tokens, int64_t completion_tokens);
// The same body for a bare HTTP status with no Status behind it (httplib's own 404 / 413 ...).
std::string ErrorBodyForHttpStatus(int http_status, absl::string_view message);

// ---- Requests ----------------------------------------------------------------------------------

// One prompt as the client sent it: text, or token ids.
struct PromptInput {
  bool is_text = true;
  std::string text;
  std::vector<int32_t> token_ids;
};

// A completion's beam search (CompletionRequest::beam_search).
struct BeamSearchRequest {
  float length_penalty = 1.0f;
};

// POST /v1/completions (and the common part of /v1/infill).
struct CompletionRequest {
  std::optional<std::string> model;
  std::vector<PromptInput> prompts;  // at least one
  // params.max_tokens is the client's value (0 allowed only with echo: the prompt alone, scored
  // when log-probabilities are asked for) or 16 when not given.
  SamplingParams params;
  bool max_tokens_given = false;
  bool echo = false;
  bool stream = false;
  bool include_usage = false;     // stream_options.include_usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats (vLLM's)
  bool return_token_ids = false;  // vLLM's extension: prompt_token_ids and choices[i].token_ids
  // OpenAI's `suffix` (/v1/completions only): the text after the completion. Each prompt, which
  // must be text, is the prefix of a fill-in-the-middle prompt the server builds as /v1/infill
  // does (a model without FIM tokens refuses it); not with echo.
  std::optional<std::string> suffix;
  // vLLM's truncate_prompt_tokens (/v1/completions only): each prompt keeps its last N tokens
  // (echo returns the kept part); not with suffix, whose FIM prompt would lose its start.
  std::optional<int> truncate_prompt_tokens;
  // vLLM's prompt_logprobs (/v1/completions, not streamed): choices[i].prompt_logprobs lists, for
  // each prompt token after the first, its log-probability, rank and this many alternatives.
  // With echo, `logprobs` also covers the prompt (OpenAI's answer). Either sets
  // params.prompt_logprobs, so that the engine computes them.
  std::optional<int> prompt_logprobs;
  // vLLM's use_beam_search (/v1/completions only): the n most likely continuations of each prompt
  // by beam search of width n (at most kMaxBeamWidth), scored as vLLM scores them: cumulative
  // log-probability over (prompt + output length) ^ length_penalty. The sampling fields that
  // would change nothing (temperature, seed) are accepted; those that would (logprobs, stop
  // strings, guidance, penalties, echo, ...) are refused with a 400.
  std::optional<BeamSearchRequest> beam_search;
  // OpenAI's best_of (/v1/completions and /v1/infill): best_of samples of each prompt are drawn
  // and the n with the highest cumulative log-probability returned; not streamed. 0: as many as
  // returned (best_of absent, 1 or n).
  int best_of = 0;
};

inline constexpr int kMaxBeamWidth = 8;

// Default max_tokens when the client sends none (OpenAI's).
inline constexpr int kDefaultMaxTokens = 16;
// Caps on one call's fan-out (the response holds prompts * n choices), so that a small body
// cannot make the server allocate without bound.
inline constexpr int kMaxN = 128;
inline constexpr int kMaxPromptsPerRequest = 1024;

// `defaults` (an object, API field -> value: the model's generation_config.json, as vLLM applies
// it) fills the fields the body leaves unset or null (none with beam search); its max_tokens,
// when neither max_tokens nor max_completion_tokens is given, stays a default that a long prompt
// cuts to what fits. The same for infill and chat.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(
    absl::string_view body, const nlohmann::json& defaults = nlohmann::json());

// POST /v1/infill: fill-in-the-middle, llama.cpp-style fields plus the sampling fields above.
struct InfillRequest {
  std::string input_prefix;
  std::string input_suffix;
  std::string prompt;        // optional text placed after the middle token
  CompletionRequest common;  // prompts left empty: the server builds the one FIM prompt
};

absl::StatusOr<InfillRequest> ParseInfillRequest(absl::string_view body,
                                                 const nlohmann::json& defaults = nlohmann::json());

// POST /v1/chat/completions: the messages (each {"role": string, "content": string or a list of
// {"type": "text", "text": string} parts, joined with newlines; other keys such as "name" kept
// for the template), turned into a prompt by the model's chat template, and the sampling fields of
// /v1/completions (max_completion_tokens as max_tokens, by default up to the context as OpenAI's;
// chat's boolean logprobs with top_logprobs
// alternatives as params.logprobs). Tools: OpenAI's `tools` (function definitions, given to the
// template as `tools`) and `tool_choice` — "none" (the default without tools), a named function
// (the output is guided by its parameters' schema), or "required" (guided to a list of calls of
// the tools, at most one with parallel_tool_calls false); "auto" (the default with tools) is
// refused, as vLLM refuses it without a tool-call parser. Assistant messages' tool_calls reach the
// template with their arguments parsed into objects, as vLLM gives them. Refused with a 400 naming
// the field: a per-request chat_template, suffix / prompt, guidance beside a tool choice.
struct ChatRequest {
  CompletionRequest common;  // prompts left empty: the server renders the one chat prompt
  // The messages (validated as above; content normalised to a string) and vLLM's
  // add_generation_prompt (end the prompt with the assistant's turn opener), continue_final_message
  // (end it inside the last message; excludes add_generation_prompt, as in vLLM) and
  // chat_template_kwargs (further template variables; not messages / add_generation_prompt /
  // tools / documents).
  ChatTemplate::Chat chat;
  // vLLM's echo: the answer starts with the last message's content when that message has the
  // answer's role (assistant), or add_generation_prompt is false (the answer continues it).
  bool echo = false;
  ToolChoice tool_choice;  // kNamed / kRequired: common.params.guided_regex is the calls' pattern
};

absl::StatusOr<ChatRequest> ParseChatRequest(absl::string_view body,
                                             const nlohmann::json& defaults = nlohmann::json());

// OpenAI's Responses API (POST /v1/responses), text in and out: `input` (a string, or a list of
// messages whose content is a string or input_text / output_text parts: a stored response's
// output items, sent back, are such messages), `instructions` (a system message first),
// previous_response_id (the stored conversation it names comes before `input`; its instructions
// do not), store, max_output_tokens, temperature, top_p, stream, text.format (text, json_object,
// json_schema), metadata; vLLM's sampling extras (seed, top_k, min_p, repetition_penalty, stop,
// structured_outputs, ...) as on chat. Read as the chat request it amounts to (errors name the
// Responses fields). Function tools, tool_choice and parallel_tool_calls are the chat's (so
// "auto" needs the server's tool-call parser), and input items of type function_call /
// function_call_output are the conversation's earlier calls and their results. Other tool types,
// reasoning, background, images and other item types are refused by name.
struct ResponsesRequest {
  ChatRequest chat;
  std::optional<std::string> instructions;
  std::optional<int> max_output_tokens;
  nlohmann::json text_format = {{"type", "text"}};
  nlohmann::json metadata;  // null, or the client's object (echoed)
  bool store = true;        // the API's default
  std::optional<std::string> previous_response_id;
  // The chat messages {role, content} after the instructions: the previous conversation, then
  // this input (what a stored response's follow-up continues, with the answer appended).
  nlohmann::ordered_json conversation = nlohmann::ordered_json::array();
  // This request's input as the API lists it (GET /v1/responses/{id}/input_items): message items
  // {type, role, content: [{type: input_text | output_text, text}]}, without ids.
  nlohmann::json input_items = nlohmann::json::array();
  // As the client gave them (echoed in the response); chat.tool_choice is what they amount to.
  nlohmann::json tools = nlohmann::json::array();
  nlohmann::json tool_choice = "auto";
  bool parallel_tool_calls = true;
};
// The conversation stored under a previous_response_id (ResponseStore::Entry::conversation), or
// the error to answer (404 naming previous_response_id when it is unknown).
using PreviousConversation =
    std::function<absl::StatusOr<nlohmann::ordered_json>(const std::string& id)>;
// `previous` null: previous_response_id is refused (nothing is stored).
absl::StatusOr<ResponsesRequest> ParseResponsesRequest(
    absl::string_view body, const nlohmann::json& defaults = nlohmann::json(),
    const PreviousConversation& previous = nullptr);

// Anthropic's Messages API (POST /v1/messages, what vLLM and llama.cpp's server also serve):
// `messages` (user / assistant turns, content a string or text blocks), `system` (a string or
// text blocks: a system message first), max_tokens (required), temperature, top_p, top_k,
// stop_sequences, stream, metadata. Read as the chat request it amounts to (errors name the
// Messages fields). Tools, thinking, images and other block types are refused by name.
// `count_only` (POST /v1/messages/count_tokens): max_tokens is not needed.
absl::StatusOr<ChatRequest> ParseAnthropicRequest(absl::string_view body,
                                                  const nlohmann::json& defaults = nlohmann::json(),
                                                  bool count_only = false);
// Anthropic's error body: {"type": "error", "error": {"type": "invalid_request_error" | ...,
// "message"}}, the type from the HTTP status.
std::string AnthropicErrorBody(const absl::Status& status);

// Triton Inference Server's generate extension as the TensorRT-LLM backend's models answer it
// (POST /v2/models/{ensemble | tensorrt_llm_bls | a served name}/generate and /generate_stream):
// {"text_input", "max_tokens" (required), "bad_words" / "stop_words" (a string or a list; "" for
// none; stop words end the text, as TensorRT-LLM keeps them), "end_id" (an extra end token),
// "pad_id", "temperature", "top_k", "top_p", "repetition_penalty", "presence_penalty",
// "frequency_penalty", "min_length" (or "min_tokens"), "random_seed", "return_log_probs",
// "beam_width" (1), "stream"}. TensorRT-LLM's decoding: greedy unless top_k > 1 or top_p > 0
// (then the temperature, 1 by default, applies). Inputs it does not know, or logits outputs, are
// refused by name (Triton refuses unknown inputs).
struct TritonRequest {
  CompletionRequest completion;  // one text prompt
  bool return_log_probs = false;
};
absl::StatusOr<TritonRequest> ParseTritonGenerateRequest(absl::string_view body);
// Triton's error body: {"error": message}.
std::string TritonErrorBody(const absl::Status& status);

// Hugging Face text-generation-inference's POST /generate, /generate_stream and / (TGI's native
// API, what its clients and the VS Code / JetBrains code-completion plugins send): {"inputs",
// "parameters": {...}, "stream"}. Unset (null) parameters keep their defaults; the ones this
// server does not implement (watermark, adapter_id) are refused by name rather than ignored.
// Sampling is on with do_sample or any of temperature / top_k / top_p / typical_p, as in TGI;
// otherwise decoding is greedy.
struct TgiRequest {
  // prompts = {inputs}; params from the parameters (max_new_tokens -> max_tokens, stop strings kept
  // in the text as TGI does); truncate -> truncate_prompt_tokens; stream from the body.
  CompletionRequest completion;
  bool return_full_text = false;       // generated_text starts with the inputs
  bool details = false;                // the details object (finish reason, tokens, seed ...)
  bool decoder_input_details =
      false;  // details.prefill: the inputs' tokens with their scores (with details)
  int top_n_tokens = 0;                // details.top_tokens / the stream's top_tokens
  bool sampling = false;
  // TGI's best_of: that many samples (sampling only, not streamed; the server checks the route),
  // the one with the highest total log-probability answered and the others in
  // details.best_of_sequences.
  int best_of = 1;
};

inline constexpr int kTgiMaxBestOf = 4;

// Default max_new_tokens (TGI's), cut to what fits the model when not given.
inline constexpr int kTgiDefaultMaxNewTokens = 100;
inline constexpr int kTgiMaxTopNTokens = 5;

absl::StatusOr<TgiRequest> ParseTgiRequest(absl::string_view body);

// TGI's error shape: {"error": message, "error_type": "validation" | "overloaded" |
// "generation" | ...}, and its HTTP status (422 for validation errors).
int TgiHttpStatusFor(const absl::Status& status);
std::string TgiErrorBody(const absl::Status& status);

// llama.cpp server's native API: POST /completion (and /completions) and POST /infill, what
// llama.cpp's own clients and editor plugins (llama.vim, llama.vscode) send. One prompt: text
// (or token ids) for /completion; input_prefix, input_suffix, input_extra (context chunks,
// placed before the prefix) and prompt (text after the middle token) for /infill. llama.cpp's
// sampling defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05) where the body says
// nothing; n_predict -1 runs to the context, 0 evaluates nothing; repeat_last_n is the penalty
// window (-1 the whole context, 0 no penalties); grammar (GBNF) and json_schema guide the
// output; logit_bias as [[id, bias or false], ...] or {"id": bias}. Fields with no effect here
// (cache_prompt, id_slot, samplers, n_keep, t_max_*) are accepted; samplers this server does not
// have (mirostat, DRY, tail-free, XTC, dynamic temperature, n_indent) are refused when set.
struct LlamaCppRequest {
  CompletionRequest completion;  // prompts empty for /infill: the server builds the FIM prompt
  std::string input_prefix, input_suffix, infill_prompt;  // /infill
  int n_probs = 0;  // completion_probabilities: this many alternatives a token
};

absl::StatusOr<LlamaCppRequest> ParseLlamaCppRequest(absl::string_view body, bool infill,
                                                     int max_model_len);

// POST /tokenize: a prompt, or (vLLM's) a conversation of chat messages rendered by the chat
// template as /v1/chat/completions does.
struct TokenizeRequest {
  std::optional<std::string> model;
  std::string prompt;
  std::optional<ChatTemplate::Chat> chat;  // vLLM's messages form, read as ChatRequest's
};
absl::StatusOr<TokenizeRequest> ParseTokenizeRequest(absl::string_view body);

struct DetokenizeRequest {
  std::optional<std::string> model;
  std::vector<int32_t> tokens;
};
absl::StatusOr<DetokenizeRequest> ParseDetokenizeRequest(absl::string_view body);

// ---- Checks that need the tokenizer or the model's limits -------------------------------------

// InvalidArgument naming `param` for an empty prompt or an id outside [0, vocab_size).
absl::Status ValidatePromptTokens(absl::Span<const int32_t> ids, int64_t vocab_size,
                                  absl::string_view param);

// The max_tokens to run with for a prompt of `prompt_len` tokens: the client's value, which must
// fit (prompt_len + max_tokens <= max_model_len; the message gives both numbers), or the default
// cut to what fits.
absl::StatusOr<int> ResolveMaxTokens(const CompletionRequest& request, int prompt_len,
                                     int max_model_len);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or values past U+10FFFF).
bool IsValidUtf8(absl::string_view text);

}  // namespace mqa
