/* exit.c: the exit status of every subcommand from the library's codes
 * (cmd.h "cmd_exit"): one mapping, used by each command and sluice-serve. */
#include "cmd.h"

#include <sluice.h>

int cmd_exit_status(int sluice_status)
{
    switch (sluice_status) {
    case SLUICE_OK:
        return CMD_EXIT_OK;
    case SLUICE_E_CHECKSUM:         /* bytes that do not match their digest */
    case SLUICE_E_MANIFEST_MISMATCH: /* headers that disagree with a v2 manifest */
    case SLUICE_E_MANIFEST_UNKNOWN: /* a digest for a tensor or file the model lacks */
    case SLUICE_E_MANIFEST_MISSING: /* tensors the manifest has no digest for */
        return CMD_EXIT_INTEGRITY;
    case SLUICE_E_SIGNATURE:
        return CMD_EXIT_SIGNATURE;
    case SLUICE_E_INVAL:            /* an option value the library refuses */
    case SLUICE_E_NOT_FOUND:        /* a tensor name the model lacks */
        return CMD_EXIT_USAGE;
    default:                        /* I/O, remote, headers, index, manifest, memory */
        return CMD_EXIT_OPEN;
    }
}

int cmd_exit_worse(int a, int b)
{
    if (a == CMD_EXIT_INTEGRITY || b == CMD_EXIT_INTEGRITY)
        return CMD_EXIT_INTEGRITY;
    return a ? a : b;
}
