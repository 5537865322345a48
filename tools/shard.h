/* shard.h: tensor-parallel shards of a model (shard.c): `sluice shard`,
 * `sluice bench --world`, and the rules `sluice manifest --parts` reads. */
#ifndef SLUICE_TOOLS_SHARD_H
#define SLUICE_TOOLS_SHARD_H

#include "sluice.h"

/* The rules arg names: "builtin" (or NULL) for the built-in set, else a
 * rules file. Returns 0, or minus the exit status (cmd.h: CMD_EXIT_OPEN
 * for a file that cannot be read, CMD_EXIT_USAGE for rules that do not
 * parse) after a message on stderr naming cmd. */
int shard_rules_load(const char *cmd, const char *arg, sluice_part_rules **out);

#endif
