// Split GGUF models read as one File: the part names, File::open (which finds
// a part's siblings) and the checks that bind parts into one model. Format:
// llama.cpp's gguf-split (tools/gguf-split/gguf-split.cpp writes the parts,
// src/llama-model-loader.cpp reads them): parts named "%s-%05d-of-%05d.gguf"
// (1-based), each a complete GGUF; part 1 holds the model's metadata, every
// part split.no (u16, 0-based), split.count (u16) and split.tensors.count
// (i32, the tensors of all parts).
#include <sys/stat.h>

#include <charconv>
#include <cstdio>
#include <string>

#include "gguf/gguf.h"

namespace bonsai::gguf {

namespace {

constexpr std::string_view kSplitNo = "split.no";
constexpr std::string_view kSplitCount = "split.count";
constexpr std::string_view kSplitTensors = "split.tensors.count";

// "part 2 of 3" (1-based, as the file names count).
std::string part_text(size_t index, size_t count) {
  return "part " + std::to_string(index + 1) + " of " + std::to_string(count);
}

}  // namespace

std::optional<SplitName> parse_split_name(std::string_view path) {
  constexpr std::string_view kExt = ".gguf";
  constexpr size_t kTail = 1 + 5 + 4 + 5 + 5;  // "-NNNNN-of-NNNNN.gguf"
  if (path.size() < kTail || !path.ends_with(kExt)) return std::nullopt;
  const std::string_view tail = path.substr(path.size() - kTail, kTail - kExt.size());  // "-NNNNN-of-NNNNN"
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-") return std::nullopt;
  auto number = [](std::string_view digits, int& out) {
    for (char c : digits)
      if (c < '0' || c > '9') return false;
    const auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
    return ec == std::errc() && p == digits.data() + digits.size();
  };
  SplitName s;
  if (!number(tail.substr(1, 5), s.no) || !number(tail.substr(10, 5), s.count)) return std::nullopt;
  if (s.no < 1 || s.count < 1 || s.no > s.count) return std::nullopt;
  s.prefix = std::string(path.substr(0, path.size() - kTail));
  return s;
}

std::string split_part_name(std::string_view prefix, int no, int count) {
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "-%05d-of-%05d.gguf", no, count);
  return std::string(prefix) + suffix;
}

// Checks parsed parts as one split set and merges them into the first (a
// friend of File: it moves the later parts' tensors and mappings in).
class SplitAssembler {
 public:
  // `named`: the parts were found by their file names (File::open), so an
  // index is "its name makes it part i" rather than "the i-th given".
  static core::Expected<std::shared_ptr<const File>> assemble(std::vector<std::shared_ptr<File>> parts, bool named);
};

core::Expected<std::shared_ptr<const File>> SplitAssembler::assemble(std::vector<std::shared_ptr<File>> parts,
                                                                     bool named) {
  const size_t n = parts.size();
  const std::string whose = named ? "its name makes it " : "it was given as ";
  auto key_error = [](const File& f, std::string_view key, const std::string& why) {
    return core::fail(core::Errc::kFormat, f.path() + ": key '" + std::string(key) + "' " + why);
  };
  // An integer key of one part (T: its gguf-split type): missing, not an
  // integer or out of T's range is a kFormat error naming the part.
  auto read_key = [&]<class T>(const File& f, std::string_view key, size_t i, T) -> core::Expected<int64_t> {
    if (!f.has(key)) {
      return key_error(f, key,
                       "is missing: " + whose + part_text(i, n) + " of a split GGUF, and every gguf-split part has it");
    }
    auto v = f.get<T>(key);
    if (!v) return core::fail(core::Errc::kFormat, v.error().message);
    return static_cast<int64_t>(*v);
  };
  for (size_t i = 0; i < n; ++i) {
    const File& f = *parts[i];
    auto count = read_key(f, kSplitCount, i, uint16_t{});
    if (!count) return std::unexpected(count.error());
    if (*count != static_cast<int64_t>(n)) {
      return key_error(f, kSplitCount,
                       "is " + std::to_string(*count) + ", but " +
                           (named ? "its name says the set has " + std::to_string(n) + " parts"
                                  : std::to_string(n) + " part(s) were given"));
    }
    auto no = read_key(f, kSplitNo, i, uint16_t{});
    if (!no) return std::unexpected(no.error());
    if (*no != static_cast<int64_t>(i)) {
      return key_error(f, kSplitNo,
                       "is " + std::to_string(*no) + ", but " + whose + part_text(i, n) + " (split.no " +
                           std::to_string(i) + ": it counts from 0)");
    }
  }
  File& base = *parts[0];
  auto total = read_key(base, kSplitTensors, 0, int32_t{});
  if (!total) return std::unexpected(total.error());
  // Later parts' split.tensors.count (gguf-split writes it in every part) must agree.
  for (size_t i = 1; i < n; ++i) {
    if (!parts[i]->has(kSplitTensors)) continue;
    auto t = read_key(*parts[i], kSplitTensors, i, int32_t{});
    if (!t) return std::unexpected(t.error());
    if (*t != *total) {
      return key_error(
          *parts[i], kSplitTensors,
          "is " + std::to_string(*t) + ", but part 1 (" + base.path() + ") says " + std::to_string(*total));
    }
  }
  // Q2_0 layouts: each part detected (or was forced) on its own; one model, one layout.
  size_t layout_from = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& l = parts[i]->q2_layout_;
    if (!l) continue;
    if (!base.q2_layout_) {
      base.q2_layout_ = l;
      layout_from = i;
    } else if (*base.q2_layout_ != *l) {
      return core::fail(core::Errc::kFormat,
                        parts[i]->path() + ": its Q2_0 tensors have the " + std::string(core::q2_layout_name(*l)) +
                            " layout, but those of " + parts[layout_from]->path() + " have " +
                            std::string(core::q2_layout_name(*base.q2_layout_)) +
                            "; pass --q2-layout g64|g128-d-first|g128-qs-first (or BONSAI_Q2_LAYOUT)");
    }
  }
  base.parts_.resize(1);
  for (size_t i = 1; i < n; ++i) {
    File& part = *parts[i];
    for (TensorInfo t : part.tensors_) {
      if (auto it = base.tensor_index_.find(t.name); it != base.tensor_index_.end()) {
        const Part& other = base.parts_[base.tensors_[it->second].part];
        return core::fail(core::Errc::kFormat, part.path() + ": tensor '" + std::string(t.name) + "' is also in " +
                                                   other.mapping->path() +
                                                   " (a tensor belongs to one part of a split GGUF)");
      }
      t.part = static_cast<uint32_t>(i);
      base.tensor_index_.emplace(t.name, base.tensors_.size());
      base.tensors_.push_back(t);
    }
    base.parts_.push_back(part.parts_.front());
  }
  if (*total != static_cast<int64_t>(base.tensors_.size())) {
    return key_error(base, kSplitTensors,
                     "is " + std::to_string(*total) + ", but the " + std::to_string(n) + " parts hold " +
                         std::to_string(base.tensors_.size()) + " tensors" +
                         (named ? "" : " (a part is missing or does not belong to this set)"));
  }
  return std::shared_ptr<const File>(std::move(parts[0]));
}

