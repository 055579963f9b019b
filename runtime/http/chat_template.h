// Chat templates: the Jinja subset that Hugging Face chat templates (tokenizer_config.json's
// `chat_template`, rendered by transformers' apply_chat_template) are written in, so that
// /v1/chat/completions turns messages into the prompt the model was fine-tuned on.
//
// Rendered as transformers does: trim_blocks and lstrip_blocks on, `raise_exception(message)`
// available, and the context's variables (messages, add_generation_prompt, bos_token, eos_token).
// Supported: text, {{ expr }}, {% if / elif / else / endif %}, {% for x in expr %} (with
// loop.index, index0, first, last, length, revindex, revindex0) / endfor, {% set name = expr %},
// comments, whitespace control (-), and expressions: literals, names, .attr, [index], [a:b] slices,
// calls of raise_exception and of string methods (strip, lstrip, rstrip, upper, lower, startswith,
// endswith, title), filters (trim, length, upper, lower, string, tojson), tests (defined,
// undefined, none, string, number, mapping, iterable, sequence, true, false), not / and / or, == !=
// < <= > >=, in / not in, + - * / % ~, and `a if cond else b`. Anything else is an error naming the
// construct and its line, at Parse time for syntax, at Render time for values. One difference from
// Python remains: mappings keep their keys sorted, so `tojson` of a dict whose keys were not in
// order prints them in another order than transformers.
//
// Thread safety: a parsed ChatTemplate is immutable; Render may run on many threads at once.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace mqa {

class ChatTemplate {
 public:
  static absl::StatusOr<ChatTemplate> Parse(absl::string_view source);

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  // `context` is an object of the template's variables. InvalidArgument for an error the template
  // raises (raise_exception: the client's messages broke its rules) or a value it cannot use.
  absl::StatusOr<std::string> Render(const nlohmann::json& context) const;

  // A conversation rendered as transformers' apply_chat_template(messages, tools,
  // add_generation_prompt, continue_final_message, **kwargs) renders it, with the tokenizer's BOS
  // and EOS as bos_token and eos_token (which kwargs may override, as there).
  struct Chat {
    nlohmann::json messages;  // a list of {role, content (a string), ...}
    bool add_generation_prompt = true;
    // The prompt ends inside the last message, so that the model goes on writing it (a prefilled
    // assistant turn): rendered with a marker after its content and cut at the marker.
    bool continue_final_message = false;
    nlohmann::json kwargs = nlohmann::json::object();  // further variables (chat_template_kwargs)
    // The template's `tools`: the request's list of tool definitions, or null (transformers
    // passes None when there are none).
    nlohmann::json tools;
  };
  absl::StatusOr<std::string> RenderChat(const Chat& chat, const std::string& bos_token,
                                         const std::string& eos_token) const;

  // The template's text, as given.
  const std::string& source() const { return source_; }

  struct Node;

 private:
  ChatTemplate(std::shared_ptr<const Node> root, std::string source);
  std::shared_ptr<const Node> root_;
  std::string source_;
};

}  // namespace mqa
