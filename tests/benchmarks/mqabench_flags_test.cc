#include <string>
#include <vector>

#include "absl/status/status.h"
#include "benchmarks/mqabench/flags.h"
#include "gtest/gtest.h"
#include "kernels/ops.h"

namespace mqa::bench {
namespace {

constexpr int kVariants = 19;  // as kNumPagedAttentionVariants

absl::StatusOr<Flags> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "mqabench");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return ParseFlags(static_cast<int>(argv.size()), argv.data());
}

absl::StatusOr<LatencyPlan> Plan(std::vector<std::string> args) {
  absl::StatusOr<Flags> f = Parse(std::move(args));
  if (!f.ok()) return f.status();
  return PlanLatency(*f, kVariants);
}

// The error names what was wrong, so a user can fix the command.
void ExpectRefused(const absl::Status& st, const std::string& mention) {
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(std::string(st.message()).find(mention), std::string::npos) << st;
}

TEST(MqabenchFlags, DefaultsAreTheRunnersOneRow) {
  absl::StatusOr<Flags> f = Parse({"latency"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->mode, "latency");
  EXPECT_EQ(f->batch_size, 1);
  EXPECT_EQ(f->chain, "auto");
  absl::StatusOr<LatencyPlan> p = PlanLatency(*f, kVariants);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->runs.size(), 1u);
  const LatencyRun& r = p->runs[0];
  EXPECT_EQ(r.variant, "skinnyd");
  EXPECT_EQ(r.fast, "pdl+ln");
  EXPECT_EQ(r.autotune, "decode");
  EXPECT_EQ(r.chain, "auto");
  EXPECT_EQ(r.engine, "off");
  EXPECT_EQ(r.attn, 18);
  EXPECT_EQ(r.skip.second, 0u);
  EXPECT_TRUE(p->timeline_layers.empty());
}

TEST(MqabenchFlags, ValuesAreRead) {
  absl::StatusOr<Flags> f =
      Parse({"latency", "--model", "configs/santacoder", "--batch-size", "32", "--input-len", "512",
             "--output-len", "64", "--num-iters", "2", "--seed", "7", "--no-cuda-graphs", "--dtype",
             "bfloat16", "--kernel-trace", "/tmp/t"});
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->model, "configs/santacoder");
  EXPECT_EQ(f->batch_size, 32);
  EXPECT_EQ(f->input_len, 512);
  EXPECT_EQ(f->output_len, 64);
  EXPECT_EQ(f->num_iters, 2);
  EXPECT_EQ(f->seed, 7u);
  EXPECT_FALSE(f->cuda_graphs);
  EXPECT_EQ(f->dtype, "bfloat16");
  EXPECT_EQ(f->kernel_trace, "/tmp/t");
}

// Every --chain row mqabench.cc documents is accepted (the shares row once was not), in order.
TEST(MqabenchFlags, EveryDocumentedChainRowIsAccepted) {
  const std::vector<std::string> rows = {
      "off",   "on",     "auto",  "at",     "na",      "late", "rel", "tail", "notail",
      "tailc", "ll",     "nl",    "tc",     "cc",      "otc",  "occ", "hf",   "ohf",
      "hf0",   "ohf0",   "fm",    "fm3",    "s4",      "f2",   "w2",  "w0",   "k16f3",
      "k8f0",  "shares", "tailr", "tailr0", "tailr15", "hq",   "hq0", "hq2", "tailp"};
  std::string list;
  for (const std::string& r : rows) list += (list.empty() ? "" : ",") + r;
  absl::StatusOr<LatencyPlan> p = Plan({"latency", "--chain", list});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->runs.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(p->runs[i].chain, rows[i]);
  absl::StatusOr<LatencyPlan> both = Plan({"latency", "--chain", "both"});
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ(both->runs.size(), 2u);
  EXPECT_EQ(both->runs[0].chain, "off");
  EXPECT_EQ(both->runs[1].chain, "on");
}

TEST(MqabenchFlags, UnknownChainRowsAreRefused) {
  for (const char* row : {"bogus", "k12f3", "k16", "s", "w-1", "fmx", "auto,", "shares2", "tailr16",
                          "tailr-1", "tailrx"}) {
    SCOPED_TRACE(row);
    ExpectRefused(Plan({"latency", "--chain", row}).status(), "--chain");
  }
}

