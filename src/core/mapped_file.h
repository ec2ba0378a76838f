// A read-only memory mapping of a whole file. The one owner of a model file's
// bytes: every tensor view points into it, and every engine replica of a model
// shares the same MappedFile through std::shared_ptr, so the mapping lives as
// long as the last user. Nothing is copied.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/error.h"

namespace bonsai::core {

class MappedFile {
 public:
  // Maps `path` read-only (MAP_PRIVATE, PROT_READ). An empty file maps to an
  // empty span. Errors: kNotFound (no such file), kIo (open/stat/mmap failed,
  // with errno text and the path; "not a regular file" for directories,
  // devices and FIFOs, which are refused without blocking).
  static Expected<std::shared_ptr<const MappedFile>> open(const std::string& path);

  // Wraps bytes already in memory (tests, fuzzing). The buffer is copied into
  // an owned allocation so the lifetime rules stay the same.
  static std::shared_ptr<const MappedFile> from_bytes(std::span<const uint8_t> bytes, std::string name);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

  // Drops the resident pages that lie wholly inside [p, p + n) (a range of
  // this mapping), madvise(MADV_DONTNEED): resident memory falls, and a
  // later read of those bytes faults them back in from the file unchanged
  // (the mapping is read-only and private, so there are no dirty pages to
  // lose). For a model whose tensors were repacked into a copy at load
  // (DESIGN.md "Weights"). Returns the bytes released: 0 for a from_bytes
  // buffer (heap memory, never released) or a range smaller than a page.
  size_t release(const void* p, size_t n) const;

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool mmapped_ = false;
  std::unique_ptr<uint8_t[]> owned_;  // set by from_bytes
  std::string path_;
};

}  // namespace bonsai::core
