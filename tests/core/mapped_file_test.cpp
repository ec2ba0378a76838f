// MappedFile::open on paths that are not regular files.
#include "core/mapped_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <string>

namespace bonsai::core {
namespace {

// `bonsai info -m FIFO` used to hang forever: open(O_RDONLY) on a FIFO blocks
// until some process opens it for writing. It must be refused at once.
TEST(MappedFile, FifoIsRefusedWithoutBlocking) {
  const auto path = (std::filesystem::temp_directory_path() / ("bonsai_fifo_" + std::to_string(::getpid()))).string();
  std::filesystem::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  auto fut = std::async(std::launch::async, [&] { return MappedFile::open(path); });
  const bool done = fut.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  if (!done) {
    // Unblock the stuck open so the test can finish (and fail).
    const int w = ::open(path.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) ::close(w);
  }
  auto r = fut.get();
  std::filesystem::remove(path);
  ASSERT_TRUE(done) << "MappedFile::open blocked on a FIFO";
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, Errc::kIo);
  EXPECT_NE(r.error().message.find("not a regular file"), std::string::npos) << r.error().message;
}

TEST(MappedFile, DirectoryAndMissingFileAreErrors) {
  auto dir = MappedFile::open(std::filesystem::temp_directory_path().string());
  ASSERT_FALSE(dir.has_value());
  EXPECT_NE(dir.error().message.find("not a regular file"), std::string::npos);
  auto missing = MappedFile::open("/nonexistent/bonsai/file.gguf");
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code, Errc::kNotFound);
}

TEST(MappedFile, RegularFileMapsItsBytes) {
  const auto path =
      (std::filesystem::temp_directory_path() / ("bonsai_mapped_" + std::to_string(::getpid()) + ".bin")).string();
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fputs("GGUF", f);
    std::fclose(f);
  }
  auto m = MappedFile::open(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(m.has_value()) << m.error().message;
  ASSERT_EQ((*m)->size(), 4u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*m)->data()), 4), "GGUF");
}

}  // namespace
}  // namespace bonsai::core
