#include "data/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kernels/core/check.h"

namespace zgpt {

namespace {

const char* kind_of(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a plain file";
}

}  // namespace

int open_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes,
                      uint64_t* bytes) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    ZG_CHECK(fd >= 0, "cannot open " + what + " " + path + ": " + std::strerror(errno));
    struct stat st {};
    std::string why;
    if (::fstat(fd, &st) != 0)
        why = std::string("cannot stat it: ") + std::strerror(errno);
    else if (!S_ISREG(st.st_mode))
        why = std::string("not a regular file (") + kind_of(st.st_mode) + ")";
    else if (uint64_t(st.st_size) > max_bytes)
        why = std::to_string(uint64_t(st.st_size)) + " bytes, more than any " + what + " (" +
              std::to_string(max_bytes) + ")";
    if (!why.empty()) {
        ::close(fd);
        throw Error(what + " " + path + " refused: " + why);
    }
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (bytes) *bytes = uint64_t(st.st_size);
    return fd;
}

std::string read_regular_file(const std::string& path, const std::string& what,
                              uint64_t max_bytes) {
    uint64_t size = 0;
    const int fd = open_regular_file(path, what, max_bytes, &size);
    std::string out(size_t(size), '\0');
    size_t done = 0;
    int err = 0;
    for (;;) {
        if (done == out.size()) {  // the file may have grown since fstat: read on to its end
            if (out.size() >= max_bytes) break;
            out.resize(std::min<uint64_t>(max_bytes, out.size() + 4096));
        }
        const ssize_t r = ::read(fd, out.data() + done, out.size() - done);
        if (r > 0) {
            done += size_t(r);
        } else if (r == 0) {
            break;
        } else if (errno != EINTR) {
            err = errno;
            break;
        }
    }
    ::close(fd);
    ZG_CHECK(!err, "cannot read " + what + " " + path + ": " + std::strerror(err));
    out.resize(done);
    return out;
}

}  // namespace zgpt
