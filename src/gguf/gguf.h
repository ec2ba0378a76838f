// GGUF v2/v3 reader: zero-copy views into one memory mapping.
// Format: ggml's docs/gguf.md (llama.cpp repository) — header (magic "GGUF",
// u32 version, u64 tensor_count, u64 kv_count), key/value metadata, tensor
// infos (name, n_dims, ne[], u32 type, u64 offset), padding to
// `general.alignment` (default 32), then the tensor data section.
//
// Every rule is checked before a byte is read; a violation is a kFormat error
// whose message names the file, the byte offset and the rule. A hostile file
// never crashes or over-reads.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "core/error.h"
#include "core/ggml_types.h"
#include "core/mapped_file.h"

namespace bonsai::gguf {

// GGUF metadata value type ids (gguf.md: GGUF_TYPE_*).
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "u8", "i32", "f32", "bool", "string", "array", ... as used in error messages and `info`.
std::string_view value_type_name(ValueType t);

struct Value;

// A metadata array: element type plus the elements (which may themselves be arrays).
struct Array {
  ValueType elem_type = ValueType::kUint8;
  std::vector<Value> items;
};

// One metadata value. Strings are views into the mapping (valid while the File lives).
struct Value {
  ValueType type = ValueType::kUint8;
  std::variant<uint64_t, int64_t, double, bool, std::string_view, Array> v;
  // Unsigned ints hold uint64_t, signed ints int64_t, f32/f64 double (f32 is
  // exactly representable), bool bool, string string_view, array Array.
};

struct KeyValue {
  std::string_view key;  // view into the mapping
  Value value;
};

// One tensor: a view into the mapping. ne[] in GGUF/ggml order (ne[0] is the
// contiguous row length); unused dims are 1. nb[] are byte strides as ggml
// computes them (nb[0] = block bytes, nb[1] = row bytes, ...).
struct TensorInfo {
  std::string_view name;
  uint32_t type_id = 0;   // raw ggml type id from the file
  core::GgmlType type{};  // same, as enum (known ids only reach here)
  uint32_t n_dims = 0;
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  std::array<uint64_t, 4> nb{0, 0, 0, 0};
  uint64_t offset = 0;            // relative to the data section
  uint64_t n_bytes = 0;           // size of the tensor's data
  const uint8_t* data = nullptr;  // = mapping + data_offset + offset
  int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

struct OpenOptions {
  // Force the layout of type-42 (Q2_0) tensors instead of detecting it
  // (`--q2-layout`, env BONSAI_Q2_LAYOUT is read by the CLI, not here).
  // Honoured where the file is ambiguous; refused (kFormat, naming the
  // layout that fits) where the file clearly contradicts it: g64 whose
  // blocks run past the data, g128 on tensors that end exactly on g64
  // blocks, or a g128 byte order whose sampled blocks break the detector's
  // rule (see File::q2_layout) while the other order's do not.
  std::optional<core::Q2Layout> q2_layout;
};

class File {
 public:
  // Maps `path` and parses it. Errors: kNotFound / kIo from the mapping,
  // kFormat for every broken rule (message: "<path>: offset <N>: <rule>"),
  // kUnsupported for a version other than 2 or 3.
  static core::Expected<std::shared_ptr<const File>> open(const std::string& path, const OpenOptions& options = {});
  // Parses an existing mapping (tests, fuzzing). Keeps the mapping alive.
  static core::Expected<std::shared_ptr<const File>> parse(std::shared_ptr<const core::MappedFile> mapping,
                                                           const OpenOptions& options = {});