core::Expected<std::shared_ptr<const File>> File::parse_split(
    std::vector<std::shared_ptr<const core::MappedFile>> parts, const OpenOptions& options) {
  if (parts.empty()) return core::fail(core::Errc::kInvalidArgument, "gguf: a split set needs at least one part");
  std::vector<std::shared_ptr<File>> files;
  files.reserve(parts.size());
  for (auto& m : parts) {
    auto f = parse_one(std::move(m), options);
    if (!f) return std::unexpected(f.error());
    files.push_back(std::move(*f));
  }
  return SplitAssembler::assemble(std::move(files), /*named=*/false);
}

core::Expected<std::shared_ptr<const File>> File::open(const std::string& path, const OpenOptions& options) {
  auto m = core::MappedFile::open(path);
  if (!m) return std::unexpected(m.error());
  auto first = parse_one(std::move(*m), options);
  if (!first) return std::unexpected(first.error());
  const std::optional<SplitName> name = parse_split_name(path);
  const bool has_count = (*first)->has(kSplitCount);
  if (!name && !has_count) return std::shared_ptr<const File>(std::move(*first));
  int64_t count = 1;
  if (has_count) {
    auto c = (*first)->get<uint16_t>(kSplitCount);
    if (!c) return core::fail(core::Errc::kFormat, c.error().message);
    count = *c;
  }
  if (!name) {
    // split.count 1 (a one-part set) loads as it is, whatever the name; more
    // parts cannot be found without gguf-split's names.
    if (count <= 1) return SplitAssembler::assemble({std::move(*first)}, /*named=*/false);
    return core::fail(core::Errc::kFormat,
                      path + ": key 'split.count' is " + std::to_string(count) +
                          ", but the file name does not end in -NNNNN-of-" +
                          split_part_name("", count, count).substr(10) +
                          " as gguf-split names the parts, so the other parts cannot be found (rename them as "
                          "gguf-split wrote them)");
  }
  if (!has_count) {
    // "-00001-of-00001.gguf" without split keys is an ordinary file.
    if (name->count == 1) return std::shared_ptr<const File>(std::move(*first));
    return core::fail(core::Errc::kFormat,
                      path + ": the name says " + part_text(static_cast<size_t>(name->no - 1), name->count) +
                          " of a split GGUF, but the file has no 'split.count' key: it is not a gguf-split part "
                          "(a whole model renamed? rename it back to load it alone)");
  }
  if (count != name->count) {
    return core::fail(core::Errc::kFormat, path + ": key 'split.count' is " + std::to_string(count) +
                                               ", but the file name says -of-" +
                                               split_part_name("", 1, name->count).substr(10) + " (" +
                                               std::to_string(name->count) + " parts)");
  }
  const auto n = static_cast<size_t>(name->count);
  const auto given = static_cast<size_t>(name->no - 1);
  std::vector<std::string> paths(n);
  for (size_t i = 0; i < n; ++i) {
    paths[i] = split_part_name(name->prefix, static_cast<int>(i + 1), name->count);
    struct stat st {};
    if (i != given && ::stat(paths[i].c_str(), &st) != 0) {
      return core::fail(core::Errc::kNotFound, paths[i] + ": missing: " + part_text(i, n) + " of the split GGUF that " +
                                                   path + " belongs to (all parts must lie side by side)");
    }
  }
  std::vector<std::shared_ptr<File>> files(n);
  files[given] = std::move(*first);
  for (size_t i = 0; i < n; ++i) {
    if (i == given) continue;
    auto pm = core::MappedFile::open(paths[i]);
    if (!pm) return std::unexpected(pm.error());
    auto f = parse_one(std::move(*pm), options);
    if (!f) return std::unexpected(f.error());
    files[i] = std::move(*f);
  }
  return SplitAssembler::assemble(std::move(files), /*named=*/true);
}

}  // namespace bonsai::gguf
