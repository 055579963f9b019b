#include "runtime/http/completion_job.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "runtime/http/api_types.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::json;

int64_t CodePoints(absl::string_view text) {
  int64_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

json EmptyLogprobs() {
  return {{"tokens", json::array()},
          {"token_logprobs", json::array()},
          {"top_logprobs", json::array()},
          {"text_offset", json::array()}};
}

void Concatenate(json& logprobs, const json& delta) {
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
    for (const json& item : delta[key]) logprobs[key].push_back(item);
  }
}

}  // namespace

CompletionJob::CompletionJob(CompletionJobOptions options, std::vector<PreparedPrompt> prompts,
                             const Tokenizer* tokenizer, ServerMetrics* metrics)
    : options_(std::move(options)),
      prompts_(std::move(prompts)),
      tokenizer_(tokenizer),
      metrics_(metrics),
      timing_(prompts_.size()),
      choices_(prompts_.size() * options_.n),
      prompt_scores_(prompts_.size()),
      prompt_finished_(prompts_.size(), false),
      cached_prompt_tokens_(prompts_.size(), 0) {
  MQA_CHECK(options_.n >= 1);
  for (Choice& choice : choices_) {
    if (options_.logprobs) choice.logprobs = EmptyLogprobs();
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
  if (prompts_[prompt_index].max_tokens == 0) {
    // A scored echo runs one engine sample; each of the n choices is that sample.
    for (size_t i = 0, size = output.samples.size(); i < size; ++i) {
      if (output.samples[i].index != 0) continue;
      for (int s = 1; s < options_.n; ++s) {
        output.samples.push_back(output.samples[i]);
        output.samples.back().index = s;
      }
    }
  }
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
        timing.first_token = now;
      } else {
        metrics_->ObserveInterTokenLatency(absl::ToDoubleSeconds(now - *timing.last_token));
      }
      timing.last_token = now;
    }
    if (output.finished) {
      metrics_->ObserveE2eLatency(absl::ToDoubleSeconds(now - options_.arrival));
      ServerMetrics::FinishedRequest finished{.prompt_tokens = output.num_prompt_tokens,
                                              .generation_tokens = output.num_generated_tokens};
      auto seconds = [](absl::Time from, absl::Time to) {
        return absl::ToDoubleSeconds(to - from);
      };
      if (const std::optional<absl::Time>& scheduled = output.first_scheduled) {
        finished.queue_seconds = seconds(options_.arrival, *scheduled);
        finished.inference_seconds = seconds(*scheduled, now);
        if (timing.first_token.has_value()) {
          finished.prefill_seconds = seconds(*scheduled, *timing.first_token);
          finished.decode_seconds = seconds(*timing.first_token, now);
        }
      }
      metrics_->ObserveFinishedRequest(finished);
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

bool CompletionJob::NeedsEngine(int prompt_index) const {
  return prompts_[prompt_index].max_tokens > 0 || options_.prompt_logprobs.has_value() ||
         (options_.echo && options_.logprobs.has_value());
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

int64_t CompletionJob::PushLogprobsEntry(json& object, int32_t token_id, const SampleResult* scored,
                                         int64_t offset) const {
  std::string token = tokenizer_->Decode({token_id});
  const int64_t chars = CodePoints(token);
  json top = nullptr;
  json chosen = nullptr;
  if (scored != nullptr) {
    top = json::object();
    const int count = options_.logprobs.value_or(0);
    for (int k = 0; k < count && k < static_cast<int>(scored->top_logprobs.size()); ++k) {
      const TokenLogprob& alt = scored->top_logprobs[k];
      top[tokenizer_->Decode({alt.token_id})] = alt.logprob;
    }
    top[token] = scored->logprob;
    chosen = scored->logprob;
  }
  object["tokens"].push_back(std::move(token));
  object["token_logprobs"].push_back(std::move(chosen));
  object["top_logprobs"].push_back(std::move(top));
  object["text_offset"].push_back(offset);
  return chars;
}

void CompletionJob::AppendLogprobs(Choice& choice, const SampleOutput& sample, json* delta) {
  *delta = EmptyLogprobs();
  int64_t offset = choice.text_chars;
  const SampleResult unscored;  // a token the engine sent without its log-probability
  for (size_t k = 0; k < sample.token_ids.size(); ++k) {
    const SampleResult* scored = k < sample.logprobs.size() ? &sample.logprobs[k] : &unscored;
    offset += PushLogprobsEntry(*delta, sample.token_ids[k], scored, offset);
  }
  Concatenate(choice.logprobs, *delta);
}

void CompletionJob::FoldPromptLogprobs(int p, const std::vector<SampleResult>& scored,
                                       std::string* chunks) {
  const std::vector<int32_t>& ids = prompts_[p].token_ids;
  MQA_CHECK(scored.size() + 1 == ids.size());
  json echo;  // the prompt's part of the logprobs object
  if (options_.echo && options_.logprobs.has_value()) {
    echo = EmptyLogprobs();
    int64_t offset = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      offset += PushLogprobsEntry(echo, ids[i], i == 0 ? nullptr : &scored[i - 1], offset);
    }
  }
  json vllm;  // vLLM's prompt_logprobs: null, then {token id: {logprob, rank, decoded_token}}
  if (options_.prompt_logprobs.has_value()) {
    vllm = json::array({nullptr});
    for (const SampleResult& entry : scored) {
      json position = json::object();
      position[std::to_string(entry.token_id)] = {
          {"logprob", entry.logprob},
          {"rank", entry.rank},
          {"decoded_token", tokenizer_->Decode({entry.token_id})}};
      for (int k = 0;
           k < *options_.prompt_logprobs && k < static_cast<int>(entry.top_logprobs.size()); ++k) {
        const TokenLogprob& alt = entry.top_logprobs[k];
        const std::string key = std::to_string(alt.token_id);
        if (position.contains(key)) continue;
        position[key] = {{"logprob", alt.logprob},
                         {"rank", k + 1},
                         {"decoded_token", tokenizer_->Decode({alt.token_id})}};
      }
      vllm.push_back(std::move(position));
    }
  }
  for (int s = 0; s < options_.n; ++s) {
    const int ci = p * options_.n + s;
    Choice& choice = choices_[ci];
    if (!vllm.is_null()) choice.prompt_logprobs = vllm;
    if (echo.is_null()) continue;
    Concatenate(choice.logprobs, echo);
    if (chunks != nullptr) {  // the echo, held back until its log-probabilities came
      absl::StrAppend(chunks,
                      ChoiceChunk(ci, prompts_[p].text, {}, echo, std::nullopt, !choice.opened));
      choice.opened = true;
    }
  }
}

void CompletionJob::Fold(const Arrived& arrived, std::string* chunks) {
  const RequestOutput& output = arrived.output;
  const int p = arrived.prompt_index;
  cached_prompt_tokens_[p] = std::max(cached_prompt_tokens_[p], output.num_cached_prompt_tokens);
  if (output.prompt_logprobs.has_value()) {
    prompt_scores_[p] = output.prompt_logprobs;
    FoldPromptLogprobs(p, *output.prompt_logprobs, chunks);
  }
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
    choice.scores.insert(choice.scores.end(), sample.logprobs.begin(), sample.logprobs.end());
    if (sample.finish_reason.has_value()) {
      choice.finish_reason = sample.finish_reason;
      choice.stop_reason = sample.stop_reason;
      choice.stop_token_id = sample.stop_token_id;
    }
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
      {"finish_reason", FinishReasonJson(finish_reason)},
      {"stop_reason", finish_reason.has_value() ? StopReasonJson(choices_[choice_index]) : json()}};
  if (options_.return_token_ids) {
    choice["token_ids"] = token_ids;
    if (first) choice["prompt_token_ids"] = prompts_[choice_index / options_.n].token_ids;
  }
  json chunk = ChunkBase();
  chunk["choices"] = json::array({std::move(choice)});
  if (options_.include_usage) {
    chunk["usage"] = options_.continuous_usage ? UsageJson() : json(nullptr);
  }
  return SseEvent(chunk);
}

