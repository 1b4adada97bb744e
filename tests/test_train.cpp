// End to end through the real binaries: prepare_data, then train from a YAML config; the run
// directory, metrics fields, falling loss, repeatability per seed, --help, and a config error.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/parameters.h"
#include "tests/helpers.h"
#include "train/checkpoint.h"
#include "train/progress.h"

using nlohmann::json;
namespace fs = std::filesystem;
using namespace zgpt::test;

namespace {

std::vector<json> read_metrics(const fs::path& p) {
    std::vector<json> out;
    std::ifstream f(p);
    for (std::string line; std::getline(f, line);) out.push_back(json::parse(line));
    return out;
}

std::vector<std::string> list_dir_names(const fs::path& d) {
    std::vector<std::string> out;
    if (fs::is_directory(d))
        for (const auto& e : fs::directory_iterator(d)) out.push_back(e.path().filename().string());
    return out;
}

// A small corpus with structure a tiny model can learn quickly.
fs::path make_corpus(const fs::path& dir) {
    fs::create_directories(dir);
    std::ostringstream s;
    const char* lines[] = {"the cat sat on the mat.\n", "a dog ran in the fog.\n",
                           "to be or not to be.\n", "all good things come to an end.\n"};
    for (int i = 0; i < 2000; i++) s << lines[(i * 7 + i / 3) % 4];
    const fs::path p = dir / "corpus.txt";
    std::ofstream(p) << s.str();
    return p;
}

const char* kConfig = R"(model:
  n_layer: 2
  n_head: 2
  n_embd: 32
  block_size: 32
train:
  batch_size: 8
  max_steps: 60
  eval_every: 30
  eval_batches: 4
  log_every: 20
  threads: 2
  sample_every: 30
  sample_tokens: 20
optim:
  lr: 1.0e-2
  min_lr: 1.0e-3
  warmup_steps: 5
loss:
  z_loss_weight: 1.0e-4
)";

}  // namespace

TEST_CASE("prepare_data + train: run directory, metrics, falling loss, repeatable per seed") {
    const fs::path dir = fs::temp_directory_path() / "zgpt_test_train";
    fs::remove_all(dir);
    const fs::path corpus = make_corpus(dir);
    CommandOutput prep =
        run_command(built_binary("ZGPT_PREPARE_BIN") + " --input " + corpus.string() + " --out " +
                    (dir / "shards").string() + " --tokenizer char");
    INFO(prep.text);
    REQUIRE(prep.code == 0);
    for (const char* bad : {"nan", "-0.1", "0.7"}) {  // refused by name, nothing written
        CAPTURE(bad);
        const CommandOutput r =
            run_command(built_binary("ZGPT_PREPARE_BIN") + " --input " + corpus.string() +
                        " --out " + (dir / "bad_shards").string() + " --val-fraction " + bad);
        CHECK(r.code != 0);
        CHECK_MESSAGE(r.text.find("val-fraction") != std::string::npos, r.text);
        CHECK(!fs::exists(dir / "bad_shards/train_000000.bin"));
    }
    CHECK(fs::exists(dir / "shards/train_000000.bin"));
    CHECK(fs::exists(dir / "shards/val_000000.bin"));
    CHECK(fs::exists(dir / "shards/tokenizer.json"));

    std::ofstream(dir / "tiny.yaml")
        << kConfig << "data:\n  train: " << (dir / "shards").string()
        << "/train_*.bin\n  val: " << (dir / "shards").string() << "/val_*.bin\n";
    auto train = [&](const std::string& name) {
        return run_command(built_binary("ZGPT_TRAIN_BIN") + " -c " + (dir / "tiny.yaml").string() +
                           " --set train.out_dir=" + (dir / "runs").string() +
                           " --set train.run_name=" + name);
    };
    CommandOutput a = train("a");
    INFO(a.text);
    REQUIRE(a.code == 0);
    // device auto: the GPU where there is one, otherwise the CPU with a line saying so
    const bool on_gpu = a.text.find("training on CUDA device") != std::string::npos;
    CHECK((on_gpu || a.text.find("training on the CPU") != std::string::npos));
    CHECK(a.text.find("step 60/60 | loss") != std::string::npos);
    CHECK(a.text.find("sample at step 30:") != std::string::npos);
    CHECK(a.text.find("start-up took ") != std::string::npos);
    CHECK(a.text.find("step 60: checkpoint ") != std::string::npos);  // with its size and time
    const fs::path run_a = dir / "runs/a";
    for (const char* f : {"config.yaml", "metrics.jsonl", "provenance.json", "summary.json"})
        CHECK(fs::exists(run_a / f));
    const auto m = read_metrics(run_a / "metrics.jsonl");
    REQUIRE(m.size() == 61);  // step 0 (validation at init) + 60 steps
    CHECK(m[0].contains("val_loss"));
    for (const char* k : {"step", "loss", "ce", "z_loss", "lse_mean", "max_logit", "grad_norm",
                          "lr", "tokens", "tok_per_s", "mfu"})
        CHECK(m[5].contains(k));
    CHECK(m[30].contains("val_loss"));
    CHECK(m[60].contains("val_ce"));
    for (const json& row : m)  // the board's power: GPU steps only (test_gpu_model checks them)
        if (!on_gpu) CHECK(!row.contains("power_w"));
    CHECK(m[60]["tokens"] == 60 * 8 * 32);
    const double z = m[60]["z_loss"], lse = m[60]["lse_mean"];
    CHECK(z > 0.0);
    CHECK(z < 1e-4 * lse * lse * 10);  // logged separately, and sized like z * lse^2
    const double first = m[1]["loss"], last = m[60]["loss"];
    CHECK(last < first - 1.0);  // from ~log(vocab) to well below
    CHECK(double(m[60]["val_loss"]) < double(m[0]["val_loss"]) - 1.0);
    const json prov = json::parse(std::ifstream(run_a / "provenance.json"));
    CHECK(prov.contains("git_commit"));
    CHECK(prov["device"] == (on_gpu ? "cuda" : "cpu"));
    CHECK(prov["kernels"] == m[5]["kernels"]);  // the variants used, in both places

    // tools/sample: the run's newest checkpoint, repeatable for a seed
    auto sample = [&](const std::string& extra) {
        return run_command(built_binary("ZGPT_SAMPLE_BIN") + " --run " + run_a.string() +
                           " --prompt 'the cat' -n 30 " + extra);
    };
    CommandOutput s1 = sample("-s 7 -t 0.8 -k 10"), s2 = sample("-s 7 -t 0.8 -k 10"),
                  g = sample("-k 1");
    INFO(s1.text);
    REQUIRE(s1.code == 0);
    CHECK(s1.text == s2.text);
    CHECK(s1.text.find("ckpt_60.bin (step 60)") != std::string::npos);
    CHECK(g.text.find("the cat") != std::string::npos);

    CommandOutput b = train("b");
    REQUIRE(b.code == 0);
    const auto mb = read_metrics(dir / "runs/b/metrics.jsonl");
    for (size_t i = 1; i < m.size(); i++) CHECK(m[i]["loss"] == mb[i]["loss"]);  // bit-identical
}

