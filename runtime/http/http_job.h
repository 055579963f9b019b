// What the server's response loops (plain and streamed) need of one call in flight, whichever API
// it came through: CompletionJob (OpenAI's /v1/completions and /v1/infill) and TgiJob (TGI's
// /generate, /generate_stream and /). The loops drain outputs, watch the client and the server's
// shutdown, and write what the job renders.
//
// Threads: one HTTP thread per job; the engine thread only reaches it through the callbacks of
// the CompletionJob underneath.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/http/api_types.h"

namespace mqa {

class HttpJob {
 public:
  virtual ~HttpJob() = default;

  // Waits up to `timeout` for outputs and folds them in; false on timeout. Streaming events
  // produced are appended to `*chunks` when non-null.
  virtual bool Drain(absl::Duration timeout, std::string* chunks) = 0;
  // True once every engine request's last output has been folded in.
  virtual bool finished() const = 0;
  // The first error an engine request ended with (OK when none).
  virtual const absl::Status& error() const = 0;
  // Engine ids whose last output has not arrived yet (to abort when the client leaves).
  virtual std::vector<std::string> UnfinishedEngineIds() const = 0;

  // Streaming: the events to send before any output.
  virtual std::string OpeningChunks() = 0;
  // Streaming: the events after the last output: `error` (OK when none) as this API reports a
  // failure inside a stream, and its end marker if it has one.
  virtual std::string ClosingChunks(const absl::Status& error) const = 0;
  // Non-streaming: the whole response body.
  virtual std::string ResponseBody() const = 0;

  // An error before or instead of the response, as this API spells it: OpenAI's unless the job
  // says otherwise.
  virtual int ErrorHttpStatus(const absl::Status& status) const { return HttpStatusFor(status); }
  virtual std::string ErrorBody(const absl::Status& status) const { return mqa::ErrorBody(status); }
  // One line for the request log: the call's id, its prompts' and generated token counts, how its
  // choices finished and how long it took (never prompt or output text).
  virtual std::string Summary() const = 0;
};

}  // namespace mqa
