#include "model/weights_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/checkpoint.h"
#include "runtime/status.h"

namespace mqa {
namespace {

using Shape = std::vector<int64_t>;

std::string ShapeString(const Shape& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

// Where the loader gets full-model tensors from, by Hugging Face name. Shapes are the full
// (unsharded) shapes; slices are as in TensorSlice.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool Has(const std::string& name) const = 0;
  // OK when the tensor exists with exactly `expected` shape; else an error naming the file,
  // the tensor, and both shapes.
  virtual absl::Status CheckShape(const std::string& name, const Shape& expected) const = 0;
  virtual absl::Status ReadSliceInto(const std::string& name, const TensorSlice& slice, void* dst,
                                     DType dtype) const = 0;
};

class CheckpointSource : public WeightSource {
 public:
  explicit CheckpointSource(std::unique_ptr<Checkpoint> ckpt) : ckpt_(std::move(ckpt)) {}

  bool Has(const std::string& name) const override { return ckpt_->Find(name) != nullptr; }

  absl::Status CheckShape(const std::string& name, const Shape& expected) const override {
    const Checkpoint::Entry* e = ckpt_->Find(name);
    if (e == nullptr) {
      return absl::NotFoundError(absl::StrCat(ckpt_->source(), ": missing tensor '", name,
                                              "' (expected shape ", ShapeString(expected), ")"));
    }
    if (e->info->shape != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          e->file->path(), ": tensor '", name, "' has shape ", ShapeString(e->info->shape),
          " but config.json implies ", ShapeString(expected)));
    }
    return absl::OkStatus();
  }

  absl::Status ReadSliceInto(const std::string& name, const TensorSlice& slice, void* dst,
                             DType dtype) const override {
    return ckpt_->ReadSliceInto(name, slice, dst, dtype);
  }

 private:
  std::unique_ptr<Checkpoint> ckpt_;
};

// Counter-based random weights: element i of tensor `name` is a function of (seed, name, i)
// only, so shards of any world size are slices of one model and can be filled in parallel.
class DummySource : public WeightSource {
 public:
  DummySource(uint64_t seed, float stddev, const std::map<std::string, Shape>* shapes)
      : seed_(seed), stddev_(stddev), shapes_(shapes) {}

  bool Has(const std::string& name) const override { return shapes_->contains(name); }

  absl::Status CheckShape(const std::string& name, const Shape& expected) const override {
    MQA_CHECK(shapes_->at(name) == expected);
    return absl::OkStatus();
  }

  absl::Status ReadSliceInto(const std::string& name, const TensorSlice& slice, void* dst,
                             DType dtype) const override {
    SafetensorsTensorInfo info;
    info.name = name;
    info.shape = shapes_->at(name);
    ASSIGN_OR_RETURN(ResolvedSlice r, ResolveSlice(info, slice, "dummy weights"));
    Fill fill = Fill::kNormal;
    if (absl::EndsWith(name, ".bias")) {
      fill = Fill::kZero;
    } else if (absl::StrContains(name, "ln_")) {
      fill = Fill::kOne;  // ln_1, ln_2, ln_f weights
    }
    const uint64_t key = Mix(seed_ ^ Mix(Fnv1a(name)));
    switch (dtype) {
      case DType::kF32:
        Generate<DType::kF32>(r, fill, key, dst);
        break;
      case DType::kF16:
        Generate<DType::kF16>(r, fill, key, dst);
        break;
      case DType::kBF16:
        Generate<DType::kBF16>(r, fill, key, dst);
        break;
      case DType::kI32:
      case DType::kI64:
        return absl::InvalidArgumentError(
            absl::StrCat("dummy weights: cannot produce ", std::string(DTypeName(dtype))));
    }
    return absl::OkStatus();
  }

 private:
  enum class Fill : uint8_t { kNormal, kZero, kOne };