TEST_CASE("the progress line's tokens/s is the recent steps' rate, not the run's average") {
    zgpt::RecentRate r(3);
    CHECK(r.tokens_per_s() == 0);
    r.add(10.0, 1000);  // a slow first step (the GEMM search, a warm-up)
    CHECK(r.tokens_per_s() == doctest::Approx(100));
    r.add(1.0, 1000);
    r.add(1.0, 1000);
    CHECK(r.tokens_per_s() == doctest::Approx(3000.0 / 12.0));
    r.add(1.0, 1000);  // the first step leaves the window
    CHECK(r.tokens_per_s() == doctest::Approx(1000));
    r.add(2.0, 1000);
    CHECK(r.tokens_per_s() == doctest::Approx(3000.0 / 4.0));
    zgpt::RecentRate one(0);  // a window below 1 is 1
    one.add(2.0, 500);
    one.add(1.0, 500);
    CHECK(one.tokens_per_s() == doctest::Approx(500));
}

TEST_CASE("train --help lists options and config keys; a bad config fails with a clear message") {
    CommandOutput h = run_command(built_binary("ZGPT_TRAIN_BIN") + " --help");
    CHECK(h.code == 0);
    for (const char* s :
         {"--config", "--set", "z_loss_weight", "label_smoothing", "qk_norm", "grad_clip"})
        CHECK(h.text.find(s) != std::string::npos);
    const fs::path dir = fs::temp_directory_path() / "zgpt_test_train_bad";
    fs::create_directories(dir);
    std::ofstream(dir / "bad.yaml") << "data:\n  train: x.bin\noptim:\n  lr: fast\n";
    CommandOutput e =
        run_command(built_binary("ZGPT_TRAIN_BIN") + " -c " + (dir / "bad.yaml").string());
    CHECK(e.code == 1);
    CHECK(e.text.find("bad.yaml:4: optim.lr: expected a number, got 'fast'") != std::string::npos);
}

// ---------------------------------------------------------------- checkpoints, resume, kills