std::string CompletionJob::OpeningChunks() {
  std::string chunks;
  for (int ci = 0; ci < static_cast<int>(choices_.size()); ++ci) {
    Choice& choice = choices_[ci];
    const int p = ci / options_.n;
    const bool echo_only = prompts_[p].max_tokens == 0;
    if (!options_.echo && !options_.return_token_ids && !echo_only) continue;
    // An echo with log-probabilities is sent when they arrive (FoldPromptLogprobs).
    if (options_.echo && options_.logprobs.has_value()) continue;
    std::string text = options_.echo ? prompts_[p].text : std::string();
    json logprobs = options_.logprobs ? json::object() : json();
    absl::StrAppend(&chunks, ChoiceChunk(ci, text, {}, logprobs,
                                         echo_only ? choice.finish_reason : std::nullopt, true));
    choice.opened = true;
  }
  return chunks;
}

std::vector<int> CompletionJob::ShownChoices() const {
  std::vector<int> shown(choices_.size());
  std::iota(shown.begin(), shown.end(), 0);
  if (options_.keep == 0) return shown;
  // best_of: per prompt, the `keep` samples with the highest cumulative log-probability.
  std::vector<double> logprob(choices_.size());
  for (size_t ci = 0; ci < choices_.size(); ++ci) logprob[ci] = choices_[ci].CumulativeLogprob();
  std::vector<int> kept;
  for (int p = 0; p < num_prompts(); ++p) {
    const auto first = shown.begin() + p * options_.n;
    std::stable_sort(first, first + options_.n,
                     [&](int a, int b) { return logprob[a] > logprob[b]; });
    kept.insert(kept.end(), first, first + std::min(options_.keep, options_.n));
  }
  return kept;
}

