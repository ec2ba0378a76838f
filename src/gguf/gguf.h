// GGUF v2/v3 reader: zero-copy views into one memory mapping.
// Format: ggml's docs/gguf.md (llama.cpp repository) — header (magic "GGUF",
// u32 version, u64 tensor_count, u64 kv_count), key/value metadata, tensor
// infos (name, n_dims, ne[], u32 type, u64 offset), padding to
// `general.alignment` (default 32), then the tensor data section.
//
// Every rule is checked before a byte is read; a violation is a kFormat error
// whose message names the file, the byte offset and the rule. A hostile file
// never crashes or over-reads.
//
// Split models (llama.cpp's gguf-split, tools/gguf-split/gguf-split.cpp and
// src/llama-model-loader.cpp): "PREFIX-00001-of-0000N.gguf" ...
// "PREFIX-0000N-of-0000N.gguf", each a whole GGUF with its own tensor infos
// and data section; part 1 carries the model's metadata, every part the keys
// split.no (u16, 0-based), split.count (u16) and split.tensors.count (i32,
// the set's total). File::open reads such a set as one model: one mapping
// per part, each tensor a view into its own part's mapping (split.cpp).
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
  uint32_t part = 0;      // index into File::parts() of the part holding the data (0 unless split)
  uint32_t type_id = 0;   // raw ggml type id from the file
  core::GgmlType type{};  // same, as enum (known ids only reach here)
  uint32_t n_dims = 0;
  std::array<int64_t, 4> ne{1, 1, 1, 1};
  std::array<uint64_t, 4> nb{0, 0, 0, 0};
  uint64_t offset = 0;            // relative to its part's data section
  uint64_t n_bytes = 0;           // size of the tensor's data
  const uint8_t* data = nullptr;  // = its part's mapping + data_offset + offset
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

// The split-part name "PREFIX-NNNNN-of-MMMMM.gguf" (gguf-split's
// "%s-%05d-of-%05d.gguf", numbers 1-based): `prefix` is everything before
// "-NNNNN" (directories included).
struct SplitName {
  std::string prefix;
  int no = 0;     // 1..count
  int count = 0;  // >= 1
};
// Parses a path or file name; nullopt unless it ends in "-NNNNN-of-MMMMM.gguf"
// (exactly five digits each) with 1 <= NNNNN <= MMMMM.
std::optional<SplitName> parse_split_name(std::string_view path);
// "PREFIX-00002-of-00005.gguf" for (prefix, 2, 5); `no` and `count` 1..99999.
std::string split_part_name(std::string_view prefix, int no, int count);

// One file of a model: the whole model, or one part of a split set.
struct Part {
  std::shared_ptr<const core::MappedFile> mapping;  // the part's bytes (shared, never copied)
  uint32_t version = 0;                             // GGUF version of this part (2 or 3)
  uint64_t alignment = 32;                          // this part's general.alignment (default 32)
  uint64_t data_offset = 0;                         // absolute offset of this part's tensor data
  size_t n_tensors = 0;                             // tensors whose data lie in this part
};

class File {
 public:
  // Maps `path` and parses it. A part of a split set (a name ending in
  // "-NNNNN-of-MMMMM.gguf", or a file with a split.count key) is read with
  // all its parts as one model: the siblings are found by name beside it
  // (any part's path works), each part is mapped and parsed with every rule
  // below, then checked as a set (split.cpp). Errors: kNotFound / kIo from
  // the mapping (a missing part: kNotFound naming its path), kFormat for
  // every broken rule (message: "<path>: offset <N>: <rule>", or for a set
  // "<part path>: key 'split.no' ..." naming the part and key),
  // kUnsupported for a version other than 2 or 3.
  static core::Expected<std::shared_ptr<const File>> open(const std::string& path, const OpenOptions& options = {});
  // Parses an existing mapping (tests, fuzzing) as one file, whatever its
  // split.* keys say. Keeps the mapping alive.
  static core::Expected<std::shared_ptr<const File>> parse(std::shared_ptr<const core::MappedFile> mapping,
                                                           const OpenOptions& options = {});
  // Parses the mappings of a split set, in part order (tests, fuzzing; open()
  // uses the same checks): every part parsed as by parse(), then split.count
  // equal to parts.size() in each part, split.no equal to the part's index,
  // part 1's split.tensors.count equal to the tensors of all parts, no tensor
  // name in two parts, and one Q2_0 layout for all parts. Metadata are part
  // 1's (later parts' other keys are ignored, as llama.cpp does). Errors:
  // those of parse(); kFormat naming the part's path and the key;
  // kInvalidArgument for an empty list or a null mapping.
  static core::Expected<std::shared_ptr<const File>> parse_split(
      std::vector<std::shared_ptr<const core::MappedFile>> parts, const OpenOptions& options = {});

  // Part 1's path, version, alignment, data offset and mapping (the whole file unless split).
  const std::string& path() const { return mapping_->path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute file offset of tensor data
  const std::shared_ptr<const core::MappedFile>& mapping() const { return mapping_; }

  // Every file of the model in part order: one entry unless split.
  const std::vector<Part>& parts() const { return parts_; }
  bool is_split() const { return parts_.size() > 1; }
  // Bytes of all parts' mappings together (the model's on-disk and mapped size).
  uint64_t total_bytes() const;
  // MappedFile::release on the part mapping that holds [p, p + n); 0 when no
  // part holds the whole range. Returns the bytes released.
  size_t release(const void* p, size_t n) const;

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
  // parse() without the const: the split assembler merges parts into the first.
  static core::Expected<std::shared_ptr<File>> parse_one(std::shared_ptr<const core::MappedFile> mapping,
                                                         const OpenOptions& options);
  friend class Parser;
  friend class SplitAssembler;
  std::shared_ptr<const core::MappedFile> mapping_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
  std::optional<core::Q2Layout> q2_layout_;
  std::vector<Part> parts_;                                    // [0] is this file's own mapping
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
  // Any value as read by File (arrays of any type and nesting), e.g. to copy
  // one file's metadata into another.
  void set_value(std::string key, const Value& v);

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

// Writes `src` as a gguf-split set of `n_parts` files
// "PREFIX-00001-of-0000N.gguf" ... (split_part_name), as llama.cpp's
// `llama-gguf-split --split-max-tensors` lays them out: part 1
// holds src's metadata (its split.* keys replaced), every part split.no
// (u16, 0-based), split.count (u16) and split.tensors.count (i32); tensors
// in src order, T*h/N..T*(h+1)/N in part h; part 1 keeps src's alignment,
// later parts the default 32. `no_tensors_in_first` (gguf-split's
// --no-tensor-first-split): part 1 holds metadata only and the tensors go
// to parts 2..N. For tests and tools; tensor bytes are copied from src's
// mapping. Returns the paths written, in order. Errors: kInvalidArgument
// (n_parts < 1 or > 65535, or more parts than tensors allow: a part would
// be empty), kIo from Writer::write naming the path.
core::Expected<std::vector<std::string>> write_split(const File& src, int n_parts, const std::string& prefix,
                                                     bool no_tensors_in_first = false);

}  // namespace bonsai::gguf
