// Collectives over MPI. CPU tensors are reduced in place; GPU tensors are staged through pinned
// host memory, so several ranks can share one GPU (NCCL refuses that). MPI has no half type:
// f16/bf16 are widened to f32, summed in f32 and rounded once, so every rank gets the same bits.
// Every operation is nonblocking and completed by WaitForRequest, which gives up at the deadline
// instead of hanging on a dead peer.
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "parallel/collectives.h"
#include "parallel/mpi_wait.h"
#include "parallel/world.h"
#include "runtime/status.h"

#ifdef MQA_WITH_CUDA
#include "runtime/cuda_check.h"
#endif

namespace mqa {
namespace {

// A grow-only host buffer; page-locked (cudaMallocHost) when `pinned`, for fast device copies.
class HostScratch {
 public:
  explicit HostScratch(bool pinned) : pinned_(pinned) {}
  ~HostScratch() { Release(); }
  HostScratch(const HostScratch&) = delete;
  HostScratch& operator=(const HostScratch&) = delete;

  absl::StatusOr<char*> Get(size_t bytes) {
    if (bytes <= size_) return data_;
    Release();
    const size_t padded = (bytes + 4095) / 4096 * 4096;
    if (pinned_) {
#ifdef MQA_WITH_CUDA
      void* p = nullptr;
      CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, padded));
      data_ = static_cast<char*>(p);
#else
      return absl::FailedPreconditionError("mqaserve was built without CUDA");
#endif
    } else {
      data_ = static_cast<char*>(std::aligned_alloc(64, padded));
      if (data_ == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat("host scratch of ", bytes, " bytes"));
      }
    }
    size_ = padded;
    return data_;
  }

 private:
  void Release() {
    if (data_ == nullptr) return;
#ifdef MQA_WITH_CUDA
    if (pinned_) {
      cudaFreeHost(data_);
    } else {
      std::free(data_);
    }
#else
    std::free(data_);
#endif
    data_ = nullptr;
    size_ = 0;
  }

  bool pinned_;
  char* data_ = nullptr;
  size_t size_ = 0;
};