namespace {

// Starts `cmd` (stdout and stderr to log) and returns its pid; the shell execs the command, so
// the pid is the trainer's own.
pid_t spawn(const std::string& cmd, const fs::path& log) {
    const pid_t pid = fork();
    if (pid == 0) {
        const std::string full = "exec " + cmd + " > '" + log.string() + "' 2>&1";
        execl("/bin/sh", "sh", "-c", full.c_str(), (char*)nullptr);
        _exit(127);
    }
    return pid;
}

size_t count_lines(const fs::path& p) {
    std::ifstream f(p);
    size_t n = 0;
    for (std::string l; std::getline(f, l);) n++;
    return n;
}

std::map<int64_t, double> losses(const fs::path& metrics) {
    std::map<int64_t, double> m;
    for (const json& r : read_metrics(metrics))
        if (r.contains("loss")) m[r["step"]] = r["loss"];
    return m;
}

struct ResumeFixture {
    fs::path dir = fs::temp_directory_path() / "zgpt_test_resume";
    std::string train = built_binary("ZGPT_TRAIN_BIN");
    ResumeFixture() {
        fs::remove_all(dir);
        const fs::path corpus = make_corpus(dir);
        REQUIRE(run_command(built_binary("ZGPT_PREPARE_BIN") + " --input " + corpus.string() +
                            " --out " + (dir / "shards").string())
                    .code == 0);
        // decay_steps fixed, so the schedule does not depend on max_steps (stop at 10, go to 20)
        std::ofstream(dir / "c.yaml")
            << "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 32}\n"
            << "data: {train: " << (dir / "shards/train_*.bin").string()
            << ", val: " << (dir / "shards/val_*.bin").string() << "}\n"
            << "train: {batch_size: 4, max_steps: 40, eval_every: 10, eval_batches: 2, "
               "checkpoint_every: 5, threads: 1, out_dir: "
            << (dir / "runs").string() << "}\n"
            << "optim: {lr: 1.0e-2, warmup_steps: 2, decay_steps: 40}\n"
            << "loss: {z_loss_weight: 1.0e-4}\n";
    }
    std::string start(const std::string& name, const std::string& extra = "") const {
        return train + " -c " + (dir / "c.yaml").string() + " --set train.run_name=" + name + " " +
               extra;
    }
    std::string resume(const std::string& name, const std::string& extra = "") const {
        return train + " --resume " + (dir / "runs" / name).string() + " " + extra;
    }
    fs::path run_dir(const std::string& name) const { return dir / "runs" / name; }
    // PREFIX + "straight" trains 20 steps; PREFIX + "split" 10, then resumes to 20: their 20
    // losses equal bit for bit. Returns the resume's output.
    std::string exact_resume(const std::string& prefix, const std::string& extra = "") const {
        REQUIRE(run_command(start(prefix + "straight", extra + " --set train.max_steps=20")).code ==
                0);
        REQUIRE(run_command(start(prefix + "split", extra + " --set train.max_steps=10")).code ==
                0);
        CommandOutput r = run_command(resume(prefix + "split", "--set train.max_steps=20"));
        INFO(r.text);
        REQUIRE(r.code == 0);
        CHECK(r.text.find("resumed from") != std::string::npos);
        const auto a = losses(run_dir(prefix + "straight") / "metrics.jsonl"),
                   b = losses(run_dir(prefix + "split") / "metrics.jsonl");
        REQUIRE(b.size() == 20);
        for (int64_t s = 1; s <= 20; s++) CHECK(a.at(s) == b.at(s));
        return r.text;
    }
};

}  // namespace

TEST_CASE("exact resume: 10 steps, stop, resume to 20 gives bit-identical losses for 11-20") {
    ResumeFixture().exact_resume("");
}

TEST_CASE(
    "exact resume and sampling with the Llama-style options (on the GPU where there is one)") {
    ResumeFixture f;
    const std::string out =
        f.exact_resume("llama_",
                       "--set model.norm=rmsnorm --set model.position=rope --set model.mlp=swiglu "
                       "--set model.n_kv_head=1 --set model.bias=false --set train.sample_every=10 "
                       "--set train.sample_tokens=8");
    INFO(out);
    CHECK(out.find("sample at step 20:") != std::string::npos);
}

// A run of `steps` steps on 2 local ranks ("plain"), and the same run ("recorded") with
// train.<key> = step: the recorded run's output and the report it wrote (`file` in its run
// directory, with the step and two ranks). Checks that both ran, that the recorded log has
// `log_line` where the plain one has no `word`, and that recording changed no loss.
struct StepReport {
    CommandOutput recorded;
    json report;
};
StepReport step_report(const ResumeFixture& f, int steps, const std::string& key, int step,
                       const std::string& file, const std::string& word,
                       const std::string& log_line) {
    const std::string two =
        "--set train.max_steps=" + std::to_string(steps) + " --set parallel.local_ranks=2";
    const CommandOutput plain = run_command(f.start("plain", two));
    REQUIRE(plain.code == 0);
    StepReport s;
    s.recorded =
        run_command(f.start("recorded", two + " --set train." + key + "=" + std::to_string(step)));
    INFO(s.recorded.text);
    REQUIRE(s.recorded.code == 0);
    CHECK(s.recorded.text.find(log_line) != std::string::npos);
    CHECK(plain.text.find(word) == std::string::npos);
    const fs::path path = f.run_dir("recorded") / file;
    REQUIRE(fs::exists(path));
    s.report = json::parse(std::ifstream(path));
    CHECK(s.report["step"] == step);
    REQUIRE(s.report["ranks"].size() == 2);
    // recording a step changes no result: the same losses as the run that did not
    const auto a = losses(f.run_dir("plain") / "metrics.jsonl"),
               b = losses(f.run_dir("recorded") / "metrics.jsonl");
    REQUIRE(a.size() == size_t(steps));
    CHECK(a == b);
    return s;
}

