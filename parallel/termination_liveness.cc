#include "parallel/termination_liveness.h"

#include <atomic>
#include <utility>

#include "parallel/mpi_wait.h"
#include "runtime/status.h"

namespace mqa {
namespace {

constexpr int kNoteTag = 1;
std::atomic<bool> g_terminating{false};
// A send's buffer must outlive the send, which is not waited for (it is one eager byte).
const uint8_t kNote = 1;

}  // namespace

void TerminationLiveness::NoteTerminating() { g_terminating.store(true); }

absl::StatusOr<std::unique_ptr<TerminationLiveness>> TerminationLiveness::Create(
    const World& world) {
  ASSIGN_OR_RETURN(Communicator comm, world.Dup());
  std::unique_ptr<TerminationLiveness> liveness(new TerminationLiveness(std::move(comm)));
  if (liveness->size_ == 1) return liveness;
  if (liveness->rank_ == 0) {
    liveness->notes_.assign(liveness->size_ - 1, MPI_REQUEST_NULL);
    liveness->note_bytes_.assign(liveness->size_ - 1, 0);
    for (int peer = 1; peer < liveness->size_; ++peer) {
      MPI_Irecv(&liveness->note_bytes_[peer - 1], 1, MPI_BYTE, peer, kNoteTag,
                liveness->comm_.get(), &liveness->notes_[peer - 1]);
    }
  }
  TerminationLiveness* self = liveness.get();
  SetWaitHooks({.on_poll = [self] { self->OnPoll(); },
                .peers_alive = [self] { return self->PeersAlive(); }});
  return liveness;
}

TerminationLiveness::TerminationLiveness(Communicator comm)
    : comm_(std::move(comm)), rank_(comm_.rank()), size_(comm_.size()) {}

TerminationLiveness::~TerminationLiveness() {
  if (size_ == 1) return;
  SetWaitHooks({});
  for (MPI_Request& note : notes_) {
    if (note == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&note);
    MPI_Wait(&note, MPI_STATUS_IGNORE);
  }
}

void TerminationLiveness::OnPoll() {
  if (rank_ == 0 || sent_ || !g_terminating.load(std::memory_order_relaxed)) return;
  sent_ = true;
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Isend(&kNote, 1, MPI_BYTE, 0, kNoteTag, comm_.get(), &request) == MPI_SUCCESS) {
    MPI_Request_free(&request);
  }
}

bool TerminationLiveness::PeersAlive() {
  if (rank_ != 0) return false;
  int all = 0;
  MPI_Testall(static_cast<int>(notes_.size()), notes_.data(), &all, MPI_STATUSES_IGNORE);
  return all != 0;
}

}  // namespace mqa
