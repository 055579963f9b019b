// libFuzzer target for the safetensors header parser: arbitrary bytes as a whole file must give
// a Status (never a crash, overflow or out-of-bounds read), and an accepted header must uphold
// the invariants the readers rely on. Built with clang++ (tests/model/CMakeLists.txt).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "model/safetensors.h"
#include "runtime/status.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto header = mqa::ParseSafetensorsHeader(bytes, "fuzz.safetensors");
  if (!header.ok()) return 0;
  MQA_CHECK(header->data_offset + header->data_size == size);
  uint64_t previous_end = 0;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, info] : header->tensors) {
    MQA_CHECK(info.begin <= info.end && info.end <= header->data_size);
    MQA_CHECK(static_cast<uint64_t>(info.numel()) * info.element_size == info.end - info.begin);
    auto all = mqa::ResolveSlice(info, mqa::TensorSlice::All(), "fuzz.safetensors");
    MQA_CHECK(all.ok());
    MQA_CHECK(all->out_numel() == info.numel());
    if (info.end > info.begin) spans.emplace_back(info.begin, info.end);
    // Convert the first row of float tensors, as the reader would: in bounds of the input.
    if (info.dtype.has_value() && all->rows > 0 && all->cols > 0) {
      const int64_t n = all->cols;
      std::vector<float> out(static_cast<size_t>(std::min<int64_t>(n, 4096)));
      std::vector<char> src(out.size() * info.element_size);
      std::memcpy(src.data(), bytes.data() + header->data_offset + info.begin, src.size());
      mqa::ConvertFloats(src.data(), *info.dtype, out.data(), mqa::DType::kF32, out.size());
    }
  }
  std::sort(spans.begin(), spans.end());
  for (const auto& [begin, end] : spans) {
    MQA_CHECK(begin >= previous_end);  // no overlaps
    previous_end = end;
  }
  return 0;
}
