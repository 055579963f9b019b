#include "launcher/setup.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "model/config.h"
#include "model/gpt_bigcode_runner.h"
#include "model/tokenizer/tokenizer.h"
#include "parallel/collectives.h"
#include "parallel/control_channel.h"
#include "parallel/distributed_runner.h"
#include "runtime/detokenizer.h"
#include "runtime/engine.h"

namespace mqa {
namespace {

absl::StatusOr<DType> ResolveDType(const Options& o, const ModelConfig& config) {
  if (o.device == "cpu") {
    if (o.dtype != "auto" && o.dtype != "float32") {
      return absl::InvalidArgumentError(
          absl::StrCat("--dtype ", o.dtype, ": the CPU backend computes in float32"));
    }
    return DType::kF32;
  }
  if (o.dtype == "float16") return DType::kF16;
  if (o.dtype == "bfloat16") return DType::kBF16;
  if (o.dtype == "float32") return DType::kF32;
  return config.checkpoint_dtype == DType::kBF16 ? DType::kBF16 : DType::kF16;
}

absl::StatusOr<std::string> TokenizerPath(const Options& o) {
  std::filesystem::path p = o.tokenizer.empty() ? o.model : o.tokenizer;
  if (std::filesystem::is_directory(p)) p /= "tokenizer.json";
  if (!std::filesystem::exists(p)) {
    return absl::NotFoundError(absl::StrCat(
        "no tokenizer: ", p.string(), " does not exist (pass --tokenizer DIR or FILE)"));
  }
  return p.string();
}

EngineOptions MakeEngineOptions(const Options& o, const ModelConfig& config,
                                const Tokenizer& tokenizer) {
  EngineOptions e;
  e.max_num_seqs = o.max_num_seqs;
  e.max_num_batched_tokens = o.max_num_batched_tokens;
  e.max_model_len = o.max_model_len > 0 ? o.max_model_len : static_cast<int>(config.n_positions);
  e.max_queued_requests = o.max_queued_requests;
  e.enable_prefix_caching = o.enable_prefix_caching;
  e.enable_chunked_prefill = o.enable_chunked_prefill;
  e.seed = o.seed;
  if (auto eos = tokenizer.eos_id()) {
    e.eos_token_id = *eos;
  } else if (config.eos_token_id >= 0) {
    e.eos_token_id = static_cast<int32_t>(config.eos_token_id);
  }
  return e;
}

absl::Status Generate(const Options& o, Engine& engine, const Tokenizer& tokenizer) {
  EngineRequest request;
  request.request_id = "generate";
  request.prompt_token_ids = tokenizer.Encode(o.prompt);
  request.params.max_tokens = o.max_tokens;
  request.params.temperature = o.temperature;
  request.params.top_p = o.top_p;
  request.params.top_k = o.top_k;
  request.params.seed = o.sample_seed;
  // Stop strings are the engine's job (StopStringMatcher): the detokenizer gets none.
  request.make_detokenizer = [&tokenizer] {
    return std::make_unique<StreamingDetokenizer>(tokenizer, StreamingDetokenizerOptions{});
  };
  RequestOutputQueue outputs;
  request.on_output = outputs.Callback();
  RETURN_IF_ERROR(engine.AddRequest(std::move(request)));
  std::fputs(o.prompt.c_str(), stdout);
  bool finished = false;
  while (!finished) {
    RETURN_IF_ERROR(engine.Step());
    while (auto out = outputs.Pop(absl::ZeroDuration())) {
      if (!out->error.ok()) return out->error;
      for (const auto& sample : out->samples) std::fputs(sample.text.c_str(), stdout);
      std::fflush(stdout);
      finished = finished || out->finished;
    }
  }
  std::fputs("\n", stdout);
  return absl::OkStatus();
}

absl::Status RunRoot(const Options& o, Engine& engine, const Tokenizer& tokenizer) {
  switch (o.command) {
    case Command::kGenerate:
      return Generate(o, engine, tokenizer);
    case Command::kServe:
      return absl::UnimplementedError(
          "the HTTP endpoint is not there yet (issue: OpenAI-compatible HTTP endpoint); "
          "use `mqaserve generate --model DIR --prompt TEXT` meanwhile");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunRank(const Options& o, const World& world) {
  if (o.tensor_parallel_size > 0 && o.tensor_parallel_size != world.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor-parallel-size ", o.tensor_parallel_size,
                     " differs from the number of MPI ranks (", world.size(),
                     "): start one rank per shard, e.g. mpirun -np ", o.tensor_parallel_size));
  }
  if (!std::filesystem::is_directory(o.model)) {
    return absl::NotFoundError(absl::StrCat("model folder ", o.model, " does not exist"));
  }
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(o.model));
  if (o.device == "cuda") {
    return absl::UnimplementedError("--device cuda: the CUDA forward is not wired in yet");
  }
  // Rank 0 reads the tokenizer before the collective start-up, so that a missing file is one
  // clear error rather than a hang in the others.
  std::optional<Tokenizer> tokenizer;
  if (world.is_root()) {
    ASSIGN_OR_RETURN(const std::string tokenizer_path, TokenizerPath(o));
    ASSIGN_OR_RETURN(tokenizer, Tokenizer::FromFile(tokenizer_path));
  }

