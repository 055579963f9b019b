// libFuzzer target: arbitrary bytes into Encode (with and without special-token parsing),
// Decode and the streaming detokenizer. Nothing may crash (ASan watches), Decode(Encode(s))
// must give s back for valid UTF-8 (and its U+FFFD repair otherwise), and streamed pieces
// must add up to Decode. Loads the committed HF fixture tokenizer
// ($MQA_TOKENIZER_FIXTURES or $MQA_SOURCE_DIR/tests/fixtures/tokenizer).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"
#include "runtime/detokenizer.h"

namespace {

const mqa::Tokenizer& Get() {
  static const mqa::Tokenizer* tokenizer = [] {
    const char* dir = std::getenv("MQA_TOKENIZER_FIXTURES");
    const char* src = std::getenv("MQA_SOURCE_DIR");
    const std::string path = dir ? std::string(dir) + "/tokenizer.json"
                                 : std::string(src ? src : ".") +
                                       "/tests/fixtures/tokenizer/tokenizer.json";
    auto t = mqa::Tokenizer::FromFile(path);
    if (!t.ok()) {
      std::fprintf(stderr, "tokenizer_fuzz: %s\n", t.status().ToString().c_str());
      std::abort();
    }
    return new mqa::Tokenizer(*std::move(t));
  }();
  return *tokenizer;
}

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tokenizer_fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const mqa::Tokenizer& t = Get();
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string repaired;
  mqa::tok::AppendUtf8Lossy(text, &repaired);
  const bool valid = mqa::tok::IsValidUtf8(text);
  for (bool parse_special : {true, false}) {
    const std::vector<int32_t> ids = t.Encode(text, parse_special);
    for (int32_t id : ids) Require(id >= 0 && id < t.vocab_size(), "id out of range");
    const std::string decoded = t.Decode(ids);
    Require(decoded == (valid ? text : repaired), "Decode(Encode(s)) != s");
  }
  // The bytes as ids (any value, in range or not), decoded at once and streamed.
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 2 <= size; i += 2) {
    ids.push_back(static_cast<int32_t>(data[i] | (data[i + 1] << 8)) - 64);
  }
  mqa::StreamingDetokenizer detok(t, {.stop_strings = {"\n\n"}});
  std::string streamed;
  bool stopped = false;
  for (int32_t id : ids) {
    const auto delta = detok.Push(id);
    Require(mqa::tok::IsValidUtf8(delta.text), "streamed text is not UTF-8");
    streamed += delta.text;
    stopped |= delta.stopped;
  }
  streamed += detok.Flush();
  const std::string all = t.Decode(ids);
  const size_t stop = all.find("\n\n");
  Require(streamed == (stop == std::string::npos ? all : all.substr(0, stop)),
          "streamed pieces do not add up to Decode");
  Require(stopped == (stop != std::string::npos), "stop flag");
  return 0;
}
