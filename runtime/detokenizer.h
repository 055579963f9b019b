// Incremental detokenizer for streaming responses: feed sampled ids one by one, get back text
// that is complete UTF-8, with stop strings found across token boundaries.
//
// Guarantees: the concatenation of every Push's text and Flush() equals
// Tokenizer::Decode(all pushed ids, skip_special_tokens) when no stop string is hit. When one is,
// the output is that text cut before the stop string (or after it with include_stop_string);
// the stop is the occurrence that ends first in the text (ties: the longer one), so the result
// does not depend on how the text was split into tokens.
//
// One StreamingDetokenizer per sequence, used from one thread (the engine's). It keeps a
// reference to the Tokenizer, which must outlive it. It is also the engine's
// IncrementalDetokenizer (runtime/stop_strings.h): Next(id) is Push(id).text; give it no stop
// strings there, since the engine's StopStringMatcher does that part.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.h"
#include "runtime/stop_strings.h"

namespace mqa {

struct StreamingDetokenizerOptions {
  std::vector<std::string> stop_strings;  // empty strings are ignored
  bool include_stop_string = false;       // emit the stop string itself before stopping
  bool skip_special_tokens = false;
};

class StreamingDetokenizer : public IncrementalDetokenizer {
 public:
  struct Delta {
    std::string text;     // new text, safe to send (may be empty)
    bool stopped = false;  // a stop string was hit: generation should end
    int stop_index = -1;   // which of options.stop_strings, when stopped
  };

  StreamingDetokenizer(const Tokenizer& tokenizer, StreamingDetokenizerOptions options);

  // After a stop, further pushes return empty deltas with stopped = true.
  Delta Push(int32_t id);
  // End of generation: the held-back text (an incomplete UTF-8 tail becomes U+FFFD; a
  // partial stop string that never completed is ordinary text). Empty after a stop.
  std::string Flush() override;

  bool stopped() const { return stop_index_ >= 0; }

  // IncrementalDetokenizer.
  std::string Next(int32_t token_id) override { return Push(token_id).text; }

 private:
  Delta TakeText(std::string text, bool final);

  const Tokenizer& tokenizer_;
  StreamingDetokenizerOptions options_;
  std::string pending_bytes_;  // an incomplete UTF-8 sequence waiting for its next bytes
  StopStringMatcher stops_;    // holds back text that may be the start of a stop string
  int stop_index_ = -1;
};

}  // namespace mqa
