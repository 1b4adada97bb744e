#include "train/timed_choices.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "data/file_read.h"

namespace zgpt {

std::string timed_choices_path(const TrainConfig& t) {
    return t.out_dir + "/gemm_choices.txt";
}

std::string read_timed_choices(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return "";
    return read_regular_file(path, "GEMM choices file");
}

std::string merge_timed_choices(const std::string& mine, const std::string& other) {
    auto lines = [](const std::string& text) {
        std::vector<std::string> v;
        std::istringstream in(text);
        for (std::string l; std::getline(in, l);)
            if (!l.empty()) v.push_back(l);
        return v;
    };
    const std::vector<std::string> a = lines(mine), b = lines(other);
    if (a.empty()) return other;
    if (b.empty() || a[0] != b[0]) return mine;
    std::map<std::string, std::string> by_shape;  // a line without its last field: mine first
    for (const auto* v : {&a, &b})
        for (size_t i = 1; i < v->size(); i++)
            by_shape.emplace((*v)[i].substr(0, (*v)[i].rfind(' ')), (*v)[i]);
    std::string r = a[0] + "\n";
    for (const auto& [shape, line] : by_shape) r += line + "\n";
    return r;
}

std::string all_ranks_choices(Communicator& comm, const std::string& mine) {
    const auto first_line = [](const std::string& t) { return t.substr(0, t.find('\n')); };
    std::string all = broadcast_text(comm, mine, 0);
    for (int r = 1; r < comm.size(); r++) {
        const std::string theirs = broadcast_text(comm, mine, r);
        if (comm.rank() == 0 && !all.empty() && !theirs.empty() &&
            first_line(all) != first_line(theirs))
            std::printf(
                "warning: rank %d's GEMM choices are for another GPU or cuBLASLt (%s); "
                "its shapes are not kept in the checkpoints\n",
                r, first_line(theirs).c_str());
        all = merge_timed_choices(all, theirs);
    }
    return all;
}

}  // namespace zgpt
