#include "runtime/http/api_types.h"

#include <algorithm>
#include <random>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/grammar.h"
#include "runtime/json_schema_regex.h"

namespace mqa {
namespace {

using json = nlohmann::json;

struct BadCase {
  std::string body;
  std::string param;  // expected ErrorParam
};

// Every malformed /v1/completions body gets InvalidArgument (400) naming the field.
TEST(ApiTypesTest, BadCompletionBodiesNameTheirField) {
  std::vector<BadCase> cases = {
      {"{", ""},
      {"", ""},
      {"[1, 2]", ""},
      {"\"prompt\"", ""},
      {"{\"prompt\": \"a\xff\"}", ""},         // invalid UTF-8
      {"{\"prompt\": \"\xed\xa0\x80\"}", ""},  // an encoded surrogate
      {"{\"prompt\": \"\\ud800\"}", ""},       // a lone escaped surrogate
      {"{}", "prompt"},
      {"{\"prompt\": 5}", "prompt"},
      {"{\"prompt\": \"\"}", "prompt"},
      {"{\"prompt\": []}", "prompt"},
      {"{\"prompt\": [[]]}", "prompt"},
      {"{\"prompt\": [\"a\", \"\"]}", "prompt"},
      {"{\"prompt\": [1, \"a\"]}", "prompt"},
      {"{\"prompt\": [\"a\", 1]}", "prompt"},
      {"{\"prompt\": [1.5]}", "prompt"},
      {"{\"prompt\": [-1]}", "prompt"},
      {"{\"prompt\": [[1], [-3]]}", "prompt"},
      {"{\"prompt\": [3000000000]}", "prompt"},
      {"{\"prompt\": {\"a\": 1}}", "prompt"},
      {"{\"prompt\": \"a\", \"model\": 3}", "model"},
      {"{\"prompt\": \"a\", \"max_tokens\": -1}", "max_tokens"},
      {"{\"prompt\": \"a\", \"max_tokens\": 0}", "max_tokens"},
      {"{\"prompt\": \"a\", \"max_tokens\": \"16\"}", "max_tokens"},
      {"{\"prompt\": \"a\", \"max_tokens\": 16.5}", "max_tokens"},
      {"{\"prompt\": \"a\", \"max_tokens\": 99999999999}", "max_tokens"},
      {"{\"prompt\": \"a\", \"temperature\": -0.5}", "temperature"},
      {"{\"prompt\": \"a\", \"temperature\": \"hot\"}", "temperature"},
      {"{\"prompt\": \"a\", \"top_p\": 0}", "top_p"},
      {"{\"prompt\": \"a\", \"top_p\": 1.01}", "top_p"},
      {"{\"prompt\": \"a\", \"top_k\": -2}", "top_k"},
      {"{\"prompt\": \"a\", \"min_p\": 1.5}", "min_p"},
      {"{\"prompt\": \"a\", \"n\": 0}", "n"},
      {"{\"prompt\": \"a\", \"n\": true}", "n"},
      {"{\"prompt\": \"a\", \"n\": 129}", "n"},
      {"{\"prompt\": \"a\", \"presence_penalty\": 2.5}", "presence_penalty"},
      {"{\"prompt\": \"a\", \"frequency_penalty\": -3}", "frequency_penalty"},
      {"{\"prompt\": \"a\", \"repetition_penalty\": 0}", "repetition_penalty"},
      {"{\"prompt\": \"a\", \"seed\": \"x\"}", "seed"},
      {"{\"prompt\": \"a\", \"stop\": 5}", "stop"},
      {"{\"prompt\": \"a\", \"stop\": [\"\"]}", "stop"},
      {"{\"prompt\": \"a\", \"stop\": [\"x\", 1]}", "stop"},
      {"{\"prompt\": \"a\", \"stop_token_ids\": 3}", "stop_token_ids"},
      {"{\"prompt\": \"a\", \"stop_token_ids\": [-4]}", "stop_token_ids"},
      {"{\"prompt\": \"a\", \"logprobs\": 21}", "logprobs"},
      {"{\"prompt\": \"a\", \"logprobs\": true}", "logprobs"},
      {"{\"prompt\": \"a\", \"echo\": \"yes\"}", "echo"},
      {"{\"prompt\": \"a\", \"ignore_eos\": 1}", "ignore_eos"},
      {"{\"prompt\": \"a\", \"min_tokens\": -1}", "min_tokens"},
      {"{\"prompt\": \"a\", \"max_tokens\": 2, \"min_tokens\": 5}", "min_tokens"},
      {"{\"prompt\": \"a\", \"return_token_ids\": \"no\"}", "return_token_ids"},
      {"{\"prompt\": \"a\", \"stream\": 1}", "stream"},
      {"{\"prompt\": \"a\", \"stream_options\": {\"include_usage\": true}}", "stream_options"},
      {"{\"prompt\": \"a\", \"stream\": true, \"stream_options\": 3}", "stream_options"},
      {"{\"prompt\": \"a\", \"stream\": true, \"stream_options\": "
       "{\"continuous_usage_stats\": 1}}",
       "stream_options"},
      {"{\"prompt\": \"a\", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}",
       "stream_options"},
  };
  std::string many = "{\"prompt\": [";
  for (int i = 0; i <= kMaxPromptsPerRequest; ++i) absl::StrAppend(&many, i ? "," : "", "[1]");
  cases.push_back({many + "]}", "prompt"});
  for (const BadCase& c : cases) {
    absl::StatusOr<CompletionRequest> parsed = ParseCompletionRequest(c.body);
    ASSERT_FALSE(parsed.ok()) << c.body;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_EQ(HttpStatusFor(parsed.status()), 400) << c.body;
    EXPECT_EQ(ErrorParam(parsed.status()), c.param) << c.body << ": " << parsed.status();
    // The error body has OpenAI's shape and names the same field.
    json body = json::parse(ErrorBody(parsed.status()));
    ASSERT_TRUE(body.contains("error")) << c.body;
    EXPECT_EQ(body["error"]["message"], std::string(parsed.status().message()));
    EXPECT_EQ(body["error"]["type"], "invalid_request_error");
    if (c.param.empty()) {
      EXPECT_TRUE(body["error"]["param"].is_null());
    } else {
      EXPECT_EQ(body["error"]["param"], c.param);
    }
    EXPECT_TRUE(body["error"].contains("code"));
  }
}

TEST(ApiTypesTest, PromptShapes) {
  auto parse = [](const std::string& body) {
    absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(body);
    EXPECT_TRUE(r.ok()) << body << ": " << r.status();
    return *r;
  };
  CompletionRequest one = parse("{\"prompt\": \"def f():\"}");
  ASSERT_EQ(one.prompts.size(), 1u);
  EXPECT_TRUE(one.prompts[0].is_text);
  EXPECT_EQ(one.prompts[0].text, "def f():");

  CompletionRequest texts = parse("{\"prompt\": [\"a\", \"b\", \"c\"]}");
  ASSERT_EQ(texts.prompts.size(), 3u);
  EXPECT_EQ(texts.prompts[2].text, "c");

  CompletionRequest ids = parse("{\"prompt\": [5, 17, 4096]}");
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_FALSE(ids.prompts[0].is_text);
  EXPECT_EQ(ids.prompts[0].token_ids, (std::vector<int32_t>{5, 17, 4096}));

  CompletionRequest lists = parse("{\"prompt\": [[1, 2], [3]]}");
  ASSERT_EQ(lists.prompts.size(), 2u);
  EXPECT_EQ(lists.prompts[1].token_ids, (std::vector<int32_t>{3}));
}

TEST(ApiTypesTest, DefaultsAndNullsLeaveDefaults) {
  absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(
      "{\"prompt\": \"x\", \"temperature\": null, \"stop\": null, \"logprobs\": null}");
  ASSERT_TRUE(r.ok()) << r.status();
  SamplingParams defaults;
  EXPECT_EQ(r->params.max_tokens, kDefaultMaxTokens);
  EXPECT_FALSE(r->max_tokens_given);
  EXPECT_EQ(r->params.temperature, defaults.temperature);
  EXPECT_EQ(r->params.n, 1);
  EXPECT_FALSE(r->params.logprobs.has_value());
  EXPECT_FALSE(r->params.seed.has_value());
  EXPECT_TRUE(r->params.stop.empty());
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->echo);
  EXPECT_FALSE(r->model.has_value());