  // A fixed string hash (std::hash differs between standard libraries; dummy weights should not).
  static uint64_t Fnv1a(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
    return h;
  }

  // splitmix64's finalizer: a bijective 64-bit mix.
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

  // Approximately standard normal: the sum of four 16-bit uniforms (Irwin-Hall, n = 4) is
  // cheap, has the right mean and variance, and is plenty for placeholder weights.
  static float Normal(uint64_t bits) {
    const uint32_t s = static_cast<uint32_t>(bits & 0xffff) + ((bits >> 16) & 0xffff) +
                       ((bits >> 32) & 0xffff) + (bits >> 48);
    constexpr float kScale = 1.7320508f / 65536.0f;  // sqrt(3) / 2^16: unit variance
    return (static_cast<float>(s) - 2.0f * 65535.0f) * kScale;
  }

  template <DType kDst>
  static void Store(void* dst, int64_t i, float v) {
    if constexpr (kDst == DType::kF32) {
      static_cast<float*>(dst)[i] = v;
    } else if constexpr (kDst == DType::kF16) {
      static_cast<uint16_t*>(dst)[i] = FloatToHalfBits(v);
    } else {
      static_cast<uint16_t*>(dst)[i] = FloatToBFloat16Bits(v);
    }
  }

  template <DType kDst>
  void Generate(const ResolvedSlice& r, Fill fill, uint64_t key, void* dst) const {
    const int64_t width = r.col_end - r.col_begin;
    const int64_t rows = r.row_end - r.row_begin;
    auto fill_rows = [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t out = (row - r.row_begin) * width;
        const uint64_t first = static_cast<uint64_t>(row * r.cols + r.col_begin);
        for (int64_t c = 0; c < width; ++c) {
          float v = fill == Fill::kOne ? 1.0f : 0.0f;
          if (fill == Fill::kNormal) {
            v = stddev_ * Normal(Mix(key + (first + c) * 0x9e3779b97f4a7c15ull));
          }
          Store<kDst>(dst, out + c, v);
        }
      }
    };
    // Large tensors (embeddings and MLP matrices of 15B models) are split across cores.
    const int64_t numel = rows * width;
    const int64_t threads =
        std::min<int64_t>({static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency())),
                           32, numel / (1 << 20) + 1, std::max<int64_t>(rows, 1)});
    if (threads <= 1) {
      fill_rows(r.row_begin, r.row_end);
      return;
    }
    std::vector<std::thread> pool;
    const int64_t per = (rows + threads - 1) / threads;
    for (int64_t t = 0; t < threads; ++t) {
      const int64_t begin = r.row_begin + t * per;
      const int64_t end = std::min(r.row_end, begin + per);
      if (begin < end) pool.emplace_back(fill_rows, begin, end);
    }
    for (auto& th : pool) th.join();
  }

  uint64_t seed_;
  float stddev_;
  const std::map<std::string, Shape>* shapes_;
};

// Builds one rank's shard tensor by tensor; owns the running progress totals.
class ShardBuilder {
 public:
  ShardBuilder(const WeightSource& src, const LoadOptions& opts) : src_(src), opts_(opts) {}

