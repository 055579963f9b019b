#include "runtime/detokenizer.h"

#include <algorithm>
#include <utility>

#include "model/tokenizer/unicode.h"

namespace mqa {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer,
                                           StreamingDetokenizerOptions options)
    : tokenizer_(tokenizer),
      options_(std::move(options)),
      stops_(options_.stop_strings, options_.include_stop_string) {}

StreamingDetokenizer::Delta StreamingDetokenizer::Push(int32_t id) {
  if (stopped()) return {"", true, stop_index_};
  const std::string* bytes = tokenizer_.TokenBytes(id);
  if (bytes == nullptr || (options_.skip_special_tokens && tokenizer_.IsSpecial(id))) {
    return {};
  }
  pending_bytes_ += *bytes;
  // Decoding is byte-concatenation then UTF-8 repair, and the repair of a prefix that ends
  // outside any incomplete sequence does not depend on what follows: so everything but an
  // incomplete tail can be decoded now.
  const size_t tail = tok::IncompleteUtf8Tail(pending_bytes_);
  std::string text;
  tok::AppendUtf8Lossy(std::string_view(pending_bytes_).substr(0, pending_bytes_.size() - tail),
                       &text);
  pending_bytes_.erase(0, pending_bytes_.size() - tail);
  return TakeText(std::move(text), /*final=*/false);
}

std::string StreamingDetokenizer::Flush() {
  if (stopped()) return "";
  std::string text;
  tok::AppendUtf8Lossy(pending_bytes_, &text);
  pending_bytes_.clear();
  return TakeText(std::move(text), /*final=*/true).text;
}

StreamingDetokenizer::Delta StreamingDetokenizer::TakeText(std::string text, bool final) {
  Delta delta;
  StopStringMatcher::Result r = stops_.Push(text);
  delta.text = std::move(r.text);
  // At the end, a held-back partial stop string is ordinary text.
  if (final && !r.stopped) delta.text += stops_.Flush();
  delta.stopped = r.stopped;
  delta.stop_index = r.stop_index;
  if (r.stopped) stop_index_ = r.stop_index;
  return delta;
}

}  // namespace mqa