  // max_tokens 0 is allowed with echo (the prompt comes back, nothing is generated).
  absl::StatusOr<CompletionRequest> echo =
      ParseCompletionRequest("{\"prompt\": \"x\", \"echo\": true, \"max_tokens\": 0}");
  ASSERT_TRUE(echo.ok()) << echo.status();
  EXPECT_EQ(echo->params.max_tokens, 0);
}

// The prompt tokens' log-probabilities: echo with logprobs (OpenAI's meaning, what loglikelihood
// evaluations read) and vLLM's prompt_logprobs both ask the engine for them, with the larger count
// of alternatives; prompt_logprobs is not streamed.
TEST(ApiTypesTest, EchoWithLogprobsAndPromptLogprobsAskForThePromptScores) {
  auto parse = [](const char* body) {
    absl::StatusOr<CompletionRequest> request = ParseCompletionRequest(body);
    EXPECT_TRUE(request.ok()) << body << ": " << request.status();
    return request.ok() ? *request : CompletionRequest();
  };
  CompletionRequest echo =
      parse("{\"prompt\": \"x\", \"echo\": true, \"logprobs\": 1, \"max_tokens\": 0}");
  EXPECT_EQ(echo.params.prompt_logprobs, 1);
  EXPECT_EQ(echo.params.max_tokens, 0);
  EXPECT_FALSE(echo.prompt_logprobs.has_value());
  EXPECT_EQ(parse("{\"prompt\": \"x\", \"echo\": true, \"logprobs\": 0}").params.prompt_logprobs,
            0);
  EXPECT_FALSE(parse("{\"prompt\": \"x\", \"echo\": true, \"logprobs\": null}")
                   .params.prompt_logprobs.has_value());
  EXPECT_FALSE(parse("{\"prompt\": \"x\", \"logprobs\": 1}").params.prompt_logprobs.has_value());
  CompletionRequest vllm = parse("{\"prompt\": \"x\", \"prompt_logprobs\": 3}");
  EXPECT_EQ(vllm.prompt_logprobs, 3);
  EXPECT_EQ(vllm.params.prompt_logprobs, 3);
  EXPECT_EQ(parse("{\"prompt\": \"x\", \"prompt_logprobs\": 2, \"echo\": true, \"logprobs\": 5}")
                .params.prompt_logprobs,
            5);
  for (const char* body : {"{\"prompt\": \"x\", \"prompt_logprobs\": 21}",
                           "{\"prompt\": \"x\", \"prompt_logprobs\": -1}",
                           "{\"prompt\": \"x\", \"prompt_logprobs\": \"2\"}",
                           "{\"prompt\": \"x\", \"prompt_logprobs\": 1, \"stream\": true}"}) {
    EXPECT_EQ(ErrorParam(ParseCompletionRequest(body).status()), "prompt_logprobs") << body;
  }
}

// TGI's request: parameters map onto the engine's; sampling as TGI turns it on; unset (null)
// parameters, as huggingface_hub sends them, keep the defaults; what is not implemented is refused
// by name.
TEST(ApiTypesTest, TgiRequests) {
  auto parse = [](const char* body) {
    absl::StatusOr<TgiRequest> request = ParseTgiRequest(body);
    EXPECT_TRUE(request.ok()) << body << ": " << request.status();
    return request.ok() ? *request : TgiRequest();
  };
  TgiRequest plain = parse(R"({"inputs": "def f("})");
  ASSERT_EQ(plain.completion.prompts.size(), 1u);
  EXPECT_EQ(plain.completion.prompts[0].text, "def f(");
  EXPECT_FALSE(plain.sampling);
  EXPECT_EQ(plain.completion.params.temperature, 0.0f);
  EXPECT_EQ(plain.completion.params.max_tokens, kTgiDefaultMaxNewTokens);
  EXPECT_FALSE(plain.completion.max_tokens_given);
  EXPECT_TRUE(plain.completion.params.include_stop_str_in_output);
  EXPECT_FALSE(plain.completion.params.prompt_logprobs.has_value());

  TgiRequest hub = parse(
      R"({"inputs": "x", "stream": true, "parameters": {"adapter_id": null, "best_of": null,
          "decoder_input_details": true, "details": true, "do_sample": false,
          "frequency_penalty": null, "grammar": null, "max_new_tokens": 7,
          "repetition_penalty": 1.1, "return_full_text": true, "seed": 18446744073709551615,
          "stop": ["\n\n"], "temperature": 0.2, "top_k": null, "top_n_tokens": 3, "top_p": 0.95,
          "truncate": 100, "typical_p": null, "watermark": false}})");
  EXPECT_TRUE(hub.completion.stream);
  EXPECT_TRUE(hub.sampling);  // temperature and top_p turn it on, do_sample or not
  EXPECT_FLOAT_EQ(hub.completion.params.temperature, 0.2f);
  EXPECT_FLOAT_EQ(hub.completion.params.top_p, 0.95f);
  EXPECT_EQ(hub.completion.params.max_tokens, 7);
  EXPECT_FLOAT_EQ(hub.completion.params.repetition_penalty, 1.1f);
  EXPECT_EQ(hub.completion.params.seed, 18446744073709551615ull);
  EXPECT_EQ(hub.completion.params.stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(hub.completion.truncate_prompt_tokens, 100);
  EXPECT_TRUE(hub.details && hub.decoder_input_details && hub.return_full_text);
  EXPECT_EQ(hub.top_n_tokens, 3);
  EXPECT_EQ(hub.completion.params.prompt_logprobs, 3);

  EXPECT_FALSE(parse(R"({"inputs": "x", "parameters": {"decoder_input_details": true}})")
                   .completion.params.prompt_logprobs.has_value());  // no details: nothing to show
  TgiRequest sampled = parse(R"({"inputs": "x", "parameters": {"do_sample": true}})");
  EXPECT_TRUE(sampled.sampling);
  EXPECT_EQ(sampled.completion.params.temperature, 1.0f);
  EXPECT_TRUE(parse(R"({"inputs": "x", "parameters": {"top_k": 5}})").sampling);
  EXPECT_FALSE(parse(R"({"inputs": "x", "parameters": {"temperature": 1.0}})").sampling);
  EXPECT_EQ(
      parse(R"({"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "a|b"}}})")
          .completion.params.guided_regex,
      "a|b");
  EXPECT_EQ(
      parse(R"({"inputs": "x", "parameters": {"grammar": {"type": "json", "value": {"enum": [1]}}}})")
          .completion.params.guided_regex,
      "(?:1)");

  const std::pair<const char*, const char*> refused[] = {
      {R"({"parameters": {}})", "inputs"},
      {R"({"inputs": 5})", "inputs"},
      {R"({"inputs": ""})", "inputs"},
      {R"({"inputs": "x", "parameters": []})", "parameters"},
      {R"({"inputs": "x", "parameters": {"typical_p": 1.5}})", "typical_p"},
      {R"({"inputs": "x", "parameters": {"grammar": {"type": "json"}}})", "grammar"},
      {R"({"inputs": "x", "parameters": {"grammar": {"type": "ebnf", "value": "x"}}})", "grammar"},
      {R"({"inputs": "x", "parameters": {"grammar": {"type": "regex"}}})", "grammar"},
      {R"({"inputs": "x", "parameters": {"adapter_id": "a"}})", "adapter_id"},
      {R"({"inputs": "x", "parameters": {"watermark": true}})", "watermark"},
      {R"({"inputs": "x", "parameters": {"best_of": 2}})", "best_of"},
      {R"({"inputs": "x", "parameters": {"temperature": 0}})", "temperature"},
      {R"({"inputs": "x", "parameters": {"top_p": 1}})", "top_p"},
      {R"({"inputs": "x", "parameters": {"top_k": 0}})", "top_k"},
      {R"({"inputs": "x", "parameters": {"max_new_tokens": 0}})", "max_new_tokens"},
      {R"({"inputs": "x", "parameters": {"top_n_tokens": 6}})", "top_n_tokens"},
      {R"({"inputs": "x", "parameters": {"seed": -1}})", "seed"},
      {R"({"inputs": "x", "parameters": {"stop": "x"}})", "stop"},
      {R"({"inputs": "x", "parameters": {"stop": [""]}})", "stop"},
  };
  for (const auto& [body, param] : refused) {
    absl::Status status = ParseTgiRequest(body).status();
    EXPECT_EQ(ErrorParam(status), param) << body << ": " << status;
    EXPECT_EQ(TgiHttpStatusFor(status), 422) << body;
    const auto error = nlohmann::json::parse(TgiErrorBody(status));
    EXPECT_EQ(error["error_type"], "validation");
    EXPECT_EQ(error["error"], std::string(status.message()));
  }
  EXPECT_EQ(TgiHttpStatusFor(absl::ResourceExhaustedError("full")), 429);
  EXPECT_EQ(nlohmann::json::parse(TgiErrorBody(absl::ResourceExhaustedError("full")))["error_type"],
            "overloaded");
}

