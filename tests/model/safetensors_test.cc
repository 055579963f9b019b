#include "model/safetensors.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "model/checkpoint.h"
#include "tests/model/safetensors_writer.h"

namespace mqa {
namespace {

using testing::BuildSafetensors;
using testing::EncodeFloats;
using testing::RawSafetensors;
using testing::StTensor;

// Asserts a failed status whose message contains every one of `parts`.
#define EXPECT_ERROR_NAMES(status_expr, ...)                                 \
  do {                                                                       \
    const absl::Status st_ = (status_expr);                                  \
    EXPECT_FALSE(st_.ok());                                                  \
    for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__}) { \
      EXPECT_NE(st_.message().find(part_), std::string::npos)                \
          << "'" << part_ << "' missing from: " << st_;                      \
    }                                                                        \
  } while (0)

StTensor F32Tensor(const std::string& name, std::vector<int64_t> shape, float start = 1.0f) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return {name, "F32", std::move(shape), EncodeFloats(v, DType::kF32)};
}

TEST(SafetensorsHeaderTest, ParsesValidHeader) {
  const std::string bytes =
      BuildSafetensors({F32Tensor("a", {2, 3}), F32Tensor("b", {4})}, {{"format", "pt"}});
  auto h = ParseSafetensorsHeader(bytes, "ok.safetensors");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->metadata.at("format"), "pt");
  ASSERT_EQ(h->tensors.size(), 2u);
  const SafetensorsTensorInfo& a = h->tensors.at("a");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.dtype, DType::kF32);
  EXPECT_EQ(a.begin, 0u);
  EXPECT_EQ(a.end, 24u);
  EXPECT_EQ(h->tensors.at("b").begin, 24u);
  EXPECT_EQ(h->data_size, 40u);
  EXPECT_EQ(h->data_offset + h->data_size, bytes.size());
}

TEST(SafetensorsHeaderTest, TruncatedFile) {
  EXPECT_ERROR_NAMES(ParseSafetensorsHeader("\x10\0\0", "t.safetensors").status(), "t.safetensors",
                     "truncated");
  // A valid file cut inside its header.
  const std::string full = BuildSafetensors({F32Tensor("w", {2})});
  EXPECT_ERROR_NAMES(ParseSafetensorsHeader(full.substr(0, 20), "cut.safetensors").status(),
                     "cut.safetensors", "past the end");
}

TEST(SafetensorsHeaderTest, HeaderLengthPastEof) {
  std::string bytes = RawSafetensors("{}", "");
  bytes[0] = static_cast<char>(0xff);
  bytes[5] = 1;
  EXPECT_ERROR_NAMES(ParseSafetensorsHeader(bytes, "len.safetensors").status(), "len.safetensors",
                     "header length");
}

TEST(SafetensorsHeaderTest, BadJson) {
  EXPECT_ERROR_NAMES(
      ParseSafetensorsHeader(RawSafetensors("{\"w\": {\"dtype\": ", ""), "j.safetensors").status(),
      "j.safetensors", "JSON");
  EXPECT_ERROR_NAMES(ParseSafetensorsHeader(RawSafetensors("[1]", ""), "arr.safetensors").status(),
                     "arr.safetensors", "object");
}

TEST(SafetensorsHeaderTest, UnknownDtype) {
  const std::string h = R"({"layer.w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})";
  EXPECT_ERROR_NAMES(ParseSafetensorsHeader(RawSafetensors(h, "abcd"), "d.safetensors").status(),
                     "d.safetensors", "layer.w", "F33");
}

TEST(SafetensorsHeaderTest, OffsetsOutsideData) {
  const std::string h = R"({"big": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  EXPECT_ERROR_NAMES(
      ParseSafetensorsHeader(RawSafetensors(h, std::string(12, 'x')), "o.safetensors").status(),
      "o.safetensors", "big", "data section");
  // A whole valid file truncated inside its data section.
  const std::string full = BuildSafetensors({F32Tensor("first", {2}), F32Tensor("second", {3})});
  EXPECT_ERROR_NAMES(
      ParseSafetensorsHeader(full.substr(0, full.size() - 4), "trunc.safetensors").status(),
      "trunc.safetensors", "second");
}