  // A fresh zeroed host tensor of this rank's shape.
  absl::StatusOr<Tensor> Zeros(const Shape& shape) {
    ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(shape, opts_.dtype));
    std::memset(t.raw(), 0, t.nbytes());
    return t;
  }

  // Copies `slice` of checkpoint tensor `name` into dst starting at row `dst_row` (dst is
  // dense; the slice's rows land contiguously there).
  absl::Status CopyInto(const std::string& name, const TensorSlice& slice, const Tensor& dst,
                        int64_t dst_row) {
    const int64_t row_elems = dst.rank() <= 1 ? 1 : dst.numel() / dst.dim(0);
    char* out = static_cast<char*>(dst.raw()) + dst_row * row_elems * DTypeSize(dst.dtype());
    return src_.ReadSliceInto(name, slice, out, dst.dtype());
  }

  void Done(const Tensor& t) {
    bytes_ += t.nbytes();
    ++tensors_;
    if (opts_.progress) opts_.progress(bytes_, tensors_);
  }

  // Replicated tensors.
  absl::StatusOr<Tensor> Full(const std::string& name, const Shape& shape) {
    RETURN_IF_ERROR(src_.CheckShape(name, shape));
    ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(shape, opts_.dtype));
    RETURN_IF_ERROR(CopyInto(name, TensorSlice::All(), t, 0));
    Done(t);
    return t;
  }

  // Rows [begin, end) of `name` (full shape `full`) into a zero-padded tensor of `out_rows`
  // rows: vocab-parallel embeddings and column-parallel weights and biases.
  absl::StatusOr<Tensor> RowShard(const std::string& name, const Shape& full, int64_t begin,
                                  int64_t end, int64_t out_rows) {
    RETURN_IF_ERROR(src_.CheckShape(name, full));
    Shape shape = full;
    shape[0] = out_rows;
    ASSIGN_OR_RETURN(Tensor t, Zeros(shape));
    end = std::min(end, full[0]);
    if (begin < end) RETURN_IF_ERROR(CopyInto(name, TensorSlice::Rows(begin, end), t, 0));
    Done(t);
    return t;
  }

  // Columns [begin, end) of a 2-D weight: row-parallel layers' input features.
  absl::StatusOr<Tensor> ColShard(const std::string& name, const Shape& full, int64_t begin,
                                  int64_t end) {
    RETURN_IF_ERROR(src_.CheckShape(name, full));
    ASSIGN_OR_RETURN(Tensor t, Tensor::Empty({full[0], end - begin}, opts_.dtype));
    RETURN_IF_ERROR(CopyInto(name, TensorSlice::Cols(begin, end), t, 0));
    Done(t);
    return t;
  }

  // The bias of a row-parallel layer: real on rank 0, zeros elsewhere, so that the all-reduce
  // of the partial outputs adds it exactly once.
  absl::StatusOr<Tensor> RankZeroBias(const std::string& name, const Shape& shape) {
    if (opts_.rank == 0) return Full(name, shape);
    RETURN_IF_ERROR(src_.CheckShape(name, shape));
    ASSIGN_OR_RETURN(Tensor t, Zeros(shape));
    Done(t);
    return t;
  }

  // c_attn weight ([rows, E]) or bias ([rows]) in this rank's layout (model/weights.h): its
  // query rows, then the K and V rows it needs.
  absl::StatusOr<Tensor> Qkv(const std::string& name, const ModelConfig& c, const ShardInfo& s) {
    const int64_t D = c.head_dim();
    const int64_t E = c.n_embd;
    const bool is_weight = !absl::EndsWith(name, ".bias");
    Shape full = {c.qkv_rows()};
    if (is_weight) full.push_back(E);
    RETURN_IF_ERROR(src_.CheckShape(name, full));
    const int64_t local_q = s.heads_per_rank * D;
    Shape shape = full;
    shape[0] = local_q + 2 * s.kv_heads_per_rank * D;
    ASSIGN_OR_RETURN(Tensor t, Tensor::Empty(shape, opts_.dtype));
    const int64_t first_head = s.rank * s.heads_per_rank;
    if (c.multi_query) {
      // HF layout: [Q of all heads (E rows) | K (D rows) | V (D rows)].
      RETURN_IF_ERROR(
          CopyInto(name, TensorSlice::Rows(first_head * D, first_head * D + local_q), t, 0));
      RETURN_IF_ERROR(CopyInto(name, TensorSlice::Rows(E, E + 2 * D), t, local_q));
    } else {
      // HF layout: per head h, rows [h*3D, h*3D + 3D) hold q_h, k_h, v_h (its c_attn output is
      // viewed as [n_head, 3 * head_dim]). Regrouped to [Q heads | K heads | V heads].
      for (int64_t j = 0; j < s.heads_per_rank; ++j) {
        const int64_t h = first_head + j;
        for (int part = 0; part < 3; ++part) {
          const int64_t src = h * 3 * D + part * D;
          RETURN_IF_ERROR(
              CopyInto(name, TensorSlice::Rows(src, src + D), t, part * local_q + j * D));
        }
      }
    }
    Done(t);
    return t;
  }

 private:
  const WeightSource& src_;
  const LoadOptions& opts_;
  uint64_t bytes_ = 0;
  int64_t tensors_ = 0;
};

