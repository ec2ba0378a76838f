// GGUF v3 writer (ggml docs/gguf.md): header, metadata, tensor infos, padding
// to the alignment, then each tensor's data padded to the alignment.
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "gguf/gguf.h"

namespace bonsai::gguf {
namespace {

// Appends raw bytes (resize + memcpy: vector::insert trips a GCC 12 -Wstringop-overflow false
// positive).
void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  if (n == 0) return;
  const size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  put_bytes(out, &v, sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

template <class T>
std::vector<uint8_t> encode_scalar(ValueType t, T v) {
  std::vector<uint8_t> e;
  put<uint32_t>(e, static_cast<uint32_t>(t));
  put<T>(e, v);
  return e;
}

template <class T>
std::vector<uint8_t> encode_array(ValueType elem, const std::vector<T>& v) {
  std::vector<uint8_t> e;
  put<uint32_t>(e, static_cast<uint32_t>(ValueType::kArray));
  put<uint32_t>(e, static_cast<uint32_t>(elem));
  put<uint64_t>(e, v.size());
  for (const T& x : v) {
    if constexpr (std::is_same_v<T, std::string>) {
      put_string(e, x);
    } else {
      put<T>(e, x);
    }
  }
  return e;
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Appends v's payload (no type id) as `t` encodes it: integers at their
// type's width, f32 narrowed from the double File keeps, arrays as element
// type + count + elements.
void put_payload(std::vector<uint8_t>& out, ValueType t, const Value& v) {
  const uint64_t* u = std::get_if<uint64_t>(&v.v);
  const int64_t* i = std::get_if<int64_t>(&v.v);
  const uint64_t bits = u ? *u : i ? static_cast<uint64_t>(*i) : 0;
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
      put<uint8_t>(out, static_cast<uint8_t>(bits));
      break;
    case ValueType::kUint16:
    case ValueType::kInt16:
      put<uint16_t>(out, static_cast<uint16_t>(bits));
      break;
    case ValueType::kUint32:
    case ValueType::kInt32:
      put<uint32_t>(out, static_cast<uint32_t>(bits));
      break;
    case ValueType::kUint64:
    case ValueType::kInt64:
      put<uint64_t>(out, bits);
      break;
    case ValueType::kFloat32: {
      const double* d = std::get_if<double>(&v.v);
      put<float>(out, d ? static_cast<float>(*d) : 0.0f);
      break;
    }
    case ValueType::kFloat64: {
      const double* d = std::get_if<double>(&v.v);
      put<double>(out, d ? *d : 0.0);
      break;
    }
    case ValueType::kBool: {
      const bool* b = std::get_if<bool>(&v.v);
      put<uint8_t>(out, b && *b ? 1 : 0);
      break;
    }
    case ValueType::kString: {
      const std::string_view* s = std::get_if<std::string_view>(&v.v);
      put_string(out, s ? *s : std::string_view());
      break;
    }
    case ValueType::kArray: {
      const Array* a = std::get_if<Array>(&v.v);
      put<uint32_t>(out, static_cast<uint32_t>(a ? a->elem_type : ValueType::kUint8));
      put<uint64_t>(out, a ? a->items.size() : 0);
      if (a)
        for (const Value& item : a->items) put_payload(out, a->elem_type, item);
      break;
    }
  }
}

}  // namespace

Writer::Writer(uint32_t alignment) : alignment_(alignment == 0 ? 32 : alignment) {
  if (alignment_ != 32) set_u32("general.alignment", alignment_);
}

void Writer::set_encoded(std::string key, std::vector<uint8_t> encoded) {
  for (Kv& kv : kv_) {
    if (kv.key == key) {
      kv.encoded = std::move(encoded);
      return;
    }
  }
  kv_.push_back(Kv{std::move(key), std::move(encoded)});
}

void Writer::set_u8(std::string key, uint8_t v) { set_encoded(std::move(key), encode_scalar(ValueType::kUint8, v)); }
void Writer::set_i8(std::string key, int8_t v) { set_encoded(std::move(key), encode_scalar(ValueType::kInt8, v)); }
void Writer::set_u16(std::string key, uint16_t v) { set_encoded(std::move(key), encode_scalar(ValueType::kUint16, v)); }
void Writer::set_i16(std::string key, int16_t v) { set_encoded(std::move(key), encode_scalar(ValueType::kInt16, v)); }
void Writer::set_u32(std::string key, uint32_t v) { set_encoded(std::move(key), encode_scalar(ValueType::kUint32, v)); }
void Writer::set_i32(std::string key, int32_t v) { set_encoded(std::move(key), encode_scalar(ValueType::kInt32, v)); }
void Writer::set_u64(std::string key, uint64_t v) { set_encoded(std::move(key), encode_scalar(ValueType::kUint64, v)); }
void Writer::set_i64(std::string key, int64_t v) { set_encoded(std::move(key), encode_scalar(ValueType::kInt64, v)); }
void Writer::set_f32(std::string key, float v) { set_encoded(std::move(key), encode_scalar(ValueType::kFloat32, v)); }
void Writer::set_f64(std::string key, double v) { set_encoded(std::move(key), encode_scalar(ValueType::kFloat64, v)); }
void Writer::set_bool(std::string key, bool v) {
  set_encoded(std::move(key), encode_scalar<uint8_t>(ValueType::kBool, v ? 1 : 0));
}
void Writer::set_string(std::string key, std::string v) {
  std::vector<uint8_t> e;
  put<uint32_t>(e, static_cast<uint32_t>(ValueType::kString));
  put_string(e, v);
  set_encoded(std::move(key), std::move(e));
}
void Writer::set_string_array(std::string key, std::vector<std::string> v) {
  set_encoded(std::move(key), encode_array(ValueType::kString, v));
}
void Writer::set_f32_array(std::string key, std::vector<float> v) {
  set_encoded(std::move(key), encode_array(ValueType::kFloat32, v));
}
void Writer::set_i32_array(std::string key, std::vector<int32_t> v) {
  set_encoded(std::move(key), encode_array(ValueType::kInt32, v));
}

void Writer::set_value(std::string key, const Value& v) {
  std::vector<uint8_t> e;
  put<uint32_t>(e, static_cast<uint32_t>(v.type));
  put_payload(e, v.type, v);
  set_encoded(std::move(key), std::move(e));
}

namespace {

// Byte size of a tensor of `type` with dims `ne`, or an error naming the rule broken.
core::Expected<uint64_t> tensor_bytes(const std::string& name, core::GgmlType type, const std::vector<int64_t>& ne) {
  auto traits = core::ggml_type_traits(static_cast<uint32_t>(type));
  if (!traits) return core::fail(core::Errc::kInvalidArgument, "gguf writer: tensor '" + name + "': unknown type");
  if (ne.empty() || ne.size() > kMaxDims) {
    return core::fail(core::Errc::kInvalidArgument, "gguf writer: tensor '" + name + "': needs 1..4 dims");
  }
  uint64_t n = 1;
  for (int64_t d : ne) {
    if (d <= 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      return core::fail(core::Errc::kInvalidArgument, "gguf writer: tensor '" + name + "': bad dims");
    }
  }
  if (ne[0] % traits->block_size != 0) {
    return core::fail(core::Errc::kInvalidArgument, "gguf writer: tensor '" + name + "': ne[0] " +
                                                        std::to_string(ne[0]) + " not a multiple of block size " +
                                                        std::to_string(traits->block_size));
  }
  return n / traits->block_size * traits->type_size;
}

}  // namespace

core::Expected<void> Writer::add_tensor(std::string name, core::GgmlType type, std::vector<int64_t> ne,
                                        std::vector<uint8_t> data) {
  auto nbytes = tensor_bytes(name, type, ne);
  if (!nbytes) return std::unexpected(nbytes.error());
  if (data.size() != *nbytes) {
    return core::fail(core::Errc::kInvalidArgument, "gguf writer: tensor '" + name + "': data has " +
                                                        std::to_string(data.size()) + " bytes, expected " +
                                                        std::to_string(*nbytes));
  }
  for (const Tensor& t : tensors_) {
    if (t.name == name) return core::fail(core::Errc::kInvalidArgument, "gguf writer: duplicate tensor '" + name + "'");
  }
  Tensor t;
  t.name = std::move(name);
  t.type_id = static_cast<uint32_t>(type);
  t.ne = std::move(ne);
  t.n_bytes = *nbytes;
  t.data = std::move(data);
  tensors_.push_back(std::move(t));
  return {};
}

core::Expected<void> Writer::add_tensor_generated(std::string name, core::GgmlType type, std::vector<int64_t> ne,
                                                  Generator gen) {
  auto nbytes = tensor_bytes(name, type, ne);
  if (!nbytes) return std::unexpected(nbytes.error());
  if (!gen) return core::fail(core::Errc::kInvalidArgument, "gguf writer: tensor '" + name + "': no generator");
  for (const Tensor& t : tensors_) {
    if (t.name == name) return core::fail(core::Errc::kInvalidArgument, "gguf writer: duplicate tensor '" + name + "'");
  }
  Tensor t;
  t.name = std::move(name);
  t.type_id = static_cast<uint32_t>(type);
  t.ne = std::move(ne);
  t.n_bytes = *nbytes;
  t.gen = std::move(gen);
  tensors_.push_back(std::move(t));
  return {};
}

void Writer::add_tensor_raw(std::string name, uint32_t type_id, std::vector<int64_t> ne, std::vector<uint8_t> data,
                            std::optional<uint64_t> offset_override) {
  Tensor t;
  t.name = std::move(name);
  t.type_id = type_id;
  t.ne = std::move(ne);
  t.n_bytes = data.size();
  t.data = std::move(data);
  t.offset_override = offset_override;
  tensors_.push_back(std::move(t));
}

std::vector<uint8_t> Writer::header_bytes(std::vector<uint64_t>* offsets) const {
  std::vector<uint8_t> h;
  put<uint32_t>(h, 0x46554747);  // "GGUF"
  put<uint32_t>(h, 3);
  put<uint64_t>(h, tensors_.size());
  put<uint64_t>(h, kv_.size());
  for (const Kv& kv : kv_) {
    put_string(h, kv.key);
    put_bytes(h, kv.encoded.data(), kv.encoded.size());
  }
  uint64_t off = 0;
  for (const Tensor& t : tensors_) {
    put_string(h, t.name);
    put<uint32_t>(h, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<int64_t>(h, d);
    put<uint32_t>(h, t.type_id);
    put<uint64_t>(h, t.offset_override.value_or(off));
    if (offsets) offsets->push_back(off);
    off += align_up(t.n_bytes, alignment_);
  }
  h.resize(align_up(h.size(), alignment_), 0);
  return h;
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> out = header_bytes(nullptr);
  for (const Tensor& t : tensors_) {
    const size_t at = out.size();
    out.resize(at + t.n_bytes, 0);
    if (t.gen) {
      t.gen(std::span<uint8_t>(out.data() + at, t.n_bytes));
    } else if (!t.data.empty()) {
      std::memcpy(out.data() + at, t.data.data(), t.data.size());
    }
    out.resize(align_up(out.size(), alignment_), 0);
  }
  return out;
}

core::Expected<void> Writer::write(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return core::fail(core::Errc::kIo, path + ": cannot create: " + std::strerror(errno));
  // A half-written regular file is removed on error; anything else (-o
  // /dev/full, /dev/stdout, a FIFO) is left alone: as root, remove() would
  // delete the device node or link itself.
  struct stat st {};
  const bool regular = ::fstat(::fileno(f), &st) == 0 && S_ISREG(st.st_mode);
  auto io_error = [&](const char* what) {
    const int e = errno;
    std::fclose(f);
    if (regular) std::remove(path.c_str());
    return core::fail(core::Errc::kIo, path + ": " + what + ": " + std::strerror(e));
  };
  const std::vector<uint8_t> head = header_bytes(nullptr);
  if (std::fwrite(head.data(), 1, head.size(), f) != head.size()) return io_error("write failed");
  std::vector<uint8_t> buf;
  const std::vector<uint8_t> zeros(alignment_, 0);
  for (const Tensor& t : tensors_) {
    std::span<const uint8_t> bytes;
    if (t.gen) {
      buf.assign(t.n_bytes, 0);
      t.gen(std::span<uint8_t>(buf.data(), buf.size()));
      bytes = buf;
    } else {
      bytes = t.data;
    }
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) {
      return io_error("write failed");
    }
    const uint64_t pad = align_up(t.n_bytes, alignment_) - t.n_bytes;
    if (pad > 0 && std::fwrite(zeros.data(), 1, pad, f) != pad) return io_error("write failed");
  }
  buf.clear();
  buf.shrink_to_fit();
  if (std::fclose(f) != 0) {
    const int e = errno;
    if (regular) std::remove(path.c_str());
    return core::fail(core::Errc::kIo, path + ": close failed: " + std::strerror(e));
  }
  return {};
}

core::Expected<std::vector<std::string>> write_split(const File& src, int n_parts, const std::string& prefix,
                                                     bool no_tensors_in_first) {
  const size_t n_tensors = src.tensors().size();
  const size_t holders = static_cast<size_t>(n_parts) - (no_tensors_in_first ? 1 : 0);
  if (n_parts < 1 || n_parts > 65535 || holders > n_tensors || holders == 0) {
    return core::fail(core::Errc::kInvalidArgument, "gguf write_split: " + std::to_string(n_parts) + " parts" +
                                                        (no_tensors_in_first ? " (the first without tensors)" : "") +
                                                        " for " + std::to_string(n_tensors) +
                                                        " tensors: every part but a metadata-only first needs one");
  }
  if (n_tensors > static_cast<size_t>(INT32_MAX)) {
    return core::fail(core::Errc::kInvalidArgument, "gguf write_split: too many tensors for split.tensors.count");
  }
  std::vector<std::string> paths;
  size_t next = 0;
  for (int p = 0; p < n_parts; ++p) {
    Writer w(p == 0 ? static_cast<uint32_t>(src.alignment()) : 32);
    if (p == 0) {
      for (const KeyValue& kv : src.metadata())
        if (!kv.key.starts_with("split.")) w.set_value(std::string(kv.key), kv.value);
    }
    w.set_u16("split.no", static_cast<uint16_t>(p));
    w.set_u16("split.count", static_cast<uint16_t>(n_parts));
    w.set_i32("split.tensors.count", static_cast<int32_t>(n_tensors));
    // Holder h of H takes tensors [T*h/H, T*(h+1)/H): sizes differ by at most one, none is empty.
    const bool holds = !(p == 0 && no_tensors_in_first);
    const size_t h = static_cast<size_t>(p) - (no_tensors_in_first ? 1 : 0);
    const size_t end = holds ? n_tensors * (h + 1) / holders : next;
    for (; next < end; ++next) {
      const TensorInfo& t = src.tensors()[next];
      w.add_tensor_raw(std::string(t.name), t.type_id, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                       std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    }
    paths.push_back(split_part_name(prefix, p + 1, n_parts));
    if (auto ok = w.write(paths.back()); !ok) return std::unexpected(ok.error());
  }
  return paths;
}

}  // namespace bonsai::gguf
