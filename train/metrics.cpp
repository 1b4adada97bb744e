#include "train/metrics.h"

#include <cerrno>
#include <cstring>

#include "kernels/check.h"

namespace zgpt {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
    f_ = std::fopen(path.c_str(), "a");
    ZG_CHECK(f_, "cannot open " + path + ": " + std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
    if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& record) {
    // NaN/inf are not JSON: dump() writes them as null, which readers can see as missing.
    const std::string line = record.dump() + "\n";
    ZG_CHECK(std::fwrite(line.data(), 1, line.size(), f_) == line.size() && std::fflush(f_) == 0,
             "failed writing " + path_);
}

}  // namespace zgpt
