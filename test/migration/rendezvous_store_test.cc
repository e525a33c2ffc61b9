#include "migration/core/rendezvous_store.h"

#include <thread>

#include "gtest/gtest.h"
#include "test/migration/forked_ranks.h"

namespace arachne::migration {
namespace {

TEST(FileRendezvousStoreTest, SetThenGetAndReplace) {
  FileRendezvousStore store(testing::MakeTempDir());
  ASSERT_TRUE(store.Set("gen1/nccl_id", std::string("a\0b", 3)).ok());
  auto v = store.Get("gen1/nccl_id", absl::Seconds(1));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("a\0b", 3));
  ASSERT_TRUE(store.Set("gen1/nccl_id", "second").ok());
  EXPECT_EQ(*store.Get("gen1/nccl_id", absl::Seconds(1)), "second");
}

TEST(FileRendezvousStoreTest, KeysWithSlashesAndPercentsDoNotCollide) {
  FileRendezvousStore store(testing::MakeTempDir());
  ASSERT_TRUE(store.Set("a/b", "1").ok());
  ASSERT_TRUE(store.Set("a%2Fb", "2").ok());
  EXPECT_EQ(*store.Get("a/b", absl::Seconds(1)), "1");
  EXPECT_EQ(*store.Get("a%2Fb", absl::Seconds(1)), "2");
}

TEST(FileRendezvousStoreTest, GetWaitsForALaterSet) {
  const std::string dir = testing::MakeTempDir();
  FileRendezvousStore reader(dir);
  std::thread writer([dir] {
    absl::SleepFor(absl::Milliseconds(20));
    FileRendezvousStore(dir).Set("late", "here").IgnoreError();
  });
  auto v = reader.Get("late", absl::Seconds(10));
  writer.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "here");
}

TEST(FileRendezvousStoreTest, MissingKeyTimesOutNamingIt) {
  FileRendezvousStore store(testing::MakeTempDir());
  EXPECT_EQ(store.Get("nobody/sets/this", absl::Milliseconds(10)).status(),
            absl::DeadlineExceededError(
                "store: key 'nobody/sets/this' did not appear within 10ms"));
}

}  // namespace
}  // namespace arachne::migration
