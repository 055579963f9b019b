#include "runtime/http/tgi_job.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/http/api_types.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::json;

// TGI writes `data:` without the space.
std::string Event(const json& value) { return absl::StrCat("data:", DumpJson(value), "\n\n"); }

}  // namespace

TgiJob::TgiJob(std::shared_ptr<CompletionJob> inner, TgiJobOptions options)
    : CompletionJobView(std::move(inner)), options_(std::move(options)) {
  MQA_CHECK(this->inner().num_prompts() == 1);
}

json TgiJob::Token(int32_t id, std::optional<float> logprob) const {
  return {{"id", id},
          {"text", inner().tokenizer().Decode({id})},
          {"logprob", logprob.has_value() ? json(*logprob) : json(nullptr)},
          {"special", inner().tokenizer().IsSpecial(id)}};
}

json TgiJob::TopTokens(const SampleResult& scored) const {
  json top = json::array();
  for (const TokenLogprob& alt : scored.top_logprobs)
    top.push_back(Token(alt.token_id, alt.logprob));
  return top;
}

int TgiJob::Best() const {
  int best = 0;
  double best_logprob = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < options_.best_of; ++i) {
    const double logprob = inner().choice(i).CumulativeLogprob();
    if (logprob > best_logprob) {
      best = i;
      best_logprob = logprob;
    }
  }
  return best;
}

std::string TgiJob::GeneratedText(int i) const {
  const std::string& text = inner().choice(i).text;
  return options_.return_full_text ? inner().prompt(0).text + text : text;
}

const char* TgiJob::FinishReason(int i) const {
  const CompletionJob::Choice& c = inner().choice(i);
  if (c.finish_reason == FinishReason::kStop) {
    return c.stop_reason.empty() ? "eos_token" : "stop_sequence";
  }
  return "length";
}

json TgiJob::Details(int i) const {
  const CompletionJob::Choice& c = inner().choice(i);
  json tokens = json::array();
  json top_tokens = json::array();
  for (size_t k = 0; k < c.token_ids.size(); ++k) {
    const SampleResult* scored = k < c.scores.size() ? &c.scores[k] : nullptr;
    tokens.push_back(
        Token(c.token_ids[k], scored ? std::optional<float>(scored->logprob) : std::nullopt));
    if (options_.top_n_tokens > 0)
      top_tokens.push_back(scored ? TopTokens(*scored) : json::array());
  }
  json prefill = json::array();
  const auto& prompt_scores = inner().prompt_scores(0);
  if (options_.decoder_input_details && prompt_scores.has_value()) {
    const std::vector<int32_t>& ids = inner().prompt(0).token_ids;
    for (size_t i = 0; i < ids.size(); ++i) {
      json entry = Token(
          ids[i], i == 0 ? std::nullopt : std::optional<float>((*prompt_scores)[i - 1].logprob));
      entry.erase("special");
      prefill.push_back(std::move(entry));
    }
  }
  json details = {{"finish_reason", FinishReason(i)},
                  {"generated_tokens", c.token_ids.size()},
                  {"seed", options_.seed.has_value() ? json(*options_.seed) : json(nullptr)},
                  {"prefill", std::move(prefill)},
                  {"tokens", std::move(tokens)}};
  if (options_.top_n_tokens > 0) details["top_tokens"] = std::move(top_tokens);
  return details;
}

bool TgiJob::Drain(absl::Duration timeout, std::string* chunks) {
  const bool got = DrainInner(timeout);
  if (chunks == nullptr) return got;
  const CompletionJob::Choice& c = inner().choice(0);
  const bool done = inner().finished() && inner().error().ok();
  while (streamed_ < c.token_ids.size()) {
    const size_t k = streamed_++;
    const SampleResult* scored = k < c.scores.size() ? &c.scores[k] : nullptr;
    json event = {{"index", k + 1},
                  {"token", Token(c.token_ids[k],
                                  scored ? std::optional<float>(scored->logprob) : std::nullopt)},
                  {"generated_text", nullptr},
                  {"details", nullptr}};
    if (options_.top_n_tokens > 0) {
      event["top_tokens"] = scored ? TopTokens(*scored) : json::array();
    }
    if (done && streamed_ == c.token_ids.size()) {
      event["generated_text"] = GeneratedText(0);
      if (options_.details) {
        event["details"] = {
            {"finish_reason", FinishReason(0)},
            {"generated_tokens", c.token_ids.size()},
            {"seed", options_.seed.has_value() ? json(*options_.seed) : json(nullptr)},
            {"input_length", inner().prompt(0).token_ids.size()}};
      }
    }
    absl::StrAppend(chunks, Event(event));
  }
  return got;
}

std::string TgiJob::ClosingChunks(const absl::Status& error) const {
  if (error.ok()) return "";
  return absl::StrCat("data:", TgiErrorBody(error), "\n\n");
}

std::string TgiJob::ResponseBody() const {
  const int best = Best();
  json response = {{"generated_text", GeneratedText(best)}};
  if (options_.details) {
    json details = Details(best);
    if (options_.best_of > 1) {
      json others = json::array();
      for (int i = 0; i < options_.best_of; ++i) {
        if (i == best) continue;
        json sequence = Details(i);
        sequence["generated_text"] = GeneratedText(i);
        others.push_back(std::move(sequence));
      }
      details["best_of_sequences"] = std::move(others);
    }
    response["details"] = std::move(details);
  }
  return DumpJson(options_.list_response ? json::array({std::move(response)}) : response);
}

int TgiJob::ErrorHttpStatus(const absl::Status& status) const { return TgiHttpStatusFor(status); }

std::string TgiJob::ErrorBody(const absl::Status& status) const { return TgiErrorBody(status); }

}  // namespace mqa
