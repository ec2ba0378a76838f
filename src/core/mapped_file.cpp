#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace bonsai::core {

Expected<std::shared_ptr<const MappedFile>> MappedFile::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO (e.g. -m <(...) or a named pipe) for reading
  // would otherwise block until a writer appears; with it the open returns
  // and the S_ISREG check below refuses the FIFO. No effect on regular files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    return fail(e == ENOENT ? Errc::kNotFound : Errc::kIo, path + ": cannot open: " + std::strerror(e));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return fail(Errc::kIo, path + ": cannot stat: " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(Errc::kIo, path + ": not a regular file");
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return fail(Errc::kIo, path + ": cannot mmap: " + std::strerror(e));
    }
    f->data_ = static_cast<const uint8_t*>(p);
    f->mmapped_ = true;
#ifdef MADV_HUGEPAGE
    // Best effort, errors ignored: where the kernel maps read-only file
    // pages as huge pages (CONFIG_READ_ONLY_THP_FOR_FS, khugepaged) the
    // weight streams of a GEMV then cost one TLB entry per 2 MiB instead of
    // per 4 KiB (bench/results/kernels-2026-11-29-grouped*.txt: 3-20% more
    // GEMV bandwidth on 2 MiB pages).
    ::madvise(p, f->size_, MADV_HUGEPAGE);
#endif
  }
  ::close(fd);
  return std::shared_ptr<const MappedFile>(std::move(f));
}

std::shared_ptr<const MappedFile> MappedFile::from_bytes(std::span<const uint8_t> bytes, std::string name) {
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = std::move(name);
  f->size_ = bytes.size();
  // One spare byte so data() is never null for an empty buffer.
  f->owned_.reset(new uint8_t[bytes.size() + 1]);
  if (!bytes.empty()) std::memcpy(f->owned_.get(), bytes.data(), bytes.size());
  f->data_ = f->owned_.get();
  return f;
}

size_t MappedFile::release(const void* p, size_t n) const {
  if (!mmapped_ || p == nullptr || n == 0) return 0;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + n;
  const auto lo = reinterpret_cast<uintptr_t>(data_), hi = lo + size_;
  if (begin < lo || end > hi) return 0;
  const uintptr_t a = (begin + page - 1) / page * page, b = end / page * page;  // page-aligned interior
  if (b <= a) return 0;
  if (::madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED) != 0) return 0;
  return b - a;
}

MappedFile::~MappedFile() {
  if (mmapped_ && data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace bonsai::core
