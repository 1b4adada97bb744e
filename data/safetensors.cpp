#include "data/safetensors.h"

#include <algorithm>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "data/file_read.h"
#include "kernels/core/check.h"

namespace zgpt {

namespace {

size_t dtype_bytes(const std::string& d) {
    if (d == "F64" || d == "I64" || d == "U64") return 8;
    if (d == "F32" || d == "I32" || d == "U32") return 4;
    if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
    if (d == "I8" || d == "U8" || d == "BOOL") return 1;
    return 0;
}

double half_to_double(uint16_t h) {
    const int sign = h >> 15, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    double v = exp == 0    ? std::ldexp(mant, -24)
               : exp == 31 ? (mant ? NAN : INFINITY)
                           : std::ldexp(mant + 1024, exp - 25);
    return sign ? -v : v;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const nlohmann::json& metadata) {
    nlohmann::json h = nlohmann::json::object();
    if (!metadata.empty()) {
        nlohmann::json m = nlohmann::json::object();  // safetensors metadata is string -> string
        for (auto it = metadata.begin(); it != metadata.end(); ++it)
            m[it.key()] =
                it.value().is_string() ? it.value().get<std::string>() : it.value().dump();
        h["__metadata__"] = m;
    }
    uint64_t offset = 0;
    for (const TensorToWrite& t : tensors) {
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        h[t.name] = {{"dtype", "F32"},
                     {"shape", t.shape},
                     {"data_offsets", {offset, offset + 4 * uint64_t(n)}}};
        offset += 4 * uint64_t(n);
    }
    std::string header = h.dump();
    header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
    const std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp, std::ios::binary);
        ZG_CHECK(f.good(), "cannot write " + tmp);
        const uint64_t len = header.size();
        f.write(reinterpret_cast<const char*>(&len), 8);
        f.write(header.data(), std::streamsize(header.size()));
        for (const TensorToWrite& t : tensors) {
            int64_t n = 1;
            for (int64_t d : t.shape) n *= d;
            f.write(reinterpret_cast<const char*>(t.data), std::streamsize(4 * n));
        }
        ZG_CHECK(f.good(), "failed writing " + tmp);
    }
    std::filesystem::rename(tmp, path);
}

