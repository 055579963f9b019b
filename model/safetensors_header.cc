// The pure part of safetensors reading: header parsing and slice resolution. Kept apart from the
// mmap code so that the fuzz target (tests/model/safetensors_header_fuzz.cc) builds from this
// file alone.
#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace mqa {
namespace {

using nlohmann::json;

// The format's own limit (safetensors MAX_HEADER_SIZE): a larger length is corruption.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeEntry {
  const char* name;
  size_t size;
  std::optional<DType> dtype;
};

// Every dtype the safetensors format defines; only the float ones are readable here, the others
// still parse so that the sizes of all tensors in a file can be validated.
constexpr DTypeEntry kDTypes[] = {
    {"F32", 4, DType::kF32},   {"F16", 2, DType::kF16},      {"BF16", 2, DType::kBF16},
    {"F64", 8, std::nullopt},  {"I64", 8, std::nullopt},     {"U64", 8, std::nullopt},
    {"I32", 4, std::nullopt},  {"U32", 4, std::nullopt},     {"I16", 2, std::nullopt},
    {"U16", 2, std::nullopt},  {"I8", 1, std::nullopt},      {"U8", 1, std::nullopt},
    {"BOOL", 1, std::nullopt}, {"F8_E4M3", 1, std::nullopt}, {"F8_E5M2", 1, std::nullopt},
};

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", what));
}

absl::Status ParseTensorEntry(const std::string& source, const std::string& name, const json& v,
                              SafetensorsTensorInfo* info) {
  const std::string where = absl::StrCat("tensor '", name, "': ");
  if (!v.is_object()) {
    return Invalid(source, absl::StrCat(where, "entry must be an object, found ", v.type_name()));
  }
  info->name = name;

  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string()) {
    return Invalid(source, absl::StrCat(where, "missing or non-string 'dtype'"));
  }
  info->dtype_name = dt->get<std::string>();
  const DTypeEntry* entry = nullptr;
  for (const DTypeEntry& e : kDTypes) {
    if (info->dtype_name == e.name) entry = &e;
  }
  if (entry == nullptr) {
    return Invalid(source, absl::StrCat(where, "unknown dtype '", info->dtype_name, "'"));
  }
  info->dtype = entry->dtype;
  info->element_size = entry->size;

  auto shape = v.find("shape");
  if (shape == v.end() || !shape->is_array()) {
    return Invalid(source, absl::StrCat(where, "missing or non-array 'shape'"));
  }
  uint64_t numel = 1;
  uint64_t nonzero_product = 1;  // bounded too, so that sub-products (rows x cols) never overflow
  for (const json& d : *shape) {
    // Non-negative integers parse as unsigned; a dimension past 2^62 cannot be a real tensor and
    // keeps every later product of int64s clear of overflow checks here.
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 62)) {
      return Invalid(source, absl::StrCat(where,
                                          "shape entries must be non-negative integers, "
                                          "found ",
                                          d.dump()));
    }
    const uint64_t dim = d.get<uint64_t>();
    if (__builtin_mul_overflow(numel, dim, &numel) ||
        __builtin_mul_overflow(nonzero_product, dim == 0 ? 1 : dim, &nonzero_product) ||
        nonzero_product > (uint64_t{1} << 62)) {
      return Invalid(source, absl::StrCat(where, "shape ", shape->dump(), " is too large"));
    }
    info->shape.push_back(static_cast<int64_t>(dim));
  }

  auto offsets = v.find("data_offsets");
  if (offsets == v.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return Invalid(source, absl::StrCat(where,
                                        "'data_offsets' must be [begin, end] with "
                                        "non-negative integers"));
  }
  info->begin = (*offsets)[0].get<uint64_t>();
  info->end = (*offsets)[1].get<uint64_t>();
  if (info->begin > info->end) {
    return Invalid(source, absl::StrCat(where, "data_offsets [", info->begin, ", ", info->end,
                                        "] end before begin"));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, uint64_t{entry->size}, &nbytes) ||
      nbytes != info->end - info->begin) {
    return Invalid(source,
                   absl::StrCat(where, "shape ", shape->dump(), " of ", info->dtype_name, " needs ",
                                numel, " x ", entry->size, " bytes but data_offsets [", info->begin,
                                ", ", info->end, "] span ", info->end - info->begin));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::string_view file_bytes,
                                                         std::string_view source_view) {
  const std::string source(source_view);  // this Abseil's StrCat does not take std::string_view
  if (file_bytes.size() < 8) {
    return Invalid(source, absl::StrCat("truncated: ", file_bytes.size(),
                                        " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = header_len << 8 | static_cast<uint8_t>(file_bytes[i]);
  }
  if (header_len > file_bytes.size() - 8) {
    return Invalid(source, absl::StrCat("header length ", header_len, " runs past the end of the ",
                                        file_bytes.size(), "-byte file (truncated?)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return Invalid(source, absl::StrCat("header length ", header_len,
                                        " exceeds the format's "
                                        "limit of ",
                                        kMaxHeaderBytes));
  }
  const std::string_view text = file_bytes.substr(8, header_len);

  // nlohmann::json keeps the last of duplicate keys silently; the callback sees every key of
  // the top-level object (depth 1) so that a duplicated tensor name is an error.
  std::set<std::string, std::less<>> keys;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(text.begin(), text.end(), on_event);
  } catch (const json::exception& e) {
    return Invalid(source, absl::StrCat("header is not valid JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    return Invalid(source, absl::StrCat("tensor '", duplicate, "' appears twice in the header"));
  }
  if (!root.is_object()) {
    return Invalid(source, absl::StrCat("header must be a JSON object, found ", root.type_name()));
  }

  SafetensorsHeader header;
  header.data_offset = 8 + header_len;
  header.data_size = file_bytes.size() - header.data_offset;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Invalid(source, "'__metadata__' must be an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return Invalid(source,
                         absl::StrCat("'__metadata__' value of '", m.key(), "' must be a string"));
        }
        header.metadata.emplace(m.key(), m->get<std::string>());
      }
      continue;
    }
    SafetensorsTensorInfo info;
    if (absl::Status s = ParseTensorEntry(source, it.key(), *it, &info); !s.ok()) return s;
    if (info.end > header.data_size) {
      return Invalid(source, absl::StrCat("tensor '", info.name, "': data_offsets [", info.begin,
                                          ", ", info.end, "] run past the ", header.data_size,
                                          "-byte data section"));
    }
    header.tensors.emplace(info.name, std::move(info));
  }

  // No two tensors may share bytes (empty tensors share nothing).
  std::vector<const SafetensorsTensorInfo*> by_offset;
  for (const auto& [name, info] : header.tensors) {
    if (info.end > info.begin) by_offset.push_back(&info);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto* prev = by_offset[i - 1];
    const auto* cur = by_offset[i];
    if (cur->begin < prev->end) {
      return Invalid(source, absl::StrCat("tensors '", prev->name, "' [", prev->begin, ", ",
                                          prev->end, ") and '", cur->name, "' [", cur->begin, ", ",
                                          cur->end, ") overlap"));
    }
  }
  return header;
}