// Every Hugging Face tensor of the model with its full shape (lm_head.weight excluded: it is
// optional, tied to wte when absent).
std::map<std::string, Shape> ExpectedShapes(const ModelConfig& c, const std::string& prefix) {
  const int64_t E = c.n_embd;
  std::map<std::string, Shape> shapes;
  shapes[prefix + "wte.weight"] = {c.vocab_size, E};
  shapes[prefix + "wpe.weight"] = {c.n_positions, E};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = absl::StrCat(prefix, "h.", i, ".");
    for (const char* ln : {"ln_1", "ln_2"}) {
      shapes[p + ln + ".weight"] = {E};
      shapes[p + ln + ".bias"] = {E};
    }
    shapes[p + "attn.c_attn.weight"] = {c.qkv_rows(), E};
    shapes[p + "attn.c_attn.bias"] = {c.qkv_rows()};
    shapes[p + "attn.c_proj.weight"] = {E, E};
    shapes[p + "attn.c_proj.bias"] = {E};
    shapes[p + "mlp.c_fc.weight"] = {c.n_inner, E};
    shapes[p + "mlp.c_fc.bias"] = {c.n_inner};
    shapes[p + "mlp.c_proj.weight"] = {E, c.n_inner};
    shapes[p + "mlp.c_proj.bias"] = {E};
  }
  shapes[prefix + "ln_f.weight"] = {E};
  shapes[prefix + "ln_f.bias"] = {E};
  return shapes;
}

absl::StatusOr<GptBigCodeWeights> Build(const WeightSource& src, const ModelConfig& c,
                                        const ShardInfo& s, const std::string& prefix,
                                        const LoadOptions& opts) {
  ShardBuilder b(src, opts);
  GptBigCodeWeights w;
  w.config = c;
  w.shard = s;
  const int64_t E = c.n_embd;
  const int64_t r = s.rank;
  const int64_t local_q = s.heads_per_rank * c.head_dim();

  ASSIGN_OR_RETURN(w.wte, b.RowShard(prefix + "wte.weight", {c.vocab_size, E}, r * s.vocab_shard,
                                     (r + 1) * s.vocab_shard, s.vocab_shard));
  ASSIGN_OR_RETURN(w.wpe, b.Full(prefix + "wpe.weight", {c.n_positions, E}));
  w.layers.resize(c.n_layer);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = absl::StrCat(prefix, "h.", i, ".");
    LayerWeights& l = w.layers[i];
    ASSIGN_OR_RETURN(l.ln_1_w, b.Full(p + "ln_1.weight", {E}));
    ASSIGN_OR_RETURN(l.ln_1_b, b.Full(p + "ln_1.bias", {E}));
    ASSIGN_OR_RETURN(l.c_attn_w, b.Qkv(p + "attn.c_attn.weight", c, s));
    ASSIGN_OR_RETURN(l.c_attn_b, b.Qkv(p + "attn.c_attn.bias", c, s));
    ASSIGN_OR_RETURN(l.c_proj_w,
                     b.ColShard(p + "attn.c_proj.weight", {E, E}, r * local_q, (r + 1) * local_q));
    ASSIGN_OR_RETURN(l.c_proj_b, b.RankZeroBias(p + "attn.c_proj.bias", {E}));
    ASSIGN_OR_RETURN(l.ln_2_w, b.Full(p + "ln_2.weight", {E}));
    ASSIGN_OR_RETURN(l.ln_2_b, b.Full(p + "ln_2.bias", {E}));
    const int64_t i0 = r * s.inner_shard;
    const int64_t i1 = i0 + s.inner_shard;
    ASSIGN_OR_RETURN(l.c_fc_w,
                     b.RowShard(p + "mlp.c_fc.weight", {c.n_inner, E}, i0, i1, s.inner_shard));
    ASSIGN_OR_RETURN(l.c_fc_b, b.RowShard(p + "mlp.c_fc.bias", {c.n_inner}, i0, i1, s.inner_shard));
    ASSIGN_OR_RETURN(l.mlp_proj_w, b.ColShard(p + "mlp.c_proj.weight", {E, c.n_inner}, i0, i1));
    ASSIGN_OR_RETURN(l.mlp_proj_b, b.RankZeroBias(p + "mlp.c_proj.bias", {E}));
  }
  ASSIGN_OR_RETURN(w.ln_f_w, b.Full(prefix + "ln_f.weight", {E}));
  ASSIGN_OR_RETURN(w.ln_f_b, b.Full(prefix + "ln_f.bias", {E}));
  if (src.Has("lm_head.weight")) {
    ASSIGN_OR_RETURN(w.lm_head, b.RowShard("lm_head.weight", {c.vocab_size, E}, r * s.vocab_shard,
                                           (r + 1) * s.vocab_shard, s.vocab_shard));
  } else {
    w.lm_head = w.wte;  // tied (GPT-BigCode's default): the same buffer
  }
  return w;
}

}  // namespace