TEST_CASE(
    "train.timeline_step: every rank's GPU timeline, or why there is none, in the run "
    "directory and the log") {
    ResumeFixture f;
    const StepReport s = step_report(f, 3, "timeline_step", 2, "timeline_step_2.json",
                                     "GPU timeline", "GPU timeline of step 2 on each rank");
    const json& t = s.report;
    const CommandOutput& r = s.recorded;
    INFO(r.text);
    CHECK(t["ranks"][0]["rank"] == 0);
    CHECK(t["ranks"][1]["rank"] == 1);
    const bool on_gpu = r.text.find("training on CUDA device") != std::string::npos;
    // rank 1 is a thread of rank 0's process: on a GPU rank 0 records for both
    REQUIRE(t["ranks"][1].contains("unavailable"));
    const std::string why1 = t["ranks"][1]["unavailable"];
    CHECK(why1.find(on_gpu ? "rank 0's process" : "CPU") != std::string::npos);
    const json& r0 = t["ranks"][0];
    if (r0.contains("unavailable")) {  // the CPU, or a GPU machine without CUPTI: said why
        CHECK(!std::string(r0["unavailable"]).empty());
        if (on_gpu) MESSAGE("no GPU timeline here: " << std::string(r0["unavailable"]));
    } else {
        CHECK(on_gpu);
        CHECK(int64_t(r0["kernels"]) > 10);
        CHECK(double(r0["busy_ms"]) > 0);
        CHECK(double(r0["busy_ms"]) <= double(r0["span_ms"]) + 1e-9);
        CHECK(double(r0["idle_ms"]) >= 0);
        CHECK(r0["top_kernels"].size() > 0);
    }
}

TEST_CASE("train.profile_step: each rank's op times in the run directory and the log") {
    ResumeFixture f;
    const StepReport s = step_report(f, 4, "profile_step", 3, "op_profile_step_3.json",
                                     "per-op time", "per-op time of step 3 on each rank");
    CHECK(list_dir_names(f.run_dir("plain")).size() + 1 ==
          list_dir_names(f.run_dir("recorded")).size());
    const json& p = s.report;
    CHECK(double(p["step_ms"]) > 0);
    for (int k = 0; k < 2; k++) {
        const json& rank = p["ranks"][k];
        CHECK(rank["rank"] == k);
        REQUIRE(rank["ops"].size() > 3);
        double total = 0;
        bool has_all_reduce = false;
        for (const json& op : rank["ops"]) {
            CHECK(double(op["ms"]) >= 0);
            total += double(op["ms"]);
            has_all_reduce |= op["op"] == "gradient all-reduce (host)";
        }
        CHECK(has_all_reduce);
        CHECK(total == doctest::Approx(double(rank["ops_ms"])));
        CHECK(total > 0);
    }
}

TEST_CASE("GEMM algorithms chosen by timing (GPU): the next run and a resume run the same ones") {
    // kernels.matmul_search times cuBLASLt's candidates in each process, so two processes could
    // choose differently; the runs folder's gemm_choices.txt and the checkpoints keep the choices
    ResumeFixture f;
    const std::string search = "--set kernels.matmul_search=8 --set train.max_steps=10";
    const std::string solo = "--set train.out_dir=" + (f.dir / "solo").string();
    CommandOutput r0 = run_command(f.start("solo1", search + " " + solo));
    INFO(r0.text);
    REQUIRE(r0.code == 0);
    if (r0.text.find("training on CUDA device") == std::string::npos) {
        MESSAGE("skipped: no CUDA device (the CPU backend chooses nothing by timing)");
        return;
    }
    // a second run from step 0 runs the first's algorithms (the runs folder's file), bit for bit
    CHECK(fs::exists(f.dir / "solo" / "gemm_choices.txt"));
    CommandOutput r1 = run_command(f.start("solo2", search + " " + solo));
    INFO(r1.text);
    REQUIRE(r1.code == 0);
    CHECK(r1.text.find("GEMM algorithms as earlier runs chose them") != std::string::npos);
    const auto l0 = losses(f.dir / "solo" / "solo1" / "metrics.jsonl"),
               l1 = losses(f.dir / "solo" / "solo2" / "metrics.jsonl");
    REQUIRE(l0.size() == 10);
    CHECK(l0 == l1);
    // 2 local ranks (rank 0's choices handed to rank 1 after the first step), stopped at step 10:
    // the checkpoint holds the choices, and two resumes of it give the same losses
    CommandOutput r2 = run_command(f.start("first", search + " --set parallel.local_ranks=2"));
    INFO(r2.text);
    REQUIRE(r2.code == 0);
    CHECK(!zgpt::load_run_checkpoint(f.run_dir("first").string(), "").state.timed_choices.empty());
    fs::copy(f.run_dir("first"), f.run_dir("second"), fs::copy_options::recursive);
    for (const char* name : {"first", "second"}) {
        CommandOutput r = run_command(f.resume(name, "--set train.max_steps=20"));
        INFO(r.text);
        REQUIRE(r.code == 0);
    }
    const auto a = losses(f.run_dir("first") / "metrics.jsonl"),
               b = losses(f.run_dir("second") / "metrics.jsonl");
    REQUIRE(a.size() == 20);
    REQUIRE(b.size() == 20);
    for (int64_t s = 11; s <= 20; s++) CHECK(a.at(s) == b.at(s));
}

