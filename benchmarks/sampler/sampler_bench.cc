// Host-side cost of the engine's per-row work on one core: ScoreToken (what a log-probability
// costs: output logprobs of a device-drawn token, every prompt_logprobs row) and the host Sample()
// (requests the device sampler does not cover), per logits row, beside the ceiling measured in the
// same run: one plain summing pass over the same rows (the least any whole-row work costs).
//
//   sampler_bench [--vocab 49152] [--rows 256] [--passes 5]
//
// Then the engine's host pool (runtime/worker_pool.h, EngineOptions::host_threads): the top-p
// sample of every row, rows spread over 1, 2, 4 ... threads up to the machine's, wall time a row
// beside the one-thread figure divided by the threads (the ceiling of that many threads).
//
// Then guided decoding (runtime/guided.h): the top-p sample of a row masked by a guide — any JSON
// object (json_object), inside a string value, where most tokens are allowed — over a vocabulary
// of random printable tokens of 1-6 bytes, beside the same sample unguided; and the one-off cost
// of a state's token mask (a pass over the vocabulary's bytes).
//
// Rows are random logits (normal, sigma 3: a broad distribution, so top-p keeps thousands of
// tokens; a trained model's rows are usually far more peaked, which makes top-p cheaper). Prints
// the best pass of each, in microseconds a row.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/grammar.h"
#include "runtime/guided.h"
#include "runtime/json_schema_regex.h"
#include "runtime/sampler.h"
#include "runtime/worker_pool.h"

namespace {

double BestMicrosPerRow(int passes, int rows, const std::function<double(int)>& per_row) {
  double best = 1e30;
  volatile double sink = 0;
  for (int pass = 0; pass < passes; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    double acc = 0;
    for (int r = 0; r < rows; ++r) acc += per_row(r);
    const auto end = std::chrono::steady_clock::now();
    sink = sink + acc;
    best = std::min(best, std::chrono::duration<double, std::micro>(end - start).count() / rows);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  int vocab = 49152, rows = 256, passes = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--vocab") {
      vocab = value;
    } else if (flag == "--rows") {
      rows = value;
    } else if (flag == "--passes") {
      passes = value;
    } else {
      std::fprintf(stderr, "usage: sampler_bench [--vocab N] [--rows N] [--passes N]\n");
      return 2;
    }
  }
  if (vocab < 1 || rows < 1 || passes < 1) return 2;
  std::vector<float> logits(static_cast<size_t>(vocab) * rows);
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (float& x : logits) x = dist(gen);
  auto row = [&](int r) {
    return absl::MakeConstSpan(logits).subspan(static_cast<size_t>(r) * vocab, vocab);
  };

  std::printf("vocab %d, %d rows, best of %d passes, one thread; us a row\n", vocab, rows, passes);
  const double ceiling = BestMicrosPerRow(passes, rows, [&](int r) {
    float lanes[8] = {};
    const absl::Span<const float> x = row(r);
    size_t i = 0;
    for (; i + 8 <= x.size(); i += 8) {
      for (int j = 0; j < 8; ++j) lanes[j] += x[i + j];
    }
    double sum = 0;
    for (float lane : lanes) sum += lane;
    for (; i < x.size(); ++i) sum += x[i];
    return sum;
  });
  std::printf("%-44s %9.1f   (ceiling: one summing pass)\n", "plain pass over the row", ceiling);
  auto report = [&](const char* name, double us) {
    std::printf("%-44s %9.1f   %5.1fx the ceiling\n", name, us, us / ceiling);
  };
  for (int top : {0, 1, 5, 20}) {
    report(("ScoreToken, top " + std::to_string(top)).c_str(),
           BestMicrosPerRow(passes, rows, [&](int r) {
             return mqa::ScoreToken(row(r), r % vocab, top).logprob;
           }));
  }
  struct Case {
    const char* name;
    float temperature, top_p;
    int top_k;
  };
  for (const Case& c :
       {Case{"Sample greedy", 0.0f, 1.0f, -1}, Case{"Sample temperature 0.8", 0.8f, 1.0f, -1},
        Case{"Sample temperature 0.8, top_k 50", 0.8f, 1.0f, 50},
        Case{"Sample temperature 0.8, top_p 0.95", 0.8f, 0.95f, -1}}) {
    mqa::SamplingParams params;
    params.temperature = c.temperature;
    params.top_p = c.top_p;
    params.top_k = c.top_k;
    mqa::SampleRng rng(7);
    report(c.name, BestMicrosPerRow(passes, rows, [&](int r) {
             mqa::SamplingContext context;
             context.params = &params;
             context.rng = &rng;
             return mqa::Sample(row(r), context).token_id;
           }));
  }

