// Text for the engine's outputs and stop-string matching.
//
// The engine does not know the tokenizer. A caller that wants text (and stop strings) plugs in
// one IncrementalDetokenizer per sample; StopStringMatcher then finds stop strings in the text
// stream, holding back any tail that may still grow into one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mqa {

// Turns a sample's tokens, one at a time, into text. Owned and called by the engine thread.
// Implementations must emit only complete UTF-8 (holding back partial characters).
class IncrementalDetokenizer {
 public:
  virtual ~IncrementalDetokenizer() = default;
  // The text this token adds (possibly empty while a character is incomplete).
  virtual std::string Next(int32_t token_id) = 0;
  // At the end of the sample: any text still held back (e.g. an incomplete character).
  virtual std::string Flush() { return {}; }
};

// Finds stop strings in a stream of text, holding back any tail that may still grow into one. The
// stop reported is the one that ends first in the text (ties: the longer), so the result does not
// depend on how the text was split into pieces. Empty stop strings are ignored. Used by the
// engine (per sample) and by StreamingDetokenizer. Not thread-safe; one per sample.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops, bool include_stop = false);

  struct Result {
    std::string text;  // safe to emit now
    bool stopped = false;
    std::string stop;  // the stop string found
    int stop_index = -1;  // its index in the constructor's list
  };
  // Feeds new text. Once stopped, further calls return nothing.
  Result Push(const std::string& delta);
  // The held-back tail, when generation ends for another reason. Empty after a stop.
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  Result Take(const std::string& delta, bool final);

  std::vector<std::string> stops_;
  bool include_stop_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace mqa