class MpiCollectives final : public Collectives {
 public:
  MpiCollectives(Communicator comm, const CollectivesOptions& options)
      : comm_(std::move(comm)), rank_(comm_.rank()), size_(comm_.size()), options_(options) {}

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }

  absl::Status AllReduceSum(Tensor& tensor) override {
    RETURN_IF_ERROR(broken_);
    if (!IsFloatDType(tensor.dtype())) {
      return absl::InvalidArgumentError(
          absl::StrCat("AllReduceSum: not a float tensor: ", tensor.DebugString()));
    }
    const size_t n = tensor.numel();
    if (n == 0) return absl::OkStatus();
    const absl::Time deadline = absl::Now() + options_.timeout;
    char* host = static_cast<char*>(tensor.raw());
    if (tensor.device() == Device::kCuda) {
      ASSIGN_OR_RETURN(host, pinned_.Get(tensor.nbytes()));
      RETURN_IF_ERROR(CopyAndWait(host, tensor.raw(), tensor.nbytes()));
    }
    float* acc = reinterpret_cast<float*>(host);
    if (tensor.dtype() != DType::kF32) {
      ASSIGN_OR_RETURN(char* wide, widened_.Get(n * sizeof(float)));
      acc = reinterpret_cast<float*>(wide);
      ConvertFloats(host, tensor.dtype(), acc, DType::kF32, n);
    }
    // MPI counts are int: reduce in chunks.
    constexpr size_t kChunk = size_t{1} << 28;
    for (size_t begin = 0; begin < n; begin += kChunk) {
      const int count = static_cast<int>(std::min(kChunk, n - begin));
      MPI_Request request = MPI_REQUEST_NULL;
      MPI_RETURN_IF_ERROR(MPI_Iallreduce(MPI_IN_PLACE, acc + begin, count, MPI_FLOAT, MPI_SUM,
                                         comm_.get(), &request));
      RETURN_IF_ERROR(Wait(&request, deadline, "MPI all-reduce"));
    }
    if (tensor.dtype() != DType::kF32) ConvertFloats(acc, DType::kF32, host, tensor.dtype(), n);
    if (tensor.device() == Device::kCuda) {
      RETURN_IF_ERROR(CopyAndWait(tensor.raw(), host, tensor.nbytes()));
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(const Tensor& input, Tensor& output) override {
    RETURN_IF_ERROR(broken_);
    RETURN_IF_ERROR(CheckGatherShapes("AllGather", input, output));
    ASSIGN_OR_RETURN(const int bytes, MpiBytes("AllGather", input.nbytes()));
    if (bytes == 0) return absl::OkStatus();
    const absl::Time deadline = absl::Now() + options_.timeout;
    ASSIGN_OR_RETURN(Staged staged, Stage(input, &output));
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_RETURN_IF_ERROR(MPI_Iallgather(staged.in, bytes, MPI_BYTE, staged.out, bytes, MPI_BYTE,
                                       comm_.get(), &request));
    RETURN_IF_ERROR(Wait(&request, deadline, "MPI all-gather"));
    return Unstage(staged, output);
  }

  absl::Status Gather(const Tensor& input, Tensor& output, int root) override {
    RETURN_IF_ERROR(broken_);
    RETURN_IF_ERROR(CheckRoot("Gather", root));
    if (rank_ == root) RETURN_IF_ERROR(CheckGatherShapes("Gather", input, output));
    ASSIGN_OR_RETURN(const int bytes, MpiBytes("Gather", input.nbytes()));
    if (bytes == 0) return absl::OkStatus();
    const absl::Time deadline = absl::Now() + options_.timeout;
    ASSIGN_OR_RETURN(Staged staged, Stage(input, rank_ == root ? &output : nullptr));
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_RETURN_IF_ERROR(MPI_Igather(staged.in, bytes, MPI_BYTE, staged.out, bytes, MPI_BYTE, root,
                                    comm_.get(), &request));
    RETURN_IF_ERROR(Wait(&request, deadline, "MPI gather"));
    if (rank_ != root) return absl::OkStatus();
    return Unstage(staged, output);
  }

  absl::Status Broadcast(Tensor& tensor, int root) override {
    RETURN_IF_ERROR(broken_);
    RETURN_IF_ERROR(CheckRoot("Broadcast", root));
    ASSIGN_OR_RETURN(const int bytes, MpiBytes("Broadcast", tensor.nbytes()));
    if (bytes == 0) return absl::OkStatus();
    const absl::Time deadline = absl::Now() + options_.timeout;
    char* host = static_cast<char*>(tensor.raw());
    if (tensor.device() == Device::kCuda) {
      ASSIGN_OR_RETURN(host, pinned_.Get(tensor.nbytes()));
      if (rank_ == root) RETURN_IF_ERROR(CopyAndWait(host, tensor.raw(), tensor.nbytes()));
    }
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_RETURN_IF_ERROR(MPI_Ibcast(host, bytes, MPI_BYTE, root, comm_.get(), &request));
    RETURN_IF_ERROR(Wait(&request, deadline, "MPI broadcast"));
    if (tensor.device() == Device::kCuda && rank_ != root) {
      RETURN_IF_ERROR(CopyAndWait(tensor.raw(), host, tensor.nbytes()));
    }
    return absl::OkStatus();
  }

 private:
  // Host pointers for a gather: the tensors' own memory when on the CPU, else the pinned scratch
  // (input first, then output).
  struct Staged {
    const char* in = nullptr;
    char* out = nullptr;
    bool out_staged = false;
  };

  absl::StatusOr<Staged> Stage(const Tensor& input, Tensor* output) {
    Staged s;
    const bool in_gpu = input.device() == Device::kCuda;
    const bool out_gpu = output != nullptr && output->device() == Device::kCuda;
    const size_t in_bytes = in_gpu ? (input.nbytes() + 63) / 64 * 64 : 0;
    const size_t out_bytes = out_gpu ? output->nbytes() : 0;
    char* scratch = nullptr;
    if (in_gpu || out_gpu) {
      ASSIGN_OR_RETURN(scratch, pinned_.Get(in_bytes + out_bytes));
    }
    if (in_gpu) {
      RETURN_IF_ERROR(CopyAndWait(scratch, input.raw(), input.nbytes()));
      s.in = scratch;
    } else {
      s.in = static_cast<const char*>(input.raw());
    }
    if (out_gpu) {
      s.out = scratch + in_bytes;
      s.out_staged = true;
    } else if (output != nullptr) {
      s.out = static_cast<char*>(output->raw());
    }
    return s;
  }

  absl::Status Unstage(const Staged& s, Tensor& output) {
    if (!s.out_staged) return absl::OkStatus();
    return CopyAndWait(output.raw(), s.out, output.nbytes());
  }

  absl::Status CopyAndWait(void* dst, const void* src, size_t bytes) {
#ifdef MQA_WITH_CUDA
    auto stream = static_cast<cudaStream_t>(options_.cuda_stream);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
#else
    (void)dst;
    (void)src;
    (void)bytes;
    return absl::FailedPreconditionError("mqaserve was built without CUDA");
#endif
  }

  absl::Status CheckGatherShapes(absl::string_view op, const Tensor& input, const Tensor& output) {
    if (!output.defined() || output.dtype() != input.dtype() ||
        output.nbytes() != input.nbytes() * size_) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": output ", output.defined() ? output.DebugString() : "undefined",
                       " must hold ", size_, " x input ", input.DebugString()));
    }
    return absl::OkStatus();
  }

  absl::Status CheckRoot(absl::string_view op, int root) {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": root ", root, " of ", size_));
    }
    return absl::OkStatus();
  }

  static absl::StatusOr<int> MpiBytes(absl::string_view op, size_t bytes) {
    if (bytes > static_cast<size_t>(INT_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", bytes, " bytes per rank is more than MPI's int count"));
    }
    return static_cast<int>(bytes);
  }

  absl::Status Wait(MPI_Request* request, absl::Time deadline, absl::string_view what) {
    // A collective's partners are working too: poll hard, then back off quickly to a short sleep
    // (a rank that waits long is waiting for a slower peer, not for idle time).
    BackoffPolicy policy;
    policy.spin = absl::Milliseconds(2);
    policy.hold = absl::Milliseconds(50);
    policy.max_sleep = absl::Milliseconds(1);
    absl::Status status = WaitForRequest(request, deadline, what, policy);
    if (!status.ok()) {
      // The ranks are out of step: refuse every later call. MPI cannot cancel or free a pending
      // collective, so its request is kept (and whatever buffer it writes to must stay alive
      // until the job ends, which it should, promptly: World::Abort).
      broken_ = absl::FailedPreconditionError(
          absl::StrCat("MPI collectives unusable after an earlier failure: ", status.message()));
      if (*request != MPI_REQUEST_NULL) abandoned_.push_back(*request);
    }
    return status;
  }

  Communicator comm_;
  int rank_;
  int size_;
  CollectivesOptions options_;
  HostScratch pinned_{/*pinned=*/true};
  HostScratch widened_{/*pinned=*/false};
  absl::Status broken_;
  std::vector<MPI_Request> abandoned_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collectives>> MakeMpiCollectives(const World& world,
                                                                const CollectivesOptions& options) {
  ASSIGN_OR_RETURN(Communicator comm, world.Dup());
  return std::make_unique<MpiCollectives>(std::move(comm), options);
}

#ifndef MQA_WITH_CUDA
absl::StatusOr<std::unique_ptr<Collectives>> MakeNcclCollectives(const World&, int,
                                                                 const CollectivesOptions&) {
  return absl::FailedPreconditionError("NCCL collectives need a build with CUDA");
}
#endif

}  // namespace mqa
