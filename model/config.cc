#include "model/config.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/status.h"
#include "runtime/text_file.h"

namespace mqa {
namespace {

using nlohmann::json;

const char* JsonTypeName(const json& v) { return v.type_name(); }

// Reads one field of the top-level object, trying each spelling in turn (HF renamed some keys
// over the years, e.g. torch_dtype -> dtype, and its attribute_map aliases n_embd as
// hidden_size). Returns nullptr when no spelling is present.
const json* FindField(const json& root, std::initializer_list<const char*> names,
                      std::string* found_name) {
  for (const char* name : names) {
    auto it = root.find(name);
    if (it != root.end()) {
      *found_name = name;
      return &*it;
    }
  }
  return nullptr;
}

class FieldReader {
 public:
  FieldReader(const json& root, std::string source) : root_(root), source_(std::move(source)) {}

  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": field '", field, "' ", what));
  }

  // A required positive integer.
  absl::StatusOr<int64_t> PositiveInt(std::initializer_list<const char*> names) const {
    std::string name;
    const json* v = FindField(root_, names, &name);
    if (v == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(source_, ": missing required field '", *names.begin(), "'"));
    }
    if (!v->is_number_integer()) {
      return Error(name, absl::StrCat("must be an integer, found ", JsonTypeName(*v)));
    }
    const int64_t x = v->get<int64_t>();
    if (x <= 0) return Error(name, absl::StrCat("must be positive, found ", x));
    return x;
  }

  // An optional integer; absent or null gives `fallback`. A list (some configs carry several
  // eos ids) gives its first element.
  absl::StatusOr<int64_t> OptionalInt(const char* name, int64_t fallback) const {
    auto it = root_.find(name);
    if (it == root_.end() || it->is_null()) return fallback;
    const json* v = &*it;
    if (v->is_array() && !v->empty()) v = &(*v)[0];
    if (!v->is_number_integer()) {
      return Error(name, absl::StrCat("must be an integer, found ", JsonTypeName(*v)));
    }
    return v->get<int64_t>();
  }

  absl::StatusOr<double> OptionalNumber(const char* name, double fallback) const {
    auto it = root_.find(name);
    if (it == root_.end() || it->is_null()) return fallback;
    if (!it->is_number()) {
      return Error(name, absl::StrCat("must be a number, found ", JsonTypeName(*it)));
    }
    return it->get<double>();
  }

  absl::StatusOr<bool> OptionalBool(const char* name, bool fallback) const {
    auto it = root_.find(name);
    if (it == root_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) {
      return Error(name, absl::StrCat("must be true or false, found ", JsonTypeName(*it)));
    }
    return it->get<bool>();
  }

  // Absent or null: returns an empty string.
  absl::StatusOr<std::string> OptionalString(std::initializer_list<const char*> names,
                                             std::string* found_name) const {
    const json* v = FindField(root_, names, found_name);
    if (v == nullptr || v->is_null()) return std::string();
    if (!v->is_string()) {
      return Error(*found_name, absl::StrCat("must be a string, found ", JsonTypeName(*v)));
    }
    return v->get<std::string>();
  }

 private:
  const json& root_;
  std::string source_;
};

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text,
                                             std::string_view source_view) {
  const std::string source(source_view);  // this Abseil's StrCat does not take std::string_view
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object, found ", JsonTypeName(root)));
  }
  FieldReader f(root, source);
  ModelConfig c;

  std::string name;
  ASSIGN_OR_RETURN(std::string model_type, f.OptionalString({"model_type"}, &name));
  if (model_type.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": missing field 'model_type' (mqaserve serves model_type \"gpt_bigcode\")"));
  }
  if (model_type != "gpt_bigcode") {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": unsupported model_type \"", model_type,
                     "\"; mqaserve serves GPT-BigCode models (model_type \"gpt_bigcode\")"));
  }

  ASSIGN_OR_RETURN(c.vocab_size, f.PositiveInt({"vocab_size"}));
  ASSIGN_OR_RETURN(c.n_positions, f.PositiveInt({"n_positions", "max_position_embeddings"}));
  ASSIGN_OR_RETURN(c.n_embd, f.PositiveInt({"n_embd", "hidden_size"}));
  ASSIGN_OR_RETURN(c.n_layer, f.PositiveInt({"n_layer", "num_hidden_layers"}));
  ASSIGN_OR_RETURN(c.n_head, f.PositiveInt({"n_head", "num_attention_heads"}));
  if (c.n_embd % c.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": n_embd (", c.n_embd, ") is not a multiple of n_head (", c.n_head, ")"));
  }

  auto inner = root.find("n_inner");
  if (inner == root.end() || inner->is_null()) {
    c.n_inner = 4 * c.n_embd;  // HF GPTBigCodeBlock: n_inner None -> 4 * hidden_size
  } else {
    ASSIGN_OR_RETURN(c.n_inner, f.PositiveInt({"n_inner"}));
  }

  // multi_query decides the number of KV heads; newer configs also write num_key_value_heads,
  // which must agree with it (GPT-BigCode supports exactly 1 or n_head KV heads).
  const bool has_mq = root.contains("multi_query") && !root["multi_query"].is_null();
  ASSIGN_OR_RETURN(c.multi_query, f.OptionalBool("multi_query", true));
  ASSIGN_OR_RETURN(const int64_t kv, f.OptionalInt("num_key_value_heads", -1));
  if (kv != -1) {
    if (kv != 1 && kv != c.n_head) {
      return f.Error("num_key_value_heads", absl::StrCat("must be 1 (multi-query) or n_head (",
                                                         c.n_head, "), found ", kv));
    }
    if (!has_mq) {
      c.multi_query = kv == 1;
    } else if ((kv == 1) != c.multi_query && c.n_head != 1) {
      return f.Error("num_key_value_heads", absl::StrCat("is ", kv, " but multi_query is ",
                                                         c.multi_query ? "true" : "false"));
    }
  }
  c.num_kv_heads = c.multi_query ? 1 : c.n_head;

  ASSIGN_OR_RETURN(const double eps, f.OptionalNumber("layer_norm_epsilon", 1e-5));
  if (!(eps > 0)) return f.Error("layer_norm_epsilon", "must be positive");
  c.layer_norm_epsilon = static_cast<float>(eps);
  ASSIGN_OR_RETURN(const double init_range, f.OptionalNumber("initializer_range", 0.02));
  if (!(init_range >= 0)) return f.Error("initializer_range", "must not be negative");
  c.initializer_range = static_cast<float>(init_range);
  ASSIGN_OR_RETURN(c.scale_attn_weights, f.OptionalBool("scale_attn_weights", true));

  ASSIGN_OR_RETURN(std::string act, f.OptionalString({"activation_function"}, &name));
  if (act.empty()) act = "gelu_pytorch_tanh";
  if (act != "gelu_pytorch_tanh" && act != "gelu" && act != "gelu_new") {
    return f.Error("activation_function",
                   absl::StrCat("is \"", act,
                                "\"; supported: gelu_pytorch_tanh, gelu_new (both tanh "
                                "approximations), gelu (exact)"));
  }
  c.activation = act;

  // Transformers >= 4.56 writes "dtype"; older versions "torch_dtype".
  ASSIGN_OR_RETURN(std::string dtype, f.OptionalString({"dtype", "torch_dtype"}, &name));
  if (dtype.empty() || dtype == "float32") {
    c.checkpoint_dtype = DType::kF32;
  } else if (dtype == "float16") {
    c.checkpoint_dtype = DType::kF16;
  } else if (dtype == "bfloat16") {
    c.checkpoint_dtype = DType::kBF16;
  } else {
    return f.Error(name, absl::StrCat("is \"", dtype, "\"; supported: float32, float16, bfloat16"));
  }

  ASSIGN_OR_RETURN(c.bos_token_id, f.OptionalInt("bos_token_id", -1));
  ASSIGN_OR_RETURN(c.eos_token_id, f.OptionalInt("eos_token_id", -1));
  for (auto [field, id] :
       {std::pair{"bos_token_id", c.bos_token_id}, std::pair{"eos_token_id", c.eos_token_id}}) {
    if (id < -1 || id >= c.vocab_size) {
      return f.Error(field, absl::StrCat("is ", id, ", outside the vocabulary of ", c.vocab_size));
    }
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  ASSIGN_OR_RETURN(const std::string text, ReadTextFile(path));
  return ParseModelConfig(text, path);
}

}  // namespace mqa
