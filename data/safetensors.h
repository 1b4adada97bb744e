// A small safetensors reader: 8-byte little-endian header length, a JSON header, raw tensors.
// Used by the oracle tests and by checkpoint import.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zgpt {

struct TensorInfo {
    std::string dtype;  // F64, F32, F16, BF16, I64, I32, ...
    std::vector<int64_t> shape;
    int64_t numel = 0;
    size_t begin = 0, end = 0;  // byte range within the data section
};

// One tensor to write: fp32 data laid out row-major in `shape`.
struct TensorToWrite {
    std::string name;
    std::vector<int64_t> shape;
    const float* data;
};

// Writes a safetensors file (F32 tensors, the header padded to 8 bytes) atomically.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const nlohmann::json& metadata = nlohmann::json::object());

class SafeTensors {
  public:
    // Throws naming the file if it is not a regular file of at most max_bytes, is truncated or
    // its header is malformed.
    static SafeTensors load(const std::string& path, uint64_t max_bytes = kMaxBytes);
    static constexpr uint64_t kMaxBytes = uint64_t(64) << 30;

    bool has(const std::string& name) const { return tensors_.count(name) > 0; }
    const TensorInfo& info(const std::string& name) const;
    std::vector<std::string> names() const;
    const nlohmann::json& metadata() const { return metadata_; }

    // Converts F64/F32/BF16/F16/I64/I32 to double.
    std::vector<double> as_double(const std::string& name) const;

  private:
    std::string path_;
    std::vector<unsigned char> data_;
    std::map<std::string, TensorInfo> tensors_;
    nlohmann::json metadata_;
};

}  // namespace zgpt
