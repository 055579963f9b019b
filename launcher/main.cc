// mqaserve: the server binary. Started by mpirun or srun; every rank runs this main.
//
// Rank 0 owns the engine (scheduler, block manager, sampler) and the HTTP endpoint; with T > 1 the
// other ranks run the worker loop. `mqaserve generate` is the offline path: one prompt, printed.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "launcher/options.h"
#include "launcher/setup.h"
#include "launcher/signals.h"
#include "parallel/world.h"

namespace {

// Before MPI is up, only the launcher's environment says which rank this is. Every rank parses the
// same argv, so a bad command line is reported by rank 0 alone (or by a process run without a
// launcher).
bool LauncherSaysRankZero() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name)) return std::string(value) == "0";
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (const auto& a : args) {
    if (a == "--help" || a == "-h") {
      std::fputs(mqa::UsageText().c_str(), stdout);
      return 0;
    }
  }
  auto options = mqa::ParseOptions(args);
  if (!options.ok()) {
    if (LauncherSaysRankZero()) {
      std::fprintf(stderr, "mqaserve: %s\n", std::string(options.status().message()).c_str());
    }
    return 2;
  }
  mqa::BlockTerminationSignals();  // before MPI starts its threads
  auto world = mqa::World::Init(&argc, &argv);
  if (!world.ok()) {
    std::fprintf(stderr, "mqaserve: MPI start-up failed: %s\n",
                 std::string(world.status().message()).c_str());
    return 1;
  }
  const absl::Status status = mqa::RunRank(*options, **world);
  if (!status.ok()) {
    if (mqa::IsJobWideError(status)) {
      // Every rank holds this error: rank 0 prints the one line, all leave through
      // MPI_Finalize with a non-zero code (no MPI_Abort banner, no rank left behind).
      if ((*world)->is_root()) {
        std::fprintf(stderr, "mqaserve: error: %s\n", std::string(status.message()).c_str());
      }
      world->reset();
      return 1;
    }
    // One clear line from the failing rank; the whole job ends (mpirun kills the other ranks).
    (*world)->Abort(status, 1);
  }
  std::fprintf(stderr, "mqaserve: %s: stopped\n", (*world)->Describe().c_str());
  return 0;
}
