// The HTTP server for real: an Engine over the shared fake runner (logits a function of the token
// history), the fixture tokenizer, a server on 127.0.0.1 with an OS-chosen port, and
// httplib::Client as the client.
#include "runtime/http/server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "runtime/http/api_types.h"
#include "runtime/http/chat_template.h"
#include "runtime/version.h"
#include "tests/runtime/fake_runner.h"
#include "tests/runtime/http/prometheus_text.h"
#include "tests/source_dir.h"

namespace mqa {
namespace {

using json = nlohmann::json;

using testing::SourceDir;

const Tokenizer& FixtureTokenizer() {
  static const Tokenizer* tokenizer = [] {
    absl::StatusOr<Tokenizer> t =
        Tokenizer::FromFile(SourceDir() + "/tests/fixtures/tokenizer/tokenizer.json");
    MQA_CHECK_OK(t.status());
    return new Tokenizer(*std::move(t));
  }();
  return *tokenizer;
}

// The greedy continuation the fake model gives (argmax, first index on ties, EOS 0 stops).
std::vector<int32_t> GreedyReference(std::vector<int32_t> history, int max_tokens, int vocab) {
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    std::vector<float> logits = testing::ReferenceLogits(history, vocab);
    int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    history.push_back(next);
    if (next == 0) break;
  }
  return out;
}

// Beam search over the fake model, written out here as the oracle of BeamSearchJob: each beam's
// 2 x width best next tokens by log_softmax, scored cumulative log-probability / (prompt + output
// length) ^ length_penalty (EOS not counted), EOS endings set aside, the best `width` kept; the
// best `width` of all at the end. Returns (tokens, ended by EOS) best first.
std::vector<std::pair<std::vector<int32_t>, bool>> ReferenceBeamSearch(
    const std::vector<int32_t>& prompt, int width, int max_tokens, double length_penalty, int vocab,
    int32_t eos) {
  struct B {
    std::vector<int32_t> tokens;
    double logprob = 0;
    bool ended = false;
  };
  auto score = [&](const B& b) {
    const double length = static_cast<double>(prompt.size() + b.tokens.size() - (b.ended ? 1 : 0));
    return b.logprob / std::pow(length, length_penalty);
  };
  auto by_score = [&](const B& a, const B& b) { return score(a) > score(b); };
  std::vector<B> live = {B{}}, done;
  for (int step = 0; step < max_tokens && !live.empty(); ++step) {
    std::vector<B> next;
    for (const B& b : live) {
      std::vector<int32_t> history = prompt;
      history.insert(history.end(), b.tokens.begin(), b.tokens.end());
      const std::vector<float> logits = testing::ReferenceLogits(history, vocab);
      const double top = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (float l : logits) sum += std::exp(l - top);
      std::vector<int32_t> order(vocab);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t x, int32_t y) { return logits[x] > logits[y]; });
      for (int k = 0; k < 2 * width; ++k) {
        B c = b;
        c.tokens.push_back(order[k]);
        c.logprob += logits[order[k]] - top - std::log(sum);
        c.ended = order[k] == eos;
        (c.ended ? done : next).push_back(std::move(c));
      }
    }
    std::stable_sort(next.begin(), next.end(), by_score);
    if (next.size() > static_cast<size_t>(width)) next.resize(width);
    live = std::move(next);
  }
  done.insert(done.end(), live.begin(), live.end());
  std::stable_sort(done.begin(), done.end(), by_score);
  if (done.size() > static_cast<size_t>(width)) done.resize(width);
  std::vector<std::pair<std::vector<int32_t>, bool>> out;
  for (const B& b : done) out.push_back({b.tokens, b.ended});
  return out;
}

struct Sse {
  int status = 0;
  std::vector<json> chunks;
  bool done = false;
  std::string text;  // choice 0's text, concatenated
  std::vector<int32_t> token_ids;
  std::string error;  // the client's transport error, if any
  std::vector<std::string> events;  // `event:` names (the Responses API's), in order
};

struct TestSetup {
  ServerOptions server;
  EngineOptions engine;
  testing::FakeRunnerOptions runner;
  bool run_engine = true;
  bool ready = true;
  absl::Duration step_delay = absl::ZeroDuration();
  const Tokenizer* tokenizer = nullptr;  // null: FixtureTokenizer()
};

const json kReferenceChat = {{{"role", "system"}, {"content", "You write Python."}},
                             {{"role", "user"}, {"content", "def fib(n):"}}};

TestSetup DefaultSetup() {
  TestSetup setup;
  setup.server.port = 0;
  setup.server.served_model_name = "demo";
  setup.server.max_model_len = 128;
  setup.server.max_body_bytes = 64 << 10;
  setup.engine.max_model_len = 128;
  setup.engine.max_num_seqs = 128;
  setup.engine.eos_token_id = 0;
  setup.runner.vocab_size = static_cast<int>(FixtureTokenizer().vocab_size());
  setup.runner.num_blocks = 1024;
  setup.runner.block_size = 8;
  return setup;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(TestSetup setup) {
    setup_ = setup;
    auto runner = std::make_unique<testing::FakeRunner>(setup.runner);
    if (setup.step_delay > absl::ZeroDuration()) {
      runner->on_step = [delay = setup.step_delay](const StepInput&) { absl::SleepFor(delay); };
    }
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(std::move(runner), setup.engine);
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    if (setup.run_engine) StartEngine();
    server_ = std::make_unique<HttpServer>(
        setup.server, engine_.get(),
        setup.tokenizer != nullptr ? setup.tokenizer : &FixtureTokenizer());
    ASSERT_TRUE(server_->Start().ok());
    if (setup.ready) server_->SetReady();
  }

  void StartEngine() {
    engine_thread_ = std::thread([this] { run_status_ = engine_->Run(); });
  }

  void TearDown() override {
    if (server_) server_->Stop();
    if (engine_) engine_->Stop();
    if (engine_thread_.joinable()) engine_thread_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_;
  }

  std::unique_ptr<httplib::Client> Client() {
    auto client = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client->set_read_timeout(30, 0);
    if (!setup_.server.api_key.empty()) {
      httplib::Headers headers;
      headers.emplace("Authorization", "Bearer " + setup_.server.api_key);
      client->set_default_headers(headers);
    }
    return client;
  }

  // POSTs `body` (sent verbatim when a string) and returns the status and parsed JSON body.
  json Post(const std::string& path, const std::string& body, int* status) {
    auto client = Client();
    httplib::Result result = client->Post(path.c_str(), body, "application/json");
    EXPECT_TRUE(result) << path << ": " << httplib::to_string(result.error());
    if (!result) return json();
    *status = result->status;
    json parsed = json::parse(result->body, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << result->body;
    return parsed;
  }
  json PostOk(const std::string& path, const json& body) {
    int status = 0;
    json response = Post(path, body.dump(), &status);
    EXPECT_EQ(status, 200) << body.dump() << " -> " << response.dump();
    return response;
  }

  // Streams a completion (or a TGI generation: `path`). `stop_after_chunks` > 0 closes the
  // connection after that many chunks.
  Sse Stream(const json& body, int stop_after_chunks = 0,
             const std::string& path = "/v1/completions") {
    Sse sse;
    auto client = Client();
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    std::string pending;
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      pending.append(data, len);
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        std::string event = pending.substr(0, end);
        pending.erase(0, end + 2);
        for (absl::string_view line : absl::StrSplit(event, '\n')) {
          if (line.empty() || line[0] == ':') continue;  // SSE comment (keep-alive)
          if (absl::StartsWith(line, "event:")) {
            sse.events.emplace_back(absl::StripLeadingAsciiWhitespace(line.substr(6)));
            continue;
          }
          EXPECT_TRUE(absl::StartsWith(line, "data:")) << line;
          absl::string_view payload = absl::StripLeadingAsciiWhitespace(line.substr(5));
          if (payload == "[DONE]") {
            sse.done = true;
            continue;
          }
          json chunk = json::parse(payload, nullptr, false);
          EXPECT_FALSE(chunk.is_discarded()) << payload;
          if (chunk.contains("choices")) {
            for (const json& choice : chunk["choices"]) {
              if (choice["index"] != 0) continue;
              if (choice.contains("text")) sse.text += choice["text"].get<std::string>();
              if (choice.contains("token_ids")) {
                for (const json& id : choice["token_ids"]) sse.token_ids.push_back(id);
              }
            }
          }
          sse.chunks.push_back(std::move(chunk));
        }
      }
      return stop_after_chunks == 0 || static_cast<int>(sse.chunks.size()) < stop_after_chunks;
    };
    httplib::Response res;
    httplib::Error error = httplib::Error::Success;
    client->send(req, res, error);
    sse.status = res.status;
    sse.error = httplib::to_string(error);
    return sse;
  }

  // The generation APIs' tests' prompt and the fake model's 5-token greedy continuation.
  struct GreedyCase {
    int vocab;
    std::string inputs;
    std::vector<int32_t> prompt, greedy;
  };
  GreedyCase FiveGreedyTokens() const {
    GreedyCase c{.vocab = setup_.runner.vocab_size, .inputs = "def add(a, b):\n    return "};
    c.prompt = FixtureTokenizer().Encode(c.inputs);
    c.greedy = GreedyReference(c.prompt, 5, c.vocab);
    return c;
  }

  // A chat template of role headers ("<|role|>\n" + content + EOS; a continued last message
  // without its EOS), for the APIs read as chat requests.
  static TestSetup WithRoleTemplate(TestSetup setup) {
    auto parsed = ChatTemplate::Parse(
        "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] }}"
        "{% if not (loop.last and continue_final_message) %}{{ eos_token }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}");
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    setup.server.chat_template = std::make_shared<const ChatTemplate>(*std::move(parsed));
    setup.server.eos_token = "<|endoftext|>";
    return setup;
  }
  // kReferenceChat's greedy 6-token chat completion (EOS ignored), which the other APIs must
  // answer alike.
  json ReferenceChat() {
    json chat = PostOk("/v1/chat/completions", {{"messages", kReferenceChat},
                                                {"max_tokens", 6},
                                                {"temperature", 0},
                                                {"ignore_eos", true}});
    EXPECT_FALSE(chat["choices"][0]["message"]["content"].get<std::string>().empty());
    return chat;
  }

  testing::PrometheusPage Metrics() {
    httplib::Client client("127.0.0.1", server_->port());
    httplib::Result result = client.Get("/metrics");
    EXPECT_TRUE(result && result->status == 200);
    if (!result) return {};
    absl::StatusOr<testing::PrometheusPage> page = testing::ParsePrometheusText(result->body);
    EXPECT_TRUE(page.ok()) << page.status();
    return page.ok() ? *page : testing::PrometheusPage{};
  }
  double Metric(const testing::PrometheusPage& page, const std::string& name,
                const std::string& extra_labels = "") {
    std::string key = absl::StrCat(name, "{model_name=\"demo\"", extra_labels, "}");
    auto it = page.samples.find(key);
    EXPECT_NE(it, page.samples.end()) << key;
    return it == page.samples.end() ? -1 : it->second;
  }
  // Polls /metrics until the engine is idle with every KV block free; returns the time it took.
  absl::Duration WaitIdle(absl::Duration limit) {
    const absl::Time start = absl::Now();
    while (absl::Now() - start < limit) {
      testing::PrometheusPage page = Metrics();
      if (Metric(page, "mqaserve_kv_cache_usage_perc") == 0 &&
          Metric(page, "mqaserve_num_requests_running") == 0 &&
          Metric(page, "mqaserve_num_requests_waiting") == 0) {
        return absl::Now() - start;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::InfiniteDuration();
  }

  TestSetup setup_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<HttpServer> server_;
  std::thread engine_thread_;
  absl::Status run_status_;
};

std::string RandomCode(std::mt19937_64& rng) {
  static const char* kWords[] = {"def",    "return", "self",  "x",      "=",  "+",
                                 "for",    "in",     "range", "(",      ")",  ":",
                                 "\n    ", "if",     "None",  "import", "os", "1"};
  std::string s;
  const int n = 3 + static_cast<int>(rng() % 12);
  for (int i = 0; i < n; ++i) absl::StrAppend(&s, kWords[rng() % std::size(kWords)], " ");
  return s;
}

TEST_F(HttpServerTest, PlainAndStreamedGreedyCompletionsAgreeWithTheModel) {
  Start(DefaultSetup());
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 3; ++trial) {
    const std::string prompt = RandomCode(rng);
    const int max_tokens = 5 + static_cast<int>(rng() % 20);
    json body = {{"model", "demo"},
                 {"prompt", prompt},
                 {"max_tokens", max_tokens},
                 {"temperature", 0},
                 {"return_token_ids", true}};
    json plain = PostOk("/v1/completions", body);
    ASSERT_EQ(plain["choices"].size(), 1u);
    const json& choice = plain["choices"][0];
    std::vector<int32_t> prompt_ids = FixtureTokenizer().Encode(prompt);
    EXPECT_EQ(choice["prompt_token_ids"].get<std::vector<int32_t>>(), prompt_ids);
    std::vector<int32_t> expected =
        GreedyReference(prompt_ids, max_tokens, setup_.runner.vocab_size);
    EXPECT_EQ(choice["token_ids"].get<std::vector<int32_t>>(), expected);
    EXPECT_EQ(choice["finish_reason"], expected.back() == 0 ? "stop" : "length");
    EXPECT_EQ(plain["usage"]["prompt_tokens"], prompt_ids.size());
    EXPECT_EQ(plain["usage"]["completion_tokens"], expected.size());
    EXPECT_EQ(plain["usage"]["total_tokens"], prompt_ids.size() + expected.size());
    EXPECT_EQ(plain["object"], "text_completion");
    EXPECT_EQ(plain["model"], "demo");
    EXPECT_TRUE(absl::StartsWith(plain["id"].get<std::string>(), "cmpl-"));

    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    Sse sse = Stream(body);
    EXPECT_EQ(sse.status, 200);
    EXPECT_TRUE(sse.done);
    EXPECT_EQ(sse.text, choice["text"].get<std::string>());
    EXPECT_EQ(sse.token_ids, expected);
    ASSERT_GE(sse.chunks.size(), 2u);
    EXPECT_EQ(sse.chunks.back()["usage"], plain["usage"]);  // the usage chunk comes last
    EXPECT_TRUE(sse.chunks.back()["choices"].empty());
    EXPECT_EQ(sse.chunks[sse.chunks.size() - 2]["choices"][0]["finish_reason"],
              choice["finish_reason"]);

    // vLLM's continuous_usage_stats: every chunk carries the usage so far.
    body["stream_options"]["continuous_usage_stats"] = true;
    Sse running = Stream(body);
    ASSERT_TRUE(running.done);
    int64_t seen = 0;
    for (const json& chunk : running.chunks) {
      ASSERT_TRUE(chunk["usage"].is_object()) << chunk;
      EXPECT_EQ(chunk["usage"]["prompt_tokens"], prompt_ids.size());
      const int64_t completion = chunk["usage"]["completion_tokens"];
      EXPECT_GE(completion, seen);
      seen = completion;
      if (!chunk["choices"].empty() && chunk["choices"][0].contains("token_ids")) {
        // A chunk's usage counts its own tokens.
        EXPECT_GE(completion, static_cast<int64_t>(chunk["choices"][0]["token_ids"].size()));
      }
    }
    EXPECT_EQ(running.chunks.back()["usage"], plain["usage"]);
  }
}

TEST_F(HttpServerTest, ListPromptsWithTwoSamplesEach) {
  Start(DefaultSetup());
  const std::vector<std::string> prompts = {"def add(a, b):", "class Stack:\n    def"};
  json body = {{"prompt", prompts},  {"n", 2},     {"max_tokens", 12},
               {"temperature", 0.9}, {"seed", 77}, {"return_token_ids", true}};
  json response = PostOk("/v1/completions", body);
  ASSERT_EQ(response["choices"].size(), 4u);
  int64_t completion_tokens = 0;
  for (int i = 0; i < 4; ++i) {
    const json& choice = response["choices"][i];
    EXPECT_EQ(choice["index"], i);
    EXPECT_EQ(choice["prompt_token_ids"].get<std::vector<int32_t>>(),
              FixtureTokenizer().Encode(prompts[i / 2]));
    EXPECT_EQ(choice["finish_reason"], "length");  // EOS is rare under the fake model
    EXPECT_EQ(choice["token_ids"].size(), 12u);
    completion_tokens += choice["token_ids"].size();
  }
  // Sampled (not greedy) and independent: the two samples of a prompt differ.
  EXPECT_NE(response["choices"][0]["token_ids"], response["choices"][1]["token_ids"]);
  EXPECT_EQ(response["usage"]["completion_tokens"], completion_tokens);
  // The same seed gives the same samples, streamed or not, token-id prompts or text.
  json ids_body = body;
  ids_body["prompt"] = {FixtureTokenizer().Encode(prompts[0]),
                        FixtureTokenizer().Encode(prompts[1])};
  json again = PostOk("/v1/completions", ids_body);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(again["choices"][i]["token_ids"], response["choices"][i]["token_ids"]) << i;
  }
}

TEST_F(HttpServerTest, EveryBadInputIsRefusedAndTheNextRequestSucceeds) {
  Start(DefaultSetup());
  struct Case {
    std::string body;
    int status;
    std::string param;
  };
  const std::string long_prompt(100, 'x');
  const std::vector<Case> cases = {
      {"{\"prompt\": \"a\"", 400, ""},
      {"[\"prompt\"]", 400, ""},
      {"{\"prompt\": \"\xc3\x28\"}", 400, ""},
      {"{\"prompt\": 12}", 400, "prompt"},
      {"{\"prompt\": \"\"}", 400, "prompt"},
      {"{\"prompt\": [5, 4097]}", 400, "prompt"},
      {"{\"prompt\": [[1], [99999]]}", 400, "prompt"},
      {"{\"prompt\": \"a\", \"max_tokens\": 128, \"temperature\": 0}", 400, "max_tokens"},
      {json({{"prompt", std::vector<int32_t>(120, 7)}, {"max_tokens", 9}}).dump(), 400,
       "max_tokens"},
      {"{\"prompt\": \"a\", \"temperature\": -1}", 400, "temperature"},
      {"{\"prompt\": \"a\", \"top_p\": 0}", 400, "top_p"},
      {"{\"prompt\": \"a\", \"n\": 0}", 400, "n"},
      {"{\"prompt\": \"a\", \"max_tokens\": -3}", 400, "max_tokens"},
      {"{\"prompt\": \"a\", \"max_tokens\": 0}", 400, "max_tokens"},
      {"{\"prompt\": \"a\", \"max_tokens\": \"4\"}", 400, "max_tokens"},
      {"{\"prompt\": \"a\", \"model\": \"gpt-4\"}", 404, "model"},
      {json({{"prompt", std::string(70 << 10, 'y')}}).dump(), 413, ""},
  };
  for (const Case& c : cases) {
    int status = 0;
    json error = Post("/v1/completions", c.body, &status);
    EXPECT_EQ(status, c.status) << c.body.substr(0, 200) << " -> " << error.dump();
    ASSERT_TRUE(error.contains("error")) << error.dump();
    EXPECT_TRUE(error["error"]["message"].is_string());
    EXPECT_TRUE(error["error"]["type"].is_string());
    EXPECT_TRUE(error["error"].contains("code"));
    if (c.param.empty()) {
      EXPECT_TRUE(error["error"]["param"].is_null()) << error.dump();
    } else {
      EXPECT_EQ(error["error"]["param"], c.param) << error.dump();
    }
    if (c.param == "max_tokens" && c.body.find("128") != std::string::npos) {
      // Both numbers: the context limit and what the request needs.
      const std::string message = error["error"]["message"];
      EXPECT_NE(message.find("128"), std::string::npos) << message;
      EXPECT_NE(message.find("129"), std::string::npos) << message;
    }
    // The server keeps serving.
    json ok = PostOk("/v1/completions", {{"prompt", "x = 1"}, {"max_tokens", 2}});
    EXPECT_FALSE(ok["choices"][0].contains("token_ids"));  // only with return_token_ids
  }
  // Unknown routes and methods also answer in OpenAI's shape.
  auto client = Client();
  httplib::Result missing = client->Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  EXPECT_TRUE(json::parse(missing->body).contains("error"));
  EXPECT_EQ(WaitIdle(absl::Seconds(2)) < absl::Seconds(2), true);
}

