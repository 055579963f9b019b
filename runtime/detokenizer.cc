#include "runtime/detokenizer.h"

#include <algorithm>
#include <utility>

#include "model/tokenizer/unicode.h"

namespace mqa {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer,
                                           StreamingDetokenizerOptions options)
    : tokenizer_(tokenizer), options_(std::move(options)) {}

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
  const size_t old_size = held_.size();
  held_ += text;
  Delta delta;
  // The stop that ends first; every earlier occurrence was found on an earlier call, so the
  // search starts where a new one could.
  size_t best_end = std::string::npos;
  size_t best_begin = 0;
  for (size_t s = 0; s < options_.stop_strings.size(); ++s) {
    const std::string& stop = options_.stop_strings[s];
    if (stop.empty()) continue;
    const size_t from = old_size >= stop.size() ? old_size - stop.size() + 1 : 0;
    const size_t at = held_.find(stop, from);
    if (at == std::string::npos) continue;
    const size_t end = at + stop.size();
    if (end < best_end || (end == best_end && at < best_begin)) {
      best_end = end;
      best_begin = at;
      stop_index_ = static_cast<int>(s);
    }
  }
  if (stopped()) {
    delta.text = held_.substr(0, options_.include_stop_string ? best_end : best_begin);
    delta.stopped = true;
    delta.stop_index = stop_index_;
    held_.clear();
    return delta;
  }
  // Hold back the longest tail that is a proper prefix of a stop string: it may complete.
  size_t keep = 0;
  if (!final) {
    for (const std::string& stop : options_.stop_strings) {
      for (size_t len = std::min(stop.size() - (stop.empty() ? 0 : 1), held_.size()); len > keep;
           --len) {
        if (held_.compare(held_.size() - len, len, stop, 0, len) == 0) {
          keep = len;
          break;
        }
      }
    }
  }
  delta.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return delta;
}

}  // namespace mqa