// The rows latency.cc runs as `auto` with one knob changed (the chain's layer-size bound), and
// the other accepted rows, which it does not.
TEST(MqabenchFlags, AutoChainRows) {
  for (const char* row : {"auto",   "na", "late", "rel", "tail", "tailc", "tailr", "tailr5",
                          "notail", "w0", "w2",   "ll",  "nl",   "hq",    "hq0",   "hq2",
                          "tc",     "cc", "hf",   "hf0", "fm",   "fm3",   "shares", "tailp"}) {
    EXPECT_TRUE(IsAutoChainRow(row)) << row;
  }
  for (const char* row : {"off", "on", "at", "otc", "occ", "ohf", "ohf0", "s4", "f2", "k16f3", "w",
                          "w-1", "fmx", "tailr16", "hq3", "bogus"}) {
    EXPECT_FALSE(IsAutoChainRow(row)) << row;
  }
}

// The release mask the tailr rows give latency.cc (GptBigCodeOptions::tail_release_early).
TEST(MqabenchFlags, TailReleaseMask) {
  EXPECT_EQ(TailReleaseMask("tailr"), 1);
  EXPECT_EQ(TailReleaseMask("tailr0"), 0);
  EXPECT_EQ(TailReleaseMask("tailr15"), 15);
  for (const char* row : {"tailr16", "tailrx", "tail", "tailc", "auto"}) {
    SCOPED_TRACE(row);
    EXPECT_EQ(TailReleaseMask(row), -1);
  }
}

// Rows are every combination, the --gemm list outermost and the --chain list innermost.
TEST(MqabenchFlags, RowsAreTheProductInOrder) {
  absl::StatusOr<LatencyPlan> p =
      Plan({"latency", "--gemm", "skinnyd,cublaslt", "--attn", "18,3", "--chain", "auto,notail"});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->runs.size(), 8u);
  EXPECT_EQ(p->runs[0].variant, "skinnyd");
  EXPECT_EQ(p->runs[0].attn, 18);
  EXPECT_EQ(p->runs[0].chain, "auto");
  EXPECT_EQ(p->runs[1].chain, "notail");
  EXPECT_EQ(p->runs[2].attn, 3);
  EXPECT_EQ(p->runs[4].variant, "cublaslt");
  EXPECT_EQ(p->runs[7].variant, "cublaslt");
  EXPECT_EQ(p->runs[7].attn, 3);
  EXPECT_EQ(p->runs[7].chain, "notail");
}

TEST(MqabenchFlags, SkipRowsBecomeOpBits) {
  absl::StatusOr<LatencyPlan> p = Plan({"latency", "--skip", "none,attn+gemm,ln"});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->runs.size(), 3u);
  EXPECT_EQ(p->runs[0].skip.second, 0u);
  EXPECT_EQ(p->runs[1].skip.second, kSkipAttention | kSkipGemm);
  EXPECT_EQ(p->runs[1].skip.first, "attn+gemm");
  EXPECT_EQ(p->runs[2].skip.second, kSkipLayerNorm);
  ExpectRefused(Plan({"latency", "--skip", "attn+norm"}).status(), "--skip");
  ExpectRefused(Plan({"latency", "--skip", "attn", "--async", "on"}).status(), "--skip");
}

TEST(MqabenchFlags, GemmVariants) {
  EXPECT_TRUE(Plan({"latency", "--gemm",
                    "skinny,skinny1,skinny4,cublaslt,splitk,tc,splitk+tc,skinnyd,"
                    "skinnydh,skinnydf,skinnydo,skinnyde,skinnyds0,skinnyds64,tma,"
                    "tma2,tma4h1,tmah0"})
                  .ok());
  absl::StatusOr<LatencyPlan> both = Plan({"latency", "--gemm", "both"});
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->runs.size(), 2u);
  EXPECT_EQ(both->runs[0].variant, "skinny2");  // "skinny" is two rows a warp
  for (const char* v : {"skinnyds65", "tma3", "tmah2", "cublas", "skinnyds"}) {
    SCOPED_TRACE(v);
    ExpectRefused(Plan({"latency", "--gemm", v}).status(), "--gemm");
  }
  int boxes = 0, hints = 0;
  EXPECT_TRUE(ParseTmaVariant("tma4h1", &boxes, &hints));
  EXPECT_EQ(boxes, 4);
  EXPECT_EQ(hints, 1);
  EXPECT_TRUE(ParseTmaVariant("tma", &boxes, &hints));
  EXPECT_EQ(boxes, 0);
  EXPECT_EQ(hints, -1);
  EXPECT_EQ(SkinnyStageKib("skinnyds16"), 16);
  EXPECT_EQ(SkinnyStageKib("skinnyd"), -1);
  int kib = 0, inflight = 0;
  EXPECT_TRUE(ParseRingForm("k24f2", &kib, &inflight));
  EXPECT_EQ(kib, 24);
  EXPECT_EQ(inflight, 2);
  EXPECT_FALSE(ParseRingForm("k20f2", &kib, &inflight));  // not a multiple of 8
}