absl::StatusOr<ResolvedSlice> ResolveSlice(const SafetensorsTensorInfo& info,
                                           const TensorSlice& slice, std::string_view source_view) {
  const std::string source(source_view);
  ResolvedSlice r;
  const int rank = static_cast<int>(info.shape.size());
  r.rows = rank == 0 ? 1 : info.shape[0];
  r.cols = 1;
  for (int i = 1; i < rank; ++i) r.cols *= info.shape[i];
  r.row_begin = slice.row_begin;
  r.row_end = slice.row_end == -1 ? r.rows : slice.row_end;
  r.col_begin = slice.col_begin;
  r.col_end = slice.col_end == -1 ? r.cols : slice.col_end;
  auto describe = [&] {
    std::string shape;
    for (int64_t d : info.shape) absl::StrAppend(&shape, shape.empty() ? "" : ", ", d);
    return absl::StrCat(source, ": tensor '", info.name, "' of shape [", shape, "]: slice rows [",
                        r.row_begin, ", ", r.row_end, ") cols [", r.col_begin, ", ", r.col_end,
                        ")");
  };
  if (r.row_begin < 0 || r.row_begin > r.row_end || r.row_end > r.rows || r.col_begin < 0 ||
      r.col_begin > r.col_end || r.col_end > r.cols) {
    return absl::OutOfRangeError(absl::StrCat(describe(), " is out of bounds"));
  }
  const bool all_cols = r.col_begin == 0 && r.col_end == r.cols;
  if (!all_cols && rank != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(describe(), ": column slices need a 2-D tensor"));
  }
  if (rank == 0) {
    if (r.row_begin != 0 || r.row_end != 1) {
      return absl::InvalidArgumentError(absl::StrCat(describe(), ": a scalar cannot be sliced"));
    }
    return r;  // out_shape {}
  }
  r.out_shape = info.shape;
  r.out_shape[0] = r.row_end - r.row_begin;
  if (rank == 2) r.out_shape[1] = r.col_end - r.col_begin;
  return r;
}

}  // namespace mqa
