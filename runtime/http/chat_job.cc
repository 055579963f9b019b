#include "runtime/http/chat_job.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::json;

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

json FinishJson(const CompletionJob::Choice& c) {
  return c.finish_reason.has_value() ? json(FinishReasonName(*c.finish_reason)) : json(nullptr);
}

}  // namespace

ChatJob::ChatJob(std::shared_ptr<CompletionJob> inner, ChatJobOptions options)
    : inner_(std::move(inner)),
      options_(std::move(options)),
      num_choices_(inner_->num_choices()),
      streamed_bytes_(num_choices_, 0),
      finish_sent_(num_choices_, false) {
  MQA_CHECK(inner_->num_prompts() == 1);
}

json ChatJob::ChunkBase() const {
  return {{"id", options_.id},
          {"object", "chat.completion.chunk"},
          {"created", options_.created},
          {"model", options_.model}};
}

std::string ChatJob::ChoiceChunk(int index, json delta, const json& finish) const {
  json choice = {{"index", index},
                 {"delta", std::move(delta)},
                 {"logprobs", nullptr},
                 {"finish_reason", finish}};
  if (!finish.is_null())
    choice["stop_reason"] = CompletionJob::StopReasonJson(inner_->choice(index));
  json chunk = ChunkBase();
  chunk["choices"] = json::array({std::move(choice)});
  if (options_.include_usage) chunk["usage"] = nullptr;
  return absl::StrCat("data: ", Dump(chunk), "\n\n");
}

std::string ChatJob::OpeningChunks() {
  std::string chunks;
  for (int i = 0; i < num_choices_; ++i) {
    absl::StrAppend(&chunks, ChoiceChunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr));
  }
  return chunks;
}

bool ChatJob::Drain(absl::Duration timeout, std::string* chunks) {
  const bool got = inner_->Drain(timeout, nullptr);
  if (chunks == nullptr) return got;
  for (int i = 0; i < num_choices_; ++i) {
    const CompletionJob::Choice& c = inner_->choice(i);
    if (c.text.size() > streamed_bytes_[i]) {
      absl::StrAppend(chunks,
                      ChoiceChunk(i, {{"content", c.text.substr(streamed_bytes_[i])}}, nullptr));
      streamed_bytes_[i] = c.text.size();
    }
    if (c.finish_reason.has_value() && !finish_sent_[i]) {
      absl::StrAppend(chunks, ChoiceChunk(i, json::object(), FinishJson(c)));
      finish_sent_[i] = true;
    }
  }
  return got;
}

std::string ChatJob::ClosingChunks(const absl::Status& error) const {
  std::string chunks;
  if (!error.ok()) absl::StrAppend(&chunks, "data: ", inner_->ErrorBody(error), "\n\n");
  if (options_.include_usage) {
    json chunk = ChunkBase();
    chunk["choices"] = json::array();
    chunk["usage"] = inner_->UsageJson();
    absl::StrAppend(&chunks, "data: ", Dump(chunk), "\n\n");
  }
  absl::StrAppend(&chunks, "data: [DONE]\n\n");
  return chunks;
}

std::string ChatJob::ResponseBody() const {
  json choices = json::array();
  for (int i = 0; i < num_choices_; ++i) {
    const CompletionJob::Choice& c = inner_->choice(i);
    choices.push_back({{"index", i},
                       {"message", {{"role", "assistant"}, {"content", c.text}}},
                       {"logprobs", nullptr},
                       {"finish_reason", FinishJson(c)},
                       {"stop_reason", CompletionJob::StopReasonJson(c)}});
  }
  json body = {
      {"id", options_.id},       {"object", "chat.completion"},   {"created", options_.created},
      {"model", options_.model}, {"choices", std::move(choices)}, {"usage", inner_->UsageJson()}};
  return Dump(body);
}

}  // namespace mqa