// allowed_token_ids and regular guidance (guided_regex, guided_choice: one pattern) are taken;
// JSON / grammar structured output and beam search, not implemented, are refused by name instead
// of answered with unconstrained text.
TEST(ApiTypesTest, AllowedTokenIdsAndGuidanceTakenOtherStructuredOutputRefused) {
  absl::StatusOr<CompletionRequest> allowed =
      ParseCompletionRequest(R"({"prompt": "x", "allowed_token_ids": [5, 9]})");
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_EQ(allowed->params.allowed_token_ids, std::vector<int32_t>({5, 9}));
  EXPECT_TRUE(
      ParseCompletionRequest(R"({"prompt": "x", "response_format": {"type": "text"}})").ok());
  EXPECT_TRUE(
      ParseCompletionRequest(R"({"prompt": "x", "bad_words": [], "use_beam_search": false})").ok());
  absl::StatusOr<CompletionRequest> regex =
      ParseCompletionRequest(R"({"prompt": "x", "guided_regex": "[0-9]{3}"})");
  ASSERT_TRUE(regex.ok()) << regex.status();
  EXPECT_EQ(regex->params.guided_regex, "[0-9]{3}");
  absl::StatusOr<CompletionRequest> choice =
      ParseCompletionRequest(R"j({"prompt": "x", "guided_choice": ["yes", "no (.)"]})j");
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->params.guided_regex, "yes|no \\(\\.\\)");
  absl::StatusOr<ChatRequest> chat = ParseChatRequest(
      R"({"messages": [{"role": "user", "content": "x"}], "guided_choice": ["a"]})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->common.params.guided_regex, "a");
  absl::StatusOr<CompletionRequest> bad =
      ParseCompletionRequest(R"({"prompt": "x", "bad_words": ["import", " os"]})");
  ASSERT_TRUE(bad.ok()) << bad.status();
  EXPECT_EQ(bad->params.bad_words, (std::vector<std::string>{"import", " os"}));
  absl::StatusOr<CompletionRequest> urgent =
      ParseCompletionRequest(R"({"prompt": "x", "priority": -3})");
  ASSERT_TRUE(urgent.ok()) << urgent.status();
  EXPECT_EQ(urgent->params.priority, -3);
  EXPECT_EQ(ErrorParam(ParseCompletionRequest(R"({"prompt": "x", "priority": 1.5})").status()),
            "priority");
  // JSON: the schema's properties in the client's order (the pattern starts with the first).
  absl::StatusOr<CompletionRequest> schema = ParseCompletionRequest(
      R"({"prompt": "x", "guided_json": {"type": "object", "properties": {"zeta": {"type":
          "integer"}, "alpha": {"type": "boolean"}}, "required": ["zeta", "alpha"]}})");
  ASSERT_TRUE(schema.ok()) << schema.status();
  EXPECT_EQ(schema->params.guided_regex.rfind("\\{ ?\"zeta\"", 0), 0u)
      << schema->params.guided_regex;
  absl::StatusOr<CompletionRequest> text_schema = ParseCompletionRequest(
      R"({"prompt": "x", "guided_json": "{\"type\": \"boolean\"}"})");
  ASSERT_TRUE(text_schema.ok()) << text_schema.status();
  EXPECT_EQ(text_schema->params.guided_regex, "(?:true|false)");
  absl::StatusOr<ChatRequest> format = ParseChatRequest(
      R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type":
          "json_schema", "json_schema": {"name": "n", "schema": {"type": "null"}}}})");
  ASSERT_TRUE(format.ok()) << format.status();
  EXPECT_EQ(format->common.params.guided_regex, "null");
  absl::StatusOr<CompletionRequest> object =
      ParseCompletionRequest(R"({"prompt": "x", "response_format": {"type": "json_object"}})");
  ASSERT_TRUE(object.ok()) << object.status();
  EXPECT_TRUE(object->params.guided_regex.empty());  // any depth: a grammar
  EXPECT_EQ(object->params.guided_grammar, GrammarGuide::JsonObjectGrammar());
  absl::StatusOr<CompletionRequest> grammar =
      ParseCompletionRequest(R"({"prompt": "x", "guided_grammar": "root ::= \"a\"+"})");
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  EXPECT_EQ(grammar->params.guided_grammar, "root ::= \"a\"+");
  const std::pair<const char*, const char*> refused[] = {
      {R"({"prompt": "x", "allowed_token_ids": []})", "allowed_token_ids"},
      {R"({"prompt": "x", "allowed_token_ids": [-1]})", "allowed_token_ids"},
      {R"({"prompt": "x", "guided_json": 5})", "guided_json"},
      {R"({"prompt": "x", "guided_json": "{no"})", "guided_json"},
      {R"({"prompt": "x", "guided_json": {"type": "tuple"}})", "guided_json"},
      {R"({"prompt": "x", "guided_json": {}, "guided_regex": "a"})", "guided_json"},
      {R"({"prompt": "x", "response_format": {"type": "json_schema"}})", "response_format"},
      {R"({"prompt": "x", "response_format": {"type": "yaml"}})", "response_format"},
      {R"({"prompt": "x", "guided_json": {}, "response_format": {"type": "json_object"}})",
       "guided_json"},
      {R"({"prompt": "x", "guided_regex": ""})", "guided_regex"},
      {R"({"prompt": "x", "guided_regex": 5})", "guided_regex"},
      {R"({"prompt": "x", "guided_choice": []})", "guided_choice"},
      {R"({"prompt": "x", "guided_choice": ["a", ""]})", "guided_choice"},
      {R"({"prompt": "x", "guided_choice": ["a"], "guided_regex": "a"})", "guided_choice"},
      {R"({"prompt": "x", "guided_grammar": ""})", "guided_grammar"},
      {R"({"prompt": "x", "guided_grammar": ["root ::= x"]})", "guided_grammar"},
      {R"({"prompt": "x", "guided_grammar": "root ::= x", "guided_regex": "a"})", "guided_grammar"},
      {R"({"prompt": "x", "guided_grammar": "root ::= x", "response_format": {"type":
          "json_object"}})",
       "response_format"},
      {R"({"prompt": "x", "response_format": "json"})", "response_format"},
      {R"({"prompt": "x", "use_beam_search": true, "stop": "y"})", "stop"},
      {R"({"prompt": "x", "use_beam_search": true, "n": 9})", "n"},
      {R"({"prompt": "x", "length_penalty": 1})", "length_penalty"},
      {R"({"prompt": "x", "bad_words": [""]})", "bad_words"},
      {R"({"prompt": "x", "bad_words": "import"})", "bad_words"},
  };
  for (const auto& [body, param] : refused) {
    EXPECT_EQ(ErrorParam(ParseCompletionRequest(body).status()), param) << body;
  }
  absl::StatusOr<CompletionRequest> beams = ParseCompletionRequest(
      R"({"prompt": "x", "use_beam_search": true, "n": 4, "length_penalty": 0.5,
          "temperature": 0.7, "seed": 3})");
  ASSERT_TRUE(beams.ok()) << beams.status();
  ASSERT_TRUE(beams->beam_search.has_value());
  EXPECT_EQ(beams->beam_search->length_penalty, 0.5f);
  EXPECT_EQ(beams->params.n, 4);
  EXPECT_FALSE(ParseCompletionRequest(R"({"prompt": "x"})")->beam_search.has_value());
  EXPECT_EQ(ErrorParam(ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}],
                                           "use_beam_search": true})")
                           .status()),
            "use_beam_search");
  // generation_config defaults do not reach a beam search, but its max_tokens does.
  absl::StatusOr<CompletionRequest> defaulted = ParseCompletionRequest(
      R"({"prompt": "x", "use_beam_search": true})", {{"top_p", 0.9}, {"max_tokens", 5}});
  ASSERT_TRUE(defaulted.ok()) << defaulted.status();
  EXPECT_EQ(defaulted->params.max_tokens, 5);
}