  LoadOptions load;
  load.model_dir = o.model;
  load.load_format = o.load_format;
  load.seed = o.seed;
  ASSIGN_OR_RETURN(load.dtype, ResolveDType(o, config));
  std::unique_ptr<Collectives> collectives;
  if (world.size() == 1) {
    collectives = MakeLocalCollectives();
  } else {
    ASSIGN_OR_RETURN(collectives, MakeMpiCollectives(world));
  }
  GptBigCodeRunnerOptions runner_options;
  runner_options.block_size = o.block_size;
  runner_options.num_kv_blocks = o.num_kv_blocks;
  runner_options.kv_cache_bytes = static_cast<int64_t>(o.kv_cache_memory_gib * (1LL << 30));
  runner_options.max_batched_tokens = o.max_num_batched_tokens;
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner,
                   CreateGptBigCodeRunnerFromDir(load, collectives.get(), runner_options));
  std::fprintf(stderr,
               "mqaserve: %s: loaded %s (%lld layers, %lld heads of %lld, %lld KV head%s, vocab "
               "%lld) on %s; %d KV blocks of %d tokens\n",
               world.Describe().c_str(), o.model.c_str(), static_cast<long long>(config.n_layer),
               static_cast<long long>(config.n_head), static_cast<long long>(config.head_dim()),
               static_cast<long long>(config.num_kv_heads), config.num_kv_heads == 1 ? "" : "s",
               static_cast<long long>(config.vocab_size), o.device.c_str(),
               runner->num_kv_blocks(), runner->block_size());

  std::unique_ptr<ControlChannel> channel;
  DistributedRunner* distributed = nullptr;
  PlanCodecOptions codec;
  codec.block_size = o.block_size;
  if (world.size() > 1) {
    ASSIGN_OR_RETURN(channel, ControlChannel::Create(world));
    if (!world.is_root()) {
      WorkerOptions worker;
      worker.codec = codec;
      return RunWorker(*channel, *runner, worker);
    }
    auto wrapped = std::make_unique<DistributedRunner>(std::move(runner), channel.get(), codec);
    distributed = wrapped.get();
    runner = std::move(wrapped);
  }
  ASSIGN_OR_RETURN(auto engine,
                   Engine::Create(std::move(runner), MakeEngineOptions(o, config, *tokenizer)));
  absl::Status result = RunRoot(o, *engine, *tokenizer);
  // Workers leave their loop only on the shutdown plan (or their timeout).
  if (distributed != nullptr) {
    absl::Status shutdown = distributed->Shutdown();
    if (result.ok()) result = shutdown;
  }
  return result;
}

}  // namespace mqa
