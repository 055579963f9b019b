#include "runtime/http/beam_search_job.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "runtime/http/api_types.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::json;

}  // namespace

BeamSearchJob::BeamSearchJob(CompletionJobOptions options, std::vector<PreparedPrompt> prompts,
                             BeamSearchOptions beam, const Tokenizer* tokenizer,
                             ServerMetrics* metrics,
                             std::function<absl::Status(EngineRequest)> submit,
                             std::function<void(const std::string&)> abort)
    : options_(std::move(options)),
      prompts_(std::move(prompts)),
      beam_(beam),
      tokenizer_(tokenizer),
      metrics_(metrics),
      submit_(std::move(submit)),
      abort_(std::move(abort)),
      searches_(prompts_.size()) {
  MQA_CHECK(options_.n >= 1 && options_.n <= kMaxBeamWidth);
  for (Search& s : searches_) s.live.emplace_back();  // the empty beam
}

std::string BeamSearchJob::EngineId(int prompt_index, int step, int beam) const {
  return absl::StrCat(options_.id, "-", prompt_index, "-", step, "-", beam);
}

double BeamSearchJob::Score(int prompt_index, const Beam& beam) const {
  // vLLM's: the length counts the prompt, not a final EOS.
  const double length = static_cast<double>(prompts_[prompt_index].token_ids.size() +
                                            beam.tokens.size() - (beam.ended ? 1 : 0));
  return beam.logprob / std::pow(std::max(length, 1.0), beam_.length_penalty);
}

absl::Status BeamSearchJob::Start() {
  for (int p = 0; p < static_cast<int>(prompts_.size()); ++p) {
    if (prompts_[p].max_tokens <= 0) {
      Finish(p);
      continue;
    }
    RETURN_IF_ERROR(SubmitStep(p));
  }
  return absl::OkStatus();
}

absl::Status BeamSearchJob::SubmitStep(int p) {
  Search& s = searches_[p];
  s.next.assign(s.live.size(), std::nullopt);
  s.arriving.assign(s.live.size(), {});
  s.pending = static_cast<int>(s.live.size());
  for (int b = 0; b < static_cast<int>(s.live.size()); ++b) {
    EngineRequest request;
    request.request_id = EngineId(p, s.step, b);
    request.prompt_token_ids = prompts_[p].token_ids;
    request.prompt_token_ids.insert(request.prompt_token_ids.end(), s.live[b].tokens.begin(),
                                    s.live[b].tokens.end());
    SamplingParams& params = request.params;
    params.max_tokens = 1;
    params.temperature = 0.0f;
    params.ignore_eos = true;  // EOS is a candidate, ranked here
    params.logprobs = std::min(2 * options_.n, kMaxLogprobs);
    params.priority = 0;
    request.on_output = [self = shared_from_this(), p, step = s.step, b](RequestOutput output) {
      {
        std::lock_guard<std::mutex> lock(self->mu_);
        self->queue_.push_back({p, step, b, std::move(output)});
      }
      self->cv_.notify_one();
    };
    if (absl::Status status = submit_(std::move(request)); !status.ok()) {
      for (int q = 0; q < b; ++q) abort_(EngineId(p, s.step, q));
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status BeamSearchJob::Advance(int p) {
  Search& s = searches_[p];
  std::vector<Beam> candidates;
  for (size_t b = 0; b < s.live.size(); ++b) {
    for (const TokenLogprob& next : s.next[b].value_or(std::vector<TokenLogprob>{})) {
      Beam c = s.live[b];
      c.tokens.push_back(next.token_id);
      c.logprob += next.logprob;
      c.ended = !beam_.ignore_eos && next.token_id == beam_.eos_token_id;
      (c.ended ? s.finished : candidates).push_back(std::move(c));
    }
  }
  auto better = [&](const Beam& a, const Beam& b) { return Score(p, a) > Score(p, b); };
  std::stable_sort(candidates.begin(), candidates.end(), better);
  if (candidates.size() > static_cast<size_t>(options_.n)) candidates.resize(options_.n);
  s.live = std::move(candidates);
  ++s.step;
  if (s.step >= prompts_[p].max_tokens || s.live.empty()) {
    Finish(p);
    return absl::OkStatus();
  }
  return SubmitStep(p);
}

void BeamSearchJob::Finish(int p) {
  Search& s = searches_[p];
  std::vector<Beam> all = std::move(s.finished);
  all.insert(all.end(), s.live.begin(), s.live.end());
  std::stable_sort(all.begin(), all.end(),
                   [&](const Beam& a, const Beam& b) { return Score(p, a) > Score(p, b); });
  if (all.size() > static_cast<size_t>(options_.n)) all.resize(options_.n);
  s.choices = std::move(all);
  s.live.clear();
  s.done = true;
  for (const Beam& beam : s.choices) {
    metrics_->CountFinished(beam.ended ? FinishReason::kStop : FinishReason::kLength);
  }
  metrics_->ObserveE2eLatency(absl::ToDoubleSeconds(absl::Now() - options_.arrival));
}

bool BeamSearchJob::Drain(absl::Duration timeout, std::string* chunks) {
  std::deque<Arrived> arrived;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout), [&] { return !queue_.empty(); });
    arrived.swap(queue_);
  }
  for (Arrived& a : arrived) {
    Search& s = searches_[a.prompt_index];
    if (s.done || a.step != s.step) continue;
    for (const SampleOutput& sample : a.output.samples) {
      for (const SampleResult& scored : sample.logprobs) s.arriving[a.beam] = scored.top_logprobs;
    }
    if (!a.output.finished) continue;
    const bool aborted =
        std::any_of(a.output.samples.begin(), a.output.samples.end(),
                    [](const SampleOutput& o) { return o.finish_reason == FinishReason::kAbort; });
    if (!a.output.error.ok() || aborted || s.arriving[a.beam].empty()) {
      if (error_.ok()) {
        error_ = !a.output.error.ok() ? a.output.error
                                      : absl::AbortedError("a beam search step was aborted");
      }
      EndAll();
      break;
    }
    s.next[a.beam] = std::move(s.arriving[a.beam]);
    if (--s.pending == 0) {
      if (absl::Status status = Advance(a.prompt_index); !status.ok()) {
        if (error_.ok()) error_ = status;
        EndAll();
        break;
      }
    }
  }
  if (chunks != nullptr && finished() && error_.ok() && !sent_) {
    json chunk = Body(Choices());
    if (options_.include_usage) chunk["usage"] = nullptr;
    absl::StrAppend(chunks, SseEvent(chunk));
    sent_ = true;
  }
  return !arrived.empty();
}

