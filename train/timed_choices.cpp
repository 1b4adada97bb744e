#include "train/timed_choices.h"

#include <fstream>
#include <map>
#include <sstream>
#include <vector>

namespace zgpt {

std::string timed_choices_path(const TrainConfig& t) {
    return t.out_dir + "/gemm_choices.txt";
}

std::string read_timed_choices(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream s;
    if (f) s << f.rdbuf();
    return s.str();
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

}  // namespace zgpt