SafeTensors SafeTensors::load(const std::string& path, uint64_t max_bytes) {
    SafeTensors st;
    st.path_ = path;
    uint64_t bytes = 0;
    const int fd = open_regular_file(path, "safetensors file", max_bytes, &bytes);
    auto read_all = [&](void* p, uint64_t n) {
        uint64_t done = 0;
        while (done < n) {
            const ssize_t r = ::read(fd, static_cast<char*>(p) + done, size_t(n - done));
            if (r > 0)
                done += uint64_t(r);
            else if (!(r < 0 && errno == EINTR))
                break;
        }
        return done == n;
    };
    uint64_t header_len = 0;
    std::string header, why;
    if (!read_all(&header_len, 8)) {
        why = "truncated (no header length)";
    } else if (header_len >= (1ull << 27) || header_len > bytes - 8) {
        why = "implausible header length " + std::to_string(header_len);
    } else {
        header.resize(header_len);
        st.data_.resize(bytes - 8 - header_len);
        if (!read_all(header.data(), header_len) || !read_all(st.data_.data(), st.data_.size()))
            why = "shorter than its size (changed while read?)";
    }
    ::close(fd);
    ZG_CHECK(why.empty(), path + ": " + why);
    nlohmann::json h;
    try {
        h = nlohmann::json::parse(header);
    } catch (const std::exception& e) {
        throw Error(path + ": header is not valid JSON: " + e.what());
    }
    ZG_CHECK(h.is_object(), path + ": header is not a JSON object");
    // A field missing or of the wrong type names the file and the tensor.
    std::string key;
    try {
        for (auto it = h.begin(); it != h.end(); ++it) {
            key = it.key();
            if (key == "__metadata__") {
                st.metadata_ = it.value();
                continue;
            }
            const nlohmann::json& e = it.value();
            ZG_CHECK(e.is_object(), "not an object");
            TensorInfo t;
            t.dtype = e.at("dtype").get<std::string>();
            // integers only: get<> would truncate 96.5 to 96
            auto integers = [&](const char* field) {
                const nlohmann::json& a = e.at(field);
                ZG_CHECK(a.is_array(), std::string(field) + " is not a list");
                for (const nlohmann::json& v : a)
                    ZG_CHECK(v.is_number_integer(),
                             std::string(field) + " holds " + v.dump() + ", not an integer");
                return a;
            };
            t.shape = integers("shape").get<std::vector<int64_t>>();
            const auto off = integers("data_offsets").get<std::vector<uint64_t>>();
            ZG_CHECK(off.size() == 2 && off[0] <= off[1] && off[1] <= st.data_.size(),
                     "lies outside the file (truncated?)");
            t.begin = off[0];
            t.end = off[1];
            const size_t eb = dtype_bytes(t.dtype);
            ZG_CHECK(eb > 0, "has unknown dtype " + t.dtype);
            // the element count, checked against the bytes before it can overflow
            t.numel = 1;
            for (int64_t d : t.shape) {
                ZG_CHECK(d >= 0, "has a negative dimension");
                ZG_CHECK(d == 0 || t.numel <= int64_t(st.data_.size() / eb) / d,
                         "has a shape larger than the file");
                t.numel *= d;
            }
            ZG_CHECK(t.end - t.begin == size_t(t.numel) * eb, "byte size does not match its shape");
            st.tensors_[key] = t;
        }
    } catch (const std::exception& e) {
        throw Error(path + ": tensor " + key + ": " + e.what());
    }
    // Tensors must not share bytes: a file where they do is not what any writer produces.
    std::vector<std::pair<size_t, std::string>> spans;
    for (const auto& [name, t] : st.tensors_)
        if (t.end > t.begin) spans.push_back({t.begin, name});
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); i++)
        ZG_CHECK(st.tensors_[spans[i - 1].second].end <= spans[i].first,
                 path + ": tensors " + spans[i - 1].second + " and " + spans[i].second +
                     " overlap in the file");
    return st;
}

const TensorInfo& SafeTensors::info(const std::string& name) const {
    auto it = tensors_.find(name);
    ZG_CHECK(it != tensors_.end(), path_ + ": no tensor named " + name);
    return it->second;
}

std::vector<std::string> SafeTensors::names() const {
    std::vector<std::string> n;
    for (const auto& [k, v] : tensors_) n.push_back(k);
    return n;
}

std::vector<double> SafeTensors::as_double(const std::string& name) const {
    const TensorInfo& t = info(name);
    const unsigned char* p = data_.data() + t.begin;
    std::vector<double> out(t.numel);
    for (int64_t i = 0; i < t.numel; i++) {
        if (t.dtype == "F64") {
            double v;
            std::memcpy(&v, p + 8 * i, 8);
            out[i] = v;
        } else if (t.dtype == "F32") {
            float v;
            std::memcpy(&v, p + 4 * i, 4);
            out[i] = v;
        } else if (t.dtype == "BF16") {
            uint32_t bits = uint32_t(p[2 * i] | (p[2 * i + 1] << 8)) << 16;
            float v;
            std::memcpy(&v, &bits, 4);
            out[i] = v;
        } else if (t.dtype == "F16") {
            out[i] = half_to_double(uint16_t(p[2 * i] | (p[2 * i + 1] << 8)));
        } else if (t.dtype == "I64") {
            int64_t v;
            std::memcpy(&v, p + 8 * i, 8);
            out[i] = double(v);
        } else if (t.dtype == "I32") {
            int32_t v;
            std::memcpy(&v, p + 4 * i, 4);
            out[i] = v;
        } else {
            throw Error(path_ + ": cannot convert dtype " + t.dtype + " of " + name);
        }
    }
    return out;
}

}  // namespace zgpt