  mqa::SamplingParams top_p;
  top_p.temperature = 0.8f;
  top_p.top_p = 0.95f;
  std::vector<mqa::SampleRng> rngs;
  for (int r = 0; r < rows; ++r) rngs.emplace_back(r);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf("\nthe top-p sample of %d rows on the engine's host pool; wall us a row\n", rows);
  double one = 0;
  for (int threads = 1; threads <= hw; threads *= 2) {
    mqa::WorkerPool pool(threads);
    std::vector<int32_t> tokens(rows);
    double best = 1e30;
    for (int pass = 0; pass < passes; ++pass) {
      const auto start = std::chrono::steady_clock::now();
      pool.ParallelFor(rows, [&](int64_t r) {
        mqa::SamplingContext context;
        context.params = &top_p;
        context.rng = &rngs[r];
        tokens[r] = mqa::Sample(row(static_cast<int>(r)), context).token_id;
      });
      const auto end = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double, std::micro>(end - start).count() / rows);
    }
    if (threads == 1) one = best;
    std::printf("%2d threads %9.1f   (ceiling %.1f: one thread's / %d)\n", threads, best,
                one / threads, threads);
  }

  auto guide_vocab = std::make_shared<mqa::GuideVocab>();
  guide_vocab->bytes.resize(vocab);
  std::mt19937 tokens_rng(5);
  for (std::string& b : guide_vocab->bytes) {
    b.resize(1 + tokens_rng() % 6);
    for (char& c : b) c = static_cast<char>(0x20 + tokens_rng() % 95);
  }
  for (int c = 0x20; c < 0x7f && c - 0x20 + 1 < vocab; ++c) {  // every byte a token of its own
    guide_vocab->bytes[c - 0x20 + 1] = std::string(1, static_cast<char>(c));
  }
  guide_vocab->eos = 0;
  guide_vocab->bytes[0].clear();
  auto regex = mqa::RegexGuide::Compile(mqa::AnyJsonObjectRegex(), guide_vocab);
  auto grammar = mqa::GrammarGuide::Compile(mqa::GrammarGuide::JsonObjectGrammar(), guide_vocab);
  if (!regex.ok() || !grammar.ok()) return 1;
  const std::string prefix = "{\"key\": \"";
  std::vector<int32_t> output;  // the prefix as byte-sized tokens, found in the vocabulary
  for (char c : prefix) {
    for (int32_t t = 1; t < vocab; ++t) {
      if (guide_vocab->bytes[t] == std::string(1, c)) {
        output.push_back(t);
        break;
      }
    }
  }
  // json_object as the depth-3 pattern (a DFA built at compile) and as the grammar (states found
  // as texts reach them): a state's mask the first time, then rows.
  const std::pair<const char*, std::shared_ptr<const mqa::Guide>> guides[] = {
      {"regex", *regex}, {"grammar", *grammar}};
  for (const auto& [kind, guide] : guides) {
    const int state = guide->Advance(mqa::Guide::start(), output);
    std::vector<float> scratch(logits.begin(), logits.begin() + vocab);
    const auto first = std::chrono::steady_clock::now();
    guide->Mask(state, absl::MakeSpan(scratch));  // the state's mask, computed once
    const double first_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - first).count();
    std::printf(
        "\nguided (json_object as a %s, inside a string; %zu prefix tokens found), us a "
        "row:\n",
        kind, output.size());
    std::printf("%-44s %9.1f   (once a state)\n", "a state's token mask, first use", first_us);
    for (const bool guided : {false, true}) {
      mqa::SamplingParams params = top_p;
      if (guided) params.guide = guide;
      mqa::SampleRng rng(3);
      report(guided ? "Sample top_p 0.95, guided" : "Sample top_p 0.95, unguided",
             BestMicrosPerRow(passes, rows, [&](int r) {
               mqa::SamplingContext context;
               context.params = &params;
               context.output_tokens = output;
               context.rng = &rng;
               return mqa::Sample(row(r), context).token_id;
             }));
    }
  }
  return 0;
}
