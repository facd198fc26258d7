// libFuzzer target for the safetensors reader (tests/fuzz.cmake): any byte string is parsed as a
// whole file; an accepted header must let every tensor be read in full and by rows without leaving
// the buffer (ASan checks), and must survive a round trip through the writer's serializer.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/safetensors.h"

namespace st = drafthead::st;

namespace {

void Crash(const char* why) {
  // A broken invariant, not an input error: make libFuzzer record it.
  __builtin_trap();
}

void ReadEverything(const st::SafetensorsFile& f, const uint8_t* data, size_t size) {
  std::vector<uint8_t> buf;
  for (const st::TensorInfo& t : f.header().tensors) {
    auto bytes = f.Bytes(t.name);
    if (!bytes.ok()) Crash("a listed tensor is not found");
    if (bytes->first < data || bytes->first + bytes->second > data + size)
      Crash("tensor bytes outside the input");
    buf.assign(t.nbytes(), 0);
    if (!f.ReadAll(t.name, buf.data(), buf.size()).ok()) Crash("ReadAll failed on a valid tensor");
    if (t.nbytes() > 0 && std::memcmp(buf.data(), bytes->first, t.nbytes()) != 0)
      Crash("ReadAll differs from the mapped bytes");
    if (t.shape.empty()) {
      if (f.ReadRows(t.name, 0, 0, buf.data(), buf.size()).ok()) Crash("rows of a scalar");
      continue;
    }
    const int64_t rows = t.shape[0];
    const int64_t half = rows / 2;
    if (!f.ReadRows(t.name, 0, half, buf.data(), buf.size()).ok() ||
        !f.ReadRows(t.name, half, rows - half, buf.data(), buf.size()).ok())
      Crash("ReadRows failed inside the tensor");
    if (f.ReadRows(t.name, rows, 1, buf.data(), buf.size()).ok()) Crash("read past the last row");
  }
}

void RoundTrip(const st::SafetensorsFile& f) {
  std::vector<st::TensorSpec> specs;
  uint64_t total = 0;
  for (const st::TensorInfo& t : f.header().tensors) {
    specs.push_back({t.name, t.dtype, t.shape});
    total += t.nbytes();
  }
  auto header = st::SerializeHeader(specs, f.metadata());
  if (!header.ok()) return;  // e.g. a name only the lenient reader accepts
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>(header->size() >> (8 * i));
  file += *header;
  file.resize(file.size() + total, '\0');
  auto back = st::ParseHeader(reinterpret_cast<const uint8_t*>(file.data()), file.size(),
                              file.size(), "roundtrip");
  if (!back.ok()) Crash("the writer's header does not parse");
  if (back->tensors.size() != specs.size() || back->metadata != f.metadata())
    Crash("round trip lost entries");
  for (size_t i = 0; i < specs.size(); ++i) {
    const st::TensorInfo& t = back->tensors[i];
    if (t.name != specs[i].name || t.dtype != specs[i].dtype || t.shape != specs[i].shape)
      Crash("round trip changed a tensor");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy so the buffer ends exactly at `size` (ASan catches any read past it).
  std::vector<uint8_t> copy(data, data + size);
  const uint8_t* p = copy.empty() ? nullptr : copy.data();
  auto f = st::SafetensorsFile::FromMemory(p, copy.size(), "fuzz-input");
  if (f.ok()) {
    ReadEverything(**f, p, copy.size());
    RoundTrip(**f);
  } else if (f.status().message().find("fuzz-input") == std::string::npos) {
    Crash("an error that does not name the file");
  }
  // A prefix of a larger file: the parser must not read past what it was given.
  if (size > 8) {
    auto h = st::ParseHeader(p, size / 2 + 4, static_cast<uint64_t>(size) * 2, "prefix");
    (void)h;
  }
  return 0;
}