// vLLM's structured_outputs (its spelling since 0.12) guides exactly as the guided_* fields do, in
// completions and chat; the schema keeps the client's property order; mistakes are named as the
// client spelled them.
TEST(ApiTypesTest, StructuredOutputsGuideAsGuidedFields) {
  const std::string schema =
      R"({"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type":
          "boolean"}}, "required": ["zeta", "alpha"]})";
  const std::pair<std::string, std::string> same[] = {
      {R"("structured_outputs": {"regex": "[0-9]{3}"})", R"("guided_regex": "[0-9]{3}")"},
      {R"j("structured_outputs": {"choice": ["yes", "no (.)"]})j",
       R"j("guided_choice": ["yes", "no (.)"])j"},
      {R"("structured_outputs": {"grammar": "root ::= \"a\"+"})",
       R"("guided_grammar": "root ::= \"a\"+")"},
      {R"("structured_outputs": {"json": )" + schema + "}", R"("guided_json": )" + schema},
      {R"("structured_outputs": {"json": "{\"type\": \"boolean\"}"})",
       R"("guided_json": "{\"type\": \"boolean\"}")"},
      {R"("structured_outputs": {"json_object": true, "disable_any_whitespace": false})",
       R"("response_format": {"type": "json_object"})"},
      {R"("structured_outputs": {"regex": "a", "json": null, "disable_fallback": false})",
       R"("guided_regex": "a")"},
      {R"("structured_outputs": {"json": )" + schema + R"(, "disable_any_whitespace": true})",
       R"("guided_whitespace_pattern": "", "guided_json": )" + schema},
      {R"("structured_outputs": {"json_object": true, "disable_any_whitespace": true})",
       R"("guided_whitespace_pattern": "", "response_format": {"type": "json_object"})"},
      {R"("structured_outputs": {"json": )" + schema + R"(, "whitespace_pattern": ""})",
       R"("guided_whitespace_pattern": "", "guided_json": )" + schema},
  };
  for (const auto& [structured, guided] : same) {
    absl::StatusOr<CompletionRequest> a =
        ParseCompletionRequest(R"({"prompt": "x", )" + structured + "}");
    absl::StatusOr<CompletionRequest> b =
        ParseCompletionRequest(R"({"prompt": "x", )" + guided + "}");
    ASSERT_TRUE(a.ok()) << a.status() << structured;
    ASSERT_TRUE(b.ok()) << b.status() << guided;
    EXPECT_FALSE(a->params.guided_regex.empty() && a->params.guided_grammar.empty()) << structured;
    EXPECT_EQ(a->params.guided_regex, b->params.guided_regex) << structured;
    EXPECT_EQ(a->params.guided_grammar, b->params.guided_grammar) << structured;
    const std::string messages = R"({"messages": [{"role": "user", "content": "x"}], )";
    absl::StatusOr<ChatRequest> chat = ParseChatRequest(messages + structured + "}");
    ASSERT_TRUE(chat.ok()) << chat.status() << structured;
    EXPECT_EQ(chat->common.params.guided_regex, b->params.guided_regex) << structured;
    EXPECT_EQ(chat->common.params.guided_grammar, b->params.guided_grammar) << structured;
  }
  absl::StatusOr<CompletionRequest> ordered =
      ParseCompletionRequest(R"({"prompt": "x", "structured_outputs": {"json": )" + schema + "}}");
  ASSERT_TRUE(ordered.ok()) << ordered.status();
  EXPECT_EQ(ordered->params.guided_regex.rfind("\\{ ?\"zeta\"", 0), 0u)
      << ordered->params.guided_regex;
  EXPECT_TRUE(ParseCompletionRequest(R"({"prompt": "x", "structured_outputs": {}})")
                  ->params.guided_regex.empty());
  // disable_any_whitespace: no space between tokens in the guide, where the default takes one.
  absl::StatusOr<CompletionRequest> tight =
      ParseCompletionRequest(R"({"prompt": "x", "structured_outputs": {"json": )" + schema +
                             R"(, "disable_any_whitespace": true}})");
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_EQ(tight->params.guided_regex.rfind("\\{\"zeta\":", 0), 0u) << tight->params.guided_regex;
  EXPECT_NE(tight->params.guided_regex, ordered->params.guided_regex);
  const std::pair<const char*, const char*> refused[] = {
      {R"({"prompt": "x", "structured_outputs": "json"})", "structured_outputs"},
      {R"({"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["b"]}})",
       "structured_outputs"},
      {R"({"prompt": "x", "structured_outputs": {"regex": "a"}, "guided_regex": "a"})",
       "structured_outputs"},
      {R"({"prompt": "x", "structured_outputs": {"json_object": true}, "response_format":
          {"type": "json_object"}})",
       "structured_outputs"},
      {R"({"prompt": "x", "structured_outputs": {"regex": ""}})", "structured_outputs.regex"},
      {R"({"prompt": "x", "structured_outputs": {"choice": []}})", "structured_outputs.choice"},
      {R"({"prompt": "x", "structured_outputs": {"json": {"type": "tuple"}}})",
       "structured_outputs.json"},
      {R"({"prompt": "x", "structured_outputs": {"grammar": 3}})", "structured_outputs.grammar"},
      {R"({"prompt": "x", "structured_outputs": {"json_object": 1}})",
       "structured_outputs.json_object"},
      {R"({"prompt": "x", "structured_outputs": {"structural_tag": "{}"}})",
       "structured_outputs.structural_tag"},
      {R"({"prompt": "x", "structured_outputs": {"whitespace_pattern": " "}})",
       "structured_outputs.whitespace_pattern"},
      {R"({"prompt": "x", "structured_outputs": {"regexp": "a"}})", "structured_outputs.regexp"},
      {R"({"prompt": "x", "structured_outputs": {"json": {}, "disable_any_whitespace": 1}})",
       "structured_outputs.disable_any_whitespace"},
      {R"({"prompt": "x", "guided_json": {}, "guided_whitespace_pattern": "\\s*"})",
       "guided_whitespace_pattern"},
      {R"({"prompt": "x", "use_beam_search": true, "structured_outputs": {"regex": "a"}})",
       "structured_outputs.regex"},
  };
  for (const auto& [body, param] : refused) {
    absl::Status status = ParseCompletionRequest(body).status();
    EXPECT_EQ(ErrorParam(status), param) << body;
    if (!absl::StrContains(body, "guided_")) {  // named as the client spelled it
      EXPECT_FALSE(absl::StrContains(status.message(), "guided_"))
          << body << ": " << status.message();
    }
  }
}

