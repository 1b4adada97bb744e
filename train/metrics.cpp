#include "train/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kernels/core/check.h"

namespace zgpt {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    ZG_CHECK(fd_ >= 0, "cannot open " + path + ": " + std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
    if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const nlohmann::json& record) {
    // NaN/inf are not JSON: dump() writes them as null, which readers can see as missing.
    const std::string line = record.dump() + "\n";
    struct stat st {};
    ZG_CHECK(::fstat(fd_, &st) == 0, "cannot stat " + path_ + ": " + std::strerror(errno));
    const off_t before = st.st_size;  // this process is the file's one writer
    int err = 0;
    for (size_t done = 0; done < line.size() && !err;) {
        const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
        if (w > 0)
            done += size_t(w);
        else if (!(w < 0 && errno == EINTR))
            err = w < 0 ? errno : EIO;
    }
    if (err) {
        // a torn line would make the file unreadable as JSON lines: cut it off
        const bool cut = ::ftruncate(fd_, before) == 0;
        throw Error("failed writing " + path_ + " (" + std::strerror(err) + ")" +
                    (cut ? "; its earlier lines are unchanged" : ""));
    }
}

}  // namespace zgpt