  const std::string& path() const { return mapping_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute file offset of tensor data
  const std::shared_ptr<const core::MappedFile>& mapping() const { return mapping_; }

  // Metadata in file order.
  const std::vector<KeyValue>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed accessor. T: uint8_t..uint64_t, int8_t..int64_t, float, double,
  // bool, std::string_view, std::string. Any integer value type converts to
  // an integer T when the value fits. Errors: kNotFound "<path>: missing key
  // 'K'", kFormat "<path>: key 'K' has type i32, expected u32" (or "value V
  // does not fit in u32").
  template <class T>
  core::Expected<T> get(std::string_view key) const;

  // Array accessors, same error rules; every element must convert.
  core::Expected<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  core::Expected<std::vector<float>> get_f32_array(std::string_view key) const;
  core::Expected<std::vector<int32_t>> get_i32_array(std::string_view key) const;

  // Tensors in file order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;

  // The Q2_0 layout in use when the file has any type-42 tensor (detected or
  // forced by OpenOptions::q2_layout); nullopt when there is none. Detection
  // (issue 2; ../shared/tools/make_qwen3_gguf.py writes all three layouts):
  //  1. Geometry: the block size (64 w / 18 B or 128 w / 34 B) under which
  //     every type-42 tensor ends exactly where padding to the next tensor's
  //     offset (or EOF) begins; if both or neither fit tightly, the one under
  //     which all tensors at least fit without overlap; if both still fit,
  //     the file is refused as ambiguous.
  //  2. For 128-weight blocks, byte order from the data (up to 4096 sampled
  //     blocks per tensor): valid ternary codes are 0..2 (never 3) and the
  //     fp16 scale is finite with |d| <= 1e3. The order with no violating
  //     block wins; if both or neither are clean the file is refused.
  // Refusals are kFormat errors that say to pass --q2-layout.
  std::optional<core::Q2Layout> q2_layout() const { return q2_layout_; }

 private:
  File() = default;
  friend class Parser;
  std::shared_ptr<const core::MappedFile> mapping_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
  std::optional<core::Q2Layout> q2_layout_;
  std::unordered_map<std::string_view, size_t> kv_index_;      // key -> index in kv_
  std::unordered_map<std::string_view, size_t> tensor_index_;  // name -> index in tensors_
};

// Limits the reader enforces beyond the spec (hostile-file defences).
inline constexpr uint32_t kMaxDims = 4;     // GGML_MAX_DIMS
inline constexpr int kMaxArrayNesting = 8;  // arrays of arrays of ... deeper is refused
inline constexpr uint64_t kMaxAlignment = 1u << 30;
// Total metadata array elements per file (each becomes a Value of ~48 bytes,
// so this bounds memory at ~800 MB; real files hold < 1M: vocab, merges, types).
inline constexpr uint64_t kMaxMetadataElements = 1u << 24;

// Writes GGUF v3 files (tests, `bonsai synth`). Values are copied in; tensor
// data is copied into the output in add order, each aligned to `alignment`.
class Writer {
 public:
  explicit Writer(uint32_t alignment = 32);

  void set_u8(std::string key, uint8_t v);
  void set_i8(std::string key, int8_t v);
  void set_u16(std::string key, uint16_t v);
  void set_i16(std::string key, int16_t v);
  void set_u32(std::string key, uint32_t v);
  void set_i64(std::string key, int64_t v);
  void set_f64(std::string key, double v);
  void set_i32(std::string key, int32_t v);
  void set_u64(std::string key, uint64_t v);
  void set_f32(std::string key, float v);
  void set_bool(std::string key, bool v);
  void set_string(std::string key, std::string v);
  void set_string_array(std::string key, std::vector<std::string> v);
  void set_f32_array(std::string key, std::vector<float> v);
  void set_i32_array(std::string key, std::vector<int32_t> v);

  // `ne` in ggml order (ne[0] = row length). `data` must be exactly the
  // tensor's byte size for `type` (Q2_0 in the g64 layout).
  core::Expected<void> add_tensor(std::string name, core::GgmlType type, std::vector<int64_t> ne,
                                  std::vector<uint8_t> data);

  // Fills a tensor's bytes at write time (streaming: `out` is the tensor's
  // exact byte size; it lives only for the call). Lets `synth` write an 8B
  // model without holding it in memory.
  using Generator = std::function<void(std::span<uint8_t> out)>;
  // As add_tensor, but the data comes from `gen` when written (called once per
  // write()/to_bytes(), in add order, on the calling thread).
  core::Expected<void> add_tensor_generated(std::string name, core::GgmlType type, std::vector<int64_t> ne,
                                            Generator gen);
  // Tests only: a tensor with any raw type id / dims / bytes and no checks
  // (to build hostile or foreign-layout files). `offset_override`, if set,
  // replaces the computed data offset in the tensor info.
  void add_tensor_raw(std::string name, uint32_t type_id, std::vector<int64_t> ne, std::vector<uint8_t> data,
                      std::optional<uint64_t> offset_override = {});

  size_t n_tensors() const { return tensors_.size(); }
  std::vector<uint8_t> to_bytes() const;
  // Writes the file (header, then each tensor streamed). Errors: kIo naming the path;
  // on a write error a regular output file is removed, a device/FIFO/link target
  // (e.g. /dev/full) never is.
  core::Expected<void> write(const std::string& path) const;

 private:
  // One metadata entry, already encoded (value type id + payload, little endian).
  struct Kv {
    std::string key;
    std::vector<uint8_t> encoded;
  };
  struct Tensor {
    std::string name;
    uint32_t type_id = 0;
    std::vector<int64_t> ne;
    uint64_t n_bytes = 0;
    std::vector<uint8_t> data;  // used when gen is empty
    Generator gen;
    std::optional<uint64_t> offset_override;
  };
  void set_encoded(std::string key, std::vector<uint8_t> encoded);
  std::vector<uint8_t> header_bytes(std::vector<uint64_t>* offsets) const;
  uint32_t alignment_;
  std::vector<Kv> kv_;  // in insertion order; setting an existing key replaces it
  std::vector<Tensor> tensors_;
};

}  // namespace bonsai::gguf
