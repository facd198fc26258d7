// safetensors (https://github.com/huggingface/safetensors) reading and writing: the one
// implementation, used by the server (checkpoints, twin files), drafthead-quantize and the client
// (hidden-state inputs, logits outputs).
//
// Layout: an 8-byte little-endian header length H, H bytes of JSON (an object: tensor name ->
// {"dtype", "shape", "data_offsets": [begin, end]} plus an optional "__metadata__" object of
// strings), then the data section; offsets are relative to its start (byte 8 + H).
//
// Files are untrusted: every header field is validated against the file size before any tensor
// byte is touched, and every failure is an absl::Status naming the file (and the tensor, where one
// is involved): INVALID_ARGUMENT for a malformed header, DATA_LOSS for a file shorter than its
// header says (truncation), NOT_FOUND for a missing tensor or file. Nothing here throws.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace drafthead::st {

enum class DType {
  kBool, kU8, kI8, kF8E4M3, kF8E5M2, kU16, kI16, kF16, kBF16, kU32, kI32, kF32, kU64, kI64, kF64,
};

// The format's spelling ("BF16", "F8_E4M3", ...), and back; nullopt for an unknown name.
const char* DTypeName(DType d);
std::optional<DType> ParseDType(std::string_view name);
int64_t DTypeSize(DType d);  // bytes per element

// Refuse headers above this (the format's own reference reader uses the same bound).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  int64_t numel = 0;   // product of shape (1 for a scalar), checked for overflow
  uint64_t begin = 0;  // data_offsets, relative to the data section; end - begin == nbytes()
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
};

// A validated header. Every tensor's bytes lie inside the file it was parsed against.
struct Header {
  std::vector<TensorInfo> tensors;  // sorted by name
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length

  const TensorInfo* Find(std::string_view name) const;  // nullptr if absent
};

// Parses and validates the header of a safetensors image: `bytes` holds the first
// min(file_size, 8 + header length) bytes or more of a file of `file_size` bytes; `path` is only
// used in messages. Pure function, safe from any thread; the in-memory entry point for fuzzing.
absl::StatusOr<Header> ParseHeader(const uint8_t* bytes, uint64_t size, uint64_t file_size,
                                   std::string_view path);

// One safetensors file, mapped read-only (MAP_PRIVATE). Immutable after Open, so every const
// method may be called from several threads at once. Tensor data is read straight out of the
// mapping: only the pages a caller asks for are faulted in. (Like any mmap reader, a file truncated
// by someone else while it is open can raise SIGBUS; the loader opens, copies and closes.)
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Over caller-owned bytes that must outlive the object (tests, the fuzzer); `path` names it in
  // messages.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromMemory(const uint8_t* data,
                                                                     uint64_t size,
                                                                     std::string path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const Header& header() const { return header_; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  uint64_t file_size() const { return size_; }

  // NOT_FOUND (naming file and tensor, and listing the first few tensors present) when absent.
  // The pointer lives as long as this object.
  absl::StatusOr<const TensorInfo*> Find(std::string_view tensor) const;

  // The tensor's bytes inside the mapping, valid while this object lives. Bounds were checked at
  // Open; unaligned in general (copy before typed access).
  absl::StatusOr<std::pair<const uint8_t*, uint64_t>> Bytes(std::string_view tensor) const;

  // Copies rows [r0, r0 + n) of `tensor` (rows = shape[0], a row = the product of the other dims)
  // into dst, which holds dst_bytes >= n * row bytes. Touches only those rows' pages. Fails with
  // INVALID_ARGUMENT for a 0-d tensor, a range outside [0, shape[0]], or a short dst.
  absl::Status ReadRows(std::string_view tensor, int64_t r0, int64_t n, void* dst,
                        uint64_t dst_bytes) const;

  // Copies the whole tensor; dst_bytes must equal its size.
  absl::Status ReadAll(std::string_view tensor, void* dst, uint64_t dst_bytes) const;

  // Hints that the pages of rows [r0, r0 + n) are no longer needed (they stay in the page cache,
  // leave this process's resident set). Best effort.
  void ReleaseRows(const TensorInfo& t, int64_t r0, int64_t n) const;

 private:
  SafetensorsFile() = default;
  absl::Status CheckRowRange(const TensorInfo& t, int64_t r0, int64_t n, uint64_t* row_bytes) const;
  void Advise(const TensorInfo& t, int64_t r0, int64_t n, int advice) const;

  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;  // data_ is our mmap (else caller-owned memory)
  Header header_;
};

// A checkpoint: one .safetensors file, or a directory holding either model.safetensors.index.json
// (its "weight_map": tensor -> file name in that directory) or exactly one *.safetensors file.
// Files are opened on first use and stay open. Thread-safe: File() serializes on a mutex; the
// returned files are immutable.
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& path);

  const std::string& path() const { return path_; }

  // The file that holds `tensor`, opened if need be. Errors name the file and the tensor.
  absl::StatusOr<const SafetensorsFile*> File(std::string_view tensor);

  // The tensor's header entry; the pointer lives as long as this Checkpoint.
  absl::StatusOr<const TensorInfo*> Info(std::string_view tensor);

  // SafetensorsFile::ReadRows on the file holding `tensor`.
  absl::Status ReadRows(std::string_view tensor, int64_t r0, int64_t n, void* dst,
                        uint64_t dst_bytes);

 private:
  Checkpoint() = default;

  std::string path_;
  std::string dir_;                                    // "" for a single file
  std::string single_file_;                            // set unless indexed
  std::map<std::string, std::string, std::less<>> weight_map_;  // indexed: tensor -> file name
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;  // by full path
};

// ---- writing ------------------------------------------------------------------------------------

struct TensorSpec {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
};

// Writes a safetensors file by streaming: the header goes out at Create, then every tensor's bytes
// in the order of `tensors`, through Append (any number of calls per tensor, in order). Output goes
// to "<path>.tmp.<pid>" and is renamed over `path` by Finish, so a reader never sees a partial
// file; destroying an unfinished writer removes the temp file. Single-threaded use.
class SafetensorsWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, std::vector<TensorSpec> tensors,
      const std::map<std::string, std::string>& metadata);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends bytes of the current tensor (and may run into the next ones); more bytes than the
  // header promised is an error.
  absl::Status Append(const void* data, uint64_t bytes);
  // Checks every byte was written, flushes, fsyncs and renames into place.
  absl::Status Finish();

 private:
  SafetensorsWriter() = default;
  absl::Status WriteRaw(const void* data, uint64_t bytes);

  std::string path_, tmp_path_;
  int fd_ = -1;
  uint64_t data_total_ = 0, data_written_ = 0;
  bool finished_ = false;
};

struct TensorData {
  TensorSpec spec;
  const void* data = nullptr;  // borrowed; bytes must equal numel * dtype size
  uint64_t bytes = 0;
};

// Writes the tensors in the given order with a SafetensorsWriter, streaming from the pointers.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// The header JSON a writer produces for these tensors (offsets packed in order), padded with
// spaces to a multiple of 8 bytes; exposed for tests.
absl::StatusOr<std::string> SerializeHeader(const std::vector<TensorSpec>& tensors,
                                            const std::map<std::string, std::string>& metadata);

}  // namespace drafthead::st