TEST(MqabenchFlags, IntegerListsAreChecked) {
  absl::StatusOr<LatencyPlan> p =
      Plan({"latency", "--attn", "18,3", "--attn-wm", "0,8", "--chain-timeline", "1,20"});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->runs.size(), 4u);
  EXPECT_EQ(p->timeline_layers, (std::vector<int>{1, 20}));
  ExpectRefused(Plan({"latency", "--attn", "19"}).status(), "--attn");
  ExpectRefused(Plan({"latency", "--attn", "x"}).status(), "--attn");
  ExpectRefused(Plan({"latency", "--attn-wm", "5"}).status(), "--attn-wm");
  ExpectRefused(Plan({"latency", "--attn-tn", "48"}).status(), "--attn-tn");
  ExpectRefused(Plan({"latency", "--attn-splits", "-1"}).status(), "--attn-splits");
  ExpectRefused(Plan({"latency", "--chain-timeline", "0"}).status(), "--chain-timeline");
  ExpectRefused(Plan({"latency", "--tail-timeline", "-2"}).status(), "--tail-timeline");
  ExpectRefused(Plan({"latency", "--tail-timeline", "3", "--engine", "on"}).status(),
                "--tail-timeline");
  EXPECT_TRUE(Plan({"latency", "--tail-timeline", "3"}).ok());
  ExpectRefused(Plan({"latency", "--fast", "pdl,turbo"}).status(), "--fast");
  ExpectRefused(Plan({"latency", "--verify-tokens", "16"}).status(), "--verify-tokens");
  ExpectRefused(Plan({"latency", "--kernel-trace", "x", "--engine", "on"}).status(),
                "--kernel-trace");
}

TEST(MqabenchFlags, BadCommandLinesNameTheirFlag) {
  ExpectRefused(Parse({}).status(), "usage");
  ExpectRefused(Parse({"serve"}).status(), "latency|throughput");
  ExpectRefused(Parse({"latency", "--batch"}).status(), "unknown flag --batch");
  ExpectRefused(Parse({"latency", "--batch-size"}).status(), "--batch-size needs a value");
  ExpectRefused(Parse({"latency", "--batch-size", "abc"}).status(), "--batch-size abc");
  ExpectRefused(Parse({"latency", "--batch-size", "0"}).status(), "--batch-size 0");
  ExpectRefused(Parse({"latency", "--output-len", "-5"}).status(), "--output-len");
  ExpectRefused(Parse({"latency", "--seed", "-1"}).status(), "--seed");
  ExpectRefused(Parse({"latency", "--load-format", "safetensors"}).status(), "--load-format");
  ExpectRefused(Parse({"latency", "--dtype", "fp8"}).status(), "--dtype");
  ExpectRefused(Parse({"latency", "--autotune", "decode,sometimes"}).status(), "--autotune");
  ExpectRefused(Parse({"latency", "--small", "maybe"}).status(), "--small");
  ExpectRefused(Parse({"throughput", "--engine", "yes"}).status(), "--engine");
  ExpectRefused(Parse({"latency", "--engine", "on,lookahead"}).status(), "--engine");
  EXPECT_TRUE(Parse({"throughput", "--num-prompts", "20", "--engine", "both"}).ok());
  EXPECT_TRUE(Parse({"throughput", "--engine", "on,la"}).ok());
}

// --engine's rows: off, on, la (the engine with decode lookahead), both = off and on, in a comma
// list in order; anything else none.
TEST(MqabenchFlags, EngineRows) {
  using V = std::vector<std::string>;
  EXPECT_EQ(EngineRows("off"), V({"off"}));
  EXPECT_EQ(EngineRows("both"), V({"off", "on"}));
  EXPECT_EQ(EngineRows("on,la"), V({"on", "la"}));
  EXPECT_EQ(EngineRows("both,la"), V({"off", "on", "la"}));
  EXPECT_TRUE(EngineRows("la,").empty());
  EXPECT_TRUE(EngineRows("async").empty());
  ASSERT_TRUE(Plan({"latency", "--engine", "on,la", "--async", "both"}).ok());
  EXPECT_EQ(Plan({"latency", "--engine", "on,la", "--async", "both"})->runs.size(), 4u);
}

}  // namespace
}  // namespace mqa::bench
