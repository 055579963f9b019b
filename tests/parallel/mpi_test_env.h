// MPI in GoogleTest binaries run under mpirun: a global environment owns the one World of the
// process (MPI_Init before the first test, MPI_Finalize after the last). Include from exactly
// one .cc of a test binary. Every rank runs every test; tests must call collectives in the same
// order on all ranks.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "parallel/world.h"

namespace mqa {

class MpiTestEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    auto world = World::Init();
    ASSERT_TRUE(world.ok()) << world.status();
    world_ = *std::move(world);
  }
  void TearDown() override { world_.reset(); }
  static World& world() { return *world_; }

 private:
  static inline std::unique_ptr<World> world_;
};

inline ::testing::Environment* const kMpiTestEnvironment =
    ::testing::AddGlobalTestEnvironment(new MpiTestEnvironment);

inline World& TestWorld() { return MpiTestEnvironment::world(); }

}  // namespace mqa