void BeamSearchJob::EndAll() {
  for (const std::string& id : UnfinishedEngineIds()) abort_(id);
  for (Search& s : searches_) s.done = true;
}

bool BeamSearchJob::finished() const {
  return std::all_of(searches_.begin(), searches_.end(), [](const Search& s) { return s.done; });
}

std::vector<std::string> BeamSearchJob::UnfinishedEngineIds() const {
  std::vector<std::string> ids;
  for (int p = 0; p < static_cast<int>(searches_.size()); ++p) {
    const Search& s = searches_[p];
    if (s.done) continue;
    for (int b = 0; b < static_cast<int>(s.next.size()); ++b) {
      if (!s.next[b].has_value()) ids.push_back(EngineId(p, s.step, b));
    }
  }
  return ids;
}

json BeamSearchJob::Body(json choices) const {
  return {{"id", options_.id},
          {"object", "text_completion"},
          {"created", options_.created},
          {"model", options_.model},
          {"choices", std::move(choices)}};
}

json BeamSearchJob::Choices() const {
  json choices = json::array();
  for (int p = 0; p < static_cast<int>(searches_.size()); ++p) {
    const std::vector<Beam>& beams = searches_[p].choices;
    for (int i = 0; i < options_.n; ++i) {
      json choice = {
          {"index", p * options_.n + i}, {"logprobs", nullptr}, {"stop_reason", nullptr}};
      if (i < static_cast<int>(beams.size())) {
        const Beam& beam = beams[i];
        std::vector<int32_t> shown = beam.tokens;
        if (beam.ended) shown.pop_back();  // the EOS is not text
        choice["text"] = tokenizer_->Decode(shown);
        choice["finish_reason"] = beam.ended ? "stop" : "length";
        if (options_.return_token_ids) {
          choice["token_ids"] = beam.tokens;
          choice["prompt_token_ids"] = prompts_[p].token_ids;
        }
      } else {  // fewer continuations than the width (a short max_tokens)
        choice["text"] = "";
        choice["finish_reason"] = "length";
      }
      choices.push_back(std::move(choice));
    }
  }
  return choices;
}

json BeamSearchJob::UsageJson() const {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (const PreparedPrompt& prompt : prompts_) prompt_tokens += prompt.token_ids.size();
  for (const Search& s : searches_) {
    for (const Beam& beam : s.choices) completion_tokens += beam.tokens.size();
  }
  return UsageObject(prompt_tokens, completion_tokens);
}

std::string BeamSearchJob::ClosingChunks(const absl::Status& error) const {
  std::string chunks;
  if (!error.ok()) absl::StrAppend(&chunks, "data: ", mqa::ErrorBody(error), "\n\n");
  if (options_.include_usage) {
    json chunk = Body(json::array());
    chunk["usage"] = UsageJson();
    absl::StrAppend(&chunks, SseEvent(chunk));
  }
  absl::StrAppend(&chunks, "data: [DONE]\n\n");
  return chunks;
}

std::string BeamSearchJob::ResponseBody() const {
  json body = Body(Choices());
  body["usage"] = UsageJson();
  return DumpJson(body);
}

std::string BeamSearchJob::Summary() const {
  const json usage = UsageJson();
  int steps = 0;
  for (const Search& s : searches_) steps += s.step;
  return absl::StrFormat(
      "%s: beam search of width %d, %d prompt%s, %d prompt tokens, %d "
      "generated, %d steps, %.3f s",
      options_.id, options_.n, static_cast<int>(prompts_.size()), prompts_.size() == 1 ? "" : "s",
      usage["prompt_tokens"].get<int64_t>(), usage["completion_tokens"].get<int64_t>(), steps,
      absl::ToDoubleSeconds(absl::Now() - options_.arrival));
}

}  // namespace mqa
