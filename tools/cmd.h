/* cmd.h: the subcommands of the sluice command, one file each. Each takes
 * the arguments after its own name (argv[0] is the subcommand) and returns
 * the process exit status. */
#ifndef SLUICE_CMD_H
#define SLUICE_CMD_H

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

#endif
