// One rank: nothing to exchange. AllGather/Gather still copy so that callers can treat the
// output uniformly whatever the world size.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "parallel/collectives.h"
#include "runtime/status.h"

#ifdef MQA_WITH_CUDA
#include "runtime/cuda_check.h"
#endif

namespace mqa {
namespace {

absl::Status CopyTensor(const Tensor& src, Tensor& dst) {
  if (src.dtype() != dst.dtype() || src.nbytes() != dst.nbytes()) {
    return absl::InvalidArgumentError(absl::StrCat("collective copy: input ", src.DebugString(),
                                                   " does not fit output ", dst.DebugString()));
  }
  if (src.nbytes() == 0 || src.raw() == dst.raw()) return absl::OkStatus();
  if (src.device() == Device::kCpu && dst.device() == Device::kCpu) {
    std::memcpy(dst.raw(), src.raw(), src.nbytes());
    return absl::OkStatus();
  }
#ifdef MQA_WITH_CUDA
  CUDA_RETURN_IF_ERROR(cudaMemcpy(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDefault));
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError("mqaserve was built without CUDA");
#endif
}

class LocalCollectives final : public Collectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status AllReduceSum(Tensor&) override { return absl::OkStatus(); }
  absl::Status AllGather(const Tensor& input, Tensor& output) override {
    return CopyTensor(input, output);
  }
  absl::Status Gather(const Tensor& input, Tensor& output, int root) override {
    if (root != 0) return absl::InvalidArgumentError(absl::StrCat("Gather: root ", root, " of 1"));
    return CopyTensor(input, output);
  }
  absl::Status Broadcast(Tensor&, int root) override {
    if (root != 0) {
      return absl::InvalidArgumentError(absl::StrCat("Broadcast: root ", root, " of 1"));
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Collectives> MakeLocalCollectives() { return std::make_unique<LocalCollectives>(); }

}  // namespace mqa
