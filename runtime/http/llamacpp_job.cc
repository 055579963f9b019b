#include "runtime/http/llamacpp_job.h"

#include <cmath>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/http/api_types.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::json;

}  // namespace

LlamaCppJob::LlamaCppJob(std::shared_ptr<CompletionJob> inner, LlamaCppJobOptions options)
    : CompletionJobView(std::move(inner)), options_(std::move(options)), start_(absl::Now()) {
  MQA_CHECK(this->inner().num_prompts() == 1 && this->inner().num_choices() == 1);
}

json LlamaCppJob::Probabilities(size_t from, size_t to) const {
  const CompletionJob::Choice& c = inner().choice(0);
  json out = json::array();
  for (size_t k = from; k < to && k < c.scores.size(); ++k) {
    json probs = json::array();
    for (const TokenLogprob& alt : c.scores[k].top_logprobs) {
      probs.push_back({{"tok_str", inner().tokenizer().Decode({alt.token_id})},
                       {"prob", std::exp(alt.logprob)}});
    }
    out.push_back(
        {{"content", inner().tokenizer().Decode({c.token_ids[k]})}, {"probs", std::move(probs)}});
  }
  return out;
}

json LlamaCppJob::Final() const {
  const CompletionJob::Choice& c = inner().choice(0);
  const bool stopped_eos = c.finish_reason == FinishReason::kStop && c.stop_reason.empty() &&
                           !c.stop_token_id.has_value();
  const bool stopped_word = c.finish_reason == FinishReason::kStop && !stopped_eos;
  const int predicted = static_cast<int>(c.token_ids.size());
  const int evaluated = static_cast<int>(inner().prompt(0).token_ids.size());
  const absl::Time first = first_token_.value_or(absl::Now());
  const absl::Time last = last_token_.value_or(first);
  const double prompt_ms = absl::ToDoubleMilliseconds(first - start_);
  const double predicted_ms = absl::ToDoubleMilliseconds(last - first);
  json timings = {
      {"prompt_n", evaluated},
      {"prompt_ms", prompt_ms},
      {"prompt_per_second", prompt_ms > 0 ? evaluated * 1e3 / prompt_ms : 0.0},
      {"predicted_n", predicted},
      {"predicted_ms", predicted_ms},
      {"predicted_per_second", predicted_ms > 0 ? (predicted - 1) * 1e3 / predicted_ms : 0.0}};
  return {{"stop", true},
          {"id_slot", 0},
          {"model", options_.model},
          {"prompt", options_.prompt},
          {"tokens_predicted", predicted},
          {"tokens_evaluated", evaluated},
          {"tokens_cached", inner().cached_prompt_tokens(0)},
          {"stopped_eos", stopped_eos},
          {"stopped_word", stopped_word},
          {"stopped_limit", c.finish_reason == FinishReason::kLength},
          {"stopping_word", stopped_word ? c.stop_reason : std::string()},
          {"truncated", false},
          {"has_new_line", absl::StrContains(c.text, "\n")},
          {"generation_settings", options_.generation_settings},
          {"timings", std::move(timings)}};
}

bool LlamaCppJob::Drain(absl::Duration timeout, std::string* chunks) {
  const bool got = DrainInner(timeout);
  const CompletionJob::Choice& c = inner().choice(0);
  if (!c.token_ids.empty()) {
    if (!first_token_.has_value()) first_token_ = absl::Now();
    last_token_ = absl::Now();
  }
  if (chunks == nullptr) return got;
  if (c.text.size() > streamed_bytes_ || c.token_ids.size() > streamed_tokens_) {
    json event = {{"content", c.text.substr(streamed_bytes_)}, {"stop", false}, {"id_slot", 0}};
    if (options_.n_probs > 0) {
      event["completion_probabilities"] = Probabilities(streamed_tokens_, c.token_ids.size());
    }
    absl::StrAppend(chunks, SseEvent(event));
    streamed_bytes_ = c.text.size();
    streamed_tokens_ = c.token_ids.size();
  }
  if (inner().finished() && inner().error().ok() && !final_sent_) {
    json last = Final();
    last["content"] = "";
    absl::StrAppend(chunks, SseEvent(last));
    final_sent_ = true;
  }
  return got;
}

std::string LlamaCppJob::ClosingChunks(const absl::Status& error) const {
  if (error.ok()) return "";
  return absl::StrCat("data: ", ErrorBody(error), "\n\n");
}

std::string LlamaCppJob::ResponseBody() const {
  json body = Final();
  body["content"] = inner().choice(0).text;
  if (options_.n_probs > 0) {
    body["completion_probabilities"] = Probabilities(0, inner().choice(0).token_ids.size());
  }
  return DumpJson(body);
}

}  // namespace mqa
