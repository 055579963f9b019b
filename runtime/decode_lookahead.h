// Decode lookahead: a runner that samples on the device may launch the decode step that most
// likely comes next before the engine has asked for it, feeding it on the device the tokens the
// current step samples. The host's work between two steps (reading the tokens back, the engine's
// output processing and scheduling, staging the next step) then overlaps the GPU's next step
// instead of leaving the GPU idle. When the engine's next step is the predicted one, the runner
// only collects its tokens; when it is not (a sequence stopped, a request arrived or was aborted),
// the predicted step's tokens are dropped and the real step runs after it: one wasted step.
//
// Safety of a predicted step that is then dropped: it writes one K / V row a sequence, at the slot
// after the sequence's last token, inside the sequence's current last block (the prediction is
// refused when the next slot would need a new block). That block is partial, so the prefix cache
// does not hold it, and StepInput::may_look_ahead promises it is the sequence's own (not shared
// with a forked sibling). Whoever owns the block later writes that slot before reading it, in
// stream order after the predicted step.
//
// These are the pure parts (prediction and matching), kept apart from the runner so that they are
// tested without a model.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "runtime/model_runner.h"
#include "runtime/row_sampling.h"

namespace mqa {

struct LookaheadStep {
  // token_ids: once launched, the tokens the step before it returned (what it was fed on the
  // device); PredictNextDecodeStep leaves the previous step's.
  StepInput input;
  std::vector<RowSamplingParams> params;
};

// The step after `input` if every sequence continues with the token sampled for it: positions,
// context lengths and slots one further, sampling offsets one further, the same block tables,
// and no block copies or finished sequences. nullopt unless `input` is a plain decode step (one
// token and one logits row per sequence, in order), every sequence's next slot lies in its current
// last block, and every next position is below `max_positions`. The token ids are left as in
// `input` (the runner feeds the sampled ones on the device and fills them in afterwards).
std::optional<LookaheadStep> PredictNextDecodeStep(const StepInput& input,
                                                   absl::Span<const RowSamplingParams> params,
                                                   int block_size, int max_positions);

// Whether the engine's `step` (with its sampling `params`) is exactly `predicted`, token ids
// included (the tokens the predicted step was fed on the device).
bool IsPredictedStep(const LookaheadStep& predicted, const StepInput& step,
                     absl::Span<const RowSamplingParams> params);

// Counts a lookahead runner keeps (ModelRunner::lookahead_stats).
struct LookaheadStats {
  int64_t launched = 0;  // predicted steps launched
  int64_t used = 0;      // ... that were the engine's next step
  int64_t dropped = 0;   // ... that were not (their tokens discarded)
  int64_t failed = 0;    // predictions whose launch failed (the step before them unaffected)
};

}  // namespace mqa
