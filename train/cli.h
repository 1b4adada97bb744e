// Command-line errors of every tool read like every other refusal: "error: <what CLI11 found>"
// (the option and the value or file it names), then the pointer to --help.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace zgpt {

inline void report_cli_errors(CLI::App& app) {
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
        return "error: " + std::string(e.what()) + "\nRun with --help for more information.\n";
    });
}

}  // namespace zgpt