// Random in-range values of every field come through unchanged.
// OpenAI's tools and tool_choice: the tools reach the template; a named function guides the output
// by its parameters' schema, "required" by a list of calls; "auto" and every malformed shape are
// refused naming the field.
TEST(ApiTypesTest, ToolsAndToolChoice) {
  const std::string messages = R"("messages": [{"role": "user", "content": "weather?"}])";
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"},
          "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
          {"function": {"name": "now"}}])";
  auto parse = [&](const std::string& rest) {
    return ParseChatRequest(absl::StrCat("{", messages, ", ", rest, "}"));
  };
  auto matches = [](const std::string& pattern, const std::string& text) {
    return std::regex_match(text, std::regex(pattern, std::regex::ECMAScript));
  };

  // Without tool_choice and without tools: plain chat. With tool_choice "none": the tools still
  // reach the template, nothing guides the output.
  absl::StatusOr<ChatRequest> none = parse(tools + R"(, "tool_choice": "none")");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->tool_choice.mode, ToolChoiceMode::kNone);
  ASSERT_EQ(none->chat.tools.size(), 2u);
  EXPECT_EQ(none->chat.tools[1]["function"]["name"], "now");
  EXPECT_TRUE(none->common.params.guided_regex.empty());
  absl::StatusOr<ChatRequest> plain = parse(R"("tools": [])");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->chat.tools.is_null());

  // Named: the output is the arguments, properties in the client's order.
  absl::StatusOr<ChatRequest> named = parse(
      tools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->tool_choice.mode, ToolChoiceMode::kNamed);
  EXPECT_EQ(named->tool_choice.name, "get_weather");
  const std::string& arguments = named->common.params.guided_regex;
  EXPECT_TRUE(matches(arguments, R"({"city": "Paris", "unit": "c"})")) << arguments;
  EXPECT_FALSE(matches(arguments, R"({"unit": "c", "city": "Paris"})")) << arguments;
  EXPECT_FALSE(matches(arguments, R"({"city": "Paris", "unit": "k"})")) << arguments;
  // A function without parameters takes any object.
  absl::StatusOr<ChatRequest> bare =
      parse(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "now"}})");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_TRUE(bare->common.params.guided_regex.empty());
  EXPECT_EQ(bare->common.params.guided_grammar, GrammarGuide::JsonObjectGrammar());

  // Required: a non-empty list of calls of the tools given, at most one without parallel calls.
  absl::StatusOr<ChatRequest> required = parse(tools + R"(, "tool_choice": "required")");
  ASSERT_TRUE(required.ok()) << required.status();
  EXPECT_EQ(required->tool_choice.mode, ToolChoiceMode::kRequired);
  const std::string& list = required->common.params.guided_regex;
  const std::string weather =
      R"({"name": "get_weather", "parameters": {"city": "Oslo", "unit": "f"}})";
  const std::string now = R"({"name": "now", "parameters": {}})";
  EXPECT_TRUE(matches(list, "[" + weather + "]")) << list;
  EXPECT_TRUE(matches(list, "[" + weather + ", " + now + "]")) << list;
  EXPECT_FALSE(matches(list, "[]"));
  EXPECT_FALSE(matches(list, R"([{"name": "other", "parameters": {}}])"));
  EXPECT_FALSE(matches(list, R"([{"name": "get_weather", "parameters": {}}])"));
  absl::StatusOr<ChatRequest> single =
      parse(tools + R"(, "tool_choice": "required", "parallel_tool_calls": false)");
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_TRUE(matches(single->common.params.guided_regex, "[" + now + "]"));
  EXPECT_FALSE(matches(single->common.params.guided_regex, "[" + now + ", " + now + "]"));
  // Each tool's $defs are gathered where its $refs point.
  absl::StatusOr<ChatRequest> defs = parse(
      R"("tools": [{"type": "function", "function": {"name": "f", "parameters": {"type":
          "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"], "$defs":
          {"P": {"type": "integer"}}}}}], "tool_choice": "required")");
  ASSERT_TRUE(defs.ok()) << defs.status();
  EXPECT_TRUE(
      matches(defs->common.params.guided_regex, R"([{"name": "f", "parameters": {"p": 7}}])"));

  // Earlier calls in the conversation reach the template with their arguments as objects.
  absl::StatusOr<ChatRequest> history = ParseChatRequest(
      R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null,
          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments":
          "{\"a\": 1}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "2"}]})");
  ASSERT_TRUE(history.ok()) << history.status();
  EXPECT_EQ(history->chat.messages[1]["tool_calls"][0]["function"]["arguments"], json({{"a", 1}}));
  EXPECT_EQ(history->chat.messages[1]["content"], "");
  EXPECT_EQ(history->chat.messages[2]["tool_call_id"], "c1");

  // "auto", the default when tools are given: no guidance, the server's parser reads the calls
  // (the server refuses it without one); with no tools, nothing to call.
  for (const std::string& rest : {tools, tools + R"(, "tool_choice": "auto")"}) {
    absl::StatusOr<ChatRequest> r = parse(rest);
    ASSERT_TRUE(r.ok()) << rest << ": " << r.status();
    EXPECT_EQ(r->tool_choice.mode, ToolChoiceMode::kAuto) << rest;
    EXPECT_TRUE(r->common.params.guided_regex.empty());
  }
  absl::StatusOr<ChatRequest> no_tools = parse(R"("tool_choice": "auto")");
  ASSERT_TRUE(no_tools.ok()) << no_tools.status();
  EXPECT_EQ(no_tools->tool_choice.mode, ToolChoiceMode::kNone);

  const std::pair<std::string, const char*> refused[] = {
      {tools + R"(, "tool_choice": "auto", "echo": true)", "echo"},
      {R"("tool_choice": "required")", "tool_choice"},
      {tools + R"(, "tool_choice": "sometimes")", "tool_choice"},
      {tools + R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})",
       "tool_choice"},
      {tools + R"(, "tool_choice": {"type": "function"})", "tool_choice"},
      {tools + R"(, "tool_choice": "required", "guided_regex": "a")", "tool_choice"},
      {tools + R"(, "tool_choice": "required", "echo": true)", "echo"},
      {tools + R"(, "tool_choice": "required", "parallel_tool_calls": 1)", "parallel_tool_calls"},
      {R"("tools": {"name": "f"})", "tools"},
      {R"("tools": [{"type": "retrieval", "function": {"name": "f"}}])", "tools"},
      {R"("tools": [{"type": "function"}])", "tools"},
      {R"("tools": [{"function": {"name": "has space"}}])", "tools"},
      {R"("tools": [{"function": {"name": ""}}])", "tools"},
      {R"("tools": [{"function": {"name": "f"}}, {"function": {"name": "f"}}])", "tools"},
      {R"("tools": [{"function": {"name": "f", "parameters": "x"}}])", "tools"},
      {R"("tools": [{"function": {"name": "f", "parameters": {"type": "tuple"}}}],
          "tool_choice": "required")",
       "tools"},
      {R"("tools": [{"function": {"name": "f", "parameters": {"$defs": {"P": {"type": "null"}}}}},
          {"function": {"name": "g", "parameters": {"$defs": {"P": {"type": "integer"}}}}}],
          "tool_choice": "required")",
       "tools"},
  };
  for (const auto& [rest, param] : refused) {
    absl::StatusOr<ChatRequest> r = parse(rest);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << rest;
    EXPECT_EQ(ErrorParam(r.status()), param) << rest << " -> " << r.status();
  }
  for (const char* bad_history :
       {R"({"messages": [{"role": "assistant", "tool_calls": {"id": 1}}]})",
        R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]})",
        R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f",
               "arguments": "{not json"}}]}]})"}) {
    EXPECT_EQ(ErrorParam(ParseChatRequest(bad_history).status()), "messages") << bad_history;
  }
}

// The model's generation_config.json defaults fill what a request leaves unset (or null); what it
// sets wins; max_tokens stays out of a chat request that gives max_completion_tokens.
TEST(ApiTypesTest, GenerationConfigDefaultsFillUnsetFields) {
  const json defaults = {{"temperature", 0.2},
                         {"top_p", 0.9},
                         {"top_k", 40},
                         {"repetition_penalty", 1.1},
                         {"max_tokens", 64}};
  absl::StatusOr<CompletionRequest> unset = ParseCompletionRequest(R"({"prompt": "x"})", defaults);
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_FLOAT_EQ(unset->params.temperature, 0.2f);
  EXPECT_FLOAT_EQ(unset->params.top_p, 0.9f);
  EXPECT_EQ(unset->params.top_k, 40);
  EXPECT_FLOAT_EQ(unset->params.repetition_penalty, 1.1f);
  EXPECT_EQ(unset->params.max_tokens, 64);
  // Still a default: a long prompt cuts it to what fits instead of being refused.
  EXPECT_FALSE(unset->max_tokens_given);
  EXPECT_EQ(*ResolveMaxTokens(*unset, 100, 128), 28);
  absl::StatusOr<CompletionRequest> set = ParseCompletionRequest(
      R"({"prompt": "x", "temperature": 0, "top_p": null, "max_tokens": 3})", defaults);
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->params.temperature, 0.0f);
  EXPECT_FLOAT_EQ(set->params.top_p, 0.9f);  // null: the default
  EXPECT_EQ(set->params.max_tokens, 3);
  absl::StatusOr<CompletionRequest> plain = ParseCompletionRequest(R"({"prompt": "x"})");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->params.temperature, 1.0f);
  EXPECT_EQ(plain->params.max_tokens, kDefaultMaxTokens);

  const std::string messages = R"("messages": [{"role": "user", "content": "x"}])";
  absl::StatusOr<ChatRequest> chat = ParseChatRequest("{" + messages + "}", defaults);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->common.params.max_tokens, 64);
  EXPECT_FLOAT_EQ(chat->common.params.temperature, 0.2f);
  absl::StatusOr<ChatRequest> completion_tokens =
      ParseChatRequest("{" + messages + R"(, "max_completion_tokens": 7})", defaults);
  ASSERT_TRUE(completion_tokens.ok()) << completion_tokens.status();
  EXPECT_EQ(completion_tokens->common.params.max_tokens, 7);
  absl::StatusOr<InfillRequest> infill =
      ParseInfillRequest(R"({"input_prefix": "a", "input_suffix": "b"})", defaults);
  ASSERT_TRUE(infill.ok()) << infill.status();
  EXPECT_EQ(infill->common.params.max_tokens, 64);
}