absl::StatusOr<ShardInfo> MakeShardInfo(const ModelConfig& c, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " of world size ", world_size, " is out of range"));
  }
  if (c.n_head % world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism over ", world_size, " ranks needs n_head (", c.n_head,
        ") to be a multiple of the world size; choose a world size that divides ", c.n_head));
  }
  if (c.n_inner % world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallelism over ", world_size,
                                                   " ranks needs n_inner (", c.n_inner,
                                                   ") to be a multiple of the world size"));
  }
  ShardInfo s;
  s.rank = rank;
  s.world_size = world_size;
  s.heads_per_rank = c.n_head / world_size;
  s.kv_heads_per_rank = c.multi_query ? 1 : s.heads_per_rank;
  s.vocab_shard = (c.vocab_size + world_size - 1) / world_size;
  s.inner_shard = c.n_inner / world_size;
  return s;
}

absl::StatusOr<GptBigCodeWeights> LoadWeights(const LoadOptions& opts) {
  if (!IsFloatDType(opts.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights can be loaded as float32, float16 or bfloat16, not ",
                     std::string(DTypeName(opts.dtype))));
  }
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(opts.model_dir));
  ASSIGN_OR_RETURN(ShardInfo shard, MakeShardInfo(config, opts.rank, opts.world_size));

  if (opts.load_format == "dummy") {
    const std::map<std::string, Shape> shapes = ExpectedShapes(config, "transformer.");
    DummySource src(opts.seed, config.initializer_range, &shapes);
    return Build(src, config, shard, "transformer.", opts);
  }
  if (opts.load_format != "auto" && opts.load_format != "safetensors") {
    return absl::InvalidArgumentError(absl::StrCat("unknown load_format '", opts.load_format,
                                                   "'; expected auto, safetensors or dummy"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(opts.model_dir));
  // GPTBigCodeForCausalLM saves "transformer.*"; a bare GPTBigCodeModel saves no prefix.
  std::string prefix = "transformer.";
  if (ckpt->Find("transformer.wte.weight") == nullptr && ckpt->Find("wte.weight") != nullptr) {
    prefix = "";
  }
  CheckpointSource src(std::move(ckpt));
  return Build(src, config, shard, prefix, opts);
}

}  // namespace mqa
