#include "train/sweep_file.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <map>

#include "data/file_read.h"
#include "kernels/core/check.h"

namespace zgpt {

std::string sweep_run_name(const std::vector<std::pair<std::string, std::string>>& overrides) {
    std::string n;
    for (const auto& [k, v] : overrides) {
        if (!n.empty()) n += '_';
        n += k.substr(k.find('.') + 1);
        n += '=';
        n += v;
    }
    for (char& c : n)
        if (!(std::isalnum((unsigned char)c) || c == '=' || c == '.' || c == '_' || c == '-' ||
              c == '+'))  // '+' kept: 1.0e+1 and 1.0e-1 are different runs
            c = '-';
    return n.empty() ? "base" : n;
}

std::vector<std::string> SweepFile::sets(const SweepRun& r) const {
    std::vector<std::string> s = fixed;
    for (const auto& [k, v] : r.overrides) s.push_back(k + "=" + v);
    return s;
}

SweepFile load_sweep_file(const std::string& path) {
    YAML::Node root;
    try {
        root = YAML::Load(read_regular_file(path, "sweep file"));
    } catch (const YAML::Exception& e) {
        throw Error(path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg);
    }
    ZG_CHECK(root.IsMap(), path + ": must be a map with base, out_dir, grid and set");
    auto at = [&](const YAML::Node& n) {  // "file:line: " of a node, for messages
        return path + ":" + std::to_string(n.Mark().line + 1) + ": ";
    };
    for (const auto& kv : root) {
        const std::string k = kv.first.as<std::string>();
        ZG_CHECK(k == "base" || k == "out_dir" || k == "grid" || k == "set",
                 at(kv.first) + "unknown key '" + k + "' (known: base, out_dir, grid, set)");
    }
    ZG_CHECK(root["base"] && root["out_dir"], path + ": needs base and out_dir");
    SweepFile f;
    f.base = root["base"].as<std::string>();
    f.out_dir = root["out_dir"].as<std::string>();
    if (root["set"]) {
        ZG_CHECK(root["set"].IsSequence(),
                 at(root["set"]) + "set must be a list of key=value overrides");
        for (const auto& s : root["set"]) f.fixed.push_back(s.as<std::string>());
    }
    ZG_CHECK(!root["grid"] || root["grid"].IsMap(),
             at(root["grid"]) + "grid must be a map of key: [values]");
    // every combination, the last axis varying fastest
    std::vector<std::vector<std::pair<std::string, std::string>>> combos = {{}};
    if (root["grid"])
        for (const auto& kv : root["grid"]) {
            const std::string key = kv.first.as<std::string>();
            ZG_CHECK(kv.second.IsSequence() && kv.second.size() > 0,
                     at(kv.second) + "grid." + key + " must be a non-empty list");
            std::vector<std::vector<std::pair<std::string, std::string>>> next;
            for (const auto& c : combos)
                for (const auto& v : kv.second) {
                    // a list or a map has no scalar: it would become an empty value
                    ZG_CHECK(v.IsScalar(), at(v) + "grid." + key +
                                               ": each value must be a scalar, not a list or map");
                    next.push_back(c);
                    next.back().emplace_back(key, v.Scalar());
                }
            combos.swap(next);
        }
    std::map<std::string, size_t> names;  // two runs with one name would share a run directory
    for (size_t i = 0; i < combos.size(); i++) {
        const std::string name = sweep_run_name(combos[i]);
        const auto [it, fresh] = names.emplace(name, i);
        if (!fresh)
            throw Error(path + ": combinations " + std::to_string(it->second + 1) + " and " +
                        std::to_string(i + 1) + " both make the run name '" + name +
                        "'; make their values differ in letters or digits");
        f.runs.push_back({name, combos[i]});
    }
    return f;
}

}  // namespace zgpt
