#include "runtime/http/response_store.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mqa {
namespace {

ResponseStore::Entry MakeEntry(const std::string& text) {
  return {.response = {{"text", text}},
          .input_items = nlohmann::json::array(),
          .conversation = nlohmann::ordered_json::array()};
}

TEST(ResponseStoreTest, KeepsGetsAndErases) {
  ResponseStore store(4, 1 << 20);
  ASSERT_TRUE(store.enabled());
  EXPECT_TRUE(store.Put("a", MakeEntry("one")));
  EXPECT_FALSE(store.Put("a", MakeEntry("again")));  // ids are not reused
  ASSERT_NE(store.Get("a"), nullptr);
  EXPECT_EQ(store.Get("a")->response["text"], "one");
  EXPECT_EQ(store.Get("b"), nullptr);
  EXPECT_TRUE(store.Erase("a"));
  EXPECT_FALSE(store.Erase("a"));
  EXPECT_EQ(store.Get("a"), nullptr);
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.bytes(), 0u);
}

// Past max_entries the oldest leave first; deleted ids do not count against the limit.
TEST(ResponseStoreTest, EvictsTheOldestPastTheCount) {
  ResponseStore store(3, 1 << 20);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store.Put(absl::StrCat("r", i), MakeEntry("x")));
  EXPECT_EQ(store.size(), 3u);
  EXPECT_EQ(store.Get("r0"), nullptr);
  EXPECT_EQ(store.Get("r1"), nullptr);
  EXPECT_NE(store.Get("r2"), nullptr);
  EXPECT_NE(store.Get("r4"), nullptr);
  ASSERT_TRUE(store.Erase("r3"));
  ASSERT_TRUE(store.Put("r5", MakeEntry("x")));  // room left by the delete: r2 stays
  EXPECT_NE(store.Get("r2"), nullptr);
  ASSERT_TRUE(store.Put("r6", MakeEntry("x")));
  EXPECT_EQ(store.Get("r2"), nullptr);
  EXPECT_NE(store.Get("r4"), nullptr);
  EXPECT_EQ(store.size(), 3u);
}

// The byte budget: the oldest leave until a new entry fits; one larger than it is not kept.
TEST(ResponseStoreTest, EvictsPastTheBytesAndRefusesAnOversizedEntry) {
  const std::string kilobyte(1000, 'x');
  ResponseStore store(100, 3500);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store.Put(absl::StrCat("r", i), MakeEntry(kilobyte)));
  EXPECT_EQ(store.size(), 3u);
  EXPECT_LE(store.bytes(), 3500u);
  ASSERT_TRUE(store.Put("r3", MakeEntry(kilobyte)));
  EXPECT_EQ(store.Get("r0"), nullptr);
  EXPECT_NE(store.Get("r1"), nullptr);
  EXPECT_LE(store.bytes(), 3500u);
  EXPECT_FALSE(store.Put("big", MakeEntry(std::string(4000, 'y'))));
  EXPECT_EQ(store.Get("big"), nullptr);
  EXPECT_EQ(store.size(), 3u);  // nothing evicted for it
}

// Many deletes and puts keep the bookkeeping bounded and the live entries reachable.
TEST(ResponseStoreTest, DeletesDoNotLoseLiveEntries) {
  ResponseStore store(50, 1 << 20);
  for (int i = 0; i <= 1998; ++i) {  // ends with a put (1998 is a multiple of 3)
    ASSERT_TRUE(store.Put(absl::StrCat("r", i), MakeEntry("x")));
    if (i % 3 != 0) ASSERT_TRUE(store.Erase(absl::StrCat("r", i)));
  }
  // The live ones are the multiples of 3, the newest 50 of them.
  EXPECT_EQ(store.size(), 50u);
  EXPECT_NE(store.Get("r1998"), nullptr);
  EXPECT_NE(store.Get(absl::StrCat("r", 1998 - 3 * 49)), nullptr);
  EXPECT_EQ(store.Get(absl::StrCat("r", 1998 - 3 * 50)), nullptr);
}

TEST(ResponseStoreTest, DisabledKeepsNothing) {
  ResponseStore store(0, 1 << 20);
  EXPECT_FALSE(store.enabled());
  EXPECT_FALSE(store.Put("a", MakeEntry("x")));
  EXPECT_EQ(store.Get("a"), nullptr);
}

}  // namespace
}  // namespace mqa
