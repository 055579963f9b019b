#include "benchmarks/kernel_timeline.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mqa::bench {
namespace {

KernelRecord Rec(const std::string& name, uint64_t start_ns, uint64_t end_ns, int64_t grid = 1) {
  KernelRecord r;
  r.name = name;
  r.start_ns = start_ns;
  r.end_ns = end_ns;
  r.grid = grid;
  r.block = 128;
  return r;
}

TEST(KernelTimelineTest, SpansSplitTheStepIntoGapsAndExposedTime) {
  // Out of order on purpose: B overlaps A's tail (PDL), C starts after an idle gap, D runs
  // entirely inside C.
  std::vector<KernelRecord> step = {Rec("C", 25000, 30000), Rec("A", 1000, 11000),
                                    Rec("D", 26000, 28000), Rec("B", 9000, 21000)};
  const std::vector<KernelSpan> s = StepSpans(step);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(step[0].name, "A");
  EXPECT_EQ(step[1].name, "B");
  EXPECT_EQ(step[2].name, "C");
  EXPECT_EQ(step[3].name, "D");
  EXPECT_DOUBLE_EQ(s[0].start_us, 0.0);
  EXPECT_DOUBLE_EQ(s[0].exposed_us, 10.0);
  EXPECT_DOUBLE_EQ(s[0].gap_us, 0.0);
  EXPECT_DOUBLE_EQ(s[1].start_us, 8.0);
  EXPECT_DOUBLE_EQ(s[1].duration_us, 12.0);
  EXPECT_DOUBLE_EQ(s[1].exposed_us, 10.0);  // 11 .. 21
  EXPECT_DOUBLE_EQ(s[1].gap_us, 0.0);
  EXPECT_DOUBLE_EQ(s[2].gap_us, 4.0);  // 21 .. 25
  EXPECT_DOUBLE_EQ(s[2].exposed_us, 5.0);
  EXPECT_DOUBLE_EQ(s[3].exposed_us, 0.0);
  EXPECT_DOUBLE_EQ(s[3].duration_us, 2.0);
  double total = 0;
  for (const KernelSpan& k : s) total += k.gap_us + k.exposed_us;
  EXPECT_DOUBLE_EQ(total, 29.0);  // first start to last end
}

TEST(KernelTimelineTest, MediansOverStepsWithTheSameKernels) {
  std::vector<std::vector<KernelRecord>> steps;
  for (uint64_t d : {10, 30, 20}) {  // kernel "b" lasts d us; its median is 20
    const uint64_t t = 1000000 * steps.size();
    steps.push_back({Rec("a", t, t + 5000), Rec("b", t + 6000, t + 6000 + d * 1000, 7)});
  }
  // A step of another graph (one kernel more) is left out; the last step is the reference.
  steps.insert(steps.begin(), {Rec("a", 0, 1), Rec("x", 2, 3), Rec("b", 4, 5, 7)});
  auto t = MedianTimeline(steps);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->steps_total, 4);
  EXPECT_EQ(t->steps_used, 3);
  ASSERT_EQ(t->rows.size(), 2u);
  EXPECT_EQ(t->rows[1].name, "b");
  EXPECT_EQ(t->rows[1].grid, 7);
  EXPECT_DOUBLE_EQ(t->rows[1].median.duration_us, 20.0);
  EXPECT_DOUBLE_EQ(t->rows[1].median.gap_us, 1.0);
  EXPECT_DOUBLE_EQ(t->rows[1].median.exposed_us, 20.0);
  EXPECT_DOUBLE_EQ(t->span_us, 26.0);
  // Same name and grid in another position: one group of two, ordered by exposed time.
  Timeline two = *t;
  two.rows.push_back(two.rows[1]);
  const std::vector<KernelGroup> g = GroupTimeline(two);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].name, "b");
  EXPECT_EQ(g[0].count, 2);
  EXPECT_DOUBLE_EQ(g[0].exposed_us, 40.0);
  EXPECT_EQ(g[1].name, "a");
  EXPECT_EQ(g[1].count, 1);
  // The same kernel and grid with other shared memory (SantaCoder's two c_projs) is its own group.
  two.rows.push_back(two.rows[1]);
  two.rows.back().smem_bytes = 98304;
  two.rows.back().median.exposed_us = 5.0;
  const std::vector<KernelGroup> three = GroupTimeline(two);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[0].count, 2);
  EXPECT_EQ(three[2].name, "b");
  EXPECT_EQ(three[2].smem_bytes, 98304);
  EXPECT_DOUBLE_EQ(three[2].exposed_us, 5.0);
}