TEST(SafetensorsHeaderTest, OverlappingTensors) {
  const std::string h =
      R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})";
  EXPECT_ERROR_NAMES(
      ParseSafetensorsHeader(RawSafetensors(h, std::string(12, 'x')), "ov.safetensors").status(),
      "ov.safetensors", "'x'", "'y'", "overlap");
}

TEST(SafetensorsHeaderTest, ShapeOffsetMismatch) {
  const std::string h = R"({"m": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}})";
  EXPECT_ERROR_NAMES(
      ParseSafetensorsHeader(RawSafetensors(h, std::string(8, 'x')), "s.safetensors").status(),
      "s.safetensors", "'m'", "[2,3]");
  const std::string neg = R"({"n": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})";
  EXPECT_ERROR_NAMES(
      ParseSafetensorsHeader(RawSafetensors(neg, std::string(4, 'x')), "n.safetensors").status(),
      "n.safetensors", "'n'");
  const std::string back = R"({"b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})";
  EXPECT_ERROR_NAMES(
      ParseSafetensorsHeader(RawSafetensors(back, std::string(8, 'x')), "b.safetensors").status(),
      "b.safetensors", "'b'");
  const std::string huge =
      R"({"h": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904],
              "data_offsets": [0, 0]}})";
  EXPECT_ERROR_NAMES(ParseSafetensorsHeader(RawSafetensors(huge, ""), "h.safetensors").status(),
                     "h.safetensors", "'h'");
}

TEST(SafetensorsHeaderTest, DuplicateNames) {
  const std::string h =
      R"({"dup": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
          "dup": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  EXPECT_ERROR_NAMES(
      ParseSafetensorsHeader(RawSafetensors(h, std::string(8, 'x')), "dup.safetensors").status(),
      "dup.safetensors", "'dup'", "twice");
}

TEST(SafetensorsHeaderTest, BadMetadata) {
  const std::string h = R"({"__metadata__": {"format": 3}})";
  EXPECT_ERROR_NAMES(ParseSafetensorsHeader(RawSafetensors(h, ""), "m.safetensors").status(),
                     "m.safetensors", "format");
}

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("st"); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    testing::WriteFileOrDie(path, bytes);
    return path;
  }
  std::string dir_;
};

TEST_F(SafetensorsFileTest, OpenErrorsNameTheFile) {
  auto missing = SafetensorsFile::Open(dir_ + "/missing.safetensors");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("missing.safetensors"), std::string::npos);
  const std::string path = Write("empty.safetensors", "");
  EXPECT_ERROR_NAMES(SafetensorsFile::Open(path).status(), path, "truncated");
}

TEST_F(SafetensorsFileTest, UnsupportedDtypeReadNamesTensorAndDtype) {
  StTensor ids{"position_ids", "I64", {2}, std::string(16, '\0')};
  const std::string path = Write("i64.safetensors", BuildSafetensors({ids}));
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_ERROR_NAMES((*file)->Read("position_ids").status(), path, "position_ids", "I64");
  EXPECT_ERROR_NAMES((*file)->Read("absent").status(), path, "absent");
}

struct SliceCase {
  DType file_dtype;
  DType target;
  size_t header_pad;  // 0 usually misaligns the data section
};

class SliceTest : public SafetensorsFileTest, public ::testing::WithParamInterface<SliceCase> {};

// Reference: element (r, c) of a rows x cols matrix, converted to the target dtype and back.
float Expected(const std::vector<float>& full, int64_t cols, int64_t r, int64_t c, DType target) {
  const float v = full[r * cols + c];
  switch (target) {
    case DType::kF32:
      return v;
    case DType::kF16:
      return HalfBitsToFloat(FloatToHalfBits(v));
    case DType::kBF16:
      return BFloat16BitsToFloat(FloatToBFloat16Bits(v));
    case DType::kI32:
    case DType::kI64:
      break;
  }
  return 0;
}

