#include "train/run_dir.h"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "kernels/core/check.h"
#include "kernels/gemm/cpu_blas.h"

namespace zgpt {

namespace fs = std::filesystem;

namespace {

// Whether dir holds what a run writes (its metrics or checkpoints).
bool holds_a_run(const fs::path& dir) {
    std::error_code ec;
    if (fs::exists(dir / "metrics.jsonl", ec)) return true;
    const fs::path ck = dir / "checkpoints";
    return fs::is_directory(ck, ec) && !fs::is_empty(ck, ec);
}

}  // namespace

std::string make_run_dir(const TrainConfig& t, const std::string& config_path) {
    std::error_code ec;
    fs::create_directories(t.out_dir, ec);
    ZG_CHECK(!ec, "cannot create train.out_dir " + t.out_dir + ": " + ec.message());
    if (t.run_name.empty()) {
        const std::time_t now = std::time(nullptr);
        char stamp[32];
        std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
        const std::string base = fs::path(config_path).stem().string() + "-" + stamp;
        // create_directory is atomic: of two runs started in the same second, one gets -2.
        for (int k = 1; k < 1000; k++) {
            const fs::path dir =
                fs::path(t.out_dir) / (k == 1 ? base : base + "-" + std::to_string(k));
            if (fs::create_directory(dir, ec)) return dir.string();
            ZG_CHECK(!ec, "cannot create run directory " + dir.string() + ": " + ec.message());
        }
        throw Error("cannot find a free run directory name for " + base + " in " + t.out_dir);
    }
    const std::string& name = t.run_name;
    if (const std::string p = run_name_problem(name); !p.empty())
        throw Error("train.run_name " + p);
    const fs::path dir = fs::path(t.out_dir) / name;
    ZG_CHECK(t.resume == "auto" || !holds_a_run(dir),
             "run directory " + dir.string() +
                 " already holds a run (metrics.jsonl or checkpoints); nothing was changed. Pick "
                 "another train.run_name, or continue that run with train.resume=auto (or "
                 "--resume " +
                 dir.string() + ")");
    fs::create_directories(dir, ec);
    ZG_CHECK(!ec, "cannot create run directory " + dir.string() + ": " + ec.message());
    ZG_CHECK(fs::is_directory(dir, ec), "run directory " + dir.string() + " is not a directory");
    return dir.string();
}

void write_file_atomic(const std::string& path, const void* data, size_t n, bool durable) {
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ZG_CHECK(fd >= 0, "cannot write " + tmp + ": " + std::strerror(errno));
    const char* p = static_cast<const char*>(data);
    int err = 0;
    for (size_t done = 0; done < n && !err;) {
        const ssize_t w = ::write(fd, p + done, n - done);
        if (w > 0)
            done += size_t(w);
        else if (!(w < 0 && errno == EINTR))
            err = w < 0 ? errno : EIO;
    }
    if (!err && durable && ::fsync(fd) != 0) err = errno;
    if (::close(fd) != 0 && !err) err = errno;
    if (err) {
        std::error_code ec;
        fs::remove(tmp, ec);
        throw Error("failed writing " + path + " (" + std::strerror(err) +
                    "); the previous file is unchanged");
    }
    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
        const std::string why = ec.message();
        fs::remove(tmp, ec);
        throw Error("cannot replace " + path + ": " + why);
    }
    if (!durable) return;
    const std::string dir = fs::path(path).parent_path().string();
    if (const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY); dfd >= 0) {
        ::fsync(dfd);  // the rename itself survives a crash
        ::close(dfd);
    }
}

static std::string run_command(const std::string& cmd) {
    std::string out;
    if (FILE* p = popen(cmd.c_str(), "r")) {
        std::array<char, 256> buf{};
        while (fgets(buf.data(), buf.size(), p)) out += buf.data();
        pclose(p);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
}

nlohmann::json provenance(const DeviceChoice& device, const std::string& command_line) {
    const std::string src = ZGPT_SOURCE_DIR;
    nlohmann::json j;
    // ZGPT_COMMIT names the commit where the tree has no (current) .git, e.g. a copy sent to a
    // GPU machine.
    const char* commit = std::getenv("ZGPT_COMMIT");
    j["git_commit"] = commit && *commit
                          ? std::string(commit)
                          : run_command("git -C '" + src + "' rev-parse HEAD 2>/dev/null");
    j["git_dirty"] =
        !run_command("git -C '" + src + "' status --porcelain -uno 2>/dev/null").empty();
    j["source_dir"] = src;
    j["command"] = command_line;
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    j["host"] = host;
    j["cpu"] = run_command("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-");
    j["cpu_threads"] = omp_get_max_threads();
    const cpu::BlasInfo blas = cpu::blas_info();
    j["cpu_isa"] = cpu::isa_name(cpu::cpu_vector_isa());
    j["blas"] = {{"library", blas.library},
                 {"kernel", blas.kernel},
                 {"kernel_isa", cpu::isa_name(blas.kernel_isa)},
                 {"chosen_by", blas.chosen_by},
                 {"library_choice", blas.library_choice}};
    j["compiler"] = __VERSION__;
    j["device"] = device.device;
    j["device_reason"] = device.reason;
    j["gpu"] = device.gpu_name;
    j["cuda_driver"] = device.driver;
    j["cuda_runtime"] = device.runtime;
    const std::time_t now = std::time(nullptr);
    char stamp[64];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&now));
    j["started"] = stamp;
    return j;
}

}  // namespace zgpt