TEST_F(HttpServerTest, FullWaitingQueueGives429) {
  TestSetup setup = DefaultSetup();
  setup.engine.max_queued_requests = 2;
  setup.run_engine = false;  // requests stay queued until the engine starts
  Start(setup);
  std::vector<std::thread> waiting;
  std::vector<int> statuses(2, 0);
  for (int i = 0; i < 2; ++i) {
    waiting.emplace_back([&, i] {
      Post("/v1/completions", json({{"prompt", "a"}, {"max_tokens", 3}}).dump(), &statuses[i]);
    });
  }
  const absl::Time start = absl::Now();
  while (engine_->metrics().num_waiting < 2 && absl::Now() - start < absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  int status = 0;
  json error = Post("/v1/completions", json({{"prompt", "b"}, {"max_tokens", 3}}).dump(), &status);
  EXPECT_EQ(status, 429) << error.dump();
  EXPECT_EQ(error["error"]["type"], "rate_limit_error");
  StartEngine();
  for (std::thread& t : waiting) t.join();
  EXPECT_EQ(statuses, (std::vector<int>{200, 200}));
  PostOk("/v1/completions", {{"prompt", "c"}, {"max_tokens", 3}});
}

TEST_F(HttpServerTest, SixtyFourConcurrentStreamsLoseNothing) {
  Start(DefaultSetup());
  constexpr int kClients = 64;
  const double tokens_before = Metric(Metrics(), "mqaserve_generation_tokens_total");
  std::vector<json> bodies(kClients);
  std::vector<Sse> results(kClients);
  std::mt19937_64 rng(3);
  for (int i = 0; i < kClients; ++i) {
    bodies[i] = {{"prompt", RandomCode(rng)},
                 {"max_tokens", 8 + i % 9},
                 {"temperature", 0.8},
                 {"seed", 1000 + i},
                 {"return_token_ids", true},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] { results[i] = Stream(bodies[i]); });
  }
  for (std::thread& t : threads) t.join();
  int64_t streamed_tokens = 0;
  for (int i = 0; i < kClients; ++i) {
    const Sse& r = results[i];
    EXPECT_EQ(r.status, 200) << i << " " << r.error;
    EXPECT_TRUE(r.done) << i;
    ASSERT_FALSE(r.chunks.empty()) << i;
    const json& usage = r.chunks.back()["usage"];
    EXPECT_EQ(usage["completion_tokens"], r.token_ids.size()) << i;
    EXPECT_LE(r.token_ids.size(), bodies[i]["max_tokens"].get<size_t>());
    streamed_tokens += r.token_ids.size();
  }
  // Every generated token reached its client, and the seeded samples are what a lone plain
  // request gets (batching changes nothing).
  const absl::Time start = absl::Now();
  while (Metric(Metrics(), "mqaserve_generation_tokens_total") - tokens_before < streamed_tokens &&
         absl::Now() - start < absl::Seconds(1)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(Metric(Metrics(), "mqaserve_generation_tokens_total") - tokens_before, streamed_tokens);
  for (int i = 0; i < kClients; i += 7) {
    json plain_body = bodies[i];
    plain_body.erase("stream");
    plain_body.erase("stream_options");
    json plain = PostOk("/v1/completions", plain_body);
    EXPECT_EQ(plain["choices"][0]["text"], results[i].text) << i;
    EXPECT_EQ(plain["choices"][0]["token_ids"].get<std::vector<int32_t>>(), results[i].token_ids);
  }
  EXPECT_LT(WaitIdle(absl::Seconds(1)), absl::Seconds(1)) << "KV blocks still in use";
}

TEST_F(HttpServerTest, ClientDisconnectMidStreamFreesBlocksWithinASecond) {
  TestSetup setup = DefaultSetup();
  setup.step_delay = absl::Milliseconds(5);  // 100 tokens take ~0.5 s or more
  Start(setup);
  const double aborts_before =
      Metric(Metrics(), "mqaserve_request_success_total", ",finished_reason=\"abort\"");
  json body = {{"prompt", "while True:"},
               {"max_tokens", 100},
               {"ignore_eos", true},
               {"temperature", 0},
               {"stream", true}};
  Sse sse = Stream(body, /*stop_after_chunks=*/3);
  const absl::Time gone = absl::Now();
  EXPECT_FALSE(sse.done);
  EXPECT_EQ(sse.chunks.size(), 3u);
  const absl::Duration idle_after = WaitIdle(absl::Seconds(1));
  EXPECT_LT(idle_after, absl::Seconds(1)) << "blocks not released after the client left";
  testing::PrometheusPage page = Metrics();
  EXPECT_EQ(Metric(page, "mqaserve_request_success_total", ",finished_reason=\"abort\""),
            aborts_before + 1);
  EXPECT_LT(Metric(page, "mqaserve_generation_tokens_total"), 100) << "ran to the end";
  EXPECT_LT(absl::Now() - gone, absl::Seconds(2));
}

// The same through TGI's stream: a client that leaves mid-stream frees its blocks at once.
TEST_F(HttpServerTest, TgiClientDisconnectMidStreamFreesBlocks) {
  TestSetup setup = DefaultSetup();
  setup.step_delay = absl::Milliseconds(5);
  Start(setup);
  json body = {{"inputs", "while True:"}, {"parameters", {{"max_new_tokens", 100}}}};
  Sse sse = Stream(body, /*stop_after_chunks=*/3, "/generate_stream");
  EXPECT_EQ(sse.chunks.size(), 3u);
  EXPECT_EQ(sse.chunks.back()["index"], 3);
  EXPECT_LT(WaitIdle(absl::Seconds(1)), absl::Seconds(1)) << "blocks not released";
  EXPECT_LT(Metric(Metrics(), "mqaserve_generation_tokens_total"), 100) << "ran to the end";
}

// Streamed tokens are small writes a few ms apart: under Nagle's algorithm each one waits for the
// client's (delayed, up to 40 ms) ACK of the one before, which on the H200 held every stream's
// first token back by ~30 ms. The server's end of a connection must have TCP_NODELAY.
TEST_F(HttpServerTest, ConnectionsHaveNagleOff) {
  Start(DefaultSetup());
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(client, 0);
  sockaddr_in server_addr{};
  server_addr.sin_family = AF_INET;
  server_addr.sin_port = htons(static_cast<uint16_t>(server_->port()));
  server_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&server_addr), sizeof(server_addr)), 0);
  const std::string request = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_EQ(::send(client, request.data(), request.size(), 0),
            static_cast<ssize_t>(request.size()));
  char reply[256];
  ASSERT_GT(::recv(client, reply, sizeof(reply), 0), 0);  // accepted and served
  sockaddr_in mine{};
  socklen_t len = sizeof(mine);
  ASSERT_EQ(::getsockname(client, reinterpret_cast<sockaddr*>(&mine), &len), 0);
  // The server runs in this process: find its end of the connection among our descriptors.
  int server_end = -1;
  DIR* dir = ::opendir("/proc/self/fd");
  ASSERT_NE(dir, nullptr);
  while (dirent* entry = ::readdir(dir)) {
    const int fd = std::atoi(entry->d_name);
    if (fd == client || entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    sockaddr_in local{}, peer{};
    socklen_t a = sizeof(local), b = sizeof(peer);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &a) != 0 ||
        ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &b) != 0 ||
        local.sin_family != AF_INET) {
      continue;
    }
    if (local.sin_port == server_addr.sin_port && peer.sin_port == mine.sin_port) server_end = fd;
  }
  ::closedir(dir);
  ASSERT_GE(server_end, 0) << "the server's socket of this connection was not found";
  int nodelay = 0;
  len = sizeof(nodelay);
  ASSERT_EQ(::getsockopt(server_end, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0);
  EXPECT_NE(nodelay, 0) << "Nagle's algorithm is on for the server's connections";
  ::close(client);
}

TEST_F(HttpServerTest, ClientLeavingANonStreamingRequestAbortsIt) {
  TestSetup setup = DefaultSetup();
  setup.step_delay = absl::Milliseconds(5);
  Start(setup);
  const double aborts_before =
      Metric(Metrics(), "mqaserve_request_success_total", ",finished_reason=\"abort\"");
  httplib::Client impatient("127.0.0.1", server_->port());
  impatient.set_read_timeout(0, 150000);  // gives up (and closes) long before 100 tokens
  httplib::Result result = impatient.Post(
      "/v1/completions", json({{"prompt", "x"}, {"max_tokens", 100}, {"ignore_eos", true}}).dump(),
      "application/json");
  EXPECT_FALSE(result);
  impatient.stop();
  EXPECT_LT(WaitIdle(absl::Seconds(1)), absl::Seconds(1)) << "blocks not released";
  testing::PrometheusPage page = Metrics();
  EXPECT_EQ(Metric(page, "mqaserve_request_success_total", ",finished_reason=\"abort\""),
            aborts_before + 1);
  EXPECT_LT(Metric(page, "mqaserve_generation_tokens_total"), 100);
}

TEST_F(HttpServerTest, ApiKeyGuardsEverythingButHealthAndMetrics) {
  TestSetup setup = DefaultSetup();
  setup.server.api_key = "s3cret-key";
  Start(setup);
  httplib::Client anonymous("127.0.0.1", server_->port());
  const std::string body = json({{"prompt", "x"}, {"max_tokens", 2}}).dump();
  for (const char* path : {"/v1/completions", "/v1/infill", "/tokenize", "/detokenize"}) {
    httplib::Result r = anonymous.Post(path, body, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error");
  }
  httplib::Result models = anonymous.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 401);
  httplib::Result wrong = anonymous.Post(
      "/v1/completions", {{"Authorization", "Bearer s3cret-kez"}}, body, "application/json");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(anonymous.Get("/health")->status, 200);
  EXPECT_EQ(anonymous.Get("/metrics")->status, 200);
  PostOk("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});  // with the key
}

std::string TlsFile(const char* name) { return SourceDir() + "/tests/runtime/http/tls/" + name; }

// An HTTPS client of the test server that trusts the test CA (and checks the server's name),
// presenting `cert` / `key` when given.
std::unique_ptr<httplib::SSLClient> TlsClient(int port, const char* cert = nullptr,
                                              const char* key = nullptr) {
  std::unique_ptr<httplib::SSLClient> client =
      cert != nullptr
          ? std::make_unique<httplib::SSLClient>("127.0.0.1", port, TlsFile(cert), TlsFile(key))
          : std::make_unique<httplib::SSLClient>("127.0.0.1", port);
  client->set_ca_cert_path(TlsFile("ca.pem").c_str());
  client->enable_server_certificate_verification(true);
  client->set_read_timeout(30, 0);
  client->set_connection_timeout(5, 0);
  return client;
}

// --ssl-certfile / --ssl-keyfile: the server speaks TLS with that certificate (a client that
// verifies it against the CA gets answers, completions included), and nothing in plain HTTP.
TEST_F(HttpServerTest, ServesHttpsWithTheGivenCertificate) {
  TestSetup setup = DefaultSetup();
  setup.server.ssl_certfile = TlsFile("server.pem");
  setup.server.ssl_keyfile = TlsFile("server-key.pem");
  Start(setup);
  auto tls = TlsClient(server_->port());
  httplib::Result health = tls->Get("/health");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  httplib::Result done = tls->Post(
      "/v1/completions", json({{"prompt", "x"}, {"max_tokens", 3}}).dump(), "application/json");
  ASSERT_TRUE(done) << httplib::to_string(done.error());
  EXPECT_EQ(done->status, 200) << done->body;
  EXPECT_EQ(json::parse(done->body)["usage"]["completion_tokens"], 3) << done->body;
  httplib::Client plain("127.0.0.1", server_->port());
  plain.set_read_timeout(5, 0);
  httplib::Result refused = plain.Get("/health");
  EXPECT_FALSE(refused && refused->status == 200) << "plain HTTP answered on the TLS port";
  // A client that does not trust the test CA refuses the server's certificate.
  httplib::SSLClient untrusting("127.0.0.1", server_->port());
  untrusting.enable_server_certificate_verification(true);
  untrusting.set_ca_cert_path(TlsFile("rogue.pem").c_str());
  EXPECT_FALSE(untrusting.Get("/health"));
}

// --ssl-ca-certs: only clients with a certificate the CA signed are served.
TEST_F(HttpServerTest, MutualTlsServesOnlyClientsTheCaSigned) {
  TestSetup setup = DefaultSetup();
  setup.server.ssl_certfile = TlsFile("server.pem");
  setup.server.ssl_keyfile = TlsFile("server-key.pem");
  setup.server.ssl_ca_certs = TlsFile("ca.pem");
  Start(setup);
  httplib::Result signed_client =
      TlsClient(server_->port(), "client.pem", "client-key.pem")->Get("/health");
  ASSERT_TRUE(signed_client) << httplib::to_string(signed_client.error());
  EXPECT_EQ(signed_client->status, 200);
  EXPECT_FALSE(TlsClient(server_->port())->Get("/health"))
      << "served a client without a certificate";
  EXPECT_FALSE(TlsClient(server_->port(), "rogue.pem", "rogue-key.pem")->Get("/health"))
      << "served a client whose certificate the CA did not sign";
}

// Unusable TLS settings are refused before anything is served, naming the file or flag.
TEST(HttpServerTls, RefusesUnusableSettingsNamingThem) {
  auto problem = [](const char* cert, const char* key, const char* ca) {
    ServerOptions o;
    o.ssl_certfile = cert != nullptr ? TlsFile(cert) : "";
    o.ssl_keyfile = key != nullptr ? TlsFile(key) : "";
    o.ssl_ca_certs = ca != nullptr ? TlsFile(ca) : "";
    return CheckServerTls(o);
  };
  EXPECT_TRUE(problem(nullptr, nullptr, nullptr).ok());
  EXPECT_TRUE(problem("server.pem", "server-key.pem", nullptr).ok());
  EXPECT_TRUE(problem("server.pem", "server-key.pem", "ca.pem").ok());
  absl::Status s = problem("server.pem", nullptr, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s) && absl::StrContains(s.message(), "--ssl-keyfile")) << s;
  s = problem(nullptr, nullptr, "ca.pem");
  EXPECT_TRUE(absl::IsInvalidArgument(s) && absl::StrContains(s.message(), "--ssl-certfile")) << s;
  s = problem("server.pem", "missing-key.pem", nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(s) && absl::StrContains(s.message(), "missing-key.pem")) << s;
  s = problem("server.pem", "client-key.pem", nullptr);  // another certificate's key
  EXPECT_TRUE(absl::IsInvalidArgument(s) && absl::StrContains(s.message(), "does not match")) << s;
  s = problem("README.md", "server-key.pem", nullptr);  // not a certificate
  EXPECT_TRUE(absl::IsInvalidArgument(s) && absl::StrContains(s.message(), "README.md")) << s;
  // HttpServer::Start refuses them the same way.
  ServerOptions o;
  o.port = 0;
  o.ssl_certfile = TlsFile("server.pem");
  o.ssl_keyfile = TlsFile("client-key.pem");
  const TestSetup setup = DefaultSetup();
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::make_unique<testing::FakeRunner>(setup.runner), setup.engine);
  ASSERT_TRUE(engine.ok()) << engine.status();
  HttpServer server(o, engine->get(), &FixtureTokenizer());
  s = server.Start();
  EXPECT_TRUE(absl::IsInvalidArgument(s) && absl::StrContains(s.message(), "client-key.pem")) << s;
}

