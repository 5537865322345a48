/* sluice.c: the sluice command: dispatches to one subcommand per file. */
#include "cmd.h"

#include <sluice.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"inspect", cmd_inspect, "inspect PATH [--json]      list tensors, metadata and totals"},
    {"synth", cmd_synth, "synth PRESET OUTDIR [...]  write a synthetic model and its manifest"},
    {"bench", cmd_bench, "bench PATH [...]           benchmark loading against baselines"},
    {"manifest", cmd_manifest, "manifest PATH [-o FILE]    write the SHA-256 manifest of a model"},
    {"verify", cmd_verify, "verify PATH [--files]      check every tensor (and file) against the manifest"},
    {"repair", cmd_repair, "repair PATH --fallback LOC mend failed tensors and damaged or missing files from a mirror"},
    {"keygen", cmd_keygen, "keygen --out PREFIX        make an Ed25519 (--curve: EC) key pair for signing"},
    {"sign", cmd_sign, "sign MANIFEST --key KEY    write MANIFEST.sig (--format model-signing: DIR/model.sig)"},
    {"shard", cmd_shard, "shard PATH --rank R --world N  load one tensor-parallel rank's shard, verified"},
    {"cat", cmd_cat, "cat PATH NAME              write one tensor's verified bytes to stdout"},
    {"stats", cmd_stats, "stats PATH [--openmetrics] load the model verified, print its metrics"},
    {"bench-metrics", cmd_bench_metrics, "bench-metrics PATH [...]   what the metrics cost; rendering time and size"},
    {"cache", cmd_cache, "cache ls|du|gc|clear|verify  look after the persistent cache"},
    {"bench-cache", cmd_bench_cache, "bench-cache PATH --url URL --cache-dir DIR  what the persistent cache buys"},
    {"serve", NULL, "serve ROOT_OR_MODEL [...]  serve tensors over gRPC (the sluice-serve program)"},
};

/* `sluice serve`: the gRPC server is a program of its own, sluice-serve
 * (C++ and grpc++, built when grpc++ is found), installed beside this one:
 * exec it with the same arguments. */
static int run_serve(char **argv)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash && (size_t)(slash - self) + sizeof "/sluice-serve" <= sizeof self) {
            strcpy(slash, "/sluice-serve");
            argv[0] = self;
            execv(self, argv);
            if (errno != ENOENT) {
                fprintf(stderr, "sluice serve: %s: %s\n", self, strerror(errno));
                return CMD_EXIT_OPEN;
            }
        }
    }
    fprintf(stderr, "sluice serve: sluice-serve is not installed beside this program "
                    "(it is built when grpc++ is found: apt-get install -y libgrpc++-dev "
                    "libprotobuf-dev protobuf-compiler protobuf-compiler-grpc)\n");
    return CMD_EXIT_OPEN;
}

static void usage(FILE *out)
{
    fprintf(out, "usage: sluice COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %s\n", commands[i].summary);
    fprintf(out, "\nrun 'sluice COMMAND --help' for a command's options; 'sluice --version'\n");
    fprintf(out, "\n" CMD_EXIT_HELP);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    /* The library's version, not the header's: the one actually loaded. */
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        printf("sluice %s\n", sluice_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run ? commands[i].run(argc - 1, argv + 1) : run_serve(argv + 1);
    fprintf(stderr, "sluice: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
