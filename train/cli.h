// Command-line errors of every tool read like every other refusal: "error: <what CLI11 found>"
// (the option and the value or file it names), then the pointer to --help.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace zgpt {

inline void report_cli_errors(CLI::App& app) {
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
        return "error: " + std::string(e.what()) + "\nRun with --help for more information.\n";
    });
}

// Parses the command line as CLI11_PARSE does, for a parse() that is not main(): the exit code
// main() should return after --help or an error (CLI11 has printed it), nothing when it parsed.
inline std::optional<int> parse_cli(CLI::App& app, int argc, char** argv) {
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e);
    }
    return std::nullopt;
}

}  // namespace zgpt
