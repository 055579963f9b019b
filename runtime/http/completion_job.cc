#include "runtime/http/completion_job.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::json;

std::string Dump(const json& value) {
  // Generated text is valid UTF-8 by construction; `replace` keeps a bug from throwing here.
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

int64_t CodePoints(absl::string_view text) {
  int64_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string SseEvent(const json& value) { return absl::StrCat("data: ", Dump(value), "\n\n"); }

}  // namespace

CompletionJob::CompletionJob(CompletionJobOptions options, std::vector<PreparedPrompt> prompts,
                             const Tokenizer* tokenizer, ServerMetrics* metrics)
    : options_(std::move(options)),
      prompts_(std::move(prompts)),
      tokenizer_(tokenizer),
      metrics_(metrics),
      timing_(prompts_.size()),
      choices_(prompts_.size() * options_.n),
      prompt_finished_(prompts_.size(), false) {
  MQA_CHECK(options_.n >= 1);
  for (Choice& choice : choices_) {
    if (options_.logprobs) {
      choice.logprobs = {{"tokens", json::array()},
                         {"token_logprobs", json::array()},
                         {"top_logprobs", json::array()},
                         {"text_offset", json::array()}};
    }
  }
  if (options_.echo) {
    for (size_t p = 0; p < prompts_.size(); ++p) {
      for (int s = 0; s < options_.n; ++s) {
        Choice& choice = choices_[p * options_.n + s];
        choice.text = prompts_[p].text;
        choice.text_chars = CodePoints(choice.text);
      }
    }
  }
}

std::string CompletionJob::EngineRequestId(int prompt_index) const {
  return absl::StrCat(options_.id, "-", prompt_index);
}

std::function<void(RequestOutput)> CompletionJob::Callback(int prompt_index) {
  // The callback may outlive the HTTP side (an aborted stream), so it owns a reference.
  return [self = shared_from_this(), prompt_index](RequestOutput output) {
    self->OnOutput(prompt_index, std::move(output));
  };
}

void CompletionJob::OnOutput(int prompt_index, RequestOutput output) {
  {
    absl::Time now = absl::Now();
    bool has_tokens = false;
    for (const SampleOutput& sample : output.samples) {
      has_tokens |= !sample.token_ids.empty();
      if (sample.finish_reason.has_value()) metrics_->CountFinished(*sample.finish_reason);
    }
    std::lock_guard<std::mutex> lock(mu_);
    Timing& timing = timing_[prompt_index];
    if (has_tokens) {
      if (!timing.last_token.has_value()) {
        metrics_->ObserveTimeToFirstToken(absl::ToDoubleSeconds(now - options_.arrival));
      } else {
        metrics_->ObserveInterTokenLatency(absl::ToDoubleSeconds(now - *timing.last_token));
      }
      timing.last_token = now;
    }
    if (output.finished) {
      metrics_->ObserveE2eLatency(absl::ToDoubleSeconds(now - options_.arrival));
    }
    queue_.push_back({prompt_index, std::move(output)});
  }
  cv_.notify_one();
}

void CompletionJob::MarkSubmittedNone(int prompt_index) {
  prompt_finished_[prompt_index] = true;
  for (int s = 0; s < options_.n; ++s) {
    choices_[prompt_index * options_.n + s].finish_reason = FinishReason::kLength;
    metrics_->CountFinished(FinishReason::kLength);
  }
}

bool CompletionJob::Drain(absl::Duration timeout, std::string* chunks) {
  std::deque<Arrived> arrived;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return !queue_.empty(); });
    arrived.swap(queue_);
  }
  for (const Arrived& a : arrived) Fold(a, chunks);
  return !arrived.empty();
}

bool CompletionJob::finished() const {
  for (bool f : prompt_finished_) {
    if (!f) return false;
  }
  return true;
}

std::vector<std::string> CompletionJob::UnfinishedEngineIds() const {
  std::vector<std::string> ids;
  for (int p = 0; p < num_prompts(); ++p) {
    if (!prompt_finished_[p]) ids.push_back(EngineRequestId(p));
  }
  return ids;
}

void CompletionJob::AppendLogprobs(Choice& choice, const SampleOutput& sample, json* delta) {
  *delta = {{"tokens", json::array()},
            {"token_logprobs", json::array()},
            {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  int64_t offset = choice.text_chars;
  for (size_t k = 0; k < sample.token_ids.size(); ++k) {
    std::string token = tokenizer_->Decode({sample.token_ids[k]});
    json top = json::object();
    float chosen = 0.0f;
    if (k < sample.logprobs.size()) {
      chosen = sample.logprobs[k].logprob;
      for (const TokenLogprob& alt : sample.logprobs[k].top_logprobs) {
        top[tokenizer_->Decode({alt.token_id})] = alt.logprob;
      }
    }
    top[token] = chosen;
    (*delta)["tokens"].push_back(token);
    (*delta)["token_logprobs"].push_back(chosen);
    (*delta)["top_logprobs"].push_back(std::move(top));
    (*delta)["text_offset"].push_back(offset);
    offset += CodePoints(token);
  }
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const json& item : (*delta)[key]) choice.logprobs[key].push_back(item);
  }
}