// llama.cpp's request: its defaults where the body says nothing, n_predict, repeat_last_n,
// logit_bias in both shapes, grammar and json_schema, /infill's fields.
TEST(ApiTypesTest, LlamaCppRequests) {
  absl::StatusOr<LlamaCppRequest> plain = ParseLlamaCppRequest(R"({"prompt": "x"})", false, 512);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const SamplingParams& p = plain->completion.params;
  EXPECT_FLOAT_EQ(p.temperature, 0.8f);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_FLOAT_EQ(p.top_p, 0.95f);
  EXPECT_FLOAT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.penalty_last_n, 64);
  EXPECT_FALSE(plain->completion.max_tokens_given);  // n_predict -1: to the context
  absl::StatusOr<LlamaCppRequest> set = ParseLlamaCppRequest(
      R"({"prompt": [1, 2, 3], "n_predict": 7, "temperature": -1, "top_k": 0, "repeat_last_n": -1,
          "seed": -1, "logit_bias": [[5, false], [6, 2.5]], "stop": ["\n", ""], "n_probs": 3,
          "cache_prompt": true, "samplers": ["top_k"], "mirostat": 0})",
      false, 512);
  ASSERT_TRUE(set.ok()) << set.status();
  const SamplingParams& q = set->completion.params;
  EXPECT_EQ(set->completion.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(q.max_tokens, 7);
  EXPECT_EQ(q.temperature, 0.0f);  // <= 0: greedy
  EXPECT_EQ(q.top_k, -1);
  EXPECT_EQ(q.penalty_last_n, 512);  // -1: the whole context
  EXPECT_FALSE(q.seed.has_value());  // -1: random
  EXPECT_EQ(q.logit_bias, (std::vector<std::pair<int32_t, float>>{{5, -100.0f}, {6, 2.5f}}));
  EXPECT_EQ(q.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(set->n_probs, 3);
  EXPECT_EQ(q.logprobs, 3);
  absl::StatusOr<LlamaCppRequest> object_bias =
      ParseLlamaCppRequest(R"({"prompt": "x", "logit_bias": {"7": -1}})", false, 512);
  ASSERT_TRUE(object_bias.ok()) << object_bias.status();
  EXPECT_EQ(object_bias->completion.params.logit_bias,
            (std::vector<std::pair<int32_t, float>>{{7, -1.0f}}));
  absl::StatusOr<LlamaCppRequest> grammar =
      ParseLlamaCppRequest(R"({"prompt": "x", "grammar": "root ::= \"a\""})", false, 512);
  ASSERT_TRUE(grammar.ok());
  EXPECT_EQ(grammar->completion.params.guided_grammar, "root ::= \"a\"");
  absl::StatusOr<LlamaCppRequest> any_json =
      ParseLlamaCppRequest(R"({"prompt": "x", "json_schema": {}})", false, 512);
  ASSERT_TRUE(any_json.ok());
  EXPECT_EQ(any_json->completion.params.guided_grammar, GrammarGuide::JsonObjectGrammar());
  absl::StatusOr<LlamaCppRequest> schema =
      ParseLlamaCppRequest(R"({"prompt": "x", "json_schema": {"type": "boolean"}})", false, 512);
  ASSERT_TRUE(schema.ok());
  EXPECT_EQ(schema->completion.params.guided_regex, "(?:true|false)");
  absl::StatusOr<LlamaCppRequest> infill = ParseLlamaCppRequest(
      R"({"input_prefix": "a", "input_suffix": "b", "prompt": "c",
          "input_extra": [{"filename": "f", "text": "ctx\n"}]})",
      true, 512);
  ASSERT_TRUE(infill.ok()) << infill.status();
  EXPECT_EQ(infill->input_prefix, "ctx\na");
  EXPECT_EQ(infill->input_suffix, "b");
  EXPECT_EQ(infill->infill_prompt, "c");
  EXPECT_TRUE(infill->completion.prompts.empty());
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({})", "prompt"},
           {R"({"prompt": ""})", "prompt"},
           {R"({"prompt": ["a", [1]]})", "prompt"},
           {R"({"prompt": "x", "tfs_z": 0.9})", "tfs_z"},
           {R"({"prompt": "x", "repeat_last_n": -2})", "repeat_last_n"},
           {R"({"prompt": "x", "n_predict": -5})", "n_predict"},
           {R"({"prompt": "x", "logit_bias": [[1, "a"]]})", "logit_bias"},
           {R"({"prompt": "x", "grammar": "root ::= \"a\"", "json_schema": {}})", "json_schema"},
           {R"({"prompt": "x", "image_data": [{"id": 1}]})", "image_data"}}) {
    EXPECT_EQ(ErrorParam(ParseLlamaCppRequest(body, false, 512).status()), param) << body;
  }
}

TEST(ApiTypesTest, RandomValidFieldsRoundTrip) {
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const int max_tokens = 1 + static_cast<int>(rng() % 4000);
    const int min_tokens = static_cast<int>(rng() % (max_tokens + 1));
    const double temperature = unit(rng) * 2.0;
    const double top_p = 1e-3 + unit(rng) * (1.0 - 1e-3);
    const int top_k = static_cast<int>(rng() % 100) - 1;
    const double min_p = unit(rng);
    const double presence = unit(rng) * 4.0 - 2.0;
    const double frequency = unit(rng) * 4.0 - 2.0;
    const double repetition = 0.1 + unit(rng) * 2.0;
    const int n = 1 + static_cast<int>(rng() % 8);
    const int64_t seed = static_cast<int64_t>(rng());
    const int logprobs = static_cast<int>(rng() % (kMaxLogprobs + 1));
    const std::string stop = absl::StrCat("stop", rng() % 1000);
    const std::vector<int32_t> stop_ids = {static_cast<int32_t>(rng() % 5000),
                                           static_cast<int32_t>(rng() % 5000)};
    const bool echo = rng() % 2;
    const bool stream = rng() % 2;
    const bool usage = stream && rng() % 2;
    json body = {{"model", "m"},
                 {"prompt", "hello"},
                 {"max_tokens", max_tokens},
                 {"min_tokens", min_tokens},
                 {"temperature", temperature},
                 {"top_p", top_p},
                 {"top_k", top_k},
                 {"min_p", min_p},
                 {"presence_penalty", presence},
                 {"frequency_penalty", frequency},
                 {"repetition_penalty", repetition},
                 {"n", n},
                 {"seed", seed},
                 {"logprobs", logprobs},
                 {"stop", stop},
                 {"stop_token_ids", stop_ids},
                 {"echo", echo},
                 {"ignore_eos", true},
                 {"return_token_ids", true},
                 {"stream", stream}};
    if (stream) body["stream_options"] = {{"include_usage", usage}};
    if (echo) body.erase("logprobs");  // not with echo (EchoWithLogprobsIsRefused)
    absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(body.dump());
    ASSERT_TRUE(r.ok()) << body.dump() << ": " << r.status();
    const SamplingParams& p = r->params;
    EXPECT_EQ(*r->model, "m");
    EXPECT_EQ(p.max_tokens, max_tokens);
    EXPECT_TRUE(r->max_tokens_given);
    EXPECT_EQ(p.min_tokens, min_tokens);
    EXPECT_FLOAT_EQ(p.temperature, static_cast<float>(temperature));
    EXPECT_FLOAT_EQ(p.top_p, static_cast<float>(top_p));
    EXPECT_EQ(p.top_k, top_k);
    EXPECT_FLOAT_EQ(p.min_p, static_cast<float>(min_p));
    EXPECT_FLOAT_EQ(p.presence_penalty, static_cast<float>(presence));
    EXPECT_FLOAT_EQ(p.frequency_penalty, static_cast<float>(frequency));
    EXPECT_FLOAT_EQ(p.repetition_penalty, static_cast<float>(repetition));
    EXPECT_EQ(p.n, n);
    EXPECT_EQ(*p.seed, static_cast<uint64_t>(seed));
    if (echo) {
      EXPECT_FALSE(p.logprobs.has_value());
    } else {
      EXPECT_EQ(*p.logprobs, logprobs);
    }
    EXPECT_EQ(p.stop, std::vector<std::string>{stop});
    EXPECT_EQ(p.stop_token_ids, stop_ids);
    EXPECT_EQ(r->echo, echo);
    EXPECT_TRUE(p.ignore_eos);
    EXPECT_TRUE(r->return_token_ids);
    EXPECT_EQ(r->stream, stream);
    EXPECT_EQ(r->include_usage, usage);
    EXPECT_TRUE(p.Validate().ok()) << p.Validate();
  }
}