TEST_CASE(
    "GEMM algorithms chosen by timing (GPU): a vocab-parallel checkpoint keeps every rank's") {
    // Two vocabulary shards of different sizes run GEMM shapes of their own; rank 0's choices
    // alone would leave rank 1's shapes to be timed again on resume (and maybe chosen otherwise)
    ResumeFixture f;
    const std::string args =
        "--set kernels.matmul_search=8 --set train.max_steps=5 --set parallel.local_ranks=2 "
        "--set parallel.vocab_parallel=2 --set model.vocab_size=81";
    CommandOutput r = run_command(f.start("vp", args));
    INFO(r.text);
    REQUIRE(r.code == 0);
    if (r.text.find("training on CUDA device") == std::string::npos) {
        MESSAGE("skipped: no CUDA device (the CPU backend chooses nothing by timing)");
        return;
    }
    // The shards' head GEMMs run over their rows (41 and 40: the first V % 2 ranks one more)
    // rounded up to 8 (model/gpt_cuda_impl.h, shard_gemm_rows): 48 and 40, widths no other GEMM
    // of this model has (C = 32, B x T = 128). The tokenizer's 19 symbols fit in V = 81.
    const int64_t rows0 = 48, rows1 = 40;
    const std::string choices =
        zgpt::load_run_checkpoint(f.run_dir("vp").string(), "").state.timed_choices;
    INFO(choices);
    REQUIRE(!choices.empty());
    auto has_dim = [&](int64_t d) {  // a line with M, N or K equal to d
        std::istringstream in(choices);
        std::string line;
        std::getline(in, line);  // the cuBLASLt version and GPU
        while (std::getline(in, line)) {
            std::istringstream l(line);
            int64_t M = 0, N = 0, K = 0;
            l >> M >> N >> K;
            if (M == d || N == d || K == d) return true;
        }
        return false;
    };
    CHECK(has_dim(rows0));
    CHECK(has_dim(rows1));
}

TEST_CASE("a non-finite loss stops the run: diverged in the summary, exit 0, no NaN checkpoint") {
    ResumeFixture f;
    REQUIRE(run_command(f.start("nan", "--set train.max_steps=5")).code == 0);
    // resume, with the weights turned to NaN at step 6 (the trainer's test hook)
    CommandOutput r = run_command("ZGPT_TEST_POISON_WEIGHTS_AT_STEP=6 " +
                                  f.resume("nan", "--set train.max_steps=20"));
    INFO(r.text);
    CHECK(r.code == 0);
    CHECK(r.text.find("not finite; stopping (diverged)") != std::string::npos);
    const json summary = json::parse(std::ifstream(f.run_dir("nan") / "summary.json"));
    CHECK(summary["diverged"] == true);
    CHECK(summary["stopped_early"] == false);
    CHECK(summary["steps"] == 6);
    const auto m = read_metrics(f.run_dir("nan") / "metrics.jsonl");
    CHECK(m.back()["step"] == 6);
    CHECK(m.back()["loss"].is_null());  // JSON has no NaN: written as null
    // no checkpoint was written from the NaN weights
    CHECK(zgpt::list_checkpoints((f.run_dir("nan") / "checkpoints").string())
              .front()
              .find("ckpt_5.bin") != std::string::npos);
}

TEST_CASE(
    "SIGKILL during a step, then during a checkpoint write: resume loses at most checkpoint_every "
    "steps") {
    ResumeFixture f;
    REQUIRE(run_command(f.start("straight")).code == 0);
    const auto want = losses(f.run_dir("straight") / "metrics.jsonl");
    // killed mid-run
    const pid_t pid = spawn(f.start("killed"), f.dir / "killed.log");
    const fs::path metrics = f.run_dir("killed") / "metrics.jsonl";
    for (int i = 0; i < 20000 && count_lines(metrics) < 13; i++) usleep(1000);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status));
    CommandOutput r = run_command(f.resume("killed"));
    INFO(r.text);
    REQUIRE(r.code == 0);
    const auto pos = r.text.find("at step ");
    REQUIRE(pos != std::string::npos);
    const int64_t resumed = std::stoll(r.text.substr(pos + 8));
    CHECK(resumed >= 5);  // at most checkpoint_every (5) steps were lost
    const auto got = losses(metrics);
    REQUIRE(got.size() == 40);
    for (int64_t s = 1; s <= 40; s++) CHECK(got.at(s) == want.at(s));

    // killed half-way through writing the step-10 checkpoint: the half file is never loaded
    CommandOutput k = run_command("ZGPT_TEST_KILL_IN_CHECKPOINT_AT_STEP=10 " + f.start("torn"));
    CHECK(k.code != 0);
    CHECK(fs::exists(f.run_dir("torn") / "checkpoints/ckpt_10.bin.tmp"));
    CHECK_FALSE(fs::exists(f.run_dir("torn") / "checkpoints/ckpt_10.bin"));
    CommandOutput r2 = run_command(f.resume("torn"));
    INFO(r2.text);
    REQUIRE(r2.code == 0);
    CHECK(r2.text.find("ckpt_5.bin at step 5") != std::string::npos);
    const auto got2 = losses(f.run_dir("torn") / "metrics.jsonl");
    for (int64_t s = 1; s <= 40; s++) CHECK(got2.at(s) == want.at(s));
}