json CompletionJob::UsageJson() const {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  for (const PreparedPrompt& prompt : prompts_) prompt_tokens += prompt.token_ids.size();
  for (int ci : ShownChoices()) completion_tokens += choices_[ci].token_ids.size();
  json usage = UsageObject(prompt_tokens, completion_tokens);
  if (options_.prompt_tokens_details) {
    int64_t cached = 0;
    for (int cached_tokens : cached_prompt_tokens_) cached += cached_tokens;
    usage["prompt_tokens_details"] = {{"cached_tokens", cached}};
  }
  return usage;
}

std::string CompletionJob::ClosingChunks(const absl::Status& error) const {
  std::string chunks;
  if (!error.ok()) absl::StrAppend(&chunks, "data: ", mqa::ErrorBody(error), "\n\n");
  if (options_.include_usage) {
    json chunk = ChunkBase();
    chunk["choices"] = json::array();
    chunk["usage"] = UsageJson();
    absl::StrAppend(&chunks, SseEvent(chunk));
  }
  absl::StrAppend(&chunks, "data: [DONE]\n\n");
  return chunks;
}

std::string CompletionJob::ResponseBody() const {
  json choices = json::array();
  const std::vector<int> shown = ShownChoices();
  for (int index = 0; index < static_cast<int>(shown.size()); ++index) {
    const int ci = shown[index];
    const Choice& choice = choices_[ci];
    json entry = {{"index", index},
                  {"text", choice.text},
                  {"logprobs", options_.logprobs ? choice.logprobs : json(nullptr)},
                  {"finish_reason", FinishReasonJson(choice.finish_reason)},
                  {"stop_reason", StopReasonJson(choice)}};
    if (options_.return_token_ids) {
      entry["prompt_token_ids"] = prompts_[ci / options_.n].token_ids;
      entry["token_ids"] = choice.token_ids;
    }
    if (options_.prompt_logprobs.has_value()) entry["prompt_logprobs"] = choice.prompt_logprobs;
    choices.push_back(std::move(entry));
  }
  json body = ChunkBase();
  body["choices"] = std::move(choices);
  body["usage"] = UsageJson();
  return DumpJson(body);
}

json CompletionJob::FinishReasonJson(const std::optional<FinishReason>& reason) {
  return reason.has_value() ? json(FinishReasonName(*reason)) : json(nullptr);
}

json CompletionJob::StopReasonJson(const Choice& choice) {
  if (choice.finish_reason != FinishReason::kStop) return nullptr;
  if (choice.stop_token_id.has_value()) return *choice.stop_token_id;
  if (!choice.stop_reason.empty()) return choice.stop_reason;
  return nullptr;
}

std::string CompletionJob::Summary() const {
  const json usage = UsageJson();
  std::string finish;
  for (const Choice& choice : choices_) {
    absl::StrAppend(
        &finish, finish.empty() ? "" : ",",
        choice.finish_reason.has_value() ? FinishReasonName(*choice.finish_reason) : "unfinished");
  }
  return absl::StrFormat("%s: %d prompt%s, %d prompt tokens, %d generated, finish %s, %.3f s",
                         options_.id, num_prompts(), num_prompts() == 1 ? "" : "s",
                         usage["prompt_tokens"].get<int64_t>(),
                         usage["completion_tokens"].get<int64_t>(), finish,
                         absl::ToDoubleSeconds(absl::Now() - options_.arrival));
}

}  // namespace mqa
