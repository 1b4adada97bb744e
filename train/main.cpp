// train: trains a GPT from a YAML config.  `train --help` lists the options and every config key.
#include <omp.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "kernels/core/check.h"
#include "kernels/core/registry.h"
#include "kernels/gemm/cpu_blas.h"
#include "model/parameters.h"
#include "train/cli.h"
#include "train/config.h"
#include "train/device.h"
#include "train/dist/launch.h"
#include "train/dist/rank_env.h"
#include "train/trainer.h"

int main(int argc, char** argv) {
    zgpt::cpu::ensure_blas_kernel(argv);  // first: it may restart the program
    CLI::App app{"Train a small GPT from a YAML config (CPU reference backend)."};
    zgpt::report_cli_errors(app);
    std::string config_path, resume_dir;
    std::vector<std::string> overrides;
    bool print_config = false;
    int nproc = 0;
    app.add_option("-c,--config", config_path, "YAML config (only overrides of the defaults)")
        ->check(CLI::ExistingFile);
    app.add_option("--resume", resume_dir,
                   "continue the run in RUN_DIR from its newest valid checkpoint (its config.yaml "
                   "is the config; --set still applies, e.g. a larger train.max_steps)")
        ->check(CLI::ExistingDirectory);
    app.add_option("--set", overrides, "override a config key: --set optim.lr=3e-4 (repeatable)");
    app.add_flag("--print-config", print_config, "print the resolved config and exit");
    bool list_kernels = false;
    app.add_flag("--list-kernels", list_kernels,
                 "print every kernel family's variants and default as JSON and exit (what "
                 "tools/ablate.py reads)");
    app.add_option("--nproc", nproc,
                   "start N processes on this machine, one rank each (one per GPU; on the CPU they "
                   "talk over TCP). Under torchrun, srun or mpirun leave it out: each process "
                   "joins through RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (or "
                   "SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID). Under srun with one task a node, "
                   "each task is its node's launcher (--nnodes and --node-rank from SLURM)")
        ->check(CLI::Range(1, 1024));
    // Several machines, as torchrun names them: one `train --nproc N` on each.
    zgpt::NodeSpec node;
    std::string master_port_text;
    auto* nnodes_opt = app.add_option("--nnodes", node.nnodes,
                                      "with --nproc N: the run spans this many nodes (machines), "
                                      "one launcher on each, N ranks a node")
                           ->check(CLI::Range(1, 65536));
    auto* node_rank_opt =
        app.add_option("--node-rank,--node_rank", node.node_rank,
                       "with --nnodes: this node's number, 0..nnodes-1 (its ranks are "
                       "node_rank x N ..)");
    auto* master_addr_opt =
        app.add_option("--master-addr,--master_addr", node.master_addr,
                       "with --nnodes: node 0's address, the same on every node (default: "
                       "MASTER_ADDR)");
    auto* master_port_opt =
        app.add_option("--master-port,--master_port", master_port_text,
                       "with --nnodes: a free TCP port on node 0, the same on every node "
                       "(default: MASTER_PORT)");
    bool config_reference = false;
    app.add_flag("--config-reference", config_reference,
                 "print every config key with its default and meaning as Markdown (docs/config.md) "
                 "and exit");
    app.footer("Config keys (section: key: default  # meaning):\n" + zgpt::config_reference());
    CLI11_PARSE(app, argc, argv);
    if (config_reference) {
        std::printf("%s", zgpt::config_reference_markdown().c_str());
        return 0;
    }
    if (list_kernels) {
        nlohmann::json j = nlohmann::json::object();
        for (const zgpt::KernelFamily& f : zgpt::kernel_families())
            j[f.name] = {
                {"default", f.default_variant}, {"variants", f.variants}, {"help", f.help}};
        std::printf("%s\n", j.dump(1).c_str());
        return 0;
    }
    if (config_path.empty() == resume_dir.empty()) {
        std::fprintf(stderr, "error: give exactly one of --config FILE or --resume RUN_DIR\n");
        return 1;
    }
    if (!resume_dir.empty()) {
        const std::filesystem::path dir = std::filesystem::absolute(resume_dir).lexically_normal();
        const std::filesystem::path run = dir.has_filename() ? dir : dir.parent_path();
        config_path = (run / "config.yaml").string();
        overrides.insert(overrides.begin(),
                         {"train.out_dir=" + run.parent_path().string(),
                          "train.run_name=" + run.filename().string(), "train.resume=auto"});
    }
    std::string command_line;
    for (int i = 0; i < argc; i++) command_line += (i ? " " : "") + std::string(argv[i]);
    std::unique_ptr<zgpt::Communicator> world;
    try {
        zgpt::Config cfg = zgpt::load_config(config_path, overrides);
        if (print_config) {
            std::printf("%s", zgpt::config_to_yaml(cfg).c_str());
            return 0;
        }
        // srun starting one launcher a node (`srun --ntasks-per-node 1 train --nproc N`): with
        // one task a node, SLURM_PROCID numbers the node, not a rank; the node count and this
        // node's number come from SLURM unless given. srun starting every rank itself
        // (SLURM_NTASKS = ranks) runs ranks, as does any process with RANK set.
        const auto env_int = [](const char* name) {
            const char* v = std::getenv(name);
            return v && *v ? std::atoi(v) : 0;
        };
        // (The launcher's ranks inherit the SLURM variables and this command line, with RANK set:
        // they take the node count the same way.)
        const bool slurm_node_tasks =
            std::getenv("SLURM_PROCID") && nproc > 1 &&
            env_int("SLURM_NTASKS") ==
                (nnodes_opt->count() > 0 ? node.nnodes : env_int("SLURM_NNODES"));
        const bool slurm_launcher = slurm_node_tasks && !std::getenv("RANK");
        if (slurm_node_tasks && nnodes_opt->count() == 0) node.nnodes = env_int("SLURM_NTASKS");
        if (slurm_launcher) {
            if (node_rank_opt->count() == 0)
                node.node_rank =
                    env_int(std::getenv("SLURM_NODEID") ? "SLURM_NODEID" : "SLURM_PROCID");
        }
        const bool in_run = !slurm_launcher && (std::getenv("RANK") || std::getenv("SLURM_PROCID"));
        for (CLI::Option* o : {nnodes_opt, node_rank_opt, master_addr_opt, master_port_opt})
            if (o->count() > 0 && nproc == 0)
                throw zgpt::Error(
                    o->get_name() +
                    " is an option of the launcher: give --nproc N (ranks a node) too");
        if (nproc > 0 && !in_run && node.nnodes > 1) {
            if (node.master_addr.empty() && std::getenv("MASTER_ADDR"))
                node.master_addr = std::getenv("MASTER_ADDR");
            if (master_port_text.empty() && std::getenv("MASTER_PORT"))
                master_port_text = std::getenv("MASTER_PORT");
        }
        if (!master_port_text.empty()) {
            char* end = nullptr;
            const long port = std::strtol(master_port_text.c_str(), &end, 10);
            if (*end != '\0' || port < 1 || port > 65535)
                throw zgpt::Error("--master-port (or MASTER_PORT) '" + master_port_text +
                                  "' is not a TCP port (1..65535)");
            node.master_port = int(port);
        }
        if (nproc > 0 && !in_run) {  // the launcher: this process only starts and watches ranks
            // The ranks share this machine's cores (train.threads, when set, still decides).
            if (!std::getenv("OMP_NUM_THREADS")) {
                const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
                setenv("OMP_NUM_THREADS", std::to_string(std::max(1u, cores / nproc)).c_str(), 1);
            }
            return zgpt::launch_local(nproc, "/proc/self/exe",
                                      std::vector<std::string>(argv, argv + argc), 5, node);
        }
        if (nproc > 0 || in_run) {
            const zgpt::RankEnv env = zgpt::rank_env_from_environment();
            if (nproc > 0 && env.world_size != nproc * node.nnodes)
                throw zgpt::Error("--nproc " + std::to_string(nproc) + " x --nnodes " +
                                  std::to_string(node.nnodes) + " but WORLD_SIZE is " +
                                  std::to_string(env.world_size));
            ZG_CHECK(cfg.parallel.local_ranks == 1,
                     "parallel.local_ranks > 1 is for one process; with several processes each is "
                     "one rank");
            const std::string device = zgpt::choose_device(cfg.train.device).device;
            // The bucketed all-reduce by the link: across nodes, not inside one (GPU ranks over
            // NCCL; the CPU's tcp communicator sums once after the pass).
            if (cfg.parallel.grad_bucket_mb < 0) {
                cfg.parallel.grad_bucket_mb = zgpt::grad_bucket_mb_for_link(
                    cfg.parallel.grad_bucket_mb, device == "cuda" ? env.nodes : 1);
                if (cfg.parallel.grad_bucket_mb > 0 && env.rank == 0)
                    std::printf(
                        "parallel.grad_bucket_mb: %g (the ranks span %d nodes: the "
                        "gradient all-reduce starts during the backward pass)\n",
                        cfg.parallel.grad_bucket_mb, env.nodes);
            }
            // torchrun's ranks start with OMP_NUM_THREADS=1: say what that costs the start-up
            // (on the GPU the weights are drawn there, unless model.init_jitter moves them after)
            const bool host_draw = device != "cuda" || cfg.model.init_jitter != 0;
            if (env.rank == 0 && host_draw && cfg.train.threads <= 0 && cfg.model.vocab_size > 0) {
                const std::string note = zgpt::one_thread_draw_note(
                    double(zgpt::make_gpt_layout(cfg.model).table.total()), omp_get_max_threads(),
                    omp_get_num_procs(), env.world_size / std::max(1, env.nodes));
                if (!note.empty()) std::printf("%s\n", note.c_str());
            }
            world = zgpt::join_run(device, cfg.parallel.timeout_s, cfg.parallel.collective_sms);
        }
        if (world) {
            zgpt::train(cfg, config_path, command_line, *world);
            zgpt::finish_run(*world);
        } else {
            zgpt::train(cfg, config_path, command_line);
        }
    } catch (const std::exception& e) {
        if (world) zgpt::report_rank_failure(*world, e.what());
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