TEST_CASE(
    "a corrupt newest checkpoint is refused with a reason and resume falls back; SIGTERM "
    "checkpoints") {
    ResumeFixture f;
    REQUIRE(run_command(f.start("a", "--set train.max_steps=15")).code == 0);
    const fs::path newest = f.run_dir("a") / "checkpoints/ckpt_15.bin";
    REQUIRE(fs::exists(newest));
    {
        std::fstream c(newest, std::ios::in | std::ios::out | std::ios::binary);
        c.seekp(300);
        c.put(0x7f);
    }
    CommandOutput r = run_command(f.resume("a", "--set train.max_steps=20"));
    INFO(r.text);
    REQUIRE(r.code == 0);
    CHECK(r.text.find("warning: checkpoint") != std::string::npos);
    CHECK(r.text.find("checksum mismatch") != std::string::npos);
    CHECK(r.text.find("ckpt_10.bin at step 10") != std::string::npos);

    // SIGTERM: the trainer finishes its step, writes a final checkpoint and exits cleanly
    const pid_t pid =
        spawn(f.start("term", "--set train.checkpoint_every=0 --set train.max_steps=100000"),
              f.dir / "term.log");
    const fs::path metrics = f.run_dir("term") / "metrics.jsonl";
    for (int i = 0; i < 20000 && count_lines(metrics) < 8; i++) usleep(1000);
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    const auto ckpts = list_dir_names(f.run_dir("term") / "checkpoints");
    CHECK(ckpts.size() == 1);
}

// ---------------------------------------------------------------------------------------------
// A run directory is never mixed with another run's, and a resume never destroys what it refuses.

namespace {

// Every file under dir with its bytes: to show that a refused command changed nothing.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
    std::map<std::string, std::string> m;
    for (const auto& e : fs::recursive_directory_iterator(dir))
        if (e.is_regular_file()) {
            std::ifstream f(e.path(), std::ios::binary);
            m[e.path().string()] = std::string(std::istreambuf_iterator<char>(f), {});
        }
    return m;
}

}  // namespace

TEST_CASE("a named run directory that holds a run is refused unless resuming; names stay inside") {
    ResumeFixture f;
    REQUIRE(run_command(f.start("taken", "--set train.max_steps=5")).code == 0);
    const auto before = snapshot(f.run_dir("taken"));
    CommandOutput again = run_command(f.start("taken", "--set train.max_steps=5"));
    INFO(again.text);
    CHECK(again.code != 0);
    CHECK(again.text.find("already holds a run") != std::string::npos);
    CHECK(again.text.find("train.resume=auto") != std::string::npos);
    CHECK(snapshot(f.run_dir("taken")) == before);
    // resume=auto continues it instead
    CommandOutput cont =
        run_command(f.start("taken", "--set train.max_steps=8 --set train.resume=auto"));
    INFO(cont.text);
    CHECK(cont.code == 0);
    CHECK(losses(f.run_dir("taken") / "metrics.jsonl").size() == 8);
    for (const char* bad : {"..", ".", "a/b", "../escape"}) {
        CAPTURE(bad);
        CommandOutput r = run_command(f.start(std::string("'") + bad + "'"));
        CHECK(r.code != 0);
        CHECK(r.text.find("one plain folder name") != std::string::npos);
    }
    CHECK_FALSE(fs::exists(f.dir / "escape"));
}

TEST_CASE("two unnamed runs started in the same second get two run directories") {
    ResumeFixture f;
    const std::string cmd = f.train + " -c " + (f.dir / "c.yaml").string() +
                            " --set train.max_steps=2 --set train.eval_every=0";
    const pid_t a = spawn(cmd, f.dir / "a.log"), b = spawn(cmd, f.dir / "b.log");
    int sa = 0, sb = 0;
    waitpid(a, &sa, 0);
    waitpid(b, &sb, 0);
    CHECK(WIFEXITED(sa));
    CHECK(WEXITSTATUS(sa) == 0);
    CHECK(WIFEXITED(sb));
    CHECK(WEXITSTATUS(sb) == 0);
    const auto names = list_dir_names(f.dir / "runs");
    REQUIRE(names.size() == 2);
    for (const std::string& n : names)
        CHECK(losses(f.dir / "runs" / n / "metrics.jsonl").size() == 2);  // nobody's lines mixed
}

