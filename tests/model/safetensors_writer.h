// Test helper: writes small safetensors files (valid ones, and deliberately broken ones through
// RawSafetensors) and random tensors for them.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "runtime/dtype.h"

namespace mqa::testing {

struct StTensor {
  std::string name;
  std::string dtype = "F32";  // safetensors spelling
  std::vector<int64_t> shape;
  std::string bytes;  // little-endian element data
};

// Encodes floats as F32 / F16 / BF16 bytes.
std::string EncodeFloats(const std::vector<float>& values, DType dtype);
// The safetensors spelling of a float dtype ("F32", "F16", "BF16").
std::string SafetensorsDTypeName(DType dtype);

// A valid file: tensors laid out back to back in the given order. `header_pad` extra spaces
// after the JSON (0 gives a header length that is usually not a multiple of 8).
std::string BuildSafetensors(const std::vector<StTensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {},
                             size_t header_pad = 0);
// 8-byte length of `header_json`, the header, then `data`: for broken files.
std::string RawSafetensors(const std::string& header_json, const std::string& data);

void WriteFileOrDie(const std::string& path, const std::string& bytes);
// A fresh empty directory under the test temp dir.
std::string MakeTempDir(const std::string& name);

// Uniform(-1, 1) values that are exactly representable in `dtype` (so conversions back to F32
// compare exactly).
std::vector<float> RandomValues(size_t n, DType dtype, std::mt19937& rng);

}  // namespace mqa::testing