// /invocations (SageMaker's inference route, as TGI and vLLM serve it): the body's shape picks the
// API — "messages" a chat completion, "prompt" a completion, "inputs" TGI's generate — each
// answered as its own route answers; anything else is a 400 naming what is expected.
TEST_F(HttpServerTest, InvocationsRoutesByTheBodysShape) {
  Start(WithRoleTemplate(DefaultSetup()));
  const json chat = ReferenceChat();
  const json via_chat = PostOk(
      "/invocations",
      {{"messages", kReferenceChat}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(via_chat["object"], "chat.completion") << via_chat.dump();
  EXPECT_EQ(via_chat["choices"][0]["message"]["content"], chat["choices"][0]["message"]["content"]);
  const json completion = {{"prompt", "def f("}, {"max_tokens", 4}, {"temperature", 0}};
  const json direct = PostOk("/v1/completions", completion);
  const json via_completion = PostOk("/invocations", completion);
  EXPECT_EQ(via_completion["object"], "text_completion") << via_completion.dump();
  EXPECT_EQ(via_completion["choices"][0]["text"], direct["choices"][0]["text"]);
  const json tgi = {{"inputs", "def f("}, {"parameters", {{"max_new_tokens", 4}}}};
  int status = 0;
  const json root = Post("/", tgi.dump(), &status);
  ASSERT_EQ(status, 200) << root.dump();
  const json via_tgi = Post("/invocations", tgi.dump(), &status);
  ASSERT_EQ(status, 200) << via_tgi.dump();
  EXPECT_EQ(via_tgi, root);
  for (const char* bad : {R"({"text": "x"})", "[1, 2]", "not json"}) {
    const json error = Post("/invocations", bad, &status);
    EXPECT_EQ(status, 400) << bad;
    EXPECT_TRUE(absl::StrContains(error["error"]["message"].get<std::string>(), "/invocations"))
        << error.dump();
  }
}

TEST_F(HttpServerTest, HealthFollowsReadinessAndFailure) {
  TestSetup setup = DefaultSetup();
  setup.ready = false;
  Start(setup);
  httplib::Client client("127.0.0.1", server_->port());
  EXPECT_EQ(client.Get("/health")->status, 503);
  int status = 0;
  Post("/v1/completions", json({{"prompt", "x"}}).dump(), &status);
  EXPECT_EQ(status, 503);
  server_->SetReady();
  EXPECT_EQ(client.Get("/health")->status, 200);
  PostOk("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
  server_->SetFailed(absl::InternalError("rank 1 died"));
  httplib::Result health = client.Get("/health");
  EXPECT_EQ(health->status, 503);
  json error = Post("/v1/completions", json({{"prompt", "x"}}).dump(), &status);
  EXPECT_EQ(status, 503);
  EXPECT_NE(error["error"]["message"].get<std::string>().find("rank 1 died"), std::string::npos);
}

TEST_F(HttpServerTest, ModelsTokenizeDetokenize) {
  Start(DefaultSetup());
  auto client = Client();
  json models = json::parse(client->Get("/v1/models")->body);
  EXPECT_EQ(models["data"][0]["id"], "demo");
  int chat_status = 0;
  json chat =
      Post("/v1/chat/completions",
           json({{"messages", {{{"role", "user"}, {"content", "hi"}}}}}).dump(), &chat_status);
  // No chat template (none given, none in the tokenizer's config): a 400 that says what to do.
  EXPECT_EQ(chat_status, 400);
  EXPECT_TRUE(absl::StrContains(chat["error"]["message"].get<std::string>(), "--chat-template"))
      << chat;
  const std::string text = "def hello(name):\n    print(f'hi {name}') # ünïcode";
  json tokens = PostOk("/tokenize", {{"prompt", text}});
  std::vector<int32_t> expected = FixtureTokenizer().Encode(text);
  EXPECT_EQ(tokens["tokens"].get<std::vector<int32_t>>(), expected);
  EXPECT_EQ(tokens["count"], expected.size());
  EXPECT_EQ(tokens["max_model_len"], 128);
  json back = PostOk("/detokenize", {{"tokens", expected}});
  EXPECT_EQ(back["prompt"], text);
  EXPECT_EQ(back["content"], text);  // llama.cpp's name
  EXPECT_EQ(PostOk("/tokenize", {{"content", text}})["tokens"], tokens["tokens"]);
  int status = 0;
  json error = Post("/detokenize", json({{"tokens", {1, 5000}}}).dump(), &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "tokens");
  Post("/tokenize", json({{"prompt", "x"}, {"model", "other"}}).dump(), &status);
  EXPECT_EQ(status, 404);
}

// OpenAI's retrieve-model (GET /v1/models/{model}) for each served name and a 404 otherwise;
// vLLM's /version; llama.cpp's /props with its sampling defaults and limits; all behind the key.
TEST_F(HttpServerTest, RetrieveModelVersionAndProps) {
  TestSetup setup = DefaultSetup();
  setup.server.model_aliases = {"demo-alias"};
  setup.server.api_key = "k";
  setup.server.bos_token = "<|endoftext|>";
  Start(setup);
  auto client = Client();  // sends the key
  httplib::Client keyless("127.0.0.1", server_->port());
  const httplib::Headers auth = {{"Authorization", "Bearer k"}};
  for (const std::string name : {"demo", "demo-alias"}) {
    auto got = client->Get("/v1/models/" + name, auth);
    ASSERT_EQ(got->status, 200) << name;
    json model = json::parse(got->body);
    EXPECT_EQ(model["id"], name);
    EXPECT_EQ(model["object"], "model");
    EXPECT_EQ(model["max_model_len"], 128);
  }
  auto missing = client->Get("/v1/models/other", auth);
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(json::parse(missing->body)["error"]["param"], "model");
  EXPECT_EQ(keyless.Get("/v1/models/demo")->status, 401);

  auto version = keyless.Get("/version");  // as vLLM: no key needed
  ASSERT_EQ(version->status, 200);
  EXPECT_EQ(json::parse(version->body)["version"], kMqaserveVersion);

  EXPECT_EQ(keyless.Get("/props")->status, 401);
  auto props_reply = client->Get("/props", auth);
  ASSERT_EQ(props_reply->status, 200);
  json props = json::parse(props_reply->body);
  EXPECT_EQ(props["total_slots"], 128);
  EXPECT_EQ(props["model_alias"], "demo");
  EXPECT_EQ(props["bos_token"], "<|endoftext|>");
  const json& settings = props["default_generation_settings"];
  EXPECT_EQ(settings["n_ctx"], 128);
  EXPECT_EQ(settings["n_predict"], -1);
  EXPECT_EQ(settings["top_k"], 40);  // llama.cpp's defaults, as /completion samples with them
  EXPECT_FLOAT_EQ(settings["temperature"].get<float>(), 0.8f);
  EXPECT_EQ(settings["params"]["top_k"], 40);
}

// A model whose tokenizer has no fill-in-the-middle tokens (the fixture's, renamed): /v1/infill and
// a completion's suffix are refused with a 400 that names the field and says why; plain
// completions still run.
TEST_F(HttpServerTest, NoFimTokensRefusesInfillAndSuffix) {
  static const Tokenizer* no_fim = [] {
    std::ifstream in(SourceDir() + "/tests/fixtures/tokenizer/tokenizer.json");
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<Tokenizer> t =
        Tokenizer::FromJson(absl::StrReplaceAll(text.str(), {{"<fim_", "<fxm_"}}), "no-fim");
    MQA_CHECK_OK(t.status());
    return new Tokenizer(*std::move(t));
  }();
  ASSERT_FALSE(no_fim->fim_tokens().has_value());
  TestSetup setup = DefaultSetup();
  setup.tokenizer = no_fim;
  Start(setup);
  for (const auto& [path, body, param] :
       {std::tuple<const char*, json, const char*>{
            "/v1/infill", {{"input_prefix", "def f("}, {"input_suffix", "):"}}, "input_prefix"},
        {"/v1/completions", {{"prompt", "def f("}, {"suffix", "):"}}, "suffix"}}) {
    int status = 0;
    json error = Post(path, body.dump(), &status);
    EXPECT_EQ(status, 400) << path;
    EXPECT_EQ(error["error"]["param"], param) << path;
    EXPECT_TRUE(absl::StrContains(error["error"]["message"].get<std::string>(),
                                  "cannot fill in the middle"))
        << error;
  }
  json plain =
      PostOk("/v1/completions", {{"prompt", "def f("}, {"max_tokens", 2}, {"ignore_eos", true}});
  EXPECT_EQ(plain["usage"]["completion_tokens"], 2);
}

TEST_F(HttpServerTest, InfillEchoStopAndLogprobs) {
  Start(DefaultSetup());
  const int vocab = setup_.runner.vocab_size;
  const Tokenizer& tok = FixtureTokenizer();

  // Infill: the FIM prompt, then the model's greedy continuation.
  json infill = PostOk("/v1/infill", {{"input_prefix", "def f(x):\n    return "},
                                      {"input_suffix", "\n\nprint(f(2))"},
                                      {"max_tokens", 6},
                                      {"temperature", 0},
                                      {"return_token_ids", true}});
  std::vector<int32_t> fim_ids =
      *tok.EncodeInfill("def f(x):\n    return ", "\n\nprint(f(2))", false);
  EXPECT_EQ(infill["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(), fim_ids);
  EXPECT_EQ(infill["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            GreedyReference(fim_ids, 6, vocab));

  // OpenAI's suffix on /v1/completions: each text prompt is the prefix of the same FIM prompt.
  json suffixed = PostOk("/v1/completions", {{"prompt", {"def f(x):\n    return ", "y = "}},
                                             {"suffix", "\n\nprint(f(2))"},
                                             {"max_tokens", 6},
                                             {"temperature", 0},
                                             {"return_token_ids", true}});
  ASSERT_EQ(suffixed["choices"].size(), 2u);
  EXPECT_EQ(suffixed["choices"][0]["prompt_token_ids"], infill["choices"][0]["prompt_token_ids"]);
  EXPECT_EQ(suffixed["choices"][0]["token_ids"], infill["choices"][0]["token_ids"]);
  EXPECT_EQ(suffixed["choices"][0]["text"], infill["choices"][0]["text"]);
  EXPECT_EQ(suffixed["choices"][1]["prompt_token_ids"].get<std::vector<int32_t>>(),
            *tok.EncodeInfill("y = ", "\n\nprint(f(2))", false));
  int suffix_status = 0;
  json refused =
      Post("/v1/completions", json({{"prompt", {1, 2}}, {"suffix", "x"}, {"max_tokens", 2}}).dump(),
           &suffix_status);
  EXPECT_EQ(suffix_status, 400);
  EXPECT_EQ(refused["error"]["param"], "suffix");

  // logit_bias: +100 on a token makes greedy decoding repeat it; an id past the vocabulary is a
  // 400 naming the field.
  const int32_t forced = tok.Encode(" x").at(0);
  json biased = PostOk("/v1/completions", {{"prompt", "def f("},
                                           {"max_tokens", 4},
                                           {"temperature", 0},
                                           {"ignore_eos", true},
                                           {"logit_bias", {{std::to_string(forced), 100}}},
                                           {"return_token_ids", true}});
  EXPECT_EQ(biased["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(4, forced));
  int bias_status = 0;
  json far = Post("/v1/completions",
                  json({{"prompt", "a"}, {"logit_bias", {{std::to_string(vocab + 5), 1}}}}).dump(),
                  &bias_status);
  EXPECT_EQ(bias_status, 400);
  EXPECT_EQ(far["error"]["param"], "logit_bias");

  // truncate_prompt_tokens: the prompt's last N tokens are what runs (and what echo returns).
  const std::string long_prompt = "import os\nimport sys\n\ndef main(argv):\n    return 0\n";
  const std::vector<int32_t> long_ids = tok.Encode(long_prompt);
  ASSERT_GT(long_ids.size(), 5u);
  json cut = PostOk("/v1/completions", {{"prompt", long_prompt},
                                        {"truncate_prompt_tokens", 5},
                                        {"max_tokens", 3},
                                        {"temperature", 0},
                                        {"echo", true},
                                        {"return_token_ids", true}});
  const std::vector<int32_t> kept(long_ids.end() - 5, long_ids.end());
  EXPECT_EQ(cut["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(), kept);
  EXPECT_EQ(cut["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(cut["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            GreedyReference(kept, 3, vocab));
  EXPECT_TRUE(absl::StartsWith(cut["choices"][0]["text"].get<std::string>(), tok.Decode(kept)))
      << cut;

  // allowed_token_ids: every token drawn is one of them; an id past the vocabulary is a 400.
  json restricted = PostOk("/v1/completions", {{"prompt", "def f("},
                                               {"max_tokens", 8},
                                               {"ignore_eos", true},
                                               {"allowed_token_ids", {forced, 7}},
                                               {"return_token_ids", true}});
  for (const json& id : restricted["choices"][0]["token_ids"]) {
    EXPECT_TRUE(id == forced || id == 7) << restricted;
  }
  int allowed_status = 0;
  json past =
      Post("/v1/completions", json({{"prompt", "a"}, {"allowed_token_ids", {vocab + 1}}}).dump(),
           &allowed_status);
  EXPECT_EQ(allowed_status, 400);
  EXPECT_EQ(past["error"]["param"], "allowed_token_ids");

  // skip_special_tokens: EOS forced by logit_bias (and not stopping: ignore_eos) is left out of
  // the text by default, and spelled out with skip_special_tokens false.
  json special_body = {{"prompt", "x"},
                       {"max_tokens", 2},
                       {"temperature", 0},
                       {"ignore_eos", true},
                       {"logit_bias", {{"0", 100}}},
                       {"return_token_ids", true}};
  json skipped = PostOk("/v1/completions", special_body);
  EXPECT_EQ(skipped["choices"][0]["token_ids"], json({0, 0}));
  EXPECT_EQ(skipped["choices"][0]["text"], "");
  special_body["skip_special_tokens"] = false;
  json spelled = PostOk("/v1/completions", special_body);
  EXPECT_EQ(spelled["choices"][0]["text"], tok.Decode({0, 0}));
  EXPECT_FALSE(tok.Decode({0, 0}).empty());

  // Echo with max_tokens 0: the prompt alone; with tokens: prompt then completion.
  json echo =
      PostOk("/v1/completions", {{"prompt", "import os"}, {"echo", true}, {"max_tokens", 0}});
  EXPECT_EQ(echo["choices"][0]["text"], "import os");
  EXPECT_EQ(echo["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(echo["usage"]["completion_tokens"], 0);
  json echo3 =
      PostOk("/v1/completions",
             {{"prompt", "import os"}, {"echo", true}, {"max_tokens", 3}, {"temperature", 0}});
  json plain3 =
      PostOk("/v1/completions", {{"prompt", "import os"}, {"max_tokens", 3}, {"temperature", 0}});
  EXPECT_EQ(echo3["choices"][0]["text"],
            "import os" + plain3["choices"][0]["text"].get<std::string>());

  // Stop strings: the text ends before the first occurrence of the stop string.
  json full =
      PostOk("/v1/completions", {{"prompt", "for i in"}, {"max_tokens", 30}, {"temperature", 0}});
  const std::string text = full["choices"][0]["text"];
  std::string stop;
  for (size_t k = 4; k + 2 <= text.size() && stop.empty(); ++k) {
    if (std::isalnum(static_cast<unsigned char>(text[k])) &&
        std::isalnum(static_cast<unsigned char>(text[k + 1]))) {
      stop = text.substr(k, 2);
    }
  }
  ASSERT_FALSE(stop.empty()) << text;
  json stopped =
      PostOk("/v1/completions",
             {{"prompt", "for i in"}, {"max_tokens", 30}, {"temperature", 0}, {"stop", stop}});
  EXPECT_EQ(stopped["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(stopped["choices"][0]["finish_reason"], "stop");
  // vLLM's stop_reason: the stop string, a stop token id as a number, null for length.
  EXPECT_EQ(stopped["choices"][0]["stop_reason"], stop);
  EXPECT_TRUE(full["choices"][0]["stop_reason"].is_null());
  const int32_t second = GreedyReference(tok.Encode("for i in"), 2, vocab).at(1);
  json by_token = PostOk("/v1/completions", {{"prompt", "for i in"},
                                             {"max_tokens", 30},
                                             {"temperature", 0},
                                             {"stop_token_ids", {second}}});
  EXPECT_EQ(by_token["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(by_token["choices"][0]["stop_reason"], second);

  // Logprobs: the chosen token's log-probability under the model's distribution.
  json lp = PostOk("/v1/completions", {{"prompt", "x = "},
                                       {"max_tokens", 4},
                                       {"temperature", 0},
                                       {"logprobs", 2},
                                       {"return_token_ids", true}});
  const json& logprobs = lp["choices"][0]["logprobs"];
  ASSERT_EQ(logprobs["token_logprobs"].size(), 4u);
  EXPECT_EQ(logprobs["tokens"].size(), 4u);
  EXPECT_EQ(logprobs["top_logprobs"].size(), 4u);
  std::vector<int32_t> history = tok.Encode("x = ");
  std::vector<float> logits = testing::ReferenceLogits(history, vocab);
  double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max);
  const int32_t first = lp["choices"][0]["token_ids"][0];
  EXPECT_NEAR(logprobs["token_logprobs"][0].get<double>(), logits[first] - max - std::log(sum),
              1e-4);
}

// The log-probability of `token` after `history` under the test model, and its rank.
std::pair<double, int> ReferenceScore(const std::vector<int32_t>& history, int32_t token,
                                      int vocab) {
  const std::vector<float> logits = testing::ReferenceLogits(history, vocab);
  const double max = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max);
  const int rank = 1 + static_cast<int>(std::count_if(logits.begin(), logits.end(),
                                                      [&](float l) { return l > logits[token]; }));
  return {logits[token] - max - std::log(sum), rank};
}

// Prompt log-probabilities: OpenAI's echo + logprobs (what lm-eval's loglikelihood tasks send:
// token-id prompts, max_tokens 1, logprobs 1, echo), scoring only (max_tokens 0), streamed, and
// vLLM's prompt_logprobs field.
TEST_F(HttpServerTest, EchoWithLogprobsScoresThePromptTokens) {
  Start(DefaultSetup());
  const int vocab = setup_.runner.vocab_size;
  const Tokenizer& tok = FixtureTokenizer();
  const std::vector<int32_t> prompt = tok.Encode("def add(a, b):\n    return a + b\n");
  ASSERT_GT(prompt.size(), 6u);
  const size_t len = prompt.size();
  // Every prompt position after the first against the model, as a client reads them.
  auto expect_prompt_part = [&](const json& logprobs, const std::string& what) {
    ASSERT_GE(logprobs["token_logprobs"].size(), len) << what;
    EXPECT_TRUE(logprobs["token_logprobs"][0].is_null()) << what;
    EXPECT_TRUE(logprobs["top_logprobs"][0].is_null()) << what;
    EXPECT_EQ(logprobs["text_offset"][0], 0) << what;
    for (size_t i = 0; i < len; ++i) {
      EXPECT_EQ(logprobs["tokens"][i], tok.Decode({prompt[i]})) << what << " " << i;
      if (i == 0) continue;
      const std::vector<int32_t> history(prompt.begin(), prompt.begin() + i);
      const double want = ReferenceScore(history, prompt[i], vocab).first;
      EXPECT_NEAR(logprobs["token_logprobs"][i].get<double>(), want, 1e-4) << what << " " << i;
      const json& top = logprobs["top_logprobs"][i];
      EXPECT_LE(top.size(), 2u) << what;  // the best alternative and the prompt's token
      EXPECT_NEAR(top[tok.Decode({prompt[i]})].get<double>(), want, 1e-4) << what;
      EXPECT_GT(logprobs["text_offset"][i].get<int64_t>(),
                logprobs["text_offset"][i - 1].get<int64_t>())
          << what;
    }
  };

  json lm_eval = PostOk("/v1/completions", {{"prompt", json::array({prompt})},
                                            {"echo", true},
                                            {"logprobs", 1},
                                            {"max_tokens", 1},
                                            {"temperature", 0},
                                            {"return_token_ids", true}});
  const json& choice = lm_eval["choices"][0];
  ASSERT_EQ(choice["logprobs"]["token_logprobs"].size(), len + 1) << lm_eval;
  expect_prompt_part(choice["logprobs"], "echo");
  const int32_t generated = choice["token_ids"][0];
  EXPECT_EQ(generated, GreedyReference(prompt, 1, vocab)[0]);
  EXPECT_NEAR(choice["logprobs"]["token_logprobs"][len].get<double>(),
              ReferenceScore(prompt, generated, vocab).first, 1e-4);
  EXPECT_EQ(choice["text"], tok.Decode(prompt) + tok.Decode({generated}));

  // Scoring only, two choices: each holds the prompt's part; nothing is generated.
  json scored = PostOk("/v1/completions", {{"prompt", json::array({prompt})},
                                           {"echo", true},
                                           {"logprobs", 1},
                                           {"max_tokens", 0},
                                           {"n", 2}});
  ASSERT_EQ(scored["choices"].size(), 2u) << scored;
  for (const json& c : scored["choices"]) {
    ASSERT_EQ(c["logprobs"]["token_logprobs"].size(), len) << scored;
    expect_prompt_part(c["logprobs"], "scored");
    EXPECT_EQ(c["finish_reason"], "length");
    EXPECT_EQ(c["text"], tok.Decode(prompt));
  }
  EXPECT_EQ(scored["usage"]["completion_tokens"], 0);

  // Streamed: the echo comes with its log-probabilities, then the completion's tokens.
  Sse sse = Stream({{"prompt", json::array({prompt})},
                    {"echo", true},
                    {"logprobs", 0},
                    {"max_tokens", 3},
                    {"stream", true},
                    {"temperature", 0}});
  ASSERT_EQ(sse.status, 200);
  EXPECT_TRUE(sse.done) << sse.error;
  ASSERT_FALSE(sse.chunks.empty());
  json streamed = {{"tokens", json::array()},
                   {"token_logprobs", json::array()},
                   {"top_logprobs", json::array()},
                   {"text_offset", json::array()}};
  for (const json& chunk : sse.chunks) {
    for (const json& c : chunk["choices"]) {
      if (!c["logprobs"].is_object()) continue;
      for (auto& [key, values] : c["logprobs"].items()) {
        for (const json& v : values) streamed[key].push_back(v);
      }
    }
  }
  ASSERT_EQ(streamed["token_logprobs"].size(), len + 3) << sse.chunks.front();
  expect_prompt_part(streamed, "stream");
  EXPECT_TRUE(absl::StartsWith(sse.text, tok.Decode(prompt))) << sse.text;
  EXPECT_EQ(sse.chunks.front()["choices"][0]["text"], tok.Decode(prompt));

  // vLLM's prompt_logprobs: {token id: {logprob, rank, decoded_token}} per position after the
  // first, the prompt's token and the 2 best.
  json vllm = PostOk("/v1/completions", {{"prompt", json::array({prompt})},
                                         {"prompt_logprobs", 2},
                                         {"max_tokens", 2},
                                         {"temperature", 0}});
  const json& positions = vllm["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(positions.size(), len) << vllm;
  EXPECT_TRUE(positions[0].is_null());
  EXPECT_TRUE(vllm["choices"][0]["logprobs"].is_null());
  for (size_t i = 1; i < len; ++i) {
    const std::vector<int32_t> history(prompt.begin(), prompt.begin() + i);
    const auto [want, rank] = ReferenceScore(history, prompt[i], vocab);
    const json& entry = positions[i][std::to_string(prompt[i])];
    EXPECT_NEAR(entry["logprob"].get<double>(), want, 1e-4) << i;
    EXPECT_EQ(entry["rank"], rank) << i;
    EXPECT_EQ(entry["decoded_token"], tok.Decode({prompt[i]}));
    EXPECT_GE(positions[i].size(), 2u);
    EXPECT_LE(positions[i].size(), 3u);
  }
  int status = 0;
  json refused =
      Post("/v1/completions",
           json({{"prompt", "x"}, {"prompt_logprobs", 1}, {"stream", true}}).dump(), &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(refused["error"]["param"], "prompt_logprobs");
}

// TGI's native API: /generate with details against the model, POST / (a list), /generate_stream
// and POST / streamed (TGI's events), stop sequences kept in the text, seeds reported and
// reproducible, TGI-shaped errors, /info.
// Triton's generate extension as TensorRT-LLM's models answer it: text_output is the greedy
// continuation (the input excluded), with return_log_probs the tokens' scores; the stream's
// text_output pieces add up to it; stop words end the text and stay in it; the model names of the
// TensorRT-LLM backend and the served ones are accepted, others 404; unknown inputs refused by
// name in Triton's error shape; its health routes.
TEST_F(HttpServerTest, TritonGenerateAndStreamAgreeWithTheModel) {
  TestSetup setup = DefaultSetup();
  setup.step_delay = absl::Milliseconds(3);  // steps slow enough that the stream has several events
  Start(setup);
  const Tokenizer& tok = FixtureTokenizer();
  const auto [vocab, inputs, prompt, greedy] = FiveGreedyTokens();
  ASSERT_EQ(greedy.size(), 5u) << "the reference continuation ended early";

  const json body = {{"text_input", inputs}, {"max_tokens", 5}, {"bad_words", ""},
                     {"stop_words", ""},     {"pad_id", 2},     {"return_log_probs", true},
                     {"temperature", 0.7}};  // greedy all the same: no top_k / top_p
  for (const char* model : {"ensemble", "tensorrt_llm_bls", "demo"}) {
    json out = PostOk(absl::StrCat("/v2/models/", model, "/generate"), body);
    EXPECT_EQ(out["model_name"], model);
    EXPECT_EQ(out["model_version"], "1");
    EXPECT_EQ(out["text_output"], tok.Decode(greedy)) << out;
    ASSERT_EQ(out["output_log_probs"].size(), 5u) << out;
    std::vector<int32_t> history = prompt;
    double cumulative = 0;
    for (size_t k = 0; k < 5; ++k) {
      const double expected = ReferenceScore(history, greedy[k], vocab).first;
      EXPECT_NEAR(out["output_log_probs"][k].get<double>(), expected, 1e-4);
      cumulative += expected;
      history.push_back(greedy[k]);
    }
    EXPECT_NEAR(out["cum_log_probs"].get<double>(), cumulative, 1e-3);
  }
  json versioned = PostOk("/v2/models/ensemble/versions/3/generate",
                          {{"text_input", inputs}, {"max_tokens", 5}});
  EXPECT_EQ(versioned["model_version"], "3");
  EXPECT_EQ(versioned["text_output"], tok.Decode(greedy));
  EXPECT_FALSE(versioned.contains("output_log_probs"));

  // Streamed: data events whose pieces add up to the text; no end marker.
  auto client = Client();
  httplib::Result streamed = client->Post(
      "/v2/models/ensemble/generate_stream",
      json(
          {{"text_input", inputs}, {"max_tokens", 5}, {"stream", true}, {"return_log_probs", true}})
          .dump(),
      "application/json");
  ASSERT_TRUE(streamed);
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  std::string text;
  size_t scored = 0;
  int events = 0;
  for (absl::string_view line : absl::StrSplit(streamed->body, '\n')) {
    if (line.empty() || line[0] == ':') continue;
    ASSERT_TRUE(absl::StartsWith(line, "data: ")) << line;
    const json event = json::parse(line.substr(6));
    EXPECT_EQ(event["model_name"], "ensemble");
    text += event["text_output"].get<std::string>();
    scored += event["output_log_probs"].size();
    ++events;
  }
  EXPECT_EQ(text, tok.Decode(greedy));
  EXPECT_GE(events, 2);
  EXPECT_EQ(scored, 5u);

  // A stop word ends the text and stays in it; end_id ends it at that token.
  const std::string full = tok.Decode(greedy);
  const std::string second = tok.Decode({greedy[1]});
  ASSERT_FALSE(second.empty());
  json stopped = PostOk("/v2/models/ensemble/generate",
                        {{"text_input", inputs}, {"max_tokens", 5}, {"stop_words", {second}}});
  EXPECT_EQ(stopped["text_output"], full.substr(0, full.find(second) + second.size())) << stopped;
  EXPECT_LT(stopped["text_output"].get<std::string>().size(), full.size());
  json ended = PostOk("/v2/models/ensemble/generate",
                      {{"text_input", inputs}, {"max_tokens", 5}, {"end_id", greedy[2]}});
  EXPECT_EQ(ended["text_output"], tok.Decode({greedy[0], greedy[1]})) << ended;

  const std::pair<json, const char*> refused[] = {
      {json{{"max_tokens", 5}}, "text_input"},
      {json{{"text_input", "x"}}, "max_tokens"},
      {json{{"text_input", "x"}, {"max_tokens", 5}, {"beam_width", 2}}, "beam_width"},
      {json{{"text_input", "x"}, {"max_tokens", 5}, {"top_p", 1.5}}, "top_p"},
      {json{{"text_input", "x"}, {"max_tokens", 5}, {"return_generation_logits", true}},
       "return_generation_logits"},
      {json{{"text_input", "x"}, {"max_tokens", 5}, {"prompt", "y"}}, "prompt"},
      {json{{"text_input", "x"}, {"max_tokens", 5}, {"stop_words", 3}}, "stop_words"},
  };
  for (const auto& [refused_body, param] : refused) {
    int status = 0;
    json error = Post("/v2/models/ensemble/generate", refused_body.dump(), &status);
    EXPECT_EQ(status, 400) << refused_body;
    ASSERT_TRUE(error["error"].is_string()) << error;
    EXPECT_NE(error["error"].get<std::string>().find(param), std::string::npos)
        << refused_body << " -> " << error;
  }
  int status = 0;
  json unknown = Post("/v2/models/llama/generate",
                      json({{"text_input", "x"}, {"max_tokens", 2}}).dump(), &status);
  EXPECT_EQ(status, 404);
  EXPECT_TRUE(unknown["error"].is_string()) << unknown;

  EXPECT_EQ(client->Get("/v2/health/ready")->status, 200);
  EXPECT_EQ(client->Get("/v2/health/live")->status, 200);
  EXPECT_EQ(client->Get("/v2/models/ensemble/ready")->status, 200);
  EXPECT_EQ(client->Get("/v2/models/llama/ready")->status, 404);
}

TEST_F(HttpServerTest, TgiGenerateAndStreamAgreeWithTheModel) {
  Start(DefaultSetup());
  const Tokenizer& tok = FixtureTokenizer();
  const auto [vocab, inputs, prompt, greedy] = FiveGreedyTokens();
  ASSERT_EQ(greedy.size(), 5u) << "the reference continuation ended early";

  json body = {{"inputs", inputs},
               {"parameters",
                {{"max_new_tokens", 5},
                 {"details", true},
                 {"decoder_input_details", true},
                 {"top_n_tokens", 2}}}};
  json generated = PostOk("/generate", body);
  EXPECT_EQ(generated["generated_text"], tok.Decode(greedy));
  const json& details = generated["details"];
  EXPECT_EQ(details["finish_reason"], "length");
  EXPECT_EQ(details["generated_tokens"], 5);
  EXPECT_TRUE(details["seed"].is_null());  // greedy
  ASSERT_EQ(details["tokens"].size(), 5u);
  ASSERT_EQ(details["top_tokens"].size(), 5u);
  std::vector<int32_t> history = prompt;
  for (size_t k = 0; k < 5; ++k) {
    const json& token = details["tokens"][k];
    EXPECT_EQ(token["id"], greedy[k]);
    EXPECT_EQ(token["text"], tok.Decode({greedy[k]}));
    EXPECT_EQ(token["special"], false);
    EXPECT_NEAR(token["logprob"].get<double>(), ReferenceScore(history, greedy[k], vocab).first,
                1e-4);
    ASSERT_EQ(details["top_tokens"][k].size(), 2u);
    EXPECT_EQ(details["top_tokens"][k][0]["id"], greedy[k]);  // greedy: the best token
    history.push_back(greedy[k]);
  }
  ASSERT_EQ(details["prefill"].size(), prompt.size());
  EXPECT_TRUE(details["prefill"][0]["logprob"].is_null());
  for (size_t i = 1; i < prompt.size(); ++i) {
    EXPECT_EQ(details["prefill"][i]["id"], prompt[i]);
    const std::vector<int32_t> before(prompt.begin(), prompt.begin() + i);
    EXPECT_NEAR(details["prefill"][i]["logprob"].get<double>(),
                ReferenceScore(before, prompt[i], vocab).first, 1e-4);
  }

  // POST /: the same in a one-element list; return_full_text puts the inputs first; no details
  // unless asked for.
  json root = PostOk("/", {{"inputs", inputs},
                           {"parameters", {{"max_new_tokens", 5}, {"return_full_text", true}}}});
  ASSERT_TRUE(root.is_array() && root.size() == 1u) << root;
  EXPECT_EQ(root[0]["generated_text"], inputs + tok.Decode(greedy));
  EXPECT_FALSE(root[0].contains("details"));

  // Streams: /generate_stream and POST / with "stream": true; TGI's `data:` events, no [DONE].
  for (const char* path : {"/generate_stream", "/"}) {
    auto client = Client();
    json stream_body = {{"inputs", inputs},
                        {"parameters", {{"max_new_tokens", 5}, {"details", true}}},
                        {"stream", true}};
    httplib::Result result = client->Post(path, stream_body.dump(), "application/json");
    ASSERT_TRUE(result) << path;
    ASSERT_EQ(result->status, 200) << result->body;
    std::vector<json> events;
    for (absl::string_view line : absl::StrSplit(result->body, '\n')) {
      if (line.empty()) continue;
      ASSERT_TRUE(absl::StartsWith(line, "data:")) << line;
      events.push_back(json::parse(line.substr(5)));
    }
    ASSERT_EQ(events.size(), 5u) << path << ": " << result->body;
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_EQ(events[k]["index"], k + 1);
      EXPECT_EQ(events[k]["token"]["id"], greedy[k]);
      EXPECT_NEAR(events[k]["token"]["logprob"].get<double>(),
                  details["tokens"][k]["logprob"].get<double>(), 1e-6);
      if (k < 4) {
        EXPECT_TRUE(events[k]["generated_text"].is_null());
        EXPECT_TRUE(events[k]["details"].is_null());
      }
    }
    EXPECT_EQ(events[4]["generated_text"], tok.Decode(greedy)) << path;
    EXPECT_EQ(events[4]["details"]["finish_reason"], "length");
    EXPECT_EQ(events[4]["details"]["input_length"], prompt.size());
  }

  // A stop sequence ends the text with it (TGI keeps it).
  const std::string text = tok.Decode(GreedyReference(prompt, 30, vocab));
  std::string stop;
  for (size_t k = 2; k + 2 <= text.size() && stop.empty(); ++k) {
    if (std::isalnum(static_cast<unsigned char>(text[k])) &&
        std::isalnum(static_cast<unsigned char>(text[k + 1]))) {
      stop = text.substr(k, 2);
    }
  }
  ASSERT_FALSE(stop.empty()) << text;
  json stopped = PostOk(
      "/generate", {{"inputs", inputs},
                    {"parameters", {{"max_new_tokens", 30}, {"stop", {stop}}, {"details", true}}}});
  EXPECT_EQ(stopped["generated_text"], text.substr(0, text.find(stop) + stop.size()));
  EXPECT_EQ(stopped["details"]["finish_reason"], "stop_sequence");

  // Sampling: the seed is reported; the same seed gives the same text.
  json sample_body = {
      {"inputs", inputs},
      {"parameters", {{"max_new_tokens", 8}, {"do_sample", true}, {"details", true}}}};
  json sampled = PostOk("/generate", sample_body);
  ASSERT_TRUE(sampled["details"]["seed"].is_number_unsigned()) << sampled;
  sample_body["parameters"]["seed"] = sampled["details"]["seed"];
  EXPECT_EQ(PostOk("/generate", sample_body)["generated_text"], sampled["generated_text"]);

  // TGI's errors: 422 with error_type "validation" naming the problem.
  for (const json& bad : {json({{"inputs", ""}}), json({{"parameters", json::object()}}),
                          json({{"inputs", "x"}, {"parameters", {{"temperature", 0}}}}),
                          json({{"inputs", "x"}, {"parameters", {{"typical_p", 1.0}}}}),
                          json({{"inputs", "x"}, {"parameters", {{"best_of", 2}}}}),
                          json({{"inputs", "x"}, {"parameters", {{"top_p", 1.0}}}}),
                          json({{"inputs", "x"}, {"parameters", {{"max_new_tokens", 1000}}}})}) {
    int status = 0;
    json error = Post("/generate", bad.dump(), &status);
    EXPECT_EQ(status, 422) << bad;
    EXPECT_EQ(error["error_type"], "validation") << bad;
    EXPECT_TRUE(error["error"].is_string()) << error;
  }
  int status = 0;
  EXPECT_EQ(Post("/generate", "{not json", &status)["error_type"], "validation");
  EXPECT_EQ(status, 422);

  auto client = Client();
  httplib::Result info = client->Get("/info");
  ASSERT_TRUE(info && info->status == 200);
  json parsed = json::parse(info->body);
  EXPECT_EQ(parsed["model_id"], "demo");
  EXPECT_EQ(parsed["max_total_tokens"], 128);
}

// The request log: one line per call, served (plain or streamed, either API) or refused, with
// its id, token counts, finish reasons and duration, and never the prompt or output text.
TEST_F(HttpServerTest, RequestLogHasALinePerCallAndNoText) {
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  TestSetup setup = DefaultSetup();
  setup.server.request_log = [lines, mu](const std::string& line) {
    std::lock_guard<std::mutex> lock(*mu);
    lines->push_back(line);
  };
  Start(setup);
  const std::string secret = "def secret_function_name(";
  PostOk("/v1/completions", {{"prompt", secret}, {"max_tokens", 3}, {"temperature", 0}});
  Sse sse = Stream({{"prompt", secret}, {"max_tokens", 2}, {"stream", true}});
  EXPECT_TRUE(sse.done);
  PostOk("/generate", {{"inputs", secret}, {"parameters", {{"max_new_tokens", 2}}}});
  int status = 0;
  Post("/v1/completions", json({{"prompt", secret}, {"temperature", -1}}).dump(), &status);
  EXPECT_EQ(status, 400);
  // The stream's line is written when its response is released, just after the client has it.
  for (int i = 0; i < 100; ++i) {
    {
      std::lock_guard<std::mutex> lock(*mu);
      if (lines->size() >= 4) break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::lock_guard<std::mutex> lock(*mu);
  ASSERT_EQ(lines->size(), 4u);
  std::sort(lines->begin(), lines->end());
  for (const std::string& line : *lines) {
    EXPECT_EQ(line.find("secret"), std::string::npos) << line;
  }
  const std::string prompt_tokens =
      absl::StrCat(FixtureTokenizer().Encode(secret).size(), " prompt tokens");
  EXPECT_TRUE(absl::StartsWith((*lines)[0], "POST /generate 200 tgi-")) << (*lines)[0];
  EXPECT_NE((*lines)[0].find("2 generated, finish length"), std::string::npos) << (*lines)[0];
  EXPECT_TRUE(absl::StartsWith((*lines)[1], "POST /v1/completions 200 cmpl-")) << (*lines)[1];
  EXPECT_NE((*lines)[1].find(prompt_tokens), std::string::npos) << (*lines)[1];
  EXPECT_TRUE(absl::StartsWith((*lines)[2], "POST /v1/completions 200 cmpl-")) << (*lines)[2];
  EXPECT_NE((*lines)[1].find(" s"), std::string::npos);
  EXPECT_TRUE(absl::StartsWith((*lines)[3], "POST /v1/completions 400: ")) << (*lines)[3];
  EXPECT_NE((*lines)[3].find("temperature"), std::string::npos) << (*lines)[3];
}

// CORS for browser clients: the allowed origin on plain, streamed and error responses, and
// preflights answered without the API key; an origin not in the list gets nothing.
TEST_F(HttpServerTest, CorsHeadersAndPreflights) {
  TestSetup setup = DefaultSetup();
  setup.server.api_key = "k";
  setup.server.allowed_origins = {"http://ide.example"};
  Start(setup);
  auto client = Client();  // sends the key
  httplib::Headers from_ide = {{"Origin", "http://ide.example"}};
  const std::string body = json({{"prompt", "x"}, {"max_tokens", 2}}).dump();
  httplib::Result plain = client->Post("/v1/completions", from_ide, body, "application/json");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 200);
  EXPECT_EQ(plain->get_header_value("Access-Control-Allow-Origin"), "http://ide.example");
  EXPECT_EQ(plain->get_header_value("Vary"), "Origin");
  httplib::Result streamed = client->Post(
      "/v1/completions", from_ide,
      json({{"prompt", "x"}, {"max_tokens", 2}, {"stream", true}}).dump(), "application/json");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);
  EXPECT_EQ(streamed->get_header_value("Access-Control-Allow-Origin"), "http://ide.example");
  httplib::Result refused =
      client->Post("/v1/completions", from_ide, R"({"prompt": 5})", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400);
  EXPECT_EQ(refused->get_header_value("Access-Control-Allow-Origin"), "http://ide.example");

  httplib::Client bare("127.0.0.1", server_->port());  // a preflight carries no key
  httplib::Headers preflight = {{"Origin", "http://ide.example"},
                                {"Access-Control-Request-Method", "POST"},
                                {"Access-Control-Request-Headers", "authorization, content-type"}};
  httplib::Result options = bare.Options("/v1/completions", preflight);
  ASSERT_TRUE(options);
  EXPECT_EQ(options->status, 204);
  EXPECT_EQ(options->get_header_value("Access-Control-Allow-Origin"), "http://ide.example");
  EXPECT_NE(options->get_header_value("Access-Control-Allow-Methods").find("POST"),
            std::string::npos);
  EXPECT_EQ(options->get_header_value("Access-Control-Allow-Headers"),
            "authorization, content-type");

  httplib::Headers elsewhere = {{"Origin", "http://evil.example"}};
  httplib::Result other = client->Post("/v1/completions", elsewhere, body, "application/json");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 200);  // CORS is the browser's to enforce; the server only says who
  EXPECT_FALSE(other->has_header("Access-Control-Allow-Origin"));
  httplib::Result other_preflight = bare.Options("/v1/completions", elsewhere);
  ASSERT_TRUE(other_preflight);
  EXPECT_FALSE(other_preflight->has_header("Access-Control-Allow-Origin"));
  EXPECT_FALSE(other_preflight->has_header("Access-Control-Allow-Methods"));
}

TEST_F(HttpServerTest, EveryOriginByDefault) {
  Start(DefaultSetup());
  auto client = Client();
  httplib::Result got = client->Get("/v1/models", {{"Origin", "http://anywhere.example"}});
  ASSERT_TRUE(got);
  EXPECT_EQ(got->get_header_value("Access-Control-Allow-Origin"), "*");
  EXPECT_FALSE(client->Get("/v1/models")->has_header("Access-Control-Allow-Origin"));
}

// Stored responses: a response is read back by id as it was answered (plain or streamed), with
// its input items; previous_response_id continues its conversation exactly as a chat of the
// earlier turns and the answer would (instructions not carried over); DELETE forgets it; store
// false keeps nothing; unknown ids are 404s naming the field; with no store, nothing is kept.
TEST_F(HttpServerTest, ResponsesAreStoredAndContinued) {
  Start(WithRoleTemplate(DefaultSetup()));
  auto client = Client();
  const json sampling = {{"temperature", 0}, {"ignore_eos", true}};
  json first_body = {
      {"input", "def fib(n):"}, {"instructions", "You write Python."}, {"max_output_tokens", 6}};
  first_body.update(sampling);
  const json first = PostOk("/v1/responses", first_body);
  const std::string first_id = first["id"];
  EXPECT_EQ(first["store"], true);
  EXPECT_TRUE(first["previous_response_id"].is_null());
  httplib::Result got = client->Get("/v1/responses/" + first_id);
  ASSERT_TRUE(got);
  ASSERT_EQ(got->status, 200) << got->body;
  EXPECT_EQ(json::parse(got->body), first);
  httplib::Result items = client->Get("/v1/responses/" + first_id + "/input_items");
  ASSERT_TRUE(items);
  ASSERT_EQ(items->status, 200) << items->body;
  const json listed = json::parse(items->body);
  EXPECT_EQ(listed["object"], "list");
  ASSERT_EQ(listed["data"].size(), 1u);
  EXPECT_EQ(listed["data"][0]["role"], "user");
  EXPECT_EQ(listed["data"][0]["content"][0],
            json({{"type", "input_text"}, {"text", "def fib(n):"}}));
  EXPECT_EQ(listed["first_id"], listed["data"][0]["id"]);
  EXPECT_FALSE(listed["has_more"]);

  // The follow-up answers as the chat of the whole conversation.
  const std::string first_text = first["output"][0]["content"][0]["text"];
  json second_body = {
      {"previous_response_id", first_id},
      {"input",
       {{{"role", "user"}, {"content", "again"}}, {{"role", "user"}, {"content", "shorter"}}}},
      {"max_output_tokens", 5}};
  second_body.update(sampling);
  const json second = PostOk("/v1/responses", second_body);
  EXPECT_EQ(second["previous_response_id"], first_id);
  json chat_body = {{"messages",
                     {{{"role", "user"}, {"content", "def fib(n):"}},
                      {{"role", "assistant"}, {"content", first_text}},
                      {{"role", "user"}, {"content", "again"}},
                      {{"role", "user"}, {"content", "shorter"}}}},
                    {"max_tokens", 5}};
  chat_body.update(sampling);
  const json chat = PostOk("/v1/chat/completions", chat_body);
  EXPECT_EQ(second["output"][0]["content"][0]["text"], chat["choices"][0]["message"]["content"]);
  EXPECT_EQ(second["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  // Its input items, newest first by default; paged with limit / after; asc on request.
  items = client->Get("/v1/responses/" + second["id"].get<std::string>() + "/input_items?limit=1");
  ASSERT_TRUE(items && items->status == 200);
  json page = json::parse(items->body);
  ASSERT_EQ(page["data"].size(), 1u);
  EXPECT_EQ(page["data"][0]["content"][0]["text"], "shorter");
  EXPECT_TRUE(page["has_more"]);
  items = client->Get("/v1/responses/" + second["id"].get<std::string>() +
                      "/input_items?after=" + page["last_id"].get<std::string>());
  ASSERT_TRUE(items && items->status == 200);
  EXPECT_EQ(json::parse(items->body)["data"][0]["content"][0]["text"], "again");
  items =
      client->Get("/v1/responses/" + second["id"].get<std::string>() + "/input_items?order=asc");
  ASSERT_TRUE(items && items->status == 200);
  EXPECT_EQ(json::parse(items->body)["data"][0]["content"][0]["text"], "again");
  for (const char* query : {"?limit=0", "?limit=x", "?order=up", "?after=msg_nothing"}) {
    items =
        client->Get("/v1/responses/" + second["id"].get<std::string>() + "/input_items" + query);
    ASSERT_TRUE(items);
    EXPECT_EQ(items->status, 400) << query;
  }

  // Streamed: the stored response is the one the last event carried.
  json third_body = {{"previous_response_id", second["id"]},
                     {"input", "once more"},
                     {"max_output_tokens", 4},
                     {"stream", true}};
  third_body.update(sampling);
  Sse sse = Stream(third_body, 0, "/v1/responses");
  ASSERT_EQ(sse.status, 200);
  ASSERT_FALSE(sse.chunks.empty());
  const json& streamed = sse.chunks.back()["response"];
  got = client->Get("/v1/responses/" + streamed["id"].get<std::string>());
  ASSERT_TRUE(got && got->status == 200);
  EXPECT_EQ(json::parse(got->body), streamed);

  // Deleted: gone, and a second delete is a 404; what continued it is not affected.
  httplib::Result deleted = client->Delete("/v1/responses/" + first_id);
  ASSERT_TRUE(deleted);
  EXPECT_EQ(deleted->status, 200);
  EXPECT_EQ(json::parse(deleted->body),
            json({{"id", first_id}, {"object", "response"}, {"deleted", true}}));
  EXPECT_EQ(client->Get("/v1/responses/" + first_id)->status, 404);
  EXPECT_EQ(client->Delete("/v1/responses/" + first_id)->status, 404);
  json again_body = second_body;
  again_body["previous_response_id"] = second["id"];
  EXPECT_EQ(PostOk("/v1/responses", again_body)["status"], "incomplete");
  int status = 0;
  json unknown = Post("/v1/responses",
                      json({{"input", "x"}, {"previous_response_id", first_id}}).dump(), &status);
  EXPECT_EQ(status, 404);
  EXPECT_EQ(unknown["error"]["param"], "previous_response_id") << unknown;

  // store: false keeps nothing.
  json unstored_body = first_body;
  unstored_body["store"] = false;
  const json unstored = PostOk("/v1/responses", unstored_body);
  EXPECT_EQ(unstored["store"], false);
  EXPECT_EQ(client->Get("/v1/responses/" + unstored["id"].get<std::string>())->status, 404);
  EXPECT_EQ(client->Get("/v1/responses/resp_nothing/input_items")->status, 404);
}

// Function tools on the Responses API: a named function's call comes out as a function_call item
// (arguments guided by its schema); "auto" with the Hermes parser gives a message and a call;
// streamed, every item's events come at the end and the final response equals the plain one;
// the call's result goes back as a function_call_output item (with previous_response_id), read as
// the chat's tool message.
TEST_F(HttpServerTest, ResponsesFunctionTools) {
  TestSetup setup = WithRoleTemplate(DefaultSetup());
  setup.server.max_model_len = setup.engine.max_model_len = 512;
  setup.server.tool_call_parser = "hermes";
  Start(setup);
  const json tools = {{{"type", "function"},
                       {"name", "get_weather"},
                       {"parameters",
                        {{"type", "object"},
                         {"properties", {{"unit", {{"enum", {"celsius", "fahrenheit"}}}}}},
                         {"required", {"unit"}}}}}};
  json named = {{"input", "weather?"},
                {"tools", tools},
                {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
                {"temperature", 0},
                {"max_output_tokens", 60}};
  const json called = PostOk("/v1/responses", named);
  ASSERT_EQ(called["output"].size(), 1u) << called;
  const json& call = called["output"][0];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(call["status"], "completed");
  const json arguments = json::parse(call["arguments"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(arguments.is_object()) << call;
  EXPECT_TRUE(arguments["unit"] == "celsius" || arguments["unit"] == "fahrenheit") << call;
  EXPECT_EQ(called["tools"], tools);
  EXPECT_EQ(called["tool_choice"]["name"], "get_weather");

  // The result back, continuing the stored response: the chat of the same turns answers alike.
  json result = {
      {"previous_response_id", called["id"]},
      {"input",
       {{{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "-3 C"}}}},
      {"temperature", 0},
      {"ignore_eos", true},
      {"max_output_tokens", 5}};
  const json answered = PostOk("/v1/responses", result);
  ASSERT_EQ(answered["output"].size(), 1u) << answered;
  EXPECT_EQ(answered["output"][0]["type"], "message");  // no tools in this request
  const json chat =
      PostOk("/v1/chat/completions",
             {{"messages",
               {{{"role", "user"}, {"content", "weather?"}},
                {{"role", "assistant"},
                 {"content", ""},
                 {"tool_calls",
                  {{{"id", call["call_id"]},
                    {"type", "function"},
                    {"function", {{"name", "get_weather"}, {"arguments", call["arguments"]}}}}}}},
                {{"role", "tool"}, {"tool_call_id", call["call_id"]}, {"content", "-3 C"}}}},
              {"temperature", 0},
              {"ignore_eos", true},
              {"max_tokens", 5}});
  EXPECT_EQ(answered["output"][0]["content"][0]["text"], chat["choices"][0]["message"]["content"]);
  EXPECT_EQ(answered["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
  httplib::Result items =
      Client()->Get("/v1/responses/" + answered["id"].get<std::string>() + "/input_items");
  ASSERT_TRUE(items && items->status == 200);
  EXPECT_EQ(json::parse(items->body)["data"][0]["type"], "function_call_output");
  // The same turns sent by the client itself (the call item, then its output) answer alike.
  const json manual = PostOk(
      "/v1/responses",
      {{"input",
        {{{"role", "user"}, {"content", "weather?"}},
         call,
         {{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "-3 C"}}}},
       {"temperature", 0},
       {"ignore_eos", true},
       {"max_output_tokens", 5}});
  EXPECT_EQ(manual["output"][0]["content"][0]["text"], answered["output"][0]["content"][0]["text"]);

  // "auto": the model's Hermes answer (a guide makes the fake model write one) as a message and a
  // call; streamed, the same items as they are written, each with its events (the text's deltas
  // as many as the steps the stream sees: compared collapsed).
  json automatic = {
      {"input", "weather?"},
      {"tools", tools},
      {"temperature", 0},
      {"max_output_tokens", 100},
      {"guided_regex",
       R"re(Checking\.<tool_call>\{"name": "get_weather", "arguments": \{"unit": "celsius"\}\}</tool_call>)re"}};
  const json plain = PostOk("/v1/responses", automatic);
  ASSERT_EQ(plain["output"].size(), 2u) << plain;
  EXPECT_EQ(plain["output"][0]["type"], "message");
  EXPECT_EQ(plain["output"][0]["content"][0]["text"], "Checking.");
  EXPECT_EQ(plain["output"][1]["type"], "function_call");
  EXPECT_EQ(plain["output"][1]["arguments"], R"({"unit":"celsius"})");
  automatic["stream"] = true;
  Sse sse = Stream(automatic, 0, "/v1/responses");
  ASSERT_EQ(sse.status, 200);
  const std::vector<std::string> expected = {"response.created",
                                             "response.in_progress",
                                             "response.output_item.added",
                                             "response.content_part.added",
                                             "response.output_text.delta",
                                             "response.output_text.done",
                                             "response.content_part.done",
                                             "response.output_item.done",
                                             "response.output_item.added",
                                             "response.function_call_arguments.delta",
                                             "response.function_call_arguments.done",
                                             "response.output_item.done",
                                             "response.completed"};
  std::vector<std::string> collapsed;
  std::string streamed_text, streamed_arguments;
  for (size_t e = 0; e < sse.events.size(); ++e) {
    const std::string piece =
        absl::EndsWith(sse.events[e], ".delta") ? sse.chunks[e]["delta"].get<std::string>() : "";
    if (sse.events[e] == "response.output_text.delta") streamed_text += piece;
    if (sse.events[e] == "response.function_call_arguments.delta") streamed_arguments += piece;
    if (collapsed.empty() || collapsed.back() != sse.events[e] ||
        !absl::EndsWith(sse.events[e], ".delta")) {
      collapsed.push_back(sse.events[e]);
    }
  }
  EXPECT_EQ(collapsed, expected);
  EXPECT_EQ(streamed_text, "Checking.");
  EXPECT_EQ(streamed_arguments, R"({"unit":"celsius"})");
  const json& last = sse.chunks.back()["response"];
  ASSERT_EQ(last["output"].size(), 2u);
  EXPECT_EQ(last["output"][0]["content"], plain["output"][0]["content"]);
  EXPECT_EQ(last["output"][1]["arguments"], plain["output"][1]["arguments"]);
}

// Streamed with a named function, the Responses API sends the call's arguments as
// function_call_arguments.delta pieces while the sample writes them (several, with a step between
// tokens), concatenating to the plain answer's arguments, then .done and the item.
TEST_F(HttpServerTest, ResponsesStreamNamedCallArgumentsAsTheyGrow) {
  TestSetup setup = WithRoleTemplate(DefaultSetup());
  setup.server.max_model_len = setup.engine.max_model_len = 512;
  setup.step_delay = absl::Milliseconds(3);
  Start(setup);
  json named = {{"input", "weather?"},
                {"tools",
                 {{{"type", "function"},
                   {"name", "get_weather"},
                   {"parameters",
                    {{"type", "object"},
                     {"properties", {{"city", {{"type", "string"}, {"maxLength", 12}}}}},
                     {"required", {"city"}}}}}}},
                {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
                {"temperature", 0},
                {"max_output_tokens", 60}};
  const json plain = PostOk("/v1/responses", named);
  ASSERT_EQ(plain["output"].size(), 1u) << plain;
  named["stream"] = true;
  Sse sse = Stream(named, 0, "/v1/responses");
  ASSERT_EQ(sse.status, 200);
  std::string arguments;
  int deltas = 0;
  for (size_t e = 0; e < sse.events.size(); ++e) {
    if (sse.events[e] == "response.function_call_arguments.delta") {
      arguments += sse.chunks[e]["delta"].get<std::string>();
      ++deltas;
    }
  }
  EXPECT_GE(deltas, 2) << "the arguments came whole";
  EXPECT_EQ(arguments, plain["output"][0]["arguments"]);
  ASSERT_GE(sse.events.size(), 4u);
  EXPECT_EQ(sse.events[sse.events.size() - 3], "response.function_call_arguments.done");
  EXPECT_EQ(sse.events[sse.events.size() - 2], "response.output_item.done");
  EXPECT_EQ(sse.chunks[sse.chunks.size() - 2]["item"]["arguments"],
            plain["output"][0]["arguments"]);
  EXPECT_EQ(sse.chunks.back()["response"]["output"][0]["arguments"],
            plain["output"][0]["arguments"]);
}

TEST_F(HttpServerTest, ResponsesStoreOff) {
  TestSetup setup = WithRoleTemplate(DefaultSetup());
  setup.server.max_stored_responses = 0;
  Start(setup);
  const json response = PostOk("/v1/responses", {{"input", "x"}, {"max_output_tokens", 2}});
  EXPECT_EQ(response["store"], false);
  EXPECT_EQ(Client()->Get("/v1/responses/" + response["id"].get<std::string>())->status, 404);
  int status = 0;
  json refused =
      Post("/v1/responses", json({{"input", "x"}, {"previous_response_id", response["id"]}}).dump(),
           &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(refused["error"]["param"], "previous_response_id");
}

// OpenAI's Responses API: `input` and `instructions` are the chat's messages, so the text equals
// the chat completion's; max_output_tokens cuts it as "incomplete"; streamed as its typed events
// in order, with increasing sequence numbers and the final response; bad fields named as sent.
TEST_F(HttpServerTest, ResponsesApiAnswersAsChat) {
  Start(WithRoleTemplate(DefaultSetup()));
  const json chat = ReferenceChat();
  const std::string text = chat["choices"][0]["message"]["content"];
  const json input_forms[] = {"def fib(n):",
                              {{{"role", "user"},
                                {"content",
                                 {{{"type", "input_text"}, {"text", "def fib"}},
                                  {{"type", "input_text"}, {"text", "(n):"}}}}}}};
  for (const json& input : input_forms) {
    json response = PostOk("/v1/responses", {{"input", input},
                                             {"instructions", "You write Python."},
                                             {"max_output_tokens", 6},
                                             {"temperature", 0},
                                             {"ignore_eos", true},
                                             {"metadata", {{"k", "v"}}}});
    EXPECT_EQ(response["object"], "response");
    EXPECT_TRUE(absl::StartsWith(response["id"].get<std::string>(), "resp_")) << response;
    EXPECT_EQ(response["status"], "incomplete");  // cut by max_output_tokens
    EXPECT_EQ(response["incomplete_details"]["reason"], "max_output_tokens");
    EXPECT_EQ(response["instructions"], "You write Python.");
    EXPECT_EQ(response["metadata"]["k"], "v");
    ASSERT_EQ(response["output"].size(), 1u);
    const json& message = response["output"][0];
    EXPECT_EQ(message["type"], "message");
    EXPECT_EQ(message["role"], "assistant");
    EXPECT_EQ(message["content"][0]["type"], "output_text");
    EXPECT_EQ(message["content"][0]["text"], text);
    EXPECT_EQ(response["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
    EXPECT_EQ(response["usage"]["output_tokens"], 6);
    EXPECT_EQ(response["usage"]["total_tokens"], chat["usage"]["total_tokens"]);
    EXPECT_TRUE(response["usage"]["input_tokens_details"]["cached_tokens"].is_number());
  }
  // A stop within the budget: "completed".
  json done = PostOk("/v1/responses", {{"input", "def fib(n):"},
                                       {"max_output_tokens", 6},
                                       {"temperature", 0},
                                       {"stop", {text.substr(0, 1)}}});
  EXPECT_EQ(done["status"], "completed") << done;
  EXPECT_TRUE(done["incomplete_details"].is_null());

  Sse sse = Stream({{"input", "def fib(n):"},
                    {"instructions", "You write Python."},
                    {"max_output_tokens", 6},
                    {"temperature", 0},
                    {"ignore_eos", true},
                    {"stream", true}},
                   0, "/v1/responses");
  ASSERT_EQ(sse.status, 200);
  EXPECT_FALSE(sse.done);  // no [DONE] in this API
  ASSERT_EQ(sse.events.size(), sse.chunks.size());
  ASSERT_GE(sse.events.size(), 9u);
  const std::vector<std::string> opening = {"response.created", "response.in_progress",
                                            "response.output_item.added",
                                            "response.content_part.added"};
  const std::vector<std::string> closing = {"response.output_text.done",
                                            "response.content_part.done",
                                            "response.output_item.done", "response.incomplete"};
  EXPECT_EQ(std::vector<std::string>(sse.events.begin(), sse.events.begin() + 4), opening);
  EXPECT_EQ(std::vector<std::string>(sse.events.end() - 4, sse.events.end()), closing);
  std::string deltas;
  for (size_t i = 0; i < sse.chunks.size(); ++i) {
    EXPECT_EQ(sse.chunks[i]["type"], sse.events[i]);
    EXPECT_EQ(sse.chunks[i]["sequence_number"], i);
    if (sse.events[i] == "response.output_text.delta") {
      deltas += sse.chunks[i]["delta"].get<std::string>();
    } else if (i >= 4 && i + 4 < sse.chunks.size()) {
      ADD_FAILURE() << "unexpected event " << sse.events[i];
    }
  }
  EXPECT_EQ(deltas, text);
  EXPECT_EQ(sse.chunks[0]["response"]["status"], "in_progress");
  EXPECT_EQ(sse.chunks[sse.chunks.size() - 4]["text"], text);
  const json& last = sse.chunks.back()["response"];
  EXPECT_EQ(last["status"], "incomplete");
  EXPECT_EQ(last["output"][0]["content"][0]["text"], text);
  EXPECT_EQ(last["usage"]["output_tokens"], 6);

  const std::pair<json, const char*> refused[] = {
      {json{{"instructions", "x"}}, "input"},
      {json{{"input", 5}}, "input"},
      {json{{"input", json::array()}}, "input"},
      {json{{"input", {{{"type", "function_call_output"}, {"output", "x"}}}}}, "input"},
      {json{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}}}}, "input"},
      {json{{"input", "x"}, {"max_output_tokens", 0}}, "max_output_tokens"},
      {json{{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}, "tools"},
      // Function tools are "auto" by default, which needs a tool-call parser (none here).
      {json{{"input", "x"}, {"tools", {{{"type", "function"}, {"name", "f"}}}}}, "tool_choice"},
      {json{{"input", {{{"type", "function_call"}, {"name", "f"}}}}}, "input"},
      {json{{"input", "x"}, {"text", {{"format", {{"type", "yaml"}}}}}}, "text.format"},
      {json{{"input", "x"}, {"background", true}}, "background"},
      {json{{"input", "x"}, {"n", 2}}, "n"},
      {json{{"input", "x"}, {"temperature", -1}}, "temperature"},
  };
  for (const auto& [body, param] : refused) {
    int status = 0;
    json error = Post("/v1/responses", body.dump(), &status);
    EXPECT_EQ(status, 400) << body;
    EXPECT_EQ(error["error"]["param"], param) << body << " -> " << error;
  }
  // A JSON schema format guides the text (its property order kept).
  const json point = {
      {"type", "object"}, {"properties", {{"x", {{"type", "integer"}}}}}, {"required", {"x"}}};
  const json format = {{"type", "json_schema"}, {"name", "point"}, {"schema", point}};
  json schema =
      PostOk("/v1/responses",
             {{"input", "a point"}, {"max_output_tokens", 40}, {"text", {{"format", format}}}});
  const std::string doc = schema["output"][0]["content"][0]["text"];
  if (schema["status"] == "completed") {
    json value = json::parse(doc, nullptr, false);
    ASSERT_TRUE(value.is_object()) << doc;
    EXPECT_TRUE(value["x"].is_number_integer()) << doc;
  } else {
    EXPECT_TRUE(absl::StartsWith(doc, "{")) << doc;
  }
  EXPECT_EQ(schema["text"]["format"]["type"], "json_schema");
}

// Anthropic's Messages API: system + messages are the chat's, so the text equals the chat
// completion's; stop reasons in its words; streamed as its events; the key as x-api-key; errors in
// its body shape; count_tokens is the rendered prompt's length.
// Client tools on the Messages API: a named tool's call is a tool_use block (input guided by its
// schema) with stop_reason "tool_use"; "any" streamed brings the blocks whole at the end; the
// result goes back as a tool_result block and is read as the chat's tool message.
TEST_F(HttpServerTest, AnthropicMessagesTools) {
  TestSetup setup = WithRoleTemplate(DefaultSetup());
  setup.server.max_model_len = setup.engine.max_model_len = 512;
  Start(setup);
  const json tools = {{{"name", "get_weather"},
                       {"description", "the weather"},
                       {"input_schema",
                        {{"type", "object"},
                         {"properties", {{"unit", {{"enum", {"celsius", "fahrenheit"}}}}}},
                         {"required", {"unit"}}}}}};
  const json ask = {{{"role", "user"}, {"content", "weather?"}}};
  int status = 0;
  auto post = [&](const json& body) { return Post("/v1/messages", body.dump(), &status); };
  json named = post({{"max_tokens", 60},
                     {"messages", ask},
                     {"tools", tools},
                     {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}},
                     {"temperature", 0}});
  ASSERT_EQ(status, 200) << named;
  EXPECT_EQ(named["stop_reason"], "tool_use");
  ASSERT_EQ(named["content"].size(), 1u) << named;
  const json& use = named["content"][0];
  EXPECT_EQ(use["type"], "tool_use");
  EXPECT_EQ(use["name"], "get_weather");
  EXPECT_TRUE(absl::StartsWith(use["id"].get<std::string>(), "toolu_")) << use;
  EXPECT_TRUE(use["input"]["unit"] == "celsius" || use["input"]["unit"] == "fahrenheit") << use;

  // The result back: the chat of the same turns answers alike.
  json result =
      post({{"max_tokens", 5},
            {"temperature", 0},
            {"messages",
             {ask[0],
              {{"role", "assistant"}, {"content", {use}}},
              {{"role", "user"},
               {"content",
                {{{"type", "tool_result"}, {"tool_use_id", use["id"]}, {"content", "-3 C"}}}}}}}});
  ASSERT_EQ(status, 200) << result;
  const json chat =
      PostOk("/v1/chat/completions",
             {{"messages",
               {ask[0],
                {{"role", "assistant"},
                 {"content", ""},
                 {"tool_calls",
                  {{{"id", use["id"]},
                    {"type", "function"},
                    {"function", {{"name", "get_weather"}, {"arguments", use["input"].dump()}}}}}}},
                {{"role", "tool"}, {"tool_call_id", use["id"]}, {"content", "-3 C"}}}},
              {"temperature", 0},
              {"max_tokens", 5}});
  EXPECT_EQ(result["content"][0]["text"], chat["choices"][0]["message"]["content"]);
  EXPECT_EQ(result["usage"]["input_tokens"].get<int>() +
                result["usage"]["cache_read_input_tokens"].get<int>(),
            chat["usage"]["prompt_tokens"]);

  // "any" with one call, streamed: message_start, ping, the tool_use block whole, the stop.
  json any = {{"max_tokens", 80},
              {"messages", ask},
              {"tools", tools},
              {"tool_choice", {{"type", "any"}, {"disable_parallel_tool_use", true}}},
              {"temperature", 0}};
  json plain = post(any);
  ASSERT_EQ(status, 200) << plain;
  EXPECT_EQ(plain["stop_reason"], "tool_use");
  ASSERT_EQ(plain["content"].size(), 1u) << plain;
  any["stream"] = true;
  Sse sse = Stream(any, 0, "/v1/messages");
  ASSERT_EQ(sse.status, 200);
  const std::vector<std::string> expected = {
      "message_start",      "ping",          "content_block_start", "content_block_delta",
      "content_block_stop", "message_delta", "message_stop"};
  EXPECT_EQ(sse.events, expected);
  ASSERT_EQ(sse.chunks.size(), expected.size());
  EXPECT_EQ(sse.chunks[2]["content_block"]["type"], "tool_use");
  EXPECT_EQ(sse.chunks[2]["content_block"]["input"], json::object());
  EXPECT_EQ(json::parse(sse.chunks[3]["delta"]["partial_json"].get<std::string>()),
            plain["content"][0]["input"]);
  EXPECT_EQ(sse.chunks[5]["delta"]["stop_reason"], "tool_use");
}

// Streamed with tools, the Messages API sends blocks as the sample writes them: a named tool's
// input as input_json_delta pieces (several, with a step between tokens) whose concatenation is
// the plain answer's input; "auto" answering in text, its text as text_delta pieces of one text
// block equal to the plain answer's.
TEST_F(HttpServerTest, AnthropicMessagesStreamToolBlocksAsTheyGrow) {
  TestSetup setup = WithRoleTemplate(DefaultSetup());
  setup.server.max_model_len = setup.engine.max_model_len = 512;
  setup.server.tool_call_parser = "hermes";
  setup.step_delay = absl::Milliseconds(3);
  Start(setup);
  const json tools = {{{"name", "get_weather"},
                       {"input_schema",
                        {{"type", "object"},
                         {"properties", {{"city", {{"type", "string"}, {"maxLength", 12}}}}},
                         {"required", {"city"}}}}}};
  json named = {{"max_tokens", 60},
                {"messages", {{{"role", "user"}, {"content", "weather?"}}}},
                {"tools", tools},
                {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}},
                {"temperature", 0}};
  int status = 0;
  const json plain = Post("/v1/messages", named.dump(), &status);
  ASSERT_EQ(status, 200) << plain;
  ASSERT_EQ(plain["stop_reason"], "tool_use") << plain;
  named["stream"] = true;
  Sse sse = Stream(named, 0, "/v1/messages");
  ASSERT_EQ(sse.status, 200);
  ASSERT_GE(sse.events.size(), 7u);
  EXPECT_EQ(sse.events[2], "content_block_start");
  EXPECT_EQ(sse.chunks[2]["content_block"]["type"], "tool_use");
  EXPECT_TRUE(absl::StartsWith(sse.chunks[2]["content_block"]["id"].get<std::string>(), "toolu_"));
  std::string partial;
  int deltas = 0;
  for (size_t e = 3; e + 3 < sse.events.size(); ++e) {
    ASSERT_EQ(sse.events[e], "content_block_delta") << e;
    EXPECT_EQ(sse.chunks[e]["delta"]["type"], "input_json_delta");
    partial += sse.chunks[e]["delta"]["partial_json"].get<std::string>();
    ++deltas;
  }
  EXPECT_GE(deltas, 2) << "the input came whole";
  EXPECT_EQ(json::parse(partial), plain["content"][0]["input"]) << partial;
  EXPECT_EQ(sse.events[sse.events.size() - 3], "content_block_stop");
  EXPECT_EQ(sse.chunks[sse.chunks.size() - 2]["delta"]["stop_reason"], "tool_use");

  json automatic = {{"max_tokens", 8},
                    {"messages", {{{"role", "user"}, {"content", "hello"}}}},
                    {"tools", tools},
                    {"tool_choice", {{"type", "auto"}}},
                    {"temperature", 0}};
  const json text = Post("/v1/messages", automatic.dump(), &status);
  ASSERT_EQ(status, 200) << text;
  ASSERT_EQ(text["content"].size(), 1u) << text;
  ASSERT_EQ(text["content"][0]["type"], "text") << text;
  automatic["stream"] = true;
  Sse streamed = Stream(automatic, 0, "/v1/messages");
  ASSERT_EQ(streamed.status, 200);
  std::string got;
  int pieces = 0;
  for (size_t e = 0; e < streamed.events.size(); ++e) {
    if (streamed.events[e] == "content_block_start") {
      EXPECT_EQ(streamed.chunks[e]["content_block"]["type"], "text");
      EXPECT_EQ(streamed.chunks[e]["index"], 0);
    }
    if (streamed.events[e] == "content_block_delta") {
      got += streamed.chunks[e]["delta"]["text"].get<std::string>();
      ++pieces;
    }
  }
  EXPECT_EQ(got, text["content"][0]["text"]);
  EXPECT_GE(pieces, 2) << "the text came whole";
}

TEST_F(HttpServerTest, AnthropicMessagesAnswerAsChat) {
  TestSetup setup = WithRoleTemplate(DefaultSetup());
  setup.server.api_key = "k";
  Start(setup);
  httplib::Client anthropic("127.0.0.1", server_->port());
  anthropic.set_default_headers({{"x-api-key", "k"}, {"anthropic-version", "2023-06-01"}});
  auto post = [&](const json& body, int* status) {
    auto result = anthropic.Post("/v1/messages", body.dump(), "application/json");
    *status = result ? result->status : -1;
    return result ? json::parse(result->body, nullptr, false) : json();
  };
  const json chat = ReferenceChat();
  const std::string text = chat["choices"][0]["message"]["content"];
  int status = 0;
  json message = post({{"model", "demo"},
                       {"system", {{{"type", "text"}, {"text", "You write Python."}}}},
                       {"messages", {{{"role", "user"}, {"content", "def fib(n):"}}}},
                       {"max_tokens", 6},
                       {"temperature", 0}},
                      &status);
  ASSERT_EQ(status, 200) << message;
  EXPECT_EQ(message["type"], "message");
  EXPECT_EQ(message["role"], "assistant");
  EXPECT_TRUE(absl::StartsWith(message["id"].get<std::string>(), "msg_"));
  ASSERT_EQ(message["content"].size(), 1u);
  EXPECT_EQ(message["content"][0]["type"], "text");
  const std::string answer = message["content"][0]["text"];
  // The same 6 tokens unless EOS came first (the chat ran with ignore_eos).
  EXPECT_TRUE(absl::StartsWith(text, answer)) << answer << " / " << text;
  if (message["stop_reason"] == "max_tokens") {
    EXPECT_EQ(answer, text);
    EXPECT_EQ(message["usage"]["output_tokens"], 6);
  } else {
    EXPECT_EQ(message["stop_reason"], "end_turn") << message;
  }
  EXPECT_EQ(message["usage"]["input_tokens"].get<int>() +
                message["usage"]["cache_read_input_tokens"].get<int>(),
            chat["usage"]["prompt_tokens"]);
  // A stop sequence: stop_reason "stop_sequence" naming it.
  json stopped = post({{"messages", {{{"role", "user"}, {"content", "def fib(n):"}}}},
                       {"system", "You write Python."},
                       {"max_tokens", 6},
                       {"temperature", 0},
                       {"stop_sequences", {text.substr(1, 1)}}},
                      &status);
  ASSERT_EQ(status, 200) << stopped;
  EXPECT_EQ(stopped["stop_reason"], "stop_sequence") << stopped;
  EXPECT_EQ(stopped["stop_sequence"], text.substr(1, 1));
  EXPECT_EQ(stopped["content"][0]["text"], text.substr(0, 1));

  // Streamed: its events in order, the deltas make the text.
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/messages";
  req.headers = {{"x-api-key", "k"}, {"Content-Type", "application/json"}};
  req.body = json({{"messages", {{{"role", "user"}, {"content", "def fib(n):"}}}},
                   {"system", "You write Python."},
                   {"max_tokens", 6},
                   {"temperature", 0},
                   {"stream", true}})
                 .dump();
  std::string raw;
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    raw.append(data, len);
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  anthropic.send(req, res, error);
  ASSERT_EQ(res.status, 200);
  std::vector<std::string> events;
  std::string deltas;
  json final_delta;
  for (absl::string_view block : absl::StrSplit(raw, "\n\n", absl::SkipEmpty())) {
    std::vector<absl::string_view> lines = absl::StrSplit(block, '\n');
    if (lines.size() != 2 || !absl::StartsWith(lines[0], "event: ")) continue;  // keep-alives
    events.emplace_back(lines[0].substr(7));
    json data = json::parse(lines[1].substr(6), nullptr, false);
    ASSERT_TRUE(data.is_object()) << lines[1];
    EXPECT_EQ(data["type"], events.back());
    if (events.back() == "content_block_delta") deltas += data["delta"]["text"].get<std::string>();
    if (events.back() == "message_delta") final_delta = data;
  }
  ASSERT_GE(events.size(), 7u);
  EXPECT_EQ(std::vector<std::string>(events.begin(), events.begin() + 3),
            (std::vector<std::string>{"message_start", "content_block_start", "ping"}));
  EXPECT_EQ(std::vector<std::string>(events.end() - 3, events.end()),
            (std::vector<std::string>{"content_block_stop", "message_delta", "message_stop"}));
  EXPECT_EQ(deltas, answer);
  EXPECT_EQ(final_delta["delta"]["stop_reason"], message["stop_reason"]);

  // A last assistant turn is a prefill the answer continues (chat's continue_final_message).
  const json prefill = {{{"role", "user"}, {"content", "def fib(n):"}},
                        {{"role", "assistant"}, {"content", "    return"}}};
  json continued = post({{"messages", prefill}, {"max_tokens", 4}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200) << continued;
  json chat_continued = PostOk("/v1/chat/completions", {{"messages", prefill},
                                                        {"max_tokens", 4},
                                                        {"temperature", 0},
                                                        {"add_generation_prompt", false},
                                                        {"continue_final_message", true}});
  EXPECT_EQ(continued["content"][0]["text"], chat_continued["choices"][0]["message"]["content"]);

  // count_tokens: the rendered prompt's length.
  auto count = anthropic.Post("/v1/messages/count_tokens",
                              json({{"system", "You write Python."},
                                    {"messages", {{{"role", "user"}, {"content", "def fib(n):"}}}}})
                                  .dump(),
                              "application/json");
  ASSERT_TRUE(count && count->status == 200);
  EXPECT_EQ(json::parse(count->body)["input_tokens"], chat["usage"]["prompt_tokens"]);

  // Errors in Anthropic's shape; the key is required.
  const std::pair<json, int> refused[] = {
      {json{{"messages", {{{"role", "user"}, {"content", "x"}}}}}, 400},  // no max_tokens
      {json{{"max_tokens", 4}, {"messages", json::array()}}, 400},
      {json{{"max_tokens", 4}, {"messages", {{{"role", "system"}, {"content", "x"}}}}}, 400},
      {json{{"max_tokens", 4},
            {"messages", {{{"role", "user"}, {"content", {{{"type", "image"}}}}}}}},
       400},
      {json{{"max_tokens", 4},
            {"messages", {{{"role", "user"}, {"content", "x"}}}},
            {"tools", {{{"name", "f"}}}}},  // "auto" by default: no tool-call parser here
       400},
      {json{{"max_tokens", 4},
            {"messages", {{{"role", "user"}, {"content", "x"}}}},
            {"tools", {{{"type", "web_search_20250305"}, {"name", "web_search"}}}}},
       400},
      {json{{"max_tokens", 4},
            {"messages", {{{"role", "user"}, {"content", "x"}}}},
            {"model", "other"}},
       404},
  };
  for (const auto& [body, code] : refused) {
    json got = post(body, &status);
    EXPECT_EQ(status, code) << body;
    EXPECT_EQ(got["type"], "error") << got;
    EXPECT_FALSE(got["error"]["message"].get<std::string>().empty()) << got;
  }
  httplib::Client keyless("127.0.0.1", server_->port());
  auto denied =
      keyless.Post("/v1/messages", json({{"max_tokens", 4}, {"messages", kReferenceChat}}).dump(),
                   "application/json");
  ASSERT_TRUE(denied);
  EXPECT_EQ(denied->status, 401);
  EXPECT_EQ(json::parse(denied->body)["error"]["type"], "authentication_error");
}

// /v1/chat/completions with a chat template (starchat-beta's): the prompt is the rendered
// conversation with its special tokens as tokens, so the answer equals /v1/completions on those
// tokens; streamed as chat chunks; the template's and the request's errors are 400s.
TEST_F(HttpServerTest, ChatCompletionsRenderTheTemplateAndAnswerAsCompletions) {
  TestSetup setup = DefaultSetup();
  auto parsed = ChatTemplate::Parse(
      "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
      "{{ '<|user|>\\n' + message['content'] + eos_token }}\n"
      "{% elif message['role'] == 'system' %}\n{{ '<|system|>\\n' + message['content'] + "
      "eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
      "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% else %}\n"
      "{{ raise_exception('unknown role ' + message['role']) }}\n{% endif %}\n"
      "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
      "{% endfor %}");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  setup.server.chat_template = std::make_shared<const ChatTemplate>(*std::move(parsed));
  setup.server.eos_token = "<|endoftext|>";
  Start(setup);
  const Tokenizer& tok = FixtureTokenizer();
  const json messages = {
      {{"role", "system"}, {"content", "You write Python."}},
      {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "def fib(n):"}}}}}};
  const std::vector<int32_t> prompt = tok.Encode(
      "<|system|>\nYou write Python.<|endoftext|>\n<|user|>\ndef fib(n):<|endoftext|>\n"
      "<|assistant|>\n",
      /*parse_special=*/true);
  ASSERT_NE(std::find(prompt.begin(), prompt.end(), 0), prompt.end()) << "EOS as a token";

  json chat = PostOk("/v1/chat/completions", {{"model", "demo"},
                                              {"messages", messages},
                                              {"max_completion_tokens", 12},
                                              {"temperature", 0}});
  json same =
      PostOk("/v1/completions", {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}});
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_TRUE(absl::StartsWith(chat["id"].get<std::string>(), "chatcmpl-"));
  ASSERT_EQ(chat["choices"].size(), 1u);
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], same["choices"][0]["text"]);
  EXPECT_EQ(chat["choices"][0]["finish_reason"], same["choices"][0]["finish_reason"]);
  EXPECT_EQ(chat["usage"], same["usage"]);
  EXPECT_EQ(chat["usage"]["prompt_tokens"], prompt.size());

  // Streamed: the role first, then the text in deltas, then the finish; usage; [DONE].
  Sse sse = Stream({{"messages", messages},
                    {"max_tokens", 12},
                    {"temperature", 0},
                    {"n", 2},
                    {"stream", true},
                    {"stream_options", {{"include_usage", true}}}},
                   0, "/v1/chat/completions");
  ASSERT_EQ(sse.status, 200);
  EXPECT_TRUE(sse.done);
  std::map<int, std::string> content;
  std::map<int, int> finishes;
  std::set<int> roles;
  for (const json& chunk : sse.chunks) {
    if (chunk["choices"].empty()) {
      EXPECT_EQ(chunk["usage"]["completion_tokens"],
                2 * chat["usage"]["completion_tokens"].get<int>());
      continue;
    }
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    const json& c = chunk["choices"][0];
    const int index = c["index"];
    if (c["delta"].contains("role")) {
      EXPECT_EQ(c["delta"]["role"], "assistant");
      EXPECT_FALSE(roles.contains(index)) << "role sent twice";
      EXPECT_TRUE(content[index].empty()) << "role after content";
      roles.insert(index);
    }
    if (c["delta"].contains("content")) content[index] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++finishes[index];
  }
  EXPECT_EQ(roles, std::set<int>({0, 1}));
  for (int i : {0, 1}) {
    EXPECT_EQ(content[i], chat["choices"][0]["message"]["content"]) << i;  // greedy: the same
    EXPECT_EQ(finishes[i], 1) << i;
  }

  // vLLM's /tokenize of a conversation: the chat prompt's tokens, with or without the generation
  // prompt; both fields, or a template error, are 400s.
  json counted = PostOk("/tokenize", {{"messages", messages}});
  EXPECT_EQ(counted["tokens"].get<std::vector<int32_t>>(), prompt);
  json without = PostOk("/tokenize", {{"messages", messages}, {"add_generation_prompt", false}});
  EXPECT_EQ(without["count"].get<size_t>(),
            tok.Encode("<|system|>\nYou write Python.<|endoftext|>\n<|user|>\ndef fib(n):"
                       "<|endoftext|>\n",
                       /*parse_special=*/true)
                .size());
  int tokenize_status = 0;
  Post("/tokenize", json({{"messages", messages}, {"prompt", "x"}}).dump(), &tokenize_status);
  EXPECT_EQ(tokenize_status, 400);
  json unknown_role =
      Post("/tokenize", json({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}).dump(),
           &tokenize_status);
  EXPECT_EQ(tokenize_status, 400);
  EXPECT_EQ(unknown_role["error"]["message"], "unknown role tool");

  // vLLM's continue_final_message: the prompt ends inside a prefilled assistant turn (no EOS
  // after it, no new turn), so the answer goes on from it: equal to /v1/completions on the
  // template's rendering cut after that message's text.
  const json prefilled = {{{"role", "user"}, {"content", "def fib(n):"}},
                          {{"role", "assistant"}, {"content", "    return"}}};
  const std::vector<int32_t> cut = tok.Encode(
      "<|user|>\ndef fib(n):<|endoftext|>\n<|assistant|>\n    return", /*parse_special=*/true);
  json continued = PostOk("/v1/chat/completions", {{"messages", prefilled},
                                                   {"add_generation_prompt", false},
                                                   {"continue_final_message", true},
                                                   {"max_tokens", 8},
                                                   {"temperature", 0}});
  json continued_same =
      PostOk("/v1/completions", {{"prompt", cut}, {"max_tokens", 8}, {"temperature", 0}});
  EXPECT_EQ(continued["usage"]["prompt_tokens"], cut.size());
  EXPECT_EQ(continued["choices"][0]["message"]["content"], continued_same["choices"][0]["text"]);
  // vLLM's chat echo: the continued message's own text first (in a stream, the opening delta).
  json echoed = PostOk("/v1/chat/completions", {{"messages", prefilled},
                                                {"add_generation_prompt", false},
                                                {"continue_final_message", true},
                                                {"echo", true},
                                                {"max_tokens", 8},
                                                {"temperature", 0}});
  EXPECT_EQ(echoed["choices"][0]["message"]["content"],
            "    return" + continued_same["choices"][0]["text"].get<std::string>());
  Sse echoed_stream = Stream({{"messages", prefilled},
                              {"add_generation_prompt", false},
                              {"continue_final_message", true},
                              {"echo", true},
                              {"max_tokens", 8},
                              {"temperature", 0},
                              {"stream", true}},
                             0, "/v1/chat/completions");
  std::string echoed_text;
  for (const json& chunk : echoed_stream.chunks) {
    const json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content")) echoed_text += delta["content"].get<std::string>();
  }
  EXPECT_EQ(echoed_text, echoed["choices"][0]["message"]["content"]);
  ASSERT_FALSE(echoed_stream.chunks.empty());
  EXPECT_EQ(echoed_stream.chunks[0]["choices"][0]["delta"]["content"], "    return");
  // A user's last message is not the answer's to repeat.
  json not_echoed = PostOk(
      "/v1/chat/completions",
      {{"messages", messages}, {"echo", true}, {"max_completion_tokens", 12}, {"temperature", 0}});
  EXPECT_EQ(not_echoed["choices"][0]["message"]["content"],
            chat["choices"][0]["message"]["content"]);
  json continued_tokens = PostOk("/tokenize", {{"messages", prefilled},
                                               {"add_generation_prompt", false},
                                               {"continue_final_message", true}});
  EXPECT_EQ(continued_tokens["tokens"].get<std::vector<int32_t>>(), cut);
  // chat_template_kwargs reach the template (here eos_token, which they may override).
  json kwargs_tokens = PostOk("/tokenize", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                            {"chat_template_kwargs", {{"eos_token", "<|end|>"}}}});
  EXPECT_EQ(kwargs_tokens["tokens"].get<std::vector<int32_t>>(),
            tok.Encode("<|user|>\nhi<|end|>\n<|assistant|>\n", /*parse_special=*/true));

  // Without max_tokens a chat answer may run to the context (OpenAI's default), not 16 tokens.
  json long_answer = PostOk("/v1/chat/completions",
                            {{"messages", messages}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(long_answer["usage"]["completion_tokens"], 128 - static_cast<int>(prompt.size()));
  EXPECT_EQ(long_answer["choices"][0]["finish_reason"], "length");

  // Chat's logprobs: each token's text, log-probability and bytes, with top_logprobs
  // alternatives, equal to /v1/completions' scores of the same tokens; streamed alike.
  json scored = PostOk("/v1/chat/completions", {{"messages", messages},
                                                {"max_tokens", 6},
                                                {"temperature", 0},
                                                {"logprobs", true},
                                                {"top_logprobs", 2}});
  json reference =
      PostOk("/v1/completions",
             {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 2}});
  const json& token_scores = scored["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(token_scores.size(), reference["choices"][0]["logprobs"]["token_logprobs"].size());
  for (size_t k = 0; k < token_scores.size(); ++k) {
    EXPECT_EQ(token_scores[k]["token"], reference["choices"][0]["logprobs"]["tokens"][k]);
    EXPECT_NEAR(token_scores[k]["logprob"].get<double>(),
                reference["choices"][0]["logprobs"]["token_logprobs"][k].get<double>(), 1e-6);
    ASSERT_EQ(token_scores[k]["top_logprobs"].size(), 2u);
    std::string bytes;
    for (const json& b : token_scores[k]["bytes"]) bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(bytes, token_scores[k]["token"].get<std::string>());
  }
  EXPECT_TRUE(chat["choices"][0]["logprobs"].is_null());  // not asked for
  Sse scored_stream = Stream({{"messages", messages},
                              {"max_tokens", 6},
                              {"temperature", 0},
                              {"logprobs", true},
                              {"stream", true}},
                             0, "/v1/chat/completions");
  size_t streamed = 0;
  for (const json& chunk : scored_stream.chunks) {
    for (const json& c : chunk["choices"]) {
      if (c["logprobs"].is_object()) streamed += c["logprobs"]["content"].size();
    }
  }
  EXPECT_EQ(streamed, token_scores.size());

  // Errors: the template's own (an unknown role), the request's shape, what chat does not do.
  const std::pair<json, std::string> refused[] = {
      {{{"messages", {{{"role", "tool"}, {"content", "x"}}}}}, "messages"},
      {{{"messages", json::array()}}, "messages"},
      {{{"messages", {{{"content", "no role"}}}}}, "messages"},
      {{{"messages", {{{"role", "user"}, {"content", 5}}}}}, "messages"},
      {{{"messages", messages}, {"top_logprobs", 2}}, "top_logprobs"},
      {{{"messages", messages}, {"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {{{"messages", messages}, {"tools", {{{"type", "function"}}}}}, "tools"},
      {{{"messages", messages}, {"max_tokens", 3}, {"max_completion_tokens", 3}},
       "max_completion_tokens"},
      // add_generation_prompt is true unless given false.
      {{{"messages", prefilled}, {"continue_final_message", true}}, "continue_final_message"},
      {{{"messages", messages}, {"chat_template_kwargs", {{"messages", json::array()}}}},
       "chat_template_kwargs"},
      {{{"messages", messages}, {"chat_template_kwargs", "x"}}, "chat_template_kwargs"},
  };
  for (const auto& [body, param] : refused) {
    int status = 0;
    json error = Post("/v1/chat/completions", body.dump(), &status);
    EXPECT_EQ(status, 400) << body;
    EXPECT_EQ(error["error"]["param"], param) << body << " -> " << error;
  }
  int status = 0;
  json raised = Post("/v1/chat/completions",
                     json({{"messages", {{{"role", "tool"}, {"content", "x"}}}}}).dump(), &status);
  EXPECT_EQ(raised["error"]["message"], "unknown role tool");
}

// Tool calls: the tools reach the template; a named function's output is its call's arguments,
// "required" gives a list of calls; plain and streamed agree (greedy), the stream names each call
// once and sends a named call's arguments as they grow.
TEST_F(HttpServerTest, ChatToolCallsNamedAndRequired) {
  TestSetup setup = DefaultSetup();
  setup.server.max_model_len = setup.engine.max_model_len = 512;
  // Steps slow enough that a stream's deltas go out between them.
  setup.step_delay = absl::Milliseconds(3);
  auto parsed = ChatTemplate::Parse(
      "{% if tools %}{% for tool in tools %}[{{ tool.function.name }}]{% endfor %}{% endif %}"
      "{% for message in messages %}{{ message.role }}: {{ message.content }}\n"
      "{% if message.tool_calls %}{{ message.tool_calls[0].function.arguments.city }}\n"
      "{% endif %}{% endfor %}assistant:");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  setup.server.chat_template = std::make_shared<const ChatTemplate>(*std::move(parsed));
  Start(setup);
  const json tools = {
      {{"type", "function"},
       {"function",
        {{"name", "get_weather"},
         {"parameters",
          {{"type", "object"},
           {"properties",
            {{"unit", {{"enum", {"celsius", "fahrenheit"}}}}, {"daily", {{"type", "boolean"}}}}},
           {"required", {"unit", "daily"}}}}}}},
      {{"type", "function"},
       {"function",
        {{"name", "set_alarm"},
         {"parameters",
          {{"type", "object"},
           {"properties", {{"armed", {{"type", "boolean"}}}}},
           {"required", {"armed"}}}}}}}};
  const json messages = {
      {{"role", "user"}, {"content", "weather?"}},
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "c1"},
          {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "cold"}}};
  // The template saw the tools and the earlier call's arguments as an object.
  json tokens = PostOk("/tokenize", {{"messages", messages}, {"tools", tools}});
  EXPECT_EQ(tokens["tokens"].get<std::vector<int32_t>>(),
            FixtureTokenizer().Encode("[get_weather][set_alarm]user: weather?\nassistant: \n"
                                      "Oslo\ntool: cold\nassistant:",
                                      /*parse_special=*/true));

  auto check_call = [](const json& call, const std::string& name) {
    EXPECT_TRUE(absl::StartsWith(call["id"].get<std::string>(), "chatcmpl-tool-")) << call;
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["function"]["name"], name);
    json arguments = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(arguments.is_object()) << call;
    if (name == "get_weather") {
      EXPECT_TRUE(arguments["unit"] == "celsius" || arguments["unit"] == "fahrenheit") << call;
      EXPECT_TRUE(arguments["daily"].is_boolean()) << call;
    } else {
      EXPECT_TRUE(arguments["armed"].is_boolean()) << call;
    }
  };
  // Each call of a stream: its first delta (id, type, name) followed by its arguments' deltas.
  auto streamed_calls = [](const Sse& sse, std::string* finish) {
    json calls = json::array();
    for (const json& chunk : sse.chunks) {
      for (const json& c : chunk["choices"]) {
        if (!c["finish_reason"].is_null()) *finish = c["finish_reason"];
        if (!c["delta"].contains("tool_calls")) continue;
        EXPECT_FALSE(c["delta"].contains("content") && !c["delta"]["content"].is_null()) << c;
        for (const json& delta : c["delta"]["tool_calls"]) {
          const size_t index = delta["index"];
          if (delta.contains("id")) {
            EXPECT_EQ(index, calls.size()) << "a call named twice: " << delta;
            calls.push_back(delta);
          } else {
            EXPECT_LT(index, calls.size()) << "arguments before the call's name: " << delta;
            if (index >= calls.size()) continue;
            calls[index]["function"]["arguments"] =
                calls[index]["function"]["arguments"].get<std::string>() +
                delta["function"]["arguments"].get<std::string>();
          }
        }
      }
    }
    return calls;
  };

  // A named function.
  const json named = {
      {"messages", messages},
      {"tools", tools},
      {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
      {"temperature", 0},
      {"max_tokens", 60}};
  json plain = PostOk("/v1/chat/completions", named);
  const json& message = plain["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null()) << plain;
  ASSERT_EQ(message["tool_calls"].size(), 1u) << plain;
  check_call(message["tool_calls"][0], "get_weather");
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "stop");
  json stream_body = named;
  stream_body["stream"] = true;
  Sse sse = Stream(stream_body, 0, "/v1/chat/completions");
  ASSERT_EQ(sse.status, 200);
  std::string finish;
  json calls = streamed_calls(sse, &finish);
  ASSERT_EQ(calls.size(), 1u);
  check_call(calls[0], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"], message["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(finish, "stop");
  int argument_deltas = 0;
  for (const json& chunk : sse.chunks) {
    for (const json& c : chunk["choices"]) argument_deltas += c["delta"].contains("tool_calls");
  }
  EXPECT_GE(argument_deltas, 2) << "the arguments should stream as they are written";

  // Required, one call at most: always complete (its language is finite).
  json required = named;
  required["tool_choice"] = "required";
  required["parallel_tool_calls"] = false;
  plain = PostOk("/v1/chat/completions", required);
  ASSERT_EQ(plain["choices"][0]["message"]["tool_calls"].size(), 1u) << plain;
  const json& call = plain["choices"][0]["message"]["tool_calls"][0];
  check_call(call, call["function"]["name"]);
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "tool_calls");
  required["stream"] = true;
  finish.clear();
  calls = streamed_calls(Stream(required, 0, "/v1/chat/completions"), &finish);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"], call["function"]);
  EXPECT_NE(calls[0]["id"], call["id"]);
  EXPECT_EQ(finish, "tool_calls");

  // Required, as many calls as the model writes in n = 2 seeded samples: plain and streamed agree
  // call for call; a list cut by max_tokens is content with finish_reason "length".
  json parallel = {{"messages", messages}, {"tools", tools}, {"tool_choice", "required"},
                   {"temperature", 1.5},   {"seed", 7},      {"n", 2},
                   {"max_tokens", 400}};
  plain = PostOk("/v1/chat/completions", parallel);
  parallel["stream"] = true;
  Sse sampled = Stream(parallel, 0, "/v1/chat/completions");
  ASSERT_EQ(sampled.status, 200);
  int complete = 0;
  size_t most_calls = 0;
  for (int i = 0; i < 2; ++i) {
    const json& choice = plain["choices"][i];
    Sse one;
    for (const json& chunk : sampled.chunks) {
      if (!chunk["choices"].empty() && chunk["choices"][0]["index"] == i)
        one.chunks.push_back(chunk);
    }
    finish.clear();
    calls = streamed_calls(one, &finish);
    EXPECT_EQ(finish, choice["finish_reason"]) << choice;
    if (choice["finish_reason"] == "tool_calls") {
      ++complete;
      most_calls = std::max(most_calls, calls.size());
      ASSERT_EQ(calls.size(), choice["message"]["tool_calls"].size()) << choice;
      for (size_t k = 0; k < calls.size(); ++k) {
        check_call(calls[k], choice["message"]["tool_calls"][k]["function"]["name"]);
        EXPECT_EQ(calls[k]["function"], choice["message"]["tool_calls"][k]["function"]);
      }
    } else {
      EXPECT_EQ(choice["finish_reason"], "length") << choice;
      EXPECT_TRUE(choice["message"]["content"].is_string()) << choice;
      EXPECT_FALSE(choice["message"].contains("tool_calls")) << choice;
    }
  }
  std::cout << complete << " of 2 sampled required-form answers complete, " << most_calls
            << " calls at most\n";

  int status = 0;
  json error = Post("/v1/chat/completions", json({{"messages", messages}, {"tools", tools}}).dump(),
                    &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "tool_choice");
  EXPECT_TRUE(absl::StrContains(error["error"]["message"].get<std::string>(), "\"auto\"")) << error;
}

// "auto" with the Hermes parser (--enable-auto-tool-choice --tool-call-parser hermes): the model
// decides (here a guide makes the fake model write a Hermes answer, or plain text); content before
// the calls, the calls as tool_calls, finish_reason "tool_calls"; streamed, the same content and
// calls with no tag text leaking; plain text stays content. Without the parser, a 400.
TEST_F(HttpServerTest, ChatToolChoiceAutoReadsHermesCalls) {
  TestSetup setup = WithRoleTemplate(DefaultSetup());
  setup.server.max_model_len = setup.engine.max_model_len = 512;
  setup.server.tool_call_parser = "hermes";
  Start(setup);
  const json tools = {
      {{"type", "function"},
       {"function",
        {{"name", "get_weather"},
         {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}};
  const json messages = {{{"role", "user"}, {"content", "weather in Paris and Rome?"}}};
  const std::string hermes =
      R"re(Checking\.\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Paris|Rome)"\}\}\n</tool_call>\n)re"
      R"re(<tool_call>\{"name": "get_weather", "arguments": \{"city": "Rome"\}\}</tool_call>)re";
  json body = {{"messages", messages},
               {"tools", tools},
               {"guided_regex", hermes},
               {"temperature", 0},
               {"max_tokens", 200}};
  json plain = PostOk("/v1/chat/completions", body);
  const json& choice = plain["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << plain;
  EXPECT_EQ(choice["message"]["content"], "Checking.\n") << plain;
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 2u) << plain;
  for (const json& call : choice["message"]["tool_calls"]) {
    EXPECT_TRUE(absl::StartsWith(call["id"].get<std::string>(), "chatcmpl-tool-")) << call;
    EXPECT_EQ(call["function"]["name"], "get_weather");
  }
  const json first_args =
      json::parse(choice["message"]["tool_calls"][0]["function"]["arguments"].get<std::string>());
  EXPECT_TRUE(first_args["city"] == "Paris" || first_args["city"] == "Rome") << first_args;
  EXPECT_EQ(choice["message"]["tool_calls"][1]["function"]["arguments"], R"({"city":"Rome"})");

  body["stream"] = true;
  Sse sse = Stream(body, 0, "/v1/chat/completions");
  ASSERT_EQ(sse.status, 200);
  std::string content;
  json calls = json::array();
  std::string finish;
  for (const json& chunk : sse.chunks) {
    for (const json& c : chunk["choices"]) {
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
      if (c["delta"].contains("content") && c["delta"]["content"].is_string()) {
        content += c["delta"]["content"].get<std::string>();
      }
      if (c["delta"].contains("tool_calls")) {
        for (const json& call : c["delta"]["tool_calls"]) {
          EXPECT_EQ(call["index"], calls.size()) << call;
          calls.push_back(call);
        }
      }
    }
  }
  EXPECT_EQ(content, "Checking.\n");
  EXPECT_EQ(finish, "tool_calls");
  ASSERT_EQ(calls.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(calls[k]["function"], choice["message"]["tool_calls"][k]["function"]) << k;
  }

  // The model answers in text: content, finish_reason as usual; streamed alike.
  json text_body = {{"messages", messages},
                    {"tools", tools},
                    {"guided_regex", "It is sunny <tool"},
                    {"temperature", 0},
                    {"max_tokens", 100}};
  plain = PostOk("/v1/chat/completions", text_body);
  EXPECT_EQ(plain["choices"][0]["message"]["content"], "It is sunny <tool") << plain;
  EXPECT_FALSE(plain["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "stop");
  text_body["stream"] = true;
  sse = Stream(text_body, 0, "/v1/chat/completions");
  content.clear();
  for (const json& chunk : sse.chunks) {
    for (const json& c : chunk["choices"]) {
      EXPECT_FALSE(c["delta"].contains("tool_calls")) << c;
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    }
  }
  EXPECT_EQ(content, "It is sunny <tool");  // the held-back tail released at the end

  int status = 0;
  json error =
      Post("/v1/chat/completions",
           json({{"messages", messages}, {"tools", tools}, {"echo", true}}).dump(), &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "echo");
}

TEST_F(HttpServerTest, ChatToolChoiceAutoNeedsAParser) {
  Start(WithRoleTemplate(DefaultSetup()));
  const json tools = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  for (const json& choice : {json(nullptr), json("auto")}) {
    json body = {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", tools}};
    if (!choice.is_null()) body["tool_choice"] = choice;
    int status = 0;
    json error = Post("/v1/chat/completions", body.dump(), &status);
    EXPECT_EQ(status, 400) << body;
    EXPECT_EQ(error["error"]["param"], "tool_choice");
    EXPECT_TRUE(
        absl::StrContains(error["error"]["message"].get<std::string>(), "--tool-call-parser"))
        << error;
  }
}

// generation_config.json as the launcher gives it: requests that leave temperature and max_tokens
// unset run greedy for 5 tokens; an extra end-of-sequence id stops every request (stop_reason the
// id) unless it sets ignore_eos, on the OpenAI and TGI APIs alike.
TEST_F(HttpServerTest, GenerationConfigDefaultsAndEndOfSequenceIds) {
  TestSetup setup = DefaultSetup();
  setup.server.sampling_defaults = {{"temperature", 0}, {"max_tokens", 5}};
  const std::vector<int32_t> prompt = FixtureTokenizer().Encode("def main():");
  const std::vector<int32_t> greedy = GreedyReference(prompt, 12, setup.runner.vocab_size);
  ASSERT_EQ(greedy.size(), 12u) << "the reference should not end early";
  // The greedy continuation's 8th token, where it first appears, ends sequences.
  const int32_t stop_id = greedy[7];
  const size_t stop_at = std::find(greedy.begin(), greedy.end(), stop_id) - greedy.begin();
  setup.server.stop_token_ids = {stop_id};
  Start(setup);

  json plain = PostOk("/v1/completions", {{"prompt", prompt}, {"return_token_ids", true}});
  EXPECT_EQ(plain["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(greedy.begin(), greedy.begin() + std::min<size_t>(5, stop_at + 1)))
      << "greedy, 5 tokens at most, without the request saying so";
  json longer = PostOk("/v1/completions",
                       {{"prompt", prompt}, {"max_tokens", 12}, {"return_token_ids", true}});
  EXPECT_EQ(longer["choices"][0]["token_ids"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(greedy.begin(), greedy.begin() + stop_at + 1));
  EXPECT_EQ(longer["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(longer["choices"][0]["stop_reason"], stop_id);
  json ignoring = PostOk(
      "/v1/completions",
      {{"prompt", prompt}, {"max_tokens", 12}, {"ignore_eos", true}, {"return_token_ids", true}});
  EXPECT_EQ(ignoring["choices"][0]["token_ids"].get<std::vector<int32_t>>(), greedy);
  EXPECT_EQ(ignoring["choices"][0]["finish_reason"], "length");
  // TGI: the same stop (its own defaults otherwise).
  json tgi = PostOk("/generate", {{"inputs", "def main():"},
                                  {"parameters", {{"max_new_tokens", 12}, {"details", true}}}});
  EXPECT_EQ(tgi["details"]["generated_tokens"], stop_at + 1) << tgi;
}

// vLLM's use_beam_search: the n best continuations by the oracle above, for two prompts, plain and
// streamed (the choices whole at the end), with a length penalty; width 1 without EOS is greedy;
// what beam search would ignore is refused.
TEST_F(HttpServerTest, BeamSearchFindsTheBestContinuations) {
  TestSetup setup = DefaultSetup();
  Start(setup);
  const int vocab = setup.runner.vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {FixtureTokenizer().Encode("def main():"),
                                                     FixtureTokenizer().Encode("import os\n")};
  for (const double penalty : {1.0, 0.0, 2.5}) {
    SCOPED_TRACE(penalty);
    json body = {{"prompt", prompts}, {"use_beam_search", true},   {"n", 3},
                 {"max_tokens", 6},   {"length_penalty", penalty}, {"return_token_ids", true}};
    json plain = PostOk("/v1/completions", body);
    ASSERT_EQ(plain["choices"].size(), 6u) << plain;
    int completion_tokens = 0;
    for (int p = 0; p < 2; ++p) {
      const auto want = ReferenceBeamSearch(prompts[p], 3, 6, penalty, vocab, /*eos=*/0);
      ASSERT_EQ(want.size(), 3u);
      for (int i = 0; i < 3; ++i) {
        const json& c = plain["choices"][p * 3 + i];
        EXPECT_EQ(c["index"], p * 3 + i);
        EXPECT_EQ(c["token_ids"].get<std::vector<int32_t>>(), want[i].first)
            << "prompt " << p << " beam " << i;
        EXPECT_EQ(c["finish_reason"], want[i].second ? "stop" : "length");
        std::vector<int32_t> shown = want[i].first;
        if (want[i].second) shown.pop_back();
        EXPECT_EQ(c["text"], FixtureTokenizer().Decode(shown));
        completion_tokens += static_cast<int>(want[i].first.size());
      }
    }
    EXPECT_EQ(plain["usage"]["completion_tokens"], completion_tokens);
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    Sse sse = Stream(body);
    ASSERT_EQ(sse.status, 200);
    EXPECT_TRUE(sse.done);
    json streamed = json::array();
    for (const json& chunk : sse.chunks) {
      for (const json& c : chunk["choices"]) streamed.push_back(c);
      if (chunk["choices"].empty()) EXPECT_EQ(chunk["usage"], plain["usage"]);
    }
    EXPECT_EQ(streamed, plain["choices"]);
  }
  // Width 1 without EOS: greedy.
  json one = PostOk("/v1/completions", {{"prompt", prompts[0]},
                                        {"use_beam_search", true},
                                        {"max_tokens", 8},
                                        {"ignore_eos", true},
                                        {"return_token_ids", true}});
  std::vector<int32_t> greedy;
  std::vector<int32_t> history = prompts[0];
  for (int i = 0; i < 8; ++i) {
    const std::vector<float> logits = testing::ReferenceLogits(history, vocab);
    greedy.push_back(
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    history.push_back(greedy.back());
  }
  EXPECT_EQ(one["choices"][0]["token_ids"].get<std::vector<int32_t>>(), greedy);

  for (const auto& [extra, param] :
       std::vector<std::pair<json, std::string>>{{{{"logprobs", 2}}, "logprobs"},
                                                 {{{"stop", "x"}}, "stop"},
                                                 {{{"guided_regex", "a+"}}, "guided_regex"},
                                                 {{{"echo", true}}, "echo"},
                                                 {{{"n", 9}}, "n"},
                                                 {{{"top_p", 0.5}}, "top_p"}}) {
    json body = {{"prompt", "x"}, {"use_beam_search", true}, {"max_tokens", 2}};
    body.update(extra);
    int status = 0;
    json error = Post("/v1/completions", body.dump(), &status);
    EXPECT_EQ(status, 400) << body;
    EXPECT_EQ(error["error"]["param"], param) << error;
  }
  int status = 0;
  json chat =
      Post("/v1/completions", json({{"prompt", "x"}, {"length_penalty", 2.0}}).dump(), &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(chat["error"]["param"], "length_penalty");
  EXPECT_LT(WaitIdle(absl::Seconds(5)), absl::Seconds(5)) << "every beam request ended";
}

// A model of 6 tokens: EOS (0) is among each beam's 4 candidates, so finished beams are set aside
// and compete with the live ones at the end, as in the oracle.
TEST_F(HttpServerTest, BeamSearchSetsAsideBeamsEndedByEos) {
  TestSetup setup = DefaultSetup();
  setup.runner.vocab_size = 6;
  Start(setup);
  int stops = 0;
  for (const std::vector<int32_t>& prompt :
       std::vector<std::vector<int32_t>>{{1, 2, 3}, {4, 5}, {2, 2, 2, 5}}) {
    for (const double penalty : {1.0, 0.0}) {  // 0: raw log-probability, short endings win
      json got = PostOk("/v1/completions", {{"prompt", prompt},
                                            {"use_beam_search", true},
                                            {"n", 2},
                                            {"max_tokens", 7},
                                            {"length_penalty", penalty},
                                            {"return_token_ids", true}});
      const auto want = ReferenceBeamSearch(prompt, 2, 7, penalty, 6, /*eos=*/0);
      ASSERT_EQ(got["choices"].size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(got["choices"][i]["token_ids"].get<std::vector<int32_t>>(), want[i].first);
        EXPECT_EQ(got["choices"][i]["finish_reason"], want[i].second ? "stop" : "length");
        stops += want[i].second;
      }
    }
  }
  EXPECT_GT(stops, 0) << "no beam ended by EOS: the test does not reach that path";
}

// OpenAI's best_of: of best_of seeded samples (the same ones n = best_of draws), the n with the
// highest cumulative log-probability, best first; usage counts those shown; not streamed.
TEST_F(HttpServerTest, BestOfReturnsTheMostLikelySamples) {
  Start(DefaultSetup());
  const json base = {{"prompt", "def main():"},
                     {"max_tokens", 8},
                     {"temperature", 1.0},
                     {"seed", 11},
                     {"ignore_eos", true}};
  json all = base;
  all["n"] = 5;
  all["logprobs"] = 0;
  json drawn = PostOk("/v1/completions", all);
  ASSERT_EQ(drawn["choices"].size(), 5u);
  std::vector<std::pair<double, std::string>> ranked;
  for (const json& c : drawn["choices"]) {
    double sum = 0;
    for (const json& lp : c["logprobs"]["token_logprobs"]) sum += lp.get<double>();
    ranked.push_back({sum, c["text"]});
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  json best = base;
  best["n"] = 2;
  best["best_of"] = 5;
  json got = PostOk("/v1/completions", best);
  ASSERT_EQ(got["choices"].size(), 2u) << got;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(got["choices"][i]["index"], i);
    EXPECT_EQ(got["choices"][i]["text"], ranked[i].second) << i;
    EXPECT_TRUE(got["choices"][i]["logprobs"].is_null());  // not asked for
  }
  // The seed's best two are not its first two samples: returning those would fail here.
  EXPECT_FALSE(ranked[0].second == drawn["choices"][0]["text"] &&
               ranked[1].second == drawn["choices"][1]["text"]);
  EXPECT_EQ(got["usage"]["completion_tokens"], 16);
  // Two prompts: two choices each, indexes in order.
  best["prompt"] = {"def main():", "import os"};
  json two = PostOk("/v1/completions", best);
  ASSERT_EQ(two["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(two["choices"][i]["index"], i);
  EXPECT_EQ(two["choices"][0]["text"], ranked[0].second);
  int status = 0;
  best["stream"] = true;
  json error = Post("/v1/completions", best.dump(), &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(error["error"]["param"], "best_of");
}

// TGI's best_of: the sample with the highest total log-probability answers, the others come in
// details.best_of_sequences; greedy or streamed best_of is a 422.
TEST_F(HttpServerTest, TgiBestOfAnswersWithTheMostLikelySample) {
  Start(DefaultSetup());
  auto total = [](const json& details) {
    double sum = 0;
    for (const json& token : details["tokens"]) sum += token["logprob"].get<double>();
    return sum;
  };
  json got = PostOk("/generate", {{"inputs", "def main():"},
                                  {"parameters",
                                   {{"max_new_tokens", 6},
                                    {"best_of", 3},
                                    {"do_sample", true},
                                    {"seed", 5},
                                    {"details", true}}}});
  const json& details = got["details"];
  ASSERT_EQ(details["best_of_sequences"].size(), 2u) << got;
  const double best = total(details);
  std::set<std::string> texts = {got["generated_text"].get<std::string>()};
  for (const json& other : details["best_of_sequences"]) {
    EXPECT_LE(total(other), best) << other;
    EXPECT_EQ(other["generated_tokens"], other["tokens"].size());
    EXPECT_TRUE(other.contains("finish_reason") && other.contains("seed"));
    texts.insert(other["generated_text"].get<std::string>());
  }
  EXPECT_EQ(texts.size(), 3u) << "three different samples";
  json info = json::parse(Client()->Get("/info")->body);
  EXPECT_EQ(info["max_best_of"], kTgiMaxBestOf);
  const std::vector<json> refused = {json{{"best_of", 2}},
                                     json{{"best_of", 2}, {"do_sample", true}, {"stream", true}},
                                     json{{"best_of", kTgiMaxBestOf + 1}, {"do_sample", true}}};
  for (const json& parameters : refused) {
    json body = {{"inputs", "x"}, {"parameters", parameters}};
    if (parameters.contains("stream")) {
      body["parameters"].erase("stream");
      body["stream"] = true;
    }
    int status = 0;
    json error = Post(parameters.contains("stream") ? "/generate_stream" : "/generate", body.dump(),
                      &status);
    EXPECT_EQ(status, 422) << body << " -> " << error;
  }
}

// llama.cpp server's native API: /completion and /infill answer in its shapes with the text the
// OpenAI routes give for the same request (greedy), streamed as content deltas then a final
// event; stop words, n_predict 0, n_probs, grammar; the samplers this server lacks are 400s.
TEST_F(HttpServerTest, LlamaCppCompletionAndInfill) {
  Start(DefaultSetup());
  const Tokenizer& tok = FixtureTokenizer();
  const std::string prompt = "def main():";
  json openai =
      PostOk("/v1/completions",
             {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}});
  const std::string text = openai["choices"][0]["text"];
  json got =
      PostOk("/completion",
             {{"prompt", prompt}, {"n_predict", 6}, {"temperature", 0}, {"ignore_eos", true}});
  EXPECT_EQ(got["content"], text);
  EXPECT_EQ(got["stop"], true);
  EXPECT_EQ(got["tokens_predicted"], 6);
  EXPECT_EQ(got["tokens_evaluated"], tok.Encode(prompt).size());
  EXPECT_TRUE(got["stopped_limit"] == true && got["stopped_eos"] == false &&
              got["stopped_word"] == false)
      << got;
  EXPECT_EQ(got["prompt"], prompt);
  EXPECT_EQ(got["model"], "demo");
  EXPECT_EQ(got["generation_settings"]["n_predict"], 6);
  EXPECT_EQ(got["generation_settings"]["top_k"], 40);  // llama.cpp's default
  EXPECT_GE(got["timings"]["predicted_ms"].get<double>(), 0.0);
  EXPECT_EQ(got["timings"]["predicted_n"], 6);
  EXPECT_TRUE(got["tokens_cached"].is_number());
  // Streamed: the same text in deltas, then a final event with the fields.
  Sse sse = Stream({{"prompt", prompt},
                    {"n_predict", 6},
                    {"temperature", 0},
                    {"ignore_eos", true},
                    {"stream", true}},
                   0, "/completion");
  ASSERT_EQ(sse.status, 200);
  std::string streamed;
  for (size_t i = 0; i < sse.chunks.size(); ++i) {
    streamed += sse.chunks[i]["content"].get<std::string>();
    EXPECT_EQ(sse.chunks[i]["stop"], i + 1 == sse.chunks.size()) << sse.chunks[i];
  }
  EXPECT_EQ(streamed, text);
  ASSERT_FALSE(sse.chunks.empty());
  EXPECT_EQ(sse.chunks.back()["tokens_predicted"], 6);
  // A stop word: stopped there, the word named.
  const std::string word = text.substr(2, 2);
  json stopped = PostOk("/completion", {{"prompt", prompt},
                                        {"n_predict", 6},
                                        {"temperature", 0},
                                        {"ignore_eos", true},
                                        {"stop", {word}}});
  EXPECT_EQ(stopped["content"], text.substr(0, text.find(word)));
  EXPECT_EQ(stopped["stopped_word"], true);
  EXPECT_EQ(stopped["stopping_word"], word);
  // n_predict 0 evaluates nothing; n_probs gives each token's alternatives as probabilities.
  json none = PostOk("/completion", {{"prompt", prompt}, {"n_predict", 0}});
  EXPECT_EQ(none["content"], "");
  EXPECT_EQ(none["tokens_predicted"], 0);
  json probs = PostOk("/completion", {{"prompt", prompt},
                                      {"n_predict", 3},
                                      {"temperature", 0},
                                      {"ignore_eos", true},
                                      {"n_probs", 2}});
  ASSERT_EQ(probs["completion_probabilities"].size(), 3u) << probs;
  for (const json& entry : probs["completion_probabilities"]) {
    ASSERT_EQ(entry["probs"].size(), 2u);
    const double best = entry["probs"][0]["prob"];
    EXPECT_TRUE(best > 0 && best <= 1) << entry;
    EXPECT_EQ(entry["content"], entry["probs"][0]["tok_str"]) << "greedy takes the best";
  }
  // A GBNF grammar.
  json digits = PostOk("/completion",
                       {{"prompt", prompt}, {"n_predict", 8}, {"grammar", "root ::= [0-9]{1,5}"}});
  const std::string number = digits["content"];
  EXPECT_TRUE(!number.empty() && number.size() <= 5 &&
              number.find_first_not_of("0123456789") == std::string::npos)
      << digits;
  // /infill: the same FIM prompt as /v1/infill, with context chunks before the prefix.
  json fim = PostOk("/v1/infill", {{"input_prefix", "# ctx\ndef f(x):\n    return "},
                                   {"input_suffix", "\n\nprint(f(2))"},
                                   {"max_tokens", 5},
                                   {"temperature", 0},
                                   {"ignore_eos", true}});
  json infill = PostOk("/infill", {{"input_extra", {{{"filename", "a.py"}, {"text", "# ctx\n"}}}},
                                   {"input_prefix", "def f(x):\n    return "},
                                   {"input_suffix", "\n\nprint(f(2))"},
                                   {"n_predict", 5},
                                   {"temperature", 0},
                                   {"ignore_eos", true}});
  EXPECT_EQ(infill["content"], fim["choices"][0]["text"]);
  EXPECT_EQ(infill["tokens_evaluated"], fim["usage"]["prompt_tokens"]);

  for (const auto& [body, param] : std::vector<std::pair<json, std::string>>{
           {{{"prompt", "x"}, {"mirostat", 2}}, "mirostat"},
           {{{"prompt", "x"}, {"dry_multiplier", 0.8}}, "dry_multiplier"},
           {{{"prompt", {"a", "b"}}}, "prompt"},
           {{{"n_predict", 4}}, "prompt"},
           {{{"prompt", "x"}, {"logit_bias", {{1}}}}, "logit_bias"},
           {{{"prompt", "x"}, {"grammar", "root ::= nope"}}, "guided_grammar"}}) {
    int status = 0;
    json error = Post("/completion", body.dump(), &status);
    EXPECT_EQ(status, 400) << body << " -> " << error;
    EXPECT_EQ(error["error"]["param"], param) << error;
  }
}

// --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens, the prompt tokens
// the prefix cache held: none the first time, whole blocks of the repeated prompt the second.
TEST_F(HttpServerTest, PromptTokensDetailsCountCachedTokens) {
  TestSetup setup = DefaultSetup();
  setup.server.prompt_tokens_details = true;
  Start(setup);
  const std::string prompt =
      "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
      "fibonacci(n - 2)\n";
  const json body = {{"prompt", prompt}, {"max_tokens", 2}, {"temperature", 0}};
  json first = PostOk("/v1/completions", body);
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << first["usage"];
  json second = PostOk("/v1/completions", body);
  const int cached = second["usage"]["prompt_tokens_details"]["cached_tokens"];
  const int prompt_tokens = second["usage"]["prompt_tokens"];
  EXPECT_GT(cached, 0) << second["usage"];
  EXPECT_LT(cached, prompt_tokens);
  EXPECT_EQ(cached % setup.runner.block_size, 0);
}

// The development routes (vLLM's VLLM_SERVER_DEV_MODE, --enable-dev-endpoints): POST
// /reset_prefix_cache (and SGLang's /flush_cache) forgets the cached blocks no request holds — the
// repeated prompt finds nothing cached after it, and caches again afterwards; without the option
// the routes do not exist.
TEST_F(HttpServerTest, ResetPrefixCacheForgetsCachedPrompts) {
  TestSetup setup = DefaultSetup();
  setup.server.prompt_tokens_details = true;
  setup.server.dev_endpoints = true;
  setup.server.api_key = "k";
  Start(setup);
  const json body = {{"prompt",
                      "def fibonacci(n):\n    if n < 2:\n        return n\n    return "
                      "fibonacci(n - 1) + fibonacci(n - 2)\n"},
                     {"max_tokens", 2},
                     {"temperature", 0}};
  auto cached = [&] {
    return PostOk("/v1/completions", body)["usage"]["prompt_tokens_details"]["cached_tokens"]
        .get<int>();
  };
  EXPECT_EQ(cached(), 0);
  EXPECT_GT(cached(), 0);
  EXPECT_EQ(httplib::Client("127.0.0.1", server_->port()).Post("/reset_prefix_cache")->status, 401);
  for (const char* path : {"/reset_prefix_cache", "/flush_cache"}) {
    int status = 0;
    const json reset = Post(path, "", &status);
    ASSERT_EQ(status, 200) << path << " " << reset.dump();
    EXPECT_GT(reset["dropped_blocks"].get<int>(), 0) << path;
    EXPECT_EQ(cached(), 0) << "after " << path;
    EXPECT_GT(cached(), 0) << "after " << path;
  }
}

TEST_F(HttpServerTest, ResetPrefixCacheIsADevelopmentRoute) {
  Start(DefaultSetup());
  EXPECT_EQ(Client()->Post("/reset_prefix_cache")->status, 404);
  EXPECT_EQ(Client()->Post("/flush_cache")->status, 404);
}

// Several served model names (vLLM's --served-model-name a b): each is a model a request may
// name and /v1/models lists them all; answers carry the first. /ping answers as /health does.
TEST_F(HttpServerTest, ModelAliasesAndPing) {
  TestSetup setup = DefaultSetup();
  setup.server.model_aliases = {"starcoder", "sc"};
  Start(setup);
  json models = json::parse(Client()->Get("/v1/models")->body);
  ASSERT_EQ(models["data"].size(), 3u);
  EXPECT_EQ(models["data"][0]["id"], "demo");
  EXPECT_EQ(models["data"][2]["id"], "sc");
  json got = PostOk("/v1/completions", {{"model", "sc"}, {"prompt", "x"}, {"max_tokens", 2}});
  EXPECT_EQ(got["model"], "demo");
  int status = 0;
  Post("/v1/completions", json({{"model", "other"}, {"prompt", "x"}}).dump(), &status);
  EXPECT_EQ(status, 404);
  EXPECT_EQ(Client()->Get("/ping")->status, 200);
  EXPECT_EQ(Client()->Post("/ping", "", "application/json")->status, 200);
}

TEST_F(HttpServerTest, MetricsCountWhatWasServed) {
  Start(DefaultSetup());
  std::mt19937_64 rng(21);
  int64_t prompt_tokens = 0;
  const int requests = 5;
  std::string prompt;
  for (int i = 0; i < requests; ++i) {
    // The last two send one longer prompt: the second finds its full blocks (but the last) in
    // the cache.
    prompt = i < requests - 2 ? RandomCode(rng)
                              : "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
                                "        a, b = b, a + b\n    return a\n";
    prompt_tokens += FixtureTokenizer().Encode(prompt).size();
    PostOk("/v1/completions", {{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}});
  }
  const int64_t repeated = FixtureTokenizer().Encode(prompt).size();
  ASSERT_GT(repeated, 8);
  testing::PrometheusPage page = Metrics();
  EXPECT_EQ(Metric(page, "mqaserve_prompt_tokens_total"), prompt_tokens);
  // vLLM's prefix-cache counters, in tokens (block size 8).
  EXPECT_EQ(Metric(page, "mqaserve_prefix_cache_queries_total"), prompt_tokens);
  EXPECT_EQ(Metric(page, "mqaserve_prefix_cache_hits_total"), (repeated - 1) / 8 * 8);
  // Per-request histograms: lengths, and where each request's time went.
  EXPECT_EQ(Metric(page, "mqaserve_request_prompt_tokens_count"), requests);
  EXPECT_EQ(Metric(page, "mqaserve_request_prompt_tokens_sum"), prompt_tokens);
  EXPECT_EQ(Metric(page, "mqaserve_request_generation_tokens_sum"), 4 * requests);
  EXPECT_EQ(Metric(page, "mqaserve_request_generation_tokens_bucket", ",le=\"5\""), requests);
  EXPECT_EQ(Metric(page, "mqaserve_request_generation_tokens_bucket", ",le=\"2\""), 0);
  for (const char* phase : {"queue", "prefill", "decode", "inference"}) {
    const std::string name = absl::StrCat("mqaserve_request_", phase, "_time_seconds");
    EXPECT_EQ(Metric(page, name + "_count"), requests) << name;
    EXPECT_GE(Metric(page, name + "_sum"), 0.0) << name;
  }
  EXPECT_LE(Metric(page, "mqaserve_request_inference_time_seconds_sum"),
            Metric(page, "mqaserve_e2e_request_latency_seconds_sum"));
  EXPECT_EQ(Metric(page, "mqaserve_request_success_total", ",finished_reason=\"length\""),
            requests);
  EXPECT_EQ(Metric(page, "mqaserve_time_to_first_token_seconds_count"), requests);
  EXPECT_EQ(Metric(page, "mqaserve_e2e_request_latency_seconds_count"), requests);
  EXPECT_GE(Metric(page, "mqaserve_inter_token_latency_seconds_count"), requests);
  EXPECT_EQ(page.types["mqaserve_inter_token_latency_seconds"], "histogram");
  EXPECT_EQ(Metric(page, "mqaserve_num_preemptions_total"), 0);
}

// --metrics-prefix vllm: the same families under vLLM's own names (dashboards made for vLLM).
TEST_F(HttpServerTest, MetricsUnderVllmNames) {
  TestSetup setup = DefaultSetup();
  setup.server.metrics_prefix = "vllm:";
  Start(setup);
  PostOk("/v1/completions", {{"prompt", "def f(x):"}, {"max_tokens", 3}, {"temperature", 0}});
  testing::PrometheusPage page = Metrics();
  EXPECT_EQ(Metric(page, "vllm:generation_tokens_total"), 3);
  EXPECT_EQ(Metric(page, "vllm:request_success_total", ",finished_reason=\"length\""), 1);
  EXPECT_EQ(Metric(page, "vllm:e2e_request_latency_seconds_count"), 1);
  EXPECT_EQ(page.types["vllm:kv_cache_usage_perc"], "gauge");
  for (const auto& [key, value] : page.samples) {
    EXPECT_TRUE(absl::StartsWith(key, "vllm:")) << key;
  }
}

}  // namespace
}  // namespace mqa
