// hub::list_cached (`bonsai list`): the models of a Hugging Face cache laid
// out by hand (no network), a split model (gguf-split parts) as one entry.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "hub/hub.h"

namespace bonsai::hub {
namespace {

namespace fs = std::filesystem;

void write_bytes(const fs::path& p, size_t n) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << std::string(n, 'x');
}

TEST(HubList, SplitPartsAreOneModelWithTheirTotalSize) {
  const fs::path cache = fs::path(::testing::TempDir()) / ("bonsai_list_" + std::to_string(::getpid()));
  fs::remove_all(cache);
  const fs::path repo = cache / "models--prism-ml--Bonsai-8B-gguf";
  const fs::path snap = repo / "snapshots" / "c0ffee";
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << "c0ffee";
  write_bytes(snap / "Bonsai-8B-Q1_0-00001-of-00003.gguf", 300);
  write_bytes(snap / "Bonsai-8B-Q1_0-00002-of-00003.gguf", 200);
  write_bytes(snap / "Bonsai-8B-Q1_0-00003-of-00003.gguf", 100);
  write_bytes(snap / "Bonsai-8B-Q2_0.gguf", 50);
  write_bytes(snap / "sub" / "Half-00002-of-00002.gguf", 70);  // part 1 never arrived
  write_bytes(snap / "Whole-00001-of-00001.gguf", 10);         // a one-part "split" is a plain file
  write_bytes(snap / "README.md", 5);

  HubOptions o;
  o.cache_dir = cache;
  const auto models = list_cached(o);
  fs::remove_all(cache);
  ASSERT_EQ(models.size(), 4u);
  // Sorted by path: the split set under its first part.
  EXPECT_EQ(models[0].path, "Bonsai-8B-Q1_0-00001-of-00003.gguf");
  EXPECT_EQ(models[0].local, snap / "Bonsai-8B-Q1_0-00001-of-00003.gguf");
  EXPECT_EQ(models[0].size, 600u);
  EXPECT_EQ(models[0].parts, 3);
  EXPECT_EQ(models[0].parts_present, 3);
  EXPECT_EQ(models[0].repo, "prism-ml/Bonsai-8B-gguf");
  EXPECT_TRUE(models[0].current);
  EXPECT_EQ(models[1].path, "Bonsai-8B-Q2_0.gguf");
  EXPECT_EQ(models[1].size, 50u);
  EXPECT_EQ(models[1].parts, 1);
  EXPECT_EQ(models[2].path, "Whole-00001-of-00001.gguf");
  EXPECT_EQ(models[2].parts, 1);
  // An incomplete set is listed as such, named by the part it lacks.
  EXPECT_EQ(models[3].path, "sub/Half-00001-of-00002.gguf");
  EXPECT_EQ(models[3].size, 70u);
  EXPECT_EQ(models[3].parts, 2);
  EXPECT_EQ(models[3].parts_present, 1);
}

}  // namespace
}  // namespace bonsai::hub
