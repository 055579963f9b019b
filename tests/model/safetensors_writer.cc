#include "tests/model/safetensors_writer.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"

namespace mqa::testing {

std::string EncodeFloats(const std::vector<float>& values, DType dtype) {
  std::string out(values.size() * DTypeSize(dtype), '\0');
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::kF32:
        std::memcpy(&out[i * 4], &values[i], 4);
        break;
      case DType::kF16: {
        const uint16_t h = FloatToHalfBits(values[i]);
        std::memcpy(&out[i * 2], &h, 2);
        break;
      }
      case DType::kBF16: {
        const uint16_t b = FloatToBFloat16Bits(values[i]);
        std::memcpy(&out[i * 2], &b, 2);
        break;
      }
      case DType::kI32:
      case DType::kI64:
        MQA_CHECK(false && "not a float dtype");
    }
  }
  return out;
}

std::string SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

std::string BuildSafetensors(const std::vector<StTensor>& tensors,
                             const std::map<std::string, std::string>& metadata,
                             size_t header_pad) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string data;
  for (const StTensor& t : tensors) {
    header[t.name] = {{"dtype", t.dtype},
                      {"shape", t.shape},
                      {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  return RawSafetensors(header.dump() + std::string(header_pad, ' '), data);
}

std::string RawSafetensors(const std::string& header_json, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header_json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header_json + data;
}

void WriteFileOrDie(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  MQA_CHECK(static_cast<bool>(out));
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  MQA_CHECK(static_cast<bool>(out));
}

std::string MakeTempDir(const std::string& name) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string leaf = "mqa_" + std::to_string(::getpid()) + "_" +
                     (info ? std::string(info->test_suite_name()) + "_" + info->name() : "x") +
                     "_" + name;
  for (char& c : leaf) {
    if (c == '/') c = '_';  // parameterized test names contain '/'
  }
  const std::string dir = ::testing::TempDir() + "/" + leaf;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<float> RandomValues(size_t n, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) {
    x = dist(rng);
    switch (dtype) {
      case DType::kF32:
        break;
      case DType::kF16:
        x = HalfBitsToFloat(FloatToHalfBits(x));
        break;
      case DType::kBF16:
        x = BFloat16BitsToFloat(FloatToBFloat16Bits(x));
        break;
      case DType::kI32:
      case DType::kI64:
        MQA_CHECK(false && "not a float dtype");
    }
    if (x == 0.0f) x = 0.5f;  // non-zero inputs only
  }
  return v;
}

}  // namespace mqa::testing
