#include "runtime/http/triton_job.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/http/api_types.h"
#include "runtime/status.h"

namespace mqa {

using json = nlohmann::json;

TritonJob::TritonJob(std::shared_ptr<CompletionJob> inner, TritonJobOptions options)
    : CompletionJobView(std::move(inner)), options_(std::move(options)) {
  MQA_CHECK(this->inner().num_prompts() == 1 && this->inner().num_choices() == 1);
}

json TritonJob::Output(std::string text, size_t from, size_t to) const {
  json out = {{"model_name", options_.model_name},
              {"model_version", options_.model_version},
              {"sequence_end", false},
              {"sequence_id", 0},
              {"sequence_start", false},
              {"text_output", std::move(text)}};
  if (options_.return_log_probs) {
    const CompletionJob::Choice& c = inner().choice(0);
    json logprobs = json::array();
    for (size_t k = from; k < to && k < c.scores.size(); ++k)
      logprobs.push_back(c.scores[k].logprob);
    double cumulative = 0;
    for (size_t k = 0; k < to && k < c.scores.size(); ++k) cumulative += c.scores[k].logprob;
    out["cum_log_probs"] = cumulative;
    out["output_log_probs"] = std::move(logprobs);
  }
  return out;
}

bool TritonJob::Drain(absl::Duration timeout, std::string* chunks) {
  const bool got = DrainInner(timeout);
  if (chunks == nullptr) return got;
  const CompletionJob::Choice& c = inner().choice(0);
  if (c.text.size() > streamed_bytes_) {
    absl::StrAppend(chunks, SseEvent(Output(c.text.substr(streamed_bytes_), streamed_tokens_,
                                            c.token_ids.size())));
    streamed_bytes_ = c.text.size();
    streamed_tokens_ = c.token_ids.size();
  }
  return got;
}

std::string TritonJob::ClosingChunks(const absl::Status& error) const {
  if (error.ok()) return "";
  return absl::StrCat("data: ", ErrorBody(error), "\n\n");
}

std::string TritonJob::ResponseBody() const {
  const CompletionJob::Choice& c = inner().choice(0);
  return DumpJson(Output(c.text, 0, c.token_ids.size()));
}

std::string TritonJob::ErrorBody(const absl::Status& status) const {
  return TritonErrorBody(status);
}

}  // namespace mqa
