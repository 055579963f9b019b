// Every CUDA attention / KV-cache kernel against its CPU reference on fresh random inputs:
// random block tables, context lengths 1 ... 8192 that are not multiples of the block size,
// decode batches (split-KV and not), mixed prefill chunks, MQA and grouped heads. The output is
// poisoned (NaN bytes) first, so every element must be written. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/device_info.h"
#include "kernels/kv_cache.h"
#include "kernels/kv_cache_cuda.h"
#include "kernels/paged_attention.h"
#include "kernels/paged_attention_cuda.h"
#include "tests/kernels/attention_test_util.h"

namespace mqa {
namespace {

using testing::PagedBatch;
using testing::SeqSpec;

// A device allocation for the test's lifetime.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) EXPECT_EQ(cudaMalloc(&ptr_, bytes), cudaSuccess);
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  static DeviceBuffer From(const std::vector<T>& v) {
    DeviceBuffer b(v.size() * sizeof(T));
    EXPECT_EQ(cudaMemcpy(b.ptr_, v.data(), b.bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    return b;
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> v(bytes_ / sizeof(T));
    EXPECT_EQ(cudaMemcpy(v.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

uint16_t ToBits(float x, DType t) {
  return t == DType::kF16 ? FloatToHalfBits(x) : FloatToBFloat16Bits(x);
}
float FromBits(uint16_t b, DType t) {
  return t == DType::kF16 ? HalfBitsToFloat(b) : BFloat16BitsToFloat(b);
}
// Rounds `v` to the dtype in place and returns the bits.
std::vector<uint16_t> RoundTo(std::vector<float>& v, DType t) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    bits[i] = ToBits(v[i], t);
    v[i] = FromBits(bits[i], t);
  }
  return bits;
}

struct AttentionCase {
  DType dtype = DType::kF16;
  int head_dim = 128;
  int block_size = 16;
  int num_heads = 48;
  int num_kv_heads = 1;
  std::vector<SeqSpec> seqs;
  int force_splits = 0;
  bool give_max_query_len = true;
};

std::string Describe(const AttentionCase& c) {
  std::string s = std::string(DTypeName(c.dtype)) + " D" + std::to_string(c.head_dim) + " bs" +
                  std::to_string(c.block_size) + " heads " + std::to_string(c.num_heads) + "/" +
                  std::to_string(c.num_kv_heads) + " splits " + std::to_string(c.force_splits) +
                  " seqs";
  for (const SeqSpec& q : c.seqs) {
    s += " (" + std::to_string(q.context_len) + "," + std::to_string(q.query_len) + ")";
  }
  return s;
}

// p (HostParams's shapes) pointed at the device copies of the batch's arrays, in the test dtype.
void PointAtDevice(PagedAttentionParams& p, const DeviceBuffer& query, const DeviceBuffer& out,
                   const DeviceBuffer& k, const DeviceBuffer& v, const DeviceBuffer& tables,
                   const DeviceBuffer& query_start, const DeviceBuffer& context_lens, DType dtype) {
  p.query = query.get<void>();
  p.output = out.get<void>();
  p.key_cache = k.get<void>();
  p.value_cache = v.get<void>();
  p.block_tables = tables.get<int32_t>();
  p.query_start = query_start.get<int32_t>();
  p.context_lens = context_lens.get<int32_t>();
  p.dtype = dtype;
}

// Runs the CUDA kernel, every decode-path variant (PagedAttentionTuning::variant) twice on one
// zeroed workspace (variant 2 must leave its counters reset; the second run with pdl), and the CPU reference on the same
// rounded inputs; returns the worst relative error.
double RunAttentionCase(const AttentionCase& c, std::mt19937& rng) {
  PagedBatch b =
      testing::MakePagedBatch(c.seqs, c.num_heads, c.num_kv_heads, c.head_dim, c.block_size, rng);
  const std::vector<uint16_t> q_bits = RoundTo(b.query, c.dtype);
  std::vector<uint16_t> k_bits = RoundTo(b.key_cache, c.dtype);
  std::vector<uint16_t> v_bits = RoundTo(b.value_cache, c.dtype);
  // On the device, the slots no sequence owns (MakePagedBatch's +-1e4 garbage, also in the last
  // block of each sequence past its context) hold NaN: a kernel that multiplies one by a masked
  // probability of 0 (as a whole-block TMA copy would, variant 13) turns the output into NaN.
  const uint16_t nan_bits = c.dtype == DType::kF16 ? 0x7e00 : 0x7fc0;
  const float k_garbage = FromBits(ToBits(1e4f, c.dtype), c.dtype);
  const float v_garbage = FromBits(ToBits(-1e4f, c.dtype), c.dtype);
  for (size_t i = 0; i < k_bits.size(); ++i) {
    if (b.key_cache[i] == k_garbage) k_bits[i] = nan_bits;
    if (b.value_cache[i] == v_garbage) v_bits[i] = nan_bits;
  }
  DeviceBuffer dq = DeviceBuffer::From(q_bits), dk = DeviceBuffer::From(k_bits),
               dv = DeviceBuffer::From(v_bits), dt = DeviceBuffer::From(b.block_tables),
               dqs = DeviceBuffer::From(b.query_start), dctx = DeviceBuffer::From(b.context_lens);
  DeviceBuffer dout(q_bits.size() * 2);

  std::vector<float> ref(b.query.size());
  PagedAttentionParams cpu = testing::HostParams(b, ref);
  if (c.give_max_query_len) {
    for (const SeqSpec& q : c.seqs) cpu.max_query_len = std::max(cpu.max_query_len, q.query_len);
  }
  EXPECT_TRUE(PagedAttentionCpu(cpu).ok());
  PagedAttentionParams p = cpu;
  PointAtDevice(p, dq, dout, dk, dv, dt, dqs, dctx, c.dtype);
  // Configurations: every variant with its automatic choices, then variant 11 forced to each of
  // its forms: one warpgroup with 32-token stages, with 64, and two warpgroups (its automatic
  // choice takes the first for decode and the last for prefill); then variant 13 forced to three
  // CTAs an SM (which also runs its TMA kernel on splits of any length; automatic: two, on splits
  // of at most 512 tokens); then variant 18's pair forced on (automatic: only where its splits
  // fill the SMs, which these small batches rarely do), with the cluster merge up to 8 splits and
  // the merge kernel past that.
  constexpr int kConfigs = kNumPagedAttentionVariants + 5;
  auto config_variant = [](int k) {
    return k < kNumPagedAttentionVariants        ? k
           : k == kNumPagedAttentionVariants + 3 ? 13
           : k == kNumPagedAttentionVariants + 4 ? 18
                                                 : 11;
  };
  auto config_name = [&](int k) {
    std::string name = std::to_string(config_variant(k)) + " (" +
                       PagedAttentionVariantName(config_variant(k));
    if (k == kNumPagedAttentionVariants) name += ", 32-token stages";
    if (k == kNumPagedAttentionVariants + 1) name += ", 64-token stages";
    if (k == kNumPagedAttentionVariants + 2) name += ", two warpgroups";
    if (k == kNumPagedAttentionVariants + 3) name += ", three CTAs an SM";
    if (k == kNumPagedAttentionVariants + 4) name += ", the pair forced";
    return name + ")";
  };
  // Runs: plain; a programmatic dependent launch; and that with the merge kernel releasing its
  // dependents at its start (release_dependents_early, as before a decode chain).
  constexpr int kRuns = 3;
  std::vector<std::vector<uint16_t>> outs;  // [config * kRuns + run]
  for (int config = 0; config < kConfigs; ++config) {
    const int variant = config_variant(config);
    PagedAttentionTuning tuning;
    tuning.num_splits = c.force_splits;
    tuning.variant = variant;
    if (config >= kNumPagedAttentionVariants && variant == 11) {
      tuning.hopper_tile_tokens = config == kNumPagedAttentionVariants ? 32 : 64;
      tuning.hopper_warpgroups = config == kNumPagedAttentionVariants + 2 ? 2 : 1;
    }
    if (config == kNumPagedAttentionVariants + 3) tuning.hopper_tma_ctas = 3;
    tuning.tma_pair = config == kNumPagedAttentionVariants + 4;
    const size_t ws_bytes = PagedAttentionCudaWorkspaceBytes(p, tuning);
    DeviceBuffer ws(ws_bytes);
    if (ws_bytes > 0) EXPECT_EQ(cudaMemset(ws.get<void>(), 0, ws_bytes), cudaSuccess);
    for (int run = 0; run < kRuns; ++run) {
      tuning.pdl = run >= 1;
      p.release_dependents_early = run == 2;
      EXPECT_EQ(cudaMemset(dout.get<void>(), 0xff, q_bits.size() * 2), cudaSuccess);  // NaN
      const absl::Status st = PagedAttentionCuda(p, nullptr, ws.get<void>(), ws_bytes, tuning);
      EXPECT_TRUE(st.ok()) << st << " variant " << variant;
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "variant " << variant;
      EXPECT_EQ(cudaGetLastError(), cudaSuccess);
      outs.push_back(dout.Download<uint16_t>());
    }
  }


  double worst = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    const std::vector<uint16_t>& out_bits = outs[k];
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const float x = FromBits(out_bits[i], c.dtype);
      if (!std::isfinite(x)) {
        ADD_FAILURE() << "variant " << config_name(static_cast<int>(k / kRuns)) << " run "
                      << k % kRuns << ": element " << i << " not written / not finite";
        return 1e9;
      }
      num += (x - static_cast<double>(ref[i])) * (x - static_cast<double>(ref[i]));
      den += static_cast<double>(ref[i]) * ref[i];
    }
    const double err = std::sqrt(num / den);
    EXPECT_LT(err, 1e-2) << "variant " << config_name(static_cast<int>(k / kRuns)) << " run "
                         << k % kRuns;
    worst = std::max(worst, err);
  }
  return worst;
}

// Variant 11's automatic prefill form (host logic only: runs without a device). The measured shapes
// of 2026-12-03 each get the form that was faster for them on the H200.
TEST(HopperPrefillForm, TwoWarpgroupsOnlyForLongPrefills) {
  auto params = [](int seqs, int q_len, int ctx) {
    PagedAttentionParams p;
    p.num_seqs = seqs;
    p.num_tokens = seqs * q_len;
    p.max_query_len = q_len;
    p.max_context_len = ctx;
    p.num_heads = 48;
    p.num_kv_heads = 1;
    return p;
  };
  constexpr int kH200Sms = 132;
  EXPECT_TRUE(UseTwoWarpgroupPrefill(params(1, 4096, 4096), kH200Sms));    // 661 -> 619 us
  EXPECT_FALSE(UseTwoWarpgroupPrefill(params(32, 512, 512), kH200Sms));    // 512 -> 532 us
  EXPECT_FALSE(UseTwoWarpgroupPrefill(params(1, 512, 4096), kH200Sms));    // 175 -> 186 us
  EXPECT_FALSE(UseTwoWarpgroupPrefill(params(1, 1024, 1024), kH200Sms));   // equal
  EXPECT_FALSE(UseTwoWarpgroupPrefill(params(64, 1, 2048), kH200Sms));     // decode
  EXPECT_TRUE(UseTwoWarpgroupPrefill(params(8, 2048, 8192), kH200Sms));    // chunks of long prompts
}

// Variant 18's automatic form (host logic only: runs without a device): the pair where one split
// a sequence fills 70-100% of the SMs at contexts up to 2048, as measured on the H200.
TEST(PairDecodeForm, OneSplitWhereItFillsTheSms) {
  auto params = [](int seqs, int ctx) {
    PagedAttentionParams p;
    p.num_seqs = seqs;
    p.num_tokens = seqs;
    p.max_query_len = 1;
    p.max_context_len = ctx;
    p.num_heads = 48;
    p.num_kv_heads = 1;
    return p;
  };
  constexpr int kH200Sms = 132;
  EXPECT_TRUE(UsePairDecode(params(128, 512), kH200Sms));    // 17.46 -> 14.8 us
  EXPECT_TRUE(UsePairDecode(params(120, 1024), kH200Sms));   // 26.4 -> 23.5
  EXPECT_TRUE(UsePairDecode(params(128, 2048), kH200Sms));   // 43.2 -> 41.4
  EXPECT_TRUE(UsePairDecode(params(96, 2048), kH200Sms));    // 38.95 -> 35.9
  EXPECT_TRUE(UsePairDecode(params(132, 100), kH200Sms));    // the whole GPU, one wave
  EXPECT_FALSE(UsePairDecode(params(80, 1024), kH200Sms));   // 61%: 20.6 -> 20.4
  EXPECT_FALSE(UsePairDecode(params(72, 2048), kH200Sms));   // 55%: 29.0 -> 35.5
  EXPECT_FALSE(UsePairDecode(params(64, 8192), kH200Sms));   // two splits of 4096: slower
  EXPECT_FALSE(UsePairDecode(params(128, 4096), kH200Sms));  // longer than measured
  EXPECT_FALSE(UsePairDecode(params(133, 512), kH200Sms));   // more than one wave
  EXPECT_FALSE(UsePairDecode(params(1, 256), kH200Sms));     // batch 1: splits and a merge
  PagedAttentionParams prefill = params(128, 512);
  prefill.max_query_len = 2;  // 96 rows a sequence: not a decode batch for the TMA kernel
  prefill.num_tokens = 256;
  EXPECT_FALSE(UsePairDecode(prefill, kH200Sms));
}

class AttentionCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

// Context lengths in [lo, hi] that are not multiples of the block size.
int RandomContext(std::mt19937& rng, int lo, int hi, int block_size) {
  std::uniform_int_distribution<int> d(lo, hi);
  int x = d(rng);
  if (x % block_size == 0) x = x > 1 ? x - 1 : x;
  return x;
}

TEST_F(AttentionCudaTest, AllCompiledVariantsMatchCpu) {
  std::mt19937 rng(std::random_device{}());
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (int head_dim : {64, 128}) {
      for (int bs : {16, 32}) {
        // MQA decode at StarCoder's 48 heads, long mixed contexts: split-KV.
        AttentionCase dec{dtype, head_dim, bs, 48, 1, {}};
        dec.seqs = {{1, 1}, {RandomContext(rng, 8000, 8192, bs), 1}};
        for (int i = 0; i < 3; ++i) dec.seqs.push_back({RandomContext(rng, 2, 8192, bs), 1});
        const double e1 = RunAttentionCase(dec, rng);
        EXPECT_LT(e1, 1e-2) << Describe(dec);
        // Mixed prefill chunks (mid-sequence starts) and decodes, grouped heads (8 per KV head).
        AttentionCase mix{dtype, head_dim, bs, 16, 2, {}};
        mix.seqs = {{RandomContext(rng, 200, 400, bs), 0},
                    {1, 1},
                    {RandomContext(rng, 600, 900, bs), 129},
                    {RandomContext(rng, 3000, 5000, bs), 1},
                    {65, 64}};
        mix.seqs[0].query_len = mix.seqs[0].context_len;
        const double e2 = RunAttentionCase(mix, rng);
        EXPECT_LT(e2, 1e-2) << Describe(mix);
        std::printf("%s D%d bs%d: decode rel err %.2e, mixed rel err %.2e\n",
                    std::string(DTypeName(dtype)).c_str(), head_dim, bs, e1, e2);
      }
    }
  }
}

TEST_F(AttentionCudaTest, GroupSizesOneToSixtyFourAndBeyond) {
  std::mt19937 rng(std::random_device{}());
  // (num_heads, num_kv_heads): groups 1, 7, 16, 24, 40, 64 and 80 (tiles over rows).
  const int shapes[][2] = {{4, 4}, {14, 2}, {16, 1}, {24, 1}, {40, 1}, {64, 1}, {80, 1}};
  for (const auto& sh : shapes) {
    for (DType dtype : {DType::kF16, DType::kBF16}) {
      AttentionCase c{
          dtype, dtype == DType::kF16 ? 128 : 64, dtype == DType::kF16 ? 16 : 32, sh[0], sh[1], {}};
      for (int i = 0; i < 4; ++i) c.seqs.push_back({RandomContext(rng, 1, 3000, c.block_size), 1});
      EXPECT_LT(RunAttentionCase(c, rng), 1e-2) << Describe(c);
    }
  }
}

TEST_F(AttentionCudaTest, LargeDecodeBatchWithoutSplits) {
  std::mt19937 rng(std::random_device{}());
  AttentionCase c{DType::kF16, 128, 16, 48, 1, {}};
  for (int i = 0; i < 300; ++i) c.seqs.push_back({RandomContext(rng, 1, 700, 16), 1});
  c.force_splits = 1;
  EXPECT_LT(RunAttentionCase(c, rng), 1e-2) << Describe(c);
  c.force_splits = 0;  // automatic
  EXPECT_LT(RunAttentionCase(c, rng), 1e-2) << "auto splits";
}

// The benchmark's decode shapes in small: one long sequence (many splits: variant 2's merge with
// several lanes per item) and a mid-size batch (few splits, several items per lane).
TEST_F(AttentionCudaTest, DecodeVariantsOnBenchmarkShapes) {
  std::mt19937 rng(std::random_device{}());
  AttentionCase one{DType::kF16, 128, 16, 48, 1, {{RandomContext(rng, 8000, 8192, 16), 1}}};
  EXPECT_LT(RunAttentionCase(one, rng), 1e-2) << Describe(one);
  AttentionCase mid{DType::kF16, 128, 16, 48, 1, {}};
  for (int i = 0; i < 40; ++i) mid.seqs.push_back({RandomContext(rng, 1, 2048, 16), 1});
  EXPECT_LT(RunAttentionCase(mid, rng), 1e-2) << Describe(mid);
}

// Variants 4 and 5 merge in the kernel up to 8 / 32 splits and fall back to the merge kernel
// past that: split counts at and just past each cap, a one-token sequence (its only split CTA
// is its own last arriver) and a long one, both dtypes. (The launcher rounds each split to whole
// 64-token tiles: with a longest context of 8000-8192 these counts are exact; 33 would become 32.)
// The same counts take variant 17's merge kernels at and past its warp form's cap (8); 128 is
// the most a 8192-token context can have (one 64-token tile a split).
TEST_F(AttentionCudaTest, InlineMergeAtAndPastItsCaps) {
  std::mt19937 rng(std::random_device{}());
  for (int splits : {2, 8, 9, 32, 64, 128}) {
    const DType dtype = splits == 9 || splits == 64 ? DType::kBF16 : DType::kF16;
    AttentionCase c{dtype, 128, 16, 48, 1, {}};
    c.seqs = {{RandomContext(rng, 8000, 8192, 16), 1}, {1, 1}, {RandomContext(rng, 2, 8192, 16), 1}};
    c.force_splits = splits;
    EXPECT_LT(RunAttentionCase(c, rng), 1e-2) << Describe(c);
  }
}

TEST_F(AttentionCudaTest, ForcedSplitsOnPrefillMergeCorrectly) {
  std::mt19937 rng(std::random_device{}());
  for (int splits : {2, 3, 7}) {
    AttentionCase c{
        DType::kBF16, 128, 16,
        48,           1,   {{RandomContext(rng, 300, 500, 16), 100}, {1000, 1}, {90, 90}}};
    c.force_splits = splits;
    EXPECT_LT(RunAttentionCase(c, rng), 1e-2) << Describe(c);
  }
}

// Causal prefill with StarCoder's 48 heads: hundreds of 64-row tiles per sequence for the wgmma
// kernel (variant 11), a whole prompt and a chunk that starts mid-sequence.
TEST_F(AttentionCudaTest, LongCausalPrefill) {
  std::mt19937 rng(std::random_device{}());
  for (const auto& [dtype, head_dim] : {std::pair{DType::kF16, 128}, std::pair{DType::kBF16, 64}}) {
    AttentionCase c{dtype, head_dim, 16, 48, 1, {{600, 600}, {RandomContext(rng, 300, 500, 16), 150}}};
    EXPECT_LT(RunAttentionCase(c, rng), 1e-2) << Describe(c);
  }
}

TEST_F(AttentionCudaTest, UnknownMaxQueryLenStillCoversEveryRow) {
  std::mt19937 rng(std::random_device{}());
  AttentionCase c{DType::kF16, 64, 16, 12, 3, {{50, 17}, {33, 1}, {7, 7}}};
  c.give_max_query_len = false;
  EXPECT_LT(RunAttentionCase(c, rng), 1e-2) << Describe(c);
}

TEST_F(AttentionCudaTest, RejectsUnsupportedShapes) {
  PagedAttentionParams p;
  p.num_heads = 8;
  p.head_dim = 80;
  p.query_stride = 640;
  p.dtype = DType::kF16;
  p.max_context_len = 10;
  EXPECT_EQ(PagedAttentionCuda(p, nullptr, nullptr, 0).code(), absl::StatusCode::kOk)
      << "an empty batch is fine";
  p.num_tokens = 1;
  p.num_seqs = 1;
  int dummy[4] = {0, 1, 1, 0};
  alignas(16) static uint16_t buf[1024];
  p.query = p.output = buf;
  p.key_cache = p.value_cache = buf;
  p.block_tables = dummy;
  p.query_start = dummy;
  p.context_lens = dummy;
  EXPECT_EQ(PagedAttentionCuda(p, nullptr, nullptr, 0).code(),
            absl::StatusCode::kInvalidArgument);  // head_dim 80
  p.head_dim = 64;
  p.query_stride = 512;
  p.dtype = DType::kF32;
  EXPECT_EQ(PagedAttentionCuda(p, nullptr, nullptr, 0).code(), absl::StatusCode::kInvalidArgument);
  p.dtype = DType::kBF16;
  p.block_size = 12;
  EXPECT_EQ(PagedAttentionCuda(p, nullptr, nullptr, 0).code(), absl::StatusCode::kInvalidArgument);
}

// PagedAttentionCuda with the step's KV write: decode batches whose new K / V rows sit in a QKV
// buffer and whose cache rows at the new slots hold NaN until written; sequences of different
// lengths, so that a sequence's last position is not always in its last split. Variant 13 with
// fuse_kv_write fuses the write into its TMA kernel (automatic splits, at most 512 tokens); with
// two forced splits of the long sequence it runs 11's kernel, which, like variant 11 itself,
// launches the write first. Then a batch whose longest context is at most 4096: variant 15 with 8
// forced splits (at most 512 tokens each: the TMA kernel; 8 a cluster, at most one CTA an SM)
// merges each sequence's splits in a cluster through distributed shared memory, the 1-token
// sequence's 7 idle CTAs taking part with empty rows; it runs twice on one workspace. Variant 16
// (14 with the first stages' K / V requested before the PDL wait) and variant 17 (14 with the
// merge kernel's warp form) on both batches; variant 18's pair forced on both (automatic splits:
// 8, merged in a cluster) and with one split (the form variant 18 takes by itself where it fills
// the SMs: no merge), and with 9 forced splits (the merge kernel) on the first. Every path
// must leave the caches equal to the reference's and the output near the CPU reference.
TEST_F(AttentionCudaTest, KvWriteWithAttentionFusedOrLaunched) {
  std::mt19937 rng(std::random_device{}());
  struct Shape {
    DType dtype;
    int head_dim, block_size, heads, kv_heads;
  };
  for (const Shape& sh : {Shape{DType::kF16, 128, 16, 48, 1}, Shape{DType::kBF16, 64, 32, 16, 2}})
  for (const int max_ctx : {8192, 4096}) {
    std::vector<SeqSpec> seqs = {
        {1, 1}, {RandomContext(rng, max_ctx - 1000, max_ctx, sh.block_size), 1}};
    for (int i = 0; i < 4; ++i) seqs.push_back({RandomContext(rng, 2, 3000, sh.block_size), 1});
    PagedBatch b = testing::MakePagedBatch(seqs, sh.heads, sh.kv_heads, sh.head_dim,
                                           sh.block_size, rng);
    const std::vector<uint16_t> q_bits = RoundTo(b.query, sh.dtype);
    const std::vector<uint16_t> k_bits = RoundTo(b.key_cache, sh.dtype);
    const std::vector<uint16_t> v_bits = RoundTo(b.value_cache, sh.dtype);
    const int D = sh.head_dim, kv_cols = sh.kv_heads * D;
    const int64_t stride = static_cast<int64_t>(sh.heads + 2 * sh.kv_heads) * D;  // a QKV row
    const int tokens = b.num_tokens;  // one a sequence
    std::vector<uint16_t> qkv(tokens * stride);
    std::vector<int32_t> slots(tokens);
    std::vector<uint16_t> k_dev = k_bits, v_dev = v_bits;
    const uint16_t nan_bits = sh.dtype == DType::kF16 ? 0x7e00 : 0x7fc0;
    for (int t = 0; t < tokens; ++t) {
      const int pos = seqs[t].context_len - 1;
      slots[t] = b.block_tables[t * b.max_blocks_per_seq + pos / sh.block_size] * sh.block_size +
                 pos % sh.block_size;
      std::copy_n(q_bits.begin() + int64_t{t} * sh.heads * D, sh.heads * D,
                  qkv.begin() + t * stride);
      std::copy_n(k_bits.begin() + int64_t{slots[t]} * kv_cols, kv_cols,
                  qkv.begin() + t * stride + sh.heads * D);
      std::copy_n(v_bits.begin() + int64_t{slots[t]} * kv_cols, kv_cols,
                  qkv.begin() + t * stride + (sh.heads + sh.kv_heads) * D);
      std::fill_n(k_dev.begin() + int64_t{slots[t]} * kv_cols, kv_cols, nan_bits);
      std::fill_n(v_dev.begin() + int64_t{slots[t]} * kv_cols, kv_cols, nan_bits);
    }
    std::vector<float> ref(b.query.size());
    PagedAttentionParams cpu = testing::HostParams(b, ref);
    cpu.max_query_len = 1;
    ASSERT_TRUE(PagedAttentionCpu(cpu).ok());

    for (int config : max_ctx == 8192 ? std::vector<int>{0, 1, 2, 4, 5, 6, 7, 8}
                                      : std::vector<int>{0, 3, 4, 5, 6, 8}) {
      DeviceBuffer dqkv = DeviceBuffer::From(qkv), dk = DeviceBuffer::From(k_dev),
                   dv = DeviceBuffer::From(v_dev), dt = DeviceBuffer::From(b.block_tables),
                   dqs = DeviceBuffer::From(b.query_start),
                   dctx = DeviceBuffer::From(b.context_lens), dslots = DeviceBuffer::From(slots),
                   dout(q_bits.size() * 2);
      EXPECT_EQ(cudaMemset(dout.get<void>(), 0xff, q_bits.size() * 2), cudaSuccess);
      PagedAttentionParams p = cpu;
      PointAtDevice(p, dqkv, dout, dk, dv, dt, dqs, dctx, sh.dtype);
      p.query_stride = stride;
      KvCacheWriteParams kv;
      kv.key = dqkv.get<uint16_t>() + sh.heads * D;
      kv.value = dqkv.get<uint16_t>() + (sh.heads + sh.kv_heads) * D;
      kv.key_stride = kv.value_stride = stride;
      kv.key_cache = dk.get<void>();
      kv.value_cache = dv.get<void>();
      kv.slot_mapping = dslots.get<int32_t>();
      kv.num_tokens = tokens;
      kv.num_kv_heads = sh.kv_heads;
      kv.head_dim = D;
      kv.block_size = sh.block_size;
      kv.dtype = sh.dtype;
      PagedAttentionTuning tuning;
      tuning.variant = config == 2   ? 11
                       : config == 3 ? 15
                       : config == 4 ? 16
                       : config == 5 ? 17
                       : config >= 6 ? 18
                                     : 13;
      tuning.num_splits = config == 1 ? 2 : config == 3 ? 8 : config == 7 ? 9 : config == 8 ? 1 : 0;
      tuning.pdl = config == 0 || config >= 4;
      tuning.tma_pair = config >= 6;
      tuning.fuse_kv_write = true;  // taken by config 0 only (the TMA kernel)
      const size_t ws_bytes = PagedAttentionCudaWorkspaceBytes(p, tuning);
      DeviceBuffer ws(ws_bytes);
      if (ws_bytes > 0) EXPECT_EQ(cudaMemset(ws.get<void>(), 0, ws_bytes), cudaSuccess);
      for (int run = 0; run < (config == 3 || config == 6 ? 2 : 1); ++run) {
        EXPECT_EQ(cudaMemset(dout.get<void>(), 0xff, q_bits.size() * 2), cudaSuccess);
        const absl::Status st =
            PagedAttentionCuda(p, nullptr, ws.get<void>(), ws_bytes, tuning, &kv);
        ASSERT_TRUE(st.ok()) << st;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      }
      EXPECT_TRUE(dk.Download<uint16_t>() == k_bits) << "config " << config << ": K cache";
      EXPECT_TRUE(dv.Download<uint16_t>() == v_bits) << "config " << config << ": V cache";
      const std::vector<uint16_t> out = dout.Download<uint16_t>();
      std::vector<float> outf(out.size());
      for (size_t i = 0; i < out.size(); ++i) {
        outf[i] = FromBits(out[i], sh.dtype);
        ASSERT_TRUE(std::isfinite(outf[i])) << "config " << config << " element " << i;
      }
      std::vector<double> refd(ref.begin(), ref.end());
      EXPECT_LT(testing::RelativeError(outf, refd), 1e-2) << "config " << config;
    }
  }
}

TEST_F(AttentionCudaTest, PerHeadBaselineMatchesCpu) {
  std::mt19937 rng(std::random_device{}());
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    const int heads = 12, kv_heads = dtype == DType::kF16 ? 1 : 3,
              d = dtype == DType::kF16 ? 128 : 64;
    std::vector<SeqSpec> seqs;
    for (int i = 0; i < 5; ++i) seqs.push_back({RandomContext(rng, 1, 8192, 16), 1});
    PagedBatch b = testing::MakePagedBatch(seqs, heads, kv_heads, d, 16, rng);
    const auto qb = RoundTo(b.query, dtype), kb = RoundTo(b.key_cache, dtype),
               vb = RoundTo(b.value_cache, dtype);
    std::vector<int32_t> mapping(heads);
    for (int h = 0; h < heads; ++h) mapping[h] = h / (heads / kv_heads);
    DeviceBuffer dq = DeviceBuffer::From(qb), dk = DeviceBuffer::From(kb),
                 dv = DeviceBuffer::From(vb), dt = DeviceBuffer::From(b.block_tables),
                 dqs = DeviceBuffer::From(b.query_start), dctx = DeviceBuffer::From(b.context_lens),
                 dmap = DeviceBuffer::From(mapping), dout(qb.size() * 2);
    cudaMemset(dout.get<void>(), 0xff, qb.size() * 2);
    std::vector<float> host_out(b.query.size());
    PagedAttentionParams p = testing::HostParams(b, host_out);
    PointAtDevice(p, dq, dout, dk, dv, dt, dqs, dctx, dtype);
    p.scale = 0.1f;
    ASSERT_TRUE(PagedAttentionPerHeadBaselineCuda(p, dmap.get<int32_t>(), nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto out = dout.Download<uint16_t>();
    std::vector<float> outf(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      outf[i] = FromBits(out[i], dtype);
      ASSERT_TRUE(std::isfinite(outf[i])) << i;
    }
    EXPECT_LT(testing::RelativeError(outf, testing::DenseCausalReference(b, p.scale)), 1e-2);
  }
}

TEST_F(AttentionCudaTest, KvCacheWriteMatchesCpu) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (int d : {64, 128}) {
      const int kv_heads = 2, block_size = 16, num_blocks = 40, tokens = 300;
      const int64_t row = kv_heads * d, stride = row + 3 * 8;  // rows inside a wider QKV row
      std::vector<float> key(tokens * stride), value(tokens * stride);
      for (float& x : key) x = normal(rng);
      for (float& x : value) x = normal(rng);
      const auto kb = RoundTo(key, dtype), vb = RoundTo(value, dtype);
      std::vector<int32_t> slots(num_blocks * block_size);
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(tokens);
      for (int i = 0; i < 10; ++i) slots[rng() % tokens] = -1;
      const size_t cache_elems = static_cast<size_t>(num_blocks) * block_size * row;
      const uint16_t poison_bits = ToBits(-3.25f, dtype);
      std::vector<uint16_t> cache_init(cache_elems, poison_bits);
      DeviceBuffer dk = DeviceBuffer::From(kb), dv = DeviceBuffer::From(vb),
                   ds = DeviceBuffer::From(slots), dkc = DeviceBuffer::From(cache_init),
                   dvc = DeviceBuffer::From(cache_init);
      KvCacheWriteParams p;
      p.key = dk.get<void>();
      p.value = dv.get<void>();
      p.key_stride = p.value_stride = stride;
      p.key_cache = dkc.get<void>();
      p.value_cache = dvc.get<void>();
      p.slot_mapping = ds.get<int32_t>();
      p.num_tokens = tokens;
      p.num_kv_heads = kv_heads;
      p.head_dim = d;
      p.block_size = block_size;
      p.dtype = dtype;
      ASSERT_TRUE(KvCacheWriteCuda(p, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

      std::vector<float> kc(cache_elems, -3.25f), vc(cache_elems, -3.25f);
      KvCacheWriteParams cpu = p;
      cpu.key = key.data();
      cpu.value = value.data();
      cpu.key_cache = kc.data();
      cpu.value_cache = vc.data();
      cpu.slot_mapping = slots.data();
      cpu.dtype = DType::kF32;
      ASSERT_TRUE(KvCacheWriteCpu(cpu).ok());
      const auto gk = dkc.Download<uint16_t>(), gv = dvc.Download<uint16_t>();
      for (size_t i = 0; i < cache_elems; ++i) {
        ASSERT_EQ(FromBits(gk[i], dtype), kc[i]) << i;
        ASSERT_EQ(FromBits(gv[i], dtype), vc[i]) << i;
      }
    }
  }
}

}  // namespace
}  // namespace mqa
