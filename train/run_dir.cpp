#include "train/run_dir.h"

#include <omp.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "kernels/check.h"

namespace zgpt {

namespace fs = std::filesystem;

std::string make_run_dir(const TrainConfig& t, const std::string& config_path) {
    std::string name = t.run_name;
    if (name.empty()) {
        const std::time_t now = std::time(nullptr);
        char stamp[32];
        std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::localtime(&now));
        name = fs::path(config_path).stem().string() + "-" + stamp;
    }
    const fs::path dir = fs::path(t.out_dir) / name;
    std::error_code ec;
    fs::create_directories(dir, ec);
    ZG_CHECK(!ec, "cannot create run directory " + dir.string() + ": " + ec.message());
    return dir.string();
}

void write_text_file(const std::string& path, const std::string& text) {
    const std::string tmp = path + ".tmp";
    {
        std::ofstream f(tmp);
        f << text;
        ZG_CHECK(f.good(), "failed writing " + tmp);
    }
    fs::rename(tmp, path);
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
