// One Triton generate-extension call in flight (POST /v2/models/{model}/generate and
// /generate_stream, as the TensorRT-LLM backend's models answer them): the CompletionJob of its
// prompt (one sample), rendered in Triton's shapes.
//
//   plain:   {"model_name", "model_version", "sequence_end": false, "sequence_id": 0,
//            "sequence_start": false, "text_output": the generated text (the input excluded)}
//            and, with return_log_probs, "cum_log_probs" and "output_log_probs" (one a token).
//   stream:  `data: {...}` events of the same shape, each "text_output" the new text (and its
//            tokens' log-probabilities, the cumulative one so far); an error is
//            `data: {"error": message}`. No end marker: the stream ends.
//
// Threads: as CompletionJob (the HTTP thread serving the call).
#pragma once

#include <memory>
#include <string>

#include "nlohmann/json.hpp"
#include "runtime/http/completion_job.h"

namespace mqa {

struct TritonJobOptions {
  std::string model_name;  // as the path named it
  std::string model_version = "1";
  bool return_log_probs = false;
};

class TritonJob : public CompletionJobView {
 public:
  TritonJob(std::shared_ptr<CompletionJob> inner, TritonJobOptions options);

  bool Drain(absl::Duration timeout, std::string* chunks) override;
  std::string OpeningChunks() override { return ""; }
  std::string ClosingChunks(const absl::Status& error) const override;
  std::string ResponseBody() const override;
  std::string ErrorBody(const absl::Status& status) const override;

 private:
  // The response object for text_output `text` and tokens [from, to) of the sample.
  nlohmann::json Output(std::string text, size_t from, size_t to) const;

  const TritonJobOptions options_;
  size_t streamed_bytes_ = 0;
  size_t streamed_tokens_ = 0;
};

}  // namespace mqa