TEST_CASE("resume refusing every checkpoint (another model shape) stops and changes nothing") {
    ResumeFixture f;
    REQUIRE(run_command(f.start("shape", "--set train.max_steps=5")).code == 0);
    const auto before = snapshot(f.run_dir("shape"));
    CommandOutput r = run_command(
        f.start("shape", "--set train.resume=auto --set model.n_embd=64 --set train.max_steps=10"));
    INFO(r.text);
    CHECK(r.code != 0);
    CHECK(r.text.find("every checkpoint") != std::string::npos);
    CHECK(r.text.find("nothing was changed") != std::string::npos);
    const auto after = snapshot(f.run_dir("shape"));
    for (const auto& [path, bytes] : before) {
        CAPTURE(path);
        if (path.find("provenance") != std::string::npos) continue;
        CHECK(after.at(path) == bytes);
    }
}

TEST_CASE("a run stopped before its first checkpoint starts again without duplicate metrics") {
    ResumeFixture f;
    REQUIRE(run_command(f.start("early", "--set train.max_steps=3")).code == 0);
    fs::remove_all(f.run_dir("early") / "checkpoints");  // as if killed before the first one
    CommandOutput r =
        run_command(f.start("early", "--set train.resume=auto --set train.max_steps=3"));
    INFO(r.text);
    REQUIRE(r.code == 0);
    const auto m = read_metrics(f.run_dir("early") / "metrics.jsonl");
    std::map<int64_t, int> seen;
    for (const json& j : m) seen[j["step"].get<int64_t>()]++;
    for (const auto& [step, n] : seen) {
        CAPTURE(step);
        CHECK(n == 1);
    }
    CHECK(seen.size() == 4);  // step 0 (evaluation) and 1..3
}

TEST_CASE("train.checkpoint_at_end: false writes no checkpoint after the last step") {
    ResumeFixture f;
    CommandOutput r = run_command(
        f.start("no_end", "--set train.max_steps=3 --set train.checkpoint_at_end=false"));
    INFO(r.text);
    REQUIRE(r.code == 0);
    CHECK(r.text.find("checkpoint ") == std::string::npos);
    CHECK(!fs::exists(f.run_dir("no_end") / "checkpoints/ckpt_3.bin"));
    CommandOutput d = run_command(f.start("end", "--set train.max_steps=3"));  // the default
    REQUIRE(d.code == 0);
    CHECK(fs::exists(f.run_dir("end") / "checkpoints/ckpt_3.bin"));
}

#include "kernels/core/check.h"
#include "train/run_dir.h"

TEST_CASE("a write that fails (a full disk: /dev/full) leaves the previous file and no .tmp") {
    const fs::path dir = fs::temp_directory_path() / "zgpt_test_full_disk";
    fs::remove_all(dir);
    fs::create_directories(dir);
    const fs::path file = dir / "metrics.jsonl";
    zgpt::write_text_file(file.string(), "old\n");
    REQUIRE(fs::exists("/dev/full"));
    fs::create_symlink("/dev/full", dir / "metrics.jsonl.tmp");  // the write lands on a full disk
    CHECK_THROWS_WITH_AS(zgpt::write_text_file(file.string(), std::string(1 << 16, 'x')),
                         doctest::Contains("the previous file is unchanged"), zgpt::Error);
    std::ifstream f(file);
    CHECK(std::string(std::istreambuf_iterator<char>(f), {}) == "old\n");
    CHECK_FALSE(fs::exists(fs::symlink_status(dir / "metrics.jsonl.tmp")));
}

#include <sys/resource.h>

#include "train/metrics.h"

TEST_CASE("metrics.jsonl keeps whole lines when the disk fills up in the middle of one") {
    const fs::path file = fs::temp_directory_path() / "zgpt_test_metrics_full.jsonl";
    fs::remove(file);
    // A child process with a file size limit: a write past it stops part-way (EFBIG), as on a
    // disk that fills up in the middle of a line.
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        const rlimit lim{1000, 1000};
        setrlimit(RLIMIT_FSIZE, &lim);
        zgpt::MetricsWriter w(file.string());
        int code = 1;  // the writer never said it failed
        try {
            for (int step = 0; step < 100; step++)
                w.write({{"step", step}, {"loss", 1.5}, {"pad", std::string(90, 'x')}});
        } catch (const zgpt::Error& e) {
            code = std::string(e.what()).find("failed writing") != std::string::npos ? 0 : 2;
        }
        _exit(code);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    std::ifstream f(file);
    const std::string text(std::istreambuf_iterator<char>(f), {});
    REQUIRE(!text.empty());
    CHECK(text.back() == '\n');
    std::istringstream lines(text);
    int n = 0;
    for (std::string line; std::getline(lines, line); n++) {
        CAPTURE(line);
        CHECK(nlohmann::json::parse(line)["step"] == n);
    }
    CHECK(n > 0);
}

namespace {

// A tmpfs of `size` mounted at `at` for one test (root only; the CI and development machines run
// as root): a full disk that is really full, and a run directory that is really read-only.
struct TmpfsMount {
    fs::path at;
    std::string why_not;  // empty when mounted
    TmpfsMount(const fs::path& where, const std::string& size) : at(where) {
        fs::create_directories(at);
        if (geteuid() != 0) {
            why_not = "not root: cannot mount a tmpfs";
            return;
        }
        const CommandOutput r =
            run_command("mount -t tmpfs -o size=" + size + " tmpfs '" + at.string() + "'");
        if (r.code != 0) why_not = "mount -t tmpfs failed: " + r.text;
    }
    ~TmpfsMount() {
        if (why_not.empty()) run_command("umount '" + at.string() + "'");
    }
    bool remount_read_only() const {
        return run_command("mount -o remount,ro '" + at.string() + "'").code == 0;
    }
};

}  // namespace

