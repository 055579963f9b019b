// Per-request sampling parameters (the OpenAI / vLLM set). Plain value type: parsed at the edge
// (http/), validated once with Validate(), then read-only for the life of the request.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace mqa {

class Guide;

struct SamplingParams {
  // Independent samples generated from one prompt; they share the prompt's KV blocks.
  int n = 1;
  // 0 selects greedy decoding (argmax; consumes no randomness).
  float temperature = 1.0f;
  // Keep the k most likely tokens; -1 (or 0) keeps all.
  int top_k = -1;
  // Keep the smallest set of most likely tokens whose probability mass reaches top_p.
  float top_p = 1.0f;
  // Drop tokens whose probability is below min_p * (probability of the most likely token).
  float min_p = 0.0f;
  // Locally typical sampling (TGI's typical_p, transformers' TypicalLogitsWarper): after top-k and
  // top-p, keep the tokens whose surprisal is closest to the distribution's entropy until their
  // probability reaches typical_p. 1: off. Host-sampled.
  float typical_p = 1.0f;
  // > 1 discourages tokens already in the prompt or output (divides positive logits,
  // multiplies negative ones).
  float repetition_penalty = 1.0f;
  // The tokens the three penalties look at: -1, the whole prompt and output (repetition) / the
  // output (presence, frequency); n > 0, the last n tokens of prompt and output for all three
  // (llama.cpp's repeat_last_n).
  int penalty_last_n = -1;
  // Subtracted once from the logit of every token that appears in the output so far.
  float presence_penalty = 0.0f;
  // Subtracted from a token's logit once per occurrence in the output so far.
  float frequency_penalty = 0.0f;
  // OpenAI's logit_bias: (token id, bias in [-100, 100]) added to the token's logit before the
  // penalties (-100 all but bans a token, +100 all but forces it). Ids are checked against the
  // vocabulary at the edge.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // vLLM's allowed_token_ids: when not empty, only these tokens can be drawn (every other logit is
  // masked first). Ids are checked against the vocabulary at the edge.
  std::vector<int32_t> allowed_token_ids;
  // Same seed, same prompt, same model: same output, whatever else shares the batch. Without a
  // seed the engine draws one from its own generator.
  std::optional<uint64_t> seed;
  // Generation stops after a sampled token in this list (the token is part of the output ids).
  std::vector<int32_t> stop_token_ids;
  // Generation stops when the output text contains one of these (needs a detokenizer); the text
  // returned ends before the stop string unless include_stop_str_in_output.
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;
  // 0 scores the prompt without generating: only with prompt_logprobs and n = 1.
  int max_tokens = 16;
  // EOS and stop_token_ids are masked out (and stop strings ignored) until this many tokens.
  int min_tokens = 0;
  // Keep generating after EOS (EOS is not masked either).
  bool ignore_eos = false;
  // Special tokens (EOS, FIM markers) left out of the output text (vLLM's default); the token ids
  // are returned either way. Read by the server's detokenizer, not by the engine.
  bool skip_special_tokens = true;
  // Return the log-probability of each chosen token and of the `logprobs` most likely tokens
  // (0: the chosen token only). Log-probabilities are of the model's distribution, before
  // penalties, temperature and filtering. Unset: none.
  std::optional<int> logprobs;
  // Return, once the prompt has run, the log-probability of each prompt token after the first
  // (given the tokens before it) and of the `prompt_logprobs` most likely tokens at its position
  // (vLLM's prompt_logprobs; OpenAI's echo with logprobs). Such a request computes its whole
  // prompt: it does not start from the prefix cache. Unset: none.
  std::optional<int> prompt_logprobs;
  // Guided decoding (runtime/guided.h: vLLM's guided_regex / guided_choice, TGI's regex grammar):
  // the pattern as given (a choice list already turned into one), and the guide the server
  // compiled from it against its tokenizer. The output text then matches the pattern in full:
  // draws are limited to tokens that keep it a prefix of a match, and the sample stops once
  // nothing can follow.
  std::string guided_regex;
  // Or a context-free grammar in GBNF (runtime/grammar.h: vLLM's guided_grammar, and OpenAI's
  // json_object as GrammarGuide::JsonObjectGrammar()); at most one of the two.
  std::string guided_grammar;
  std::shared_ptr<const Guide> guide;
  // vLLM's bad_words: the words as given (read by the server), and the token sequences it
  // tokenized them into (each word as is and after a space, as vLLM does). A sequence's last token
  // is masked whenever the output so far ends with the rest of it (a one-token word always).
  std::vector<std::string> bad_words;
  std::vector<std::vector<int32_t>> bad_words_token_ids;
  // vLLM's request priority (lower is served first) under EngineOptions::priority_scheduling;
  // with first-come-first-served scheduling only 0 is accepted. Not a sampling parameter: it
  // rides here from the API to the scheduler.
  int priority = 0;

  bool greedy() const { return temperature == 0.0f; }

  // InvalidArgument naming the field and the value for anything out of range.
  absl::Status Validate() const;
};

// Whether the device sampler (runtime/row_sampling.h: greedy, temperature, top-k, top-p, seed)
// draws exactly what a request asks for: no penalties, min-p, min_tokens masking, logit_bias,
// allowed_token_ids, bad words or guide. Log-probabilities (of the output or the prompt) do not need the host sampler:
// the engine scores the device's draw (and prompt rows) from the step's logits, copied back only
// for steps that hold such a request.
bool DeviceSamplable(const SamplingParams& params);

// Most logprobs one request may ask for (the OpenAI API's cap).
inline constexpr int kMaxLogprobs = 20;

}  // namespace mqa