float Load(const Tensor& t, int64_t i) {
  float v = 0;
  ConvertFloats(static_cast<const char*>(t.raw()) + i * DTypeSize(t.dtype()), t.dtype(), &v,
                DType::kF32, 1);
  return v;
}

TEST_P(SliceTest, RowsColsAndRangesMatchTheFullTensor) {
  const SliceCase p = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(p.file_dtype) * 7 + static_cast<int>(p.target));
  const int64_t rows = 11, cols = 13, n1 = 29;
  const std::vector<float> mat = testing::RandomValues(rows * cols, p.file_dtype, rng);
  const std::vector<float> vec = testing::RandomValues(n1, p.file_dtype, rng);
  const std::string dt = testing::SafetensorsDTypeName(p.file_dtype);
  const std::string path =
      Write("slices.safetensors",
            BuildSafetensors({{"vec", dt, {n1}, EncodeFloats(vec, p.file_dtype)},
                              {"mat", dt, {rows, cols}, EncodeFloats(mat, p.file_dtype)}},
                             {}, p.header_pad));
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();

  auto check = [&](const TensorSlice& s, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    auto t = (*file)->Read("mat", s, p.target);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_EQ(t->shape(), (std::vector<int64_t>{r1 - r0, c1 - c0}));
    ASSERT_EQ(t->dtype(), p.target);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        ASSERT_EQ(Load(*t, (r - r0) * (c1 - c0) + (c - c0)), Expected(mat, cols, r, c, p.target))
            << r << "," << c;
      }
    }
  };
  check(TensorSlice::All(), 0, rows, 0, cols);
  check(TensorSlice::Rows(3, 8), 3, 8, 0, cols);
  check(TensorSlice::Rows(10, 11), 10, 11, 0, cols);
  check(TensorSlice::Cols(5, 12), 0, rows, 5, 12);
  check(TensorSlice::Cols(0, 1), 0, rows, 0, 1);
  check(TensorSlice{2, 9, 4, 6}, 2, 9, 4, 6);

  auto v = (*file)->Read("vec", TensorSlice::Rows(7, 20), p.target);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->shape(), (std::vector<int64_t>{13}));
  for (int64_t i = 7; i < 20; ++i) EXPECT_EQ(Load(*v, i - 7), Expected(vec, 1, i, 0, p.target));

  // Out-of-range and column slices of a 1-D tensor are errors naming file and tensor.
  EXPECT_ERROR_NAMES((*file)->Read("mat", TensorSlice::Rows(5, 12)).status(), path, "mat");
  EXPECT_ERROR_NAMES((*file)->Read("mat", TensorSlice::Cols(6, 5)).status(), path, "mat");
  EXPECT_ERROR_NAMES((*file)->Read("vec", TensorSlice::Cols(0, 0)).status(), path, "vec", "2-D");
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, SliceTest,
                         ::testing::Values(SliceCase{DType::kF32, DType::kF32, 0},
                                           SliceCase{DType::kF32, DType::kF32, 5},
                                           SliceCase{DType::kF16, DType::kF32, 0},
                                           SliceCase{DType::kBF16, DType::kF32, 3},
                                           SliceCase{DType::kF32, DType::kBF16, 0},
                                           SliceCase{DType::kF32, DType::kF16, 2},
                                           SliceCase{DType::kBF16, DType::kBF16, 1},
                                           SliceCase{DType::kF16, DType::kF16, 0},
                                           SliceCase{DType::kBF16, DType::kF16, 0}),
                         [](const ::testing::TestParamInfo<SliceCase>& info) {
                           return absl::StrCat(testing::SafetensorsDTypeName(info.param.file_dtype),
                                               "_to_",
                                               testing::SafetensorsDTypeName(info.param.target),
                                               "_pad", info.param.header_pad);
                         });

// --- Sharded checkpoints --------------------------------------------------------------------

class CheckpointTest : public SafetensorsFileTest {
 protected:
  void WriteIndex(const std::string& weight_map_json) {
    Write("model.safetensors.index.json",
          R"({"metadata": {"total_size": 0}, "weight_map": )" + weight_map_json + "}");
  }
};

