#include "runtime/http/responses_job.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using json = nlohmann::json;

}  // namespace

ResponsesJob::ResponsesJob(std::shared_ptr<CompletionJob> inner, ResponsesJobOptions options)
    : CompletionJobView(std::move(inner)),
      options_(std::move(options)),
      item_id_(absl::StrCat("msg_", absl::StripPrefix(options_.id, "resp_"))) {
  MQA_CHECK(this->inner().num_prompts() == 1 && this->inner().num_choices() == 1);
}

void ResponsesJob::Store() {
  if (stored_ || options_.store == nullptr || !finished() || !error().ok()) return;
  stored_ = true;
  nlohmann::ordered_json conversation = options_.conversation;
  const json output = OutputItems();
  nlohmann::ordered_json answer = {{"role", "assistant"}, {"content", ""}};
  for (const json& item : output) {
    if (item["type"] == "message") {
      answer["content"] = item["content"][0]["text"].get<std::string>();
    } else {
      answer["tool_calls"].push_back(
          {{"id", item["call_id"]},
           {"type", "function"},
           {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    }
  }
  conversation.push_back(std::move(answer));
  json items = options_.input_items;
  for (size_t i = 0; i < items.size(); ++i) {
    items[i]["id"] = absl::StrCat(item_id_, "_in", i);
    items[i]["status"] = "completed";
  }
  options_.store->Put(options_.id, {.response = Response(),
                                    .input_items = std::move(items),
                                    .conversation = std::move(conversation)});
}

json ResponsesJob::TextPart(const std::string& text) {
  return {{"type", "output_text"},
          {"text", text},
          {"annotations", json::array()},
          {"logprobs", json::array()}};
}

json ResponsesJob::Message(const std::string& text) const {
  const CompletionJob::Choice& c = inner().choice(0);
  const char* status = !c.finish_reason.has_value()              ? "in_progress"
                       : *c.finish_reason == FinishReason::kStop ? "completed"
                                                                 : "incomplete";
  return {{"type", "message"},
          {"id", item_id_},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({TextPart(text)})}};
}

json ResponsesJob::OutputItems() const {
  const CompletionJob::Choice& c = inner().choice(0);
  json items = json::array();
  if (streams_text()) {
    items.push_back(Message(c.text));
    return items;
  }
  ToolAnswer answer = ReadToolAnswer(options_.tool_choice, c.text);
  if (answer.content.has_value()) items.push_back(Message(*answer.content));
  for (size_t k = 0; k < answer.calls.size(); ++k) items.push_back(CallItem(k, answer.calls[k]));
  return items;
}

json ResponsesJob::CallItem(size_t k, const ToolCall& call) const {
  const std::string suffix(absl::StripPrefix(options_.id, "resp_"));
  // call_id: what the client's function_call_output names; unique as the response id is.
  return {{"type", "function_call"},
          {"id", absl::StrCat("fc_", suffix, "_", k)},
          {"call_id", absl::StrCat("call_", suffix, "_", k)},
          {"name", call.name},
          {"arguments", call.arguments},
          {"status", "completed"}};
}

void ResponsesJob::OpenText(std::string* chunks) const {
  if (open_text_.has_value()) return;
  json item = Message("");
  item["status"] = "in_progress";
  item["content"] = json::array();
  absl::StrAppend(chunks, Event("response.output_item.added",
                                {{"output_index", next_item_}, {"item", std::move(item)}}));
  absl::StrAppend(chunks, Event("response.content_part.added", {{"item_id", item_id_},
                                                                {"output_index", next_item_},
                                                                {"content_index", 0},
                                                                {"part", TextPart("")}}));
  open_text_.emplace();
}

void ResponsesJob::AddText(const std::string& piece, std::string* chunks) const {
  OpenText(chunks);
  absl::StrAppend(chunks, Event("response.output_text.delta", {{"item_id", item_id_},
                                                               {"output_index", next_item_},
                                                               {"content_index", 0},
                                                               {"delta", piece},
                                                               {"logprobs", json::array()}}));
  *open_text_ += piece;
}

void ResponsesJob::CloseText(std::string* chunks) const {
  if (!open_text_.has_value()) return;
  json item = Message(*open_text_);
  if (item["status"] == "in_progress") item["status"] = "completed";  // a call follows it
  absl::StrAppend(chunks, TextDoneEvents(item_id_, next_item_, *open_text_));
  absl::StrAppend(chunks, Event("response.output_item.done",
                                {{"output_index", next_item_}, {"item", std::move(item)}}));
  open_text_.reset();
  ++next_item_;
}

void ResponsesJob::StreamItems(bool finished, std::string* chunks) const {
  const std::string& text = inner().choice(0).text;
  switch (options_.tool_choice.mode) {
    case ToolChoiceMode::kNone: {  // the text is the one message item (opened with the stream)
      const size_t sent = open_text_.has_value() ? open_text_->size() : 0;
      if (text.size() > sent) AddText(text.substr(sent), chunks);
      if (finished) CloseText(chunks);
      return;
    }
    case ToolChoiceMode::kNamed: {  // the text is the call's arguments
      const json item = CallItem(0, {options_.tool_choice.name, text});
      if (!named_sent_.has_value() && (!text.empty() || finished)) {
        json added = item;
        added["status"] = "in_progress";
        added["arguments"] = "";
        absl::StrAppend(chunks, Event("response.output_item.added",
                                      {{"output_index", next_item_}, {"item", std::move(added)}}));
        named_sent_ = 0;
        calls_sent_ = 1;
      }
      if (named_sent_.has_value() && text.size() > *named_sent_) {
        absl::StrAppend(chunks, Event("response.function_call_arguments.delta",
                                      {{"item_id", item["id"]},
                                       {"output_index", next_item_},
                                       {"delta", text.substr(*named_sent_)}}));
        named_sent_ = text.size();
      }
      if (finished && named_sent_.has_value()) {
        absl::StrAppend(
            chunks, Event("response.function_call_arguments.done", {{"item_id", item["id"]},
                                                                    {"output_index", next_item_},
                                                                    {"name", item["name"]},
                                                                    {"arguments", text}}));
        absl::StrAppend(chunks, Event("response.output_item.done",
                                      {{"output_index", next_item_}, {"item", item}}));
        ++next_item_;
      }
      return;
    }
    case ToolChoiceMode::kRequired:
      for (const ToolCall& call : scanner_.Feed(text)) {
        absl::StrAppend(chunks, ItemEvents(next_item_++, CallItem(calls_sent_++, call)));
      }
      if (finished && calls_sent_ == 0) {  // never a list of calls: the text, as the plain answer
        AddText(text, chunks);
        CloseText(chunks);
      }
      return;
    case ToolChoiceMode::kAuto: {
      HermesToolCallStreamer::Delta got = hermes_.Feed(text, finished);
      if (!got.content.empty()) AddText(got.content, chunks);
      for (const ToolCall& call : got.calls) {
        CloseText(chunks);
        absl::StrAppend(chunks, ItemEvents(next_item_++, CallItem(calls_sent_++, call)));
      }
      if (finished) CloseText(chunks);
      return;
    }
  }
}

json ResponsesJob::Response(bool failed) const {
  const CompletionJob::Choice& c = inner().choice(0);
  std::string status = "in_progress";
  json incomplete = nullptr;
  if (failed) {
    status = "failed";
  } else if (c.finish_reason.has_value()) {
    status = *c.finish_reason == FinishReason::kStop ? "completed" : "incomplete";
    if (*c.finish_reason == FinishReason::kLength) {
      incomplete = {{"reason", "max_output_tokens"}};
    } else if (*c.finish_reason == FinishReason::kAbort) {
      incomplete = {{"reason", "aborted"}};
    }
  }
  json usage = nullptr;
  json output = json::array();
  if (status != "in_progress") {
    const json chat_usage = inner().UsageJson();
    const int64_t input = chat_usage["prompt_tokens"],
                  output_tokens = chat_usage["completion_tokens"];
    usage = {{"input_tokens", input},
             {"input_tokens_details", {{"cached_tokens", inner().cached_prompt_tokens(0)}}},
             {"output_tokens", output_tokens},
             {"output_tokens_details", {{"reasoning_tokens", 0}}},
             {"total_tokens", input + output_tokens}};
    if (!failed) output = OutputItems();
  }
  return {
      {"id", options_.id},
      {"object", "response"},
      {"created_at", inner().options().created},
      {"status", status},
      {"error", nullptr},
      {"incomplete_details", std::move(incomplete)},
      {"instructions",
       options_.instructions.has_value() ? json(*options_.instructions) : json(nullptr)},
      {"max_output_tokens",
       options_.max_output_tokens.has_value() ? json(*options_.max_output_tokens) : json(nullptr)},
      {"model", inner().options().model},
      {"output", std::move(output)},
      {"parallel_tool_calls", options_.parallel_tool_calls},
      {"previous_response_id", options_.previous_response_id.has_value()
                                   ? json(*options_.previous_response_id)
                                   : json(nullptr)},
      {"reasoning", nullptr},
      {"store", options_.store != nullptr},
      {"temperature", options_.temperature},
      {"text", {{"format", options_.text_format}}},
      {"tool_choice", options_.tool_choice_given},
      {"tools", options_.tools},
      {"top_p", options_.top_p},
      {"truncation", "disabled"},
      {"usage", std::move(usage)},
      {"metadata", options_.metadata.is_null() ? json::object() : options_.metadata}};
}

std::string ResponsesJob::Event(const std::string& type, json data) const {
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  return absl::StrCat("event: ", type, "\n", SseEvent(data));
}

std::string ResponsesJob::OpeningChunks() {
  std::string chunks = Event("response.created", {{"response", Response()}});
  absl::StrAppend(&chunks, Event("response.in_progress", {{"response", Response()}}));
  if (streams_text()) OpenText(&chunks);  // with tools, items open as the text makes them
  return chunks;
}

std::string ResponsesJob::ItemEvents(int index, const json& item) const {
  json added = item;
  added["status"] = "in_progress";
  const bool message = item["type"] == "message";
  if (message) {
    added["content"] = json::array();
  } else {
    added["arguments"] = "";
  }
  std::string chunks =
      Event("response.output_item.added", {{"output_index", index}, {"item", std::move(added)}});
  const json id = item["id"];
  if (message) {
    const std::string text = item["content"][0]["text"];
    const json at = {{"item_id", id}, {"output_index", index}, {"content_index", 0}};
    json part = at;
    part["part"] = TextPart("");
    absl::StrAppend(&chunks, Event("response.content_part.added", std::move(part)));
    json delta = at;
    delta["delta"] = text;
    delta["logprobs"] = json::array();
    absl::StrAppend(&chunks, Event("response.output_text.delta", std::move(delta)));
    absl::StrAppend(&chunks, TextDoneEvents(id, index, text));
  } else {
    absl::StrAppend(
        &chunks, Event("response.function_call_arguments.delta",
                       {{"item_id", id}, {"output_index", index}, {"delta", item["arguments"]}}));
    absl::StrAppend(&chunks, Event("response.function_call_arguments.done",
                                   {{"item_id", id},
                                    {"output_index", index},
                                    {"name", item["name"]},
                                    {"arguments", item["arguments"]}}));
  }
  absl::StrAppend(&chunks,
                  Event("response.output_item.done", {{"output_index", index}, {"item", item}}));
  return chunks;
}

std::string ResponsesJob::TextDoneEvents(const json& item_id, int index,
                                         const std::string& text) const {
  const json at = {{"item_id", item_id}, {"output_index", index}, {"content_index", 0}};
  json done = at;
  done["text"] = text;
  done["logprobs"] = json::array();
  json part = at;
  part["part"] = TextPart(text);
  // (In order: each event takes the next sequence number.)
  std::string chunks = Event("response.output_text.done", std::move(done));
  absl::StrAppend(&chunks, Event("response.content_part.done", std::move(part)));
  return chunks;
}

bool ResponsesJob::Drain(absl::Duration timeout, std::string* chunks) {
  const bool got = DrainInner(timeout);
  Store();
  if (chunks != nullptr) StreamItems(/*finished=*/false, chunks);
  return got;
}

std::string ResponsesJob::ClosingChunks(const absl::Status& error) const {
  std::string chunks;
  if (!error.ok()) {
    const json body = json::parse(inner().ErrorBody(error), nullptr, false);
    json event = body.is_object() && body.contains("error") ? body["error"] : json::object();
    absl::StrAppend(&chunks, Event("error", std::move(event)));
    absl::StrAppend(&chunks, Event("response.failed", {{"response", Response(/*failed=*/true)}}));
    return chunks;
  }
  StreamItems(/*finished=*/true, &chunks);
  json response = Response();
  const std::string type =
      response["status"] == "completed" ? "response.completed" : "response.incomplete";
  absl::StrAppend(&chunks, Event(type, {{"response", std::move(response)}}));
  return chunks;
}

std::string ResponsesJob::ResponseBody() const { return DumpJson(Response()); }

}  // namespace mqa
