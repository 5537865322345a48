/* cmd.h: the subcommands of the sluice command, one file each. Each takes
 * the arguments after its own name (argv[0] is the subcommand) and returns
 * the process exit status. */
#ifndef SLUICE_CMD_H
#define SLUICE_CMD_H

#ifdef __cplusplus
extern "C" {
#endif

/* The exit status of every subcommand, one table for all (docs/command.md
 * "Exit status", man sluice(1), each --help by CMD_EXIT_HELP). */
enum cmd_exit {
    CMD_EXIT_OK = 0,
    CMD_EXIT_INTEGRITY = 1, /* bytes or headers that do not match the manifest */
    CMD_EXIT_USAGE = 2,     /* a bad command line, or a tensor name the model lacks */
    CMD_EXIT_OPEN = 3,      /* cannot open, read or write: the model, its manifest, a
                               file, a key; I/O, network, memory */
    CMD_EXIT_SIGNATURE = 4  /* a signature missing, invalid, or by no trusted key or CA */
};

/* The help text of the table above (each --help ends with it). */
#define CMD_EXIT_HELP                                                          \
    "Exit status (the same in every command): 0 success; 1 integrity: bytes or\n" \
    "headers that do not match the manifest; 2 usage error (or a tensor name\n"  \
    "the model lacks); 3 cannot open, read or write (the model, its manifest,\n" \
    "a file or key; I/O, network, memory); 4 signature refused (missing,\n"     \
    "invalid, or by no trusted key or CA).\n"

/* The exit status (CMD_EXIT_*) of a failed library call's SLUICE_E_* code
 * (SLUICE_OK: 0). exit.c. */
int cmd_exit_status(int sluice_status);

/* The first failure's status, integrity winning: what a command that
 * meets several failures exits with. */
int cmd_exit_worse(int a, int b);

int cmd_inspect(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_manifest(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_repair(int argc, char **argv);
int cmd_cat(int argc, char **argv);
int cmd_keygen(int argc, char **argv);        /* sign.c */
int cmd_sign(int argc, char **argv);          /* sign.c */
int cmd_stats(int argc, char **argv);         /* metrics_cli.c */
int cmd_bench_metrics(int argc, char **argv); /* metrics_cli.c */
int cmd_cache(int argc, char **argv);
int cmd_bench_cache(int argc, char **argv);   /* bench_cache.c */
int cmd_shard(int argc, char **argv);         /* shard.c */
int cmd_bench_world(int argc, char **argv);   /* shard.c: bench --world */

#ifdef __cplusplus
}
#endif

#endif
