// metrics.jsonl: one JSON object per line, flushed as written so a crash loses nothing logged.
#pragma once
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace zgpt {

class MetricsWriter {
  public:
    explicit MetricsWriter(const std::string& path);
    ~MetricsWriter();
    MetricsWriter(const MetricsWriter&) = delete;
    MetricsWriter& operator=(const MetricsWriter&) = delete;
    void write(const nlohmann::json& record);

  private:
    std::string path_;
    FILE* f_ = nullptr;
};

}  // namespace zgpt