TEST_F(CheckpointTest, SingleFileAndShardedReadTheSameTensors) {
  Write("model.safetensors", BuildSafetensors({F32Tensor("a", {2, 2}), F32Tensor("b", {3}, 9)}));
  auto single = Checkpoint::Open(dir_);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ((*single)->num_files(), 1u);

  const std::string sharded = testing::MakeTempDir("sharded");
  testing::WriteFileOrDie(sharded + "/model-00001-of-00002.safetensors",
                          BuildSafetensors({F32Tensor("a", {2, 2})}));
  testing::WriteFileOrDie(sharded + "/model-00002-of-00002.safetensors",
                          BuildSafetensors({F32Tensor("b", {3}, 9)}));
  testing::WriteFileOrDie(sharded + "/model.safetensors.index.json",
                          R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                             "b": "model-00002-of-00002.safetensors"}})");
  auto multi = Checkpoint::Open(sharded);
  ASSERT_TRUE(multi.ok()) << multi.status();
  EXPECT_EQ((*multi)->num_files(), 2u);
  EXPECT_EQ((*multi)->TensorNames(), (std::vector<std::string>{"a", "b"}));
  for (const char* name : {"a", "b"}) {
    auto x = (*single)->Read(name);
    auto y = (*multi)->Read(name);
    ASSERT_TRUE(x.ok() && y.ok());
    ASSERT_EQ(x->shape(), y->shape());
    for (int64_t i = 0; i < x->numel(); ++i) EXPECT_EQ(x->data<float>()[i], y->data<float>()[i]);
  }
  EXPECT_EQ((*multi)->Read("b")->data<float>()[2], 11.0f);
}

TEST_F(CheckpointTest, IndexPointsToMissingFile) {
  Write("shard1.safetensors", BuildSafetensors({F32Tensor("a", {2})}));
  WriteIndex(R"({"a": "shard1.safetensors", "h.0.w": "shard2.safetensors"})");
  EXPECT_ERROR_NAMES(Checkpoint::Open(dir_).status(), "model.safetensors.index.json",
                     "shard2.safetensors", "h.0.w");
}

TEST_F(CheckpointTest, IndexListsTensorMissingInShard) {
  Write("shard1.safetensors", BuildSafetensors({F32Tensor("a", {2})}));
  WriteIndex(R"({"a": "shard1.safetensors", "ghost": "shard1.safetensors"})");
  auto c = Checkpoint::Open(dir_);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_ERROR_NAMES(c.status(), "model.safetensors.index.json", "ghost", "shard1.safetensors");
}

TEST_F(CheckpointTest, TensorInTwoShards) {
  Write("s1.safetensors", BuildSafetensors({F32Tensor("a", {2}), F32Tensor("twice", {1})}));
  Write("s2.safetensors", BuildSafetensors({F32Tensor("twice", {1})}));
  WriteIndex(R"({"a": "s1.safetensors", "twice": "s2.safetensors"})");
  EXPECT_ERROR_NAMES(Checkpoint::Open(dir_).status(), "twice", "s1.safetensors", "s2.safetensors");
}

TEST_F(CheckpointTest, BrokenShardErrorNamesIndexShardAndTensor) {
  Write("s1.safetensors", RawSafetensors("{not json", ""));
  WriteIndex(R"({"w": "s1.safetensors"})");
  EXPECT_ERROR_NAMES(Checkpoint::Open(dir_).status(), "model.safetensors.index.json",
                     "s1.safetensors", "JSON");
}

TEST_F(CheckpointTest, BadIndex) {
  WriteIndex(R"({"w": "../outside.safetensors"})");
  EXPECT_ERROR_NAMES(Checkpoint::Open(dir_).status(), "model.safetensors.index.json", "'w'");
  Write("model.safetensors.index.json", "{\"weight_map\": [");
  EXPECT_ERROR_NAMES(Checkpoint::Open(dir_).status(), "model.safetensors.index.json", "JSON");
}

TEST_F(CheckpointTest, EmptyFolderIsNotFound) {
  auto c = Checkpoint::Open(dir_);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_ERROR_NAMES(c.status(), dir_, "model.safetensors");
}

}  // namespace
}  // namespace mqa