void CompletionJob::Fold(const Arrived& arrived, std::string* chunks) {
  const RequestOutput& output = arrived.output;
  const int p = arrived.prompt_index;
  for (const SampleOutput& sample : output.samples) {
    MQA_CHECK(sample.index >= 0 && sample.index < options_.n);
    const int ci = p * options_.n + sample.index;
    Choice& choice = choices_[ci];
    json logprobs_delta;
    if (options_.logprobs) AppendLogprobs(choice, sample, &logprobs_delta);
    choice.text += sample.text;
    choice.text_chars += CodePoints(sample.text);
    choice.token_ids.insert(choice.token_ids.end(), sample.token_ids.begin(),
                            sample.token_ids.end());
    if (sample.finish_reason.has_value()) choice.finish_reason = sample.finish_reason;
    bool news =
        !sample.text.empty() || !sample.token_ids.empty() || sample.finish_reason.has_value();
    if (chunks != nullptr && news) {
      absl::StrAppend(chunks, ChoiceChunk(ci, sample.text, sample.token_ids, logprobs_delta,
                                          sample.finish_reason, !choice.opened));
      choice.opened = true;
    }
  }
  if (!output.finished) return;
  prompt_finished_[p] = true;
  if (!output.error.ok() && error_.ok()) error_ = output.error;
  // Samples that never started (a request aborted before its prompt ran) end as aborted.
  for (int s = 0; s < options_.n; ++s) {
    const int ci = p * options_.n + s;
    Choice& choice = choices_[ci];
    if (choice.finish_reason.has_value()) continue;
    choice.finish_reason = FinishReason::kAbort;
    metrics_->CountFinished(FinishReason::kAbort);
    if (chunks != nullptr) {
      absl::StrAppend(chunks, ChoiceChunk(ci, "", {}, options_.logprobs ? json::object() : json(),
                                          choice.finish_reason, !choice.opened));
      choice.opened = true;
    }
  }
}

json CompletionJob::ChunkBase() const {
  return {{"id", options_.id},
          {"object", "text_completion"},
          {"created", options_.created},
          {"model", options_.model}};
}

std::string CompletionJob::ChoiceChunk(int choice_index, const std::string& text,
                                       const std::vector<int32_t>& token_ids, const json& logprobs,
                                       std::optional<FinishReason> finish_reason,
                                       bool first) const {
  json choice = {
      {"index", choice_index},
      {"text", text},
      {"logprobs", logprobs.is_null() ? json(nullptr) : logprobs},
      {"finish_reason",
       finish_reason.has_value() ? json(FinishReasonName(*finish_reason)) : json(nullptr)}};
  if (options_.return_token_ids) {
    choice["token_ids"] = token_ids;
    if (first) choice["prompt_token_ids"] = prompts_[choice_index / options_.n].token_ids;
  }
  json chunk = ChunkBase();
  chunk["choices"] = json::array({std::move(choice)});
  if (options_.include_usage) chunk["usage"] = nullptr;
  return SseEvent(chunk);
}

std::string CompletionJob::OpeningChunks() {
  std::string chunks;
  for (int ci = 0; ci < static_cast<int>(choices_.size()); ++ci) {
    Choice& choice = choices_[ci];
    const int p = ci / options_.n;
    const bool echo_only = prompts_[p].max_tokens == 0;
    if (!options_.echo && !options_.return_token_ids && !echo_only) continue;
    std::string text = options_.echo ? prompts_[p].text : std::string();
    json logprobs = options_.logprobs ? json::object() : json();
    absl::StrAppend(&chunks, ChoiceChunk(ci, text, {}, logprobs,
                                         echo_only ? choice.finish_reason : std::nullopt, true));
    choice.opened = true;
  }
  return chunks;
}

json CompletionJob::Usage() const {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  for (const PreparedPrompt& prompt : prompts_) prompt_tokens += prompt.token_ids.size();
  for (const Choice& choice : choices_) completion_tokens += choice.token_ids.size();
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

std::string CompletionJob::ClosingChunks() const {
  std::string chunks;
  if (options_.include_usage) {
    json chunk = ChunkBase();
    chunk["choices"] = json::array();
    chunk["usage"] = Usage();
    chunks = SseEvent(chunk);
  }
  absl::StrAppend(&chunks, "data: [DONE]\n\n");
  return chunks;
}

std::string CompletionJob::ResponseBody() const {
  json choices = json::array();
  for (int ci = 0; ci < static_cast<int>(choices_.size()); ++ci) {
    const Choice& choice = choices_[ci];
    json entry = {{"index", ci},
                  {"text", choice.text},
                  {"logprobs", options_.logprobs ? choice.logprobs : json(nullptr)},
                  {"finish_reason", choice.finish_reason.has_value()
                                        ? json(FinishReasonName(*choice.finish_reason))
                                        : json(nullptr)}};
    if (options_.return_token_ids) {
      entry["prompt_token_ids"] = prompts_[ci / options_.n].token_ids;
      entry["token_ids"] = choice.token_ids;
    }
    choices.push_back(std::move(entry));
  }
  json body = ChunkBase();
  body["choices"] = std::move(choices);
  body["usage"] = Usage();
  return Dump(body);
}

}  // namespace mqa