// OpenAI's logit_bias: token id keys (as JSON strings) to biases in [-100, 100].
TEST(ApiTypesTest, LogitBias) {
  absl::StatusOr<CompletionRequest> r =
      ParseCompletionRequest("{\"prompt\": \"a\", \"logit_bias\": {\"50\": -100, \"7\": 2.5}}");
  ASSERT_TRUE(r.ok()) << r.status();
  auto bias = r->params.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{7, 2.5f}, {50, -100.0f}}));
  EXPECT_TRUE(r->params.Validate().ok());
  for (const char* bad : {"{\"prompt\": \"a\", \"logit_bias\": {\"x\": 1}}",
                          "{\"prompt\": \"a\", \"logit_bias\": {\"-3\": 1}}",
                          "{\"prompt\": \"a\", \"logit_bias\": {\"3\": 101}}",
                          "{\"prompt\": \"a\", \"logit_bias\": {\"3\": \"up\"}}",
                          "{\"prompt\": \"a\", \"logit_bias\": [3]}"}) {
    EXPECT_EQ(ErrorParam(ParseCompletionRequest(bad).status()), "logit_bias") << bad;
  }
  r = ParseCompletionRequest("{\"prompt\": \"a\", \"logit_bias\": null}");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->params.logit_bias.empty());
}

// vLLM's truncate_prompt_tokens (>= 1, not with suffix) and skip_special_tokens (default on).
TEST(ApiTypesTest, TruncatePromptTokensAndSkipSpecialTokens) {
  absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(
      "{\"prompt\": \"a\", \"truncate_prompt_tokens\": 5, \"skip_special_tokens\": false}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->truncate_prompt_tokens, 5);
  EXPECT_FALSE(r->params.skip_special_tokens);
  r = ParseCompletionRequest("{\"prompt\": \"a\"}");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->truncate_prompt_tokens.has_value());
  EXPECT_TRUE(r->params.skip_special_tokens);
  for (const char* bad :
       {"{\"prompt\": \"a\", \"truncate_prompt_tokens\": 0}",
        "{\"prompt\": \"a\", \"truncate_prompt_tokens\": 2.5}",
        "{\"prompt\": \"a\", \"truncate_prompt_tokens\": 2, \"suffix\": \"b\"}"}) {
    EXPECT_EQ(ErrorParam(ParseCompletionRequest(bad).status()), "truncate_prompt_tokens") << bad;
  }
  EXPECT_EQ(ErrorParam(
                ParseCompletionRequest("{\"prompt\": \"a\", \"skip_special_tokens\": 1}").status()),
            "skip_special_tokens");
}

// best_of: 1 or n change nothing; more than n asks for a choice among that many samples (not
// streamed, not in chat); fewer than n is a 400.
TEST(ApiTypesTest, BestOf) {
  for (const char* same :
       {R"({"prompt": "a", "best_of": 1})", R"({"prompt": "a", "best_of": null})",
        R"({"prompt": "a", "n": 3, "best_of": 3})"}) {
    absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(same);
    ASSERT_TRUE(r.ok()) << same;
    EXPECT_EQ(r->best_of, 0) << same;
  }
  absl::StatusOr<CompletionRequest> more =
      ParseCompletionRequest(R"({"prompt": "a", "n": 2, "best_of": 6})");
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_EQ(more->best_of, 6);
  EXPECT_EQ(more->params.n, 2);
  for (const char* bad :
       {R"({"prompt": "a", "n": 3, "best_of": 2})", R"({"prompt": "a", "best_of": "2"})",
        R"({"prompt": "a", "best_of": 4, "stream": true})",
        R"({"prompt": "a", "best_of": 1000})"}) {
    EXPECT_EQ(ErrorParam(ParseCompletionRequest(bad).status()), "best_of") << bad;
  }
  EXPECT_EQ(ErrorParam(ParseChatRequest(R"({"messages": [{"role": "user", "content": "x"}],
                                           "best_of": 2})")
                           .status()),
            "best_of");
}

// OpenAI's `suffix`: kept for the server to build each text prompt's infill; not with echo or
// token prompts; null is absent.
TEST(ApiTypesTest, CompletionSuffix) {
  absl::StatusOr<CompletionRequest> r =
      ParseCompletionRequest("{\"prompt\": [\"def f(\", \"x = \"], \"suffix\": \"):\\n\"}");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->suffix.has_value());
  EXPECT_EQ(*r->suffix, "):\n");
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_EQ(r->prompts[1].text, "x = ");
  r = ParseCompletionRequest("{\"prompt\": \"a\", \"suffix\": null}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->suffix.has_value());
  r = ParseCompletionRequest("{\"prompt\": \"a\", \"suffix\": \"\"}");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->suffix, "");
  EXPECT_EQ(ErrorParam(ParseCompletionRequest("{\"prompt\": \"a\", \"suffix\": 3}").status()),
            "suffix");
  EXPECT_EQ(
      ErrorParam(ParseCompletionRequest("{\"prompt\": \"a\", \"suffix\": \"b\", \"echo\": true}")
                     .status()),
      "suffix");
  EXPECT_EQ(ErrorParam(ParseCompletionRequest("{\"prompt\": [1, 2], \"suffix\": \"b\"}").status()),
            "suffix");
}

TEST(ApiTypesTest, InfillTokenizeDetokenize) {
  absl::StatusOr<InfillRequest> infill = ParseInfillRequest(
      "{\"input_prefix\": \"def f(\", \"input_suffix\": \"):\\n\", \"max_tokens\": 7}");
  ASSERT_TRUE(infill.ok()) << infill.status();
  EXPECT_EQ(infill->input_prefix, "def f(");
  EXPECT_EQ(infill->input_suffix, "):\n");
  EXPECT_EQ(infill->common.params.max_tokens, 7);
  EXPECT_TRUE(infill->common.prompts.empty());
  EXPECT_EQ(ErrorParam(ParseInfillRequest("{\"max_tokens\": 7}").status()), "input_prefix");
  EXPECT_EQ(ErrorParam(ParseInfillRequest("{\"input_prefix\": 1}").status()), "input_prefix");
  EXPECT_EQ(ErrorParam(ParseInfillRequest("{\"input_prefix\": \"a\", \"top_p\": 9}").status()),
            "top_p");

  absl::StatusOr<TokenizeRequest> tokenize = ParseTokenizeRequest("{\"prompt\": \"abc\"}");
  ASSERT_TRUE(tokenize.ok());
  EXPECT_EQ(tokenize->prompt, "abc");
  EXPECT_EQ(ErrorParam(ParseTokenizeRequest("{}").status()), "prompt");
  EXPECT_EQ(ErrorParam(ParseTokenizeRequest("{\"prompt\": [1]}").status()), "prompt");

  absl::StatusOr<DetokenizeRequest> detokenize = ParseDetokenizeRequest("{\"tokens\": [9, 8]}");
  ASSERT_TRUE(detokenize.ok());
  EXPECT_EQ(detokenize->tokens, (std::vector<int32_t>{9, 8}));
  EXPECT_EQ(ErrorParam(ParseDetokenizeRequest("{\"tokens\": \"x\"}").status()), "tokens");
  EXPECT_EQ(ErrorParam(ParseDetokenizeRequest("{\"tokens\": [\"x\"]}").status()), "tokens");
}

