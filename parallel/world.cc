#include "parallel/world.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace mqa {

Communicator::~Communicator() {
  // MPI_Comm_free after MPI_Finalize is an error; World outlives its Communicators by contract,
  // but guard anyway so a late destructor in a failing test does not crash the report.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    Communicator old(comm_);
    comm_ = other.comm_;
    other.comm_ = MPI_COMM_NULL;
  }
  return *this;
}

absl::StatusOr<Communicator> Communicator::Dup(MPI_Comm comm) {
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_RETURN_IF_ERROR(MPI_Comm_dup(comm, &dup));
  Communicator owned(dup);
  MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
  return owned;
}

int Communicator::rank() const {
  int r = 0;
  MQA_CHECK(MPI_Comm_rank(comm_, &r) == MPI_SUCCESS);
  return r;
}

int Communicator::size() const {
  int n = 0;
  MQA_CHECK(MPI_Comm_size(comm_, &n) == MPI_SUCCESS);
  return n;
}

absl::StatusOr<std::unique_ptr<World>> World::Init(int* argc, char*** argv) {
  std::unique_ptr<World> world(new World());
  int initialized = 0;
  MPI_RETURN_IF_ERROR(MPI_Initialized(&initialized));
  if (initialized) {
    MPI_RETURN_IF_ERROR(MPI_Query_thread(&world->thread_level_));
  } else {
    MPI_RETURN_IF_ERROR(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &world->thread_level_));
    world->owns_mpi_ = true;
  }
  if (world->thread_level_ < MPI_THREAD_FUNNELED) {
    return absl::FailedPreconditionError(
        absl::StrCat("the MPI library provides thread level ", world->thread_level_,
                     "; mqaserve needs MPI_THREAD_FUNNELED or better (MPI_THREAD_MULTIPLE asked)"));
  }
  // Errors on the world communicator come back as codes (MPI_RETURN_IF_ERROR), not as an abort
  // inside the library: a failing peer must end the job with our message, not MPI's.
  MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  ASSIGN_OR_RETURN(world->world_, Communicator::Dup(MPI_COMM_WORLD));
  MPI_RETURN_IF_ERROR(MPI_Comm_rank(MPI_COMM_WORLD, &world->rank_));
  MPI_RETURN_IF_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &world->size_));

  MPI_Comm local = MPI_COMM_NULL;
  MPI_RETURN_IF_ERROR(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world->rank_,
                                          MPI_INFO_NULL, &local));
  Communicator local_comm(local);
  MPI_RETURN_IF_ERROR(MPI_Comm_rank(local, &world->local_rank_));
  MPI_RETURN_IF_ERROR(MPI_Comm_size(local, &world->local_size_));

  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_RETURN_IF_ERROR(MPI_Get_processor_name(name, &len));
  world->hostname_.assign(name, len);
  return world;
}

World::~World() {
  world_ = Communicator();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_mpi_ && !finalized) MPI_Finalize();
}

void World::Abort(const absl::Status& status, int exit_code) const {
  std::fprintf(stderr, "mqaserve %s: fatal: %s\n", Describe().c_str(), status.ToString().c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code == 0 ? 1 : exit_code);
  std::_Exit(exit_code == 0 ? 1 : exit_code);  // MPI_Abort should not return; never continue.
}

std::string World::Describe() const {
  return absl::StrCat("rank ", rank_, "/", size_, " on ", hostname_, " (local ", local_rank_, "/",
                      local_size_, ")");
}

absl::StatusOr<int> DeviceForRank(const World& world, int device_count) {
  if (world.local_size() > device_count) {
    return absl::FailedPreconditionError(
        absl::StrCat(world.local_size(), " ranks run on ", world.hostname(), " but it has ",
                     device_count, " CUDA device(s); start at most one rank per GPU on each node"));
  }
  return world.local_rank();
}

}  // namespace mqa
