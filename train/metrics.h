// metrics.jsonl: one JSON object per line, written as it comes so a crash loses nothing logged.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace zgpt {

class MetricsWriter {
  public:
    explicit MetricsWriter(const std::string& path);
    ~MetricsWriter();
    MetricsWriter(const MetricsWriter&) = delete;
    MetricsWriter& operator=(const MetricsWriter&) = delete;
    // Appends one line. A line that cannot be written whole (a full disk) is cut off again, so
    // the file keeps whole lines only, and zgpt::Error says why.
    void write(const nlohmann::json& record);

  private:
    std::string path_;
    int fd_ = -1;
};

}  // namespace zgpt