TEST(KernelTimelineTest, MedianIsTheUpperOne) {
  EXPECT_EQ(Median({}), 0.0);
  EXPECT_EQ(Median({5.0}), 5.0);
  EXPECT_EQ(Median({4.0, 1.0, 3.0, 2.0}), 3.0);
}

TEST(KernelTimelineTest, NoKernelsIsAnError) {
  EXPECT_FALSE(MedianTimeline({{}, {}}).ok());
  EXPECT_FALSE(MedianTimeline({}).ok());
}

TEST(KernelTimelineTest, ShortNamesKeepTemplateArgumentsOnly) {
  EXPECT_EQ(ShortKernelName("void mqa::(anonymous namespace)::SkinnyGemmKernel<__half, 1, 0, 2, "
                            "true, 8, true>(mqa::(anonymous namespace)::SkinnyArgs<__half>)"),
            "SkinnyGemmKernel<__half, 1, 0, 2, true, 8, true>");
  EXPECT_EQ(ShortKernelName("void mqa::fwd::LayerNormKernel<float>(float const*, int)"),
            "LayerNormKernel<float>");
  EXPECT_EQ(ShortKernelName("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64"),
            "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64");
  EXPECT_EQ(ShortKernelName("void cutlass::Kernel2<cutlass_80_wmma<a::b, 4>>(T1::Params)"),
            "Kernel2<cutlass_80_wmma<a::b, 4>>");
  EXPECT_EQ(ShortKernelName("void Foo<1, 2, 3, 4, 5>(int)", 10), "Foo<1, ...");
}

TEST(KernelTimelineTest, CsvHasARowAPositionWithTheNameQuoted) {
  std::vector<KernelRecord> step = {Rec("void ns::K<int, 2>(int)", 0, 3000, 132),
                                    Rec("odd\"name", 4000, 5000)};
  auto t = MedianTimeline({step});
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string path =
      (std::filesystem::temp_directory_path() / "kernel_timeline_test.csv").string();
  ASSERT_TRUE(WriteTimelineCsv(path, *t).ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::filesystem::remove(path);
  EXPECT_EQ(text.str(),
            "position,name,grid,block,smem_bytes,start_us,duration_us,gap_us,exposed_us\n"
            "0,\"K<int, 2>\",132,128,0,0.000,3.000,0.000,3.000\n"
            "1,\"odd\"\"name\",1,128,0,4.000,1.000,1.000,1.000\n");
  EXPECT_FALSE(WriteTimelineCsv("/nonexistent-dir/x.csv", *t).ok());
}

TEST(KernelTimelineTest, SummaryListsGroupsAndTheRest) {
  std::vector<KernelRecord> step;
  for (int i = 0; i < 5; ++i)
    step.push_back(Rec("k" + std::to_string(i), i * 10000, i * 10000 + (i + 1) * 1000));
  auto t = MedianTimeline({step});
  ASSERT_TRUE(t.ok());
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  PrintTimelineSummary(f, "decode", *t, 2);
  std::fclose(f);
  const std::string out(buf, len);
  free(buf);
  EXPECT_NE(out.find("decode: 5 kernels a step"), std::string::npos) << out;
  EXPECT_NE(out.find(" k4"), std::string::npos) << out;  // the largest two groups by name
  EXPECT_NE(out.find(" k3"), std::string::npos) << out;
  EXPECT_EQ(out.find(" k0"), std::string::npos) << out;
  EXPECT_NE(out.find("(3 more kinds)"), std::string::npos) << out;
}

}  // namespace
}  // namespace mqa::bench