TEST_CASE("a full disk (a small tmpfs): a clear message, no .tmp left, whole metrics lines") {
    ResumeFixture f;
    // room for the config, the metrics and the provenance, not for the first checkpoint (step 5)
    TmpfsMount disk(f.dir / "small_disk", "96k");
    if (!disk.why_not.empty()) {
        MESSAGE("skipped: " << disk.why_not);
        return;
    }
    const CommandOutput r = run_command(
        f.start("full", "--set train.max_steps=10 --set train.out_dir=" + disk.at.string()));
    INFO(r.text);
    CHECK(r.code != 0);
    CHECK(r.text.find("No space left on device") != std::string::npos);
    CHECK(r.text.find(disk.at.string()) != std::string::npos);  // the message names the file
    for (const auto& [path, text] : snapshot(disk.at)) {
        CAPTURE(path);
        CHECK(path.find(".tmp") == std::string::npos);
        if (fs::path(path).filename() == "metrics.jsonl") {
            CHECK(!text.empty());
            CHECK(text.back() == '\n');  // no half-written line
            for (const json& row : read_metrics(path)) CHECK(row.contains("step"));
        }
    }
}

TEST_CASE("a read-only run directory: resume fails with the reason and changes no file") {
    ResumeFixture f;
    TmpfsMount disk(f.dir / "ro_disk", "16m");
    if (!disk.why_not.empty()) {
        MESSAGE("skipped: " << disk.why_not);
        return;
    }
    REQUIRE(run_command(
                f.start("ro", "--set train.max_steps=10 --set train.out_dir=" + disk.at.string()))
                .code == 0);
    const auto before = snapshot(disk.at);
    REQUIRE(before.size() >= 4);  // config, metrics, provenance, checkpoints
    REQUIRE(disk.remount_read_only());
    const CommandOutput r = run_command(f.train + " --resume " + (disk.at / "ro").string() +
                                        " --set train.max_steps=20");
    INFO(r.text);
    CHECK(r.code != 0);
    CHECK(r.text.find("Read-only file system") != std::string::npos);
    CHECK(r.text.find((disk.at / "ro").string()) != std::string::npos);
    CHECK(snapshot(disk.at) == before);
}

TEST_CASE("a data.train glob that matches nothing says so, naming the key") {
    const std::string train = built_binary("ZGPT_TRAIN_BIN");
    CommandOutput r =
        run_command(train + " -c " + std::string(ZGPT_SOURCE_DIR) +
                    "/configs/shakespeare-char-cpu.yaml --set "
                    "data.train=/nonexistent/zgpt_nothing_*.bin --set train.out_dir=" +
                    (fs::temp_directory_path() / "zgpt_test_noglob").string());
    INFO(r.text);
    CHECK(r.code != 0);
    CHECK(r.text.find("data.train: no files match '/nonexistent/zgpt_nothing_*.bin'") !=
          std::string::npos);
    CHECK(r.text.find("tokenizer.json") == std::string::npos);  // not the misleading old message
}

TEST_CASE("sample refuses a negative token count, top-k or temperature, naming the option") {
    const std::string sample = built_binary("ZGPT_SAMPLE_BIN");
    const std::string run = fs::temp_directory_path().string();  // exists; holds no checkpoint
    struct Bad {
        const char* args;
        const char* option;
    };
    for (const Bad b : {Bad{"-n -1", "--tokens"}, Bad{"-n 0", "--tokens"}, Bad{"-k -1", "--top-k"},
                        Bad{"-t -0.5", "--temperature"}}) {
        CAPTURE(b.args);
        CommandOutput r = run_command(sample + " --run " + run + " " + b.args);
        INFO(r.text);
        CHECK(r.code != 0);
        CHECK(r.text.find(std::string(b.option) + ": Value") != std::string::npos);
    }
}

TEST_CASE("a config bigger than the machine's memory is refused before anything is allocated") {
    const std::string train = built_binary("ZGPT_TRAIN_BIN");
    const fs::path out = fs::temp_directory_path() / "zgpt_test_too_big";
    fs::remove_all(out);
    CommandOutput r =
        run_command(train + " -c " + std::string(ZGPT_SOURCE_DIR) +
                    "/configs/shakespeare-char-cpu.yaml --set model.n_embd=65536 --set "
                    "model.n_head=1 --set model.vocab_size=1073741824 --set train.device=cpu "
                    "--set data.train=/nonexistent/x_*.bin --set train.out_dir=" +
                    out.string());
    INFO(r.text);
    CHECK(r.code != 0);
    CHECK(r.text.find("GB of host memory") != std::string::npos);
    CHECK_FALSE(fs::exists(out));  // no run directory either
}