TEST(ApiTypesTest, PromptTokensAndLengthLimits) {
  EXPECT_TRUE(ValidatePromptTokens({0, 5, 99}, 100, "prompt").ok());
  absl::Status empty = ValidatePromptTokens({}, 100, "prompt");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorParam(empty), "prompt");
  absl::Status outside = ValidatePromptTokens({3, 100}, 100, "prompt");
  EXPECT_EQ(ErrorParam(outside), "prompt");
  EXPECT_NE(outside.message().find("100"), absl::string_view::npos);

  std::mt19937 rng(7);
  for (int trial = 0; trial < 100; ++trial) {
    const int max_model_len = 16 + static_cast<int>(rng() % 4000);
    const int prompt_len = 1 + static_cast<int>(rng() % max_model_len);
    CompletionRequest request;
    request.params.max_tokens = 1 + static_cast<int>(rng() % 4000);
    request.max_tokens_given = true;
    absl::StatusOr<int> resolved = ResolveMaxTokens(request, prompt_len, max_model_len);
    if (prompt_len + request.params.max_tokens <= max_model_len) {
      ASSERT_TRUE(resolved.ok());
      EXPECT_EQ(*resolved, request.params.max_tokens);
    } else {
      ASSERT_FALSE(resolved.ok());
      EXPECT_EQ(ErrorParam(resolved.status()), "max_tokens");
      // The message gives both numbers: the limit and what was asked for.
      const std::string message(resolved.status().message());
      EXPECT_NE(message.find(absl::StrCat(max_model_len)), std::string::npos) << message;
      EXPECT_NE(message.find(absl::StrCat(prompt_len + request.params.max_tokens)),
                std::string::npos)
          << message;
    }
    // Without an explicit max_tokens the default is cut to fit; a prompt that fills the whole
    // context is refused.
    request.max_tokens_given = false;
    request.params.max_tokens = kDefaultMaxTokens;
    resolved = ResolveMaxTokens(request, prompt_len, max_model_len);
    if (prompt_len < max_model_len) {
      ASSERT_TRUE(resolved.ok());
      EXPECT_EQ(*resolved, std::min(kDefaultMaxTokens, max_model_len - prompt_len));
    } else {
      EXPECT_FALSE(resolved.ok());
    }
  }
}

TEST(ApiTypesTest, HttpStatusMapping) {
  EXPECT_EQ(HttpStatusFor(absl::InvalidArgumentError("x")), 400);
  EXPECT_EQ(HttpStatusFor(absl::UnauthenticatedError("x")), 401);
  EXPECT_EQ(HttpStatusFor(absl::NotFoundError("x")), 404);
  EXPECT_EQ(HttpStatusFor(PayloadTooLarge("x")), 413);
  EXPECT_EQ(HttpStatusFor(absl::ResourceExhaustedError("x")), 429);
  EXPECT_EQ(HttpStatusFor(absl::UnavailableError("x")), 503);
  EXPECT_EQ(HttpStatusFor(absl::InternalError("x")), 500);
  json not_found = json::parse(ErrorBody(ApiError(absl::StatusCode::kNotFound, "model", "nope")));
  EXPECT_EQ(not_found["error"]["param"], "model");
  EXPECT_EQ(not_found["error"]["message"], "nope");
  json too_large = json::parse(ErrorBodyForHttpStatus(413, "big"));
  EXPECT_EQ(too_large["error"]["code"], "request_too_large");
  EXPECT_TRUE(too_large["error"]["param"].is_null());
}

TEST(ApiTypesTest, Utf8Validation) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("plain ascii"));
  EXPECT_TRUE(IsValidUtf8("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80"));  // é € 😀
  EXPECT_FALSE(IsValidUtf8("\xc3"));                                       // truncated
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));                                   // overlong
  EXPECT_FALSE(IsValidUtf8("\xe0\x80\xaf"));                               // overlong
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));                               // surrogate
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));                           // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\x80"));                                       // lone continuation
  // Every code point encodes to valid UTF-8 (checked against a direct encoder).
  std::mt19937 rng(99);
  for (int i = 0; i < 2000; ++i) {
    uint32_t cp = rng() % 0x110000;
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (cp >> 18));
      s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    EXPECT_TRUE(IsValidUtf8(s)) << absl::StrFormat("U+%04X", cp);
    if (s.size() > 1) EXPECT_FALSE(IsValidUtf8(s.substr(0, s.size() - 1)));
  }
}

// previous_response_id: the stored conversation comes between the new instructions and the new
// input (the previous instructions are not carried); an unknown id is the lookup's error; without
// a store it is refused. The input is kept as the API's items and appended to the conversation.
TEST(ApiTypesTest, ResponsesPreviousConversationAndInputItems) {
  const nlohmann::ordered_json earlier = {{{"role", "user"}, {"content", "def f():"}},
                                          {{"role", "assistant"}, {"content", "  return 1"}}};
  std::vector<std::string> asked;
  PreviousConversation previous =
      [&](const std::string& id) -> absl::StatusOr<nlohmann::ordered_json> {
    asked.push_back(id);
    if (id != "resp_a") return ApiError(absl::StatusCode::kNotFound, "previous_response_id", "no");
    return earlier;
  };
  const json body = {
      {"previous_response_id", "resp_a"},
      {"instructions", "Be brief."},
      {"store", false},
      {"input",
       {{{"role", "developer"}, {"content", "Python only."}},
        {{"type", "message"},
         {"id", "msg_x"},
         {"status", "completed"},
         {"role", "assistant"},
         {"content", {{{"type", "output_text"}, {"text", "ok"}, {"annotations", json::array()}}}}},
        {{"role", "user"}, {"content", "and g?"}}}}};
  absl::StatusOr<ResponsesRequest> parsed = ParseResponsesRequest(body.dump(), json(), previous);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(asked, std::vector<std::string>{"resp_a"});
  EXPECT_EQ(parsed->previous_response_id, "resp_a");
  EXPECT_FALSE(parsed->store);
  const json expected_messages = {{{"role", "system"}, {"content", "Be brief."}},
                                  {{"role", "user"}, {"content", "def f():"}},
                                  {{"role", "assistant"}, {"content", "  return 1"}},
                                  {{"role", "system"}, {"content", "Python only."}},
                                  {{"role", "assistant"}, {"content", "ok"}},
                                  {{"role", "user"}, {"content", "and g?"}}};
  EXPECT_EQ(parsed->chat.chat.messages, expected_messages);
  // The conversation a follow-up continues: everything but the instructions.
  EXPECT_EQ(json::parse(parsed->conversation.dump()),
            json(std::vector<json>(expected_messages.begin() + 1, expected_messages.end())));
  ASSERT_EQ(parsed->input_items.size(), 3u);
  EXPECT_EQ(parsed->input_items[0]["role"], "developer");
  EXPECT_EQ(parsed->input_items[0]["content"][0]["type"], "input_text");
  EXPECT_EQ(parsed->input_items[1]["content"][0], json({{"type", "output_text"}, {"text", "ok"}}));
  EXPECT_EQ(parsed->input_items[2]["content"][0]["text"], "and g?");

  absl::StatusOr<ResponsesRequest> plain =
      ParseResponsesRequest(R"({"input": "hi", "store": null})", json(), previous);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->store);  // the API's default
  EXPECT_FALSE(plain->previous_response_id.has_value());
  EXPECT_EQ(plain->conversation.size(), 1u);

  absl::Status unknown =
      ParseResponsesRequest(R"({"input": "x", "previous_response_id": "resp_b"})", json(), previous)
          .status();
  EXPECT_EQ(HttpStatusFor(unknown), 404) << unknown;
  EXPECT_EQ(ErrorParam(unknown), "previous_response_id");
  for (const char* bad :
       {R"({"input": "x", "previous_response_id": 5})", R"({"input": "x", "store": "yes"})"}) {
    absl::Status status = ParseResponsesRequest(bad, json(), previous).status();
    EXPECT_EQ(HttpStatusFor(status), 400) << bad;
  }
  absl::Status unstored =
      ParseResponsesRequest(R"({"input": "x", "previous_response_id": "resp_a"})").status();
  EXPECT_EQ(HttpStatusFor(unstored), 400) << unstored;
  EXPECT_EQ(ErrorParam(unstored), "previous_response_id");
}

}  // namespace
}  // namespace mqa
